"""`atac-hf pack` and the built-in workloads."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest

from atac_hf.packing import cli
from atac_hf.workloads import WORKLOADS, describe_lengths, load_lengths, make_workload


def run_pack(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="atac-hf")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pack", *argv])
    return args.func(args)


def test_pack_json_shape(tmp_path, capsys):
    lengths = [5000, 0, 70000, 1200, 3000, 40000, 800]
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(lengths))
    assert run_pack(["--lengths", str(path), "--max-tokens", "32768", "--packs-per-window", "2",
                     "--strategy", "wfap", "--model", "7b", "--hardware", "A800", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # exactly one JSON object
    assert set(out) == {"packs", "deferred", "metrics"}
    covered = {}
    for pack in out["packs"]:
        assert sum(e - s for _, s, e in pack) <= 32768
        for sid, s, e in pack:
            assert 0 <= sid < len(lengths) and 0 <= s < e <= lengths[sid]
            covered[sid] = covered.get(sid, 0) + e - s
    assert covered == {i: n for i, n in enumerate(lengths) if n}
    assert all(len(d) == 2 and d[1] >= 1 for d in out["deferred"])
    m = out["metrics"]
    assert m["zero_length_skipped"] == 1 and m["num_split"] == 2 and m["tokens"] == sum(lengths)


@pytest.mark.parametrize("strategy", ["wfap", "sequential", "bfd", "wlb"])
def test_pack_summary_with_builtin_workload(strategy, capsys):
    assert run_pack(["--workload", "longtail", "--num-samples", "3000", "--max-tokens", "65536",
                     "--packs-per-window", "8", "--strategy", strategy]) == 0
    out = capsys.readouterr().out
    assert f"({strategy}, cap 65536, 8 packs/window, cost model 8b@H100)" in out
    assert "max/mean per window" in out and "padding" in out and "deferred" in out


def test_pack_cli_errors(tmp_path):
    with pytest.raises(ValueError, match=r"lengths file '.*missing.json' does not exist \(check --lengths\)"):
        run_pack(["--lengths", str(tmp_path / "missing.json"), "--max-tokens", "8"])
    bad = tmp_path / "bad.json"
    bad.write_text('[1, 2.5]')
    with pytest.raises(ValueError, match=r"entry 1 is 2.5, not an int"):
        run_pack(["--lengths", str(bad), "--max-tokens", "8"])
    bad.write_text('{"a": 1}')
    with pytest.raises(ValueError, match=r"must hold a JSON array of ints, got a dict"):
        run_pack(["--lengths", str(bad), "--max-tokens", "8"])
    bad.write_text('[1, -3]')
    with pytest.raises(ValueError, match=r"entry 1 is -3, a negative length"):
        run_pack(["--lengths", str(bad), "--max-tokens", "8"])
    bad.write_text('[1, ')
    with pytest.raises(ValueError, match=r"is not valid JSON"):
        run_pack(["--lengths", str(bad), "--max-tokens", "8"])
    with pytest.raises(ValueError, match=r"max_tokens=0 is invalid"):
        run_pack(["--workload", "uniform", "--num-samples", "10", "--max-tokens", "0"])
    with pytest.raises(ValueError, match=r"unknown model preset 'huge'"):
        run_pack(["--workload", "uniform", "--num-samples", "10", "--max-tokens", "8", "--model", "huge"])


def test_pack_cli_subprocess_reports_user_errors(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "atac_hf.packing.cli", "--workload", "sft", "--num-samples", "50",
                           "--max-tokens", "64", "--overlength", "error"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "atac-hf pack: error: sample" in proc.stderr and "overlength='error'" in proc.stderr


def test_main_cli_pack_json(tmp_path):
    try:
        from atac_hf.cli import build_parser

        build_parser()
    except ImportError as e:  # other sub-commands not written yet
        pytest.skip(f"main CLI not importable yet: {e}")
    path = tmp_path / "l.json"
    path.write_text(json.dumps([3, 9, 4, 1]))
    proc = subprocess.run([sys.executable, "-m", "atac_hf.cli", "pack", "--lengths", str(path), "--max-tokens", "10",
                           "--packs-per-window", "2", "--strategy", "bfd", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert sorted(tuple(s) for p in out["packs"] for s in p) == [(0, 0, 3), (1, 0, 9), (2, 0, 4), (3, 0, 1)]


# ---------------------------------------------------------------------------- workloads
def test_longtail_workload_shape():
    d = describe_lengths(make_workload("longtail", 100_000, seed=0))
    assert 3000 <= d["median"] <= 3500 and 22_000 <= d["p99"] <= 32_000 and 110_000 <= d["max"] <= 125_000
    assert 0.007 <= d["long_sample_share"] <= 0.012 and 0.13 <= d["long_token_share"] <= 0.21


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_deterministic(name):
    a, b = make_workload(name, 500, seed=3), make_workload(name, 500, seed=3)
    assert np.array_equal(a, b) and a.dtype == np.int64 and a.min() >= 1
    assert not np.array_equal(a, make_workload(name, 500, seed=4))


def test_workload_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown workload 'zipf'; legal values: \['longtail', 'sft', 'uniform'\]"):
        make_workload("zipf")
    with pytest.raises(ValueError, match=r"num_samples=0 must be an int >= 1"):
        make_workload("sft", 0)
    with pytest.raises(ValueError, match=r"max_len=0 must be an int >= 1"):
        make_workload("sft", 5, max_len=0)
    with pytest.raises(ValueError, match="describe_lengths got no lengths"):
        describe_lengths([])
    path = tmp_path / "ok.json"
    path.write_text("[1, 2, 0]")
    assert load_lengths(path).tolist() == [1, 2, 0]


def test_pack_json_all_empty_samples(tmp_path, capsys):
    path = tmp_path / "zeros.json"
    path.write_text("[0, 0]")
    assert run_pack(["--lengths", str(path), "--max-tokens", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["packs"] == [] and out["metrics"]["zero_length_skipped"] == 2 and out["metrics"]["imbalance_mean"] is None

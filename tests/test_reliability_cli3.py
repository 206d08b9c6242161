"""Reliability, third red-team pass: atomic profile saves, calibrate/bench/check-model flags
checked before anything runs, and ``dataset:`` / lengths-file workloads validated entry by entry.
Every user error is one ``atac-hf <cmd>: error: ...`` line, exit code 2, and changes nothing."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from atac_hf.cli import main
from atac_hf.cost import CostModel, default_cost_model


def _one_error_line(capsys, argv: list[str], match: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and "it/s" not in ln]
    assert rc == 2, (argv, rc, err[:500])
    assert len(lines) == 1 and lines[0].startswith(f"atac-hf {argv[0]}: error: "), (argv, err[:500])
    assert "Traceback" not in err
    assert re.search(match, lines[0]), (match, lines[0][:500])
    return lines[0]


# ---------------------------------------------------------------- 1. atomic profile saves
def test_save_numpy_metadata_and_fields_roundtrip(tmp_path):
    p = tmp_path / "prof.json"
    cm = default_cost_model()
    cm.save(p, fit_error=np.float32(0.01), n=np.int64(3), ok=np.bool_(True), arr=np.arange(3))
    data = json.loads(p.read_text())
    assert data["metadata"] == {"fit_error": pytest.approx(0.01), "n": 3, "ok": True, "arr": [0, 1, 2]}
    cm2 = cm.replace(tile=np.int64(64), attn_s_per_pair=np.float32(1e-12))
    cm2.save(p)
    back = CostModel.from_profile(p)
    assert back.tile == 64 and type(json.loads(p.read_text())["cost_model"]["tile"]) is int
    assert back.attn_s_per_pair == pytest.approx(1e-12)


def test_save_failure_leaves_existing_profile_untouched(tmp_path):
    p = tmp_path / "prof.json"
    cm = default_cost_model()
    cm.save(p, device="cpu")
    before = p.read_bytes()
    with pytest.raises(ValueError, match=r"metadata \['bad'\].*JSON-serialisable"):
        cm.save(p, bad=object())
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["prof.json"]  # no temp file left behind
    assert CostModel.from_profile(p).name == cm.name


# ---------------------------------------------------------------- 2. calibrate --device / --budget-s
@pytest.mark.parametrize("device", ["meta", "mps", "nope", "cuda:x", "CPU0"])
def test_calibrate_refuses_unsupported_device_before_measuring(capsys, tmp_path, device):
    out = tmp_path / "p.json"
    line = _one_error_line(capsys, ["calibrate", "--quick", "--device", device, "-o", str(out)],
                           r"--device .*legal values: cpu, cuda, cuda:N")
    assert device in line
    assert not out.exists()


def test_calibrate_refuses_cuda_without_cuda(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "p.json"
    _one_error_line(capsys, ["calibrate", "--quick", "--device", "cuda", "-o", str(out)],
                    r"--device 'cuda': CUDA is not available.*legal values here: cpu")
    assert not out.exists()


def test_calibrate_refuses_a_cuda_index_past_the_devices(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    _one_error_line(capsys, ["calibrate", "--quick", "--device", "cuda:2", "-o", str(tmp_path / "p.json")],
                    r"--device 'cuda:2': this machine has 2 CUDA device\(s\); legal values: cpu, cuda, cuda:0 to cuda:1")


def test_calibrate_api_refuses_meta_device():
    from atac_hf.cost.calibrate import calibrate

    with pytest.raises(ValueError, match=r"device='meta' is not supported; legal values"):
        calibrate("tiny", device="meta", quick=True)


@pytest.mark.parametrize("budget", ["nan", "-5", "0", "inf", "abc"])
def test_calibrate_refuses_bad_budget(capsys, tmp_path, budget):
    out = tmp_path / "p.json"
    _one_error_line(capsys, ["calibrate", "--quick", "--budget-s", budget, "-o", str(out)],
                    r"--budget-s .* must be a finite number of seconds > 0.*'none'")
    assert not out.exists()


def test_calibrate_budget_parsing():
    from atac_hf.cost.cli import _parse_budget, check_device

    assert _parse_budget(None) is None and _parse_budget("none") == 0.0 and _parse_budget("2.5") == 2.5
    assert check_device(None) is None and check_device(" CPU ") == "cpu"


# ---------------------------------------------------------------- 3. bench checks its flags first
@pytest.fixture
def bench_never_runs(monkeypatch):
    from atac_hf.sim import bench

    def ran(*a, **k):
        raise AssertionError("bench ran the grid before checking its arguments")

    monkeypatch.setattr(bench, "run_grid", ran)
    monkeypatch.setattr(bench, "run_robustness_grid", ran)


def test_bench_output_directory_refused_before_running(capsys, tmp_path, bench_never_runs):
    (tmp_path / "reports").mkdir()
    _one_error_line(capsys, ["bench", "--workers", "1", "--output", str(tmp_path / "reports")],
                    r"--output '.*reports' is a directory; give the report's file name")
    assert [p.name for p in tmp_path.iterdir()] == ["reports"] and not list((tmp_path / "reports").iterdir())


def test_bench_unwritable_output_and_plots_dir_refused_before_running(capsys, tmp_path, bench_never_runs):
    _one_error_line(capsys, ["bench", "--workers", "1", "--output", "/proc/nope/BENCH.md"],
                    r"--output '/proc/nope/BENCH.md' is not writable here")
    (tmp_path / "f").write_text("x")
    _one_error_line(capsys, ["bench", "--workers", "1", "--output", str(tmp_path / "f" / "R.md")],
                    r"--output .* is not a folder")
    _one_error_line(capsys, ["bench", "--workers", "1", "--output", str(tmp_path / "R.md"),
                             "--plots-dir", str(tmp_path / "f")], r"--plots-dir .* exists and is not a directory")
    _one_error_line(capsys, ["bench", "--workers", "1", "--output", str(tmp_path / "R.md"),
                             "--plots-dir", "/proc/nope/img"], r"--plots-dir '/proc/nope/img' is not writable here")
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


@pytest.mark.parametrize("argv, match", [
    (["--seed", "-1"], r"--seed -1 must be from 0 to"),
    (["--workers", "-3"], r"--workers -3 must be from 1 to 1024"),
    (["--workers", "0"], r"--workers 0 must be from 1 to 1024"),
    (["--scenarios", ","], r"--scenarios ',' names no scenario; give comma-separated names from \["),
    (["--scenarios", " "], r"--scenarios ' ' names no scenario"),
])
def test_bench_flags_refused_before_running(capsys, bench_never_runs, argv, match):
    _one_error_line(capsys, ["bench", *argv], match)


# ---------------------------------------------------------------- 4. check-model --timeout / --world-size
@pytest.fixture
def no_probe(monkeypatch):
    import atac_hf.integrations.check_cli as cc

    def ran(*a, **k):
        raise AssertionError("check-model spawned workers before checking its arguments")

    monkeypatch.setattr(cc, "_run_items", ran)


@pytest.mark.parametrize("timeout", ["nan", "inf", "-inf", "0", "-1"])
def test_check_model_refuses_a_timeout_that_disables_the_watchdog(capsys, no_probe, timeout):
    _one_error_line(capsys, ["check-model", "--model-type", "llama", f"--timeout={timeout}"],
                    r"--timeout must be > 0 seconds and finite \(default 120.*got " + re.escape(timeout) + "$")


@pytest.mark.parametrize("world", ["0", "-2", "65", "100000"])
def test_check_model_bounds_world_size(capsys, no_probe, world):
    _one_error_line(capsys, ["check-model", "--model-type", "llama", f"--world-size={world}"],
                    rf"--world-size must be >= 1 and <= 64 .*got {world}")


def test_check_model_checks_output_before_probing(capsys, no_probe, tmp_path):
    _one_error_line(capsys, ["check-model", "--model-type", "llama", "--output", str(tmp_path)],
                    r"--output .* is a directory")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 5. dataset: and lengths-file workloads
def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rows, match", [
    ([{"length": "123"}, {"length": "45"}], r"row 0 is '123', a string: measure text by tokens, not characters"),
    ([{"length": 5}, {"length": -3}], r"row 1 is -3, not a length"),
    ([{"length": True}, {"length": False}], r"row 0 is True, not a length"),
    ([{"length": 5.7}, {"length": 2.0}], r"row 0 is 5.7, not a length"),
    ([{"length": 5}, {"length": None}], r"row 1 is None, not a length"),
    ([{"length": [[1, 2]]}, {"length": [[3]]}], r"row 0 is \[\[1, 2\]\], not a length"),
    ([{"length": 2**41}], r"row 0 is 2199023255552, not a length; a length column holds ints from 0 to"),
])
def test_dataset_column_rows_validated(tmp_path, rows, match):
    pytest.importorskip("datasets")
    from atac_hf.workloads import load_workload

    path = _jsonl(tmp_path / "w.jsonl", rows)
    with pytest.raises(ValueError, match=match) as e:
        load_workload(f"dataset:{path}")
    assert "column 'length'" in str(e.value) and "dataset:<path>:<column> in --workload" in str(e.value)


def test_dataset_lengths_ints_and_token_lists_zeros_dropped(tmp_path):
    datasets = pytest.importorskip("datasets")
    from atac_hf.workloads import lengths_from_dataset

    ds = datasets.Dataset.from_dict({"length": [5, 0, 7], "ids": [[1] * 5, [], [2] * 7]})
    assert lengths_from_dataset(ds).tolist() == [5, 7] == lengths_from_dataset(ds, "ids").tolist()
    assert lengths_from_dataset(ds.select([2, 0]), "ids").tolist() == [7, 5]  # the indices mapping is honoured
    with pytest.raises(ValueError, match=r"row 1 is None, not a length"):
        lengths_from_dataset(datasets.Dataset.from_dict({"length": [3, None]}))
    with pytest.raises(ValueError, match=r"row 0 is 'ab', a string"):
        lengths_from_dataset(datasets.Dataset.from_dict({"length": ["ab"]}), setting="--workload-file")


def test_dataset_empty_path_and_unloadable_files_are_one_line_errors(tmp_path, capsys):
    pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "empty.jsonl").write_text("")
    pq.write_table(pa.table({"length": pa.array([], pa.int64())}), str(tmp_path / "empty.parquet"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    sim = ["--steps", "1", "--dp", "1", "--pp", "1", "--cp", "2", "--micro-batches", "1", "--max-tokens", "4096"]
    for spec in ("dataset:", "dataset::length"):
        _one_error_line(capsys, ["simulate", "--workload", spec, *sim],
                        r"dataset workload has an empty path: give dataset:<path-or-hub-name>\[:<column>\] "
                        r"\(check --workload\)")
    for name in ("empty.jsonl", "empty.parquet", "bad.parquet"):
        _one_error_line(capsys, ["simulate", "--workload", f"dataset:{tmp_path / name}", *sim],
                        rf"dataset '.*{re.escape(name)}' cannot be loaded: \w+.*check --workload\)")


def test_lengths_file_entries_bounded_and_capped(tmp_path, monkeypatch):
    from atac_hf import workloads
    from atac_hf.workloads import load_lengths

    big = tmp_path / "big.json"
    big.write_text("[5, 99999999999999999999999]")
    with pytest.raises(ValueError, match=r"entry 1 is 99999999999999999999999, over the longest sample length "
                                         r"1099511627776 \(2\*\*40; check --lengths\)"):
        load_lengths(big)
    huge = tmp_path / "huge.json"
    huge.write_text("[" + "9" * 300 + "]")
    with pytest.raises(ValueError, match=r"entry 0 is an int of 997 bits, over"):
        load_lengths(huge)
    huge.write_text("[" + "9" * 5000 + "]")  # past Python's int-from-string digit limit
    with pytest.raises(ValueError, match=r"huge.json' cannot be parsed: .*4300 digits.*\(check --lengths\)"):
        load_lengths(huge)
    many = tmp_path / "many.json"
    many.write_text(json.dumps([1] * 11))
    monkeypatch.setattr(workloads, "MAX_NUM_SAMPLES", 10)
    with pytest.raises(ValueError, match=r"holds 11 lengths, more than the 10 a workload may hold.*check --lengths"):
        load_lengths(many)


def test_lengths_messages_name_the_callers_flag(tmp_path, capsys):
    bad = tmp_path / "notgz.json.gz"
    bad.write_text("[1,2,3]")
    big = tmp_path / "big.json"
    big.write_text("[5, 99999999999999999999999]")
    sim = ["--steps", "1", "--dp", "1", "--pp", "1", "--cp", "2", "--micro-batches", "1", "--max-tokens", "64"]
    _one_error_line(capsys, ["simulate", "--workload", str(bad), *sim], r"cannot be read.*\(check --workload\)$")
    _one_error_line(capsys, ["plan", "--doc-lengths", str(big), "--cp-size", "2"], r"check --doc-lengths\)$")
    _one_error_line(capsys, ["pack", "--lengths", str(big), "--max-tokens", "8"], r"check --lengths\)$")
    _one_error_line(capsys, ["bench", "--workers", "1", "--workload-file", str(big)], r"check --workload-file\)$")


# ---------------------------------------------------------------- plan: a baseline over the cap
def test_plan_reports_a_baseline_over_the_cap_as_a_row_and_refuses_only_when_none_fits(capsys):
    """`plan --max-tokens-per-rank 4 --doc-lengths 5,3 --cp-size 2`: per_doc keeps the 5-token
    document on one rank; it was an abort after 3 JSON rows (red-team 3)."""
    argv = ["plan", "--max-tokens-per-rank", "4", "--doc-lengths", "5,3", "--cp-size", "2"]
    assert main(argv + ["--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["strategy"] for r in rows] == ["atp", "contiguous", "zigzag", "per_doc", "wlb_adaptive"]
    assert "over max_tokens_per_rank=4" in rows[3]["refused"]
    assert all(max(r["rank_tokens"]) <= 4 for r in rows if "refused" not in r)
    assert main(argv) == 0
    assert "per_doc        refused: over --max-tokens-per-rank=4" in capsys.readouterr().out
    _one_error_line(capsys, argv + ["--strategy", "per_doc"], r"strategy 'per_doc' puts 5 tokens on one rank")
    _one_error_line(capsys, ["plan", "--max-tokens-per-rank", "3", "--doc-lengths", "5,3", "--cp-size", "2"],
                    r"no strategy fits --max-tokens-per-rank=3: strategy 'atp' puts 4 tokens")

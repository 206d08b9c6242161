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

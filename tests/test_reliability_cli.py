"""Reliability of the command line (issue 13, items 2, 6 and 7): every user mistake ends in one
``atac-hf <cmd>: error: ...`` line and exit code 2, never a traceback, a hang or a memory
blow-up; calibrate refuses a bad output path before it measures anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _reliability  # noqa: E402
from _reliability import count  # noqa: E402

from atac_hf.cli import USER_ERRORS, main
from atac_hf.cost import default_cost_model


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    _reliability.flush(__name__)


def _one_error_line(capsys, argv: list[str], match: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (argv, rc, err[:500])
    assert len(lines) == 1 and lines[0].startswith(f"atac-hf {argv[0]}: error: "), (argv, err[:500])
    assert "Traceback" not in err
    import re

    assert re.search(match, lines[0]), (match, lines[0][:500])
    assert len(lines[0]) < 2200
    count("cli.errors_one_line")
    return lines[0]


@pytest.fixture
def files(tmp_path):
    zero = default_cost_model().replace(linear_s_per_token=0.0, attn_s_per_pair=0.0, segment_overhead_s=0.0)
    zero.save(tmp_path / "zero.json")
    (tmp_path / "deep.json").write_text("[" * 10_000 + "]" * 10_000)
    (tmp_path / "bools.json").write_text("[true, 2]")
    (tmp_path / "lens.json").write_text("[3, 4, 100]")
    return tmp_path


def test_hostile_arguments_end_in_one_line(capsys, files):
    t = files
    cases = [
        (["pack", "--lengths", "/dev/zero", "--max-tokens", "100"], "not a regular file"),
        (["pack", "--workload", "sft", "--num-samples", "50", "--max-tokens", "100", "--cost-profile", "/dev/zero"],
         "not a regular file"),
        (["pack", "--workload", "sft", "--num-samples", "50", "--max-tokens", "100", "--cost-profile",
          str(t / "zero.json")], "prices all work at 0 s"),
        (["pack", "--lengths", str(t / "deep.json"), "--max-tokens", "100"], "nests 10000 levels deep"),
        (["pack", "--workload", "sft", "--num-samples", str(10**12), "--max-tokens", "100"], "--num-samples"),
        (["pack", "--workload", "sft", "--num-samples", "10", "--max-tokens", "100", "--seed", "-1"], "--seed"),
        (["plan", "--doc-lengths", "3,4", "--cp-size", "2", "--profile", "/dev/zero"], "not a regular file"),
        (["plan", "--doc-lengths", "3,4", "--cp-size", "2", "--profile", str(t / "zero.json")], "prices all work"),
        (["plan", "--doc-lengths", "3,4", "--cp-size", str(10**7)], "cp_size must be an int >= 1 and <= 4096"),
        (["plan", "--doc-lengths", "3,4", "--cp-size", str(2**70)], "cp_size must be an int >= 1 and <= 4096"),
        (["plan", "--doc-lengths", "3,4", "--cp-size", "0"], "cp_size must be an int >= 1"),
        (["plan", "--doc-lengths", "3,True", "--cp-size", "2"], "must be comma-separated ints"),
        (["plan", "--doc-lengths", "9" * 5000, "--cp-size", "2"], r"--doc-lengths '9+\.\.\.' must be"),
        (["plan", "--doc-lengths", str(t / "bools.json"), "--cp-size", "2"], "bool|integer|int"),
        (["plan", "--doc-lengths", str(t / "deep.json"), "--cp-size", "2"], "nests 10000 levels deep"),
        (["plan", "--doc-lengths", "3,4", "--cp-size", "2", "--max-tokens-per-rank", str(2**70)],
         "max_tokens_per_rank must be >= 1"),
        (["plan", "--doc-lengths", "0,4", "--cp-size", "2"], "document 0 has length 0"),
        (["calibrate", "-o", "/nonexistent/p.json", "--quick"], "the folder '/nonexistent' does not exist"),
        (["calibrate", "-o", str(t), "--quick"], "is a directory"),
        (["calibrate", "--model", "/dev/zero", "-o", str(t / "p.json"), "--quick"], "not a regular file"),
        (["calibrate", "-o", str(t / "p.json"), "--quick", "--max-len", str(2**40)], "--max-len"),
        (["calibrate", "-o", str(t / "p.json"), "--quick", "--threads", "0"], "--threads"),
        # simulate: sizes that used to run for hours are refused at once
        (["simulate", "--dp", str(10**9), "--steps", "1"], "--dp=1000000000 must be from 1 to"),
        (["simulate", "--steps", str(10**12)], "--steps=1000000000000 must be from 1 to 10000"),
        (["simulate", "--max-tokens", str(2**70), "--steps", "1"], "--max-tokens=1180591620717411303424 must be"),
        (["simulate", "--steps", "1000", "--dp", "64", "--micro-batches", "64"], "packs to simulate, more than"),
        (["simulate", "--workload", "/dev/zero", "--steps", "1"], "not a regular file"),
        (["simulate", "--cp", str(10**7), "--steps", "1"], r"--max-tokens=131072 is smaller than --cp=10000000: .*lower --cp"),
    ]
    for argv, match in cases:
        _one_error_line(capsys, argv, match)
    assert main(["plan", "--doc-lengths", str(t / "lens.json"), "--cp-size", "2", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert all(min(r["rank_tokens"]) >= 1 for r in rows) and len(rows) >= 5


def test_calibrate_checks_its_output_before_measuring(capsys, tmp_path, monkeypatch):
    import atac_hf.cost.calibrate as calibrate_mod

    def measured(*a, **k):
        raise AssertionError("calibrate measured before checking its arguments")

    monkeypatch.setattr(calibrate_mod, "calibrate", measured)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # writing the profile there would block until a reader came
    _one_error_line(capsys, ["calibrate", "-o", str(fifo), "--quick"], "not a regular file")
    _one_error_line(capsys, ["calibrate", "-o", "/dev/null", "--quick"], "not a regular file")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        for out, match in (("/nonexistent/p.json", "does not exist"), (str(tmp_path), "is a directory")) + (
                () if os.geteuid() == 0 else ((str(locked / "p.json"), "not writable"),)):
            _one_error_line(capsys, ["calibrate", "-o", out, "--quick"], match)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("error", [TypeError("bad type"), OverflowError("int too large to convert"),
                                   RecursionError("maximum recursion depth exceeded"), MemoryError(),
                                   ZeroDivisionError("division by zero"), OSError(28, "No space left on device")])
def test_any_user_error_type_is_one_line_not_a_traceback(capsys, monkeypatch, error):
    import atac_hf.sharding.cli as plan_cli

    def boom(args):
        raise error

    monkeypatch.setattr(plan_cli, "run", boom)
    assert isinstance(error, USER_ERRORS)
    line = _one_error_line(capsys, ["plan", "--doc-lengths", "3", "--cp-size", "1"], type(error).__name__)
    assert line.startswith("atac-hf plan: error: ")


def test_no_hang_on_devices_through_the_real_entry_point(tmp_path):
    """The console script itself (a fresh process): reading /dev/zero used to hang forever or be
    killed for memory. Guarded by a subprocess timeout, which is a hang guard, not a speed limit."""
    cases = [["pack", "--lengths", "/dev/zero", "--max-tokens", "100"],
             ["pack", "--workload", "sft", "--num-samples", "20", "--max-tokens", "100", "--cost-profile", "/dev/zero"],
             ["plan", "--doc-lengths", "3,4", "--cp-size", "2", "--profile", "/dev/zero"],
             ["plan", "--doc-lengths", "3,4", "--cp-size", str(10**7)]]
    for argv in cases:
        proc = subprocess.run([sys.executable, "-m", "atac_hf.cli", *argv], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2, (argv, proc.stderr[-500:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"atac-hf {argv[0]}: error: "), proc.stderr[-500:]
        count("cli.subprocess_refusals")

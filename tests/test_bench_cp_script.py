"""`scripts/bench_cp.py --quick`: the CPU context-parallel benchmark runs end to end (gloo link
measurement, per-rank timing of every strategy) and writes its tables; numbers are not checked
here (benchmarks are measured in docs/BENCHMARKS.md, not asserted in tests)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 10-20 s on 2 cores: run with -m slow (CI runs it after the default suite)
def test_bench_cp_quick_runs_every_strategy(tmp_path):
    """Every strategy, and with ``--preset-plan`` the cost-model-driven ones planned with a GPU preset
    too, timed in the same run, with the calibrated-vs-preset table."""
    out, md = tmp_path / "cp.json", tmp_path / "cp.md"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_cp.py"), "--quick", "--skip-steps",
                    "--profile", str(ROOT / "configs" / "cost_cpu_tiny_llama.json"), "--length-scale", "8",
                    "--preset-plan", "8b@H100",
                    "--json-out", str(out), "--markdown-out", str(md)], check=True, cwd=ROOT, timeout=300)
    data = json.loads(out.read_text())
    preset = [f"{s} (preset-planned)" for s in ("per_doc", "wlb_adaptive", "atp")]
    assert [r["strategy"] for r in data["rows"]] == ["contiguous", "zigzag", "per_doc", "wlb_adaptive", "atp",
                                                     *preset]
    for r in data["rows"]:
        assert len(r["layer max s per pack"]) == len(r["same plan per pack"]) == 1
    assert "`8b@H100` preset" in md.read_text() and "| 2 | 4K | atp | " in md.read_text()
    bw, lat = data["links"]["2"]
    assert bw > 0 and lat >= 0
    for r in data["raw"]:
        assert len(r["rank_attn_s"]) == len(r["rank_linear_s"]) == 2 and min(r["rank_attn_s"]) > 0
        assert sum(r["lengths"]) > 0
    assert "| atp |" in md.read_text() and set(data["planner_ms"]) == {r["strategy"] for r in data["rows"]} - set(preset)


def test_bench_cp_refuses_a_bad_preset_before_any_work():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_cp.py"), "--preset-plan", "8b"],
                          cwd=ROOT, timeout=60, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--preset-plan: '8b': expected MODEL@GPU" in proc.stderr and "'H100'" in proc.stderr and "'7b'" in proc.stderr


@pytest.mark.slow  # 10-20 s on 2 cores: run with -m slow (CI runs it after the default suite)
def test_bench_atp_split_quick_runs_both_parts():
    """`scripts/bench_atp_split.py --quick`: the estimate table and the measured A/B run."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_atp_split.py"), "--quick",
                           "--profile", str(ROOT / "configs" / "cost_cpu_tiny_llama.json")],
                          check=True, cwd=ROOT, timeout=300, capture_output=True, text=True)
    assert proc.stdout.count("| 7b on A800 |") == 3 and proc.stdout.count("| 8b on H100 |") == 3
    assert "| 300 + 90" in proc.stdout and "ATP, two-way split" in proc.stdout

"""scripts/device_check.py (the one-shot GPU check) in its CPU smoke mode: every part runs
and reports ok, so the script cannot rot between GPU runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("a_exactness", "b_per_rank_time", "c_cp1_overhead", "d_calibration")


@pytest.mark.slow  # 10-20 s on 2 cores: run with -m slow (CI runs it after the default suite)
def test_device_check_cpu_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "--cpu-smoke", "--out",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "device_check.json").read_text())
    for key in PARTS:
        assert res["parts"][key]["status"] == "ok", (key, res["parts"][key])
    assert (tmp_path / "device_check.log").read_text().strip()
    assert (tmp_path / res["parts"]["d_calibration"]["profile"]).exists()
    # not vacuous: exactness checked real cases (gathers and every strategy), timing measured every rank
    a = res["parts"]["a_exactness"]
    assert a["num_cases"] >= 20 and a["num_passed"] == a["num_cases"]
    assert any(c["gathered_docs"] for c in a["cases"] if c["cp"] > 1)
    assert {c["strategy"] for c in a["cases"]} == {"contiguous", "zigzag", "per_doc", "wlb_adaptive", "atp"}
    rows = res["parts"]["b_per_rank_time"]["rows"]
    assert rows and all(len(st["rank_ms"]) == r["cp"] for r in rows for st in r["strategies"].values())
    c_rows = res["parts"]["c_cp1_overhead"]["rows"]
    assert {r["baseline"] for r in c_rows} >= {"hf_sdpa"}  # transformers' own packed-row path ran
    # fp32 cases are judged by the plain-attention rule (atac_hf.attention.tolerance), fp64 by 1e-10
    fp32 = [e for c in a["cases"] if c["dtype"] == "float32" for e in c["errors"]]
    assert fp32 and all({"plain_err", "bound", "ratio"} <= set(e) and e["ok"] for e in fp32)


def _script():
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts" / "device_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_check_gpu_settings_include_varlen_and_quick_halves_the_work():
    from atac_hf.attention.compat import torch_varlen_attn

    dc = _script()
    full, quick = dc.settings(dc.parse_args([])), dc.settings(dc.parse_args(["--quick"]))
    if torch_varlen_attn() is not None:
        for s in (full, quick):
            assert s["exact_backends"][0] == s["timing_backends"][0] == s["overhead_backends"][0] == "varlen"
    assert full["timing_tokens"] == [32768, 65536, 131072] and full["timing_cp"] == [4, 8]
    assert quick["timing_tokens"] == [32768, 131072] and quick["timing_kv_heads"] == [8] and quick["packs"] == 1
    assert quick["exact_cp"] == [2, 8] and quick["budget_s"] < full["budget_s"] and quick["quick"]


@pytest.mark.slow  # 10-20 s on 2 cores: run with -m slow (CI runs it after the default suite)
def test_device_cp_check_cpu_smoke(tmp_path):
    """scripts/device_cp_check.py (multi-rank CP training of a small model against the single-device
    model, the GPU check's part that runs whole HF models) in its CPU smoke mode: world 4, fp32."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_cp_check.py"), "--cpu-smoke", "--out",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "device_cp_check: PASS" in proc.stdout
    res = json.loads((tmp_path / "device_cp_check.json").read_text())
    (world,) = res["worlds"]
    assert world["status"] == "ok" and world["world"] == 4
    cases = world["cases"]
    # not vacuous: every strategy, ATP splits and both exchanges ran, every tensor judged by the rule
    assert {c["strategy"] for c in cases} == {"contiguous", "zigzag", "per_doc", "wlb_adaptive", "atp"}
    atp = [c for c in cases if c["strategy"] == "atp"]
    assert all(c["split_docs"] > 0 for c in atp)
    assert {c["kv_exchange"] for c in atp} == {"all_gather", "all_to_all"}
    assert all({ch["tensor"] for ch in c["checks"]} == {"logits", "loss", "grads"} for c in cases)
    assert all(ch["ok"] for c in cases for ch in c["checks"])

#!/usr/bin/env python
"""One-shot GPU check of the ``atac_cp`` attention: exactness, per-rank balance, cp_size-1
overhead and a calibration profile, in one process on one GPU (< 8 min on an H200).

Parts, run in this order (each in its own try/except; a failing part or item is
recorded in the JSON and the others still run; exactness first since the first H200 run,
where part c overran its share and part a started too late to run any case):

a. exactness: ``emulate_cp_attention`` (every rank in one process, the gather by
   concatenation) with the ``varlen``, ``sdpa`` and ``flex`` backends, bf16 and fp32 (varlen:
   bf16 only, the flash kernels take no fp32), every strategy, cp_size 2/4/8, forward and
   backward (dq, dk, dv), against float64 document-masked attention on the whole row. A case
   passes when each tensor's error is at most 2x that of plain PyTorch attention in the same
   dtype (one SDPA call over the whole row with a dense document mask) plus a floor of 1/64
   ulp (``atac_hf.attention.tolerance``, the rule of the GPU tests); fp64 (smoke):
   ``max|x - ref| / max(1, max|ref|) <= 1e-10``. The first pack runs once more in the first
   dtype with a sliding window (256; smoke 5): the window translation of each kernel.
d. calibration: ``atac_hf.cost.calibrate.calibrate("7b", device="cuda", backend=B)`` with B the
   default GPU backend (``varlen`` where torch has ``varlen_attn``, else ``sdpa``); the profile
   (with its held-out error) is saved under the output folder and plans part b.
c. cp_size-1 overhead of ``atac_cp_attention`` against what a user would otherwise run on one
   GPU (``scripts/_device_check/baselines.py``): the ``varlen`` backend against one plain
   ``varlen_attn`` call over the whole row (target <= 5%); ``sdpa``/``flex`` against
   transformers' own packed-row path (``create_causal_mask`` from ``position_ids``, then
   ``ALL_ATTENTION_FUNCTIONS["sdpa"/"flex_attention"]``) and against simple per-document
   loops; interleaved, median.
b. per-rank kernel time (forward + backward, CUDA events, warm-up, median of repeats)
   of every strategy on long-tail WFAP packs of 32K/64K/128K tokens, 32 heads, 8 (then
   32) kv heads, head_dim 128, bf16, cp_size 4 and 8: each rank timed alone on its real
   shard with the gathered buffer precomputed; max/mean and max per strategy. Targets:
   ``atp`` max/mean <= 1.05 and below every baseline. Items run in priority order (kv
   heads 8 before 32, first pack before second, varlen, sdpa, then flex, then 32K -> 128K
   and cp 4 -> 8) under a time budget (``--budget-s``, default 300 s, ``--quick`` 150 s: no
   item starts after it); what does not fit is listed as skipped.

Before the parts, a probe records whether the ``sdpa`` backend reaches a fused SDPA
kernel (``meta.sdpa_backend_fused``); where it runs the math kernel ((H, L, L) scores),
its part b/c items above the smallest size are skipped on CUDA (they would not fit).
The exit code is 0 whenever the JSON was written: read each part's ``status``
(``ok``, ``fail`` = a tolerance missed, ``partial``/``error`` = exceptions, recorded).

Run on the device machine (the working tree is the repo; nothing to install)::

    set -o pipefail; PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/device_check.py --out $OUT 2>&1 | tee $OUT/log.txt

with the ``run`` tool's ``timeout_s=540``. Files written to ``--out`` (default ``$OUT``):
``device_check.json`` (all numbers, errors, skipped items), ``device_check.log`` and
``cost_profile_cuda.json``. Commit them under ``docs/results/h200/`` and the summary
tables into ``docs/BENCHMARKS.md`` ("GPU check (H200)").

``--quick`` does about half the work (cp 2/8 in part a; 32K and 128K, kv heads 8, one pack
in part b; 32K in part c; the quick calibration grid). This script has not run on a GPU
yet (no device was lent when ``varlen`` was added): expect to fix what the first run shows.

CPU smoke mode (every part at tiny sizes, fp32/fp64, sdpa only; < 60 s; run by
``tests/test_device_check.py`` so that this script does not rot)::

    python scripts/device_check.py --cpu-smoke --out /tmp/dc
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):  # run from a plain checkout (no pip install on the device)
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

STRATEGIES = ("contiguous", "zigzag", "per_doc", "wlb_adaptive", "atp")
PARTS = ("a", "d", "c", "b")  # exactness first: on the first H200 run, c overran and starved a
PART_KEYS = {"a": "a_exactness", "b": "b_per_rank_time", "c": "c_cp1_overhead", "d": "d_calibration"}
# share of the budget after which a part starts no new item (b takes whatever is left)
PART_DEADLINE = {"a": 0.3, "d": 0.45, "c": 0.65, "b": 1.0}
HAND_PACK = [4096, 1, 700, 3, 1200, 1, 64, 129, 1000, 95, 900]  # 8188 tokens: tiny and long docs together


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "device_check_out", help="output folder (default $OUT)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU, fp32/fp64, sdpa only (< 60 s)")
    p.add_argument("--quick", action="store_true",
                   help="GPU, about half the work: cp 2/8 in part a, 32K and 128K with kv heads 8 and one pack in "
                        "part b, 32K in part c, the quick calibration grid (budget 150 s)")
    p.add_argument("--parts", default="dcab", help="subset of parts to run, any of 'dcab' (order is fixed)")
    p.add_argument("--budget-s", type=float, default=None, help="no new item starts after this (default 300; quick 150; smoke 120)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calib-model", default=None,
                   help="MODEL_PRESETS key calibrated in part d (default 7b; smoke tiny)")
    p.add_argument("--calib-quick", action="store_true", help="calibrate with the quick grid")
    p.add_argument("--exact-cp", type=int, nargs="+", default=None, help="cp sizes of part a (default 2 4 8)")
    p.add_argument("--exact-backends", nargs="+", default=None, help="part a backends (default sdpa flex varlen)")
    p.add_argument("--dtypes", nargs="+", default=None, help="part a dtypes (default bfloat16 float32)")
    p.add_argument("--timing-tokens", type=int, nargs="+", default=None, help="part b pack sizes (32K 64K 128K)")
    p.add_argument("--timing-cp", type=int, nargs="+", default=None, help="part b cp sizes (default 4 8)")
    p.add_argument("--timing-kv-heads", type=int, nargs="+", default=None, help="part b kv heads (default 8 32)")
    p.add_argument("--timing-backends", nargs="+", default=None, help="part b backends (default varlen sdpa flex)")
    p.add_argument("--packs", type=int, default=None,
                   help="part b packs per size: anchor-heavy, then median-cost (default 2; smoke 1)")
    p.add_argument("--overhead-tokens", type=int, nargs="+", default=None, help="part c pack sizes (32K 64K)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    return p.parse_args(argv)


def settings(args) -> dict:
    """Sizes per mode; command-line values override."""
    import torch

    from atac_hf.attention.compat import torch_varlen_attn

    smoke = args.cpu_smoke
    quick = args.quick and not smoke
    cuda = torch.cuda.is_available() and not smoke
    # torch's varlen_attn (CUDA): the default GPU backend when flash-attn is absent
    gpu = (["varlen"] if torch_varlen_attn() is not None else []) + ["sdpa", "flex"]
    s = dict(
        device="cuda" if cuda else "cpu",
        budget_s=120.0 if smoke else (150.0 if quick else 300.0),  # smoke: a loaded CI box calibrates slowly
        calib_model="tiny" if smoke else "7b",
        exact_heads=(4, 2, 16) if smoke else (32, 8, 128),
        exact_packs=[[40, 1, 3, 17, 1, 9, 30]] if smoke else [HAND_PACK],
        exact_longtail_tokens=128 if smoke else 8192,
        exact_window=5 if smoke else 256,  # one extra pass: the first pack with a sliding window
        exact_cp=[2, 4] if smoke else ([2, 8] if quick else [2, 4, 8]),
        exact_backends=["sdpa"] if smoke else gpu,
        dtypes=["float32", "float64"] if smoke else ["bfloat16", "float32"],
        timing_heads=(4, 16) if smoke else (32, 128),
        timing_tokens=[384] if smoke else ([32768, 131072] if quick else [32768, 65536, 131072]),
        timing_cp=[2, 4] if smoke else [4, 8],
        timing_kv_heads=[2] if smoke else ([8] if quick else [8, 32]),
        timing_backends=["sdpa"] if smoke else gpu,
        timing_dtype="float32" if smoke else "bfloat16",
        overhead_tokens=[384] if smoke else ([32768] if quick else [32768, 65536]),
        overhead_backends=["sdpa"] if smoke else gpu,
        workload_scale=1 / 256 if smoke else 1.0,
        packs=1 if smoke or quick else 2,
        warmup=1,
        repeats=1 if smoke else 3,
        overhead_repeats=3 if smoke else 7,
    )
    for k in ("budget_s", "calib_model", "exact_cp", "exact_backends", "dtypes", "timing_tokens", "timing_cp",
              "timing_kv_heads", "timing_backends", "packs", "warmup", "repeats"):
        v = getattr(args, k, None)
        if v is not None:
            s[k] = v
    if args.overhead_tokens is not None:
        s["overhead_tokens"] = args.overhead_tokens
    s["seed"] = args.seed
    s["quick"] = quick
    s["calib_backend"] = "varlen" if cuda and "varlen" in gpu else "sdpa"
    return s


# ---------------------------------------------------------------------------- bookkeeping
class Run:
    """Results, log and time budget of one run; the JSON is rewritten after every part."""

    def __init__(self, out: Path, budget_s: float):
        self.out, self.budget_s, self.t0 = out, budget_s, time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        self.log_path = out / "device_check.log"
        self.log_path.write_text("")
        self.json_path = out / "device_check.json"
        self.results: dict = {"meta": {}, "settings": {}, "parts": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, msg: str) -> None:
        line = f"[{self.elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        with self.log_path.open("a") as f:
            f.write(line + "\n")

    def over(self, part: str) -> bool:
        return self.elapsed() > PART_DEADLINE[part] * self.budget_s

    def save(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 2)
        self.json_path.write_text(json.dumps(self.results, indent=1, default=_jsonable))


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:600]}"


def _free():
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment(dev: str) -> dict:
    import torch

    meta = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "device": dev, "float32_matmul_precision": torch.get_float32_matmul_precision()}
    for mod in ("transformers", "accelerate", "triton", "flash_attn"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception as e:  # optional: absent on some machines
            meta[mod] = f"unavailable ({type(e).__name__})"
    if dev == "cuda":
        meta.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                    gpu_mem_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    try:
        meta["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                            timeout=10).stdout.strip() or None
    except Exception:
        meta["git_commit"] = None
    return meta


def sdpa_backend_fused(dev: str) -> bool | str:
    """Whether the ``sdpa`` backend's causal calls reach a fused SDPA kernel (flash /
    efficient / cuDNN) rather than the math kernel, which materialises (H, L, L) scores."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from atac_hf.attention.backends import run_backend
    from atac_hf.sharding import plan_shards

    fused = [getattr(SDPBackend, n) for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
             if hasattr(SDPBackend, n)]
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    q, k, v = (torch.randn(4, 64, 64, device=dev, dtype=dtype) for _ in range(3))
    plan = plan_shards([64], 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with sdpa_kernel(fused):
                run_backend("sdpa", q, k, v, plan.local_layout(0), {}, None, scaling=0.125, window=None)
        return True
    except RuntimeError as e:
        return False if "No available kernel" in str(e) else _err(e)


# ---------------------------------------------------------------------------- packs
def longtail_packs(tokens: int, n: int, cm, seed: int, scale: float) -> list[list[int]]:
    """WFAP packs of ``tokens`` from the built-in long-tail workload (lengths x ``scale``):
    the mixed pack (>= 4 docs) with the longest document, then the median-cost pack."""
    from atac_hf.packing import PackingConfig, pack_lengths
    from atac_hf.workloads import make_workload

    num = max(64, int(48 * tokens / (3000 * scale)))
    lengths = np.maximum(1, np.round(make_workload("longtail", num, seed=seed) * scale)).astype(np.int64)
    res = pack_lengths(lengths, PackingConfig(max_tokens=tokens, packs_per_window=8), cm)
    packs = [[int(e - s) for _, s, e in p] for p in res.packs]
    mixed = [p for p in packs if len(p) >= 4] or packs
    chosen = [max(mixed, key=lambda p: (max(p), sum(p)))]
    costs = np.array([cm.pack_cost(p) for p in packs])
    chosen.append(packs[int(np.argsort(costs)[len(costs) // 2])])
    return chosen[:n]


def _pack_info(lens) -> dict:
    return {"tokens": int(sum(lens)), "docs": len(lens), "max_doc": int(max(lens)),
            "lengths": [int(x) for x in lens] if len(lens) <= 64 else None}


def _qkv(N: int, H: int, K: int, D: int, dtype, device, seed: int):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(h, N, D, generator=g, device=device, dtype=torch.float32).to(dtype) for h in (H, K, K)]


# ---------------------------------------------------------------------------- part d
def part_calibration(run: Run, s: dict) -> dict:
    from atac_hf.cost.calibrate import calibrate

    kw = {}
    if s["device"] == "cpu":  # a handful of tiny measurements: seconds, not a faithful profile
        kw["grid"] = dict(linear=[64, 128, 256], attention=[[64], [128], [32] * 4, [16] * 8],
                          heldout=[[96, 32], [24] * 6], repeats=2)
    res = calibrate(s["calib_model"], device=s["device"], quick=s.get("calib_quick", False), backend=s["calib_backend"],
                    progress=lambda m: run.say(f"  calibrate: {m}"), **kw)
    path = run.out / f"cost_profile_{s['device']}.json"
    res.save(str(path))
    run.say(res.summary())
    cm = res.cost_model
    return {"status": "ok", "profile": path.name, "model": s["calib_model"], "backend": s["calib_backend"],
            "device_name": res.device,
            "linear_s_per_token": cm.linear_s_per_token, "attn_s_per_pair": cm.attn_s_per_pair,
            "segment_overhead_s": cm.segment_overhead_s, "tile": cm.tile,
            "heldout_max_rel_err": res.max_rel_err, "heldout_mean_rel_err": res.mean_rel_err,
            "seconds": res.seconds, "summary": res.summary(), "_cost_model": cm}


# ---------------------------------------------------------------------------- part a
def _errors(got, ref) -> list[dict]:
    rows = []
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        ad = (x.double() - r).abs().max().item()
        scale = max(1.0, r.abs().max().item())
        rows.append({"tensor": name, "max_abs_err": ad, "scaled_err": ad / scale})
    return rows


def _plain_lowp_errors(q, k, v, lens, scale, gout, ref, window=None) -> tuple[list[dict], str]:
    """Errors of plain PyTorch attention in q's dtype (one SDPA call over the whole row, dense
    document mask) against ``ref``; a fused kernel when one takes the mask, else whatever
    SDPA picks (named in the second return value)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from atac_hf.attention.reference import doc_mask_dense, doc_masked_sdpa_dense

    mask = doc_mask_dense(lens, q.device, window)

    def run_once():
        out = doc_masked_sdpa_dense(q, k, v, lens, scaling=scale, mask=mask)
        return _errors((out, *torch.autograd.grad(out, (q, k, v), gout)), ref)

    fused = [getattr(SDPBackend, n) for n in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "FLASH_ATTENTION")
             if hasattr(SDPBackend, n)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with sdpa_kernel(fused):
                return run_once(), "fused SDPA kernel"
    except RuntimeError as e:
        if "No available kernel" not in str(e):
            raise
    return run_once(), "SDPA default choice (no fused kernel took the mask)"


def part_exactness(run: Run, s: dict) -> dict:
    import torch

    from atac_hf.attention import emulate_cp_attention
    from atac_hf.attention.reference import reference_attention
    from atac_hf.attention.tolerance import check_errors
    from atac_hf.cost import CostModel
    from atac_hf.sharding import plan_shards

    dev = s["device"]
    H, K, D = s["exact_heads"]
    scale = D ** -0.5
    cm = CostModel.from_model("7b", "H200")
    packs = list(s["exact_packs"])
    wl_scale = s["exact_longtail_tokens"] / 131072
    packs += longtail_packs(s["exact_longtail_tokens"], 1, cm, s["seed"], wl_scale)
    tol64 = 1e-10  # float64 runs against the float64 reference: no plain-attention rule
    cases, failures, errors, skipped, plain_kernels = [], [], [], [], {}
    backends = list(s["exact_backends"])
    if dev == "cpu" and "flex" in backends:
        backends.remove("flex")
        skipped.append("flex on CPU: flex_attention has no CPU backward")
    min_chunk = 128 if dev == "cuda" else 1
    from atac_hf.attention.compat import torch_varlen_attn

    varlen_fn = torch_varlen_attn()
    for pi, lens in enumerate(packs):
        N = int(sum(lens))
        # every dtype without a window; the first pack once more in the first dtype with a sliding window
        combos = [(d, None) for d in s["dtypes"]] + ([(s["dtypes"][0], s["exact_window"])]
                                                      if pi == 0 and s.get("exact_window") else [])
        for dname, window in combos:
            wtag = "" if window is None else f" window {window}"
            if run.over("a"):
                skipped.append(f"pack {pi} {dname}{wtag}: time budget")
                continue
            dtype = getattr(torch, dname)
            try:
                q, k, v = (t.requires_grad_() for t in _qkv(N, H, K, D, dtype, dev, s["seed"] + pi))
                g = torch.Generator(device=dev).manual_seed(s["seed"] + 100 + pi)
                gout = torch.randn(N, H, D, generator=g, device=dev).to(dtype)
                ref_out, ref_grads = reference_attention(q, k, v, lens, scaling=scale, window=window,
                                                         grad_out_NHD=gout)
                ref = (ref_out, *ref_grads)
                ref_max = [r.abs().max().item() for r in ref]
                base = None
                if dname != "float64":  # plain PyTorch attention in the same dtype
                    base, plain_kernel = _plain_lowp_errors(q, k, v, lens, scale, gout, ref, window)
                    plain_kernels[f"pack {pi} {dname}{wtag}"] = plain_kernel
                    run.say(f"  a: pack {pi} ({N} tok) {dname}{wtag} plain whole-row SDPA ({plain_kernel}) errors: "
                            + ", ".join(f"{e['tensor']} {e['max_abs_err']:.2e}" for e in base))
            except Exception as e:  # noqa: BLE001 - recorded, the other dtypes/packs still run
                errors.append({"pack": pi, "dtype": dname, "stage": "reference", "error": _err(e),
                               "trace": traceback.format_exc(limit=3)})
                run.say(f"  a: reference failed: {_err(e)}")
                _free()
                continue
            for backend in backends:
                if backend in ("varlen", "flash") and dname not in ("bfloat16", "float16"):
                    skipped.append(f"pack {pi} {dname} {backend}: the flash kernels take float16/bfloat16 only")
                    continue
                if backend == "varlen" and window is not None and not (varlen_fn and varlen_fn.takes_window):
                    skipped.append(f"pack {pi} {dname}{wtag} varlen: this torch's varlen_attn has no window_size")
                    continue
                for C in s["exact_cp"]:
                    for strategy in STRATEGIES:
                        case = {"pack": pi, "tokens": N, "dtype": dname, "window": window, "backend": backend,
                                "cp": C, "strategy": strategy}
                        try:
                            plan = plan_shards(lens, C, strategy, cm, min_chunk=min_chunk)
                            case["gathered_docs"] = len(plan.gathered_docs)
                            out = emulate_cp_attention(q, k, v, plan, backend=backend, scaling=scale, window=window)
                            got = (out, *torch.autograd.grad(out, (q, k, v), gout))
                            errs = _errors(got, ref)
                            if base is not None:  # the rule of atac_hf.attention.tolerance
                                checks = check_errors([e["max_abs_err"] for e in errs],
                                                      [b["max_abs_err"] for b in base], ref_max, dtype)
                                for e, c in zip(errs, checks):
                                    e.update(plain_err=c.plain_err, bound=c.bound, ratio=c.ratio, ok=c.ok)
                            else:
                                for e in errs:
                                    e["ok"] = e["scaled_err"] <= tol64
                            case["errors"] = errs
                            case["ok"] = all(e["ok"] for e in errs)
                            if not case["ok"]:
                                failures.append(case)
                        except Exception as e:  # noqa: BLE001
                            case.update(ok=False, error=_err(e))
                            errors.append(case)
                            _free()
                        cases.append(case)
                    group = [c for c in cases if c["pack"] == pi and c["dtype"] == dname and c["backend"] == backend
                             and c["cp"] == C and c["window"] == window]
                    n_ok = sum(c.get("ok", False) for c in group)
                    run.say(f"  a: pack {pi} {dname}{wtag} {backend} cp{C}: {n_ok}/{len(group)} strategies within "
                            "tolerance"
                            + "".join(f"; {c['strategy']}: {c.get('error', 'err')}" for c in group
                                      if "error" in c))
            del q, k, v, ref, ref_out, ref_grads
            _free()
    status = "error" if errors and not cases else ("fail" if failures or errors else "ok")
    summary = {}
    for c in cases:
        key = f"{c['dtype']}/{c['backend']}" + ("" if c["window"] is None else f"/window {c['window']}")
        d = summary.setdefault(key, {"cases": 0, "passed": 0, "worst_scaled_err": 0.0, "worst_ratio_to_plain": 0.0})
        d["cases"] += 1
        d["passed"] += bool(c.get("ok"))
        for e in c.get("errors", []):
            d["worst_scaled_err"] = max(d["worst_scaled_err"], e["scaled_err"])
            d["worst_ratio_to_plain"] = max(d["worst_ratio_to_plain"], e.get("ratio", 0.0))
    return {"status": status, "criterion": "bf16 and fp32 (atac_hf.attention.tolerance): max|x-ref| <= 2 x "
            "max|x_plain-ref| + eps(dtype) * max(1, max|ref|) / 64 for out, dq, dk, dv, x_plain = plain whole-row "
            "SDPA (dense document mask) in the same dtype; fp64: max|x-ref|/max(1,max|ref|) <= 1e-10; "
            "ref = float64 per-document attention",
            "heads": [H, K, D], "packs": [_pack_info(p) for p in packs], "plain_kernels": plain_kernels,
            "summary": summary,
            "num_cases": len(cases), "num_passed": sum(bool(c.get("ok")) for c in cases),
            "failures": failures[:20], "errors": errors[:20], "skipped": skipped, "cases": cases}


def _math_sdpa_too_big(s: dict, backend: str, T: int, sizes) -> bool:
    return s["device"] == "cuda" and backend == "sdpa" and s.get("sdpa_fused") is not True and T > min(sizes)


# ---------------------------------------------------------------------------- part c
def part_overhead(run: Run, s: dict) -> dict:
    import torch

    from _device_check.baselines import BASELINES, BUILDERS
    from atac_hf.attention import ShardContext, atac_cp_attention
    from atac_hf.attention.timing import time_calls
    from atac_hf.cost import CostModel
    from atac_hf.sharding import plan_shards

    dev = s["device"]
    H, D = s["timing_heads"]
    K = s["timing_kv_heads"][0]
    dtype = getattr(torch, s["timing_dtype"])
    scale = D ** -0.5
    cm = CostModel.from_model("7b", "H200")
    rows, errors, skipped = [], [], []
    backends = [b for b in s["overhead_backends"] if not (b in ("flex", "varlen") and dev == "cpu")]
    module = torch.nn.Module()  # a stand-in attention module (no config: nothing to check)
    for T in s["overhead_tokens"]:
        lens = longtail_packs(T, 1, cm, s["seed"], s["workload_scale"])[0]
        N = int(sum(lens))
        # (N, H, D) leaves, as a model's projections give them; the attention sees (1, H, N, D) views
        q, k, v = (t.transpose(0, 1).contiguous().requires_grad_() for t in _qkv(N, H, K, D, dtype, dev, s["seed"]))
        gout = torch.randn(N, H, D, device=dev, dtype=dtype)
        plan = plan_shards(lens, 1, "atp", cm)
        for backend in backends:
            if rows and run.over("c"):  # the first item always runs
                skipped.append(f"{T} {backend}: time budget")
                continue
            if _math_sdpa_too_big(s, backend, T, s["overhead_tokens"]):
                skipped.append(f"{T} {backend}: the sdpa backend runs the math kernel here (would not fit)")
                continue
            ctx = ShardContext(plan=plan, rank=0, layout=plan.local_layout(0), backend=backend)

            def atac():
                out, _ = atac_cp_attention(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], None, scaling=scale, atac_shard=ctx)
                out[0].backward(gout)

            def zero():
                q.grad = k.grad = v.grad = None

            for base in BASELINES[backend]:
                if base == "hf_flex" and dev == "cpu":
                    continue
                tag = f"{N} tok {len(lens)} docs {backend} vs {base}"
                try:
                    plain_run = BUILDERS[base](q, k, v, lens, scale)
                    t_atac, t_plain = time_calls([atac, lambda: plain_run(gout)], device=dev, warmup=2,
                                                 repeats=s["overhead_repeats"], before=[zero, zero])
                    a, p = statistics.median(t_atac), statistics.median(t_plain)
                    row = {"tokens": N, "docs": len(lens), "max_doc": max(lens), "backend": backend, "baseline": base,
                           "atac_cp1_ms": 1e3 * a, "plain_ms": 1e3 * p, "overhead": a / p - 1,
                           "target_met": a / p - 1 <= 0.05, "atac_samples_ms": [1e3 * x for x in t_atac],
                           "plain_samples_ms": [1e3 * x for x in t_plain]}
                    rows.append(row)
                    run.say(f"  c: {tag}: atac cp1 {1e3 * a:.2f} ms vs {1e3 * p:.2f} ms ({100 * (a / p - 1):+.1f}%)")
                except Exception as e:  # noqa: BLE001
                    errors.append({"tokens": N, "backend": backend, "baseline": base, "error": _err(e),
                                   "trace": traceback.format_exc(limit=3)})
                    run.say(f"  c: {tag} failed: {_err(e)}")
                _free()
        del q, k, v, gout
        _free()
    status = "error" if errors and not rows else ("partial" if errors else "ok")
    return {"status": status, "heads": [H, K, D], "dtype": s["timing_dtype"], "rows": rows, "errors": errors,
            "skipped": skipped, "baselines": {b: list(x) for b, x in BASELINES.items()},
            "target": "atac_cp (cp_size 1, varlen backend) within 5% of plain varlen attention over the whole row "
                      "(varlen_row); the other rows compare with transformers' own packed-row path (hf_sdpa, "
                      "hf_flex: mask from position_ids, built once outside the timed call) and simple loops",
            "all_targets_met": bool(rows) and all(r["target_met"] for r in rows if r["baseline"] == "varlen_row")}


# ---------------------------------------------------------------------------- part b
def part_per_rank(run: Run, s: dict, cm_cal) -> dict:
    import torch

    from atac_hf.attention.timing import per_rank_times
    from atac_hf.cost import HARDWARE_PRESETS, CostModel
    from atac_hf.sharding import plan_shards

    dev = s["device"]
    H, D = s["timing_heads"]
    dtype = getattr(torch, s["timing_dtype"])
    dtype_bytes = torch.empty(0, dtype=dtype).element_size()
    if cm_cal is not None:
        hw = HARDWARE_PRESETS["H200"]  # one GPU cannot measure the CP link: NVLink figures of the preset
        base_cm, cm_source = cm_cal.replace(link_bandwidth=hw.intra_node_bw, link_latency_s=hw.link_latency_s), \
            "calibrated in part d (link figures from HARDWARE_PRESETS['H200'])"
    else:
        base_cm, cm_source = CostModel.from_model("7b", "H200"), 'CostModel.from_model("7b", "H200") (no calibration)'
    min_chunk = 128 if dev == "cuda" else 1
    packs = {T: longtail_packs(T, s["packs"], base_cm, s["seed"], s["workload_scale"]) for T in s["timing_tokens"]}
    # priority: kv heads, then pack, then backend; sizes and cp cheapest first
    items = [(kv, pi, backend, T, C) for kv in s["timing_kv_heads"] for pi in range(s["packs"])
             for backend in s["timing_backends"] for T in s["timing_tokens"] for C in s["timing_cp"]
             if pi < len(packs[T]) and not (backend == "flex" and dev == "cpu")]
    rows, errors, skipped = [], [], []
    for kv, pi, backend, T, C in items:
        lens = packs[T][pi]
        tag = f"{T} tok pack {pi} kv{kv} {backend} cp{C}"
        if run.over("b"):
            skipped.append(f"{tag}: time budget")
            continue
        if _math_sdpa_too_big(s, backend, T, s["timing_tokens"]):
            skipped.append(f"{tag}: the sdpa backend runs the math kernel here (would not fit)")
            continue
        cm = base_cm.replace(kv_bytes_per_token=2.0 * kv * D * dtype_bytes)
        N = int(sum(lens))
        try:
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
            q, k, v = _qkv(N, H, kv, D, dtype, dev, s["seed"] + pi)
            g = torch.Generator(device=dev).manual_seed(s["seed"])
            per = {}
            for strategy in STRATEGIES:
                t0 = time.perf_counter()
                plan = plan_shards(lens, C, strategy, cm, min_chunk=min_chunk)
                plan_ms = 1e3 * (time.perf_counter() - t0)
                times = per_rank_times(plan, q, k, v, backend=backend, warmup=s["warmup"], repeats=s["repeats"],
                                       generator=g)
                pred = np.asarray(plan.rank_compute_s, dtype=np.float64)
                pred_ratio = float(pred.max() / pred.mean()) if pred.mean() > 0 else None
                per[strategy] = {"rank_ms": [1e3 * t for t in times], "max_ms": 1e3 * max(times),
                                 "max_over_mean": max(times) / (sum(times) / len(times)),
                                 "predicted_max_over_mean": pred_ratio,
                                 "gathered_docs": len(plan.gathered_docs), "plan_ms": plan_ms}
                _free()
            atp = per["atp"]
            base = [per[x] for x in STRATEGIES if x != "atp"]
            row = {"tokens": N, "pack_tokens": T, "pack": pi, "docs": len(lens), "max_doc": max(lens), "kv_heads": kv,
                   "backend": backend, "cp": C, "strategies": per,
                   "atp_balance_target_met": atp["max_over_mean"] <= 1.05
                   and all(atp["max_over_mean"] < b["max_over_mean"] for b in base),
                   "atp_max_ms_vs_best_baseline": atp["max_ms"] / min(b["max_ms"] for b in base),
                   "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev == "cuda" else None}
            rows.append(row)
            run.say(f"  b: {tag} ({N} tok, {len(lens)} docs, longest {max(lens)}): "
                    + "  ".join(f"{x} {per[x]['max_over_mean']:.3f}/{per[x]['max_ms']:.1f}ms" for x in STRATEGIES))
            del q, k, v
        except Exception as e:  # noqa: BLE001
            errors.append({"item": tag, "error": _err(e), "trace": traceback.format_exc(limit=3)})
            run.say(f"  b: {tag} failed: {_err(e)}")
        _free()
        run.results["parts"][PART_KEYS["b"]] = {"status": "running", "rows": rows}
        run.save()
    status = "error" if errors and not rows else ("partial" if errors else "ok")
    return {"status": status, "cost_model": cm_source, "cost_model_coefficients": base_cm.to_dict(),
            "heads": [H, D], "dtype": s["timing_dtype"], "warmup": s["warmup"], "repeats": s["repeats"],
            "packs": {str(T): [_pack_info(p) for p in ps] for T, ps in packs.items()},
            "target": "atp max/mean <= 1.05 and below every baseline's",
            "rows": rows, "errors": errors, "skipped": skipped}


# ---------------------------------------------------------------------------- report
def summary_lines(res: dict) -> list[str]:
    P = res["parts"]
    lines = ["", "=== device check summary ===", f"meta: {json.dumps(res['meta'])}"]
    for key in PART_KEYS.values():
        p = P.get(key)
        if p is not None:
            lines.append(f"{key}: {p.get('status')}" + (f" ({p['error']})" if p.get("error") else ""))
    a = P.get(PART_KEYS["a"], {})
    for k, d in (a.get("summary") or {}).items():
        lines.append(f"  a {k}: {d['passed']}/{d['cases']} pass, worst scaled err {d['worst_scaled_err']:.2e}"
                     + (f", worst error ratio to plain SDPA in the same dtype {d['worst_ratio_to_plain']:.2f}"
                        if d["worst_ratio_to_plain"] else ""))
    for r in P.get(PART_KEYS["c"], {}).get("rows", []):
        lines.append(f"  c {r['tokens']} tok {r['backend']} vs {r['baseline']}: atac cp1 {r['atac_cp1_ms']:.2f} ms, "
                     f"baseline {r['plain_ms']:.2f} ms, overhead {100 * r['overhead']:+.1f}%")
    b = P.get(PART_KEYS["b"], {})
    if b.get("rows"):
        lines.append("  b | tokens | pack | kv | backend | cp | " + " | ".join(STRATEGIES)
                     + " | (max/mean, max ms)")
    for r in b.get("rows", []):
        lines.append(f"  b | {r['tokens']} | {r['pack']} | {r['kv_heads']} | {r['backend']} | {r['cp']} | "
                     + " | ".join(f"{r['strategies'][x]['max_over_mean']:.3f}, {r['strategies'][x]['max_ms']:.1f}"
                                  for x in STRATEGIES))
    for x in b.get("skipped", []):
        lines.append(f"  b skipped: {x}")
    d = P.get(PART_KEYS["d"], {})
    if d.get("status") == "ok":
        lines.append(f"  d: attn_s_per_pair {d['attn_s_per_pair']:.3e}, linear_s_per_token "
                     f"{d['linear_s_per_token']:.3e}, held-out max err {100 * d['heldout_max_rel_err']:.1f}%")
    lines.append(f"elapsed {res.get('elapsed_s')} s")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    s = settings(args)
    s["calib_quick"] = args.calib_quick or s["quick"]
    run = Run(Path(args.out), s["budget_s"])
    if s["device"] == "cpu":
        torch.set_num_threads(1)  # tiny kernels: more threads only add overhead
    torch.manual_seed(args.seed)
    torch.set_float32_matmul_precision("highest")  # fp32 exactness: no TF32
    try:  # flex sees many shard shapes: never fall back to eager (dense scores) on the recompile limit
        import torch._dynamo as dynamo

        name = "recompile_limit" if hasattr(dynamo.config, "recompile_limit") else "cache_size_limit"
        setattr(dynamo.config, name, max(64, getattr(dynamo.config, name)))
    except Exception:  # noqa: BLE001
        pass
    run.results["meta"] = environment(s["device"])
    try:
        s["sdpa_fused"] = run.results["meta"]["sdpa_backend_fused"] = sdpa_backend_fused(s["device"])
    except Exception as e:  # noqa: BLE001
        s["sdpa_fused"] = run.results["meta"]["sdpa_backend_fused"] = _err(e)
    if s["sdpa_fused"] is not True:
        run.say("WARNING: the sdpa backend does not reach a fused SDPA kernel here (math kernel, (H, L, L) "
                "scores)" + ("; on CUDA its part b/c items above the smallest size are skipped" if s["device"] ==
                             "cuda" else ""))
    run.results["settings"] = {k: v for k, v in s.items()}
    run.say(f"device check on {run.results['meta'].get('gpu', s['device'])}; budget {s['budget_s']:.0f} s; "
            f"out {run.out}")
    run.save()
    wanted = [p for p in PARTS if p in args.parts]
    cm_cal = None
    for part in PARTS:
        key = PART_KEYS[part]
        if part not in wanted:
            continue
        run.say(f"part {key} ...")
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if part == "d":
                    res = part_calibration(run, s)
                    cm_cal = res.pop("_cost_model")
                elif part == "a":
                    res = part_exactness(run, s)
                elif part == "c":
                    res = part_overhead(run, s)
                else:
                    res = part_per_rank(run, s, cm_cal)
            except Exception as e:  # noqa: BLE001 - one failing part must not lose the others
                res = {"status": "error", "error": _err(e), "trace": traceback.format_exc(limit=8)}
                run.say(f"part {key} failed: {_err(e)}")
        res["seconds"] = round(time.perf_counter() - t0, 2)
        res["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:200]}" for w in caught})[:10]
        run.results["parts"][key] = res
        run.say(f"part {key}: {res['status']} in {res['seconds']:.1f} s")
        run.save()
        _free()
    run.save()
    for line in summary_lines(run.results):
        run.say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

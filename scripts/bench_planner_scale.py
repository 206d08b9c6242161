#!/usr/bin/env python
"""Planner CPU time and memory at scale (red-team 19's cases): ATP at CP 16-256, and WFAP on packs of
thousands of tiny samples. A planning call that takes seconds stalls training as a hang would.

* ``atp-cp``: long-tail packs of 8K tokens per rank at CP 16..256, the 8B-on-A800 cluster model with
  8 GPUs per node, ``min_chunk=128`` (the CUDA default), no cap;
* ``atp-equal``: 192 / 320 / 448 equal documents of 300 tokens at CP 128 (no anchor count levels the ranks);
* ``atp-tight``: a 4M-token pack of the ``sft`` mix at CP 128 with the cap ``ceil(tokens / C)``;
* ``wfap-tiny``: 4 packs' worth of 1-20-token samples at caps of 64K-256K tokens (time, then the peak
  traced memory of a second call).

    python scripts/bench_planner_scale.py                # all
    python scripts/bench_planner_scale.py --only atp-cp --cp 16,32,64,128

Times are CPU seconds of one call (``time.process_time``); compare trees with ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from atac_hf.cost import default_cost_model
from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.sharding import plan_shards
from atac_hf.sim import ClusterConfig
from atac_hf.workloads import load_workload


def _pack(pool: np.ndarray, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Documents drawn from ``pool`` (each cut to ``tokens``) until they hold ``tokens``."""
    L = np.minimum(pool[rng.integers(0, len(pool), 200_000)], tokens).astype(np.int64)
    return L[:max(1, int(np.searchsorted(np.cumsum(L), tokens)))]


def _timed(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def atp_cp(cps: list[int]) -> None:
    pool = load_workload("longtail", num_samples=200_000, seed=1)
    print("| CP | tokens | documents | ATP CPU s | imbalance |\n|---|---|---|---|---|")
    for C in cps:
        L = _pack(pool, 8192 * C, np.random.default_rng(0))
        cm = ClusterConfig(model="8b", hardware="A800", cp_size=C, gpus_per_node=8, max_tokens=1 << 22).cost_model()
        plan, s = _timed(lambda: plan_shards(L, C, "atp", cm, min_chunk=128))
        print(f"| {C} | {int(L.sum()):,} | {len(L)} | {s:.3f} | {plan.imbalance:.4f} |", flush=True)


def atp_equal() -> None:
    print("| documents (300 tokens) | CP | ATP CPU s | block ms |\n|---|---|---|---|")
    for D in (192, 320, 448):
        plan, s = _timed(lambda: plan_shards(np.full(D, 300, np.int64), 128, "atp", default_cost_model()))
        print(f"| {D} | 128 | {s:.3f} | {plan.block_time_s * 1e3:.4f} |", flush=True)


def atp_tight() -> None:
    L = _pack(load_workload("sft", num_samples=200_000, seed=1), 1 << 22, np.random.default_rng(0))
    C = 128
    cap = -(-int(L.sum()) // C)
    print("| model | documents | tokens | cap | ATP CPU s | imbalance |\n|---|---|---|---|---|---|")
    for model, hw in (("70b", "H100"), ("8b", "A800")):
        cm = ClusterConfig(model=model, hardware=hw, cp_size=C, gpus_per_node=8, max_tokens=1 << 22).cost_model()
        plan, s = _timed(lambda: plan_shards(L, C, "atp", cm, max_tokens_per_rank=cap, min_chunk=128))
        print(f"| {model} on {hw} | {len(L)} | {int(L.sum()):,} | {cap} | {s:.2f} | {plan.imbalance:.4f} |", flush=True)


def wfap_tiny(caps: list[int]) -> None:
    print("| cap | samples per pack | packs | WFAP CPU s | peak traced MiB |\n|---|---|---|---|---|")
    for cap in caps:
        L = np.random.default_rng(0).integers(1, 21, int(4 * cap / 10.5))
        res, s = _timed(lambda: pack_lengths(L, PackingConfig(max_tokens=cap, packs_per_window=4)))
        tracemalloc.start()  # a second call, traced (tracing slows Python down several times)
        pack_lengths(L, PackingConfig(max_tokens=cap, packs_per_window=4))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"| {cap:,} | {len(L) // 4:,} | {len(res.packs)} | {s:.2f} | {peak / 2**20:.0f} |", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["atp-cp", "atp-equal", "atp-tight", "wfap-tiny"], action="append",
                   help="run only these cases (repeatable; default: all)")
    p.add_argument("--cp", default="16,32,64,128,256", help="CP sizes of atp-cp (comma-separated)")
    p.add_argument("--caps", default="65536,131072,262144", help="pack caps of wfap-tiny (comma-separated)")
    args = p.parse_args(argv)
    only = set(args.only or ["atp-cp", "atp-equal", "atp-tight", "wfap-tiny"])
    if "atp-cp" in only:
        atp_cp([int(x) for x in args.cp.split(",")])
    if "atp-equal" in only:
        atp_equal()
    if "atp-tight" in only:
        atp_tight()
    if "wfap-tiny" in only:
        wfap_tiny([int(x) for x in args.caps.split(",")])


if __name__ == "__main__":
    main()

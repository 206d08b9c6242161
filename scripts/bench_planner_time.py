#!/usr/bin/env python
"""ATP planner time and plan identity (issue 16: "the planner stays under 1 ms for a 128K pack
at CP 8").

A fixed corpus of packs (wlbllm lengths and the built-in long-tail mix packed with WFAP at
32K/64K/128K, 256K for CP 16; random packs with token caps and ``min_chunk`` values, like the
property tests) is planned by :func:`~atac_hf.sharding.plan_shards` with ``"atp"`` for the
default cost model at CP 2/4/8 and for the cluster cost models of
``scripts/bench_hierarchical.py`` (CP 8 in one node, CP 8 over 2 nodes x 4, CP 16 over 2 nodes
x 8; 8b and 7b). Prints the planner's CPU time per setting (median / p99 / max over packs of the
best of ``--repeat`` calls).

``--baseline PATH``: the first run writes the corpus and the plans' essential fields there
(per-rank segments, gathered documents, K/V exchange and window, ``kv_recv_tokens``,
``a2a_token_counts``, per-rank compute, exchange and block time); later runs re-plan the same
packs (the corpus is read back, so changes to the packer do not move it) and fail on any
difference: integers exact, floats exact unless ``--rtol`` is given.

    python scripts/bench_planner_time.py --baseline /tmp/atp_plans.pkl
    python scripts/bench_planner_time.py --baseline /tmp/atp_plans.pkl --quick
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from atac_hf.cost import default_cost_model
from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.sharding import plan_shards
from atac_hf.sim import ClusterConfig
from atac_hf.workloads import load_workload

CLUSTERS = {  # as scripts/bench_hierarchical.py
    "cp8-1node": dict(cp_size=8, max_tokens=131072, gpus_per_node=8),
    "cp8-2x4": dict(cp_size=8, max_tokens=131072, gpus_per_node=4),
    "cp16-2x8": dict(cp_size=16, max_tokens=262144, gpus_per_node=8),
}


def wfap_packs(workload: str, max_tokens: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    pool = load_workload(workload)
    sample = rng.choice(pool, int(max_tokens * (n + 8) / pool.mean()))
    res = pack_lengths(sample, PackingConfig(max_tokens=max_tokens, packs_per_window=8))
    packs = [np.array([e - s for _, s, e in p], dtype=np.int64) for p in res.packs]
    return [L for L in packs if L.sum() >= 0.9 * max_tokens][:n]


def random_cases(n: int, seed: int) -> list[dict]:
    """Hypothesis-like packs: few or many documents, short and long, with caps and min_chunk."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        D = int(rng.integers(1, 40))
        kind = i % 4
        if kind == 0:
            L = rng.integers(1, 64, D)
        elif kind == 1:
            L = rng.integers(1, 4096, D)
        elif kind == 2:
            L = np.concatenate([rng.integers(1, 2048, D), rng.integers(8192, 40000, int(rng.integers(1, 4)))])
        else:
            L = np.maximum(1, (rng.pareto(1.2, D) * 800).astype(np.int64))
        C = int(rng.choice([2, 3, 4, 5, 8]))
        slack = [None, 1.0, 1.05, 1.25][int(rng.integers(0, 4))]
        cap = None if slack is None else int(np.ceil(L.sum() / C * slack))
        out.append(dict(lengths=L.astype(np.int64), C=C, cap=cap, min_chunk=int(rng.choice([1, 16, 128]))))
    return out


def build_corpus(quick: bool) -> list[dict]:
    """Cases: (setting label, cost-model key, lengths, C, cap, min_chunk)."""
    n = 2 if quick else 6
    cases = []
    for mt in (32768, 65536, 131072):
        for w in ("wlbllm", "longtail"):
            for L in wfap_packs(w, mt, n, seed=1):
                for C in (2, 4, 8):
                    cases.append(dict(setting=f"default cp{C} {mt // 1024}K", cm="default", lengths=L, C=C,
                                      cap=None, min_chunk=1))
    for name, kw in CLUSTERS.items():
        for model in ("8b", "7b"):
            key = f"{name}-{model}"
            cl = ClusterConfig(model=model, hardware="H100", **kw)
            for w in ("wlbllm", "longtail"):
                for L in wfap_packs(w, kw["max_tokens"], n, seed=0):
                    cases.append(dict(setting=f"{key} {kw['max_tokens'] // 1024}K", cm=key, lengths=L,
                                      C=kw["cp_size"], cap=cl.rank_token_cap(), min_chunk=128))
    for c in random_cases(8 if quick else 40, seed=2):
        cases.append(dict(setting="random", cm="default", **c))
    return cases


def cost_models() -> dict:
    out = {"default": default_cost_model()}
    for name, kw in CLUSTERS.items():
        for model in ("8b", "7b"):
            out[f"{name}-{model}"] = ClusterConfig(model=model, hardware="H100", **kw).cost_model()
    return out


def essentials(plan) -> dict:
    return dict(
        strategy=plan.strategy,
        segments=[np.asarray(s).copy() for s in plan.segments],
        gathered_docs=np.asarray(plan.gathered_docs).copy(),
        kv_exchange=plan.kv_exchange,
        kv_window=plan.kv_window,
        kv_recv_tokens=np.asarray(plan.kv_recv_tokens).copy(),
        a2a_recv_send=[np.asarray(x).copy() for x in plan.a2a_token_counts],
        rank_compute_s=np.asarray(plan.rank_compute_s, dtype=np.float64).copy(),
        comm_s=float(plan.comm_s),
        block_time_s=float(plan.block_time_s),
    )


def compare(a: dict, b: dict, rtol: float) -> str | None:
    """None if equal, else what differs first."""
    for k in ("strategy", "kv_exchange", "kv_window"):
        if a[k] != b[k]:
            return f"{k}: {a[k]!r} != {b[k]!r}"
    if len(a["segments"]) != len(b["segments"]):
        return "number of ranks"
    for r, (x, y) in enumerate(zip(a["segments"], b["segments"])):
        if x.shape != y.shape or not np.array_equal(x, y):
            return f"segments of rank {r}"
    for k in ("gathered_docs", "kv_recv_tokens"):
        if not np.array_equal(a[k], b[k]):
            return k
    if not all(np.array_equal(x, y) for x, y in zip(a["a2a_recv_send"], b["a2a_recv_send"])):
        return "a2a_token_counts"
    for k in ("rank_compute_s", "comm_s", "block_time_s"):
        x, y = np.asarray(a[k]), np.asarray(b[k])
        ok = np.array_equal(x, y) if rtol == 0 else np.allclose(x, y, rtol=rtol, atol=0)
        if not ok:
            return f"{k}: {x!r} != {y!r}"
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=None, help="pickle of corpus + plans: written if absent, else checked")
    p.add_argument("--repeat", type=int, default=3, help="calls per case (time: the best)")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance of float fields (0: exact)")
    p.add_argument("--quick", action="store_true", help="a smaller corpus")
    args = p.parse_args(argv)
    base = None
    if args.baseline and Path(args.baseline).exists():
        base = pickle.loads(Path(args.baseline).read_bytes())
        cases = base["cases"]
    else:
        cases = build_corpus(args.quick)
    cms = cost_models()
    times: dict[str, list[float]] = {}
    plans = []
    bad = 0
    for i, c in enumerate(cases):
        cm = cms[c["cm"]]
        best = np.inf
        for _ in range(args.repeat):
            t0 = time.process_time()
            plan = plan_shards(c["lengths"], c["C"], "atp", cm, max_tokens_per_rank=c["cap"],
                               min_chunk=c["min_chunk"])
            best = min(best, time.process_time() - t0)
        times.setdefault(c["setting"], []).append(best * 1e3)
        e = essentials(plan)
        plans.append(e)
        if base is not None:
            why = compare(base["plans"][i], e, args.rtol)
            if why:
                bad += 1
                print(f"DIFF case {i} ({c['setting']}, {len(c['lengths'])} docs): {why}", file=sys.stderr)
    print("| setting | packs | ATP plan CPU time (ms, median / p99 / max) |")
    print("|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {len(v)} | {statistics.median(v):.2f} / {float(np.percentile(v, 99)):.2f} / {max(v):.2f} |")
    print(f"total (sum of every case's best time): {sum(sum(v) for v in times.values()):.1f} ms")
    if base is None and args.baseline:
        Path(args.baseline).write_bytes(pickle.dumps({"cases": cases, "plans": plans}))
        print(f"wrote {len(cases)} cases to {args.baseline}")
    elif base is not None:
        print(f"{len(cases) - bad} of {len(cases)} plans identical to {args.baseline}")
        if bad:
            sys.exit(1)


if __name__ == "__main__":
    main()

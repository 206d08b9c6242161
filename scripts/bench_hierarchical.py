#!/usr/bin/env python
"""Hierarchical ATP-CP (issue 16) in the simulator's cost model: ATP with anchors over
sub-groups of ranks and the only-needed K/V exchange against all-gather ATP (flat anchors,
every gathered document to every rank), on WFAP packs of long-tail mixes, in three clusters:
CP 8 in one node (NVLink), CP 8 over 2 nodes x 4 GPUs and CP 16 over 2 nodes x 8 GPUs
(inter-node links 9x slower than NVLink; the CP group's link is its slowest, as
:class:`~atac_hf.sim.ClusterConfig` prices it).

Per scenario: K/V rows a rank receives per layer (max and mean over ranks, averaged over
packs) against what an all-gather of the same split documents moves; layer time (block
time, estimated) summed over the packs (the step time of one DP replica without pipeline,
divided by the number of layers) and the speedup; per-rank balance of both plans under an
independent cost model (attention priced at 2x and 0.5x, ``atac_hf.sim.robustness.
scale_attention``); ATP planner CPU time per pack (median). Also the hierarchical candidate
alone (:func:`~atac_hf.sharding.subgroups.plan_subgroups`, the best of its anchor shares),
whichever plan ATP takes. Prints markdown and, with --output, (re)writes the
"## Hierarchical ATP-CP (simulator estimate)" section of that file.

    python scripts/bench_hierarchical.py --output docs/BENCHMARKS.md
    python scripts/bench_hierarchical.py --quick
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.sharding import atp as atp_mod
from atac_hf.sharding import plan_shards
from atac_hf.sharding.segments import finish_plan
from atac_hf.sharding.subgroups import ANCHOR_SHARES, plan_subgroups
from atac_hf.sim import ClusterConfig
from atac_hf.sim.robustness import scale_attention
from atac_hf.workloads import load_workload

HEADING = "## Hierarchical ATP-CP (simulator estimate)"
SCENARIOS = {
    "CP 8, 1 node (NVLink)": dict(cp_size=8, max_tokens=131072, gpus_per_node=8),
    "CP 8, 2 nodes x 4": dict(cp_size=8, max_tokens=131072, gpus_per_node=4),
    "CP 16, 2 nodes x 8": dict(cp_size=16, max_tokens=262144, gpus_per_node=8),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="wlbllm,longtail")
    p.add_argument("--packs", type=int, default=16, help="WFAP packs per scenario and workload")
    p.add_argument("--models", default="8b,7b", help="model presets (8b: GQA, 8 K/V heads; 7b: 32 K/V heads)")
    p.add_argument("--hardware", default="H100")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="markdown file whose section is (re)written")
    p.add_argument("--quick", action="store_true", help="4 packs, one workload (a smoke test)")
    return p.parse_args(argv)


def flat_atp(L, C, cm, cap):
    """All-gather ATP: the flat anchor-tail plan, every gathered document to every rank, planned for the
    all-gather (ATP costs its candidates with the exchange it is given)."""
    saved = atp_mod.ANCHOR_SHARES
    atp_mod.ANCHOR_SHARES = ()
    try:
        return plan_shards(L, C, "atp", cm, max_tokens_per_rank=cap, min_chunk=128, kv_exchange="all_gather")
    finally:
        atp_mod.ANCHOR_SHARES = saved


def imbalance(plan, cm):
    return finish_plan(plan.doc_lengths, plan.cp_size, plan.strategy, list(plan.segments), plan.gathered_docs,
                       cm, plan.kv_exchange).imbalance


def ag_rows(plan):
    """Rows a rank receives when an all-gather moves the plan's split documents (C - 1) / C."""
    C = plan.cp_size
    return float(plan.doc_lengths[plan.sharded_docs].sum()) * (C - 1) / C


def run(scenario, kw, workload, model, args):
    cl = ClusterConfig(model=model, hardware=args.hardware, **kw)
    cm = cl.cost_model()
    cap = cl.rank_token_cap()
    C = cl.cp_size
    rng = np.random.default_rng(args.seed)
    pool = load_workload(workload)
    sample = rng.choice(pool, int(kw["max_tokens"] * (args.packs + 8) / pool.mean()))
    res = pack_lengths(sample, PackingConfig(max_tokens=kw["max_tokens"], packs_per_window=8))
    packs = [np.array([e - s for _, s, e in p], dtype=np.int64) for p in res.packs]
    packs = [L for L in packs if L.sum() >= 0.9 * kw["max_tokens"]][: args.packs]
    models = {"2x": scale_attention(cm, 2.0), "0.5x": scale_attention(cm, 0.5)}
    rows = {k: [] for k in ("flat_block", "hier_block", "hier_recv_max", "hier_recv_mean", "hier_ag", "flat_recv",
                            "cand_recv_max", "cand_ag", "cand_block", "plan_ms", "flat_imb", "hier_imb",
                            "cand_imb", "a2a", "sub")}
    for L in packs:
        flat = flat_atp(L, C, cm, cap)
        times = []
        for _ in range(3):
            t0 = time.process_time()  # CPU time: immune to other jobs on a shared machine
            hier = plan_shards(L, C, "atp", cm, max_tokens_per_rank=cap, min_chunk=128)
            times.append(time.process_time() - t0)
        cands = [p for p in (plan_subgroups(L, C, cm, anchor_share=s, max_tokens_per_rank=cap, min_chunk=128)
                             for s in ANCHOR_SHARES) if p is not None]
        cand = min(cands, key=lambda p: p.block_time_s) if cands else None
        rows["flat_block"].append(flat.block_time_s)
        rows["hier_block"].append(hier.block_time_s)
        rows["flat_recv"].append(float(flat.kv_recv_tokens.max()))
        rows["hier_recv_max"].append(float(hier.kv_recv_tokens.max()))
        rows["hier_recv_mean"].append(float(hier.kv_recv_tokens.mean()))
        rows["hier_ag"].append(ag_rows(hier))
        rows["plan_ms"].append(statistics.median(times) * 1e3)
        rows["flat_imb"].append(max(imbalance(flat, m) for m in models.values()))
        rows["hier_imb"].append(max(imbalance(hier, m) for m in models.values()))
        rows["a2a"].append(hier.kv_exchange == "all_to_all")
        rows["sub"].append(any(len(a) != len(b) or not np.array_equal(a, b)  # the hierarchical plan taken
                               for a, b in zip(hier.segments, flat.segments)))
        if cand is not None:
            rows["cand_recv_max"].append(float(cand.a2a_token_counts[0].max()))
            rows["cand_ag"].append(ag_rows(cand))
            rows["cand_block"].append(cand.block_time_s / flat.block_time_s)
            rows["cand_imb"].append(max(imbalance(cand, m) for m in models.values()))
    n = len(packs)
    mean = lambda k: float(np.mean(rows[k])) if rows[k] else float("nan")  # noqa: E731
    kvb = cm.kv_bytes_per_token / 2**20
    return {
        "scenario": scenario, "workload": workload, "model": model, "packs": n,
        "flat_recv_mb": mean("flat_recv") * kvb, "hier_recv_mb": mean("hier_recv_max") * kvb,
        "hier_recv_mean_mb": mean("hier_recv_mean") * kvb, "ag_same_mb": mean("hier_ag") * kvb,
        "speedup": sum(rows["flat_block"]) / sum(rows["hier_block"]),
        "step_flat_ms": sum(rows["flat_block"]) * cl.dims.num_layers * 1e3,
        "step_hier_ms": sum(rows["hier_block"]) * cl.dims.num_layers * 1e3,
        "slower_packs": int(sum(h > f * (1 + 1e-9) for h, f in zip(rows["hier_block"], rows["flat_block"]))),
        "slower_worst": max(h / f for h, f in zip(rows["hier_block"], rows["flat_block"])) - 1,
        "flat_imb": max(rows["flat_imb"]), "hier_imb": max(rows["hier_imb"]),
        "a2a_packs": int(sum(rows["a2a"])), "sub_packs": int(sum(rows["sub"])),
        "plan_ms": statistics.median(rows["plan_ms"]), "plan_p99": float(np.percentile(rows["plan_ms"], 99)),
        "plan_max": max(rows["plan_ms"]), "hier_ratio": mean("hier_recv_max") / mean("hier_ag") if mean("hier_ag") else 0.0,
        "cand_ratio": (mean("cand_recv_max") / mean("cand_ag")) if rows["cand_ag"] else float("nan"),
        "cand_block": mean("cand_block"), "cand_imb": max(rows["cand_imb"]) if rows["cand_imb"] else float("nan"),
    }


def _worst(r) -> str:
    return f" ({r['slower_worst']:+.2%})" if r["slower_packs"] else ""


def to_markdown(results, cmd):
    out = [HEADING, "",
           "ATP with anchors over sub-groups of ranks and the only-needed K/V exchange (`hier`: ATP as shipped, "
           "which picks per pack among flat and hierarchical plans and between the all-gather and the all-to-all "
           "by estimated block time) against all-gather ATP (`flat`: flat anchors, every gathered document to "
           "every rank), on H100 presets (`8b`: Llama-3-8B-like, 8 K/V heads; `7b`: Llama-2-7B-like, 32 K/V "
           "heads, 4x the K/V bytes per token), WFAP packs of 128K tokens (CP 8) or 256K tokens (CP 16). "
           "Estimates of the cost model the planners use (a 2-node CP group is priced at its inter-node link, "
           "50 GB/s against 450 GB/s NVLink); nothing here ran on a GPU.", "",
           f"Reproduce: `{cmd}`", "",
           "| scenario | model | workload | packs | K/V recv / rank, flat AG (MiB) | hier max (MiB) | hier mean (MiB) | "
           "AG of hier's split docs (MiB) | layer time summed, flat -> hier (ms x layers) | speedup | packs slower (worst) "
           "| packs a2a / hierarchical | hier K/V max / AG of its split docs | max/mean at 0.5x,2x attn: flat, hier "
           "| ATP plan CPU time (ms, median / p99 / max) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['scenario']} | {r['model']} | {r['workload']} | {r['packs']} | {r['flat_recv_mb']:.1f} | "
                   f"{r['hier_recv_mb']:.1f} | {r['hier_recv_mean_mb']:.1f} | {r['ag_same_mb']:.1f} | "
                   f"{r['step_flat_ms']:.0f} -> {r['step_hier_ms']:.0f} | {r['speedup']:.3f}x | "
                   f"{r['slower_packs']}{_worst(r)} | {r['a2a_packs']} / {r['sub_packs']} | {r['hier_ratio']:.2f} | "
                   f"{r['flat_imb']:.3f}, {r['hier_imb']:.3f} | {r['plan_ms']:.1f} / {r['plan_p99']:.1f} / "
                   f"{r['plan_max']:.1f} |")
    out += ["", "The hierarchical candidate alone (`plan_subgroups`, best anchor share by estimated block time), "
            "whether or not ATP takes it:", "",
            "| scenario | model | workload | K/V recv max / AG of the same split docs | block time vs flat | "
            "max/mean at 0.5x,2x attn |", "|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['scenario']} | {r['model']} | {r['workload']} | {r['cand_ratio']:.2f} | {r['cand_block']:.3f} | "
                   f"{r['cand_imb']:.3f} |")
    return "\n".join(out) + "\n"


def write_section(path: Path, text: str) -> None:
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if HEADING in old:
        head, rest = old.split(HEADING, 1)
        nxt = rest.find("\n## ")
        old = head + (rest[nxt + 1:] if nxt >= 0 else "")
        new = old.rstrip("\n") + "\n\n" + text
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new, encoding="utf-8")


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.packs, args.workloads, args.models = 4, "wlbllm", "8b"
    results = [run(name, kw, w, m, args) for name, kw in SCENARIOS.items() for m in args.models.split(",")
               for w in args.workloads.split(",")]
    cmd = "python scripts/bench_hierarchical.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    text = to_markdown(results, cmd.strip())
    print(text)
    if args.output:
        write_section(Path(args.output), text)


if __name__ == "__main__":
    main()

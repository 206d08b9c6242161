#!/usr/bin/env python
"""Where ATAC's CP overhead comes from in a simulator scenario, and what one runtime change would buy.

For every pack WFAP makes in the scenario (the grid's stream (as ``atac-hf bench``), ``price_band=(0.5, 2)``, the
feeder passing ``last=True``, as ``scripts/bench_robustness.py``), ATP's plan (the planner's own
cost model) is compared with the pack's whole-document cost per rank (what the balance bound
counts): the CP overhead is sum(block time) / sum(whole-document cost / C). Reported with it:

* the packs whose K/V exchange is exposed (block time above the slowest rank's compute) and the
  exchange's share of the overhead;
* a what-if: the same plans if the runtime also overlapped the exchange with each gathered chunk's
  own causal square (the keys it holds itself: computable before the exchange lands, merged with
  the prefix by log-sum-exp). The runtime does not do this today; the figure bounds what that
  change alone could bring.

    python scripts/probe_cp_overhead.py 13b-64K-cp4-pp1-tp4-longtail 8b-128K-cp8-pp1-tp2-wlbllm
"""

from __future__ import annotations

import argparse

import numpy as np

from atac_hf.sharding import plan_shards
from atac_hf.sim.bench import _lengths, default_grid
from atac_hf.sim.simulate import simulate


def probe(name: str) -> dict:
    grid = {s.name: s for s in default_grid()}
    if name not in grid:
        raise SystemExit(f"unknown scenario {name!r}; legal values: {sorted(grid)}")
    sc = grid[name]
    cluster = sc.config()
    cm = cluster.cost_model()
    res = simulate(_lengths(sc.workload), cluster, combos=[("wfap", "atp")], num_steps=sc.num_steps,
                   packing_options={"price_band": (0.5, 2.0), **sc.options}, end_of_stream="last")
    C, cap = cluster.cp_size, cluster.rank_token_cap()
    block = mean = compute = what_if = 0.0
    exposed = packs = 0
    for win in res.packs["wfap"]:
        for p in win:
            lengths = np.array([e - s for _, s, e in p], dtype=np.int64)
            plan = plan_shards(lengths, C, "atp", cm, max_tokens_per_rank=cap)
            packs += 1
            block += plan.block_time_s
            mean += float(cm.doc_cost(lengths).sum()) / C
            compute += float(plan.rank_compute_s.max())
            exposed += plan.block_time_s > float(plan.rank_compute_s.max()) * (1 + 1e-9)
            gathered = plan.gathered_mask()
            ranks = []
            for seg in plan.segments:
                cost, attn = cm.segment_and_attention_cost(seg[:, 1], seg[:, 2])
                local = ~gathered[seg[:, 0]]
                own = cm.attention_cost(np.zeros(int((~local).sum()), np.int64), (seg[:, 2] - seg[:, 1])[~local])
                hidden = float(attn[local].sum() + own.sum())
                # a node-routed exchange's second phase (comm_tail_s) overlaps nothing
                first = plan.comm_s - plan.comm_tail_s
                ranks.append(float(cost.sum()) - hidden + (max(hidden, first) + plan.comm_tail_s if gathered.any()
                                                           else hidden))
            what_if += max(ranks)
    return dict(scenario=name, packs=packs, exposed=exposed, overhead=block / mean, compute_only=compute / mean,
                what_if=what_if / mean)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenarios", nargs="+", help="scenario names of the default grid (atac-hf bench --list)")
    args = p.parse_args(argv)
    print("| scenario | packs | packs with the exchange exposed | CP overhead | slowest rank's compute alone "
          "| what-if: exchange also hidden behind each chunk's own square |")
    print("|---|---|---|---|---|---|")
    for name in args.scenarios:
        r = probe(name)
        print(f"| {r['scenario']} | {r['packs']} | {r['exposed']} | {r['overhead']:.3f} | {r['compute_only']:.3f} "
              f"| {r['what_if']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""ATP's two-way anchor split against its cost-level split, side by side.

1. **Estimated** (numpy only): on WFAP packs of the wlbllm lengths (32K and 128K tokens) at
   CP 2, 4 and 8 with the GPU cost presets, how often ATP takes the two-way split (every
   rank level in tokens and in attention pairs) and what it costs by the planner's own
   estimate (block time against the cost-level split).
2. **Measured** (CPU, skipped with ``--estimate-only``): per-rank layer time (attention +
   token-wise work, forward + backward, one layer of the ``bench_cp.py`` model) of
   ``per_doc``, ATP with the cost-level split and ATP with the two-way split, on the given
   packs, every plan and rank interleaved round by round, minimum kept.

    python scripts/bench_atp_split.py [--packs 14841,1509@2 ...] [--repeats 9] [--profile P]

The cost-level split is ATP with ``atac_hf.sharding.atp.TWO_WAY_TOLERANCE`` at -inf.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cp  # noqa: E402

DEFAULT_PACKS = ["14841,1509@2", "4745,3443@2", "4619,3573@2", "3948,4240@4"]  # original-lengths WFAP packs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--packs", nargs="+", default=DEFAULT_PACKS,
                   help="packs to time, as comma-separated document lengths @ cp_size")
    p.add_argument("--repeats", type=int, default=9, help="timed rounds (minimum kept)")
    p.add_argument("--profile", help="CPU cost profile JSON (default: calibrate up to the packs' longest document)")
    p.add_argument("--estimate-only", action="store_true", help="only part 1 (no timing)")
    p.add_argument("--quick", action="store_true", help="smoke run: small packs, 1 round, few estimate packs")
    args = p.parse_args(argv)
    if args.quick:
        args.packs, args.repeats = ["300,90@2"], 1
    return args


@contextlib.contextmanager
def cost_level_split():
    """ATP without the two-way split (the cost-level water-filling only)."""
    from atac_hf.sharding import atp as planners

    old = planners.TWO_WAY_TOLERANCE
    planners.TWO_WAY_TOLERANCE = -np.inf
    try:
        yield
    finally:
        planners.TWO_WAY_TOLERANCE = old


def both_atp(pack, cp, cm):
    from atac_hf.sharding import plan_shards

    two_way = plan_shards(pack, cp, "atp", cm)
    with cost_level_split():
        cost_level = plan_shards(pack, cp, "atp", cm)
    return cost_level, two_way


def estimate(quick: bool) -> list[str]:
    from atac_hf.cost import CostModel

    lengths = bench_cp.load_lengths(str(bench_cp.WLB_PATH) if bench_cp.WLB_PATH.exists() else "longtail", 0)
    n = 2 if quick else 15
    packs = [p for t in (32768, 131072) for p in bench_cp.make_packs(lengths, t, n, t)]
    out = ["| cost model | CP | packs | two-way taken | est. block time vs cost-level (mean, max) |",
           "|---|---:|---:|---:|---:|"]
    for name, cm in (("7b on A800", CostModel.from_model("7b", "A800")), ("8b on H100", CostModel.from_model("8b", "H100"))):
        for cp in (2, 4, 8):
            ratio, taken = [], 0
            for pack in packs:
                a, b = both_atp(pack, cp, cm)
                taken += a.digest != b.digest
                ratio.append(b.block_time_s / a.block_time_s)
            out.append(f"| {name} | {cp} | {len(packs)} | {taken} ({100 * taken / len(packs):.0f}%) | "
                       f"{np.mean(ratio):.4f}, {np.max(ratio):.4f} |")
    return out


def measure(args) -> list[str]:
    from atac_hf.sharding import plan_shards

    cases = []
    for spec in args.packs:
        lens, cp = spec.split("@")
        cases.append(([int(x) for x in lens.split(",")], int(cp)))
    longest = max(max(p) for p, _ in cases)
    cm0, source = bench_cp.cpu_cost_model(args.profile, 2, max_len=longest)
    links = {cp: bench_cp.measure_link(cp) for cp in sorted({c for _, c in cases})}
    out = [f"Cost model: {source}; links: " + "; ".join(f"CP {c}: {bw / 1e9:.2f} GB/s, {lat * 1e6:.0f} us"
                                                       for c, (bw, lat) in links.items()) + f"; {args.repeats} rounds.",
           "", "| pack | CP | per_doc | ATP, cost-level split | ATP, two-way split |", "|---|---:|---:|---:|---:|"]
    for pi, (pack, cp) in enumerate(cases):
        bw, lat = links[cp]
        cm = cm0.replace(link_bandwidth=bw, link_latency_s=lat)
        cost_level, two_way = both_atp(pack, cp, cm)
        plans = {"per_doc": plan_shards(pack, cp, "per_doc", cm), "cost_level": cost_level, "two_way": two_way}
        timed = bench_cp.per_rank_times(plans, 2, args.repeats, 1, 0)
        cells = []
        for s in plans:
            attn, lin = timed[s]
            layer = np.asarray(attn) + np.asarray(lin)
            cells.append(f"{1e3 * layer.max():.0f}, {layer.max() / layer.mean():.3f}")
        same = " (identical plans)" if cost_level.digest == two_way.digest else ""
        out.append(f"| {' + '.join(map(str, pack))}{same} | {cp} | " + " | ".join(cells) + " |")
        print(out[-1], file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    print("\n".join(["Estimated (the planner's own cost model):", ""] + estimate(args.quick)), flush=True)
    if not args.estimate_only:
        print("\n".join(["", "Measured: slowest rank's layer ms, layer max/mean:", ""] + measure(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

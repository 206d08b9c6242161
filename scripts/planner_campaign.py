#!/usr/bin/env python
"""A random campaign over ATP's promises, under prices drawn over decades.

Each case draws a cost model (token, pair, per-call and link prices over several decades,
sometimes a sliding window, a masked-pair price, nodes), a pack (tiny documents, a few thousand
tokens, one or two long documents among short ones, or a Pareto tail), a cp_size, ``min_chunk``,
a forced exchange or none, and sometimes a token cap, and checks what ATP promises:

- ``validate()`` passes, the cap is kept, every rank holds a token, the plan is deterministic;
- never slower than ``per_doc`` (a hard guarantee);
- the sub-group candidates never make it slower than the flat plan;
- with the automatic exchange, no more than TWO_WAY_TOLERANCE slower than one contiguous run a
  rank, unless that run is less level and not robustly no worse (tests/test_atp_contiguous.py);
- with the automatic exchange, no slower than ATP forced to the all-gather (not a guarantee:
  docs/RELIABILITY.md, "Not covered", counts it); a pack where it is, counted apart where ATP's plan is
  the safer bet (a smaller worst excess over the all-gather's plan at the estimate and at 0.25x-4x the
  attention price than the all-gather's over it).

Prints each broken promise's count and its first cases (lengths, cp_size, min_chunk, exchange,
cap, cost-model fields, ratio).

    python scripts/planner_campaign.py --seed 1 --cases 3000
"""

from __future__ import annotations

import argparse
from unittest import mock

import numpy as np
from tqdm.auto import tqdm

import atac_hf.sharding.atp as atp_mod
from atac_hf.cost import CostModel
from atac_hf.sharding import plan_shards
from atac_hf.sharding.atp import TWO_WAY_TOLERANCE, _block_at, _robustly_no_worse
from atac_hf.sharding.baselines import contiguous_segments
from atac_hf.sharding.segments import finish_plan
from atac_hf.sharding.subgroups import _scaled


def draw_cost_model(rng: np.random.Generator) -> dict:
    lin = 10 ** rng.uniform(-9, 0)
    kw = dict(linear_s_per_token=lin, attn_s_per_pair=lin * 10 ** rng.uniform(-4, 0),
              segment_overhead_s=float(rng.choice([0.0, lin * 10 ** rng.uniform(0, 4)])),
              tile=int(rng.choice([1, 16, 64, 128])), kv_bytes_per_token=float(rng.choice([0.0, 10 ** rng.uniform(2, 6)])),
              link_bandwidth=10 ** rng.uniform(8, 12), link_latency_s=float(rng.choice([0.0, 1e-5, 1e-3])))
    if rng.random() < 0.3:
        kw["sliding_window"] = int(rng.integers(2, 2000))
    if rng.random() < 0.3:
        kw["masked_attn_s_per_pair"] = kw["attn_s_per_pair"] * rng.uniform(0.1, 1.5)
    if rng.random() < 0.3:
        kw["node_size"] = int(rng.choice([1, 2, 4]))
        kw["intra_node_bandwidth"] = kw["link_bandwidth"] * 10
    return kw


def draw_pack(rng: np.random.Generator) -> np.ndarray:
    kind = rng.integers(4)
    if kind == 0:
        return rng.integers(1, 40, size=rng.integers(1, 20))
    if kind == 1:
        return rng.integers(1, 5000, size=rng.integers(1, 15))
    if kind == 2:
        return np.concatenate([rng.integers(5000, 60000, size=rng.integers(1, 3)),
                               rng.integers(50, 3000, size=rng.integers(0, 30))])
    return np.maximum(1, (rng.pareto(1.2, size=rng.integers(1, 40)) * 300).astype(int))


def check(L, C, cm, min_chunk, kv, cap) -> list[tuple[str, float]]:
    """The promises ``plan_shards(L, C, "atp", ...)`` breaks, each with a ratio (1.0 where none)."""
    kw = dict(min_chunk=min_chunk, kv_exchange=kv, max_tokens_per_rank=cap)
    plan = plan_shards(L, C, "atp", cm, **kw)
    broken = []
    try:
        plan.validate()
    except Exception:  # noqa: BLE001 - any failure of validate() is the finding
        broken.append(("validate", 1.0))
    if L.sum() >= C and plan.rank_num_tokens().min() == 0:
        broken.append(("idle rank", 1.0))
    if cap is not None and plan.rank_num_tokens().max() > cap:
        broken.append(("cap", 1.0))
    again = plan_shards(L, C, "atp", cm, **kw)
    if [s.tolist() for s in again.segments] != [s.tolist() for s in plan.segments]:
        broken.append(("not deterministic", 1.0))
    try:
        per_doc = plan_shards(L, C, "per_doc", cm, **kw)
    except ValueError:  # per_doc over the cap
        per_doc = None
    if per_doc is not None and plan.block_time_s > per_doc.block_time_s * (1 + 1e-9):
        broken.append(("slower than per_doc", plan.block_time_s / per_doc.block_time_s))
    with mock.patch.object(atp_mod, "ANCHOR_SHARES", ()):
        flat = plan_shards(L, C, "atp", cm, **kw)
    if plan.block_time_s > flat.block_time_s * (1 + 1e-9):
        broken.append(("sub-groups slower than the flat plan", plan.block_time_s / flat.block_time_s))
    if kv is None:
        gather = plan_shards(L, C, "atp", cm, **{**kw, "kv_exchange": "all_gather"})
        if plan.block_time_s > gather.block_time_s * (1 + 1e-9):
            safer = " (the safer bet)" if _safer_bet(plan, gather, cm) else ""
            broken.append((f"automatic exchange slower than the all-gather{safer}",
                           plan.block_time_s / gather.block_time_s))
        run = finish_plan(L, C, "atp", contiguous_segments(L, C), None, cm, "auto")
        if (cap is None or run.rank_num_tokens().max() <= cap) and not (
                plan.block_time_s <= run.block_time_s * (1 + TWO_WAY_TOLERANCE) * (1 + 1e-9)
                or (run.imbalance > plan.imbalance and not _robustly_no_worse(run, plan, cm))):
            broken.append(("contiguous rule", plan.block_time_s / run.block_time_s))
    return broken


def _safer_bet(a, b, cm: CostModel) -> bool:
    """Whether plan ``a``'s worst excess over ``b``'s block time, at the estimate and with attention priced
    0.25x-4x, is smaller than ``b``'s worst excess over ``a``'s (ATP's rules prefer such a plan)."""
    worst_a = worst_b = 1.0
    for k in (0.25, 0.5, 1.0, 2.0, 4.0):
        alt = _scaled(cm, k)
        ta, tb = _block_at(a, alt), _block_at(b, alt)
        if ta > 0 and tb > 0:
            worst_a, worst_b = max(worst_a, ta / tb), max(worst_b, tb / ta)
    return worst_a < worst_b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--show", type=int, default=3, help="cases printed per broken promise")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    found: dict[str, list] = {}
    for _ in tqdm(range(args.cases), desc="packs", mininterval=2):
        kw = draw_cost_model(rng)
        cm = CostModel(**kw)
        C = int(rng.choice([2, 3, 4, 5, 8, 16]))
        L = draw_pack(rng)
        min_chunk = int(rng.choice([1, 1, 4, 64]))
        kv = [None, "all_gather", "all_to_all"][rng.integers(3)]
        cap = int(np.ceil(L.sum() / C * rng.uniform(1.0, 1.5))) if rng.random() < 0.3 else None
        try:
            broken = check(L, C, cm, min_chunk, kv, cap)
        except ValueError as e:  # CapExceededError: the cap is under what ATP can place
            if "max_tokens_per_rank" not in str(e):
                broken = [(f"error: {e}"[:100], 1.0)]
            else:
                broken = []
        for name, ratio in broken:
            found.setdefault(name, []).append((L.tolist(), C, min_chunk, kv, cap, kw, ratio))
    for name, cases in found.items():
        worst = max(c[-1] for c in cases)
        print(f"{name}: {len(cases)} of {args.cases} (worst ratio {worst:.3f})")
        for c in cases[:args.show]:
            print("   ", c)
    print(f"{args.cases} packs, {sum(len(v) for v in found.values())} broken promises")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""ATP under the cost model's price error, and ATP planned for a forced K/V exchange (issue 16:
"per-rank balance stays at most 1.05 by an independent cost model"; ``plan_shards(kv_exchange=)``).

A plan level in estimated cost only can be far from level when attention costs 2x or 0.5x what the
model says: a pack of mid-length documents and one long one, kept whole, gives the long one's rank
1.6x a rank's attention pairs at a 1.01x token share. Where no plan of extra anchors is level in
tokens and pairs separately, ATP takes the cost-level plan of up to ROBUST_EXTRA_ANCHORS more
anchors that is most level at those prices, within TWO_WAY_TOLERANCE of the estimate.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.sharding import plan_shards
from atac_hf.sharding.segments import finish_plan
from atac_hf.sharding.atp import PRICE_ERROR_BAND, TWO_WAY_TOLERANCE, _price_error_imbalance
from atac_hf.sim import ClusterConfig
from atac_hf.sim.robustness import scale_attention
from atac_hf.workloads import load_workload

# a 128K WFAP pack of the wlbllm lengths: 21 documents of 5.4-5.6K tokens, one of 2,720, one of 12,409
FRAGILE = [5494, 5549, 5575, 5498, 5602, 5523, 5586, 5561, 5529, 5616, 5573, 5414, 5586, 5408, 5497, 2720,
           5426, 5494, 5579, 5551, 12409, 5469, 5402]


def _cluster(model="8b", cp_size=8, max_tokens=131072, gpus_per_node=8):
    cl = ClusterConfig(model=model, hardware="H100", cp_size=cp_size, max_tokens=max_tokens,
                       gpus_per_node=gpus_per_node)
    return cl.cost_model(), cl.rank_token_cap()


def _imbalance_at(plan, cm):
    """max / mean per-rank compute of ``plan`` costed by ``cm`` (an independent model)."""
    return finish_plan(plan.doc_lengths, plan.cp_size, plan.strategy, list(plan.segments), plan.gathered_docs,
                       cm, plan.kv_exchange).imbalance


def test_a_plan_fragile_to_the_attention_price_takes_extra_anchors():
    cm, cap = _cluster()
    L = np.array(FRAGILE, dtype=np.int64)
    whole = plan_shards(L, 8, "atp", cm, max_tokens_per_rank=cap, min_chunk=128, max_anchors=0)
    # every document whole: level by the estimate, 1.065 with attention at 2x
    assert whole.imbalance < 1.01
    assert _imbalance_at(whole, scale_attention(cm, 2.0)) > 1.05
    plan = plan_shards(L, 8, "atp", cm, max_tokens_per_rank=cap, min_chunk=128)
    assert len(plan.gathered_docs) >= 1
    assert plan.block_time_s <= whole.block_time_s * (1 + TWO_WAY_TOLERANCE)
    for k in PRICE_ERROR_BAND:
        assert _imbalance_at(plan, scale_attention(cm, k)) <= 1 + TWO_WAY_TOLERANCE
    assert _price_error_imbalance(plan, cm) == pytest.approx(
        max(_imbalance_at(plan, scale_attention(cm, k)) for k in PRICE_ERROR_BAND), rel=1e-9)


def _packs(workload, max_tokens, n, seed=0):
    rng = np.random.default_rng(seed)
    pool = load_workload(workload)
    sample = rng.choice(pool, int(max_tokens * (n + 8) / pool.mean()))
    res = pack_lengths(sample, PackingConfig(max_tokens=max_tokens, packs_per_window=8))
    packs = [np.array([e - s for _, s, e in p], dtype=np.int64) for p in res.packs]
    return [L for L in packs if L.sum() >= 0.9 * max_tokens][:n]


@pytest.mark.parametrize("gpus_per_node", [8, 4])
@pytest.mark.parametrize("model", ["8b", "7b"])
@pytest.mark.parametrize("workload", ["wlbllm", "longtail"])
def test_atp_stays_level_when_attention_costs_half_or_twice_the_estimate(workload, model, gpus_per_node):
    """Issue 16's balance target at CP 8 on 128K WFAP packs: max / mean per-rank compute at most 1.05
    with attention priced at 0.5x and 2x the planner's model (in one node and over 2 nodes x 4)."""
    cm, cap = _cluster(model, gpus_per_node=gpus_per_node)
    worst = 1.0
    for L in _packs(workload, 131072, 6):
        plan = plan_shards(L, 8, "atp", cm, max_tokens_per_rank=cap, min_chunk=128)
        worst = max(worst, *(_imbalance_at(plan, scale_attention(cm, k)) for k in (0.5, 2.0)))
    assert worst <= 1.05


def test_a_forced_all_gather_is_planned_for():
    """``kv_exchange="all_gather"``: ATP costs its candidates with the all-gather, not the all-to-all it
    would pick by itself with the all-gather put in afterwards (over 2 nodes, where the two differ
    most: 1.06x here on one pack, up to 1.5x on the packs of scripts/bench_hierarchical.py before this
    was planned for). ATP's search is greedy, so this is no bound pack by pack (two packs here come
    out 0.4-0.5% slower): within TWO_WAY_TOLERANCE on every pack, faster in sum, and by over 5% on some."""
    cm, cap = _cluster("7b", cp_size=16, max_tokens=262144, gpus_per_node=8)
    forced_s, recast_s = [], []
    for L in _packs("longtail", 262144, 6):
        forced = plan_shards(L, 16, "atp", cm, max_tokens_per_rank=cap, min_chunk=128, kv_exchange="all_gather")
        auto = plan_shards(L, 16, "atp", cm, max_tokens_per_rank=cap, min_chunk=128)
        assert forced.kv_exchange == "all_gather"
        recast = finish_plan(L, 16, "atp", list(auto.segments), auto.gathered_docs, cm, "all_gather")
        forced_s.append(forced.block_time_s)
        recast_s.append(recast.block_time_s)
    forced_s, recast_s = np.array(forced_s), np.array(recast_s)
    assert (forced_s <= recast_s * (1 + TWO_WAY_TOLERANCE)).all()
    assert forced_s.sum() < recast_s.sum()
    assert (recast_s > forced_s * 1.05).any()


# a 128K WFAP pack of the wlbllm lengths under the 2 nodes x 4, 7b model (20,480-token cap): 19 documents
# of 5.9-6.2K tokens, one of 3,620, one of 12,072
EQUAL_MID = [6143, 6167, 6103, 5939, 5950, 5966, 6016, 6028, 6008, 6166, 6072, 6045, 6100, 3620, 12072, 6117,
             6013, 6198, 6137, 6157, 6053]


@pytest.mark.usefixtures("no_contiguous_candidate")
def test_the_anchor_count_that_levels_the_ranks_competes_with_its_own_exchange():
    """The anchor-count search prices the exchange as the all-gather, which across nodes costs far more
    than the (routed) all-to-all: on this pack it stopped at 1 anchor, ranks 10% off level, where 4
    anchors level them and, exchanged all-to-all, finish 6% sooner. Where the exchange may be the
    all-to-all and the ranks are off level, the fewest anchors that level them are built and compete."""
    cm, cap = _cluster("7b", gpus_per_node=4)
    L = np.array(EQUAL_MID, dtype=np.int64)
    short = plan_shards(L, 8, "atp", cm, max_tokens_per_rank=cap, min_chunk=128, max_anchors=3)
    plan = plan_shards(L, 8, "atp", cm, max_tokens_per_rank=cap, min_chunk=128)
    assert short.imbalance > 1.05
    assert plan.imbalance <= 1.01
    assert plan.block_time_s <= short.block_time_s * 0.95
    assert plan.kv_exchange == "all_to_all"

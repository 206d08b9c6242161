"""ATP's competing candidates and fallbacks (issue 20's sixth pass over `plan_atp`, `plan_shards`
and `plan_subgroups`): the per_doc candidate is skipped only where it cannot win whichever exchange
"auto" prices it with, the contiguous fallback is an ``atp`` plan under the cap, the per_doc
refill of a plan with an idle rank is costed by the caller's model and taken only where it is
strictly faster, a sub-group plan never leaves a rank without tokens, and the water fill's split
by shares uses every token of room a cap leaves."""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.cost import CostModel, default_cost_model
from atac_hf.sharding import plan_shards
from atac_hf.sharding.atp import _per_doc_a2a_floor, _split_by_share, plan_atp
from atac_hf.sharding.segments import finish_flat, per_doc_flat
from atac_hf.sharding.subgroups import ANCHOR_SHARES, plan_subgroups

CM = default_cost_model()
# one node of 4 ranks whose all-to-all rows travel at NVLink speed, the all-gather priced at the slow link
NVLINK_A2A = CM.replace(node_size=4, link_bandwidth=5e10, intra_node_bandwidth=4.05e12,
                        kv_bytes_per_token=4096.0, link_latency_s=8e-6)
UNIT = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, link_bandwidth=1e11, link_latency_s=1e-5)


def _models(rng):
    """Cost models where the all-to-all may be priced below the all-gather: nodes, windows, both."""
    nodes = int(rng.integers(1, 5))
    return [CM, CM.replace(sliding_window=int(rng.integers(1, 300))),
            CM.replace(node_size=nodes, intra_node_bandwidth=CM.link_bandwidth * 9, link_bandwidth=CM.link_bandwidth / 9),
            NVLINK_A2A.replace(sliding_window=int(rng.integers(1, 300))),
            CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, sliding_window=int(rng.integers(1, 50)),
                      node_size=2)]


def _packs(rng, n):
    for i in range(n):
        hi = (8, 100, 3000, 20000)[i % 4]
        yield rng.integers(1, hi, int(rng.integers(1, 24))).astype(np.int64), int(rng.integers(2, 9))


def test_per_doc_a2a_floor_is_below_the_per_doc_layouts_all_to_all_time():
    rng = np.random.default_rng(0)
    tight = 0
    for L, C in _packs(rng, 120):
        for cm in _models(rng):
            a2a = finish_flat(L, C, "atp", *per_doc_flat(L, C), None, cm, "all_to_all").comm_s
            floor = _per_doc_a2a_floor(L, C, cm)
            assert 0.0 <= floor <= a2a * (1 + 1e-12), (L.tolist(), C, cm)
            tight += floor == a2a
    assert tight > 0  # rank 0's receive is the busiest link in many packs: the floor is often exact


def test_per_doc_a2a_floor_counts_rank_0s_last_chunk_prefix_held_elsewhere():
    # [10] over 2 ranks: rank 0 holds [0, 3) and [8, 10); its last chunk needs keys [3, 8) from rank 1
    cm = UNIT.replace(kv_bytes_per_token=1.0, link_bandwidth=1.0, link_latency_s=0.0)
    assert _per_doc_a2a_floor(np.array([10]), 2, cm) == 2.0 * 5
    assert _per_doc_a2a_floor(np.array([10]), 2, cm.replace(sliding_window=3)) == 2.0 * 2  # keys [6, 8) only
    assert _per_doc_a2a_floor(np.array([10, 1]), 2, cm) == 2.0 * 5  # a 1-token document stays local
    # [2] over 3 ranks: rank 0 holds token 0 only (its last chunk is empty) and receives nothing
    assert _per_doc_a2a_floor(np.array([2]), 3, cm) == 0.0
    # across nodes the rows may arrive over both links at once
    assert _per_doc_a2a_floor(np.array([10]), 2, cm.replace(node_size=1, intra_node_bandwidth=4.0)) == 2.0 * 5 / 5


def test_atp_is_never_slower_than_its_own_per_doc_candidate():
    """ATP skips building the per_doc layout only where it cannot win: its all-gather estimate
    alone is no bound where the "auto" exchange prices it with a cheaper all-to-all."""
    rng = np.random.default_rng(1)
    cases = [(np.array([2559, 1586, 2769]), 4, NVLINK_A2A)]  # per_doc's all-to-all wins here by 0.06%
    cases += [(L, C, cm) for L, C in _packs(rng, 60) for cm in _models(rng)]
    for L, C, cm in cases:
        plan = plan_atp(L, C, cm)
        even = finish_flat(L, C, "atp", *per_doc_flat(L, C), None, cm, "auto")
        assert plan.block_time_s <= even.block_time_s * (1 + 1e-12), (L.tolist(), C, cm)
    plan = plan_atp(np.array([2559, 1586, 2769]), 4, NVLINK_A2A)
    assert plan.kv_exchange == "all_to_all" and len(plan.gathered_docs) == 3  # the per_doc layout, taken


def test_atp_falls_back_to_a_contiguous_split_labelled_atp_under_a_tight_cap():
    # a 7-token and a 1-token document at cp 4 under a cap of 2 tokens a rank: no anchor may be cut
    # into 2 x 4 chunks of 3 tokens, per_doc puts 3 tokens on rank 0: only a contiguous split fits
    plan = plan_shards([7, 1], 4, "atp", CM, max_tokens_per_rank=2, min_chunk=3)
    assert plan.strategy == "atp"
    assert plan.rank_num_tokens().tolist() == [2, 2, 2, 2]
    assert [s.tolist() for s in plan.segments] == [[[0, 0, 2]], [[0, 2, 4]], [[0, 4, 6]], [[0, 6, 7], [1, 0, 1]]]
    plan.validate()


def test_the_per_doc_refill_of_a_plan_with_an_idle_rank_is_costed_by_the_callers_model():
    # ATP keeps both 3-token documents whole (min_chunk 2 > 3 / 10) and leaves ranks idle; the
    # refilled candidates are costed by UNIT, not by a default. The per_doc refill's slowest rank
    # costs 8 (6 tokens + 2 pairs, exchange 1e-5 x 8); the contiguous candidate (one run a rank,
    # since it competes) wins with 7: its last rank holds tokens 1-2 of the second document
    # (2 tokens + 2 + 3 pairs)
    plan = plan_shards([3, 3], 5, "atp", UNIT, max_tokens_per_rank=2, min_chunk=2)
    assert plan.rank_num_tokens().min() >= 1 and plan.rank_num_tokens().max() <= 2
    assert plan.block_time_s == pytest.approx(7.00008)
    per_doc = finish_flat(np.array([3, 3]), 5, "atp", *per_doc_flat(np.array([3, 3]), 5), None, UNIT, "auto")
    assert per_doc.block_time_s == pytest.approx(8.00008)
    plan.validate()


def test_the_per_doc_refill_replaces_atps_plan_only_where_strictly_faster():
    cm = NVLINK_A2A.replace(node_size=1)
    plan = plan_shards([2, 2], 4, "atp", cm, min_chunk=8)
    refill = plan_shards([2, 2], 4, "per_doc", cm, kv_exchange="auto")
    assert plan.block_time_s == refill.block_time_s  # a tie: ATP's own (filled) layout is kept
    assert [s.tolist() for s in plan.segments] == [[[0, 0, 1]], [[1, 0, 1]], [[0, 1, 2]], [[1, 1, 2]]]


@pytest.mark.parametrize("cm", [CM, NVLINK_A2A, UNIT])
@pytest.mark.parametrize("share", sorted({1.0, *ANCHOR_SHARES}))
@pytest.mark.parametrize("cap", [None, 4])
def test_a_sub_group_plan_never_leaves_the_last_rank_without_tokens(cm, share, cap):
    # one 5-token document over 3 ranks: a sub-group layout of 2 ranks would leave rank 2 idle
    plan = plan_subgroups(np.array([5]), 3, cm, anchor_share=share, max_tokens_per_rank=cap)
    assert plan is None or plan.rank_num_tokens().min() >= 1


def test_the_per_doc_refill_is_taken_where_it_fills_the_cap_exactly():
    # ATP keeps the documents whole (min_chunk 4) and leaves 2 of 6 ranks idle; its refill costs 5 s,
    # the per_doc layout refilled 4 s with 2 tokens on its busiest rank: at the cap, so it fits
    plan = plan_shards([2, 2, 2, 1], 6, "atp", UNIT, max_tokens_per_rank=2, min_chunk=4)
    assert plan.block_time_s == pytest.approx(4.0) and plan.rank_num_tokens().max() == 2
    plan.validate()


@pytest.mark.parametrize("lengths, weights, room", [
    ([5, 7], [3, 2, 2, 2, 2], [1, 4, 5, 1, 4]),  # one pass over the ranks leaves a remainder token
    ([7, 8, 9], [2, 1, 3, 3, 4], [2, 6, 2, 5, 9]),  # the room is used to the last token
])
def test_split_by_share_hands_out_rounding_remainders_under_every_ranks_room(lengths, weights, room):
    # the documents' rounding remainders exceed the ranks with room in a first pass; a second pass
    # gives them to ranks with any token of room left (one with exactly one token left included)
    lengths, room = np.array(lengths), np.array(room, dtype=np.float64)
    frac = np.array(weights, dtype=np.float64) / sum(weights)
    got = _split_by_share(UNIT, lengths, frac, room.copy())
    assert got is not None
    bounds, n, _ = got
    assert n.sum(axis=1).tolist() == lengths.tolist()  # every token placed once
    assert (n.sum(axis=0) <= room).all()  # no rank over its room
    assert (bounds[:, -1] == lengths).all() and (np.diff(bounds, axis=1) >= 0).all()

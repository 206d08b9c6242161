"""Kills survivors of the twenty-fourth mutation pass in plan.py / segments.py / baselines.py
(``ShardPlan.validate``, ``_a2a_options``, ``contiguous_compute_floor``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding import plan_shards
from atac_hf.sharding.baselines import contiguous_compute_floor, contiguous_segments
from atac_hf.sharding.segments import finish_plan


def _with(plan, segments, **fields):
    segs = tuple(np.asarray(s, dtype=np.int64).reshape(-1, 3) for s in segments)
    return dataclasses.replace(plan, segments=segs, **fields)


def test_validate_refuses_a_rank_out_of_row_order_after_its_first_segment():
    """A rank's segments must run in row order, all of them: rank 0 holds rows [0, 1), [6, 10),
    [1, 5) (the ranges still tile the row with rank 1's [5, 6), so only the per-rank order check
    can refuse it). The check compares every segment's start with the end before it, not only
    with the first segment's end."""
    plan = plan_shards(np.array([6, 4]), 2, "contiguous")
    # validate__mutmut_43: `end[:+1]` compares each start with the first segment's end only
    with pytest.raises(AssertionError, match="rank 0: token indices not strictly increasing"):
        _with(plan, [[[0, 0, 1], [1, 0, 4], [0, 1, 5]], [[0, 5, 6]]]).validate()


def test_validate_messages_are_the_plain_sentences():
    """The two row-wide refusals read exactly as written (what broke, in the planner's words):
    a token held by zero or several ranks, and a split document the plan does not gather."""
    plan = plan_shards(np.array([6, 4]), 2, "contiguous")  # rank 0: [0, 5) of doc 0; rank 1: [5, 6) + doc 1
    # validate__mutmut_74 ("XX...XX")
    with pytest.raises(AssertionError, match="^some token is held by zero or several ranks$"):
        _with(plan, [[[0, 0, 5]], [[1, 0, 4]]]).validate()
    # validate__mutmut_79 ("XX...XX"), _80 (upper case): doc 0 is split over both ranks, gathered by none
    with pytest.raises(AssertionError, match="^a split document is not gathered$"):
        _with(plan, plan.segments, gathered_docs=np.zeros(0, dtype=np.int64)).validate()


@pytest.mark.parametrize("lengths, C", [([2**54 + 1], 5), ([2**55 + 3, 7], 7), ([2**60 + 5], 3)])
def test_contiguous_floor_cuts_huge_rows_where_the_layout_does(lengths, C):
    """Past 2**53 tokens the rank cuts ``n * r // C`` must be integer arithmetic: true division
    rounds ``n * r`` to float, and the truncated cut lands a few tokens off the layout's, so the
    floor is no longer the contiguous layout's slowest compute (exactly: one price per token)."""
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
    L = np.array(lengths)
    plan = finish_plan(L, C, "atp", contiguous_segments(L, C), None, cm, "all_gather")
    # contiguous_compute_floor__mutmut_8 (`/ C`)
    assert contiguous_compute_floor(L, C, cm) == float(plan.rank_compute_s.max())


def test_a_hidden_direct_exchange_is_not_rerouted():
    """Where the direct all-to-all is hidden on every rank (here exactly: its 210 s equals each
    rank's local attention), the node-routed exchange cannot lower the block time (its second
    phase adds to every rank): the plan stays direct. Rank 0's rows of document 0 go to ranks 2
    and 3 (the other node), so routing halves the inter-node rows; its second phase (1e-16 s at
    1e18 B/s) vanishes in the 465 s block, which would tie and let the smaller exchange win."""
    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=5.25,
                   link_bandwidth=1.0, link_latency_s=0.0, node_size=2, intra_node_bandwidth=1e18)
    L = np.array([30, 20, 20, 20, 20])
    segs = [[[0, 0, 10], [1, 0, 20]], [[2, 0, 20]], [[0, 10, 20], [3, 0, 20]], [[0, 20, 30], [4, 0, 20]]]
    segs = [np.asarray(s, dtype=np.int64) for s in segs]
    # _a2a_options__mutmut_40 / _41 (the hidden test dropped), _42 (`comm < local_attn`: equality not hidden)
    for exchange in ("all_to_all", "auto"):
        plan = finish_plan(L, 4, "atp", segs, None, cm, exchange)
        assert plan.kv_exchange == "all_to_all"
        assert plan.kv_route_node is None
        assert float(plan.comm_s) == 210.0 and float(plan.comm_tail_s) == 0.0
        assert plan.block_time_s == 465.0

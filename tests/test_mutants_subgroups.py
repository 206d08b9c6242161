"""Tests that kill the mutmut survivors in ``atac_hf/sharding/subgroups.py`` (issue 20).
docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding.subgroups import plan_subgroups, rank_compute

CM = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1)


def _seg(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def test_rank_compute_sums_each_ranks_segments():
    """rank_compute: per rank, tokens + causal pairs at 1 s each. Rank 0: doc 0 [0, 2) (2 tokens,
    3 pairs) and doc 1 [0, 1) (1 + 1): 7 s; rank 1: doc 0 [2, 4) (2 tokens, 2 * 2 + 3 = 7 pairs):
    9 s; rank 2 holds nothing: 0 s, still one entry."""
    got = rank_compute([_seg((0, 0, 2), (1, 0, 1)), _seg((0, 2, 4)), _seg()], CM)
    assert got.dtype == np.float64
    assert got.tolist() == [7.0, 9.0, 0.0]


def test_plan_subgroups_default_anchor_share_is_one_ranks_share():
    """By default an anchor costs more than one rank's share of the pack: with token-wise work
    only, a 6-token document among five of 2 tokens (16 tokens, 4 a rank on 4 ranks) is 1.5
    shares, so it is split over a sub-group; at anchor_share 2 there is no anchor and no plan."""
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
    L = np.array([6, 2, 2, 2, 2, 2], dtype=np.int64)
    plan = plan_subgroups(L, 4, cm)
    assert plan is not None and plan.sharded_docs.tolist() == [0]
    assert 2 <= sum(int((s[:, 0] == 0).any()) for s in plan.segments) < 4  # a proper sub-group
    same = plan_subgroups(L, 4, cm, anchor_share=1.0)
    assert [s.tolist() for s in plan.segments] == [s.tolist() for s in same.segments]
    assert plan_subgroups(L, 4, cm, anchor_share=2.0) is None

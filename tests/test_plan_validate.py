"""``ShardPlan.validate`` compares the segments' row ranges (O(segments)): it expanded every token
index before, one int64 per token (64 GiB for a 2**33-token pack)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from atac_hf.sharding import STRATEGIES, plan_shards


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_validate_plans_of_huge_packs_without_expanding_tokens(strategy):
    plan = plan_shards(np.array([2**40, 3, 2**33]), 8, strategy)
    plan.validate()


def _with(plan, segments):
    return dataclasses.replace(plan, segments=tuple(np.asarray(s, dtype=np.int64).reshape(-1, 3) for s in segments))


def test_validate_refuses_overlaps_gaps_disorder_and_negative_starts():
    plan = plan_shards(np.array([6, 4]), 2, "contiguous")  # rank 0: [0, 5) of doc 0; rank 1: [5, 6) + doc 1
    plan.validate()
    with pytest.raises(AssertionError, match="held by zero or several ranks"):  # token 4 on both ranks
        _with(plan, [[[0, 0, 5]], [[0, 4, 6], [1, 0, 4]]]).validate()
    with pytest.raises(AssertionError, match="held by zero or several ranks"):  # token 5 on none
        _with(plan, [[[0, 0, 5]], [[1, 0, 4]]]).validate()
    with pytest.raises(AssertionError, match="rank 1: token indices not strictly increasing"):
        _with(plan, [[[0, 0, 5]], [[1, 0, 4], [0, 5, 6]]]).validate()
    with pytest.raises(AssertionError, match="rank 0: a segment ends before it starts"):
        _with(plan, [[[0, 5, 0]], [[0, 5, 6], [1, 0, 4]]]).validate()
    # a start before the document's first token (numpy wrapped it to the row's last tokens before)
    with pytest.raises(AssertionError, match="rank 0: a segment lies outside its document"):
        _with(plan, [[[0, -2, 5]], [[0, 5, 6], [1, 0, 2]]]).validate()
    # the ranges tile the row, but a segment runs past its document into the next one, or names a
    # document by a negative id (numpy wrapped -1 to the last document); red-team 9
    with pytest.raises(AssertionError, match="rank 0: a segment lies outside its document"):
        _with(plan, [[[0, 0, 7]], [[1, 1, 4]]]).validate()
    with pytest.raises(AssertionError, match="rank 1: no such document"):
        _with(plan, [[[0, 0, 5]], [[0, 5, 6], [-1, 0, 4]]]).validate()
    with pytest.raises(AssertionError, match="rank 1: no such document"):
        _with(plan, [[[0, 0, 5]], [[0, 5, 6], [2, 0, 4]]]).validate()
    # empty segments hold nothing and are allowed anywhere
    _with(plan, [[[1, 2, 2], [0, 0, 5]], [[0, 5, 6], [1, 0, 4]]]).validate()

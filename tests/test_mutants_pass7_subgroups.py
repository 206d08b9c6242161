"""Tests that kill the hand-planted mutants of the parts of ``atac_hf/sharding/subgroups.py`` the
earlier passes' samples missed (issue 20, docs/TESTING.md, seventh pass): the anchor rule, the
proper-sub-group test, the re-splits and their pick, the lays of ``_split_chains`` and the tail
placement. Models whose seconds are exact (``tile=1``, whole-second prices); where a plan is too
long to work out by hand the expected value is the current one (characterisation), with the
property that tells it apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding.subgroups import plan_subgroups

# tokens and pairs at 1 s each, a link fast enough that any exchange hides behind the compute
UNIT = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, link_bandwidth=1e11, link_latency_s=1e-5)


def _cost(n):
    """A whole document's seconds under UNIT: n tokens + n (n + 1) / 2 causal pairs."""
    return n + n * (n + 1) // 2


def _layout(plan):
    return [np.asarray(s).tolist() for s in plan.segments]


@pytest.mark.parametrize("lengths, C, share", [([5], 2, 1.0), ([6], 3, 0.5)])
def test_no_plan_where_the_only_anchor_spans_every_rank(lengths, C, share):
    """One document, the whole pack: its interval on the line covers every slot, so it lands on all
    C ranks, no *proper* sub-group (2..C-1 ranks): the flat plan's job, None (the docstring). Kills
    ``2 <= len(p) <= C`` (a plan splitting it over all ranks)."""
    assert plan_subgroups(np.array(lengths), C, UNIT, anchor_share=share) is None


def test_a_document_costing_exactly_the_anchor_share_is_no_anchor():
    """``[4, 7, 2, 3, 3, 5, 5]`` on 8 ranks: 112 s of work, 14 s a rank; doc 0 (4 tokens) costs
    exactly 14 s, one share, and anchors cost *more* than ``anchor_share`` (1.0) shares: the line
    holds docs 1, 5 and 6 only (2.5, 1.43 and 1.43 shares); the plan splits docs 1 and 5
    (characterisation). Kills ``>=`` in the anchor rule (doc 0 on the line too: docs 1, 5 and 6
    split, another layout)."""
    L = np.array([4, 7, 2, 3, 3, 5, 5])
    assert sum(_cost(n) for n in L.tolist()) == 112 and _cost(4) == 14
    plan = plan_subgroups(L, 8, UNIT)
    assert plan.gathered_docs.tolist() == [1, 5]
    assert _layout(plan) == [[[3, 0, 3]], [[4, 0, 3]], [[1, 0, 5]], [[0, 0, 4]], [[1, 5, 7]],
                             [[2, 0, 2], [5, 0, 2], [5, 4, 5]], [[5, 2, 4]], [[6, 0, 5]]]


def test_slot_line_deals_each_anchor_by_the_work_a_rank_it_would_leave():
    """5 ranks in nodes of 2, 2 and 1, three 1-share anchors. The first goes to node 0 (work a rank
    after it: 0.5, 0.5, 1.0; ties to the first), the second to node 1 (1.0, 0.5, 1.0), the third to
    node 0 again (1.0, 1.0, 1.0), not to the empty one-rank node 2, where it would be 1.0 a rank too:
    node 0 lays anchors 0 and 2 on [0, 1) and [1, 2), node 1 anchor 1 on [2, 4). Kills
    ``argmin(work / width)`` (the load before the anchor: the third to node 2)."""
    from atac_hf.sharding.subgroups import _slot_line

    assert _slot_line(np.array([1.0, 1.0, 1.0]), 5, 2) == (
        [(0.0, 1.0), (2.0, 4.0), (1.0, 2.0)], [(0, 2), (2, 4), (4, 5)])


def _tails(tails, unit, L, planned, C, cap=np.inf):
    from atac_hf.sharding.subgroups import _place_tails

    got = _place_tails(np.array(tails), np.array(unit, dtype=np.float64), np.array(L), planned, [(0, 1, planned)], C,
                       cap)
    return None if got is None else got.tolist()


@pytest.mark.parametrize("models", [1, 3])
def test_place_tails_a_chain_filled_to_exactly_the_cap_stays_open(models):
    """Doc 0 (4 tokens) split 2 + 2 over the chain {0, 1} (0.2 shares), rank 2 alone; tail 1 (1 token,
    0.5 shares) goes to the chain (0.35 a rank against 0.5), rank 0. At a cap of 3 the chain's ranks
    hold 2 tokens: the tail fills one to exactly the cap, which a cap allows. With one model and with
    three (the inlined worst-of-three loop). Kills ``low[b] + n >= cap`` in either loop (the chain
    closed: rank 2)."""
    unit = [[0.2, 0.5]] * models
    halves = [(0, [(0, 2), (1, 2)])]
    assert _tails([1], unit, [4, 1], halves, 3) == [0]
    assert _tails([1], unit, [4, 1], halves, 3, cap=3) == [0]
    assert _tails([1], unit, [4, 1], halves, 3, cap=2) == [2]  # no room left on the chain


def test_pieces_a_small_piece_between_equal_neighbours_merges_into_the_left_one():
    """An anchor of 7 tokens over ranks holding [0, 3), [3, 4) and [4, 7) of the line: pieces 3, 1,
    3; the middle one is under 2 * min_chunk and its neighbours are equal: it merges into the left
    one (the lower rank), 4 + 3. Kills ``<`` for ``<=`` in the neighbour test (into the right: 3 + 4)."""
    from atac_hf.sharding.subgroups import _pieces

    assert _pieces((0.0, 7.0), [0.0, 3.0, 4.0, 7.0], 7, 1) == [(0, 4), (2, 3)]

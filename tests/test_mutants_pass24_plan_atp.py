"""Tests that kill ``plan_atp`` mutants the suite let through in the twenty-fourth mutation pass
(issue 20: mutmut 3.8.1 over every mutant of ``atac_hf/sharding/atp.py``). Most survivors were the
thirteenth pass's (tests/test_mutants_pass13.py); these pin what ATP gained since: the level count
competing with its exchange, the price-error rule, the contiguous candidate, the forced exchange.

Models whose seconds are exact (``tile=1``, whole-second prices, no latency), so block times compare
exactly. Several cases sit on a documented boundary (a strict or inclusive tolerance) met exactly;
each docstring says so, and says where the mutant's plan is faster there (the boundary is the rule
as written, not an optimum).
"""

from __future__ import annotations

from unittest import mock

import numpy as np

import atac_hf.sharding.atp as atp_mod
from atac_hf.cost import CostModel
from atac_hf.sharding.atp import SUBGROUP_SKIP_LEVEL, TWO_WAY_TOLERANCE, _price_error_imbalance, plan_atp


def _model(linear, bandwidth, window=None):
    """Pairs at 1 s, ``linear`` s a token, one K/V byte a token over ``bandwidth`` byte/s."""
    return CostModel(linear_s_per_token=float(linear), attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0,
                     link_bandwidth=float(bandwidth), link_latency_s=0.0, sliding_window=window)


PAIRS = _model(0, 8)  # as tests/test_mutants_pass13.py
FAST = _model(1, 64)
SLOW1 = _model(1, 1)
WINDOW5 = _model(1, 2, 5)


def _seg(plan):
    return [np.asarray(s).tolist() for s in plan.segments]


def test_a_document_costing_exactly_a_ranks_share_is_kept_whole():
    """``[6, 5, 3]`` on 2 ranks under PAIRS: 21 + 15 + 6 = 42 pairs, 21 a rank. Document 0 costs a
    rank's share, not more, so no document must be split (the anchor count starts at the documents
    costlier than a rank's share): whole documents, 21 s on both ranks, nothing exchanged. The
    contiguous candidate cannot stand in: its cut at row 7 gives rank 0 22 s. Kills the start count
    as ``whole >= target`` (mutant 90: document 0 split, 22 s)."""
    plan = plan_atp(np.array([6, 5, 3]), 2, PAIRS)
    assert _seg(plan) == [[[0, 0, 6]], [[1, 0, 5], [2, 0, 3]]]
    assert plan.gathered_docs.tolist() == []
    assert plan.block_time_s == 21.0


def test_the_level_count_is_searched_from_the_next_count_to_the_last():
    """``[12, 18, 8, 22, 5, 1]`` on 2 ranks under FAST (``"auto"`` exchange). Anchors are the documents
    of >= 4 tokens (jmax 5). The anchor-count loop stops at 3 anchors (documents 3, 1, 0), whose
    cost-level water fill is level (311 / 309 s); their plan re-split two-way computes 313 / 307 s,
    over 0.5% from level, so the fewest more anchors whose water fill is level compete, built with
    their exchange: 4 (document 2 too), two-way, 312 / 308 s, taken (312 < 313). Kills the loop's
    range started at 0 (mutant 386: it meets count 3 again, rebuilds the 313 s plan and stops),
    at ``best + 2`` (390: skips count 4) and ended at ``jmax - 1`` (391: no count tried): 313 s."""
    plan = plan_atp(np.array([12, 18, 8, 22, 5, 1]), 2, FAST)
    assert plan.block_time_s == 312.0
    assert plan.rank_compute_s.tolist() == [308.0, 312.0]
    assert plan.gathered_docs.tolist() == [0, 1, 2, 3]


def test_a_level_count_no_faster_than_atps_plan_is_not_taken():
    """``[13, 20, 18]`` on 2 ranks under PAIRS, all-to-all: 91 + 210 + 171 = 472 pairs, 236 a rank.
    The anchor-count loop takes 1 anchor (document 1: water fill 234 / 238 s, block 238 s; 2 anchors
    are level but 240.75 s); re-split two-way it is 241 / 231 s, 2% from level, so the level count
    competes: 2 anchors, two-way, 231 / 241 s, the same 241 s block time with 6.25 s of exchange
    against 3 s. A level count replaces ATP's plan only where faster: at a tie the fewer anchors
    (less K/V traffic) are kept. Kills the level count's test ``<=`` (mutant 414)."""
    plan = plan_atp(np.array([13, 20, 18]), 2, PAIRS, kv_exchange="all_to_all")
    assert plan.block_time_s == 241.0
    assert plan.gathered_docs.tolist() == [1]
    assert plan.comm_s == 3.0


def test_a_plan_exactly_at_the_level_tolerance_tries_no_level_count():
    """``[30, 3, 30, 29, 1, 15]`` on 2 ranks under FAST, all-to-all. The anchor-count loop takes 1
    anchor (document 0; water fill 803 / 797 s, level); re-split two-way it computes 796 / 804 s:
    804 / 800 is exactly 1.005, "level" as the anchor-count loop reads it (max <= 1.005 x mean), so
    the level-count search (for plans "off level") does not run: 804 s. Kills its entry test as
    ``imbalance >= 1.005`` (mutant 382). A boundary met exactly: there the mutant goes on to a 3-anchor
    plan of 802 s; the test holds the threshold as written (strict)."""
    plan = plan_atp(np.array([30, 3, 30, 29, 1, 15]), 2, FAST, kv_exchange="all_to_all")
    assert plan.imbalance == 1.005
    assert plan.block_time_s == 804.0
    assert plan.gathered_docs.tolist() == [0]


def test_a_plan_within_the_price_error_tolerance_is_kept():
    """``[20, 20, 4, 8, 7]`` on 2 ranks under SLOW1, all-gather. The anchor-count loop takes 1 anchor
    (277 / 276 s, level); no plan of the 2 or 3 extra anchors is level two-way. The price-error rule
    replaces a plan only where its ranks are more than TWO_WAY_TOLERANCE from level with attention at
    0.5x or 2x: this one's worst is 1.0196, kept (277 s). Kills the rule's test as ``worst > 1 -
    TWO_WAY_TOLERANCE`` (mutant 492: it takes the extras' cost-level plan, 281 s)."""
    plan = plan_atp(np.array([20, 20, 4, 8, 7]), 2, SLOW1, kv_exchange="all_gather")
    assert 1.0 < _price_error_imbalance(plan, SLOW1) < 1 + TWO_WAY_TOLERANCE
    assert plan.block_time_s == 277.0
    assert plan.gathered_docs.tolist() == [0]


def test_a_plan_exactly_at_the_price_error_tolerance_is_kept():
    """``[7, 7, 15, 8, 18]`` on 2 ranks, pairs at 1 s, no token price, an 8-token window, a 1 byte/s
    link: all compute is attention, so scaling its price scales every rank alike and the plan's
    imbalance is the same at 0.5x and 2x: 153 / 150, exactly 1 + TWO_WAY_TOLERANCE. The rule replaces
    plans *more* than TWO_WAY_TOLERANCE from level: this one (1 anchor, 153 s) is kept. Kills the
    test as ``>=`` (mutant 491: the extras' cost-level plan, 155 s)."""
    cm = _model(0, 1, 8)
    plan = plan_atp(np.array([7, 7, 15, 8, 18]), 2, cm)
    assert _price_error_imbalance(plan, cm) == 1 + TWO_WAY_TOLERANCE
    assert plan.block_time_s == 153.0
    assert plan.gathered_docs.tolist() == [4]


def test_the_contiguous_layout_as_level_and_faster_is_taken_under_atps_name():
    """One 15-token document on 3 ranks under WINDOW5 (a 5-token window). ATP's head-tail plan
    computes 23 / 27 / 30 s with 6 s of exposed all-to-all: 36 s. One contiguous run a rank: 5
    tokens each, 5 + 15 = 20 s on rank 0 and 5 + 25 = 30 s on the others (each query reads 5 keys),
    4 s of all-to-all (4 keys each to ranks 1 and 2): 34 s, over TWO_WAY_TOLERANCE faster; its max /
    mean is 30 / (80 / 3), the same 1.125 as ATP's plan: "no less level", taken. Kills the level
    test as ``<`` (mutant 610: 36 s) and the contiguous plan named None, ``"XXatpXX"`` or ``"ATP"``
    (586, 597, 598; ``plan_shards`` and the runtime read the name)."""
    plan = plan_atp(np.array([15]), 3, WINDOW5)
    assert plan.strategy == "atp"
    assert _seg(plan) == [[[0, 0, 5]], [[0, 5, 10]], [[0, 10, 15]]]
    assert plan.block_time_s == 34.0


def test_the_contiguous_layout_exactly_the_tolerance_faster_is_not_taken():
    """One 6-token document on 3 ranks, pairs at 1 s, a 3-token window, 16 byte/s. ATP's plan: 6.375 s
    (4 / 5 / 6 s and 0.375 s of exposed all-to-all); the contiguous runs: 6.25 s (3 / 6 / 6 s and
    0.25 s), as level (max / mean 1.2 both). 6.25 x 1.02 is 6.375 exactly: the contiguous layout is
    taken where faster by *more than* TWO_WAY_TOLERANCE, so ATP's plan stays. Kills the test as
    ``run * (1 + TWO_WAY_TOLERANCE) <= plan`` (mutant 609). A boundary met exactly: the mutant's
    plan is the faster one there; the test holds the tolerance as documented."""
    plan = plan_atp(np.array([6]), 3, _model(0, 16, 3))
    assert plan.block_time_s == 6.375
    assert _seg(plan) == [[[0, 0, 1], [0, 5, 6]], [[0, 1, 2], [0, 4, 5]], [[0, 2, 4]]]


def test_no_sub_group_candidate_where_the_ranks_are_exactly_the_skip_level_from_level():
    """``[15, 9, 20, 20, 19]`` on 3 ranks, 2 s a token, pairs at 1 s, a 3-token window, 4 byte/s: the
    flat plan (1 anchor) computes 134 / 134 / 132 s, its 3 s exchange hidden (block time 134 s, its
    slowest rank's compute): max / mean is 134 / (400 / 3), exactly 1 + SUBGROUP_SKIP_LEVEL. Sub-group
    candidates are built only where the exchange is exposed or the ranks are *further* than that
    from level (elsewhere none can gain more than that, and building them is most of the planning
    time): none is built. Kills the gate's imbalance test as ``>=`` (mutant 626; it builds them and
    takes one of the same 134 s)."""
    cm = _model(2, 4, 3)
    with mock.patch.object(atp_mod, "_plan_subgroups", side_effect=AssertionError("sub-group candidate built")):
        plan = plan_atp(np.array([15, 9, 20, 20, 19]), 3, cm)
    assert plan.imbalance == 1 + SUBGROUP_SKIP_LEVEL
    assert plan.block_time_s == float(plan.rank_compute_s.max()) == 134.0
    assert plan.gathered_docs.tolist() == [2, 3]


def test_the_contiguous_fallback_keeps_the_exchange_asked_for():
    """``[2, 1]`` on 3 ranks under PAIRS with a cap of 1 token a rank (the thirteenth pass's fallback
    case), ``kv_exchange="all_gather"``: nothing but the contiguous split fits; ``plan_atp`` costs
    every candidate with the exchange asked for, so the fallback's all-gather moves document 0's 2
    tokens (1/3 s): 2.333 s, although the all-to-all would be 2.25 s. Kills the fallback costed with
    exchange None (mutant 701: ``"auto"``, the all-to-all)."""
    plan = plan_atp(np.array([2, 1]), 3, PAIRS, max_tokens_per_rank=1, kv_exchange="all_gather")
    assert _seg(plan) == [[[0, 0, 1]], [[0, 1, 2]], [[1, 0, 1]]]
    assert plan.kv_exchange == "all_gather"
    assert plan.comm_s == 1 / 3
    assert plan.block_time_s == 2 + 1 / 3


def test_whole_document_loads_exactly_at_the_level_tolerance_count_as_level():
    """``[87, 74, 50, 26, 18]`` on 2 ranks under PAIRS: 3828 + 2775 + 1275 + 351 + 171 = 8400 pairs,
    4200 a rank, none costlier, so the anchor count starts at 0: whole documents, longest first on
    the least-loaded rank, give 4179 / 4221 s, and 4221 is 4200 x 1.005 exactly (in doubles too):
    level, the loop stops. That plan is level in estimated cost only; one more anchor split two-way
    (4260 s) is within TWO_WAY_TOLERANCE and taken, and per_doc (4251.75 s) beats it. Kills the
    loop's level test as ``<`` (mutant 366, left "not told apart" by the thirteenth pass: it goes on
    to 1 and 2 anchors, 4203 s). A boundary met exactly: the mutant's plan is the faster one there;
    the test holds "level" as the loop defines it (inclusive)."""
    assert 8400 / 2 * 1.005 == 4221.0
    plan = plan_atp(np.array([87, 74, 50, 26, 18]), 2, PAIRS)
    assert plan.block_time_s == 4251.75
    assert plan.gathered_docs.tolist() == [0, 1, 2, 3, 4]


def test_a_level_count_exactly_at_the_level_tolerance_is_level():
    """``[122, 24, 24, 11, 21]`` on 2 ranks under PAIRS: 7503 + 300 + 300 + 66 + 231 = 8400 pairs, 4200
    a rank. Document 0 costs more, so the count starts at 1 anchor: its water fill gives 4221 /
    4179 s (4221 is 4200 x 1.005 exactly: level), the loop stops; re-split two-way it computes
    4173 / 4227 s, off level, so the fewest more anchors whose water fill is level compete: 3 anchors
    (documents 0, 1, 2; water fill again 4221 / 4179 s, level by the same inclusive test), two-way
    4201 / 4199 s, taken. Kills the level-count search's test as ``<`` (mutant 399: it passes over
    3 anchors to 4, 4226.875 s)."""
    plan = plan_atp(np.array([122, 24, 24, 11, 21]), 2, PAIRS)
    assert plan.block_time_s == 4201.0
    assert plan.rank_compute_s.tolist() == [4201.0, 4199.0]
    assert plan.gathered_docs.tolist() == [0, 1, 2]

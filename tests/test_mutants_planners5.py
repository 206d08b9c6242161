"""Tests that kill the mutmut survivors of the packing planners' fifth pass (issue 20).

A sample of the mutants the fourth pass did not run (``atac_hf.packing.planners.{wfap,window,
wfap_place,wfap_end}``, every 16th name from the 9th, ``wfap_end`` every 32nd from the 8th).
Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.<module>.<name>``)
and the hand-checked case on which the mutant gives another answer; docs/TESTING.md lists the run
and the verdicts. Expected values are worked out by hand, never computed with the code under test.

The WFAP cases reuse the fourth pass's setting (``tests/test_mutants_wfap.py``): a cost of causal
pairs only, L (L + 1) / 2, cap 100, 2 packs a window and reference documents of 10 tokens: a light
pack (100 tokens of 10-token documents) costs 10 x 55 = 550, so a sample is heavy from 34 tokens on
(34 x 35 / 2 = 595 > 1.05 x 550).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_mutants_wfap import _cfg, _ctx, _item  # noqa: E402

import pytest  # noqa: E402

from atac_hf.packing.planners.wfap import plan_wfap, wfap_held  # noqa: E402


# ---------------------------------------------------------------- wfap.py
# x__select_release__mutmut_135 (`overdue | splittable`: every splittable heavy item split, not
# only the overdue ones). Window 2, max_defer 2, balance_split: sample 0 (66 tokens, arrived in
# window 0) is overdue, sample 1 (40 tokens, arrived in window 1) is heavy (820 > 577.5) but not
# due. Their run of two anchors is unbalanced: 2 x 2211 / (2211 + min(2211, 820 + 5.5 x 60))
# = 4422 / 3361 = 1.32 > 1.05, and 2 heavy items are below HELD_LIMIT x 2, so no run is released:
# the overdue one is split into the fewest light fragments (3 of 22 tokens, 253 each; 2 of 33
# cost 561 > 550) and the other waits for a run that balances it.

def test_balance_split_cuts_only_the_overdue_heavy_sample():
    cfg = _cfg(balance_split=True, max_defer=2, min_fragment=5)
    items = [_item(0, 66, arrival=0), _item(1, 40, arrival=1)]
    packs, carry, split = plan_wfap(items, _ctx(cfg, window=2))
    assert sorted((it[0], it[1], it[2]) for p in packs for it in p) == [(0, 0, 22), (0, 22, 44), (0, 44, 66)]
    assert carry == [(1, 0, 40, 1, 1, 0)] and split == [(0, 66)]
    # the next window holds sample 1 back: 40 tokens, one item
    assert wfap_held(items, _ctx(cfg, window=2)) == (40, 1)


# x_wfap_held__mutmut_20 (`return 1, 0` for a pool without heavy items): a pool of light samples
# holds nothing back, like an empty one.

def test_a_pool_without_heavy_samples_holds_nothing_back():
    ctx = _ctx(_cfg(), window=1)
    assert wfap_held([], ctx) == (0, 0)
    assert wfap_held([_item(0, 10, arrival=0), _item(1, 33, arrival=0)], ctx) == (0, 0)


# x__place__mutmut_67 (the tails ordered with the not-due ones first): the first
# `num_due_tails` of the order are placed without a ceiling as the overdue ones, so with the
# mutant a new tail takes the overdue tail's place and the overdue one is left over.
# Window 2, max_defer 2: sample 0 (30 tokens, arrived in window 0) is overdue, samples 1-7
# (30 tokens, new) are not; all light (465). Two packs of 100 hold three samples each: sample 0
# goes first, then 1-5 in data order, each to the cheaper pack (ties to the lower index):
# 0 -> pack 0, 1 -> pack 1, 2 -> pack 0, ...; 6 and 7 find no room and wait.

def test_an_overdue_light_tail_is_placed_before_the_new_ones():
    items = [_item(0, 30, arrival=0)] + [_item(i, 30, arrival=2) for i in range(1, 8)]
    packs, carry, split = plan_wfap(items, _ctx(_cfg(max_defer=2), window=2))
    assert [[it[0] for it in p] for p in packs] == [[0, 2, 4], [1, 3, 5]]
    assert [it[0] for it in carry] == [6, 7] and split == []


# ---------------------------------------------------------------- wfap_place.py
# x_local_search__mutmut_27 (the gap as `sc[p] + sc[q]`): the search stops where the costliest
# and the cheapest pack differ by rounding only (<= 1e-12 of the score); the mutant's "gap" is
# the sum, so it goes on. Two models (K = 2): pack 0 holds tails 0 (3, 1) and 1 (7, 4), costs
# (10, 5), score 10; pack 1 holds tails 2 (1, 3) and 3 (4, 7 - 1e-12), costs (5, 10 - 1e-12),
# score 10 - 1e-12. Swapping tails 0 and 2 would give (8, 7) and (7, 8 - 1e-12), but a gap of
# 1e-12 (at most 1e-12 x 10) is no gap: nothing moves.

def test_local_search_stops_at_a_gap_within_rounding():
    from atac_hf.packing.planners.wfap_place import local_search

    e = 1e-12
    c = [[3.0, 1.0], [7.0, 4.0], [1.0, 3.0], [4.0, 7.0 - e]]
    pc = [[10.0, 5.0], [5.0, 10.0 - e]]
    pt, tail_of = [20, 20], [[0, 1], [2, 3]]
    local_search(pc, pt, tail_of, [[], []], [10, 10, 10, 10], c, 100)
    assert tail_of == [[0, 1], [2, 3]] and pc == [[10.0, 5.0], [5.0, 10.0 - e]] and pt == [20, 20]
    # with a real gap (tail 3 at (4, 6): pack 1 at (5, 9)) one step swaps: the best swaps (0 with 2,
    # or 1 with 3) lower the pair's higher score from 10 to 8
    c[3] = [4.0, 6.0]
    pc = [[10.0, 5.0], [5.0, 9.0]]
    tail_of = [[0, 1], [2, 3]]
    local_search(pc, pt, tail_of, [[], []], [10, 10, 10, 10], c, 100, max_steps=1)
    assert max(max(v) for v in pc) == 8.0 and [sorted(t) for t in tail_of] in ([[1, 2], [0, 3]], [[0, 3], [1, 2]])


# x__place__mutmut_55 (`pt[best] = L[i]`: an anchor joining a pack that already holds an overdue
# tail forgets the tail's tokens), which the fourth pass left: here it overfills a pack past
# the cap. Window 2, max_defer 2: sample 0 (10 tokens, 55, arrived in window 0) is an overdue
# light tail; samples 1 (50 tokens, 1275) and 2 (48 tokens, 1176), arrived in window 1, are
# heavy and balanced (potentials 1275 + 5.5 x 50 = 1550 and 1176 + 5.5 x 52 = 1462: the run
# costs max 1275 over a mean of (1275 + 1275) / 2, ratio 1.0), so both are released; samples
# 3-62 are new 1-token tails (1 each). Overdue tails first: 0 -> pack 0. Then the anchors by
# cost: 1 -> pack 1 (0 < 55), 2 -> pack 0 (55 < 1275): pack 0 costs 1231 with 58 tokens. The
# ceiling is the costliest pack, 1275 (the fill level is 1.64 x 100 x 1.025 = 168). The new
# tails go to pack 0 until it is full: 42 of them (1273 <= 1275); pack 1 would pass the
# ceiling (1276), so 18 are left (holding back new tails does not leave fewer). The mutant
# counts pack 0 at 48 tokens and puts 44 tails in it (1275): 102 tokens.

def test_an_anchor_joining_an_overdue_tail_counts_its_tokens():
    items = [_item(0, 10, arrival=0), _item(1, 50, arrival=1), _item(2, 48, arrival=1)]
    items += [_item(i, 1, arrival=2) for i in range(3, 63)]
    packs, carry, split = plan_wfap(items, _ctx(_cfg(max_defer=2), window=2))
    assert [sum(it[2] - it[1] for it in p) for p in packs] == [100, 50]
    assert [sorted(it[0] for it in p if it[0] < 3) for p in packs] == [[0, 2], [1]]
    assert sorted(it[0] for it in packs[0] if it[0] >= 3) == list(range(3, 45))
    assert [it[0] for it in carry] == list(range(45, 63)) and split == []


# x__select_release__mutmut_75 (`ratio < tol`: a run balanced to exactly the tolerance is not
# released), which the fourth pass left for want of an exact case. Cap 64, 2 packs, reference
# documents of 1 token (a light pack costs 64 pairs), balance_tolerance 1.5, so every number is
# exact in binary: samples 0 (30 tokens, 465 pairs) and 1 (14 tokens, 105) are heavy (> 1.5 x
# 64 = 96), with potentials 465 + 34 = 499 and 105 + 50 = 155. The run of both costs max 465
# over a mean of (465 + 155) / 2 = 310: 465 / 310 = 1.5, within the tolerance, so it is
# released, one anchor a pack. The mutant holds both back (2 heavy samples: no forced release).

def test_a_run_balanced_to_exactly_the_tolerance_is_released():
    from atac_hf.packing import PackingConfig
    from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token
    from test_mutants_wfap import PAIRS

    cfg = PackingConfig(max_tokens=64, packs_per_window=2, reference_doc_tokens=1, balance_tolerance=1.5)
    ctx = WindowContext(config=cfg, cost_model=PAIRS, window=1, final=False,
                        ref_cost_per_token=ref_cost_per_token(cfg, PAIRS))
    packs, carry, split = plan_wfap([_item(0, 30, arrival=0), _item(1, 14, arrival=0)], ctx)
    assert packs == [[(0, 0, 30, 0, 0, 0)], [(1, 0, 14, 0, 1, 0)]] and carry == [] and split == []


# x__select_release__mutmut_126 (`< tol` where fewer heavy items than packs are released together
# if balanced): the same exact setting with 3 packs and balance_tolerance 2 (heavy above 128):
# sample 1 (16 tokens, 136 pairs, arrived in window 0) is overdue in window 2 (max_defer 2),
# sample 0 (31 tokens, 496, arrived in window 1) is not. Potentials 496 + 33 = 529 and
# 136 + 48 = 184; with the third pack light (64): 496 / ((496 + 184 + 64) / 3) = 496 / 248 = 2,
# within the tolerance, so both are released. The overdue anchor goes first (pack 0), then
# sample 0 to the cheapest pack left (pack 1). The mutant releases the overdue one with only the
# companions no costlier than it (none: 496 > 136), and holds sample 0 back.

def test_fewer_heavy_samples_than_packs_balanced_to_exactly_the_tolerance_are_released_together():
    from atac_hf.packing import PackingConfig
    from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token
    from test_mutants_wfap import PAIRS

    cfg = PackingConfig(max_tokens=64, packs_per_window=3, reference_doc_tokens=1, balance_tolerance=2.0,
                        max_defer=2)
    ctx = WindowContext(config=cfg, cost_model=PAIRS, window=2, final=False,
                        ref_cost_per_token=ref_cost_per_token(cfg, PAIRS))
    items = [_item(0, 31, arrival=1), _item(1, 16, arrival=0)]
    packs, carry, split = plan_wfap(items, ctx)
    assert packs == [[(1, 0, 16, 0, 1, 0)], [(0, 0, 31, 1, 0, 0)], []] and carry == [] and split == []


# x__place__mutmut_151 (the hold-back count starting at `freed = 1.0`), which the fourth pass
# left. Window 1, 2 packs, nothing overdue. Samples 17 (45 tokens, 1035) and 28 (40, 820), both
# arrived in window 0, are heavy and balanced (potentials 1337.5 and 1150: max 1035 over a mean
# of 1035), so they anchor packs 0 and 1. Light tails, carried before: 31 (12 tokens, 78),
# 13 (5, 15), 33 (3, 6); new: 22 (12, 78), 32 (8, 36), 8 (3, 6), 12 (3, 6), 2 (2, 3). The
# ceiling is the costliest pack, 1035 (fill level: 72 / 24 x 100 x 1.025 = 307.5). In order
# (carried first, then by cost, ties in data order) each goes to the cheaper pack, 1: 31, 13,
# 33, 22, 32 (1033); 8, 12 and 2 would pass 1035 and are left: 8 new tokens over. Holding back
# new tails frees cost x 100 / 1035 tokens each: 22 (7.54 <= 8) is held, 32 (+3.48), 8 and 12
# (+0.58) are not, 2 (+0.29: 7.83) is. Without 22 and 2: 31, 13, 33, 32, 8, 12 all go to pack 1
# (967), 2 left instead of 3, so that is kept. The mutant's count starts at 1: 22 (8.54) is not
# held but 32, 8, 12, 2 are; without them only 2 fewer tails are placed, 4 left, not fewer than
# 3: it keeps the first placement. x__place__mutmut_157 (`s[i] * rate`: the cost times 1035 / 100)
# holds nothing back (22 would free 807 tokens) and keeps the first placement too.

def test_holding_back_new_tails_frees_their_own_tokens_from_zero():
    spec = [(2, 2, 1), (8, 3, 1), (12, 3, 1), (13, 5, 0), (17, 45, 0), (22, 12, 1), (28, 40, 0), (31, 12, 0),
            (32, 8, 1), (33, 3, 0)]
    items = [_item(sid, L, arrival=a) for sid, L, a in spec]
    packs, carry, split = plan_wfap(items, _ctx(_cfg(), window=1))
    assert [[it[0] for it in p] for p in packs] == [[17], [28, 31, 13, 33, 32, 8, 12]]
    assert [it[0] for it in carry] == [2, 22] and split == []


# x_local_search__mutmut_79 (`argmin(None)`: the first tail's move taken, not the best one).
# One model; pack 0 holds tails 0 (7 tokens, cost 7) and 1 (3, 3): 10; pack 1 holds tail 2
# (2, 2). Moving tail 0 gives max(3, 9) = 9, moving tail 1 max(7, 5) = 7: the best move is tail 1.
# The best swap (0 with 2: packs 5 and 7) is no better than 7, so the move is made; then pack 0
# holds one tail and no anchor (never emptied) and no swap lowers 7: packs (7) and (5). The
# mutant takes the move of tail 0 (9), which the swap beats: packs (5) and (7), tails swapped.

def test_local_search_moves_the_best_tail():
    from atac_hf.packing.planners.wfap_place import local_search

    c = [[7.0], [3.0], [2.0]]
    pc, pt, tail_of = [[10.0], [2.0]], [10, 2], [[0, 1], [2]]
    local_search(pc, pt, tail_of, [[], []], [7, 3, 2], c, 100)
    assert tail_of == [[0], [2, 1]] and pc == [[7.0], [5.0]] and pt == [7, 5]


# ---------------------------------------------------------------- window.py
# x_place_overdue__mutmut_132 (a pack's cost lowered when a piece of a split overdue sample
# joins it). Cap 10, cost = tokens, 3 packs holding overdue items (none can leave): 6, 5 and 4
# tokens (room 4, 5, 6). An overdue 9-token sample fits none, so it is cut over the packs with
# the most room: 6 tokens to pack 2, 3 to pack 1 (costs 6, 8, 10; room 4, 2, 0). An overdue
# 2-token item then fits packs 0 and 1 and joins the cheaper, pack 0 (6 < 8); the mutant counts
# pack 1 at 5 - 3 = 2 and puts it there.

def test_place_overdue_costs_the_pieces_of_a_split_sample():
    from test_mutants_window import _ctx as _wctx
    from test_mutants_window import _item as _witem

    from atac_hf.packing.planners.window import place_overdue

    ctx = _wctx(3, 0, 0)  # max_defer 0: a whole sample that fits may be cut (deferral off)
    x, y, z = _witem(0, 6, 0, 0), _witem(1, 5, 0, 1), _witem(2, 4, 0, 2)
    o1, o2 = _witem(3, 9, 0, 3), _witem(4, 2, 0, 4)
    packs = [[x], [y], [z]]
    rest, split = place_overdue(packs, [o1, o2], ctx)
    assert packs == [[x, o2], [y, (3, 6, 9, 0, 3, 1)], [z, (3, 0, 6, 0, 3, 1)]]
    assert rest == [] and split == [(3, 9)]


# x__split_light__mutmut_19 (`>= light`: a fragment costing exactly a light pack is cut again).
# Cap 100, reference documents of 5 tokens: a light pack is 20 x 15 = 300 pairs; a fragment of
# 24 tokens costs 24 x 25 / 2 = 300, exactly light, which "at most a light pack" allows. An
# overdue 48-token sample (1176 > 1.05 x 300, heavy) alone in a window of 2 packs is unbalanced
# (1176 over a mean of (1176 + 300) / 2: 1.59), so balance_split cuts it: 2 fragments of 24
# (the mutant: 3 of 16, 48 // 3 >= min_fragment 12).

def test_balance_split_keeps_fragments_that_cost_exactly_a_light_pack():
    from atac_hf.packing import PackingConfig

    cfg = PackingConfig(max_tokens=100, packs_per_window=2, reference_doc_tokens=5, balance_split=True,
                        max_defer=2)
    packs, carry, split = plan_wfap([_item(0, 48, arrival=0)], _ctx(cfg, window=2))
    assert sorted((it[1], it[2]) for p in packs for it in p) == [(0, 24), (24, 48)]
    assert all(len(p) == 1 for p in packs) and carry == [] and split == [(0, 48)]


# x_plan_wfap__mutmut_118 (due from `window - arrival > max_defer`, one window late). Window 3,
# max_defer 2, 2 packs: samples 29 (arrived in window 1) and 33 (window 0), 1 token each, are
# both due (3 - 1 >= 2), so they are placed in data order: 29 to pack 0, 33 to the cheaper pack
# 1. The mutant counts only 33 as due and places it first.

def test_a_sample_is_due_once_it_has_waited_max_defer_windows():
    packs, carry, split = plan_wfap([_item(29, 1, arrival=1), _item(33, 1, arrival=0)],
                                    _ctx(_cfg(max_defer=2), window=3))
    assert packs == [[(29, 0, 1, 1, 29, 0)], [(33, 0, 1, 0, 33, 0)]] and carry == [] and split == []


# x_local_search__mutmut_101 (`pt[q] + dl < C`: a swap that fills the cheaper pack exactly to the
# cap refused). Cap 10, one model. Pack 0: an anchor (5 tokens, cost 4) and tail 0 (3, 6): cost
# 10, 8 tokens; pack 1: an anchor (7, 3) and tail 1 (1, 3): cost 6, 8 tokens. Moving tail 0
# does not fit (11 tokens); swapping tails 0 and 1 moves 2 tokens and 3 of cost: packs (7, 6
# tokens) and (9, 10 tokens: exactly the cap), 9 < 10, so it is made; then nothing lowers 9.

def test_local_search_swaps_into_an_exact_fit():
    from atac_hf.packing.planners.wfap_place import local_search

    L = [3, 1, 0, 5, 7]
    c = [[6.0], [3.0], [0.0], [4.0], [3.0]]
    pc, pt, tail_of, anchor_of = [[10.0], [6.0]], [8, 8], [[0], [1]], [[3], [4]]
    local_search(pc, pt, tail_of, anchor_of, L, c, 10)
    assert tail_of == [[1], [0]] and pc == [[7.0], [9.0]] and pt == [6, 10] and anchor_of == [[3], [4]]


# x_balance_models__mutmut_41 (the message names the band's high end): a price band whose low end
# is 0 under a model that prices only attention makes short documents free; the message names
# the low end.

def test_a_price_band_that_makes_short_documents_free_is_refused_naming_its_low_end():
    import pytest

    from atac_hf.cost import CostModel
    from atac_hf.packing import PackingConfig
    from atac_hf.packing.planners.window import balance_models

    cfg = PackingConfig(max_tokens=100, packs_per_window=2, reference_doc_tokens=10, price_band=(0.0, 2.0))
    with pytest.raises(ValueError) as e:
        balance_models(cfg, CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1))
    assert str(e.value) == ("price_band=(0.0, 2.0): a pack of short documents costs 0 s under the cost model "
                            "'custom' with its attention price scaled by 0 (it prices only attention): raise the "
                            "band's low end above 0 (set price_band)")


# ---------------------------------------------------------------- a fourth sample (NR % 16 == 7; wfap_end 12)
# x_fill_level__mutmut_7 (`idx.size == 1` returns 0.0): a single tail has a fill level. A
# 10-token tail costing 55 is small (<= 550 / 8), so the level is 55 / 10 x 100 x (1 + 0.05 / 2)
# = 563.75; no tail at all: 0.

def test_fill_level_of_a_single_tail():
    import numpy as np

    from atac_hf.packing.planners.wfap_place import fill_level

    lens, costs, light = np.array([10]), np.array([[55.0]]), np.array([550.0])
    assert fill_level([0], lens, costs, light, 100, 1.05) == pytest.approx(563.75, rel=1e-12)
    assert fill_level([], lens, costs, light, 100, 1.05) == 0.0


# x__select_release__mutmut_85 (`argmin(None)`: the first balanced run, not the best). Heavy samples
# 0 (70 tokens, 2485; potential 2485 + 5.5 x 30 = 2650), 1 (66, 2211; 2398), 2 (65, 2145;
# 2337.5), in that release order. The run (0, 1): 2 x 2485 / (2485 + 2398) = 1.018; the run
# (1, 2): 2211 over a mean of 2211 (2337.5 > 2211): 1.0, the best. Both are within 1.05, so (1, 2)
# is released, one anchor a pack (the costlier first), and 0 waits.

def test_the_best_balanced_run_is_released():
    items = [_item(0, 70, arrival=0), _item(1, 66, arrival=0), _item(2, 65, arrival=0)]
    packs, carry, split = plan_wfap(items, _ctx(_cfg(), window=1))
    assert [[it[0] for it in p] for p in packs] == [[1], [2]]
    assert [it[0] for it in carry] == [0] and split == []


# x_place_overdue__mutmut_94 (the cut stops with 1 token left), x_costs_of__mutmut_11 (a span
# costed `end + start`). Cap 10, cost = tokens, min_fragment 1 (the default at cap 10).

def test_place_overdue_cuts_down_to_the_last_token():
    # packs of overdue items with room 4, 4 and 1: an overdue 9-token sample is cut 4 + 4 + 1
    from test_mutants_window import _ctx as _wctx
    from test_mutants_window import _item as _witem

    from atac_hf.packing.planners.window import place_overdue

    ctx = _wctx(3, 0, 0)  # max_defer 0: a whole sample that fits may be cut (deferral off)
    x, y, z = _witem(0, 6, 0, 0), _witem(1, 6, 0, 1), _witem(2, 9, 0, 2)
    o = _witem(3, 9, 0, 3)
    packs = [[x], [y], [z]]
    rest, split = place_overdue(packs, [o], ctx)
    assert packs == [[x, (3, 0, 4, 0, 3, 1)], [y, (3, 4, 8, 0, 3, 1)], [z, (3, 8, 9, 0, 3, 1)]]
    assert rest == [] and split == [(3, 9)]


def test_place_overdue_costs_a_fragment_by_its_own_tokens():
    # pack 0 holds a fragment of tokens 6-9 (3 tokens, cost 3), pack 1 a 4-token sample: an
    # overdue 2-token item fits both and joins the cheaper, pack 0 (the mutant costs it 15)
    from test_mutants_window import _ctx as _wctx
    from test_mutants_window import _item as _witem

    from atac_hf.packing.planners.window import place_overdue

    ctx = _wctx(2, 1, 1)
    frag, y, o = (5, 6, 9, 1, 5, 1), _witem(1, 4, 1, 1), _witem(2, 2, 0, 2)
    packs = [[frag], [y]]
    rest, split = place_overdue(packs, [o], ctx)
    assert packs == [[frag, o], [y]] and rest == [] and split == []

"""Tests that kill the mutmut survivors of WFAP's end-of-stream planner (issue 20, fourth pass).

``atac_hf.packing.planners.wfap_end``: each test names the mutants it kills (mutmut 3 names,
``atac_hf.packing.planners.wfap_end.<name>``) and the hand-checked case on which the mutant
gives another answer. docs/TESTING.md lists the run and the verdicts. Expected values are
worked out by hand, never computed with the code under test.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig
from atac_hf.packing.planners import wfap_end
from atac_hf.packing.planners.wfap_end import plan_end, rest_fits_window
from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token

# cost = tokens
LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


def _ctx(cfg: PackingConfig, window: int, cm: CostModel = LINEAR) -> WindowContext:
    return WindowContext(config=cfg, cost_model=cm, window=window, final=True,
                         ref_cost_per_token=ref_cost_per_token(cfg, cm))


def _item(sid: int, length: int, arrival: int, seq: int | None = None) -> tuple:
    # (sample_id, start, end, arrival, seq, frag)
    return (sid, 0, length, arrival, sid if seq is None else seq, 0)


def _plan(items, ctx, costs=None):
    """plan_end on whole items, costs = tokens unless given: (sample ids of each pack, carried ids)."""
    lens = np.array([it[2] - it[1] for it in items], dtype=np.int64)
    c = lens.astype(float)[:, None] if costs is None else np.asarray(costs, dtype=float).reshape(len(items), -1)
    packs, carry = plan_end(items, lens, c, ctx)
    return [[it[0] for it in p] for p in packs], [it[0] for it in carry]


# ---------------------------------------------------------------- rest_fits_window
# x_rest_fits_window__mutmut_10: `max_defer <= LOOKAHEAD_MIN_DEFER` refuses the lookahead at
# max_defer == 2, the documented minimum ("with max_defer >= 2").

def test_lookahead_allowed_from_max_defer_two():
    cfg = PackingConfig(max_tokens=10, packs_per_window=2, max_defer=2)
    assert rest_fits_window(cfg, np.array([5, 5, 9]))  # 19 tokens < one window of 20
    assert not rest_fits_window(PackingConfig(max_tokens=10, packs_per_window=2, max_defer=1), np.array([5, 5, 9]))


# ---------------------------------------------------------------- deadlines
# x_plan_end__mutmut_17: the slack of an overdue item floored at 1 window instead of 0. Cap 10,
# one pack a window, max_defer 2, window 5: A (3 tokens, arrived in window 0) is overdue; B and
# D (8 tokens each) arrived now and may wait 2 windows. 19 tokens need 2 windows, but A, B, D
# fit no two packs (3 + 8 > 10), so the plan takes 3 windows: A alone in the first (it cannot
# wait), B and D later. With slack 1, A may wait one window, the costlier B's pack is preferred
# first, and A is carried out of the end plan (only the generic place_overdue would save it).

def test_end_plan_keeps_an_overdue_item_in_its_first_window():
    cfg = PackingConfig(max_tokens=10, packs_per_window=1, max_defer=2)
    packs, carry = _plan([_item(0, 3, arrival=0), _item(1, 8, arrival=5), _item(2, 8, arrival=5)], _ctx(cfg, 5))
    assert packs == [[0]]
    assert sorted(carry) == [1, 2]


# ---------------------------------------------------------------- the better of the two plans
# x_plan_end__mutmut_42 (`MODE in ("deal", "XXbestXX")`: "best" makes the windows plan only).
# Cap 10, 2 packs a window, lengths 8, 7, 4, 6, 9 (ids 0-4; cost = tokens): 34 tokens, 2
# windows. Both plans make the packs {9}, {8}, {7}, {6, 4}. The deal plan puts the two
# costliest packs together ({6, 4} and {9}: 10 + 8 = 18 over the two windows); the windows
# plan anchors 9 and 8 in the first window and 7 and 6 in the second, where 4 then goes
# (9 + 10 = 19). The end plan keeps the cheaper one: {6, 4} and {9} first.

def test_end_plan_keeps_the_deal_plan_where_it_is_cheaper():
    cfg = PackingConfig(max_tokens=10, packs_per_window=2, max_defer=5)
    items = [_item(i, L, arrival=0) for i, L in enumerate([8, 7, 4, 6, 9])]
    packs, carry = _plan(items, _ctx(cfg, 0))
    assert sorted(map(sorted, packs)) == [[2, 3], [4]]
    assert sorted(carry) == [0, 1]


# The other way round: lengths 6, 8, 6, 10, 2 (ids 0-4). The deal plan makes {10}, {8},
# {6, 2}, {6} (2 to the cheapest pack with room): 10 + 8 = 18 however dealt; the windows plan
# anchors 10 and 8 first, 6 and 6 second, and 2 joins the 8 (it evens the first window):
# 10 + 6 = 16. The end plan keeps the windows plan: {10} and {8, 2} first.

def test_end_plan_keeps_the_windows_plan_where_it_is_cheaper():
    cfg = PackingConfig(max_tokens=10, packs_per_window=2, max_defer=5)
    items = [_item(i, L, arrival=0) for i, L in enumerate([6, 8, 6, 10, 2])]
    packs, carry = _plan(items, _ctx(cfg, 0))
    assert sorted(map(sorted, packs)) == [[1, 4], [3]]
    assert sorted(carry) == [0, 2]


# x_plan_end mutants of the work limit (`n * P * m0 <= WINDOWS_WORK_LIMIT`): "best" makes the
# windows plan while items x packs x windows stay within the limit, the deal plan alone above
# it. The case above has 5 items, 2 packs, 2 windows: 20.

def test_windows_plan_made_up_to_the_work_limit_and_not_beyond(monkeypatch):
    cfg = PackingConfig(max_tokens=10, packs_per_window=2, max_defer=5)
    items = [_item(i, L, arrival=0) for i, L in enumerate([6, 8, 6, 10, 2])]
    monkeypatch.setattr(wfap_end, "WINDOWS_WORK_LIMIT", 20)
    assert sorted(map(sorted, _plan(items, _ctx(cfg, 0))[0])) == [[1, 4], [3]]  # the windows plan
    monkeypatch.setattr(wfap_end, "WINDOWS_WORK_LIMIT", 19)
    assert sorted(map(sorted, _plan(items, _ctx(cfg, 0))[0])) == [[1], [3]]  # the deal plan


# x__by_deadline__mutmut_9: the early items ordered by deadline with numpy's default
# (unstable) sort: among items of the same deadline the largest no longer goes first. Cap 10,
# one pack a window, max_defer 2, window 3: lengths 10, 9, 7, 8, 6 arrived in windows 2, 3, 1,
# 0, 0: the 7, 8 and 6 cannot wait (the 8 and the 6 are overdue, the 7 is due now), the 10
# may wait one window, the 9 two. The first window's one pack takes one of the three due
# items: the largest, the 8 (the others are left to the generic overdue placement). (The
# mutant is told apart where numpy's sort reorders ties, as its SIMD sort does for these keys.)

def test_end_plan_places_the_largest_due_item_first():
    cfg = PackingConfig(max_tokens=10, packs_per_window=1, max_defer=2)
    arrivals = [2, 3, 1, 0, 0]
    items = [_item(i, L, arrival=a) for i, (L, a) in enumerate(zip([10, 9, 7, 8, 6], arrivals))]
    packs, carry = _plan(items, _ctx(cfg, 3))
    assert packs == [[3]]
    assert sorted(carry) == [0, 1, 2, 4]


# ---------------------------------------------------------------- the windows plan by hand
# _plan_windows(order, lens, costs, slack, P, cap) -> (items of each pack, packs of each window)

def _windows(lens, slack, P, C, costs=None):
    lens = np.asarray(lens, dtype=np.int64)
    c = lens.astype(float)[:, None] if costs is None else np.asarray(costs, dtype=float)
    order = np.lexsort((np.arange(lens.size), -c.max(axis=1)))
    return wfap_end._plan_windows(order, lens, c, np.asarray(slack, dtype=np.int64), P, C)


# x__plan_windows__mutmut_31 (`pc[j] -= costs[i]`): an early item goes to the cheapest pack
# with room of the windows it may wait for. Cap 12, 2 packs a window: 9 and 3 are due now
# (slack 0), 12 and 3 may wait. 27 tokens: 2 windows. The 9 takes pack 0, the due 3 the empty
# pack 1 (cheaper than the 9's); 12 and the other 3 anchor the second window's packs. With
# the costs subtracted, the 9's pack looks cheapest and the due 3 joins it.

def test_windows_plan_puts_an_early_item_in_the_cheapest_pack_it_may_use():
    members, wins = _windows([9, 12, 3, 3], [0, 2, 2, 0], P=2, C=12)
    assert members == [[0], [3], [1], [2]]
    assert wins == [[0, 1], [2, 3]]


# x__plan_windows__mutmut_43 (`pt - lens <= C`: room by the wrong sign): the early items
# keep the cap. Cap 10, one pack a window, 8 and 7 both overdue: only one fits the first
# window; the other is left over (after 2 extra windows are tried), never put over the cap.

def test_windows_plan_keeps_the_cap_for_early_items():
    members, wins = _windows([8, 7], [0, 0], P=1, C=10)
    assert members[0] == [0] and all(1 not in m for m in members)
    assert len(wins) == 4  # the token minimum (2) and both extra windows tried


# x__plan_windows__mutmut_47 (`< C`): an early item that fills a pack exactly is placed. Cap
# 10, one pack a window: 6 and 4 are overdue, 10 may wait: 2 windows, 6 + 4 in the first.

def test_windows_plan_fills_a_pack_exactly_with_early_items():
    members, wins = _windows([6, 4, 10], [0, 0, 5], P=1, C=10)
    assert members == [[0, 1], [2]] and wins == [[0], [1]]


# x__plan_windows__mutmut_51 (`left -= 1` for an early item without room): the plan takes
# more windows while any item is left over. Cap 10, one pack a window: 8 and 7 overdue, four
# 6s may wait; 39 tokens: 4 windows, where the 7 finds no room (only the first window's pack
# may take it) and the fourth 6 none either (three empty packs, no two 6s together): 5, then 6
# windows are tried; from 5 on every 6 has a pack (the 7 never fits the first window). The
# mutant's count (-1 + 1) reads 0 at 4 windows and leaves a 6 out.

def test_windows_plan_tries_more_windows_while_items_are_left():
    members, wins = _windows([8, 7, 6, 6, 6, 6], [0, 0, 5, 5, 5, 5], P=1, C=10)
    assert len(wins) == 6
    assert members[0] == [0] and sorted(i for m in members for i in m) == [0, 2, 3, 4, 5]


# The items after the anchors go where they raise their window's max/mean cost the least.
# x__plan_windows__mutmut_115 (the new max as `pc - ci`): cap 10, 2 packs, lengths 9, 6, 1
# (cost = tokens): one window, 9 and 6 anchor it (max/mean 9 / 7.5 = 1.2); 1 on the 9 gives
# 10 / 8 = 1.25, on the 6 gives 9 / 8 = 1.125: it joins the 6.

def test_windows_plan_puts_an_item_where_it_raises_the_max_over_mean_least():
    members, wins = _windows([9, 6, 1], [9, 9, 9], P=2, C=10)
    assert members == [[0], [1, 2]] and wins == [[0, 1]]


# x__plan_windows__mutmut_107 (the old max/mean over `wsum * P`): the change is compared across
# windows. Cap 10, 2 packs a window, lengths 1, 7, 2, 7, 9 (ids 0-4): 26 tokens, 2 windows;
# 9 and 7 anchor the first (9 / 8 = 1.125), 7 and 2 the second (7 / 4.5 = 1.556). The 1:
# on the 9: 10 / 8.5 = 1.176 (+0.051); on the 7: 9 / 8.5 = 1.059 (-0.066); on the second
# window's 7: 8 / 5 = 1.6 (+0.044); on its 2: 7 / 5 = 1.4 (-0.156): it joins the 2.

def test_windows_plan_compares_the_change_of_max_over_mean_across_windows():
    members, wins = _windows([1, 7, 2, 7, 9], [9] * 5, P=2, C=10)
    assert members == [[4], [1], [3], [2, 0]] and wins == [[0, 1], [2, 3]]


# x__plan_windows__mutmut_127 (the mean floored at 1.0 instead of a guard against 0): the plan
# does not depend on the unit of the costs. Cap 10, one pack a window, lengths 8, 4, 1: at one
# pack a window every window's max/mean is 1, so the 1 goes to the first pack with room (the
# 8's); in units 1000 times larger (costs < 1) the same.

def test_windows_plan_does_not_depend_on_the_cost_unit():
    lens = np.array([8, 4, 1])
    for scale in (1.0, 1e-3):
        members, wins = _windows(lens, [9, 9, 9], P=1, C=10, costs=lens[:, None] * scale)
        assert members == [[0, 2], [1]] and wins == [[0], [1]]


# x__plan_windows__mutmut_151 (a window's max cost not updated after an item joins it). Cap 10,
# one pack a window, lengths 5, 1, 1, 7 (ids 0-3), slack 3, 0, 2, 3: 14 tokens, 2 windows; the
# due 1 (id 1) takes the first window's pack, 7 anchors the second; 5 fits only the first
# (6 tokens). The last 1: at one pack a window every window's max/mean stays 1, so it goes to
# the first pack with room, the first window's. With the first window's max left at 1 (its
# old max/mean 1/6), the mutant sees the first window worsen and puts the 1 in the second.

def test_windows_plan_keeps_each_windows_max_up_to_date():
    members, wins = _windows([5, 1, 1, 7], [3, 0, 2, 3], P=1, C=10)
    assert members == [[1, 0, 2], [3]] and wins == [[0], [1]]


# x__plan_deal__mutmut_160 (`min(plans, key=None)`: the deal chosen by list order, not by step
# time). Cap 10, 2 packs a window, lengths 9, 3, 10, 7, 9 (ids 0-4): the deal makes {10}, {9},
# {9}, {7, 3}; by rank the two 10s share the first window (10 + 9 = 19), round-robin by rank
# pairs each 10 with a 9 (10 + 10 = 20); the windows plan also gives 20. The end plan's first
# window: {10} and {7, 3}.

def test_deal_plan_puts_the_costliest_packs_together_where_that_is_cheaper():
    cfg = PackingConfig(max_tokens=10, packs_per_window=2, max_defer=5)
    items = [_item(i, L, arrival=0) for i, L in enumerate([9, 3, 10, 7, 9])]
    packs, carry = _plan(items, _ctx(cfg, 0))
    assert sorted(map(sorted, packs)) == [[1, 3], [2]]
    assert sorted(carry) == [0, 4]


# x__plan_windows__mutmut_53 (`break` for `continue` when an early item finds no room): the
# early items after one that finds no room are still placed. Cap 10, one pack a window, 8, 7
# and 2 all overdue: 8 takes the first window's pack, 7 does not fit, 2 fills it to 10.

def test_windows_plan_places_the_early_items_after_one_without_room():
    members, wins = _windows([8, 7, 2], [0, 0, 0], P=1, C=10)
    assert members[0] == [0, 2] and all(1 not in m for m in members)


# x__plan_windows__mutmut_93 (`< C`): an item after the anchors that fills a pack exactly is
# placed there. Cap 10, one pack a window, 6, 4, 5 (none due): 2 windows, 6 and 5 anchor them;
# the 4 fits both, and at one pack a window it goes to the first with room: 6 + 4 = 10.

def test_windows_plan_fills_a_pack_exactly_after_the_anchors():
    members, wins = _windows([6, 4, 5], [9, 9, 9], P=1, C=10)
    assert members == [[0, 1], [2]] and wins == [[0], [1]]


# x__plan_windows__mutmut_117 (the new mean as `(wsum + ci) * P`): the change of max/mean is
# compared across windows in the same units. Cap 10, 2 packs a window, lengths 10, 4, 8, 2, 4
# (ids 0-4), slack 2, 0, 2, 2, 3: 28 tokens, 2 windows; the due 4 (id 1) takes pack 0, then
# 10, 8 and the other 4 anchor packs 1-3: windows {4}, {10} (10 / 7 = 1.429) and {8}, {4}
# (8 / 6 = 1.333). The 2: on the first window's 4: 10 / 8 = 1.25 (-0.179); on the 8: 10 / 7
# (+0.095); on the second window's 4: 8 / 7 = 1.143 (-0.190): it joins the second window's 4.

def test_windows_plan_compares_the_change_of_max_over_mean_in_the_same_units():
    members, wins = _windows([10, 4, 8, 2, 4], [2, 0, 2, 2, 3], P=2, C=10)
    assert members == [[1], [0], [2], [4, 3]] and wins == [[0, 1], [2, 3]]

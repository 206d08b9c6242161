"""Eighteenth mutation pass (2 of 2): tests that kill the survivors of mutmut over
packing/planners/wfap_end.py's _plan_windows, _plan_deal and _assign

Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.wfap_end.<name>``)
and the hand-checked case on which the mutant gives another answer. The private functions are
called directly, with the arguments ``plan_end`` passes: ``order`` the items largest score first,
``lens`` (n,) tokens, ``costs`` (n, K) costs (K = 1 here), ``slack`` the windows each item may
still wait (9: never due before the plan's last window), ``P`` packs per window, ``C`` the cap in
tokens, ``mult`` the pack multiple (None: whole windows). A plan is ``(items of each pack, packs
of each window)``.
"""

from __future__ import annotations

import numpy as np

from atac_hf.packing.planners.wfap_end import _assign, _plan_deal, _plan_windows

NEVER_DUE = 9


def _slack(n: int) -> np.ndarray:
    return np.full(n, NEVER_DUE, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# _plan_windows


# x__plan_windows__mutmut_109 (`break` for `continue`): an item with no room anywhere is left over,
# and the items after it are still placed. P = 1, cap 10, mult 1, lengths 1, 1, 1, 1, 10, 1 (costs
# 6..1, so in that order): 15 tokens, m0 = 2 windows, top 4 packs. At 2 and 3 packs the 10-token
# item finds no pack with room (every pack holds an anchor); at the top count (4 packs, items 0-3
# anchor them) it is still left, and item 5 joins pack 0 (with P = 1 every window's max/mean stays
# 1, so the first pack with room). With `break` item 5 is dropped as well.

def test_plan_windows_places_the_items_after_one_without_room():
    lens = np.array([1, 1, 1, 1, 10, 1])
    costs = np.array([[6.0], [5.0], [4.0], [3.0], [2.0], [1.0]])
    members, wins = _plan_windows(np.arange(6), lens, costs, _slack(6), 1, 10, 1)
    assert members == [[0, 5], [1], [2], [3]]
    assert wins == [[0], [1], [2], [3]]


# x__plan_windows__mutmut_119 (a window's current max/mean taken over a mean of at least 1.0 instead
# of 1e-300): the plan must not depend on the unit of the costs. P = 2, cap 10, lengths 6, 6, 6, 6,
# 1: 25 tokens, 2 windows of 2 packs; items 0-3 (costs .4, .3 | .3, .1) anchor packs 0-3. Item 4
# (cost .1) raises window 0's max/mean 1.143 to 1.25 (pack 0) or lowers it to 1.0 (pack 1); window
# 1's 1.5 to 1.6 (pack 2) or 1.2 (pack 3): the least is pack 3 (-0.3). With means under 1 clamped
# to 1 the "old" ratio becomes the window's max (.4, .3) and pack 1 wins (1.0 - .4); with the
# costs x 16 (means over 1) the mutant agrees again, so the clean answer is also the scaled one.

def test_plan_windows_choice_does_not_depend_on_the_cost_unit():
    lens = np.array([6, 6, 6, 6, 1])
    costs = np.array([[0.4], [0.3], [0.3], [0.1], [0.1]])
    expected = ([[0], [1], [2], [3, 4]], [[0, 1], [2, 3]])
    assert _plan_windows(np.arange(5), lens, costs, _slack(5), 2, 10) == expected
    assert _plan_windows(np.arange(5), lens, costs * 16, _slack(5), 2, 10) == expected


# x__plan_windows__mutmut_155 (`wsum[w] = ci`: a window's cost sum replaced by the last item's): the
# sums kept up to date must add up. P = 2, cap 10, lengths 6, 6, 6, 6, 1, 3, costs 8, 6 | 5, 4, 2,
# 1: items 0-3 anchor packs 0-3 (window 0: 8, 6; window 1: 5, 4). Item 4 (2) goes to pack 1 (8, 8:
# max/mean 1.143 -> 1.0, the least rise of -0.143 against pack 3's -0.020). Item 5 (1): window 0
# is at 1.0 (+0.059 for either pack), pack 2 gives 1.2 (+0.089), pack 3 5, 5 (1.111 -> 1.0, -0.111):
# pack 3, both windows balanced (8, 8 and 5, 5). With window 0's sum taken as 2 its ratio looks like
# 8 / 1 = 8 and a pack of window 0 "drops" it to 6: item 5 goes to pack 0 (9, 8 and 5, 4).

def test_plan_windows_keeps_each_windows_cost_sum():
    lens = np.array([6, 6, 6, 6, 1, 3])
    costs = np.array([[8.0], [6.0], [5.0], [4.0], [2.0], [1.0]])
    members, wins = _plan_windows(np.arange(6), lens, costs, _slack(6), 2, 10)
    assert members == [[0], [1, 4], [2], [3, 5]]
    assert wins == [[0, 1], [2, 3]]


# ---------------------------------------------------------------------------------------------
# _plan_deal


# x__plan_deal__mutmut_30 (packs start at cost 1.0 instead of 0.0): the plan must not depend on the
# unit of the costs. P = 2, cap 10, two items of 2 tokens costing 2 and 1 units: one pack each (the
# second item goes to the empty, cheaper pack). With the costs x 2**-70 (exact in floating point)
# the clean plan is the same; packs starting at 1.0 make 1.0 + 2**-69 == 1.0 == 1.0 + 0, a tie,
# and the second item joins the first (pack 0).

def test_plan_deal_does_not_depend_on_the_cost_unit():
    lens = np.array([2, 2])
    costs = np.array([[2.0], [1.0]])
    for scale in (1.0, 2.0 ** -70):
        members, wins = _plan_deal(np.arange(2), lens, costs * scale, _slack(2), 2, 10, False)
        assert members == [[0], [1]]
        assert wins == [[0, 1]]


# x__plan_deal__mutmut_58 (`left = place_tails(group ...)`: the items of an earlier deadline group
# left over are forgotten) and x__plan_deal__mutmut_84 (`left = place_tails(rest ...)`: those of
# every deadline group forgotten): an item left over makes the planner try more packs, up to the
# top count. P = 1, cap 10, lengths 8, 8, 4, 3 (costs 4, 3, 2, 1), slack 0, 0, 1, never: 23 tokens,
# m0 = 3 windows, top 5 packs. Items 0 and 1 may only go to window 0's pack: item 0 takes it, item 1
# is left; item 2 (due by window 1) takes pack 1; item 3 the empty pack 2. Item 1 never fits (window
# 0 is one pack at any count), so the counts go 3 -> 4 -> 5 and the plan has 5 packs, 2 empty. With
# item 1's leftover forgotten (by item 2's group, or by the rest) the plan stops at 3 packs.

def test_plan_deal_tries_more_packs_while_a_due_item_is_left_over():
    lens = np.array([8, 8, 4, 3])
    costs = np.array([[4.0], [3.0], [2.0], [1.0]])
    slack = np.array([0, 0, 1, NEVER_DUE])
    members, wins = _plan_deal(np.arange(4), lens, costs, slack, 1, 10, False)
    assert members == [[0], [2], [3], [], []]
    assert wins == [[0], [1], [2], [3], [4]]


# The next case: P = 1, cap 8, items (tokens, cost) 0: (3, 80), 1: (3, 14), 2: (3, 109), 3: (2, 82),
# 4: (1, 87), 5: (1, 47); 11 tokens: 2 packs (2 windows). Largest first (2, 4, 3, 0, 5, 1) to the
# cheapest pack with room: pack 0 {2, 0} 189 / 6 tokens, pack 1 {4, 3, 5, 1} 230 / 7 (item 1, 3
# tokens, fits pack 1 only). Local search, a window's budget of 2 x P = 2 steps: swap 3 <-> 0 (228 |
# 191), move 1 to pack 0 (214 | 205). A third step would swap 4 <-> 3 (209 | 210).
_LS_ORDER = np.array([2, 4, 3, 0, 5, 1])
_LS_LENS = np.array([3, 3, 3, 2, 1, 1])
_LS_COSTS = np.array([[80.0], [14.0], [109.0], [82.0], [87.0], [47.0]])


# x__plan_deal__mutmut_115 (`search or Q > 1`): without local search the greedy packs stay.

def test_plan_deal_without_local_search_keeps_the_greedy_packs():
    members, wins = _plan_deal(_LS_ORDER, _LS_LENS, _LS_COSTS, _slack(6), 1, 8, False)
    assert members == [[2, 0], [4, 3, 5, 1]]
    assert wins == [[1], [0]]  # the costlier pack first (rank order)


# x__plan_deal__mutmut_117 (`Q > 2`: no local search over 2 packs), x__plan_deal__mutmut_125 and
# x__plan_deal__mutmut_133 (`max_steps=None`: local search's default of 2 x Q steps, 4 here) and
# x__plan_deal__mutmut_135 (`3 * P` steps): local search over the plan's packs runs two steps (a
# window's budget, 2 x P) and stops there: packs {2, 3, 1} 205 and {4, 5, 0} 214.

def test_plan_deal_local_search_runs_a_windows_budget_of_steps():
    members, wins = _plan_deal(_LS_ORDER, _LS_LENS, _LS_COSTS, _slack(6), 1, 8, True)
    assert members == [[2, 3, 1], [4, 5, 0]]
    assert [float(_LS_COSTS[m].sum()) for m in members] == [205.0, 214.0]
    assert wins == [[1], [0]]


# ---------------------------------------------------------------------------------------------
# _assign


# x__assign__mutmut_12 (`need = 1`: every window takes its earliest-deadline pack first): a due pack
# goes early only when it must. P = 1, 3 windows, preferred order 0, 1, 2, deadlines 2, 2, 1 (pack 2
# due by window 1). Window 0: pack 2 can still wait (window 1 is left for it), so the preferred pack
# 0; window 1: pack 2 must go now; window 2: pack 1. The mutant puts pack 2 in window 0.

def test_assign_takes_a_due_pack_only_when_it_cannot_wait():
    assert _assign([0, 1, 2], [2, 2, 1], 1, 3, 1) == [[0], [2], [1]]


# x__assign__mutmut_36 (`w < m - 2`: the window before the last is also cut to ``last`` packs): only
# the last window is short. P = 3, 2 windows, last 2: packs 0-4 (no deadlines) -> [0, 1, 2], [3, 4].
# The mutant cuts window 0 to 2 packs ([0, 1], [2, 3]) and pack 4 is in no window.

def test_assign_only_the_last_window_is_short():
    assert _assign([0, 1, 2, 3, 4], [1] * 5, 3, 2, 2) == [[0, 1, 2], [3, 4]]

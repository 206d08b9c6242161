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

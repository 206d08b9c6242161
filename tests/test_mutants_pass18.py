"""Eighteenth mutation pass: tests that kill the survivors of mutmut over packing/planners/wfap_end.py

Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.wfap_end.<name>``)
and the hand-checked case on which the mutant gives another answer. Conventions: a cost model of
1 s a token (``cost = tokens`` unless a test gives the costs); items are whole samples ``(sid, 0,
length, arrival, seq=sid, 0)``; ``plan_end`` is called directly with the lengths and the (n, K)
costs, as ``wfap`` passes them, and gives ``(sample ids of each pack of this window, carried
ids)``. The private helpers (``_Counts``, ``_bins``, ``_worst_ratio``) are called directly where
that is the clearest way to check them. (The survivors of ``_plan_windows``, ``_plan_deal`` and
``_assign`` are in test_mutants_pass18_deal.py.)
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig
from atac_hf.packing.planners import wfap_end
from atac_hf.packing.planners.wfap_end import _bins, _Counts, _worst_ratio, plan_end, rest_fits_window
from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


def _ctx(cfg: PackingConfig, window: int = 0, pack_multiple: int = 1) -> WindowContext:
    return WindowContext(config=cfg, cost_model=LINEAR, window=window, final=True,
                         ref_cost_per_token=ref_cost_per_token(cfg, LINEAR), pack_multiple=pack_multiple)


def _item(sid: int, length: int, arrival: int = 0) -> tuple:
    return (sid, 0, length, arrival, sid, 0)


def _plan(lengths, ctx, costs=None, arrivals=None):
    """plan_end over whole items of these lengths (arrival 0 unless given)."""
    arrivals = [0] * len(lengths) if arrivals is None else arrivals
    items = [_item(i, L, a) for i, (L, a) in enumerate(zip(lengths, arrivals))]
    lens = np.array(lengths, dtype=np.int64)
    c = lens.astype(float)[:, None] if costs is None else np.asarray(costs, dtype=float).reshape(len(items), -1)
    packs, carry = plan_end(items, lens, c, ctx)
    return [[it[0] for it in p] for p in packs], [it[0] for it in carry]


# ---------------------------------------------------------------------------------------------
# rest_fits_window


# x_rest_fits_window__mutmut_14 (`... if (config.overlength == "truncate") or True`: every sample
# counted at most max_tokens): only "truncate" cuts a sample to the cap; under "split" (the
# default) a sample of 25 tokens brings 25 tokens. Cap 10, 2 packs: a window holds 20 tokens, so a
# rest of one 25-token sample does not fit it under "split", and fits (10 tokens) under "truncate".

def test_rest_fits_window_counts_overlength_samples_whole_unless_truncated():
    assert not rest_fits_window(PackingConfig(max_tokens=10, packs_per_window=2), np.array([25]))
    assert rest_fits_window(PackingConfig(max_tokens=10, packs_per_window=2, overlength="truncate"), np.array([25]))


# x_rest_fits_window__mutmut_29 (`total = ...`: each block of 4096 samples counted on its own):
# the sum runs over the blocks. 8192 samples of 1 token are 8192 tokens, more than a window of
# 5000 (one pack of 5000 tokens), although each block of 4096 is less; 4999 samples still fit.

def test_rest_fits_window_sums_over_the_blocks():
    cfg = PackingConfig(max_tokens=5000, packs_per_window=1)
    assert not rest_fits_window(cfg, np.ones(8192, dtype=np.int64))
    assert rest_fits_window(cfg, np.ones(4999, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# _Counts and _bins


# xǁ_Countsǁ__init____mutmut_34 (`max(2, ceil(tokens / C))`: at least 2 packs): a pool that fits
# one pack gets one pack. Lengths 3 and 4, cap 10, 4 packs a window: 7 tokens, ceil(7 / 10) = 1
# pack (fewer than the window's 4). The end plan puts both in it, the longer first ([[1, 0]]; the
# whole window of 4 packs, 4 / (7 / 4) = 2.29 max/mean, is no better than the one pack's 1); the
# mutant makes 2 packs ([[1], [0]]).

def test_a_pool_that_fits_one_pack_gets_one_pack():
    assert _Counts(np.array([3, 4]), 4, 10, 1).first == 1
    assert _plan([3, 4], _ctx(PackingConfig(max_tokens=10, packs_per_window=4))) == ([[1, 0]], [])


# xǁ_Countsǁ__init____mutmut_38 (`self.tries = 1`), xǁ_Countsǁnext__mutmut_1 (`tries = 1`),
# xǁ_Countsǁnext__mutmut_2 (`tries -= 1`), xǁ_Countsǁnext__mutmut_3 (`tries += 2`),
# xǁ_Countsǁnext__mutmut_22 (`(... or ...) and False`), xǁ_Countsǁnext__mutmut_24 (`nxt >= top and
# tries >= MAX_COUNT_TRIES`) and xǁ_Countsǁnext__mutmut_26 (`tries > MAX_COUNT_TRIES`): the counts
# tried, fewest first, are at most MAX_COUNT_TRIES = 8 before the largest one, which is never
# passed. 25 tokens, cap 10, 10 packs a window, multiple 1: m0 = ceil(25 / 100) = 1 window, so the
# top is (1 + 2) x 10 = 30 packs; the first count is ceil(25 / 10) = 3. Where one item of 1 token
# is left each time (one more pack), the counts are 3, 4, ..., 10 (8 counts), then the top 30,
# then None. And left items that fill 40 packs on their own take the count to the top, not 43.

def test_counts_tried_are_at_most_eight_before_the_top_and_never_beyond_it():
    c = _Counts(np.array([5, 5, 5, 5, 5]), 10, 10, 1)
    seen = [c.first]
    while (nxt := c.next(seen[-1], [1])) is not None:
        seen.append(nxt)
        assert len(seen) < 40
    assert seen == [3, 4, 5, 6, 7, 8, 9, 10, 30]
    c = _Counts(np.array([5, 5, 5, 5, 5]), 10, 10, 1)
    assert c.next(3, [10] * 40) == 30


# x__bins__mutmut_20 (`room[j] = x`) and x__bins__mutmut_21 (`room[j] += x`): first fit
# decreasing of 6, 3, 3 into packs of 10: the 6 opens a pack (4 left), the first 3 joins it (1
# left), the second 3 opens a second pack: 2 packs. (The mutants leave 3 or 7 tokens of room after
# the first 3, so the second 3 joins too: 1 pack.)

def test_bins_is_first_fit_decreasing():
    assert _bins([3, 6, 3], 10) == 2
    assert _bins([5, 5, 5], 10) == 2


# ---------------------------------------------------------------------------------------------
# plan_end


# x_plan_end__mutmut_51 (the deal plan made with `search=None`: no local search over its packs).
# One pack a window (so the window's own local search does not run), cap 10, lengths = costs 3, 3,
# 2, 2, 2 (ids 0-4): 12 tokens, 2 windows of one pack. The deal plan places largest first into
# the cheapest pack: {0, 2, 4} = 7 and {1, 3} = 5; its local search swaps 0 (3) and 3 (2): {2, 4,
# 3} = 6 and {1, 0} = 6. The windows plan gives {0, 2, 3, 4} = 9 and {1} = 3; all cost 12 over the
# two windows, so the deal plan (the first) is kept and its first pack (the equal scores keep pack
# order) is emitted: [2, 4, 3]. Without the search: [0, 2, 4].

def test_end_plan_deal_plan_runs_its_local_search():
    cfg = PackingConfig(max_tokens=10, packs_per_window=1)
    assert _plan([3, 3, 2, 2, 2], _ctx(cfg)) == ([[2, 4, 3]], [0, 1])


# x_plan_end__mutmut_73 (the work limit checked with the whole-window count `_Counts(..., None)`
# instead of the plan's own first count): "best" makes the windows plan where items x the plan's
# first pack count is within WINDOWS_WORK_LIMIT. Cap 10, 2 packs a window, lengths 10, 8, 2, 6
# (ids 0-3), costs = tokens squared (100, 64, 4, 36): 26 tokens, first count ceil(26 / 10) = 3
# (whole windows: 4), so 4 x 3 = 12 is the work, at the limit of 12. The deal plan of 3 packs:
# {0} 100, {1} 64, {3, 2} 40, dealt by rank {0}, {1} | {3, 2}: 100 + 40 = 140. The windows plan
# anchors 0 and 1 in the first window and 3 in the second (1 pack); 2 joins 1 (it evens the first
# window): {0}, {1, 2} | {3}: 100 + 36 = 136, kept (its max/mean 100 / 84 = 1.19 against whole
# windows' 36 / 20 = 1.8). With the mutant (4 x 4 = 16 > 12) only the deal plan is made: [[0], [1]].

def test_windows_plan_work_limit_uses_the_plans_own_first_count(monkeypatch):
    monkeypatch.setattr(wfap_end, "WINDOWS_WORK_LIMIT", 12)
    cfg = PackingConfig(max_tokens=10, packs_per_window=2)
    assert _plan([10, 8, 2, 6], _ctx(cfg), costs=[100, 64, 4, 36]) == ([[0], [1, 2]], [3])


# x_plan_end__mutmut_113 (`SHORT_LAST_WINDOW or ...`) and x_plan_end__mutmut_114 (`len(wins[-1])
# <= P`): whole windows are compared only with a plan whose last window is short. Cap 12, 2 packs a
# window, pack_multiple 3, no local search, lengths = costs 7, 7, 8, 2, 6 (ids 0-4): 30 tokens.
# 3 packs (ceil(30 / 12)) leave the 6 over (8, 7 + 2, 7), so the count goes to 6 (a multiple of
# 3): 3 full windows, {2} 8, {0} 7 | {1} 7, {4} 6 | {3} 2, {} (the deal plan; the windows plan is
# the same, 8 + 7 + 2 = 17). Its last window is full, so it is kept and {2}, {0} are emitted. The
# mutants also make whole windows (4 packs: {2}, {4, 3} | {0}, {1}, max/mean 1 against the plan's
# 2 / 1 = 2 in its last window) and keep those: [[2], [4, 3]].

def test_end_plan_with_a_full_last_window_is_not_compared_with_whole_windows():
    cfg = PackingConfig(max_tokens=12, packs_per_window=2, local_search=False)
    assert _plan([7, 7, 8, 2, 6], _ctx(cfg, pack_multiple=3)) == ([[2], [0]], [1, 3, 4])


# x_plan_end__mutmut_120 (`>=`): whole windows replace the short last window only where its
# max/mean is *above* balance_tolerance x theirs. Cap 10, 3 packs a window, three items of 5 tokens
# costing 1 each, balance_tolerance 4/3: 15 tokens make 2 packs, {0, 2} 2 and {1} 1: max/mean 2 /
# 1.5 = 4/3; whole windows (3 packs of one item) have max/mean 1, and 4/3 is not above 4/3 x 1
# (the same double), so the 2 packs are kept; the mutant keeps the 3.

def test_short_last_window_kept_at_exactly_the_balance_tolerance():
    cfg = PackingConfig(max_tokens=10, packs_per_window=3, balance_tolerance=4 / 3)
    assert _plan([5, 5, 5], _ctx(cfg), costs=[1, 1, 1]) == ([[0, 2], [1]], [])


# x_plan_end__mutmut_130 (`local_search or P > 1`): without local_search the emitted window is not
# searched either. Cap 10, 2 packs, lengths = costs 3, 3, 2, 2, 2: both plans give {0, 2, 4} = 7
# and {1, 3} = 5 (largest first to the cheapest pack); a local search would swap 0 and 3 (6 and 6).

def test_end_plan_without_local_search_emits_the_plan_as_made():
    cfg = PackingConfig(max_tokens=10, packs_per_window=2, local_search=False)
    assert _plan([3, 3, 2, 2, 2], _ctx(cfg)) == ([[0, 2, 4], [1, 3]], [])
    searched = _plan([3, 3, 2, 2, 2], _ctx(PackingConfig(max_tokens=10, packs_per_window=2)))
    assert sorted(map(sorted, searched[0])) == [[0, 1], [2, 3, 4]]


# x_plan_end__mutmut_160 (`max_steps=3 * P`): the emitted window's local search takes at most
# 2 x packs_per_window steps. Cap 100, 2 packs a window, max_defer 1, window 1: twelve items of 2
# tokens arrived in window 0 (ids 3-14, overdue: they go in this window, 6 in each pack, 12
# tokens), two of 100 and one of 40 (ids 0-2) arrived now. 264 tokens: 4 packs, 2 windows; the 100s
# take the second window's packs, the 40 joins the first pack (52 against 12). The plan's own
# search cannot move the overdue items (anchors); the window's search can: each step moves one
# 2-token item from the 52 pack to the 12 one, 4 steps (52 -> 44, 12 -> 20) where 7 would go on
# to 40 and 24. The first pack keeps its last two small items (11, 13) and the 40; the mutant
# moves them too (6 steps).

def test_end_window_local_search_takes_at_most_two_steps_a_pack():
    cfg = PackingConfig(max_tokens=100, packs_per_window=2, max_defer=1)
    lengths = [100, 100, 40] + [2] * 12
    arrivals = [1, 1, 1] + [0] * 12
    packs, carry = _plan(lengths, _ctx(cfg, window=1), arrivals=arrivals)
    assert packs == [[11, 13, 2], [4, 6, 8, 10, 12, 14, 3, 5, 7, 9]]
    assert carry == [0, 1]


# x_plan_end__mutmut_150 (`max_steps=None`) and x_plan_end__mutmut_158 (max_steps left out): the
# emitted window's local search gets 2 x packs_per_window steps (a window's budget) even where
# the end plan's short last window has fewer packs (local_search's own default would be 2 x its
# packs). Cap 10, 3 packs a window, lengths 3 and 4: one pack is emitted, searched with a budget
# of 6 steps. (The budget shows in the packs only on larger pools, e.g. 11 items in a 3-pack
# window of 6, with two balance models.)

def test_end_window_local_search_budget_is_a_whole_windows(monkeypatch):
    calls = []
    real = wfap_end.local_search

    def spy(pc, pt, tail_of, anchor_of, L, c, C, max_steps=None):
        calls.append((len(pc), max_steps))
        return real(pc, pt, tail_of, anchor_of, L, c, C, max_steps=max_steps)

    monkeypatch.setattr(wfap_end, "local_search", spy)
    assert _plan([3, 4], _ctx(PackingConfig(max_tokens=10, packs_per_window=3))) == ([[1, 0]], [])
    assert calls[-1] == (1, 6)


# ---------------------------------------------------------------------------------------------
# _worst_ratio


# x__worst_ratio__mutmut_8 (`reshape(-1, )`: the (packs, K) costs flattened),
# x__worst_ratio__mutmut_20 (`max(axis=None)`: the max over both models) and
# x__worst_ratio__mutmut_26 (`mean(axis=None)`: the mean over both models): with two balance
# models (price_band) the worst max/mean is taken per model. One window of two packs costing 4 and
# 4 under the first model, 1 and 3 under the second: max/mean 4 / 4 = 1 and 3 / 2 = 1.5, worst 1.5
# (the mutants: 4 / 2.5 = 1.6, 4 / 2 = 2, 3 / 3 = 1.33).

def test_worst_ratio_is_taken_per_balance_model():
    costs = np.array([[4.0, 1.0], [4.0, 3.0]])
    assert _worst_ratio(([[0], [1]], [[0, 1]]), costs) == 1.5

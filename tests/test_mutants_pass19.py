"""Nineteenth mutation pass (1 of 2): tests that kill the survivors of mutmut over packing/planners/wfap.py

Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.wfap.<name>``)
and the hand-checked case on which the mutant gives another answer. Conventions (as in
test_mutants_wfap.py): a cost of causal pairs only, L (L + 1) / 2, cap 100, 2 packs a window and
reference documents of 10 tokens: a light pack (100 tokens of 10-token documents) costs
10 x 55 = 550, so a sample is heavy from 34 tokens on (34 x 35 / 2 = 595 > 1.05 x 550). Items
are whole samples ``(sid, 0, length, arrival, seq=sid, 0)``. The private helper ``_split_light``
is called directly where that is the clearest way to check it. (The survivors of ``_place`` and
the rest of ``plan_wfap`` are in test_mutants_pass19_place.py.)
"""

from __future__ import annotations

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig
from atac_hf.packing.planners.wfap import _split_light, plan_wfap, wfap_held
from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token

PAIRS = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1)


def _cfg(**kw) -> PackingConfig:
    kw.setdefault("max_tokens", 100)
    kw.setdefault("packs_per_window", 2)
    return PackingConfig(reference_doc_tokens=10, **kw)


def _ctx(cfg: PackingConfig, window: int, final: bool = False) -> WindowContext:
    return WindowContext(config=cfg, cost_model=PAIRS, window=window, final=final,
                         ref_cost_per_token=ref_cost_per_token(cfg, PAIRS))


def _item(sid: int, length: int, arrival: int) -> tuple:
    return (sid, 0, length, arrival, sid, 0)


def _spans(fragments) -> list[tuple[int, int]]:
    return [(it[1], it[2]) for it in fragments]


# ---------------------------------------------------------------------------------------------
# _select_release


# x__select_release__mutmut_46 (`lens >= 2 / min_fragment`: every heavy item counted splittable):
# balance_split cuts an overdue heavy sample only when it makes two fragments of at least
# min_fragment. A 66-token sample (2211 pairs, heavy) that arrived in window 0 is overdue in
# window 2 (max_defer 2); alone in a window of 2 packs its run is unbalanced (2211 over a mean of
# (2211 + 550) / 2: 1.60 > 1.05). With min_fragment 40 it cannot be cut (66 < 2 x 40), so it is
# placed whole; the mutant splits it into 2 fragments of 33 tokens (shorter than min_fragment).

def test_balance_split_places_an_overdue_heavy_sample_too_short_to_cut_whole():
    cfg = _cfg(balance_split=True, max_defer=2, min_fragment=40)
    packs, carry, split = plan_wfap([_item(0, 66, arrival=0)], _ctx(cfg, window=2))
    assert sorted(len(p) for p in packs) == [0, 1]
    assert [it for p in packs for it in p] == [(0, 0, 66, 0, 0, 0)]
    assert carry == [] and split == []


# ---------------------------------------------------------------------------------------------
# _split_light


# x__split_light__mutmut_10 (`L // (k - 1) >= m`: k grows while the previous count was legal):
# no fragment may be shorter than min_fragment, even if it then costs more than a light pack.
# 100 tokens, min_fragment 34: 3 fragments would be 33 tokens (100 // 3 < 34), so 2 of 50 (1275
# pairs each, over 550, but the shortest legal cut). The mutant cuts on to 4 fragments of 25
# (25 < 34).

def test_split_light_never_cuts_below_min_fragment():
    ctx = _ctx(_cfg(min_fragment=34), window=2)
    out = _split_light((7, 0, 100, 0, 7, 0), ctx)
    assert out == [(7, 0, 50, 0, 7, 1), (7, 50, 100, 0, 7, 1)]


# x__split_light__mutmut_11 (`L // (k + 2) >= m`: one count too early) and x__split_light__mutmut_12
# (`L // (k + 1) > m`: a cut into fragments of exactly min_fragment not allowed). 66 tokens,
# min_fragment 22: 2 fragments of 33 cost 561 > 550, 3 of 22 (>= 22, 253 each) are light: 3
# fragments. _11 checks 66 // 4 = 16 < 22 already at k = 2 and _12 needs 66 // 3 = 22 > 22: both
# stop at 2 fragments of 33.

def test_split_light_cuts_into_fragments_of_exactly_min_fragment():
    ctx = _ctx(_cfg(min_fragment=22), window=2)
    out = _split_light((3, 10, 76, 1, 3, 0), ctx)
    assert out == [(3, 10, 32, 1, 3, 1), (3, 32, 54, 1, 3, 1), (3, 54, 76, 1, 3, 1)]


# x__split_light__mutmut_16 (the fragment size as `-(-L / k)`: L / k, which the cost model takes
# as floor(L / k), not the longest fragment ceil(L / k)). 65 tokens, min_fragment 5: in 2
# fragments the longer is 33 tokens (561 > 550), so 3 fragments (22, 22, 21; 253 pairs at most).
# The mutant prices 32 tokens (528 <= 550) and stops at 2 fragments (33 + 32).

def test_split_light_prices_the_longest_fragment():
    ctx = _ctx(_cfg(min_fragment=5), window=2)
    out = _split_light((0, 0, 65, 0, 0, 0), ctx)
    assert _spans(out) == [(0, 22), (22, 44), (44, 65)]


# ---------------------------------------------------------------------------------------------
# wfap_held


# x_wfap_held__mutmut_6 (the lengths as float64, `dtype=None`): the held token count is an exact
# integer sum, also past 2**53 tokens where a float sum rounds. Cap 2**40 (the largest allowed),
# one pack a window, 8194 samples of 2**40 - 1 tokens, all heavy (about 2**79 pairs against a
# light pack of 5.5 x 2**40), none overdue (arrived in window 0, planned in window 1): a run of
# one anchor is always balanced, so the first is released and 8193 are held, 8193 x (2**40 - 1)
# = 9008298766360575 tokens (odd, > 2**53: float64 gives 9008298766360576).

def test_wfap_held_counts_tokens_exactly_past_two_to_the_53():
    cfg = _cfg(max_tokens=2**40, packs_per_window=1)
    items = [_item(i, 2**40 - 1, arrival=0) for i in range(8194)]
    assert wfap_held(items, _ctx(cfg, window=1)) == (8193 * (2**40 - 1), 8193)

"""Sixteenth mutation pass: tests that kill the survivors of mutmut over packing/planners/window.py

Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.window.<name>``)
and the hand-checked case on which the mutant gives another answer. All cases: cap 10 tokens,
cost = tokens (so the cheapest pack is the one with the fewest tokens), window 1, max_defer 1:
items that arrived in window 0 are overdue, items of window 1 are not.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig
from atac_hf.packing.planners.window import (WindowContext, _make_room, balance_models, costs_of, place_overdue,
                                             ref_cost_per_token)

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


def _ctx(packs: int, *, min_fragment: int = 1, split_overdue: bool = True, max_defer: int = 1) -> WindowContext:
    cfg = PackingConfig(max_tokens=10, packs_per_window=packs, max_defer=max_defer, min_fragment=min_fragment,
                        split_overdue=split_overdue)
    return WindowContext(config=cfg, cost_model=LINEAR, window=1, final=False,
                         ref_cost_per_token=ref_cost_per_token(cfg, LINEAR))


def _fresh(sid: int, length: int) -> tuple:
    """A whole sample of this window (not overdue)."""
    return (sid, 0, length, 1, sid, 0)


def _overdue(sid: int, length: int) -> tuple:
    """A whole sample of window 0 (overdue)."""
    return (sid, 0, length, 0, sid, 0)


def _overdue_fragment(sid: int, start: int, end: int) -> tuple:
    """The tail [start, end) of a sample of window 0 split before (overdue, frag = 1)."""
    return (sid, start, end, 0, sid, 1)


# x_balance_models__mutmut_6 (`if ref is None or True`): a ref cost per token given by the
# caller is used as is, not computed again from the config (here 0.5, where LINEAR gives 1).

def test_balance_models_uses_the_given_ref_cost_per_token():
    cfg = PackingConfig(max_tokens=10, packs_per_window=2)
    bm = balance_models(cfg, LINEAR, 0.5)
    assert bm.ref.tolist() == [0.5] and bm.light.tolist() == [5.0]
    assert balance_models(cfg, LINEAR).ref.tolist() == [1.0]


# x_costs_of__mutmut_2 (`np.zeros(None)`: a TypeError) and x_costs_of__mutmut_3 (`np.zeros(1)`):
# no items cost an empty array (one cost per item).

def test_costs_of_no_items_is_an_empty_array():
    out = costs_of([], LINEAR)
    assert isinstance(out, np.ndarray) and out.shape == (0,)
    assert costs_of([_fresh(0, 3), (1, 2, 7, 0, 1, 1)], LINEAR).tolist() == [3.0, 5.0]


# x_place_overdue__mutmut_15 (each pack's cost taken as that of `costs_of(None)`, i.e. 0): an
# overdue item goes to the cheapest pack with room, not the first. Packs of 6 and 3 tokens.

def test_place_overdue_puts_an_item_in_the_cheapest_pack_not_the_first():
    a, b, o = _fresh(0, 6), _fresh(1, 3), _overdue(2, 2)
    packs = [[a], [b]]
    rest, split = place_overdue(packs, [o], _ctx(2))
    assert packs == [[a], [b, o]] and rest == [] and split == []


# x_place_overdue__mutmut_27 (`fits = None`) and x_place_overdue__mutmut_29 (`room[j] > L`): an
# overdue fragment that fits a pack goes into it whole, also when it fills the pack exactly.
# Without split_overdue the mutants carry it on (a fragment gets no _make_room either).

def test_place_overdue_places_a_fitting_fragment_even_as_an_exact_fit():
    ctx = _ctx(1, split_overdue=False)
    a, o = _fresh(0, 7), _overdue_fragment(1, 4, 6)  # 2 tokens into a room of 3
    packs = [[a]]
    assert place_overdue(packs, [o], ctx) == ([], []) and packs == [[a, o]]
    b, o = _fresh(0, 5), _overdue_fragment(1, 5, 10)  # 5 tokens into a room of exactly 5
    packs = [[b]]
    assert place_overdue(packs, [o], ctx) == ([], []) and packs == [[b, o]]


# x_place_overdue__mutmut_37 (`room[j] = L`): a pack's room drops by the item placed in it.
# Pack of 1 token (room 9): a 4-token fragment leaves room 5 (the mutant: 4), so a 5-token one
# still fits.

def test_place_overdue_room_left_after_an_item_is_the_room_minus_the_item():
    a, o1, o2 = _fresh(0, 1), _overdue_fragment(1, 2, 6), _overdue_fragment(2, 5, 10)
    packs = [[a]]
    rest, split = place_overdue(packs, [o1, o2], _ctx(1, split_overdue=False))
    assert packs == [[a, o1, o2]] and rest == [] and split == []


# x_place_overdue__mutmut_38 (`room[j] += L`): the room shrinks, it does not grow. Pack of 4
# tokens (room 6): a 4-token fragment leaves room 2 (the mutant: 10), so a 3-token one is
# carried on, not put in a pack past the cap. (The pack's 4 tokens are overdue too: a fragment
# that fits nowhere makes room by carrying items that may wait, since red-team 9.)

def test_place_overdue_does_not_overfill_a_pack():
    a, o1, o2 = _overdue(0, 4), _overdue_fragment(1, 2, 6), _overdue_fragment(2, 7, 10)
    packs = [[a]]
    rest, split = place_overdue(packs, [o1, o2], _ctx(1, split_overdue=False))
    assert packs == [[a, o1]] and rest == [o2] and split == []


# x_place_overdue__mutmut_79 (`L <= 2 * m`) and x_place_overdue__mutmut_81 (`L < 3 * m`): a
# sample of exactly 2 * min_fragment tokens can be split in two fragments of min_fragment.
# min_fragment 2, two packs of 8 tokens (room 2 each), an overdue whole 4-token sample (no item
# can leave: the packs' items are overdue too).

def test_place_overdue_splits_a_sample_of_twice_min_fragment():
    a, b, o = _overdue(0, 8), _overdue(1, 8), _overdue(2, 4)
    packs = [[a], [b]]
    rest, split = place_overdue(packs, [o], _ctx(2, min_fragment=2, max_defer=0))  # deferral off: cut
    assert packs == [[a, (2, 0, 2, 0, 2, 1)], [b, (2, 2, 4, 0, 2, 1)]]
    assert rest == [] and split == [(2, 4)]


# x_place_overdue__mutmut_101 (`1 < left - take < m`) and x_place_overdue__mutmut_103
# (`0 < left + take < m`): a piece that would leave a 1-token rest (< min_fragment 2) is cut
# shorter so that a legal fragment is left. Rooms 6 and 2, an overdue 7-token fragment: 5 + 2,
# not 6 + a 1-token rest (which the mutants then carry on whole).

def test_place_overdue_leaves_a_legal_fragment_behind_a_piece():
    a, b, o = _overdue(0, 4), _overdue(1, 8), _overdue_fragment(2, 3, 10)
    packs = [[a], [b]]
    rest, split = place_overdue(packs, [o], _ctx(2, min_fragment=2))
    assert packs == [[a, (2, 3, 8, 0, 2, 1)], [b, (2, 8, 10, 0, 2, 1)]]
    assert rest == [] and split == []


# x_place_overdue__mutmut_117 (`0 < left <= m`): a fragment of an over-cap sample may be placed
# in part when the rest is exactly min_fragment long. Rooms 5 and 0, an overdue 7-token
# fragment, min_fragment 2: 5 tokens go, the last 2 are carried on (the mutant carries all 7).

def test_place_overdue_places_part_of_a_fragment_leaving_exactly_min_fragment():
    a, b, o = _overdue(0, 5), _overdue(1, 10), _overdue_fragment(2, 3, 10)
    packs = [[a], [b]]
    rest, split = place_overdue(packs, [o], _ctx(2, min_fragment=2))
    assert packs == [[a, (2, 3, 8, 0, 2, 1)], [b]]
    assert rest == [(2, 8, 10, 0, 2, 1)] and split == []


# x__make_room__mutmut_20 (`freed = span_len(x)`): the tokens freed add up over the items that
# leave. One full pack: two movable 3-token items and an overdue 4; a 6-token overdue sample
# needs both 3s to leave (the mutant counts only the last 3 and finds no room).

def test_make_room_adds_up_the_tokens_of_every_item_that_leaves():
    ctx = _ctx(1)
    a, b, c = _fresh(0, 3), _fresh(1, 3), _overdue(2, 4)
    assert _make_room([[a, b, c]], [0], [10.0], 6, ctx) == (0, [a, b])
    packs = [[a, b, c]]
    rest, split = place_overdue(packs, [_overdue(3, 6)], ctx)
    assert packs == [[c, _overdue(3, 6)]] and rest == [a, b] and split == []

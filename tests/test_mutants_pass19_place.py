"""Nineteenth mutation pass (2 of 2): tests that kill the survivors of mutmut over packing/planners/wfap.py's plan_wfap and _place

Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.wfap.<name>``)
and the hand-checked case on which the mutant gives another answer. Conventions: items are
``(sid, start, end, arrival, seq, frag)``; whole samples are ``(sid, 0, length, arrival, seq=sid,
0)``; the cost model is 1 s a token (``cost = tokens``) unless a test says otherwise, with
``reference_doc_tokens=1`` where attention is priced (so a light pack costs the cap's tokens at
the 1-token document's cost per token). ``plan_wfap`` is called on a window that is not the last
(``final=False``); ``_place`` is called directly, with the (n, K) costs given, where that is the
clearest way to set up its steps 3-5. (The survivors of heavy_lengths, _select_release,
_split_light, wfap_held and plan_wfap's mutants 7, 11, 43 and 78 are in test_mutants_pass19.py.)
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig
from atac_hf.packing.planners.wfap import _place, plan_wfap
from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
# cost(L) = L + L (L + 1) / 2: a 1-token document costs 2 s, a 6-token one 27 s
ATTN = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1)
# cost(L) = L (L + 1) / 2: a 1-token document costs 1 s, a 4-token one 10 s, a 16-token one 136 s
PAIRS = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1)


def _ctx(cost_model: CostModel = LINEAR, window: int = 0, **cfg_kw) -> WindowContext:
    cfg = PackingConfig(**cfg_kw)
    return WindowContext(config=cfg, cost_model=cost_model, window=window, final=False,
                         ref_cost_per_token=ref_cost_per_token(cfg, cost_model))


def _item(sid: int, length: int, arrival: int = 0) -> tuple:
    return (sid, 0, length, arrival, sid, 0)


def _ids(packs, carry):
    return [[it[0] for it in p] for p in packs], [it[0] for it in carry]


def _place_direct(items, costs, ctx, *, light, heavy=None, released=(), due=None):
    """``_place`` with the given (n, K) costs (``due``: the overdue mask)."""
    n = len(items)
    lens = np.array([it[2] - it[1] for it in items], dtype=np.int64)
    costs = np.asarray(costs, dtype=float).reshape(n, -1)
    heavy = np.zeros(n, dtype=bool) if heavy is None else np.asarray(heavy, dtype=bool)
    due = np.zeros(n, dtype=bool) if due is None else np.asarray(due, dtype=bool)
    meta = np.array([(it[3], it[4], it[1]) for it in items], dtype=np.int64).reshape(-1, 3)
    return _place(items, lens, costs, np.asarray(light, dtype=float), heavy, list(released), due, meta, ctx)


# ---------------------------------------------------------------------------------------------
# plan_wfap


# x_plan_wfap__mutmut_152 (`carry.sort(key=None)`: the carry sorted as whole tuples, i.e. by sample
# id): the carry is in (arrival, seq, start) order, data order. Cap 10, 1 pack, three new samples
# of 6 tokens with ids 9, 1, 0 in data order (seq 0, 1, 2): the first (id 9) fills the pack, the
# others are carried in data order [1, 0]; the mutant carries [0, 1].

def test_plan_wfap_carry_is_in_data_order():
    ctx = _ctx(max_tokens=10, packs_per_window=1)
    items = [(9, 0, 6, 0, 0, 0), (1, 0, 6, 0, 1, 0), (0, 0, 6, 0, 2, 0)]
    packs, carry, split = plan_wfap(items, ctx)
    assert _ids(packs, carry) == ([[9]], [1, 0]) and split == []


# x_plan_wfap__mutmut_98 (`price_band is None and ...`: with a band and band_placement=False the
# tails are placed by the band's costs) and x_plan_wfap__mutmut_123 (`... or True`: the fill
# level's "small tail" test reads the band's light pack, 1, against the cost model's seconds).
# Cost model ATTN, cap 16, 1 pack, band (0.5, 2), band_placement=False; new samples: one of 6
# tokens (27 s) and four of 1 token (2 s). No sample is heavy in the band (the 6-token one costs
# (6 + 2 x 21) / (3 x 16) = 1.0 light packs at price x2, 16.5 / 24 at x0.5). Tails balance the
# cost model alone: a light pack is 2 x 16 = 32 s, the 1-token tails (<= 32 / 8 s) are small, so
# the fill level is 32 x 1.025 = 32.8 s: the 6-token tail and two 1-token tails (31 s) go in,
# two are carried (holding back two 1-token tails instead leaves as many over). Mutant 98
# prices the pack in the band: 6-token tail 1.0, each 1-token tail 3 / 48 more at x2, past the
# fill level 1.025: all four are carried. Mutant 123 finds no tail small (every one costs more
# than 1 / 8 s), so the fill level is the mean rate (35 s / 10 tokens) x 16 x 1.025 = 57.4 s: all
# four go in. With band_placement=True (the mutant-98 placement) the four are carried.

def test_plan_wfap_band_placement_false_places_tails_by_the_cost_model():
    items = [_item(0, 6), _item(1, 1), _item(2, 1), _item(3, 1), _item(4, 1)]
    kw = dict(max_tokens=16, packs_per_window=1, reference_doc_tokens=1, price_band=(0.5, 2.0))
    packs, carry, _ = plan_wfap(items, _ctx(ATTN, band_placement=False, **kw))
    assert _ids(packs, carry) == ([[0, 1, 2]], [3, 4])
    packs, carry, _ = plan_wfap(items, _ctx(ATTN, band_placement=True, **kw))
    assert _ids(packs, carry) == ([[0]], [1, 2, 3, 4])


# x_plan_wfap__mutmut_119 (`due_arr[n_orig:] = None`) and x_plan_wfap__mutmut_120 (`= False`): the
# fragments of an overdue sample split just now are overdue too and ignore the fill level.
# Cost model PAIRS (a light pack: 16 x 1 s = 16 s), cap 16, 2 packs, max_defer 1, balance_split;
# window 1: a 16-token sample of window 0 (136 s, heavy, overdue; alone it cannot be balanced:
# 136 / ((136 + 16) / 2) = 1.79) is split into 4 fragments of 4 tokens (10 s <= 16 s; 3 of 6 tokens
# would cost 21 s), plus two new 1-token samples (1 s). The fragments go first, two per pack
# (20 s, past the fill level 16 x 1.025 = 16.4 s), and the 1-token samples are carried. The
# mutants place the fragments as ordinary tails under the fill level, one per pack, carry the
# other two, and put the 1-token samples in their place.

def test_plan_wfap_fragments_of_an_overdue_split_ignore_the_fill_level():
    ctx = _ctx(PAIRS, window=1, max_tokens=16, packs_per_window=2, reference_doc_tokens=1, max_defer=1,
               min_fragment=1, balance_split=True)
    items = [_item(0, 16, arrival=0), _item(1, 1, arrival=1), _item(2, 1, arrival=1)]
    packs, carry, split = plan_wfap(items, ctx)
    assert split == [(0, 16)]
    assert [[(it[0], it[1], it[2]) for it in p] for p in packs] == [[(0, 0, 4), (0, 8, 12)],
                                                                    [(0, 4, 8), (0, 12, 16)]]
    assert _ids(packs, carry)[1] == [1, 2]


# x__place__mutmut_63 (the seq tie-break key replaced by start): tails of equal cost go in data
# order (seq), whatever their starts. Cap 10, 1 pack, two new 6-token tails: the fragment [20, 26)
# of sample 1 (seq 3) and the whole sample 0 (seq 5). The earlier one in data order, the
# fragment, gets the pack and sample 0 is carried; the mutant orders by start and places sample 0.

def test_place_tails_of_equal_cost_go_in_data_order():
    ctx = _ctx(max_tokens=10, packs_per_window=1)
    items = [(1, 20, 26, 0, 3, 1), (0, 0, 6, 0, 5, 0)]
    packs, carry, _ = plan_wfap(items, ctx)
    assert _ids(packs, carry) == ([[1]], [0])


# x__place__mutmut_194 (`local_search or P > 1`): local_search=False turns the local search off.
# Cap 10, 2 packs, new samples of 3, 3, 2, 2, 2 tokens: the greedy (largest first, to the cheapest
# pack) gives 3 + 2 + 2 = 7 and 3 + 2 = 5; the local search swaps a 3 of the first pack with a 2 of
# the second (6 and 6). Without it the greedy packs stay; the mutant swaps anyway.

def test_place_local_search_false_keeps_the_greedy_packs():
    items = [_item(i, L) for i, L in enumerate([3, 3, 2, 2, 2])]
    packs, carry, _ = plan_wfap(items, _ctx(max_tokens=10, packs_per_window=2, local_search=False))
    assert _ids(packs, carry) == ([[0, 2, 4], [1, 3]], [])
    packs, carry, _ = plan_wfap(items, _ctx(max_tokens=10, packs_per_window=2, local_search=True))
    assert sorted(sum(items[i][2] for i in p) for p in _ids(packs, carry)[0]) == [6, 6]


# ---------------------------------------------------------------------------------------------
# _place


# x__place__mutmut_24 (`sorted(group, key=None)`) and x__place__mutmut_26 (`sorted(group)`): the
# released anchors go largest cost first (each to the cheapest pack with room), not in index
# order. Cap 100, 2 packs, costs given: anchors 0 (2 s) and 1 (5 s), not overdue, and an overdue
# tail 2 (3 s). The tail goes first, to pack 0; then anchor 1 to the empty pack 1 and anchor 0 to
# pack 0: 5 s and 5 s. The mutants place anchor 0 first, to pack 1, then anchor 1 to pack 1 too
# (2 s < 3 s): 3 s and 7 s.

def test_place_anchors_go_largest_first():
    ctx = _ctx(max_tokens=100, packs_per_window=2)
    items = [_item(0, 1), _item(1, 1), _item(2, 1)]
    anchor_of, tail_of, left = _place_direct(items, [2.0, 5.0, 3.0], ctx, light=[100.0], heavy=[1, 1, 0],
                                             released=[0, 1], due=[0, 0, 1])
    assert anchor_of == [[0], [1]] and tail_of == [[2], []] and left == []


# x__place__mutmut_101 (`... if (released) or True else 0.0`: the costliest pack counts in the
# ceiling even when no anchor was released): without released anchors the ceiling is the fill
# level (or the costliest tail to place), however costly the overdue tails made a pack. Cap 10,
# 2 packs, light pack 10 s, costs given, local search off: overdue tails 0 (12 s) and 1 (1 s,
# small), new tails 2-7 (1 token, 2 s each; not small). Fill level: 1 s a token x 10 x 1.025 =
# 10.25 s. Tail 0 goes to pack 0, tail 1 to pack 1, then new tails to pack 1 up to 1 + 4 x 2 = 9 s;
# the other two are carried. The mutant's ceiling is pack 0's 12 s: pack 1 takes a fifth (11 s).

def test_place_ceiling_without_anchors_ignores_the_overdue_packs():
    ctx = _ctx(max_tokens=10, packs_per_window=2, local_search=False)
    items = [_item(0, 1), _item(1, 1)] + [_item(i, 1, arrival=0) for i in range(2, 8)]
    costs = [12.0, 1.0] + [2.0] * 6
    anchor_of, tail_of, left = _place_direct(items, costs, ctx, light=[10.0], due=[1, 1] + [0] * 6)
    assert anchor_of == [[], []] and tail_of == [[0], [1, 2, 3, 4, 5]] and sorted(left) == [6, 7]

"""Twentieth mutation pass: tests that kill the survivors of mutmut over packing/planners/baselines.py

Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.baselines.<name>``)
and the hand-checked case on which the mutant gives another answer. Conventions: items are
``(sample_id, start, end, arrival, seq, frag)``, whole samples ``(sid, 0, length, arrival, seq=sid,
0)`` listed in data order unless a test says otherwise; a cost model of 1 s a token (``cost =
tokens``) unless a test gives another; the planners (``plan_bfd``, ``plan_wlb``) and the helper
``_wlb_queues`` are called directly on a hand-built pool and context, so ``fill_empty_packs`` /
``place_overdue`` (which the stream runs after the planner) do not mask a planner's choice.
Results are written as sample ids per pack and the carried ids; expected values are worked out
by hand, never computed with the code under test.
"""

from __future__ import annotations

import pytest

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, StreamPacker
from atac_hf.packing.planners.baselines import _wlb_queues, plan_bfd, plan_wlb
from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
# every document costs 0 (legal: every price >= 0): only the token rule tells packs apart
ZERO = CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0, tile=1)


def _ctx(cfg: PackingConfig, cm: CostModel = LINEAR, window: int = 0, final: bool = False) -> WindowContext:
    return WindowContext(config=cfg, cost_model=cm, window=window, final=final,
                         ref_cost_per_token=ref_cost_per_token(cfg, cm))


def _item(sid: int, length: int, arrival: int = 0, seq: int | None = None, start: int = 0) -> tuple:
    return (sid, start, start + length, arrival, sid if seq is None else seq, 1 if start else 0)


def _ids(result) -> tuple[list[list[int]], list[int]]:
    packs, carry, _split = result
    return [[it[0] for it in p] for p in packs], [it[0] for it in carry]


def _all_due(lengths, max_tokens: int, packs: int, cm: CostModel = LINEAR):
    """plan_wlb on whole samples of these lengths (ids 0, 1, ... in data order), every one due
    (the stream's last window), no outlier queue (wlb_thresholds=()): all go to the greedy."""
    cfg = PackingConfig(max_tokens=max_tokens, packs_per_window=packs, strategy="wlb", wlb_thresholds=())
    return _ids(plan_wlb([_item(i, L) for i, L in enumerate(lengths)], _ctx(cfg, cm, final=True)))


# ---------------------------------------------------------------------------------------------
# plan_bfd


# x_plan_bfd__mutmut_33 (`due.append(True)`: every pack counts as due), x_plan_bfd__mutmut_37
# (`due[j] = None`: no pack is due) and x_plan_bfd__mutmut_38 (`due[j] and is_due`: never set):
# the emitted packs are those holding a due item first, then the fullest. Cap 5, one pack a window,
# max_defer 1, window 1: the 2 (arrived in window 0) is due, the 4 (window 1) is not. Best fit, due
# first: 2 -> A (room 3), 4 does not fit A -> B (room 1). A is emitted although B is fuller; the 4
# waits. With every pack due, or none, the fullest (B = [4]) is emitted and the due 2 is carried.
# (The stream's test_bfd_keeps_the_due_pack_even_when_another_is_fuller no longer tells these
# apart: place_overdue puts the carried due 2 in the window anyway.)

def test_bfd_emits_the_pack_holding_a_due_item_before_a_fuller_one():
    cfg = PackingConfig(max_tokens=5, packs_per_window=1, strategy="bfd", max_defer=1)
    items = [_item(0, 2, arrival=0), _item(1, 4, arrival=1)]
    assert _ids(plan_bfd(items, _ctx(cfg, window=1))) == ([[0]], [1])
    # with nothing due (both arrived in window 1) the fuller pack goes
    items = [_item(0, 2, arrival=1), _item(1, 4, arrival=1)]
    assert _ids(plan_bfd(items, _ctx(cfg, window=1))) == ([[1]], [0])


# ---------------------------------------------------------------------------------------------
# _wlb_queues


# x__wlb_queues__mutmut_5 (`sorted(range(n), key=None)`) and x__wlb_queues__mutmut_7 (the key
# dropped): the queues are FIFO in data order, not in the pool's list order. The stream's pool is
# not always in data order: _top_up appends the next fragment of a split sample (older) after the
# carried samples. Cap 10, one pack a window, default thresholds (2, 5), max_defer 5 (nothing due):
# window 0 gets a 30-token sample (fragments 10 + 10 + 10; one shown, two in the backlog) and an
# 8. Queue 1 (>= 5) holds [fragment 0-10, the 8]: full (>= 1), it releases the oldest, the
# fragment; the 8 waits. The pool is then [the 8 (seq 1), fragment 10-20 (seq 0)]: the fragment is
# older and goes first again in window 1, and the third fragment in window 2 (the 8 waits behind
# them). In list order the 8 would go in window 1.

def test_wlb_queues_are_fifo_in_data_order_not_pool_order():
    cfg = PackingConfig(max_tokens=10, packs_per_window=1, strategy="wlb", max_defer=5, min_fragment=1)
    pool = [_item(1, 8, seq=1), _item(0, 10, seq=0, start=10)]
    free, queues = _wlb_queues(pool, _ctx(cfg, window=1))
    assert free == [] and queues == [[], [1, 0]]
    p = StreamPacker(cfg, LINEAR)
    with pytest.warns(UserWarning, match="split into fragments"):
        assert p.add_window([0, 1], [30, 8]) == [[(0, 0, 10)]]
    assert p.add_window([], []) == [[(0, 10, 20)]]
    assert p.add_window([], []) == [[(0, 20, 30)]]
    assert p.pending_ids == [1]


# ---------------------------------------------------------------------------------------------
# plan_wlb: the overdue fallback (greedy, best fit, greedy again)


# x_plan_wlb__mutmut_91 (restart() sets the token heap to (1, j)): after the fallback the greedy
# runs again on reset heaps, and the token fallback must find an empty pack there. Zero cost
# model (every pack's workload stays 0: the least-workload pick is always pack 0), cap 10, two
# packs, three due 6s. Greedy: 6 -> pack 0, 6 does not fit pack 0 -> fewest tokens, pack 1; the
# third fits nowhere. Best fit also places two, so the greedy runs again and gives the same plan.
# With the stale (1, j) entries the token heap knows only pack 0 and the second 6 is carried too.

def test_wlb_greedy_after_the_fallback_still_reaches_an_empty_pack():
    assert _all_due([6, 6, 6], 10, 2, ZERO) == ([[0], [1]], [2])


# x_plan_wlb__mutmut_94 / _96 (best fit in index order: `key=None` / no key), _98 (shortest
# first), _108 / _110 (`max(fits)` with no key: the highest-index pack that fits) and _112
# (`(tok, +j)`: ties to the highest index). Cap 8, two packs, all due, lengths 2, 2, 3, 4, 5
# (16 tokens, exactly two packs). Greedy (least workload): 5 -> A, 4 -> B, 3 -> B (7), 2 -> A (7),
# the last 2 fits neither: one stranded. Best fit decreasing: 5 -> A, 4 -> B (A would hold 9),
# 3 -> A (the fuller that fits: 8), 2 -> B, 2 -> B (8): none stranded, so it is kept:
# A = [5, 3] (ids 4, 2), B = [4, 2, 2] (ids 3, 0, 1). Shortest (or index) first: 2, 2, 3 -> A (7),
# 4 -> B, 5 fits neither: as many stranded as the greedy, whose plan is kept (A = [5, 2],
# B = [4, 3], one 2 carried). Highest index first / ties to the highest index: the same packs as
# the clean plan in the other order (B first).

def test_wlb_overdue_fallback_is_best_fit_decreasing():
    assert _all_due([2, 2, 3, 4, 5], 8, 2) == ([[4, 2], [3, 0, 1]], [])


# x_plan_wlb__mutmut_108 / _110 (the highest-index pack that fits, not the fullest): a case where
# the packs themselves differ. Cap 9, three packs, all due, lengths 7, 4, 4, 3, 3, 3, 1. Greedy:
# 7 -> A, 4 -> B, 4 -> C, 3 -> B (7), 3 -> C (7), the third 3 fits none (each holds 7), 1 -> A:
# one stranded. Best fit: 7 -> A, 4 -> B, 4 -> B (8, the fuller that fits), 3, 3, 3 -> C (9), and
# the 1 to the fuller of A (7) and B (8): B (9). All placed. The mutant puts the first 7 in C and
# the 1 beside it (C = [7, 1]), leaving the 4 + 4 pack at 8. (_98 and _112 fail here too: the
# shortest-first fallback strands the 7 and falls back to the greedy; _112 gives the clean packs in
# reverse order.)

def test_wlb_overdue_fallback_puts_each_document_in_the_fullest_pack_it_fits():
    assert _all_due([7, 4, 4, 3, 3, 3, 1], 9, 3) == ([[0], [1, 2, 6], [3, 4, 5]], [])


# x_plan_wlb__mutmut_122 (`>` for `>=`: best fit kept where it strands as many as the greedy):
# the balance-first plan is kept unless best fit strands fewer. Cap 5, two packs, all due,
# lengths 3, 3, 1, 4. Greedy: 4 -> A, 3 -> B, 3 fits neither, 1 -> B (4): loads 4 and 4, one 3
# carried. Best fit: 4 -> A, 3 -> B, 3 stranded, 1 -> A (the fuller: 5): also one stranded, so
# the greedy's plan stays. The mutant keeps A = [4, 1], B = [3].

def test_wlb_keeps_the_balance_plan_where_best_fit_strands_as_many():
    assert _all_due([3, 3, 1, 4], 5, 2) == ([[3], [0, 2]], [1])


# The same mutant where it costs a document: cap 12, two packs, window 1, max_defer 1. Due (arrived
# in window 0): 7, 8, 9, 2 (ids 0-3); not due (window 1): 3, 2 (ids 4, 5). Greedy on the due ones:
# 9 -> A, 8 -> B, 7 fits neither, 2 -> B (10); best fit: 2 -> A (11), the 7 stranded as well: the
# greedy plan stays (9 | 10), and the rest (longest first, least workload) fills both to 12: 3 -> A,
# 2 -> B. From best fit's 11 | 8 the 3 goes to B (11) and the last 2 fits neither: carried.

def test_wlb_balance_plan_leaves_room_for_the_documents_not_due():
    cfg = PackingConfig(max_tokens=12, packs_per_window=2, strategy="wlb", wlb_thresholds=(), max_defer=1)
    items = [_item(0, 7), _item(1, 8), _item(2, 9), _item(3, 2), _item(4, 3, arrival=1), _item(5, 2, arrival=1)]
    assert _ids(plan_wlb(items, _ctx(cfg, window=1))) == ([[2, 4], [1, 3, 5]], [0])

"""Holes found by the twenty-second mutation pass over ``sharding/bounds.py`` (issue 20).

ATP builds its per_doc candidate only where :func:`_per_doc_may_win` says it can have a block
time under the threshold. These tests pin the bounds' exact values on hand-worked packs (and
that they stay tight: equal to the built layout's exchange where the docstring says it is exact),
that ``_per_doc_may_win`` says False wherever its bounds prove the candidate cannot get under
the threshold (strictly), that it never says False where the built candidate does, and that
the per-pack quantities a caller hands in are used as given, not counted again.

Every model below prices exactly (tile 1, no latency unless noted, 1 byte a token over 1 byte/s):
a token's K/V costs 1 s on the wire, a causal pair 1 s of compute, a token 0 s.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding import bounds
from atac_hf.sharding.baselines import per_doc_block_time
from atac_hf.sharding.bounds import _per_doc_a2a_floor, _per_doc_lower_bound, _per_doc_may_win, _work_lower_bound
from atac_hf.sharding.segments import _exact_pairs, finish_flat, per_doc_flat

UNIT = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0,
                 link_bandwidth=1.0, link_latency_s=0.0)


def _per_doc(L, C, cm, exchange):
    return finish_flat(np.asarray(L, np.int64), C, "atp", *per_doc_flat(np.asarray(L, np.int64), C), None, cm, exchange)


# ----------------------------------------------------------------------------- _per_doc_lower_bound


def test_per_doc_lower_bound_adds_the_gather_of_a_two_token_document_on_all_ranks_but_one():
    """Kills _per_doc_lower_bound mutants 3 and 4 (``lengths > 2`` / ``>= 3``: a 2-token document
    is split too), 6 (the exchange dropped), 9 (``comm_cost(None, C)``: 0 s), 15 (the exchange
    subtracted) and 28 (``C - 2`` ranks wait).

    [2] over 2 ranks: 3 exact pairs over 2 ranks, work 1.5 s; the document is split (token 0 on
    rank 0, token 1 on rank 1), its all-gather 2 x (2 tokens x 1/2) = 2 s, half of it on top:
    1.5 + 1 = 2.5 s (the layout's block time is 2 + 2 = 4 s). [10] over 4 ranks: 55 pairs / 4 =
    13.75 s, the all-gather 2 x 10 x 3/4 = 15 s, 3/4 of it on top: 25 s."""
    L = np.array([2])
    assert _work_lower_bound(L, 2, UNIT) == 1.5
    assert _per_doc_lower_bound(L, 2, UNIT) == 2.5
    assert per_doc_block_time(L, 2, UNIT) == 4.0
    assert _per_doc_lower_bound(np.array([2, 1]), 2, UNIT) == (3 + 1) / 2 + 1.0  # a 1-token document stays local
    assert _per_doc_lower_bound(np.array([10]), 4, UNIT) == 13.75 + 0.75 * 15.0
    assert _per_doc_lower_bound(np.array([10]), 4, UNIT, comm=4.0) == 13.75 + 3.0  # the caller's exchange as given


def test_per_doc_lower_bound_uses_the_callers_work_bound():
    """Kills _per_doc_lower_bound mutant 17 (the caller's ``work`` ignored, the exact-work bound
    computed again). [2, 1, 1] with 3 s a kernel call: the per_doc layout computes 12 s and 5 s
    (rank 0: token 0 of the [2] and both 1-token documents, 3 calls; rank 1: token 1, one call),
    a mean of 8.5 s, a lower bound of its compute tighter than the exact work (5 pairs / 2 =
    2.5 s, no per-call time). The all-gather of the 2-token document: 2 x 2 x 5 / 2 = 10 s."""
    cm = UNIT.replace(segment_overhead_s=3.0, kv_bytes_per_token=5.0)
    L = np.array([2, 1, 1])
    assert _per_doc(L, 2, cm, "all_gather").rank_compute_s.tolist() == [12.0, 5.0]
    assert _per_doc_lower_bound(L, 2, cm) == 2.5 + 5.0
    assert _per_doc_lower_bound(L, 2, cm, 8.5) == 8.5 + 5.0
    assert _per_doc_lower_bound(L, 2, cm, 8.5, 0.0) == 8.5


# ----------------------------------------------------------------------------- _per_doc_a2a_floor


def test_per_doc_a2a_floor_counts_a_one_token_last_chunk():
    """Kills _per_doc_a2a_floor mutants 13 (``rem / C``: a fractional share of the remainder),
    29 and 55 (``tail > 1``: a last chunk of one token needs no keys).

    [10] over 4 ranks: 8 chunks of 1 token, 2 left over, one to each of ranks 0 and 1; rank 0
    holds [0, 2) and its last chunk [9, 10), which needs keys [2, 9) held by the others: 7 rows,
    2 x 7 = 14 s, exactly the layout's all-to-all (rank 0's receive is the busiest link). Under a
    window of 100 (every key of the document) the same 7 rows; under a window of 3 only keys
    [7, 9): 2 rows, 4 s."""
    L = np.array([10])
    assert _per_doc_a2a_floor(L, 4, UNIT) == 14.0
    assert _per_doc(L, 4, UNIT, "all_to_all").comm_s == 14.0
    wide = UNIT.replace(sliding_window=100)
    assert _per_doc_a2a_floor(L, 4, wide) == 14.0
    assert _per_doc(L, 4, wide, "all_to_all").comm_s == 14.0
    assert _per_doc_a2a_floor(L, 4, UNIT.replace(sliding_window=3)) == 4.0


def test_per_doc_a2a_floor_windowed_head_of_an_even_share():
    """Kills _per_doc_a2a_floor mutants 38 (``(extra + 1) / 2``) and 40 (``(extra + 2) // 2``):
    rank 0's head is ``base + (extra + 1) // 2`` tokens, in whole tokens.

    [8] over 2 ranks under a window of 100: 4 chunks of 2 tokens, no remainder (extra 0); rank 0
    holds [0, 2) and [6, 8), its last chunk needs keys [2, 6): 4 rows, 2 x 4 = 8 s, exactly the
    layout's all-to-all."""
    cm = UNIT.replace(sliding_window=100)
    assert _per_doc_a2a_floor(np.array([8]), 2, cm) == 8.0
    assert _per_doc(np.array([8]), 2, cm, "all_to_all").comm_s == 8.0


def test_per_doc_a2a_floor_pays_a_latency_per_peer():
    """Kills _per_doc_a2a_floor mutants 69 (``latency / (C - 1)``) and 71 (``C - 2`` peers).
    [10] over 4 ranks at 1 s a step: 2 x (3 peers x 1 s + 7 rows) = 20 s, the layout's
    all-to-all exactly."""
    cm = UNIT.replace(link_latency_s=1.0)
    assert _per_doc_a2a_floor(np.array([10]), 4, cm) == 20.0
    assert _per_doc(np.array([10]), 4, cm, "all_to_all").comm_s == 20.0


def test_per_doc_a2a_floor_of_one_rank_is_zero():
    """Kills _per_doc_a2a_floor mutant 3 (``return 1.0`` for one rank): one rank exchanges
    nothing, so 1 s is no lower bound of its exchange."""
    for cm in (UNIT, UNIT.replace(link_latency_s=1.0), UNIT.replace(sliding_window=3)):
        assert _per_doc_a2a_floor(np.array([10, 1, 7]), 1, cm) == 0.0
        assert _per_doc(np.array([10, 1, 7]), 1, cm, "all_to_all").comm_s == 0.0


# ----------------------------------------------------------------------------- _per_doc_may_win


def test_per_doc_may_win_false_where_the_sum_over_ranks_reaches_the_threshold():
    """Kills _per_doc_may_win mutants 23 (the gate's bound with ``work=comm``), 47 (``>`` where
    the bound may equal the threshold) and 48 (``return True`` where it cannot win).

    [2, 1, 1, 1, 1] over 2 ranks: work 7 pairs / 2 = 3.5 s; the [2] is split (rank 0 token 0,
    rank 1 token 1), its all-gather 2 s; rank 0 also runs the four 1-token documents (4 s of
    local attention, which hides the exchange): block time max(5 - 4 + max(4, 2), 2 + 2) = 5 s.
    The all-to-all moves 1 row (2 s, no cheaper) and rank 0 receives nothing (floor 0). Summed
    over the ranks the block time is at least the work, 3.5 s, so nothing is under 3.5 s, though
    the block time less the whole exchange is 3 s."""
    L = np.array([2, 1, 1, 1, 1])
    assert per_doc_block_time(L, 2, UNIT) == 5.0
    assert _per_doc(L, 2, UNIT, "auto").block_time_s == 5.0
    assert _per_doc_a2a_floor(L, 2, UNIT) == 0.0
    for threshold in (3.5, 3.25, 1.0):
        assert _per_doc_may_win(L, 2, UNIT, 3.5, threshold) is False, threshold
    assert _per_doc_may_win(L, 2, UNIT, 3.5, 5.0 + 1e-9) is True


def test_per_doc_may_win_without_a_split_document_has_no_exchange_to_save():
    """Kills _per_doc_may_win mutants 13 (``else 1.0``: a 1 s exchange where there is none), 48,
    56 (``block <= threshold``) and 72 (``<=`` in the last test): the block time must be strictly
    under the threshold.

    [1, 1, 1] over 2 ranks: nothing is split, rank 0 runs all three documents: block time 3 s,
    no exchange; the work bound 1.5 s."""
    L = np.array([1, 1, 1])
    assert per_doc_block_time(L, 2, UNIT) == 3.0
    for threshold in (3.0, 2.5, 1.5, 1.0):
        assert _per_doc_may_win(L, 2, UNIT, 1.5, threshold) is False, threshold
    assert _per_doc_may_win(L, 2, UNIT, 1.5, 3.0 + 1e-9) is True


def test_per_doc_may_win_an_all_to_all_no_cheaper_saves_nothing():
    """Kills _per_doc_may_win mutants 71 (``comm + floor``: twice the exchange taken off), 56 and
    72 and 48.

    [10] over 2 ranks: rank 0 [0, 3) + [8, 10) (6 + 19 pairs), rank 1 [3, 8) (30 pairs); the
    all-gather 2 x 10 / 2 = 10 s, block 30 + 10 = 40 s; the all-to-all moves 5 rows (10 s): no
    cheaper, so the candidate's block time is 40 s. The lower bound: 55 / 2 + 5 = 32.5 s."""
    L = np.array([10])
    assert per_doc_block_time(L, 2, UNIT) == 40.0
    assert _per_doc_a2a_floor(L, 2, UNIT) == 10.0
    assert _per_doc(L, 2, UNIT, "auto").block_time_s == 40.0
    for threshold in (40.0, 35.0, 32.5, 20.0):
        assert _per_doc_may_win(L, 2, UNIT, 27.5, threshold) is False, threshold
    assert _per_doc_may_win(L, 2, UNIT, 27.5, 40.0 * (1 + 1e-9)) is True


@pytest.mark.parametrize("L, C, cm, block", [
    # [2, 2] over 4 ranks: each document's token 0 on rank 0, token 1 on rank 1 (2 + 2 pairs); the
    # all-gather of 4 tokens costs 2 x 4 x 3/4 = 6 s (block 10 s), the all-to-all only the 2 rows
    # rank 1 needs, 4 s: block 8 s. Kills _per_doc_may_win mutants 2 and 3 (2-token documents
    # not counted as split: no exchange to save, so 10 s is taken for the best).
    ([2, 2], 4, UNIT, 8.0),
    # [10] over 2 ranks, window 3, 10 bytes a token: the all-gather moves 10 tokens / 2 (100 s,
    # block 15 + 100 s), the all-to-all 2 rows each way (40 s): block 55 s. Kills mutant 45 (the
    # second bound with ``work=floor``: 40 + 100 / 2 = 90 s, above the 55 s the layout has).
    ([10], 2, UNIT.replace(sliding_window=3, kv_bytes_per_token=10.0), 55.0),
])
def test_per_doc_may_win_true_where_the_all_to_all_layout_is_under_the_threshold(L, C, cm, block):
    L = np.array(L)
    plan = _per_doc(L, C, cm, "auto")
    assert plan.kv_exchange == "all_to_all" and plan.block_time_s == block
    work = _work_lower_bound(L, C, cm)
    for threshold in (block * (1 + 1e-6), block + 1.0):  # ATP's margin, and a wide one
        assert _per_doc_may_win(L, C, cm, work, threshold) is True, threshold


def test_per_doc_may_win_uses_the_callers_work_bound():
    """Kills _per_doc_may_win mutants 18 and 40 (the caller's ``work`` ignored in one of the two
    bounds, the looser exact-work bound computed again).

    [2, 1, 1] over 2 ranks at 3 s a call, 5 bytes a token: the layout computes 12 s and 5 s, a
    mean of 8.5 s (a valid bound of its compute, tighter than the exact work, 2.5 s); the
    all-gather costs 10 s, the all-to-all as much (1 row, 10 s), rank 0 receives nothing (floor
    0); its block time is 15 s. With 8.5 s of work nothing is under 8 s (a mean of 8.5 s); with
    2.5 s both bounds (2.5 + 5 = 7.5 s with the all-gather, 2.5 s with the floor) are under 8 s, and
    the block time less the exchange all-to-all could save, 15 - 10 = 5 s, is too: a mutant that
    bounds with the exact work instead says True."""
    cm = UNIT.replace(segment_overhead_s=3.0, kv_bytes_per_token=5.0)
    L = np.array([2, 1, 1])
    assert _per_doc(L, 2, cm, "auto").block_time_s == 15.0
    assert _work_lower_bound(L, 2, cm) == 2.5
    assert _per_doc_may_win(L, 2, cm, 8.5, 8.0) is False
    # the exact-work bound alone proves nothing at 8 s: both of its bounds are under it
    assert _per_doc_lower_bound(L, 2, cm, 2.5) == 7.5 and _per_doc_lower_bound(L, 2, cm, 2.5, 0.0) == 2.5


def test_callers_per_pack_quantities_are_not_counted_again(monkeypatch):
    """ATP counts the pack's exact pairs once (``exact_pairs`` in plan_atp) and hands the work bound
    on: with ``pairs`` / ``work`` given, no bound counts them again. Kills _work_lower_bound mutant 4
    (``pairs`` ignored), _per_doc_lower_bound mutant 17 and _per_doc_may_win mutants 18 and 40 (the
    caller's ``work`` ignored)."""
    L = np.array([10, 3, 2, 1])
    C = 4
    pairs = _exact_pairs(L, UNIT)
    work = _work_lower_bound(L, C, UNIT, pairs)
    assert work == (55 + 6 + 3 + 1) / 4
    calls = []
    real = bounds._exact_pairs
    monkeypatch.setattr(bounds, "_exact_pairs", lambda *a: calls.append(1) or real(*a))
    assert _work_lower_bound(L, C, UNIT, pairs) == work
    assert _work_lower_bound(L, C, UNIT, np.array([100.0, 0.0, 0.0, 0.0])) == 25.0  # the caller's pairs as given
    assert _per_doc_lower_bound(L, C, UNIT, work) == _per_doc_lower_bound(L, C, UNIT, work, 2.0 * 15 * 0.75)
    assert not calls
    lb = _per_doc_lower_bound(L, C, UNIT, work)
    for threshold in (lb / 2, lb, lb * 2, per_doc_block_time(L, C, UNIT) * 2):  # both bounds' tests reached
        _per_doc_may_win(L, C, UNIT, work, threshold)
    assert not calls
    assert _work_lower_bound(L, C, UNIT) == work and calls  # without them, counted here


def test_atp_takes_the_per_doc_all_to_all_layout_of_a_two_token_document():
    """Kills _per_doc_may_win mutants 2 and 3 at the plan level (a 2-token document not counted as
    split: no exchange for the all-to-all to save, so ATP skips the per_doc candidate that wins).

    [2] over 4 ranks (one node of 3 and one beyond), 2 s a pair, 2 s a call, 2 bytes a token:
    whole on one rank, 3 pairs: 6 + 2 = 8 s. Split (token 0 on rank 0: 2 + 2 = 4 s, token 1 on
    rank 1: 4 + 2 = 6 s): the all-gather costs 2 x (2 tokens x 2 B x 3/4) / 2 B/s = 3 s (9 s);
    the all-to-all only the row rank 1 needs, within its node at 8 B/s: 2 x 2 / 8 = 0.5 s (6.5 s)."""
    from atac_hf.sharding import plan_shards

    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=2.0, segment_overhead_s=2.0, tile=1, kv_bytes_per_token=2.0,
                   link_bandwidth=2.0, link_latency_s=0.0, node_size=3, intra_node_bandwidth=8.0)
    L = np.array([2])
    assert cm.doc_cost(L).tolist() == [8.0]
    assert per_doc_block_time(L, 4, cm) == 9.0
    assert _per_doc(L, 4, cm, "all_to_all").block_time_s == 6.5
    plan = plan_shards(L, 4, "atp", cm)
    assert plan.kv_exchange == "all_to_all" and plan.block_time_s == 6.5

"""Tests that kill the mutmut survivors in ``atac_hf/sharding/atp.py`` (issue 20), on
hand-built plans whose seconds are exact (tile 1, prices of whole seconds).
docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding import ShardPlan
from atac_hf.sharding.atp import _robustly_no_worse

#: 8 s per token, 1 s per causal pair (times the price factor k in _robustly_no_worse)
CM8 = CostModel(linear_s_per_token=8.0, attn_s_per_pair=1.0, tile=1)


def _hand_plan(lengths, segments) -> ShardPlan:
    return ShardPlan(doc_lengths=np.array(lengths, dtype=np.int64), cp_size=len(segments), strategy="hand",
                     segments=tuple(np.array(s, dtype=np.int64).reshape(-1, 3) for s in segments),
                     gathered_docs=np.zeros(0, dtype=np.int64), rank_compute_s=np.zeros(len(segments)))


# b: rank 0 ten 1-token documents (80 + 10 k s), rank 1 one of 8 tokens (64 + 36 k s).
# a: rank 0 documents of 7, 1 and 1 tokens (72 + 30 k s), rank 1 one token (8 + k s).
# Block times, a against b: k = 0.25: 79.5 / 82.5, 0.5: 87 / 85, 1.5: 117 / 118,
# 2: 132 / 136, 4: 192 / 208. a is worse only at half the attention price.
B = _hand_plan([1] * 10 + [8], [[(i, 0, 1) for i in range(10)], [(10, 0, 8)]])
A = _hand_plan([7, 1, 1, 1], [[(0, 0, 7), (1, 0, 1), (2, 0, 1)], [(3, 0, 1)]])


def test_robustly_no_worse_checks_attention_at_half_its_price():
    """a plan no slower than the other at 0.25x, 2x and 4x (and 1.5x) the attention price but
    slower at 0.5x is not robustly no worse."""
    assert _robustly_no_worse(A, B, CM8) is False
    assert _robustly_no_worse(B, B, CM8) is True


def test_robustly_no_worse_fills_in_the_callers_block_times():
    """``b_blocks`` collects b's block time per price factor as costed: up to the first factor
    where a is worse (0.5x), every factor where a is no worse throughout; without it the check
    runs all the same."""
    got: dict = {}
    assert _robustly_no_worse(A, B, CM8, got) is False
    assert got == {0.25: 82.5, 0.5: 85.0}
    got = {}
    assert _robustly_no_worse(B, B, CM8, got) is True
    assert got == {0.25: 82.5, 0.5: 85.0, 2.0: 136.0, 4.0: 208.0}
    # costed once: a cached block time is used as given (here a made-up one that a beats)
    assert _robustly_no_worse(A, B, CM8, {0.25: 82.5, 0.5: 87.0, 2.0: 136.0, 4.0: 208.0}) is True


def test_head_tail_flat_segments_and_ranks_of_two_documents():
    """Docs 0 (8 tokens) and 1 (3 tokens) head-tail over 2 ranks, bounds [0, 2, 4, 6, 8] and
    [0, 1, 2, 2, 3] (doc 1's remainder: rank 0 gets 2 tokens, rank 1 one, rank 1's tail chunk
    empty): every rank's head chunk first, then the tails; empty chunks dropped."""
    from atac_hf.sharding.atp import _head_tail_flat
    from atac_hf.sharding.segments import head_tail_bounds

    bounds = head_tail_bounds(np.array([8, 3]), 2)
    assert bounds.tolist() == [[0, 2, 4, 6, 8], [0, 1, 2, 2, 3]]
    seg, rank = _head_tail_flat(np.array([0, 1]), bounds, 2)
    assert seg.dtype == np.int64
    assert seg.tolist() == [[0, 0, 2], [0, 2, 4], [1, 0, 1], [1, 1, 2], [0, 6, 8], [0, 4, 6], [1, 2, 3]]
    assert rank.tolist() == [0, 1, 0, 1, 0, 1, 0]


# ---------------------------------------------------------------------------- _water_fill, _split_by_share

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)  # a chunk costs its tokens


def _fill(cm, lengths, load, tok=None, cap=np.inf):
    from atac_hf.sharding.atp import _water_fill

    L = np.array(lengths, dtype=np.int64)
    tok = np.zeros(len(load), np.int64) if tok is None else np.array(tok, dtype=np.int64)
    bounds, added = _water_fill(cm, L, cm.doc_cost(L), np.array(load, dtype=np.float64), tok, cap)
    return bounds.tolist(), added.tolist()


def test_water_fill_levels_the_ranks_it_can():
    """An 8-token anchor over ranks loaded 0 and 0 is split 4 + 4; over ranks loaded 0 and 100 a
    4-token anchor (cost 4) cannot reach the second: all of it on rank 0 (head [0, 2), tail
    [2, 4))."""
    assert _fill(LINEAR, [8], [0.0, 0.0]) == ([[0, 2, 4, 6, 8]], [4.0, 4.0])
    assert _fill(LINEAR, [4], [0.0, 100.0]) == ([[0, 2, 2, 2, 4]], [4.0, 0.0])


def test_water_fill_keeps_the_cap_after_the_tails():
    """Cap 8 with rank 0 already holding 6 tokens: rank 0 takes 2 of the 8-token anchor (head
    [0, 1), tail [7, 8)), rank 1 the other 6."""
    assert _fill(LINEAR, [8], [0.0, 0.0], tok=[6, 0], cap=8.0) == ([[0, 1, 4, 7, 8]], [2.0, 6.0])


def test_water_fill_with_nothing_priced_splits_evenly():
    """A model that prices nothing gives no shares: the anchor is split evenly, 2 tokens a chunk."""
    free = CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0, tile=1)
    assert _fill(free, [8], [0.0, 0.0]) == ([[0, 2, 4, 6, 8]], [0.0, 0.0])


# Characterisation (seeded search; tile 4, so a rank's cost per token depends on its chunks): the
# second split, on shares corrected by each rank's measured cost per token, is the one kept. The
# first case ends exactly level (162 + 285 = 145 + 302 = 447).
TILE4 = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=4)


def test_water_fill_corrects_the_shares_by_measured_cost_per_token():
    """The corrected split of a 27-token anchor over loads 162 and 145 (level at 447 s) and of a
    25-token anchor over loads 52, 30 and 149."""
    assert _fill(TILE4, [27], [162.0, 145.0]) == ([[0, 7, 14, 21, 27]], [285.0, 302.0])
    assert _fill(TILE4, [25], [52.0, 30.0, 149.0]) == ([[0, 5, 11, 13, 15, 21, 25]], [169.0, 284.0, 132.0])


def _share(frac, room, lengths):
    from atac_hf.sharding.atp import _split_by_share

    bounds, n, added = _split_by_share(LINEAR, np.array(lengths, dtype=np.int64), np.array(frac, dtype=np.float64),
                                       np.array(room, dtype=np.float64))
    return bounds.tolist(), n.tolist()


def test_split_by_share_hands_the_excess_over_a_cap_to_ranks_with_room():
    """8 tokens at shares 1/2, 1/2 with room 2 and 10: rank 0 is clipped to 2, rank 1 takes 6.
    At shares 1, 0 the same: the excess goes to rank 1 though its share is 0. At 0.6, 0.3, 0.1
    (10 tokens, room 2, 100, 100) the 4 in excess go 3 : 1 by share: 2, 6, 2."""
    assert _share([0.5, 0.5], [2, 10], [8]) == ([[0, 1, 4, 7, 8]], [[2, 6]])
    assert _share([1.0, 0.0], [2, 10], [8]) == ([[0, 1, 4, 7, 8]], [[2, 6]])
    assert _share([0.6, 0.3, 0.1], [2, 100, 100], [10]) == ([[0, 1, 4, 5, 6, 9, 10]], [[2, 6, 2]])


def test_split_by_share_rounds_up_the_largest_fraction_where_there_is_room():
    """7 tokens at 0.8, 0.2: 5.6 and 1.4, so rank 0 gets the odd token (6 + 1), also when its
    room is exactly one token more than its floor (room 6)."""
    assert _share([0.8, 0.2], [100, 100], [7]) == ([[0, 3, 4, 4, 7]], [[6, 1]])
    assert _share([0.8, 0.2], [6, 10], [7]) == ([[0, 3, 4, 4, 7]], [[6, 1]])

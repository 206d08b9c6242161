"""Tests that kill the mutmut survivors in ``atac_hf/sharding/two_way.py`` (issue 20): the two-way
split of anchors, worked by hand (docs/TESTING.md, fifth pass).

Notation of the hand work: a rank's pairs from a chunk [s, e) are P(e) - P(s), P(n) = n(n+1)/2.
For a rank that takes ``nr`` tokens of [H, E) as a head of h and a tail of nr - h, its pairs are
``base + slope * h`` with base = P(E) - P(H) + (H - b)(H + b + 1)/2, b = E - nr, slope = H - b;
h = round((target - base) / slope), clipped to [0, nr].
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.sharding.segments import causal_pairs
from atac_hf.sharding.two_way import _two_way_anchor_segments, _two_way_flat


def _flat(lengths, C, anchors, owner, cap=np.inf, min_chunk=1):
    got = _two_way_flat(np.array(lengths, dtype=np.int64), C, np.array(anchors, dtype=np.int64),
                        np.array(owner, dtype=np.int64), cap, min_chunk)
    if got is None:
        return None
    seg, rank = got
    assert seg.dtype == np.int64 and rank.dtype == np.int64
    return seg.tolist(), rank.tolist()


def _rank_tokens_and_pairs(lengths, C, owner, seg, rank):
    tok, pairs = [0] * C, [0] * C
    for (_, s, e), r in zip(seg, rank):
        tok[r] += e - s
        pairs[r] += causal_pairs(e) - causal_pairs(s)
    for d, r in enumerate(owner):
        if r >= 0:
            tok[r] += lengths[d]
            pairs[r] += causal_pairs(lengths[d])
    return tok, pairs


def test_two_way_one_anchor_on_two_ranks_is_zigzag():
    """8 tokens, 2 ranks, no tails: 4 tokens and 18 pairs a rank. Rank 0 (outermost): base 26,
    slope -4, h = 2: [0, 2) + [6, 8); rank 1 the middle [2, 6)."""
    assert _flat([8], 2, [0], [-1]) == ([[0, 0, 2], [0, 6, 8], [0, 2, 6]], [0, 0, 1])


def test_two_way_one_anchor_on_three_ranks():
    """12 tokens over 3 ranks: 4 tokens and 26 pairs each. Rank 0: base 42, slope -8, h = 2;
    rank 1 in [2, 10): base 34, slope -4, h = 2; rank 2 the middle [4, 8)."""
    assert _flat([12], 3, [0], [-1]) == ([[0, 0, 2], [0, 10, 12], [0, 2, 4], [0, 8, 10], [0, 4, 8]],
                                         [0, 0, 1, 1, 2])


def test_two_way_a_tail_shifts_its_rank_to_more_head_and_fewer_pairs():
    """8 + 2 tokens, the 2-token tail (3 pairs) on rank 0: 5 tokens and 19.5 pairs a rank, so
    rank 0 needs 3 tokens and 16.5 pairs of the anchor: base 21, slope -5, h = round(0.9) = 1:
    [0, 1) + [6, 8) (16 pairs); rank 1 the middle [1, 6) (20 pairs)."""
    got = _flat([8, 2], 2, [0], [-1, 0])
    assert got == ([[0, 0, 1], [0, 6, 8], [0, 1, 6]], [0, 0, 1])
    assert _rank_tokens_and_pairs([8, 2], 2, [-1, 0], *got) == ([5, 5], [19, 20])


def test_two_way_lays_the_rank_furthest_from_its_target_outermost():
    """12 + 3 tokens over 3 ranks, the 3-token tail on rank 1: targets 28, 22, 28 pairs, mirrored
    shares 32.5, 13, 32.5 (5, 2, 5 tokens): rank 1 is furthest (9) and goes first: h = round(0.1)
    = 0, its 2 tokens the tail [10, 12); rank 0 in [0, 10): base 40, slope -5, h = round(2.4) = 2;
    rank 2 the middle [2, 7)."""
    got = _flat([12, 3], 3, [0], [-1, 1])
    assert got == ([[0, 0, 2], [0, 7, 10], [0, 10, 12], [0, 2, 7]], [0, 0, 1, 2])
    assert _rank_tokens_and_pairs([12, 3], 3, [-1, 1], *got) == ([5, 5, 5], [30, 29, 25])


def test_two_way_two_anchors_rounding_repaired_and_later_anchors_assumed_mirrored():
    """12 + 6 anchors and a 3-token tail on rank 2 over 3 ranks: 7 tokens and 35 pairs a rank,
    goal 7, 7, 4 anchor tokens. Per anchor in proportion: 12 -> 4.67, 4.67, 2.67 -> 5, 5, 2 (the
    ties to the first ranks); 6 -> 2.33, 2.33, 1.33 -> 3, 2, 1; rank 0 is a token over, rank 2
    one short: the over rank's largest share (anchor 12) gives it: 4, 5, 3 and 3, 2, 1.
    Anchor 12 is laid against the targets less anchor 6's mirrored pairs (10.5, 7, 3.5):
    24.5, 28, 25.5, order by distance from its own mirrored pairs (26, 32.5, 19.5): 2, 1, 0.
    Rank 2: base 33, slope -9, h = 1 (24 pairs); rank 1 in [1, 10): base 40, slope -4, h = 3
    (28); rank 0 the middle [4, 8) (26). Anchor 6 against what is left, 9, 7, 5: order 0, 2, 1;
    rank 0: base 15, slope -3, h = 2; rank 2 in [2, 5): base 5, slope -2, h = 0; rank 1 [2, 4)."""
    got = _flat([12, 6, 3], 3, [0, 1], [-1, -1, 2])
    assert got == ([[0, 4, 8], [1, 0, 2], [1, 5, 6], [0, 1, 4], [0, 8, 10], [1, 2, 4],
                    [0, 0, 1], [0, 10, 12], [1, 4, 5]], [0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert _rank_tokens_and_pairs([12, 6, 3], 3, [-1, -1, 2], *got) == ([7, 7, 7], [35, 35, 35])


def test_two_way_hands_the_odd_token_to_the_first_rank():
    """7 tokens over 2 ranks: goals 3.5 -> 4, 3 (the tie to rank 0); 14 pairs each: rank 0 base 22,
    slope -3, h = round(2.67) = 3: [0, 3) + [6, 7) (13 pairs); rank 1 [3, 6) (15)."""
    assert _flat([7], 2, [0], [-1]) == ([[0, 0, 3], [0, 6, 7], [0, 3, 6]], [0, 0, 1])


@pytest.mark.parametrize("min_chunk, want", [
    (1, ([[0, 0, 2], [0, 12, 16], [0, 2, 12]], [0, 0, 1])),  # h = round(1.8) = 2
    (3, ([[0, 0, 3], [0, 13, 16], [0, 3, 13]], [0, 0, 1])),  # 2 < 3: clipped to 3 + 3
    (4, ([[0, 10, 16], [0, 0, 10]], [0, 1])),                # 6 < 2 * 4 and h 2 < 4: all tail
    (6, ([[0, 10, 16], [0, 0, 10]], [0, 1])),
])
def test_two_way_cuts_no_chunk_under_min_chunk(min_chunk, want):
    """16 + 4 tokens, the 4-token tail (10 pairs) on rank 0: rank 0 needs 6 tokens and 63 pairs
    of the anchor: base 81, slope -10, h = 2 unclipped. Rank 1 (innermost) is never clipped."""
    assert _flat([16, 4], 2, [0], [-1, 0], min_chunk=min_chunk) == want


def test_two_way_min_chunk_keeps_the_whole_share_as_a_head_where_the_head_is_the_larger():
    """6 + 1 tokens, the 1-token tail on rank 0: goals 2.5 -> 3 (the tie to rank 0) and 3 anchor
    tokens, 11 pairs a rank: rank 0 needs 10 of the anchor: base 15, slope -3, h = round(1.67) = 2
    unclipped (head [0, 2), tail [5, 6)); min_chunk 2: the 1-token tail is under it and 3 < 4
    tokens cannot make two chunks, h >= 3 - h: all head, [0, 3)."""
    assert _flat([6, 1], 2, [0], [-1, 0]) == ([[0, 0, 2], [0, 5, 6], [0, 2, 5]], [0, 0, 1])
    assert _flat([6, 1], 2, [0], [-1, 0], min_chunk=2) == ([[0, 0, 3], [0, 3, 6]], [0, 1])


def test_two_way_a_rank_filled_by_its_tails_gets_no_anchor_chunk():
    """4 + 4 tokens, the second whole on rank 1: rank 1 has its 4 tokens and 10 pairs already
    (need 0 and 0: allowed), rank 0 takes the whole anchor; the per-rank lists keep rank 1's
    empty one."""
    assert _flat([4, 4], 2, [0], [-1, 1]) == ([[0, 0, 4]], [0])
    segs = _two_way_anchor_segments(np.array([4, 4]), 2, np.array([0]), np.array([-1, 1]), np.inf, 1)
    assert [s.tolist() for s in segs] == [[[0, 0, 4]], []]
    segs = _two_way_anchor_segments(np.array([4, 4]), 2, np.array([0]), np.array([-1, 0]), np.inf, 1)
    assert [s.tolist() for s in segs] == [[], [[0, 0, 4]]]


def test_two_way_anchor_segments_are_the_flat_split_rank_by_rank():
    segs = _two_way_anchor_segments(np.array([12, 3]), 3, np.array([0]), np.array([-1, 1]), np.inf, 1)
    assert [s.tolist() for s in segs] == [[[0, 0, 2], [0, 7, 10]], [[0, 10, 12]], [[0, 2, 7]]]
    assert _two_way_anchor_segments(np.array([2, 8]), 2, np.array([0]), np.array([-1, 0]), np.inf, 1) is None


@pytest.mark.parametrize("lengths, anchors, owner, cap", [
    ([2, 8], [0], [-1, 0], np.inf),                        # the tail has more than a rank's tokens
    ([4, 6, 1, 1, 1, 1, 1, 1], [0], [-1, 0, 1, 1, 1, 1, 1, 1], np.inf),  # 8 tokens each, but 21 > 18.5 pairs
    ([3, 3], [], [0, 1], np.inf),                          # nothing left to split
    ([8], [0], [-1], 3.0),                                 # 4 tokens a rank is over the cap
    ([7], [0], [-1], 3.0),                                 # ceil(3.5) = 4 > 3
])
def test_two_way_refuses_what_no_level_split_can_do(lengths, anchors, owner, cap):
    assert _flat(lengths, 2, anchors, owner, cap) is None


def test_two_way_cap_of_exactly_a_level_rank_is_kept():
    assert _flat([8], 2, [0], [-1], cap=4.0) == ([[0, 0, 2], [0, 6, 8], [0, 2, 6]], [0, 0, 1])
    assert _flat([7], 2, [0], [-1], cap=4.0) == ([[0, 0, 3], [0, 6, 7], [0, 3, 6]], [0, 0, 1])


def test_two_way_splits_an_anchor_of_one_token():
    """1 + 1 tokens, the second whole on rank 0: rank 1 needs the anchor's one token (1 pair)."""
    assert _flat([1, 1], 2, [0], [-1, 0]) == ([[0, 0, 1]], [1])


def test_two_way_hands_every_odd_token_out_and_rounds_half_to_even():
    """8 tokens over 3 ranks: goals 2.67 -> 3, 3, 2 (both odd tokens, to the first ranks), 12 pairs
    a rank. Mirrored shares 13.5, 13.5, 9: rank 2 is furthest and goes first: base 15, slope -6,
    h = round(0.5) = 0 (half to even): the tail [6, 8); rank 0 in [0, 6): base 15, slope -3,
    h = 1; rank 1 the middle [1, 4)."""
    assert _flat([8], 3, [0], [-1]) == ([[0, 0, 1], [0, 4, 6], [0, 1, 4], [0, 6, 8]], [0, 0, 1, 2])


def _shares(D, C, seg, rank):
    """(D, C) tokens of each document on each rank."""
    n = [[0] * C for _ in range(D)]
    for (d, s, e), r in zip(seg, rank):
        n[d][r] += e - s
    return n


def test_two_way_repairs_a_rank_over_its_total_that_is_not_rank_0():
    """Anchors 5 and 2 over 3 ranks: goals 2.33 -> 3, 2, 2; 5 -> 2.14, 1.43, 1.43 -> 2, 2, 1 (the
    odd token to the largest fraction, rank 1); 2 -> 0.86, 0.57, 0.57 -> 1, 1, 0: rank 1 is a token
    over, rank 2 one short; anchor 5 (the larger share on rank 1) gives it: 2, 1, 2 and 1, 1, 0.
    6 pairs a rank. Anchor 5: order 0, 1, 2; rank 0: base 9, slope -3, h = round(1.5) = 2 (half to
    even): [0, 2); rank 1 in [2, 5): base 5, slope -2, h = 0: [4, 5); rank 2 [2, 4). Anchor 2 against
    what is left (3, 1, -1): rank 0: h clipped to 0: [1, 2); rank 1 [0, 1)."""
    got = _flat([5, 2], 3, [0, 1], [-1, -1])
    assert got == ([[0, 0, 2], [1, 1, 2], [0, 4, 5], [1, 0, 1], [0, 2, 4]], [0, 0, 1, 1, 2])
    assert _shares(2, 3, *got) == [[2, 1, 2], [1, 1, 0]]


def test_two_way_hands_each_anchors_odd_tokens_by_its_own_fractions():
    """Anchors 5 and 2 over 2 ranks, min_chunk 2: goals 4, 3; 5 -> 2.86, 2.14 -> 3, 2; 2 -> 1.14,
    0.86 -> 1, 1 (the odd token to rank 1's larger fraction, though rank 0's share is larger).
    9 pairs a rank; anchor 5: rank 0 base 12, slope -2, h = 2 leaves a 1-token tail: all head
    [0, 3); rank 1 [3, 5); anchor 2: rank 0 h = 0: [1, 2); rank 1 [0, 1)."""
    got = _flat([5, 2], 2, [0, 1], [-1, -1], min_chunk=2)
    assert got == ([[0, 0, 3], [1, 1, 2], [0, 3, 5], [1, 0, 1]], [0, 0, 1, 1])


def test_two_way_repair_moves_one_token_at_a_time_from_the_largest_share():
    """Four 1-token anchors over 2 ranks: every odd token goes to rank 0 (ties), 4 over 2 and 2: the
    repair moves them one at a time (no anchor has more than its one token), from the largest share
    (the first of the ties): anchors 0 and 1 go to rank 1."""
    got = _flat([1, 1, 1, 1], 2, [0, 1, 2, 3], [-1, -1, -1, -1])
    assert got == ([[2, 0, 1], [3, 0, 1], [0, 0, 1], [1, 0, 1]], [0, 0, 1, 1])


def test_two_way_repair_takes_from_the_anchor_with_the_most_on_the_over_rank():
    """Anchors 18, 17, 1 over 4 ranks, min_chunk 2: goals 9 each; 18 -> 4.5 -> 5, 5, 4, 4; 17 -> 4.25
    -> 5, 4, 4, 4; 1 -> 1, 0, 0, 0: totals 11, 9, 8, 8. Rank 0 gives a token to rank 2 from anchor 18
    (5 there, the first of the largest), then one to rank 3 from anchor 17 (now the largest: 5 > 4),
    a token at a time (min of the excess, the shortfall and the share): 4, 5, 5, 4 / 4, 4, 4, 5 /
    1, 0, 0, 0. The segments: characterisation (the current output, checked by the shares)."""
    got = _flat([17, 1, 18], 4, [2, 0, 1], [-1, -1, -1], min_chunk=2)
    assert _shares(3, 4, *got) == [[4, 4, 4, 5], [1, 0, 0, 0], [4, 5, 5, 4]]
    assert got == ([[2, 0, 2], [2, 16, 18], [0, 0, 2], [0, 15, 17], [1, 0, 1], [2, 2, 5], [2, 14, 16], [0, 7, 11],
                    [2, 5, 8], [2, 12, 14], [0, 5, 7], [0, 11, 13], [2, 8, 12], [0, 2, 5], [0, 13, 15]],
                   [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3])


def test_two_way_repair_counts_each_move_off_the_excess():
    """Anchors 10 and 6 over 4 ranks, min_chunk 2: goals 4 each; 10 -> 3, 3, 2, 2; 6 -> 2, 2, 1, 1;
    totals 5, 5, 3, 3: rank 0 gives anchor 10's token to rank 2, rank 1 gives one to rank 3: 2, 2, 3,
    3 and 2, 2, 1, 1. The segments: characterisation, checked by the shares."""
    got = _flat([10, 6], 4, [0, 1], [-1, -1], min_chunk=2)
    assert _shares(2, 4, *got) == [[2, 2, 3, 3], [2, 2, 1, 1]]
    assert got == ([[0, 0, 2], [1, 4, 6], [0, 2, 4], [1, 2, 4], [0, 4, 7], [1, 1, 2], [0, 7, 10], [1, 0, 1]],
                   [0, 0, 1, 1, 2, 2, 3, 3])


def test_two_way_repair_of_seven_small_anchors():
    """Characterisation (found by a seeded search for inputs where the repair moves more than
    one rank's shortfall): seven anchors of 1-5 tokens over 3 ranks, min_chunk 2; every rank
    gets 6 tokens."""
    L = [2, 2, 1, 5, 5, 1, 2]
    got = _flat(L, 3, [3, 4, 0, 1, 6, 2, 5], [-1] * 7, min_chunk=2)
    assert got == ([[4, 4, 5], [0, 1, 2], [1, 1, 2], [6, 1, 2], [2, 0, 1], [5, 0, 1], [3, 4, 5], [4, 2, 4],
                    [0, 0, 1], [1, 0, 1], [6, 0, 1], [3, 0, 4], [4, 0, 2]],
                   [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
    assert _rank_tokens_and_pairs(L, 3, [-1] * 7, *got)[0] == [6, 6, 6]


def test_two_way_counts_the_pairs_of_the_tokens_before_a_rank():
    """3 tokens over 4 ranks: goals 0.75 -> 1, 1, 1, 0; 1.5 pairs a rank. Rank 0: base 3, slope -2,
    h = round(0.75) = 1: [0, 1); rank 1 in [1, 3): base P(3) - P(1) - 2 = 3, slope -1,
    h = round(1.5) = 2, clipped to its 1 token: [1, 2); rank 2 [2, 3)."""
    assert _flat([3], 4, [0], [-1]) == ([[0, 0, 1], [0, 1, 2], [0, 2, 3]], [0, 1, 2])


@pytest.mark.parametrize("lengths, owner, min_chunk, want", [
    # a 1-token head under min_chunk 2, 3 < 4 tokens: the smaller chunk goes, all tail
    ([1, 7], [0, -1], 2, ([[1, 4, 7], [1, 0, 4]], [0, 1])),
    # h = nr = 2 (all head): no empty tail to clip for, whatever min_chunk
    ([3], [-1], 1, ([[0, 0, 2], [0, 2, 3]], [0, 1])),
    # h = 1 of 2 under min_chunk 2, a tie of head and tail: the head kept, all head
    ([4], [-1], 2, ([[0, 0, 2], [0, 2, 4]], [0, 1])),
    # h = 3 of 4 leaves a 1-token tail under min_chunk 2, 4 >= 4 tokens: clipped to 4 - 2
    ([7], [-1], 2, ([[0, 0, 2], [0, 5, 7], [0, 2, 5]], [0, 0, 1])),
])
def test_two_way_min_chunk_clipping_at_its_edges(lengths, owner, min_chunk, want):
    """[1, 7], the 1-token tail on rank 0: rank 0 needs 3 tokens and 13.5 pairs of the 7: base 18,
    slope -4, h = 1. [3]: goals 2, 1, 3 pairs each: base 5, slope -1, h = 2. [4]: base 7, slope -2,
    h = 1. [7]: goals 4, 3: base 22, slope -3, h = 3."""
    anchors = [i for i, o in enumerate(owner) if o < 0]
    assert _flat(lengths, 2, anchors, owner, min_chunk=min_chunk) == want


def test_two_way_ties_in_the_distance_from_target_keep_rank_order():
    """Anchors 2 and 2 over 4 ranks, min_chunk 2: a token a rank, 1.5 pairs each; shares 0, 0, 1, 1
    and 1, 1, 0, 0 (the repair moves the first anchor's odd tokens from ranks 0 and 1). The second
    anchor's ranks 0 and 1 are both 0 from their targets: laid in rank order (a stable sort; numpy's
    default sort is not stable on ties here): rank 0 its tail [1, 2) (h = round(0.5) = 0), rank 1
    [0, 1)."""
    got = _flat([2, 2], 4, [0, 1], [-1, -1], min_chunk=2)
    assert got == ([[1, 1, 2], [1, 0, 1], [0, 1, 2], [0, 0, 1]], [0, 1, 2, 3])


def test_two_way_ties_in_an_anchors_odd_token_go_to_the_first_rank():
    """Anchors 3 and 3 over 4 ranks: goals 2, 2, 1, 1; each anchor 1, 1, 0.5, 0.5 -> its odd token to
    rank 2 (the first of the tied fractions, a stable sort); rank 2 is then a token over, rank 3
    short: the first anchor gives it, shares 1, 1, 0, 1 and 1, 1, 1, 0. The segments:
    characterisation, checked by the shares."""
    got = _flat([3, 3], 4, [0, 1], [-1, -1])
    assert _shares(2, 4, *got) == [[1, 1, 0, 1], [1, 1, 1, 0]]
    assert got == ([[0, 0, 1], [1, 1, 2], [0, 1, 2], [1, 0, 1], [1, 2, 3], [0, 2, 3]], [0, 0, 1, 1, 2, 3])

"""Tests that kill survivors of the twenty-fourth mutation pass over ``atac_hf/sharding/two_way.py``
(issue 20: mutmut over every mutant of ``_two_way_flat``).

Both pin that the two-way split counts causal pairs exactly where the documents are large: the pairs
of a document of ``n`` tokens, P(n) = n(n + 1)/2, pass 2**53 at about 1.34e8 tokens, and float64 holds
only every 2nd integer in [2**53, 2**54) and every 4th in [2**54, 2**55) (``check_doc_lengths`` takes
documents up to 2**62 tokens). Counted exactly, the packs below split level in tokens *and* pairs, as the
docstring of ``_two_way_anchor_segments`` promises; a float count a few pairs off breaks the tie between
the two ranks' distances from their targets and leaves them unlevel.

At cp 2 the two ranks are always exactly equally far from their pair targets: their needs sum to the
anchors' pairs, as do their mirrored shares, so the distances are x and -x. The tie keeps rank order
(``kind="stable"``): rank 0 takes every anchor's outer (head and tail) chunks, rank 1 the middle.
"""

from __future__ import annotations

import numpy as np

from atac_hf.sharding.two_way import _two_way_anchor_segments, _two_way_flat
from test_mutants_two_way import _rank_tokens_and_pairs  # noqa: E402


def P(n: int) -> int:
    """Causal pairs of a prefix of ``n`` tokens, in Python ints (exact)."""
    return n * (n + 1) // 2


def _split(lengths, anchors, owner, C=2):
    got = _two_way_flat(np.array(lengths, dtype=np.int64), C, np.array(anchors, dtype=np.int64),
                        np.array(owner, dtype=np.int64), np.inf, 1)
    assert got is not None
    seg, rank = got
    assert seg.dtype == np.int64 and rank.dtype == np.int64
    return seg.tolist(), rank.tolist()


def _tokens_and_pairs(lengths, owner, seg, rank, C=2):
    """Every rank's tokens and causal pairs (its anchor chunks and its whole tails), exactly (Python ints)."""
    return _rank_tokens_and_pairs(lengths, C, owner, seg, rank)


def test_a_large_anchor_zigzag_leaves_the_next_anchor_an_exact_tie():
    """Anchors of 4q = 131,028,324 and 4 tokens on 2 ranks, no tails (q = 32,757,081): 2q + 2 tokens
    and 4q^2 + q + 5 pairs a rank (the pack's P(4q) + 10 = 8,584,210,910,638,660 pairs, under 2**53).
    Anchor 4q first, 2q tokens each; both ranks are 0 from their targets (4q^2 + q, their mirrored
    shares), rank 0 outer: base P(4q) - P(2q) = 6q^2 + q, slope -2q, h = q: [0, q) + [3q, 4q), the
    zigzag, 4q^2 + q pairs; rank 1 the middle [q, 3q), 4q^2 + q as well. So each rank needs 5 more
    pairs, the mirrored share of the 4-token anchor: a tie again, rank 0 outer: base 7, slope -2,
    h = 1: [0, 1) + [3, 4) (5 pairs), rank 1 [1, 3) (5 pairs). Every rank level in tokens and pairs.

    Rank 0's pairs from anchor 4q are counted in Python ints: in float64 the partial sum
    q(q + 1) + 4q(4q + 1) = 17q^2 + 5q = 18,241,448,209,674,942 is over 2**54 and not a multiple of 4,
    so a float count is a pair off, the tie breaks toward rank 1 and the 4-token anchor leaves the
    ranks 3 and 7 pairs (mutmut 69: the token shares ``n`` as float64, making every count a float)."""
    q = 32_757_081
    lengths, owner = [4 * q, 4], [-1, -1]
    seg, rank = _split(lengths, [0, 1], owner)
    assert seg == [[0, 0, q], [0, 3 * q, 4 * q], [1, 0, 1], [1, 3, 4], [0, q, 3 * q], [1, 1, 3]]
    assert rank == [0, 0, 0, 0, 1, 1]
    assert _tokens_and_pairs(lengths, owner, seg, rank) == ([2 * q + 2] * 2, [4 * q * q + q + 5] * 2)
    # the per-rank form agrees
    per_rank = _two_way_anchor_segments(np.array(lengths, dtype=np.int64), 2, np.array([0, 1]),
                                        np.array(owner, dtype=np.int64), np.inf, 1)
    assert [s.tolist() for s in per_rank] == [seg[:4], seg[4:]]


def test_the_pack_pair_total_is_summed_exactly_before_it_is_shared():
    """An anchor of A = 2b + 12 tokens (b = 110,428,088) and a 12-token tail (78 pairs) on rank 1, 2
    ranks: 110,428,100 tokens a rank, so rank 0 takes b + 12 anchor tokens and rank 1 b. Each rank's
    pair need is half the pack's P(A) + 78 less its tails' pairs; their distances from the mirrored
    shares are -662,568,528 and +662,568,528, a tie: rank 0 outer. Its pairs with a head of h are
    P(A) - b*h - P(b); setting them to (P(A) + 78) / 2 gives h = b/2 + 12 = 55,214,056, so rank 0 holds
    [0, 55214056) + [165642144, A) and rank 1 the middle: both exactly 12,194,363,999,686,922 pairs.

    P(A) = 24,388,727,999,373,766 is not a float64 (over 2**54, 2 mod 4); the pack's total
    24,388,727,999,373,844 is. Summed from per-document float pairs the total comes out 4 high, both
    targets 2 high, rank 1 is laid outer and the ranks end 144 pairs apart (mutmut 2: the lengths as
    float64, ``lengths.astype(None)``, so the pairs are summed as floats)."""
    b = 110_428_088
    A = 2 * b + 12
    lengths, owner = [A, 12], [-1, 1]
    seg, rank = _split(lengths, [0], owner)
    assert seg == [[0, 0, b // 2 + 12], [0, A - b // 2, A], [0, b // 2 + 12, A - b // 2]]
    assert rank == [0, 0, 1]
    tok, pairs = _tokens_and_pairs(lengths, owner, seg, rank)
    assert tok == [b + 12] * 2
    assert pairs == [(P(A) + P(12)) // 2] * 2 == [12_194_363_999_686_922] * 2

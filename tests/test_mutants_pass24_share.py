"""Mutation pass 24: kills ``_split_by_share`` survivors of the twenty-fourth mutation pass
(mutmut names ``atac_hf.sharding.atp.x__split_by_share__mutmut_N``; issue 20, docs/TESTING.md).

``_split_by_share`` gives rank r about ``frac[r]`` of each anchor's tokens with no rank over its
``room``: shares over a room by more than a rounding error (``min(0.5, 1e-9 x tokens)``) are
clipped and their excess handed to the ranks with room by share; then each document is floored
and its remainder handed out in three passes (largest fraction first; one more token to the
lowest ranks with any room left; several tokens a rank, lowest first). Direct calls under a
model that prices tokens only (the costs play no part here); each test works its case by hand.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding.atp import _split_by_share

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
# attention pairs at 1 s each, no token-wise price; one K/V byte a token over an 8 byte/s link
PAIRS = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=8.0,
                  link_latency_s=0.0)


def _split(lengths, frac, room):
    return _split_by_share(LINEAR, np.array(lengths, dtype=np.int64), np.asarray(frac, dtype=np.float64),
                           np.array(room, dtype=np.int64))


def _shares(*weights):
    return np.array(weights, dtype=np.float64) / sum(weights)


def _check_fits(got, lengths, room):
    """The split exists, places every token of every document once and keeps each rank within
    its room; its bounds are int64 head-tail cuts that end at each document's length."""
    assert got is not None
    bounds, n, _ = got
    assert (n >= 0).all() and n.sum(axis=1).tolist() == list(lengths)
    assert (n.sum(axis=0) <= np.asarray(room)).all()
    assert bounds.dtype == np.int64 and bounds[:, -1].tolist() == list(lengths)
    return n.tolist()


def test_an_exact_fit_is_split_though_its_shares_round_one_ulp_over_a_room():
    """Rooms 2,855 and 1,549 hold a 4,404-token document exactly; at shares room / tokens (what
    levelled loads give) 2855 / 4404 x 4404 is 2855.0000000000005, one float64 ulp (4.5e-13) over
    the room. That is a rounding error, within the tolerance 1e-9 x 4404 = 4.4e-6: the split is
    [2855, 1549]. Pins the fix of c4777de (an exact fit refused turned away an anchor that fits)
    at a size where the ulp error is larger than a tolerance scaled down by the tokens.

    Kills mutant 13 (``tol = min(0.5, 1e-9 / total)``: 2.3e-13 < one ulp, so rank 0 is clipped;
    rank 1 is at its room, not free, and the split returns None)."""
    frac = np.array([2855, 1549]) / 4404
    assert frac[0] * 4404 > 2855  # the rounding the tolerance is there for
    assert _check_fits(_split([4404], frac, [2855, 1549]), [4404], [2855, 1549]) == [[2855, 1549]]


def test_a_share_exactly_the_tolerance_over_its_room_is_not_clipped():
    """The clip is strict: a share ``room + tol`` is within its room. 1,000 tokens, tolerance
    1e-9 x 1000; rank 0's share 0.300000001 gives 300 + tol exactly (in float64), rooms 300, 1000,
    1000. Kept as given, the shares floor to [300, 100, 599] and the odd token goes to the largest
    fraction, rank 1's 0.49999955 (rank 2's is 0.49999945): [300, 101, 599]. The boundary is
    reached only by construction; the test pins where the tolerance ends (a share is clipped,
    and other ranks' shares changed, only beyond it).

    Kills mutant 17 (``>=``: rank 0 clipped, its 1e-6 handed to ranks 1 and 2 by share, about
    0.14 : 0.86, lifts rank 2's fraction over rank 1's: [300, 100, 600]); mutant 13 too (a
    tolerance of 1e-12 clips rank 0 the same way)."""
    total = 1000
    frac = np.array([0.300000001, 0.10049999955, 0.59949999945])
    assert frac[0] * total == 300 + min(0.5, 1e-9 * total)  # exactly on the boundary
    room = [300, 1000, 1000]
    assert _check_fits(_split([total], frac, room), [total], room) == [[300, 101, 599]]


def test_a_share_a_fraction_of_a_token_over_its_room_hands_the_excess_on_by_share():
    """10 tokens at shares 0.33, 0.14, 0.53 with rooms 3, 10, 10: rank 0 wants 3.3, 0.3 over its
    room, far more than a rounding error (1e-9 x 10). It is clipped to 3 and its 0.3 goes to ranks
    1 and 2 in proportion 0.14 : 0.53: 1.4627 and 5.5373, so the odd token is rank 2's: [3, 1, 6]
    (the nearest integers to the clipped shares). The tolerance is for float rounding only; a
    share that is really over its room must move its excess to the ranks that have room.

    Kills mutant 14 (``tol = min(0.5, 1.000000001 * total)``, half a token at every size: rank 0
    stays at 3.3, floors [3, 1, 5], rank 0 has no room for its 0.3 and rank 1's 0.4 takes the odd
    token: [3, 2, 5])."""
    room = [3, 10, 10]
    assert _check_fits(_split([10], [0.33, 0.14, 0.53], room), [10], room) == [[3, 1, 6]]


def test_a_huge_document_keeps_every_rank_within_its_room():
    """The tolerance is capped at half a token: a floor of a share at most half a token over an
    integer room is the room. A 2e9-token document (documents up to 2**62 tokens are accepted) at
    shares 0.5 +- 6e-10 wants 1e9 + 1.2 and 1e9 - 1.2 tokens over rooms of 1e9 each: rank 0 is 1.2
    over, clipped, and the split is [1e9, 1e9].

    Kills mutant 12 (``min(1.5, ...)``: the tolerance is 1.5 tokens from 1.5e9 tokens up; rank 0
    keeps 1e9 + 1.2, floored to 1e9 + 1, one token over its room)."""
    n = 10**9
    room = [n, n]
    assert _check_fits(_split([2 * n], [0.5 + 0.6e-9, 0.5 - 0.6e-9], room), [2 * n], room) == [[n, n]]


def test_a_remainder_token_goes_to_the_lowest_rank_with_any_room_one_token_included():
    """Documents of 5 and 13 tokens at shares 3:3:4:4:9 with rooms 6, 8, 2, 2, 3. Ranks 2-4 want
    3.13, 3.13 and 7.04 tokens: clipped to their rooms, the excess goes to ranks 0 and 1 (equal
    shares): 5.5 each. Document 0 floors to [1, 1, 0, 0, 0] and document 1 to [3, 3, 1, 1, 2],
    leaving rooms 2, 4, 1, 1, 1; document 0's 3 remainder tokens go to its largest fractions,
    ranks 4 (0.83), 2 and 3 (0.56), filling them. Document 1's 3 go to ranks 0 and 1 (0.97 each)
    and one is left with only ranks 0 (one token of room left) and 1 (three) to take it: the
    second pass gives it to the lowest rank with any room, rank 0: [5, 4, 1, 1, 2]. Ranks 0 and 1
    end at 6 and 5 tokens (wanted 5.5 each): where ranks tie, the lowest takes the token, as in the
    first pass, and a rank with exactly one token of room is a rank with room.

    Kills mutants 89 (``left[q] > 1``) and 90 (``left[q] >= 2``): both skip rank 0 and give the
    token to rank 1, [4, 5, 1, 1, 2]."""
    room = [6, 8, 2, 2, 3]
    got = _check_fits(_split([5, 13], _shares(3, 3, 4, 4, 9), room), [5, 13], room)
    assert got == [[1, 1, 1, 1, 1], [5, 4, 1, 1, 2]]


def test_the_later_remainder_passes_book_every_token_they_hand_out():
    """Twelve 5-token documents over 7 ranks at shares 3:1:3:2:3:2:3, rooms 10, 3, 10, 7, 10, 10,
    10 (60 tokens: an exact fit). The shares over their rooms are clipped and rank 5 takes their
    excess: every rank wants exactly its room, each document 5/60 of it (0.83 on ranks 0, 2, 4,
    5, 6; 0.58 on rank 3; 0.25 on rank 1), all floored to 0. The first ten documents give their 5
    tokens to the five 0.83 ranks, which are then full. Document 10: first pass ranks 3 and 1,
    second pass ranks 1 and 3 again, third pass rank 1's last token: [0, 3, 0, 2, 0, 0, 0].
    Document 11 has only rank 3 left (5 tokens of room): all 5 there. The second and third passes
    must count the room they use, or a later document is refused (the split fits) or put over a
    room (a rank over its cap).

    Kills mutants 94 (second pass ``left[r] = 1``: None), 95 (``left[r] += 1``: rank 1 over its
    room), 96 (``left[r] -= 2``: None), 114 (third pass ``left[r] = take``: rank 1 over) and 115
    (``left[r] += take``: rank 1 gets 2 of document 11, 5 tokens over a room of 3)."""
    room = [10, 3, 10, 7, 10, 10, 10]
    got = _check_fits(_split([5] * 12, _shares(3, 1, 3, 2, 3, 2, 3), room), [5] * 12, room)
    assert got[:10] == [[1, 0, 1, 0, 1, 1, 1]] * 10
    assert got[10:] == [[0, 3, 0, 2, 0, 0, 0], [0, 0, 0, 5, 0, 0, 0]]


def test_bounds_are_int64_and_hold_every_token_of_a_document_over_2_53():
    """Documents up to 2**62 tokens are accepted, and a chunk bound past 2**53 may have no float64
    value. The split's bounds are int64 head-tail cuts ending at the document's length: 2**53 + 1
    tokens at shares 1/2, 1/2 is 2**52 + 1 and 2**52 tokens (heads 2**51 + 1 and 2**51), the last
    cut 2**53 + 1. The plan's segments are built from these bounds: a bound off by one drops a
    token from the plan (at b5fb7ec, ATP's plan of ``[2**53 + 1, 3]`` at cp 2 under PAIRS did).

    Kills mutants 140 (``np.zeros(..., dtype=None)``) and 142 (no dtype): float64 bounds, the last
    one 2**53."""
    n = 2**53 + 1
    bounds, tok, _ = _split_by_share(PAIRS, np.array([n]), np.array([0.5, 0.5]), np.full(2, np.inf))
    assert bounds.dtype == np.int64
    assert bounds.tolist() == [[0, 2**51 + 1, 2**52 + 1, 3 * 2**51 + 1, n]]
    assert tok.tolist() == [[2**52 + 1, 2**52]]

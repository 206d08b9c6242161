"""Mutation pass 23: survivors of ``atac_hf/sharding/exchange.py`` (``_ranges``, ``_overlaps``).

Each test names the mutants it kills (mutmut names, module ``atac_hf.sharding.exchange``) and
works its expected values by hand. Empty segments ``(d, x, x)`` are legal anywhere
(``ShardPlan.validate``), and one of a gathered document makes its rank need ``[0, x)``
(``[x - W + 1, x)`` under a window ``W``): the runtime's tables and the pricing agree on that.
"""

from __future__ import annotations

import numpy as np
import torch

from atac_hf.attention import emulate_cp_attention, varlen_attention_reference
from atac_hf.sharding import ShardPlan
from atac_hf.sharding.exchange import (_overlaps, _ranges, a2a_pair_counts, a2a_pair_counts_flat, a2a_rows,
                                       needed_ranges)


def hand_plan(lengths, segments, gathered_docs) -> ShardPlan:
    plan = ShardPlan(doc_lengths=np.array(lengths), cp_size=len(segments), strategy="x",
                     segments=tuple(np.array(s, dtype=np.int64).reshape(-1, 3) for s in segments),
                     gathered_docs=np.array(gathered_docs), rank_compute_s=np.ones(len(segments)),
                     kv_exchange="all_to_all")
    plan.validate()
    return plan


def test_an_empty_segment_inside_the_ranks_own_chunk_does_not_shrink_its_windowed_range():
    """Kills ``x__ranges__mutmut_46`` (``lexsort((r[:, 2], r[:, 0]))``: ranges sorted by their end
    instead of their start before the running-max merge).

    One document of 20 tokens, window 3; rank 1 holds ``[0, 10)``, rank 0 holds ``[10, 20)`` and an
    empty segment ``(0, 15, 15)`` (legal anywhere). Rank 0's chunk attends to keys
    ``[10 - 3 + 1, 20) = [8, 20)``, the empty one to ``[13, 15)`` (inside): the union is
    ``[8, 20)``, so rank 1 sends its local rows 8 and 9. Sorted by end, ``[13, 15)`` came first and
    the merge kept its start: ``[13, 20)``, and rank 1 sent nothing, leaving rank 0's first queries
    (10 and 11) without keys 8 and 9. Only empty segments make end order differ from start order
    (disjoint non-empty chunks are ordered alike by both)."""
    segments = ([[0, 10, 20], [0, 15, 15]], [[0, 0, 10]])
    g = np.array([True])
    assert needed_ranges(np.array(segments[0]), g, 3) == {0: [(8, 20)]}
    assert _ranges(np.array(segments[0]), g, 3).tolist() == [[0, 8, 20]]
    segs = [np.array(s) for s in segments]
    rows, docs, pos = a2a_rows(segs, g, 1, 0, 3)
    assert rows.tolist() == [8, 9] and docs.tolist() == [0, 0] and pos.tolist() == [8, 9]
    assert a2a_pair_counts(segs, g, 3).tolist() == [[0, 0], [2, 0]]
    # end to end: the emulated CP attention over this plan is exact under the window
    plan = hand_plan([20], segments, [0])
    gen = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(h, 20, 8, generator=gen, dtype=torch.float64) for h in (2, 2, 2))
    cu = torch.tensor([0, 20])
    ref = varlen_attention_reference(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), cu, cu,
                                     window=3, scaling=0.3)
    out = emulate_cp_attention(q, k, v, plan, backend="varlen_reference", scaling=0.3, window=3)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_an_empty_prefix_segment_after_the_longest_range_needs_no_key():
    """Kills ``x__ranges__mutmut_54`` (the per-document shift ``(d - d0) * (max_end - 1)`` instead of
    ``(max_end + 1)``: too small to reset the running max of the ends at a document change).

    Documents of 4 and 4 tokens, both gathered; rank 0 holds ``(0, 0, 4)`` and an empty
    ``(1, 0, 0)``, rank 1 holds ``(1, 0, 4)``. Rank 0 needs ``[0, 4)`` of document 0 and the empty
    prefix ``[0, 0)`` of document 1: rank 1 sends it nothing, as the (vectorised, unwindowed)
    pricing says. With the mutant the shift of document 1 was 3, the running max carried
    document 0's end 4 into it (4 - 3 = 1) and the table sent a row the pricing did not count."""
    segments = [np.array([[0, 0, 4], [1, 0, 0]]), np.array([[1, 0, 4]])]
    g = np.array([True, True])
    hand_plan([4, 4], segments, [0, 1])
    assert needed_ranges(segments[0], g) == {0: [(0, 4)], 1: [(0, 0)]}
    assert _ranges(segments[0], g, None).tolist() == [[0, 0, 4], [1, 0, 0]]
    rows, docs, pos = a2a_rows(segments, g, 1, 0)
    assert rows.tolist() == [] and docs.tolist() == [] and pos.tolist() == []
    # the runtime's tables move what the planner priced
    assert a2a_pair_counts(segments, g).tolist() == [[0, 0], [0, 0]]


def test_ranges_of_no_gathered_segment_are_an_empty_int64_n_by_3_array():
    """Kills ``x__ranges__mutmut_13`` / ``_15`` (the empty result as float64) and ``_17`` (as a
    ``(0, 4)`` array). ``_ranges`` returns ``(n, 3)`` ``(doc, lo, hi)`` integer rows whatever ``n``;
    ``routing.routed_pair_counts`` computes owners and documents from its column 0 with integer
    ``//`` and ``%`` and indexes with them, so an empty result must keep the non-empty one's type."""
    g = np.array([False, True])
    for seg in (np.array([[0, 0, 4]]), np.zeros((0, 3), np.int64)):
        for window in (None, 3):
            out = _ranges(seg, g, window)
            assert out.shape == (0, 3) and out.dtype == np.int64
    full = _ranges(np.array([[1, 2, 4]]), g, 3)
    assert full.tolist() == [[1, 0, 4]] and full.dtype == np.int64


def test_overlaps_with_range_returns_four_arrays_when_nothing_overlaps():
    """Kills ``x__overlaps__mutmut_11`` and ``_44`` (the two early returns give three arrays
    ``(i, a, b)`` where ``with_range`` asks for ``(i, j, a, b)``, as ``routing.routed_pair_counts``
    unpacks them). Early return 1: no segments or no ranges; early return 2: no range of any
    segment's document (segment of document 1, range of document 0)."""
    z = np.zeros((0, 3), np.int64)
    ranges = np.array([[0, 0, 5]])
    seg = np.array([[1, 0, 5]])
    for src, rng in ((z, ranges), (seg, z), (z, z), (seg, ranges)):
        got = _overlaps(src, rng, with_range=True)
        assert len(got) == 4 and all(len(x) == 0 and x.dtype == np.int64 for x in got)
        assert len(_overlaps(src, rng)) == 3
    # and one that overlaps: segment 0 = (0, 2, 9) with range 0 = [0, 5): [2, 5)
    i, j, a, b = _overlaps(np.array([[0, 2, 9]]), ranges, with_range=True)
    assert (i.tolist(), j.tolist(), a.tolist(), b.tolist()) == ([0], [0], [2], [5])


def test_flat_pair_counts_with_nothing_to_exchange_are_int64_zeros_like_a2a_pair_counts():
    """Kills ``x_a2a_pair_counts_flat__mutmut_1`` (the early result ``None``) and ``_3`` / ``_5`` (a
    float64 one). ``a2a_pair_counts_flat`` is :func:`a2a_pair_counts` on the flat segments, a
    ``(C, C)`` int64 matrix: with no gathered document (nothing moves) or a single rank (no one to
    send to) every count is 0. The planner reaches it only with 2+ ranks and gathered documents;
    its callers price the result as a matrix (``CostModel.a2a_pair_cost``)."""
    segments = [np.array([[0, 0, 4]]), np.array([[1, 0, 3], [2, 0, 2]])]
    allseg, rank_of = np.concatenate(segments), np.array([0, 1, 1])
    for window in (None, 3):
        none = np.zeros(3, dtype=bool)
        got = a2a_pair_counts_flat(allseg, rank_of, 2, none, window, segments)
        assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.tolist() == [[0, 0], [0, 0]]
        assert got.tolist() == a2a_pair_counts(segments, none, window).tolist()
        one = [allseg]
        got = a2a_pair_counts_flat(allseg, np.zeros(3, np.int64), 1, np.ones(3, bool), window, one)
        assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.tolist() == [[0]]
    # and with something to move: rank 1's (1, 0, 3) is document 1, not gathered; document 0 is,
    # but rank 1 holds none of it: nothing moves; gather document 1 and split it: rank 0 needs [0, 3)
    split = [np.array([[0, 0, 4], [1, 3, 5]]), np.array([[1, 0, 3], [2, 0, 2]])]
    g = np.array([False, True, False])
    got = a2a_pair_counts_flat(np.concatenate(split), np.array([0, 0, 1, 1]), 2, g, None, split)
    assert got.dtype == np.int64 and got.tolist() == [[0, 0], [3, 0]] == a2a_pair_counts(split, g).tolist()

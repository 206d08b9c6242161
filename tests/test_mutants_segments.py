"""Tests that kill the mutmut survivors in ``atac_hf/sharding/segments.py`` (issue 20):
:func:`fill_empty_ranks` (when it leaves a plan alone, which rank gives tokens, how the cut is
found, which documents end up gathered, which exchange the filled plan uses) and
:func:`finish_flat` (its default exchange, the deferred all-to-all choice, the one-rank plan,
the compute bound, the sliding window in the all-to-all price).

Every case is built by hand on a cost model whose prices are powers of two or halves, so the
expected seconds are exact; they are worked out in the comments, never with the code under
test. docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import math

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding import ShardPlan
from atac_hf.sharding.segments import fill_empty_ranks, finish_flat, finish_plan, resolve_exchange

#: tile 1 (exact pairs); the K/V link: 0.25 s latency per peer, 1 byte per token at 1 byte/s, so
#: the all-gather of K tokens at C ranks costs 2 (0.25 (C - 1) + K (C - 1) / C) and an
#: all-to-all whose busiest rank moves m rows 2 (0.25 (C - 1) + m).
LINK = dict(tile=1, kv_bytes_per_token=1.0, link_bandwidth=1.0, link_latency_s=0.25)
CM = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, **LINK)


def _seg(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _hand_plan(lengths, segments, gathered=(), strategy="hand", exchange="all_gather") -> ShardPlan:
    return ShardPlan(doc_lengths=np.array(lengths, dtype=np.int64), cp_size=len(segments), strategy=strategy,
                     segments=tuple(_seg(*s) for s in segments), gathered_docs=np.array(gathered, dtype=np.int64),
                     rank_compute_s=np.zeros(len(segments)), kv_exchange=exchange)


def _segs(plan: ShardPlan) -> list:
    return [s.tolist() for s in plan.segments]


# ---------------------------------------------------------------------------- fill_empty_ranks


def test_fill_empty_ranks_returns_a_plan_that_fills_every_rank_itself():
    """A plan whose every rank holds a token (here one rank holds exactly 1) comes back as the
    same object, not re-costed: plan_shards tells a filled plan by identity."""
    p = _hand_plan([1, 3], [[(0, 0, 1)], [(1, 0, 3)]])
    assert fill_empty_ranks(p, CM) is p
    one = _hand_plan([3], [[(0, 0, 3)]])
    assert fill_empty_ranks(one, CM) is one


def test_fill_empty_ranks_fills_a_pack_of_exactly_cp_size_tokens():
    """Two tokens on two ranks, both on rank 0: rank 1 takes the second one, cut out of the
    segment [0, 2), and the document is then gathered."""
    q = fill_empty_ranks(_hand_plan([2], [[(0, 0, 2)], []]), CM)
    assert _segs(q) == [[[0, 0, 1]], [[0, 1, 2]]]
    assert q.gathered_docs.tolist() == [0]
    q.validate()


def test_fill_empty_ranks_takes_from_the_richest_rank_after_each_fill():
    """doc 0 (8 tokens) all on rank 1 of 3. Rank 0 takes rank 1's second half [4, 8); ranks 0
    and 1 then hold 4 each, and the tie goes to the lower rank: rank 2 takes rank 0's second
    half [6, 8) (a rank just filled can give again)."""
    q = fill_empty_ranks(_hand_plan([8], [[], [(0, 0, 8)], []]), CM)
    assert _segs(q) == [[[0, 4, 6]], [[0, 0, 4]], [[0, 6, 8]]]
    q.validate()


def test_fill_empty_ranks_counts_segments_from_the_end_by_their_own_tokens():
    """Rank 0 holds doc 0 [0, 4), doc 1 [2, 3), doc 2 [2, 3) (6 tokens; the last two do not
    start their document), rank 1 the starts of docs 1 and 2, rank 2 nothing. Rank 2 takes 3
    tokens from rank 0's end: the two 1-token segments whole and 1 token cut from doc 0."""
    q = fill_empty_ranks(_hand_plan([4, 3, 3], [[(0, 0, 4), (1, 2, 3), (2, 2, 3)], [(1, 0, 2), (2, 0, 2)], []]), CM)
    assert _segs(q) == [[[0, 0, 3]], [[1, 0, 2], [2, 0, 2]], [[0, 3, 4], [1, 2, 3], [2, 2, 3]]]
    assert q.gathered_docs.tolist() == [0, 1, 2]
    q.validate()


def test_fill_empty_ranks_gathers_only_the_documents_it_splits():
    """Docs [4, 4] both whole on rank 0 of 2: rank 1 takes doc 1 whole, so no document is held
    by two ranks and none is gathered."""
    q = fill_empty_ranks(_hand_plan([4, 4], [[(0, 0, 4), (1, 0, 4)], []], strategy="per_doc"), CM)
    assert _segs(q) == [[[0, 0, 4]], [[1, 0, 4]]]
    assert q.gathered_docs.tolist() == []


def test_fill_empty_ranks_keeps_the_documents_the_plan_gathers():
    """The same fill of a plan that gathers every document (as zigzag does) still gathers both,
    though neither is split."""
    q = fill_empty_ranks(_hand_plan([4, 4], [[(0, 0, 4), (1, 0, 4)], []], gathered=[0, 1], strategy="zigzag"), CM)
    assert _segs(q) == [[[0, 0, 4]], [[1, 0, 4]]]
    assert q.gathered_docs.tolist() == [0, 1]


def _filled(strategy: str, exchange: str = "all_gather") -> ShardPlan:
    # docs [2, 8] whole on rank 0 of 2 (10 tokens): rank 1 takes 5 from the end, doc 1 [3, 8),
    # and doc 1 is gathered. All-gather: 2 (0.25 + 8 / 2) = 8.5 s. All-to-all: rank 1 needs doc
    # 1's keys [0, 3) from rank 0, rank 0 nothing: 2 (0.25 + 3) = 6.5 s
    q = fill_empty_ranks(_hand_plan([2, 8], [[(0, 0, 2), (1, 0, 8)], []], strategy=strategy, exchange=exchange), CM)
    assert _segs(q) == [[[0, 0, 2], [1, 0, 3]], [[1, 3, 8]]]
    assert q.gathered_docs.tolist() == [1]
    return q


def test_fill_empty_ranks_reprices_an_atp_plan_for_the_all_to_all():
    """atp picks its exchange by estimate: its filled plan takes the all-to-all where that is
    now faster (6.5 s against the all-gather's 8.5 s), though it came in as an all-gather plan."""
    q = _filled("atp")
    assert (q.kv_exchange, q.comm_s, q.strategy) == ("all_to_all", 6.5, "atp")


def test_fill_empty_ranks_keeps_a_baselines_exchange():
    """A baseline's plan keeps its exchange through the fill: the all-gather (8.5 s) even where
    the all-to-all would be faster; an all-to-all plan stays one."""
    q = _filled("zigzag")
    assert (q.kv_exchange, q.comm_s, q.strategy) == ("all_gather", 8.5, "zigzag")
    q = _filled("per_doc", "all_to_all")
    assert (q.kv_exchange, q.comm_s) == ("all_to_all", 6.5)


# ---------------------------------------------------------------------------- finish_flat / finish_plan


def test_finish_flat_without_an_exchange_uses_the_all_gather():
    """finish_flat's default exchange is the all-gather, even where the all-to-all is cheaper
    (the segments of the fill above: 6.5 s against 8.5 s)."""
    allseg = _seg((0, 0, 2), (1, 0, 3), (1, 3, 8))
    p = finish_flat(np.array([2, 8], dtype=np.int64), 2, "hand", allseg, np.array([0, 0, 1]), None, CM)
    assert (p.kv_exchange, p.comm_s, p.kv_window) == ("all_gather", 8.5, None)
    assert p.gathered_docs.tolist() == [1]


def test_finish_flat_defers_the_all_to_all_where_the_all_gather_is_just_hidden():
    """Docs [8, 1, 1] on 2 ranks: rank 0 holds doc 0 [0, 2) and doc 1, rank 1 doc 0 [2, 8) and
    doc 2; doc 0 gathered. Attention costs only its 8.5 s per call, so each rank's local
    attention (one 1-token document) is 8.5 s, exactly the all-gather's 2 (0.25 + 8 / 2) = 8.5 s:
    hidden on every rank (<=). With defer_a2a the plan says all-gather and the all-to-all
    (rank 1 needs doc 0's keys [0, 2): 2 (0.25 + 2) = 4.5 s) is costed by resolve_exchange;
    the block time is the same either way (rank 1: 6 + 8.5 + 1 + 8.5 = 24 s)."""
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, segment_overhead_s=8.5, **LINK)
    lengths = np.array([8, 1, 1], dtype=np.int64)
    allseg, rank_of = _seg((0, 0, 2), (1, 0, 1), (0, 2, 8), (2, 0, 1)), np.array([0, 0, 1, 1])
    p = finish_flat(lengths, 2, "hand", allseg, rank_of, np.array([0]), cm, "auto", defer_a2a=True)
    assert (p.kv_exchange, p.comm_s, p.block_time_s) == ("all_gather", 8.5, 24.0)
    q = resolve_exchange(p, cm)
    assert (q.kv_exchange, q.comm_s, q.block_time_s) == ("all_to_all", 4.5, 24.0)
    assert resolve_exchange(q, cm) is q  # decided once
    # not deferred: the all-to-all is chosen at once
    now = finish_flat(lengths, 2, "hand", allseg, rank_of, np.array([0]), cm, "auto")
    assert (now.kv_exchange, now.comm_s, now.block_time_s) == ("all_to_all", 4.5, 24.0)


def test_a_one_rank_plan_exchanges_nothing_whatever_is_asked():
    """At cp_size 1 nothing travels: a plan asked for the all-to-all, with a gathered document,
    keeps the all-gather label (no exchange, no window) and costs 0 s of exchange."""
    cm = CM.replace(sliding_window=2)
    p = finish_plan(np.array([4], dtype=np.int64), 1, "hand", [_seg((0, 0, 4))], np.array([0]), cm, "all_to_all")
    assert (p.kv_exchange, p.kv_window, p.comm_s) == ("all_gather", None, 0.0)


def test_finish_plan_all_to_all_priced_with_the_sliding_window():
    """doc 0 (8 tokens) cut at 4 on 2 ranks. Under a 2-token window rank 1's queries [4, 8) see
    keys from 3 on: 1 row from rank 0, so the all-to-all costs 2 (0.25 + 1) = 2.5 s and wins
    over the all-gather's 2 (0.25 + 8 / 2) = 8.5 s. Without a window rank 1 needs 4 rows:
    2 (0.25 + 4) = 8.5 s, not faster, so "auto" keeps the all-gather, and an explicit
    all-to-all is kept all the same."""
    lengths, segs = np.array([8], dtype=np.int64), [_seg((0, 0, 4)), _seg((0, 4, 8))]
    windowed = CM.replace(sliding_window=2)
    for exchange in ("auto", "all_to_all"):
        p = finish_plan(lengths, 2, "hand", segs, None, windowed, exchange)
        assert (p.kv_exchange, p.comm_s, p.kv_window) == ("all_to_all", 2.5, 2)
    p = finish_plan(lengths, 2, "hand", segs, None, CM, "auto")
    assert (p.kv_exchange, p.comm_s) == ("all_gather", 8.5)
    p = finish_plan(lengths, 2, "hand", segs, None, CM, "all_to_all")
    assert (p.kv_exchange, p.comm_s, p.kv_window) == ("all_to_all", 8.5, None)


def test_finish_plan_bound_refuses_only_compute_beyond_it():
    """``bound`` returns None only where some rank's compute exceeds ``bound * (1 + 1e-9)``: a
    bound at which the margin lands exactly on the slowest rank's compute keeps the plan, the
    next float below refuses it."""
    lengths, segs = np.array([3, 5], dtype=np.int64), [_seg((0, 0, 3)), _seg((1, 0, 5))]
    cmax = float(finish_plan(lengths, 2, "hand", segs, None, CM).rank_compute_s.max())
    assert cmax == 5 + 15  # 5 tokens + 15 causal pairs at 1 s each
    bound = cmax / (1 + 1e-9)
    for _ in range(8):  # the float whose margin product is exactly cmax (within a few ulps)
        if bound * (1 + 1e-9) == cmax:
            break
        bound = math.nextafter(bound, math.inf if bound * (1 + 1e-9) < cmax else -math.inf)
    assert bound * (1 + 1e-9) == cmax
    assert finish_plan(lengths, 2, "hand", segs, None, CM, bound=bound) is not None
    below = math.nextafter(bound, -math.inf)
    assert below * (1 + 1e-9) < cmax
    assert finish_plan(lengths, 2, "hand", segs, None, CM, bound=below) is None


# ---------------------------------------------------------------------------- fifth pass: the other functions

def test_check_doc_lengths_takes_integral_floats_as_int64_and_refuses_other_dtypes_whole_message():
    import re

    import pytest

    from atac_hf.sharding.segments import check_doc_lengths

    got = check_doc_lengths([2.0, 3.0])
    assert got.dtype == np.int64 and got.tolist() == [2, 3]
    for arr, what in ((np.array([2 + 0j, 3 + 0j]), "complex128"), (np.array(["a", "b"]), "<U1")):
        with pytest.raises(ValueError, match="^" + re.escape(f"doc_lengths must be integers (ints >= 1), got dtype {what}")
                          + "$"):
            check_doc_lengths(arr)
    with pytest.raises(ValueError, match="^" + re.escape("document 1 has length 0; every document must have >= 1 token "
                                                         "(drop empty documents before packing)") + "$"):
        check_doc_lengths([1, 0, 2])


def test_head_tail_segments_per_rank_heads_and_tails_of_each_document():
    """Bounds [0, 2, 4, 6, 8] and [0, 1, 2, 2, 3] over 2 ranks (test_mutants_atp's head_tail_flat
    case): rank r holds chunk r (its head) and chunk 2C-1-r (its tail) of each document in turn;
    the empty one (document 1's tail on rank 1) dropped."""
    from atac_hf.sharding.segments import head_tail_segments

    got = head_tail_segments(np.array([0, 1]), np.array([[0, 2, 4, 6, 8], [0, 1, 2, 2, 3]]), 2)
    assert [s.tolist() for s in got] == [[[0, 0, 2], [0, 6, 8], [1, 0, 1], [1, 2, 3]], [[0, 2, 4], [0, 4, 6], [1, 1, 2]]]


def test_sort_segments_orders_by_row_position():
    """Documents of 4 and 2 tokens (row offsets 0, 4, 6): segments at row positions 4, 3, 0 come
    out 0, 3, 4; none stays none, shaped (0, 3)."""
    from atac_hf.sharding.segments import row_offsets, sort_segments

    off = row_offsets(np.array([4, 2]))
    assert off.tolist() == [0, 4, 6]
    seg = np.array([[1, 0, 2], [0, 3, 4], [0, 0, 1]])
    assert sort_segments(seg, off).tolist() == [[0, 0, 1], [0, 3, 4], [1, 0, 2]]
    assert sort_segments(np.zeros(0, np.int64), off).shape == (0, 3)

"""Tests that kill the mutmut survivors in ``atac_hf/sharding/plan.py`` and ``exchange.py``
(issue 20): the per-rank layouts (``LocalLayout``, ``VarlenLayout``) and the K/V volumes of
hand-built plans, field by field and with their dtypes, including a rank that holds no
tokens (``plan_shards([1], 2)`` makes one) and segments that do not start a document.

Expected values are worked out by hand in the comments, never with the code under test.
docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atac_hf.cost import CostModel
from atac_hf.sharding import ShardPlan, plan_shards
from atac_hf.sharding.exchange import a2a_pair_counts, a2a_rows, a2a_token_counts, needed_ranges
from atac_hf.sharding.plan import LocalLayout
from atac_hf.sharding.baselines import per_doc_block_time
from atac_hf.sharding.segments import causal_pairs, finish_plan, head_tail_bounds, per_doc_segments

sys.path.insert(0, os.path.dirname(__file__))
from test_sharding import COSTS  # noqa: E402

I64 = np.dtype(np.int64)


def _seg(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _plan(exchange: str = "all_gather") -> ShardPlan:
    """Documents [4, 2] on 3 ranks: rank 0 holds doc 0 [0, 2); rank 1 doc 0 [2, 4) and doc 1
    [0, 2); rank 2 nothing. Doc 0 is split, so gathered; doc 1 is not."""
    p = ShardPlan(doc_lengths=np.array([4, 2], dtype=np.int64), cp_size=3, strategy="hand",
                  segments=(_seg((0, 0, 2)), _seg((0, 2, 4), (1, 0, 2)), _seg()),
                  gathered_docs=np.array([0], dtype=np.int64), rank_compute_s=np.array([1.0, 1.0, 0.0]),
                  kv_exchange=exchange)
    p.validate()
    return p


def _eq(a, want, dtype=I64) -> None:
    a = np.asarray(a)
    assert a.dtype == dtype, (a.dtype, dtype)
    assert a.tolist() == want


def _check_layout(lay: LocalLayout, **want) -> None:
    for name in ("seg_doc", "seg_local_start", "seg_local_end", "seg_doc_start", "seg_doc_end", "send_index",
                 "send_counts", "recv_counts", "self_index"):
        if name in want:
            _eq(getattr(lay, name), want.pop(name))
    _eq(lay.seg_gathered, want.pop("seg_gathered"), np.dtype(bool))
    keys = want.pop("doc_key_index")
    assert sorted(lay.doc_key_index) == sorted(keys)
    for d, v in keys.items():
        _eq(lay.doc_key_index[d], v)
    for name, v in want.items():
        assert getattr(lay, name) == v, (name, getattr(lay, name), v)


# ---------------------------------------------------------------------------- all-gather layouts
def test_all_gather_layouts_of_every_rank_including_an_empty_one():
    # send lists: rank 0 sends its doc-0 rows [0, 1] (doc positions 0, 1); rank 1 its doc-0 rows
    # [0, 1] (positions 2, 3); rank 2 nothing: counts [2, 2, 0], padded to max_send = 2, so doc
    # 0's keys sit at rows [0, 1] (rank 0's block) and [2, 3] (rank 1's block) of the 3 x 2 buffer.
    p = _plan()
    common = dict(cp_size=3, exchange="all_gather", window=None, send_counts=[2, 2, 0], max_send=2, num_key_rows=6)
    want = {
        0: dict(n_local=2, seg_doc=[0], seg_local_start=[0], seg_local_end=[2], seg_doc_start=[0], seg_doc_end=[2],
                seg_gathered=[True], send_index=[0, 1], doc_key_index={0: [0, 1, 2, 3]}),
        1: dict(n_local=4, seg_doc=[0, 1], seg_local_start=[0, 2], seg_local_end=[2, 4], seg_doc_start=[2, 0],
                seg_doc_end=[4, 2], seg_gathered=[True, False], send_index=[0, 1], doc_key_index={0: [0, 1, 2, 3]}),
        2: dict(n_local=0, seg_doc=[], seg_local_start=[], seg_local_end=[], seg_doc_start=[], seg_doc_end=[],
                seg_gathered=[], send_index=[], doc_key_index={}),
    }
    for r in range(3):
        lay = p.local_layout(r)
        _check_layout(lay, **common, **want[r], rank=r)
        assert lay.recv_counts is None and lay.self_index is None
        assert p.local_layout(r, window=1) is lay  # the all-gather layout ignores the window


def test_varlen_layouts_with_and_without_a_window():
    # rank 1, keys of cat([4 local rows, 6 gathered rows]): the doc-0 chunk [2, 4) (gathered)
    # attends to doc 0's keys [0, 4) = buffer rows 4 + [0, 1, 2, 3]; the doc-1 chunk (local rows
    # 2, 3) to local rows [2, 3]. With a window of 2 the doc-0 chunk starting at 2 sees keys
    # from 2 - 2 + 1 = 1 on: rows [5, 6, 7].
    p = _plan()
    v = p.local_layout(1).varlen_layout()
    _eq(v.k_index, [4, 5, 6, 7, 2, 3])
    _eq(v.cu_seqlens_q, [0, 2, 4])
    _eq(v.cu_seqlens_k, [0, 4, 6])
    assert (v.max_seqlen_q, v.max_seqlen_k) == (2, 4)
    w = p.local_layout(1).varlen_layout(sliding_window=2)
    _eq(w.k_index, [5, 6, 7, 2, 3])
    _eq(w.cu_seqlens_k, [0, 3, 5])
    assert (w.max_seqlen_q, w.max_seqlen_k) == (2, 3)
    # rank 0: one chunk [0, 2) of doc 0 (n_local 2): buffer rows 2 + [0, 1]
    v0 = p.local_layout(0).varlen_layout()
    _eq(v0.k_index, [2, 3])
    _eq(v0.cu_seqlens_q, [0, 2])
    assert (v0.max_seqlen_q, v0.max_seqlen_k) == (2, 2)
    # the empty rank: no segments
    e = p.local_layout(2).varlen_layout(sliding_window=3)
    _eq(e.k_index, [])
    _eq(e.cu_seqlens_q, [0])
    _eq(e.cu_seqlens_k, [0])
    assert (e.max_seqlen_q, e.max_seqlen_k) == (0, 0)


def test_varlen_layout_of_a_local_chunk_that_does_not_start_its_document():
    # one document of 5 held by rank 0 as two chunks [0, 3) and [3, 5) (not split over ranks:
    # not gathered). The second chunk's keys are the document's prefix in local rows: [0, 5);
    # with a window of 2 they start at 3 - 2 + 1 = 2: rows [2, 3, 4].
    p = ShardPlan(doc_lengths=np.array([5], dtype=np.int64), cp_size=2, strategy="hand",
                  segments=(_seg((0, 0, 3), (0, 3, 5)), _seg()), gathered_docs=np.zeros(0, dtype=np.int64),
                  rank_compute_s=np.array([1.0, 0.0]))
    p.validate()
    lay = p.local_layout(0)
    v = lay.varlen_layout()
    _eq(v.k_index, [0, 1, 2, 0, 1, 2, 3, 4])
    _eq(v.cu_seqlens_q, [0, 3, 5])
    _eq(v.cu_seqlens_k, [0, 3, 8])
    assert (v.max_seqlen_q, v.max_seqlen_k) == (3, 5)
    w = lay.varlen_layout(sliding_window=2)
    _eq(w.k_index, [0, 1, 2, 2, 3, 4])
    _eq(w.cu_seqlens_k, [0, 3, 6])
    assert (w.max_seqlen_q, w.max_seqlen_k) == (3, 3)


@pytest.mark.parametrize("strategy", ["atp", "contiguous", "zigzag", "per_doc", "wlb_adaptive"])
def test_layouts_of_a_plan_with_an_empty_rank(strategy):
    # one token on 2 ranks: one rank holds it, the other nothing; every layout still builds
    p = plan_shards([1], 2, strategy=strategy)
    held = [len(s) for s in p.segments]
    assert sorted(held) == [0, 1]
    for r in range(2):
        lay = p.local_layout(r)
        assert lay.n_local == held[r] and lay.rank == r and lay.cp_size == 2
        _eq(lay.seg_local_start, [0] if held[r] else [])
        _eq(lay.seg_local_end, [1] if held[r] else [])
        assert lay.seg_gathered.dtype == bool and len(lay.seg_gathered) == held[r]
        assert lay.send_counts.dtype == I64 and lay.send_index.dtype == I64
        v = lay.varlen_layout()
        _eq(v.cu_seqlens_q, [0, 1] if held[r] else [0])
        assert (v.max_seqlen_q, v.max_seqlen_k) == ((1, 1) if held[r] else (0, 0))


# ---------------------------------------------------------------------------- all-to-all layouts
def test_all_to_all_layouts_of_every_rank():
    # rank 1's doc-0 chunk [2, 4) attends to keys [0, 4): it receives [0, 2) from rank 0 (2 rows)
    # and holds [2, 4) itself. Key buffer of rank 1 = cat([own rows (doc positions 2, 3),
    # received rows (positions 0, 1)]): doc_key_index[0] = [2, 3, 0, 1]. Rank 0's chunk [0, 2)
    # needs only its own keys: it sends its 2 rows to rank 1 and receives nothing;
    # doc_key_index[0] = [0, 1, -1, -1] (positions 2, 3 are never attended to by rank 0).
    p = _plan("all_to_all")
    base = dict(cp_size=3, exchange="all_to_all", window=None)
    _check_layout(p.local_layout(0), **base, rank=0, n_local=2, seg_doc=[0], seg_local_start=[0], seg_local_end=[2],
                  seg_doc_start=[0], seg_doc_end=[2], seg_gathered=[True], send_index=[0, 1], send_counts=[0, 2, 0],
                  recv_counts=[0, 0, 0], self_index=[0, 1], doc_key_index={0: [0, 1, -1, -1]}, num_key_rows=2)
    _check_layout(p.local_layout(1), **base, rank=1, n_local=4, seg_doc=[0, 1], seg_local_start=[0, 2],
                  seg_local_end=[2, 4], seg_doc_start=[2, 0], seg_doc_end=[4, 2], seg_gathered=[True, False],
                  send_index=[], send_counts=[0, 0, 0], recv_counts=[2, 0, 0], self_index=[0, 1],
                  doc_key_index={0: [2, 3, 0, 1]}, num_key_rows=4)
    _check_layout(p.local_layout(2), **base, rank=2, n_local=0, seg_doc=[], seg_local_start=[], seg_local_end=[],
                  seg_doc_start=[], seg_doc_end=[], seg_gathered=[], send_index=[], send_counts=[0, 0, 0],
                  recv_counts=[0, 0, 0], self_index=[], doc_key_index={}, num_key_rows=0)
    # rank 1 with a window of 1: its chunk [2, 4) sees keys from 2 on, all its own
    _check_layout(p.local_layout(1, window=1), **{**base, "window": 1}, rank=1, n_local=4, seg_doc=[0, 1],
                  seg_local_start=[0, 2], seg_local_end=[2, 4], seg_doc_start=[2, 0], seg_doc_end=[4, 2],
                  seg_gathered=[True, False], send_index=[], send_counts=[0, 0, 0], recv_counts=[0, 0, 0],
                  self_index=[0, 1], doc_key_index={0: [-1, -1, 0, 1]}, num_key_rows=2)
    # the all-to-all varlen keys of rank 1: doc 0's chunk takes buffer rows 4 + [2, 3, 0, 1] in
    # document order, the local doc-1 chunk rows [2, 3]
    v = p.local_layout(1).varlen_layout()
    _eq(v.k_index, [6, 7, 4, 5, 2, 3])
    _eq(v.cu_seqlens_k, [0, 4, 6])


# ---------------------------------------------------------------------------- K/V volumes
def test_kv_volumes_of_both_exchanges():
    ag, a2a = _plan(), _plan("all_to_all")
    assert ag.kv_tokens == a2a.kv_tokens == 4
    # all-gather: every rank receives the gathered rows it does not hold: 4 - [2, 2, 0]
    _eq(ag.kv_recv_tokens, [2, 2, 4])
    # the ring's (C - 1) / C of the 4 gathered tokens, 2 bytes each
    assert ag.kv_bytes(2.0) == 4 * 2.0 * 2 / 3
    # all-to-all: only rank 1 receives (doc 0 [0, 2) from rank 0)
    recv, send = a2a_token_counts(a2a.segments, a2a.gathered_mask(), None)
    _eq(recv, [0, 2, 0])
    _eq(send, [2, 0, 0])
    _eq(a2a_pair_counts(a2a.segments, a2a.gathered_mask(), None), [[0, 2, 0], [0, 0, 0], [0, 0, 0]])
    _eq(a2a.kv_recv_tokens, [0, 2, 0])
    _eq(ag.a2a_token_counts[0], [0, 2, 0])  # the same counts, whichever exchange the plan uses
    assert a2a.kv_bytes(2.0) == 2 * 2.0
    # one rank: nothing travels
    one = plan_shards([3, 5], 1)
    assert one.kv_bytes(2.0) == 0.0


def test_exchange_rows_between_two_ranks():
    p = _plan("all_to_all")
    g = p.gathered_mask()
    rows, docs, pos = a2a_rows(p.segments, g, 0, 1)  # rank 0's rows that rank 1 attends to
    _eq(rows, [0, 1])
    _eq(docs, [0, 0])
    _eq(pos, [0, 1])
    for src, dst in ((1, 0), (2, 0), (0, 2), (2, 1)):
        for a in a2a_rows(p.segments, g, src, dst):
            _eq(a, [])
    assert needed_ranges(p.segments[1], g) == {0: [(0, 4)]}
    assert needed_ranges(p.segments[1], g, 1) == {0: [(2, 4)]}
    assert needed_ranges(p.segments[2], g) == {}


def test_all_to_all_layout_of_a_one_rank_plan():
    # one rank: no other rank to send to or receive from; nothing gathered
    p = ShardPlan(doc_lengths=np.array([3], dtype=np.int64), cp_size=1, strategy="hand", segments=(_seg((0, 0, 3)),),
                  gathered_docs=np.zeros(0, dtype=np.int64), rank_compute_s=np.array([1.0]), kv_exchange="all_to_all")
    _check_layout(p.local_layout(0), rank=0, cp_size=1, exchange="all_to_all", window=None, n_local=3, seg_doc=[0],
                  seg_local_start=[0], seg_local_end=[3], seg_doc_start=[0], seg_doc_end=[3], seg_gathered=[False],
                  send_index=[], send_counts=[0], recv_counts=[0], self_index=[], doc_key_index={}, num_key_rows=0)
    assert p.kv_bytes(2.0) == 0.0


@pytest.mark.parametrize("lengths", [[8, 8, 8, 8], [60, 2, 2]])
def test_wlb_adaptive_is_the_faster_baseline_under_its_own_name(lengths):
    # per pack, the faster of zigzag and per_doc by estimated block time: its plan, renamed
    z, d = plan_shards(lengths, 4, "zigzag"), plan_shards(lengths, 4, "per_doc")
    best = z if z.block_time_s <= d.block_time_s else d
    w = plan_shards(lengths, 4, "wlb_adaptive")
    assert w.strategy == "wlb_adaptive" and w.cp_size == 4
    assert w.comm_s == best.comm_s > 0 and w.block_time_s == best.block_time_s
    assert [s.tolist() for s in w.segments] == [s.tolist() for s in best.segments]
    assert w.gathered_docs.tolist() == best.gathered_docs.tolist()
    assert w.rank_compute_s.tolist() == best.rank_compute_s.tolist()
    assert w.doc_lengths.tolist() == lengths


def test_causal_pairs_and_head_tail_bounds_by_hand():
    # a causal prefix of n tokens has n (n + 1) / 2 query-key pairs
    assert [causal_pairs(n) for n in (0, 1, 2, 4, 7)] == [0, 1, 3, 10, 28]
    _eq(causal_pairs(np.array([3, 5], dtype=np.int64)), [6, 15])
    # L = 10, C = 2: 2C = 4 chunks of 2 with 2 left over, one extra token in each rank's head:
    # sizes 3, 3 | 2, 2. L = 7: 1 each, 3 left: rank 0 two extra (head and tail), rank 1 one
    # (head): sizes 2, 2 | 1, 2. Rank r holds chunks r and 3 - r.
    _eq(head_tail_bounds(np.array([10, 7]), 2), [[0, 3, 6, 8, 10], [0, 2, 4, 5, 7]])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 70), min_size=1, max_size=12), st.integers(1, 8), st.sampled_from(sorted(COSTS)))
def test_per_doc_block_time_equals_the_per_doc_plan(lengths, cp, cost):
    # the shortcut ATP uses must price exactly what finish_plan prices for per_doc's segments
    # (head-tail in every document, the split ones gathered): 1-token documents, chunks that
    # touch, remainders of every size mod 2C
    cm = COSTS[cost]
    plan = finish_plan(np.array(lengths), cp, "per_doc", per_doc_segments(np.array(lengths), cp), None, cm)
    assert per_doc_block_time(np.array(lengths), cp, cm) == pytest.approx(plan.block_time_s, rel=1e-9, abs=0.0)


def test_per_doc_block_time_on_fixed_cases():
    # the same equality on fixed cases (every run): 1-token documents beside split ones, more
    # ranks than a document's tokens, one rank
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, link_bandwidth=1e18)
    for lengths, cp in (([8], 2), ([1, 1, 9], 3), ([7, 2, 1], 4), ([5], 1)):
        plan = finish_plan(np.array(lengths), cp, "per_doc", per_doc_segments(np.array(lengths), cp), None, cm)
        assert plan.block_time_s > 0
        assert per_doc_block_time(np.array(lengths), cp, cm) == pytest.approx(plan.block_time_s, rel=1e-12)


def test_check_doc_lengths_refusals_with_their_whole_messages():
    from atac_hf.sharding.segments import check_doc_lengths

    def refused(v, message):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            check_doc_lengths(v)

    refused([3, True], "doc_lengths[1] is the bool True, not a document length: doc_lengths must be integers (ints >= 1)")
    refused([[1, 2], [3]], "doc_lengths must be a flat 1-D sequence of ints (got a ragged nested sequence)")
    refused(np.array([True, False]), "doc_lengths is a bool array, not document lengths: doc_lengths must be integers "
                                     "(ints >= 1)")
    refused(np.array([1.5]), "doc_lengths must be integers (ints >= 1), got dtype float64")
    # 2**62 as a float is not converted (the conversion stops below 2**62)
    refused([2.0**62], "doc_lengths must be integers (ints >= 1), got dtype float64")
    refused([2**61, 2**61], "the pack holds 4.61e+18 tokens, 2**62 or more: the document lengths are not token counts "
            "(a pack holds at most 2**62 - 1 tokens)")
    _eq(check_doc_lengths([3.0, 4.0]), [3, 4])
    _eq(check_doc_lengths(np.array([2, 5], dtype=np.int32)), [2, 5])


def test_is_int_refuses_bools_and_floats():
    from atac_hf.sharding.segments import is_int

    assert [is_int(v) for v in (3, np.int32(3), np.int64(-1))] == [True, True, True]
    assert [is_int(v) for v in (True, np.bool_(False), 1.5, 2.0, "3", None)] == [False] * 6


def test_fill_empty_ranks_moves_a_whole_segment_that_does_not_start_its_document():
    # doc 0 (6 tokens) on 3 ranks: rank 0 [0, 2) + [4, 6), rank 1 [2, 4), rank 2 empty. The
    # richest, rank 0 (4 tokens), gives the second half, 2 tokens: exactly its last segment
    # [4, 6), moved whole (no empty remainder left behind)
    from atac_hf.sharding.segments import fill_empty_ranks

    p = ShardPlan(doc_lengths=np.array([6], dtype=np.int64), cp_size=3, strategy="per_doc",
                  segments=(_seg((0, 0, 2), (0, 4, 6)), _seg((0, 2, 4)), _seg()),
                  gathered_docs=np.array([0], dtype=np.int64), rank_compute_s=np.zeros(3))
    q = fill_empty_ranks(p, CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1))
    assert [s.tolist() for s in q.segments] == [[[0, 0, 2]], [[0, 2, 4]], [[0, 4, 6]]]
    assert q.gathered_docs.tolist() == [0] and q.strategy == "per_doc"
    q.validate()

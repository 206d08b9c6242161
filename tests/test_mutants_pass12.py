"""Tests that kill hand-planted mutants of ``atac_hf/sharding/segments.py`` the suite let through
(issue 20, docs/TESTING.md, twelfth pass). Each docstring names its mutant and works the case by
hand. Models whose seconds are exact (``tile=1``, whole-second or power-of-two prices).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding.segments import check_doc_lengths


def test_check_doc_lengths_refuses_a_non_integral_float_below_its_rounding_and_above_it():
    """``check_doc_lengths`` refuses "a non-integral number among them": 2.3 (rounds down to 2,
    so ``2.3 >= round(2.3)``) and 2.7 (rounds up) alike, whole message. Kills the integrality test
    ``arr >= np.round(arr)`` (for ``==``), which took ``[4.0, 2.3]`` as ``[4, 2]``."""
    for bad in ([4.0, 2.3], [4.0, 2.7]):
        with pytest.raises(ValueError, match="^" + re.escape("doc_lengths must be integers (ints >= 1), got dtype "
                                                             "float64") + "$"):
            check_doc_lengths(bad)


def test_per_doc_flat_ranks_of_a_pack_beyond_the_one_shot_layout():
    """32,768 one-token documents and one of 4 at cp 2: D x C = 65,538 > ``_PER_DOC_FLAT_MAX``, so
    ``per_doc_flat`` lays it out rank by rank. Head-tail of 4 tokens at C = 2: chunks of 1 token,
    rank 0 holds chunks 0 and 3 (rows [0, 1) and [3, 4)), rank 1 chunks 1 and 2; a one-token
    document is rank 0's head chunk only. So rank 0 holds 32,768 + 2 segments, rank 1 2: the
    ranks are 32,770 zeros then 2 ones. Kills the rank counts taken in reverse rank order
    (``segs[::-1]``: 2 zeros, then 32,770 ones)."""
    from atac_hf.sharding.segments import _PER_DOC_FLAT_MAX, per_doc_flat

    L = np.array([1] * 32768 + [4], dtype=np.int64)
    assert len(L) * 2 > _PER_DOC_FLAT_MAX
    seg, rank = per_doc_flat(L, 2)
    assert np.bincount(rank).tolist() == [32770, 2] and np.all(np.diff(rank) >= 0)
    assert seg[-4:].tolist() == [[32768, 0, 1], [32768, 3, 4], [32768, 1, 2], [32768, 2, 3]]
    assert seg[:3].tolist() == [[0, 0, 1], [1, 0, 1], [2, 0, 1]]


# tile 1; the K/V link: 0.25 s latency per peer, 1 byte per token at 1 byte/s, so the all-gather
# of K tokens at C ranks costs 2 (0.25 (C - 1) + K (C - 1) / C) and an all-to-all whose busiest
# rank moves m rows 2 (0.25 (C - 1) + m) (tests/test_mutants_segments.py's LINK)
LINK = {"tile": 1, "kv_bytes_per_token": 1.0, "link_bandwidth": 1.0, "link_latency_s": 0.25}


def _seg(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def test_finish_flat_costs_the_all_to_all_at_once_where_one_rank_does_not_hide_the_all_gather():
    """Docs [8, 1] on 2 ranks: rank 0 holds doc 0 [0, 2) and doc 1, rank 1 doc 0 [2, 8); doc 0
    gathered (8 tokens: 2 (0.25 + 4) = 8.5 s), the all-to-all moves doc 0's rows [0, 2) to rank 1
    (2 (0.25 + 2) = 4.5 s). 1 s a token, 8.5 s a kernel call, pairs free: compute 2 + 8.5 + 1 + 8.5
    = 20 s on rank 0 (local attention 8.5 s: doc 1), 6 + 8.5 = 14.5 s on rank 1 (no local
    attention). The all-gather is hidden on rank 0 only, so ``defer_a2a`` does not defer
    (docstring: "where the all-gather is hidden on every rank"): "auto" takes the all-to-all now,
    block max(20 - 8.5 + max(8.5, 4.5), 14.5 + 4.5) = 20 s. Kills the deferral on ``np.any`` (the
    plan says all-gather, block max(20, 14.5 + 8.5) = 23 s, and resolve_exchange keeps 23 s)."""
    from atac_hf.sharding.segments import finish_flat, resolve_exchange

    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, segment_overhead_s=8.5, **LINK)
    lengths = np.array([8, 1], dtype=np.int64)
    allseg, rank_of = _seg((0, 0, 2), (1, 0, 1), (0, 2, 8)), np.array([0, 0, 1])
    p = finish_flat(lengths, 2, "hand", allseg, rank_of, None, cm, "auto", defer_a2a=True)
    assert p.rank_compute_s.tolist() == [20.0, 14.5] and p.gathered_docs.tolist() == [0]
    assert (p.kv_exchange, p.comm_s, p.block_time_s) == ("all_to_all", 4.5, 20.0)
    assert resolve_exchange(p, cm) is p


def test_a_deferred_all_to_all_keeps_the_sliding_window():
    """tests/test_mutants_segments.py's deferral case under a 2-token sliding window: docs [8, 1, 1]
    on 2 ranks, rank 0 doc 0 [0, 2) and doc 1, rank 1 doc 0 [2, 8) and doc 2; 8.5 s a kernel
    call, pairs free, so each rank's local attention is 8.5 s, the all-gather's 2 (0.25 + 8 / 2) =
    8.5 s exactly: hidden on every rank, deferred. Rank 1's first row (2) attends keys (0, 2]:
    row 1 only comes from rank 0, so the all-to-all costs 2 (0.25 + 1) = 2.5 s, and
    resolve_exchange takes it, as finish_flat does without the deferral: an all-to-all plan
    sends the window (``kv_window=2``), as ShardPlan's layouts need. Kills the resolved plan's
    ``kv_window=None``."""
    from atac_hf.sharding.segments import finish_flat, resolve_exchange

    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, segment_overhead_s=8.5, sliding_window=2, **LINK)
    lengths = np.array([8, 1, 1], dtype=np.int64)
    allseg, rank_of = _seg((0, 0, 2), (1, 0, 1), (0, 2, 8), (2, 0, 1)), np.array([0, 0, 1, 1])
    p = finish_flat(lengths, 2, "hand", allseg, rank_of, None, cm, "auto", defer_a2a=True)
    assert (p.kv_exchange, p.comm_s, p.block_time_s, p.kv_window) == ("all_gather", 8.5, 24.0, None)
    q = resolve_exchange(p, cm)
    assert (q.kv_exchange, q.comm_s, q.block_time_s, q.kv_window) == ("all_to_all", 2.5, 24.0, 2)
    now = finish_flat(lengths, 2, "hand", allseg, rank_of, None, cm, "auto")
    assert (now.kv_exchange, now.comm_s, now.block_time_s, now.kv_window) == ("all_to_all", 2.5, 24.0, 2)


def test_row_offsets_of_a_pack_beyond_int32():
    """check_doc_lengths takes packs of up to 2**62 tokens, so row offsets are int64: two
    documents of 2**32 tokens start at rows 0 and 2**32 and end at 2**33; the contiguous split at
    cp 2 cuts at row 2**32, one whole document a rank. Kills ``row_offsets`` as int32 (2**32 wraps
    to 0: the split lands on document 0 only)."""
    from atac_hf.sharding import plan_shards
    from atac_hf.sharding.segments import row_offsets

    n = 2**32
    off = row_offsets(np.array([n, n], dtype=np.int64))
    assert off.dtype == np.int64 and off.tolist() == [0, n, 2 * n]
    plan = plan_shards([n, n], 2, "contiguous")
    assert [s.tolist() for s in plan.segments] == [[[0, 0, n]], [[1, 0, n]]]


def _doc_costs(plan, cm) -> np.ndarray:
    """Summed compute of each document's segments in ``plan`` (what any plan pays for it)."""
    allseg = np.concatenate(plan.segments)
    cost, _ = cm.segment_and_attention_cost(allseg[:, 1], allseg[:, 2])
    return np.bincount(allseg[:, 0], weights=cost, minlength=plan.num_docs)


def test_doc_work_lower_bounds_count_exact_window_pairs_not_tiles():
    """Pairs at 1 s, tile 4, a 9-token sliding window: a document of 11 tokens has exact pairs
    1 + 2 + ... + 9 + 9 + 9 = 63 (row i attends min(i + 1, 9) keys), so its bound is 63 s (the
    docstring: exact causal pairs, the window counted, no tiles). Zigzag at cp 3 cuts it into
    [4, 11) and [0, 4), which cost 90 s in all: the bound is below, as a lower bound must be. Kills
    ``_exact_pairs`` on ``cm`` itself (tiled: 96 s for the whole document, above the 90 s the
    plan pays)."""
    from atac_hf.sharding import plan_shards
    from atac_hf.sharding.segments import _doc_work_lower_bounds

    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=4, sliding_window=9)
    bound = _doc_work_lower_bounds(np.array([33, 11], dtype=np.int64), cm)
    assert bound[1] == 63.0
    plan = plan_shards([33, 11], 3, "zigzag", cm)
    assert np.all(bound <= _doc_costs(plan, cm))


def test_doc_work_lower_bounds_one_call_at_the_cheaper_per_call_price():
    """The docstring's bound: token-wise work + exact pairs x the cheaper pair price + one kernel
    call at the cheaper per-call price. A 3-token document at 1 s a token, 2 s a pair, 5 s a
    call: 3 + 6 x 2 + 5 = 20 s, exactly what a one-rank plan pays (one causal call). Under a
    2-token window an 8-token document held whole is one *masked* call (longer than the window):
    4 s causal, 1 s masked, pairs and tokens free: the bound is min(4, 1) = 1 s, the plan's cost.
    Kills the bound without the call (15 s) or with two (25 s), and the call at the causal price
    (4 s, above the 1 s the plan pays)."""
    from atac_hf.sharding import plan_shards
    from atac_hf.sharding.segments import _doc_work_lower_bounds

    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=2.0, segment_overhead_s=5.0, tile=1)
    assert _doc_work_lower_bounds(np.array([3], dtype=np.int64), cm).tolist() == [20.0]
    assert plan_shards([3], 1, "per_doc", cm).rank_compute_s.tolist() == [20.0]
    masked = CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0, segment_overhead_s=4.0,
                       masked_segment_overhead_s=1.0, sliding_window=2, tile=1)
    assert _doc_work_lower_bounds(np.array([8], dtype=np.int64), masked).tolist() == [1.0]
    assert plan_shards([8], 1, "per_doc", masked).rank_compute_s.tolist() == [1.0]

"""The baseline sharding strategies ATP-CP is measured against (pure numpy).

    contiguous   Llama-3 style all-gather CP: the row cut into C contiguous runs.
    zigzag       head-tail over the whole row (torch / Accelerate default).
    per_doc      head-tail inside every document (Megatron THD, WLB-LLM per-doc).
    wlb_adaptive per pack, the faster of zigzag and per_doc by estimated latency.

Each takes ``(lengths, C, cost_model, **options)`` and returns a :class:`ShardPlan`;
:func:`~atac_hf.sharding.plan_shards` is the entry point.
"""

from __future__ import annotations

import numpy as np

from ..cost import CostModel
from .plan import ShardPlan
from .segments import finish_plan, head_tail_bounds, per_doc_segments, row_offsets, row_ranges_to_segments

__all__ = ["per_doc_block_time", "plan_contiguous", "plan_per_doc", "plan_wlb_adaptive", "plan_zigzag"]


def contiguous_segments(lengths, C) -> list:
    """One contiguous run of the row per rank (ranks 0..C-1 in row order), as segments."""
    offsets = row_offsets(lengths)
    n = int(offsets[-1])
    cuts = [n * r // C for r in range(C + 1)]
    return [row_ranges_to_segments(offsets, [(cuts[r], cuts[r + 1])]) for r in range(C)]


def contiguous_compute_floor(lengths, C, cm) -> float:
    """The slowest rank's compute in the contiguous layout (a floor of its block time, which adds
    the exposed exchange), without building it: one piece per (rank, document) it spans."""
    offsets = row_offsets(lengths)
    n = int(offsets[-1])
    cuts = n * np.arange(C + 1, dtype=np.int64) // C
    edges = np.union1d(offsets, cuts)
    start, end = edges[:-1], edges[1:]
    keep = end > start
    start, end = start[keep], end[keep]
    doc = np.searchsorted(offsets, start, side="right") - 1
    rank = np.searchsorted(cuts, start, side="right") - 1
    cost = cm.segment_cost(start - offsets[doc], end - offsets[doc])
    return float(np.bincount(rank, weights=cost, minlength=C).max()) if len(cost) else 0.0


def plan_contiguous(lengths, C, cm, **_) -> ShardPlan:
    # Llama-3 style CP all-gathers the K/V of the whole row every layer.
    return finish_plan(lengths, C, "contiguous", contiguous_segments(lengths, C), np.arange(len(lengths)), cm)


def plan_zigzag(lengths, C, cm, **_) -> ShardPlan:
    offsets = row_offsets(lengths)
    b = head_tail_bounds(np.array([offsets[-1]]), C)[0]
    segments = [row_ranges_to_segments(offsets, [(b[r], b[r + 1]), (b[2 * C - 1 - r], b[2 * C - r])])
                for r in range(C)]
    # ring / all-gather attention over the whole row moves every document's K/V.
    return finish_plan(lengths, C, "zigzag", segments, np.arange(len(lengths)), cm)


def plan_per_doc(lengths, C, cm, **_) -> ShardPlan:
    docs = np.arange(len(lengths), dtype=np.int64)
    segments = per_doc_segments(lengths, C)
    # Megatron THD / WLB per-document CP passes every document's K/V around the ring.
    return finish_plan(lengths, C, "per_doc", segments, docs, cm)


def plan_wlb_adaptive(lengths, C, cm, **_) -> ShardPlan:
    a, b = plan_zigzag(lengths, C, cm), plan_per_doc(lengths, C, cm)
    best = a if a.block_time_s <= b.block_time_s else b
    return ShardPlan(
        doc_lengths=best.doc_lengths, cp_size=C, strategy="wlb_adaptive", segments=best.segments,
        gathered_docs=best.gathered_docs, rank_compute_s=best.rank_compute_s, comm_s=best.comm_s,
        block_time_s=best.block_time_s,
    )


def per_doc_block_time(lengths: np.ndarray, C: int, cm: CostModel) -> float:
    """Estimated block time of ``finish_plan(per_doc_segments(lengths, C), gathered=None)``
    (head-tail inside every document, gathering the documents it splits) without building
    the segments: a rank's head and tail chunk of a document are costed as one call where
    they touch (as ``finish_plan`` merges them). Ranks are costed in batches of (ranks x docs)
    arrays of at most ~1M entries, each holding only the documents that reach its ranks."""
    L = np.asarray(lengths, dtype=np.int64)
    split = L >= 2  # a document of 2+ tokens has tokens on 2+ ranks
    # only rank 0 holds unsplit (1-token) documents
    local0 = float(cm.attention_cost(np.zeros(int((~split).sum()), np.int64), L[~split]).sum())
    comm = float(cm.comm_cost(int(L[split].sum()), C)) if split.any() else 0.0
    # document d has tokens on ranks 0..min(L_d, C)-1 only: longest first, rank r's documents
    # are a prefix, so a batch of ranks costs only the documents that reach its first rank
    # (work O(sum_d min(L_d, C)), not O(C x D))
    order = np.argsort(-L, kind="stable")
    L = L[order]
    base, rem = L // (2 * C), L % (2 * C)
    head_start, tail_end = np.zeros_like(L), L.copy()
    block = 0.0
    r0 = 0
    while r0 < C:
        active = int(np.count_nonzero(L > r0))  # documents with tokens on rank r0
        if active == 0:
            break  # later ranks are empty: they add nothing to the block time
        # ranks in this batch: ~1M entries at most, and not past where half the documents end
        r1 = min(C, r0 + max(1, (1 << 20) // active), max(r0 + 1, int(L[active // 2])))
        base, rem, head_start, tail_end = base[:active], rem[:active], head_start[:active], tail_end[:active]
        r = np.arange(r0, r1)[:, None]
        extra = rem // C + (r < rem % C)
        head, tail = base + (extra + 1) // 2, base + extra // 2
        he = head_start + np.cumsum(head, axis=0)
        hs = he - head
        ts = tail_end - np.cumsum(tail, axis=0)
        te = ts + tail
        cost = cm.segment_cost(hs, he) + cm.segment_cost(ts, te)
        touch = (he == ts) & (he > hs) & (te > ts)  # few: the middle rank's chunks, short documents
        if touch.any():
            cost[touch] = cm.segment_cost(hs[touch], te[touch])
        compute = cost.sum(axis=1)
        local = np.where(r[:, 0] == 0, local0, 0.0)
        exposed = np.maximum(local, comm) if split.any() else local
        block = max(block, float(np.max(compute - local + exposed)))
        head_start, tail_end = he[-1], ts[-1]
        L = L[:active]
        r0 = r1
    return block

"""Sharding planners: ATP-CP and the baselines, behind :func:`plan_shards`.

Every planner is a pure, deterministic function of (document lengths, cp_size,
cost model, options): no torch, no communication. No strategy needs document
lengths divisible by anything and none pads: head-tail splits spread the
remainder instead.

Strategies:
    atp          anchor-tail: the j most expensive documents are split head-tail
                 over all ranks, the rest stay whole; j is chosen by estimated
                 block time (compute + exposed K/V exchange), and the anchors' chunks
                 level the ranks in tokens and attention pairs where the tails allow.
    contiguous   Llama-3 style all-gather CP: the row cut into C contiguous runs.
    zigzag       head-tail over the whole row (torch / Accelerate default).
    per_doc      head-tail inside every document (Megatron THD, WLB-LLM per-doc).
    wlb_adaptive per pack, the faster of zigzag and per_doc by estimated latency.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable

import numpy as np

from ..cost import CostModel, default_cost_model
from .plan import ShardPlan

__all__ = ["plan_shards", "STRATEGIES", "head_tail_bounds"]

#: ATP takes the plan whose ranks are level in tokens and in attention pairs separately
#: (robust to the cost model's error in their relative price) over the one level in
#: estimated cost alone, unless its estimated block time is more than this fraction higher.
TWO_WAY_TOLERANCE = 0.02


def plan_shards(
    doc_lengths: Any,
    cp_size: int,
    strategy: str = "atp",
    cost_model: CostModel | None = None,
    *,
    max_tokens_per_rank: int | None = None,
    min_chunk: int = 1,
    max_anchors: int | None = None,
) -> ShardPlan:
    """Plan how the documents of one pack are spread over a CP group.

    Args:
        doc_lengths: lengths of the pack's documents in row order (ints >= 1).
        cp_size: ranks in the CP group (>= 1).
        strategy: one of :data:`STRATEGIES`.
        cost_model: costs segments; :func:`~atac_hf.cost.default_cost_model` if None.
        max_tokens_per_rank: memory cap on tokens per rank, or None for no cap. ``atp``
            respects every cap that some placement can respect (>= ceil(tokens / cp_size)),
            falling back to a contiguous split when nothing better fits.
        min_chunk: ``atp`` only: a document is an anchor candidate only when each of
            its ``2 * cp_size`` chunks gets at least this many tokens (128 on GPU).
        max_anchors: ``atp`` only: largest number of anchors tried (default: all).

    Returns:
        The :class:`ShardPlan`.

    Raises:
        ValueError: empty pack, a length < 1 or not an int, more than 2**62 tokens,
            cp_size < 1, an unknown strategy, a bad ``max_tokens_per_rank``/``min_chunk``/
            ``max_anchors``, or a cap the strategy cannot respect (for ``atp``: a cap no
            placement can respect).
        TypeError: ``cost_model`` is not a :class:`~atac_hf.cost.CostModel`.
    """
    lengths = _check_lengths(doc_lengths)
    if isinstance(cp_size, bool) or not isinstance(cp_size, (int, np.integer)) or cp_size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r} (set cp_size in the ATAC config)")
    try:
        fn = STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown sharding strategy {strategy!r}; legal values: {sorted(STRATEGIES)} (set sharding_strategy)"
        ) from None
    if max_tokens_per_rank is not None and (not _is_int(max_tokens_per_rank) or max_tokens_per_rank < 1):
        raise ValueError(f"max_tokens_per_rank must be >= 1 or None (an int), got {max_tokens_per_rank!r} "
                         "(set max_tokens_per_rank)")
    if not _is_int(min_chunk) or min_chunk < 1:
        raise ValueError(f"min_chunk must be >= 1 (an int), got {min_chunk!r} (set min_chunk)")
    if max_anchors is not None and (not _is_int(max_anchors) or max_anchors < 0):
        raise ValueError(f"max_anchors must be an int >= 0 or None, got {max_anchors!r}")
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel or None, got {type(cost_model).__name__}")
    cm = cost_model if cost_model is not None else default_cost_model()
    plan = fn(lengths, int(cp_size), cm, max_tokens_per_rank=max_tokens_per_rank,
              min_chunk=int(min_chunk), max_anchors=max_anchors)
    if max_tokens_per_rank is not None:
        worst = int(plan.rank_num_tokens().max())
        if worst > max_tokens_per_rank:
            raise ValueError(
                f"strategy {strategy!r} puts {worst} tokens on one rank, over max_tokens_per_rank="
                f"{max_tokens_per_rank} ({int(lengths.sum())} tokens over cp_size={cp_size}); raise the cap, "
                "raise cp_size or pack fewer tokens"
            )
    return plan


# ---------------------------------------------------------------------------- helpers
def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_lengths(doc_lengths: Any) -> np.ndarray:
    try:
        arr = np.asarray(doc_lengths)
    except ValueError:  # ragged nesting
        raise ValueError("doc_lengths must be a flat 1-D sequence of ints (got a ragged nested sequence)") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"doc_lengths must be a non-empty 1-D sequence of ints, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"doc_lengths must be integers, got dtype {arr.dtype}")
    if arr.min() < 1:
        bad = int(np.argmin(arr))
        raise ValueError(
            f"document {bad} has length {int(arr[bad])}; every document must have >= 1 token "
            "(drop empty documents before packing)"
        )
    if float(arr.astype(np.float64).sum()) >= 2.0**62:
        raise ValueError(f"the pack holds {float(arr.astype(np.float64).sum()):.3g} tokens, more than 2**62: "
                         "the document lengths are not token counts")
    return arr.astype(np.int64)


def head_tail_bounds(lengths: np.ndarray, cp_size: int) -> np.ndarray:
    """(D, 2C + 1) chunk boundaries of head-tail splits; rank r holds chunks r and 2C-1-r.

    The remainder ``L mod 2C`` is spread over ranks (rank r gets ``rem // C`` or one
    more extra tokens, half in its head chunk, half in its tail chunk), never padded.
    """
    C = cp_size
    L = np.asarray(lengths, dtype=np.int64)[:, None]
    base, rem = L // (2 * C), L % (2 * C)
    r = np.arange(C, dtype=np.int64)[None, :]
    extra = rem // C + (r < rem % C)
    sizes = np.empty((len(L), 2 * C), dtype=np.int64)
    sizes[:, :C] = base + (extra + 1) // 2
    sizes[:, C:] = (base + extra // 2)[:, ::-1]
    bounds = np.zeros((len(L), 2 * C + 1), dtype=np.int64)
    np.cumsum(sizes, axis=1, out=bounds[:, 1:])
    return bounds


def _head_tail_segments(docs: np.ndarray, bounds: np.ndarray, C: int) -> list[np.ndarray]:
    """Per rank (n, 3) segments of head-tail splits of ``docs`` (bounds from head_tail_bounds)."""
    out = []
    for r in range(C):
        head = np.stack([docs, bounds[:, r], bounds[:, r + 1]], axis=1)
        tail = np.stack([docs, bounds[:, 2 * C - 1 - r], bounds[:, 2 * C - r]], axis=1)
        seg = np.stack([head, tail], axis=1).reshape(-1, 3)
        out.append(seg[seg[:, 2] > seg[:, 1]])
    return out


def _per_doc_segments(lengths: np.ndarray, C: int) -> list[np.ndarray]:
    """``_head_tail_segments(arange(D), head_tail_bounds(lengths, C), C)`` in O(D) memory: one
    rank at a time instead of a (D, 2C + 1) bounds matrix (1M documents at C = 64: 1 GB, 10 s),
    dropping documents already fully placed (short documents end on the first ranks)."""
    L = np.asarray(lengths, dtype=np.int64)
    docs = np.arange(len(L), dtype=np.int64)
    base, rem = L // (2 * C), L % (2 * C)
    head_start = np.zeros_like(L)
    tail_end = L.copy()
    out = []
    for r in range(C):
        extra = rem // C + (r < rem % C)
        head = base + (extra + 1) // 2
        tail = base + extra // 2
        seg = np.stack([np.stack([docs, head_start, head_start + head], axis=1),
                        np.stack([docs, tail_end - tail, tail_end], axis=1)], axis=1).reshape(-1, 3)
        out.append(seg[seg[:, 2] > seg[:, 1]])
        head_start = head_start + head
        tail_end = tail_end - tail
        left = tail_end > head_start  # documents with tokens for later ranks
        if not left.all():
            docs, base, rem, head_start, tail_end = docs[left], base[left], rem[left], head_start[left], tail_end[left]
    return out


def _per_doc_block_time(lengths: np.ndarray, C: int, cm: CostModel) -> float:
    """Estimated block time of ``_finish(_per_doc_segments(lengths, C), gathered=None)``
    (head-tail inside every document, gathering the documents it splits) without building
    the segments: a rank's head and tail chunk of a document are costed as one call where
    they touch (as ``_finish`` merges them). Ranks are costed in batches of (ranks x docs)
    arrays of at most ~1M entries."""
    L = np.asarray(lengths, dtype=np.int64)
    split = L >= 2  # a document of 2+ tokens has tokens on 2+ ranks
    # only rank 0 holds unsplit (1-token) documents
    local0 = float(cm.attention_cost(np.zeros(int((~split).sum()), np.int64), L[~split]).sum())
    comm = float(cm.comm_cost(int(L[split].sum()), C)) if split.any() else 0.0
    base, rem = L // (2 * C), L % (2 * C)
    head_start, tail_end = np.zeros_like(L), L.copy()
    step = max(1, (1 << 20) // max(len(L), 1))
    block = 0.0
    for r0 in range(0, C, step):
        r = np.arange(r0, min(C, r0 + step))[:, None]
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
    return block


def _row_ranges_to_segments(offsets: np.ndarray, ranges: list[tuple[int, int]]) -> np.ndarray:
    """(n, 3) document segments covering row ranges ``[lo, hi)`` (given in ascending order)."""
    parts = []
    for lo, hi in ranges:
        if hi <= lo:
            continue
        d0 = int(np.searchsorted(offsets, lo, side="right")) - 1
        d1 = int(np.searchsorted(offsets, hi, side="left")) - 1
        docs = np.arange(d0, d1 + 1, dtype=np.int64)
        starts = np.maximum(offsets[docs], lo) - offsets[docs]
        ends = np.minimum(offsets[docs + 1], hi) - offsets[docs]
        parts.append(np.stack([docs, starts, ends], axis=1))
    return np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)


def _finish(lengths, C, strategy, segments, gathered_docs, cm: CostModel) -> ShardPlan:
    """Cost the segments and build the plan (block time = max over ranks of
    gathered-doc compute + max(local-doc attention, K/V exchange) + local linear).
    ``gathered_docs=None`` gathers exactly the documents held by several ranks."""
    # cost what the ranks will run: touching chunks of one document are one kernel call
    segments = [_merge_adjacent(s) for s in segments]
    gathered = np.zeros(len(lengths), dtype=bool)
    if gathered_docs is None:
        seen = np.zeros(len(lengths), dtype=np.int64)
        for s in segments:
            seen[np.unique(s[:, 0])] += 1
        gathered = seen > 1
    else:
        gathered[gathered_docs] = True
    gdocs = np.flatnonzero(gathered).astype(np.int64)
    comm = float(cm.comm_cost(int(lengths[gdocs].sum()), C)) if C > 1 else 0.0
    allseg = np.concatenate(segments)
    rank_of = np.repeat(np.arange(C), [len(x) for x in segments])
    cost = cm.segment_cost(allseg[:, 1], allseg[:, 2])
    local = ~gathered[allseg[:, 0]]
    local_attn = np.bincount(rank_of[local], weights=cm.attention_cost(allseg[local, 1], allseg[local, 2]),
                             minlength=C)
    compute = np.bincount(rank_of, weights=cost, minlength=C)
    # while the gather runs, each rank computes attention of its local documents
    exposed = np.maximum(local_attn, comm) if len(gdocs) else local_attn
    block = float(np.max(compute - local_attn + exposed))
    return ShardPlan(
        doc_lengths=lengths,
        cp_size=C,
        strategy=strategy,
        segments=tuple(segments),
        gathered_docs=gdocs,
        rank_compute_s=compute,
        comm_s=comm,
        block_time_s=block,
    )


def _merge_adjacent(seg: np.ndarray) -> np.ndarray:
    """Merge consecutive segments of one document that touch (e.g. the two middle
    chunks of a head-tail split), so the rank runs one kernel call instead of two."""
    seg = np.ascontiguousarray(seg, dtype=np.int64).reshape(-1, 3)
    if len(seg) < 2:
        return seg
    joins = (seg[1:, 0] == seg[:-1, 0]) & (seg[1:, 1] == seg[:-1, 2])
    if not joins.any():
        return seg
    starts = np.flatnonzero(np.concatenate([[True], ~joins]))
    ends = np.concatenate([starts[1:], [len(seg)]]) - 1
    return np.stack([seg[starts, 0], seg[starts, 1], seg[ends, 2]], axis=1)


def _sort_segments(seg: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    if len(seg) == 0:
        return seg.reshape(0, 3)
    order = np.argsort(offsets[seg[:, 0]] + seg[:, 1], kind="stable")
    return seg[order]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


# ---------------------------------------------------------------------------- baselines
def _contiguous(lengths, C, cm, **_) -> ShardPlan:
    offsets = _offsets(lengths)
    n = int(offsets[-1])
    cuts = [n * r // C for r in range(C + 1)]
    segments = [_row_ranges_to_segments(offsets, [(cuts[r], cuts[r + 1])]) for r in range(C)]
    # Llama-3 style CP all-gathers the K/V of the whole row every layer.
    return _finish(lengths, C, "contiguous", segments, np.arange(len(lengths)), cm)


def _zigzag(lengths, C, cm, **_) -> ShardPlan:
    offsets = _offsets(lengths)
    b = head_tail_bounds(np.array([offsets[-1]]), C)[0]
    segments = [_row_ranges_to_segments(offsets, [(b[r], b[r + 1]), (b[2 * C - 1 - r], b[2 * C - r])])
                for r in range(C)]
    # ring / all-gather attention over the whole row moves every document's K/V.
    return _finish(lengths, C, "zigzag", segments, np.arange(len(lengths)), cm)


def _per_doc(lengths, C, cm, **_) -> ShardPlan:
    docs = np.arange(len(lengths), dtype=np.int64)
    segments = _per_doc_segments(lengths, C)
    # Megatron THD / WLB per-document CP passes every document's K/V around the ring.
    return _finish(lengths, C, "per_doc", segments, docs, cm)


def _wlb_adaptive(lengths, C, cm, **_) -> ShardPlan:
    a, b = _zigzag(lengths, C, cm), _per_doc(lengths, C, cm)
    best = a if a.block_time_s <= b.block_time_s else b
    return ShardPlan(
        doc_lengths=best.doc_lengths, cp_size=C, strategy="wlb_adaptive", segments=best.segments,
        gathered_docs=best.gathered_docs, rank_compute_s=best.rank_compute_s, comm_s=best.comm_s,
        block_time_s=best.block_time_s,
    )


# ---------------------------------------------------------------------------- ATP
def _atp(lengths, C, cm: CostModel, *, max_tokens_per_rank=None, min_chunk=1, max_anchors=None, **_) -> ShardPlan:
    """Anchor-tail placement.

    For a candidate anchor count j (the j most expensive documents): the other
    documents (tails) are placed whole, longest first, on the least-loaded rank
    under the token cap; then every anchor is split head-tail over the ranks with
    per-rank shares that bring all ranks to one level (water filling). A rank's
    head and tail chunks of an anchor are mirror images of equal size, so its
    share of the anchor's attention work equals its share of the tokens, wherever
    the chunks sit. The smallest j whose ranks come out level wins, unless a
    larger j has a smaller estimated block time (compute + exposed K/V exchange).

    The chosen anchors are then re-split so that every rank is level in tokens and in
    causal attention pairs separately (a rank's head/tail proportion sets its pairs;
    see :func:`_two_way_anchor_segments`): such a plan stays level whatever the true
    price ratio of token-wise work and attention, which a cost model gets only
    approximately. It replaces the cost-level split unless its estimated block time is
    more than :data:`TWO_WAY_TOLERANCE` higher. Last, head-tail inside every document
    (the ``per_doc`` layout) competes on estimated block time.
    """
    D = len(lengths)
    offsets = _offsets(lengths)
    if C == 1:
        return _finish(lengths, 1, "atp", [np.stack([np.arange(D), np.zeros(D, np.int64), lengths], 1)],
                       np.zeros(0, np.int64), cm)
    cap = np.inf if max_tokens_per_rank is None else float(max_tokens_per_rank)
    whole = cm.doc_cost(lengths)
    whole_attn = cm.attention_cost(np.zeros(D, np.int64), lengths)
    order = np.argsort(-whole, kind="stable")  # most expensive first (ties: row order)
    eligible = order[lengths[order] >= 2 * C * min_chunk]
    jmax = len(eligible) if max_anchors is None else min(len(eligible), int(max_anchors))
    cand = eligible[:jmax]
    target = float(whole.sum()) / C
    # documents costlier than a rank's share must be split; start there.
    j0 = min(jmax, int(np.count_nonzero(whole[cand] > target)))
    anchor_len = np.concatenate([[0], np.cumsum(lengths[cand])])
    zeros_c = np.zeros(C)

    not_tail = np.zeros(D, dtype=bool)
    not_tail[cand[:j0]] = True
    best = None
    stale = 0
    for j in range(j0, jmax + 1):
        if j > j0:
            not_tail[cand[j - 1]] = True
        tails = order[~not_tail[order]]
        placed = _place_tails(D, tails, whole[tails], whole_attn[tails], lengths[tails],
                              zeros_c, np.zeros(C, np.int64), cap)
        if placed is None:
            continue  # tails do not fit under the cap: more anchors needed
        owner, load, tok, tail_attn = placed
        bounds = None
        if j:
            filled = _water_fill(cm, lengths[cand[:j]], whole[cand[:j]], load, tok, cap)
            if filled is None:
                continue
            bounds, added = filled
            load = load + added
        comm = float(cm.comm_cost(int(anchor_len[j]), C))
        block = float(np.max(load - tail_attn + np.maximum(tail_attn, comm if j else 0.0)))
        if best is None or block < best[0] * (1 - 1e-9):
            best = (block, j, owner, bounds)
            stale = 0
        else:
            stale += 1
        # level ranks: more anchors only add K/V traffic and remove overlap.
        if float(load.max()) <= float(load.mean()) * 1.005 or stale >= 3:
            break
    anchor_plan = None
    if best is not None:
        _, j, owner, bounds = best
        anchors = cand[:j]
        per_rank = _head_tail_segments(anchors, bounds, C) if j else [np.zeros((0, 3), np.int64)] * C
        tails = np.flatnonzero(owner >= 0)
        tail_segs = []
        for rr in range(C):
            t = tails[owner[tails] == rr]
            tail_segs.append(np.stack([t, np.zeros(len(t), np.int64), lengths[t]], axis=1))
        with_tails = lambda anchor_segs: [_sort_segments(np.concatenate([a, t]), offsets)  # noqa: E731
                                          for a, t in zip(anchor_segs, tail_segs)]
        anchor_plan = _finish(lengths, C, "atp", with_tails(per_rank), np.sort(anchors), cm)
        # The same anchors and tails with every rank level in tokens and in attention pairs
        # separately: balanced whatever the true price ratio of the two (the cost model's is
        # off by 5-20% on CPU); taken unless the estimate says it costs over TWO_WAY_TOLERANCE.
        two_way = _two_way_anchor_segments(lengths, C, anchors, owner, cap, min_chunk) if j else None
        if two_way is not None:
            plan = _finish(lengths, C, "atp", with_tails(two_way), np.sort(anchors), cm)
            if plan.block_time_s <= anchor_plan.block_time_s * (1 + TWO_WAY_TOLERANCE):
                anchor_plan = plan
    # Head-tail inside every document, moving only the K/V of documents it splits,
    # is a candidate too (ATP is never worse than per_doc); its block time is costed
    # without building it first, and the plan is built only if it can win.
    if anchor_plan is None or _per_doc_block_time(lengths, C, cm) < anchor_plan.block_time_s * (1 + 1e-6):
        even = _finish(lengths, C, "atp", _per_doc_segments(lengths, C), None, cm)
        if even.rank_num_tokens().max() <= cap and (anchor_plan is None
                                                      or even.block_time_s < anchor_plan.block_time_s):
            return even
    if anchor_plan is None:
        # neither anchor-tail nor per-document head-tail fits the cap; a contiguous
        # split fits every cap >= ceil(tokens / C), i.e. every cap any placement can
        # respect (plan_shards reports the overflow otherwise). It gathers only the
        # documents it cuts.
        plan = _contiguous(lengths, C, cm)
        return _finish(lengths, C, "atp", list(plan.segments), None, cm)
    return anchor_plan


def _causal_pairs(n):
    """Query-key pairs of a causal prefix of ``n`` tokens (int or int64 array)."""
    return n * (n + 1) // 2


def _two_way_anchor_segments(lengths: np.ndarray, C: int, anchors: np.ndarray, owner: np.ndarray, cap: float,
                             min_chunk: int) -> list[np.ndarray] | None:
    """Split ``anchors`` over the ranks so that, with the tails ``owner`` places, every rank
    gets the same number of tokens *and* the same number of causal query-key pairs.

    A rank's token share of an anchor sets its token count; where its chunks sit sets its
    pairs: a chunk ``[s, e)`` has ``pairs(e) - pairs(s)`` of them, so moving tokens from a
    rank's head chunk to its tail chunk raises its pairs, linearly in the tokens moved.
    Ranks are laid out from the outside in (heads from the document's start, tails from its
    end), those furthest from their target first, as outer chunks reach the widest range;
    the innermost rank takes the middle, and with it the remainder. Anchors are visited
    largest first; each absorbs what it can of every rank's remaining pair need, the later
    ones assumed mirrored (pairs proportional to tokens). A rank's head or tail is not cut
    shorter than ``min_chunk`` (it gets one chunk instead, or a clipped split).

    Returns per-rank (n, 3) anchor segments, or None where no such split exists: a rank's
    tails alone exceed a rank's share of tokens or pairs, or the cap forbids level tokens.
    """
    L = lengths.astype(np.int64)
    tails = np.flatnonzero(owner >= 0)
    tail_tok = np.bincount(owner[tails], weights=L[tails].astype(np.float64), minlength=C)
    tail_pairs = np.bincount(owner[tails], weights=_causal_pairs(L[tails]).astype(np.float64), minlength=C)
    need_tok = float(L.sum()) / C - tail_tok
    need_pairs = float(_causal_pairs(L).sum()) / C - tail_pairs
    if need_tok.min() < 0 or need_pairs.min() < 0 or need_tok.sum() <= 0 or np.ceil(float(L.sum()) / C) > cap:
        return None
    A = L[anchors]
    # level token counts: integer per-rank totals (within a token of level, so under every
    # feasible cap), each anchor split in proportion to them, rounding repaired
    goal = np.floor(need_tok + 1e-9).astype(np.int64)
    goal[np.argsort(-(need_tok - goal), kind="stable")[: int(A.sum() - goal.sum())]] += 1
    want = A[:, None] * (goal / goal.sum())[None, :]
    n = np.floor(want).astype(np.int64)
    for d in range(len(A)):  # hand out the rounding remainders, largest fraction first
        short = int(A[d] - n[d].sum())
        n[d, np.argsort(-(want[d] - n[d]), kind="stable")[:short]] += 1
    off = n.sum(axis=0) - goal
    while off.any():  # per-anchor rounding can leave a rank a token or two over its total
        o, u = int(np.argmax(off)), int(np.argmin(off))
        d = int(np.argmax(n[:, o]))
        k = int(min(off[o], -off[u], n[d, o]))
        n[d, o] -= k
        n[d, u] += k
        off[o] -= k
        off[u] += k
    mirror = n * (A[:, None] + 1) / 2.0  # pairs of a mirrored head-tail share
    remaining = need_pairs.copy()
    out: list[list[np.ndarray]] = [[] for _ in range(C)]
    for d in range(len(A)):
        Ld = int(A[d])
        target = remaining - mirror[d + 1:].sum(axis=0)
        ranks = [int(r) for r in np.argsort(-np.abs(target - mirror[d]), kind="stable") if n[d, r] > 0]
        H, E = 0, Ld
        for i, r in enumerate(ranks):
            nr = int(n[d, r])
            if i == len(ranks) - 1:  # innermost: the middle, one chunk
                h = nr
            else:
                # pairs(h) = pairs(H + h) - pairs(H) + pairs(E) - pairs(E - nr + h): linear in h
                a, b = H, E - nr
                base = (_causal_pairs(E) - _causal_pairs(a)) + (a - b) * (a + b + 1) / 2.0
                slope = float(a - b)  # < 0: a longer head (a shorter tail) has fewer pairs
                h = int(np.clip(np.rint((target[r] - base) / slope), 0, nr)) if slope < 0 else (nr + 1) // 2
                if 0 < h < min_chunk or 0 < nr - h < min_chunk:  # no chunk under min_chunk tokens
                    h = (0 if h < nr - h else nr) if nr < 2 * min_chunk else int(np.clip(h, min_chunk, nr - min_chunk))
            segs = [(int(anchors[d]), H, H + h), (int(anchors[d]), E - (nr - h), E)]
            got = _causal_pairs(H + h) - _causal_pairs(H) + _causal_pairs(E) - _causal_pairs(E - (nr - h))
            remaining[r] -= got
            out[r].append(np.array([sg for sg in segs if sg[2] > sg[1]], dtype=np.int64).reshape(-1, 3))
            H, E = H + h, E - (nr - h)
    return [np.concatenate(x) if x else np.zeros((0, 3), np.int64) for x in out]


def _water_fill(cm: CostModel, lengths: np.ndarray, costs: np.ndarray, load: np.ndarray,
                tok: np.ndarray, cap: float):
    """Split anchors head-tail with per-rank shares that level the loads.

    Args: anchor lengths and whole costs (j,), per-rank load and tokens before them.
    Returns ((j, 2C+1) chunk bounds, (C,) added cost per rank), or None if the cap forbids it.
    """
    C = len(load)
    room = cap - tok
    total = float(costs.sum())
    srt = np.sort(load)
    levels = (total + np.cumsum(srt)) / np.arange(1, C + 1)
    kk = int(np.flatnonzero(levels >= srt)[-1])
    share = np.maximum(levels[kk] - load, 0.0)
    frac = share / share.sum() if share.sum() > 0 else np.full(C, 1.0 / C)
    split = _split_by_share(cm, lengths, frac, room)
    if split is None:
        return None
    bounds, n, added = split
    # Tile quantisation makes per-token cost differ a little between ranks: one
    # correction step rescales each rank's tokens by its measured cost per token.
    got = n.sum(axis=0)
    if share.sum() > 0 and np.all(added[got > 0] > 0):
        per_tok = np.where(got > 0, added / np.maximum(got, 1), 0.0)
        adj = np.where((frac > 0) & (per_tok > 0), share / np.where(per_tok > 0, per_tok, 1.0), 0.0)
        if adj.sum() > 0:
            split2 = _split_by_share(cm, lengths, adj / adj.sum(), room)
            if split2 is not None and np.max(load + split2[2]) < np.max(load + added):
                bounds, n, added = split2
    return bounds, added


def _split_by_share(cm: CostModel, lengths: np.ndarray, frac: np.ndarray, room: np.ndarray):
    """Head-tail bounds giving rank r about ``frac[r]`` of each document's tokens, with
    no rank over its ``room`` (tokens left under the cap). Returns (bounds, tokens
    (j, C), cost per rank), or None if the documents do not fit."""
    C = len(frac)
    total = int(lengths.sum())
    if total > room.sum():
        return None
    # clip shares at the cap, handing the excess to ranks with room (a few rounds at most)
    want_tot = frac * total
    for _ in range(C):
        over = want_tot > room
        if not over.any():
            break
        excess = float((want_tot[over] - room[over]).sum())
        want_tot[over] = room[over]
        free = (~over) & (want_tot < room)
        weights = frac * free if (frac * free).sum() > 0 else free.astype(float)
        if weights.sum() == 0:
            return None
        want_tot = want_tot + excess * weights / weights.sum()
    frac = want_tot / total
    want = lengths[:, None] * frac[None, :]
    n = np.floor(want + 1e-9).astype(np.int64)
    left = room - n.sum(axis=0)
    rest = lengths - n.sum(axis=1)
    if rest.any():
        remainder = want - n
        for d in np.flatnonzero(rest):
            for r in np.argsort(-remainder[d], kind="stable"):
                if rest[d] == 0:
                    break
                if left[r] >= 1:
                    n[d, r] += 1
                    left[r] -= 1
                    rest[d] -= 1
            if rest[d]:
                for r in np.flatnonzero(left >= 1)[: rest[d]]:
                    n[d, r] += 1
                    left[r] -= 1
                    rest[d] -= 1
            if rest[d]:
                return None
    heads = (n + 1) // 2
    sizes = np.concatenate([heads, (n - heads)[:, ::-1]], axis=1)
    bounds = np.zeros((len(lengths), 2 * C + 1), dtype=np.int64)
    np.cumsum(sizes, axis=1, out=bounds[:, 1:])
    r = np.arange(C)
    added = (cm.segment_cost(bounds[:, r], bounds[:, r + 1])
             + cm.segment_cost(bounds[:, 2 * C - 1 - r], bounds[:, 2 * C - r])).sum(axis=0)
    return bounds, n, added


def _place_tails(num_docs, tails, cost, attn, toks, base_load, base_tok, cap):
    """Longest-processing-time placement of whole documents (given most expensive first):
    each goes to the least-loaded rank whose token count stays under the cap.

    Returns (owner per document id, load, tokens, local attention per rank), or None
    if some document fits on no rank. Pure Python on small lists: faster than numpy here.
    """
    C = len(base_load)
    owner = np.full(num_docs, -1, dtype=np.int64)
    load = [float(x) for x in base_load]
    tok = [int(x) for x in base_tok]
    tail_attn = [0.0] * C
    heap = [(load[r], r) for r in range(C)]
    heapq.heapify(heap)
    who = [0] * len(tails)
    for i, (c, a, n) in enumerate(zip(cost.tolist(), attn.tolist(), toks.tolist())):
        l, r = heap[0]
        if tok[r] + n > cap:  # least-loaded rank is full: take the least-loaded with room
            fits = [(load[q], q) for q in range(C) if tok[q] + n <= cap]
            if not fits:
                return None
            l, r = min(fits)
            heap.remove((l, r))
            heapq.heapify(heap)
            heapq.heappush(heap, (l + c, r))
        else:
            heapq.heapreplace(heap, (l + c, r))
        load[r] = l + c
        tok[r] += n
        tail_attn[r] += a
        who[i] = r
    owner[tails] = who
    return owner, np.asarray(load), np.asarray(tok, dtype=np.int64), np.asarray(tail_attn)


STRATEGIES: dict[str, Callable[..., ShardPlan]] = {
    "atp": _atp,
    "contiguous": _contiguous,
    "zigzag": _zigzag,
    "per_doc": _per_doc,
    "wlb_adaptive": _wlb_adaptive,
}

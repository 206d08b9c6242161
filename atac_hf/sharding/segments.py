"""Shared pieces of the sharding planners: input checks, head-tail chunk bounds, segment
lists, and :func:`finish_plan`, which costs a per-rank segment list into a :class:`ShardPlan`.

A *segment* is ``(doc, start, end)``: query rows ``[start, end)`` of document ``doc`` (see
:mod:`atac_hf.sharding.plan`). A rank's segment list is an ``(n, 3)`` int64 array in row order.
Numpy only.
"""

from __future__ import annotations

from typing import Any

import functools
import heapq

import numpy as np

from ..cost import CostModel
from .exchange import a2a_pair_counts_flat
from .routing import route_blocks, routed_pair_counts, routes
from .plan import ShardPlan

__all__ = ["causal_pairs", "check_doc_lengths", "fill_empty_ranks", "finish_plan", "head_tail_bounds", "head_tail_segments",
           "is_int", "merge_adjacent", "per_doc_segments", "row_offsets", "row_ranges_to_segments",
           "sort_segments"]


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_doc_lengths(doc_lengths: Any) -> np.ndarray:
    """``doc_lengths`` as a (D,) int64 array, or ValueError naming what is wrong:
    not a flat non-empty sequence, a bool, a string or a non-integral number among them, a
    length < 1, or more than 2**62 tokens in all."""
    if isinstance(doc_lengths, (list, tuple)):
        # numpy turns True into 1 and mixes bools into int arrays silently: a bool is not a length
        bad = next((i for i, x in enumerate(doc_lengths) if isinstance(x, (bool, np.bool_))), None)
        if bad is not None:
            raise ValueError(f"doc_lengths[{bad}] is the bool {doc_lengths[bad]!r}, not a document length: "
                             "doc_lengths must be integers (ints >= 1)")
    if isinstance(doc_lengths, np.ma.MaskedArray) and np.ma.getmaskarray(doc_lengths).any():
        # np.asarray would plan the masked entries' raw data as if they were lengths
        raise ValueError("doc_lengths is a masked array with masked entries: pass the lengths of the documents "
                         "of the pack only (doc_lengths.compressed())")
    try:
        arr = np.asarray(doc_lengths)
    except (ValueError, TypeError, OverflowError):  # ragged nesting, odd objects
        raise ValueError("doc_lengths must be a flat 1-D sequence of ints (got a ragged nested sequence)") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"doc_lengths must be a non-empty 1-D sequence of ints, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        raise ValueError("doc_lengths is a bool array, not document lengths: doc_lengths must be integers "
                         "(ints >= 1)")
    if arr.dtype == object and all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                                   and -2**63 <= x < 2**63 for x in arr.tolist()):
        arr = arr.astype(np.int64)  # Python ints held as objects (a pandas object column): lengths as the list is
    if arr.dtype != np.int64 and not np.issubdtype(arr.dtype, np.integer):  # int64: the usual case, checked first
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)) \
                and float(np.abs(arr).max()) < 2.0**62:
            arr = arr.astype(np.int64)
        else:
            what = "ints beyond int64 or other objects" if arr.dtype == object else f"dtype {arr.dtype}"
            raise ValueError(f"doc_lengths must be integers (ints >= 1), got {what}")
    if arr.min() < 1:
        bad = int(np.argmin(arr))
        raise ValueError(
            f"document {bad} has length {int(arr[bad])}; every document must have >= 1 token "
            "(drop empty documents before packing)"
        )
    approx = float(arr.astype(np.float64).sum())  # exact below (Python ints) only near the bound
    if approx >= 2.0**62 * (1 - 1e-9) and (approx > 2.0**62 * (1 + 1e-9) or sum(arr.tolist()) >= 2**62):
        raise ValueError(f"the pack holds {approx:.3g} tokens, 2**62 or more: the document lengths are not "
                         "token counts (a pack holds at most 2**62 - 1 tokens)")
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


def head_tail_segments(docs: np.ndarray, bounds: np.ndarray, C: int) -> list[np.ndarray]:
    """Per rank (n, 3) segments of head-tail splits of ``docs`` (bounds from head_tail_bounds)."""
    out = []
    for r in range(C):
        head = np.stack([docs, bounds[:, r], bounds[:, r + 1]], axis=1)
        tail = np.stack([docs, bounds[:, 2 * C - 1 - r], bounds[:, 2 * C - r]], axis=1)
        seg = np.stack([head, tail], axis=1).reshape(-1, 3)
        out.append(seg[seg[:, 2] > seg[:, 1]])
    return out


def per_doc_segments(lengths: np.ndarray, C: int) -> list[np.ndarray]:
    """``head_tail_segments(arange(D), head_tail_bounds(lengths, C), C)`` in O(D) memory: one
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
        if not left.any():  # every later rank is empty (C beyond the longest document)
            out.extend(np.zeros((0, 3), np.int64) for _ in range(C - r - 1))
            break
        if not left.all():
            docs, base, rem, head_start, tail_end = docs[left], base[left], rem[left], head_start[left], tail_end[left]
    return out


#: per_doc_flat lays packs of up to this many (document, rank) pairs out at once ((D, 2C + 1) bounds);
#: larger ones rank by rank (per_doc_segments, O(D) memory).
_PER_DOC_FLAT_MAX = 1 << 16


def per_doc_flat(lengths: np.ndarray, C: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`per_doc_segments` as one (S, 3) array of every rank's segments in turn and the (S,) rank
    of each (what :func:`finish_flat` takes). ATP costs this layout for every pack it may win on:
    for a pack of tens of documents, a dozen numpy calls on :func:`head_tail_bounds` instead of a
    dozen per rank."""
    L = np.asarray(lengths, dtype=np.int64)
    D = len(L)
    if D * C > _PER_DOC_FLAT_MAX:
        segs = per_doc_segments(L, C)
        return np.concatenate(segs), np.repeat(np.arange(C), [len(x) for x in segs])
    b = head_tail_bounds(L, C)
    seg = np.empty((C, D, 2, 3), dtype=np.int64)  # rank, document, head / tail, (doc, start, end)
    seg[:, :, :, 0] = np.arange(D)[None, :, None]
    seg[:, :, 0, 1], seg[:, :, 0, 2] = b[:, :C].T, b[:, 1:C + 1].T  # rank r's head: chunk r
    seg[:, :, 1, 1], seg[:, :, 1, 2] = b[:, 2 * C - 1:C - 1:-1].T, b[:, 2 * C:C:-1].T  # its tail: chunk 2C-1-r
    seg = seg.reshape(-1, 3)
    keep = seg[:, 2] > seg[:, 1]
    return seg[keep], np.repeat(np.arange(C), 2 * D)[keep]


def row_ranges_to_segments(offsets: np.ndarray, ranges: list[tuple[int, int]]) -> np.ndarray:
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


def finish_plan(lengths, C, strategy, segments, gathered_docs, cm: CostModel, exchange: str = "all_gather", *,
                bound: float | None = None, route: int | None | str = "auto") -> ShardPlan | None:
    """Cost the segments and build the plan (block time = max over ranks of
    gathered-doc compute + max(local-doc attention, K/V exchange) + local linear).
    ``gathered_docs=None`` gathers exactly the documents held by several ranks.
    ``exchange``: ``"all_gather"``, ``"all_to_all"`` (only the needed K/V rows, priced by
    :meth:`~atac_hf.cost.CostModel.a2a_pair_cost`: the busiest rank's links), or ``"auto"``:
    the all-to-all where its exchange is estimated faster than the all-gather's (whether or not
    either is hidden behind local attention), else the all-gather. ``bound``: return None instead
    where some rank's compute exceeds it (the block time, never below that, would too). ``route``:
    the all-to-all's node routing (:mod:`~atac_hf.sharding.routing`): ``"auto"`` routes where that is
    estimated faster, None never, a node size always (re-costing a plan as it runs)."""
    flat = [np.asarray(x, dtype=np.int64).reshape(-1, 3) for x in segments]
    allseg = np.concatenate(flat) if flat else np.zeros((0, 3), np.int64)
    rank_of = np.repeat(np.arange(C), [len(x) for x in flat])
    return finish_flat(lengths, C, strategy, allseg, rank_of, gathered_docs, cm, exchange, bound=bound, route=route)


def finish_flat(lengths, C, strategy, allseg, rank_of, gathered_docs, cm: CostModel,
                exchange: str = "all_gather", *, bound: float | None = None, defer_a2a: bool = False,
                route: int | None | str = "auto") -> ShardPlan | None:
    """:func:`finish_plan` of the segments ``allseg`` ((S, 3) int64, every rank's in turn) held by
    ranks ``rank_of`` ((S,), non-decreasing): the same plan, without a list of per-rank arrays.
    ``defer_a2a`` (with ``"auto"``): where the all-gather is hidden on every rank, the block time
    is that of either exchange, and the all-to-all is not costed yet: the plan says all-gather
    until :func:`resolve_exchange` decides (a planner's losing candidates never need it)."""
    # cost what the ranks will run: touching chunks of one document are one kernel call
    allseg, rank_of = _merge_flat(allseg, rank_of)
    gathered = np.zeros(len(lengths), dtype=bool)
    if gathered_docs is None:
        # documents held by 2+ ranks: distinct (document, rank) pairs counted per document (np.unique's
        # sort and mask, without its Python-level overhead)
        held = np.sort(allseg[:, 0] * C + rank_of)
        distinct = np.ones(len(held), dtype=bool)
        distinct[1:] = held[1:] != held[:-1]
        gathered = np.bincount(held[distinct] // C, minlength=len(lengths)) > 1
    else:
        gathered[gathered_docs] = True
    gdocs = gathered.nonzero()[0].astype(np.int64)
    comm = float(cm.comm_cost(int(lengths[gdocs].sum()), C)) if C > 1 else 0.0
    ends = np.cumsum(np.bincount(rank_of, minlength=C)).tolist()
    segments = [allseg[a:b] for a, b in zip([0] + ends[:-1], ends)]
    cost, attn = cm.segment_and_attention_cost(allseg[:, 1], allseg[:, 2])
    local = ~gathered[allseg[:, 0]]
    local_attn = np.bincount(rank_of[local], weights=attn[local], minlength=C)
    compute = np.bincount(rank_of, weights=cost, minlength=C)
    # every rank's block time is at least its compute (the margin covers the rounding of the sum)
    if bound is not None and float(compute.max()) > bound * (1 + 1e-9):
        return None
    kind, routed, tail = "all_gather", None, 0.0
    # "auto" takes the all-to-all where its exchange is estimated faster, hidden or not (it then
    # moves fewer bytes over links that other traffic shares)
    deferred = defer_a2a and exchange == "auto" and C > 1 and len(gdocs) and bool(np.all(comm <= local_attn))
    # while the gather runs, each rank computes attention of its local documents
    exposed = np.maximum(local_attn, comm) if len(gdocs) else local_attn
    block = float(np.max(compute - local_attn + exposed))
    if exchange != "all_gather" and C > 1 and len(gdocs) and not deferred:
        a2a = _a2a_options(allseg, rank_of, C, gathered, segments, cm, compute, local_attn, route)
        if exchange == "all_to_all" or (a2a[0], a2a[1]) < (block, comm):
            block, comm, tail, routed = a2a
            kind = "all_to_all"
    plan = ShardPlan(
        doc_lengths=lengths,
        cp_size=C,
        strategy=strategy,
        segments=tuple(segments),
        gathered_docs=gdocs,
        rank_compute_s=compute,
        comm_s=comm,
        block_time_s=block,
        kv_exchange=kind,
        kv_window=cm.exchange_window if kind == "all_to_all" else None,
        kv_route_node=routed,
        comm_tail_s=tail,
    )
    if deferred:  # what resolve_exchange needs, kept flat
        plan._cache["a2a_deferred"] = (allseg, rank_of, gathered, segments, local_attn)
    return plan


def resolve_exchange(plan: ShardPlan, cm: CostModel) -> ShardPlan:
    """``plan`` with the exchange :func:`finish_flat` deferred (``defer_a2a``) decided: the
    all-to-all where it is estimated faster than the all-gather (the block time is the same:
    either is hidden). Plans not deferred come back unchanged."""
    deferred = plan._cache.pop("a2a_deferred", None)
    if deferred is None:
        return plan
    allseg, rank_of, gathered, segments, local_attn = deferred
    block, comm, tail, route = _a2a_options(allseg, rank_of, plan.cp_size, gathered, segments, cm,
                                            plan.rank_compute_s, local_attn)
    if not (block, comm) < (plan.block_time_s, plan.comm_s):
        return plan
    return ShardPlan(doc_lengths=plan.doc_lengths, cp_size=plan.cp_size, strategy=plan.strategy,
                     segments=plan.segments, gathered_docs=plan.gathered_docs, rank_compute_s=plan.rank_compute_s,
                     comm_s=comm, block_time_s=block, kv_exchange="all_to_all",
                     kv_window=cm.exchange_window, kv_route_node=route, comm_tail_s=tail)


def _a2a_options(allseg, rank_of, C, gathered, segments, cm: CostModel, compute, local_attn, route="auto"):
    """``(block, comm, tail, route)`` of the all-to-all: direct, or routed by node
    (:mod:`~atac_hf.sharding.routing`) where the group spans nodes and that is estimated faster (block
    time, then exchange time). Where the direct exchange is hidden on every rank, the routed one,
    whose second phase nothing hides, cannot lower the block time: it is not costed. ``route``: see
    :func:`finish_plan`."""
    if route is None or route == "auto":
        comm = cm.a2a_pair_cost(a2a_pair_counts_flat(allseg, rank_of, C, gathered, cm.exchange_window, segments))
        best = (float(np.max(compute - local_attn + np.maximum(local_attn, comm))), comm, 0.0, None)
        if route is None or not routes(C, cm.node_size) or bool(np.all(comm <= local_attn)):
            return best
        node = int(cm.node_size)
    else:
        best, node = None, int(route)
    first, second = routed_pair_counts(segments, gathered, cm.exchange_window, node)
    t1, t2 = cm.a2a_pair_cost(first), cm.a2a_pair_cost(second)
    routed = (route_blocks(compute, local_attn, t1, t2), t1 + t2, t2, node)
    return routed if best is None or routed[:2] < best[:2] else best


def fill_empty_ranks(plan: ShardPlan, cm: CostModel, exchange: str | None = None) -> ShardPlan:
    """``plan`` with a token on every rank, when the pack has at least cp_size tokens.

    A planner may leave a rank empty (a pack of few short documents: ``atp`` keeps documents
    shorter than ``2 * cp_size * min_chunk`` whole); transformers models cannot run on 0
    tokens. Each empty rank, in turn, takes the second half (in row order) of the tokens of the
    rank holding most: whole segments where they fit, else a cut of one segment, whose
    document is then gathered. The richest rank only loses tokens, so no cap is crossed;
    work is O(C log C + segments). Plans that already fill every rank, and packs of fewer
    tokens than ranks (some rank must stay empty), come back unchanged. ``exchange``: the K/V
    exchange the filled plan is costed for (None: ``"auto"`` for ``atp``, else the plan's own).
    """
    C = plan.cp_size
    held = plan.rank_num_tokens()
    if C == 1 or int(held.min()) > 0 or plan.num_tokens < C:
        return plan
    segs = list(plan.segments)
    heap = [(-int(t), r) for r, t in enumerate(held.tolist()) if t > 0]
    heapq.heapify(heap)
    for r in np.flatnonzero(held == 0).tolist():
        neg, q = heapq.heappop(heap)
        t = -neg  # >= 2: C ranks share >= C tokens and this one has none
        k = t // 2
        seg = segs[q]
        from_end = np.cumsum((seg[:, 2] - seg[:, 1])[::-1])
        i = int(np.searchsorted(from_end, k, side="left"))  # segments from the end: i whole, then part
        j = len(seg) - 1 - i
        need = k - (int(from_end[i - 1]) if i else 0)
        d, s, e = (int(x) for x in seg[j])
        if need == e - s:
            kept, moved = seg[:j], seg[j:]
        else:
            kept = np.concatenate([seg[:j], [[d, s, e - need]]]).astype(np.int64)
            moved = np.concatenate([[[d, e - need, e]], seg[j + 1:]]).astype(np.int64)
        segs[q], segs[r] = kept, moved
        heapq.heappush(heap, (-(t - k), q))
        heapq.heappush(heap, (-k, r))
    owners = np.zeros(plan.num_docs, dtype=np.int64)
    for x in segs:
        owners[np.unique(x[:, 0])] += 1
    gathered = np.union1d(plan.gathered_docs, np.flatnonzero(owners > 1)).astype(np.int64)
    if exchange is None:
        exchange = "auto" if plan.strategy == "atp" else plan.kv_exchange
    return finish_plan(plan.doc_lengths, C, plan.strategy, segs, gathered, cm, exchange)


def _merge_flat(allseg: np.ndarray, rank_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge_adjacent` of every rank's segments at once (``rank_of`` non-decreasing)."""
    if len(allseg) < 2:
        return allseg, rank_of
    joins = (allseg[1:, 0] == allseg[:-1, 0]) & (allseg[1:, 1] == allseg[:-1, 2]) & (rank_of[1:] == rank_of[:-1])
    if not joins.any():
        return allseg, rank_of
    starts = np.flatnonzero(np.concatenate([[True], ~joins]))
    ends = np.concatenate([starts[1:], [len(allseg)]]) - 1
    return np.stack([allseg[starts, 0], allseg[starts, 1], allseg[ends, 2]], axis=1), rank_of[starts]


def merge_adjacent(seg: np.ndarray) -> np.ndarray:
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


def sort_segments(seg: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    if len(seg) == 0:
        return seg.reshape(0, 3)
    order = np.argsort(offsets[seg[:, 0]] + seg[:, 1], kind="stable")
    return seg[order]


def row_offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def causal_pairs(n):
    """Query-key pairs of a causal prefix of ``n`` tokens (int or int64 array: n(n + 1) wraps int64
    past ``PAIRS_INT64_MAX`` tokens, see :func:`causal_pairs_float`)."""
    return n * (n + 1) // 2


PAIRS_INT64_MAX = 3_037_000_499  # the longest prefix whose n(n + 1) fits in int64


def causal_pairs_float(lengths: np.ndarray) -> np.ndarray:
    """(D,) causal pairs of each of the int64 ``lengths`` as float64, each the exact count rounded once
    (int64 up to ``PAIRS_INT64_MAX`` tokens, Python ints past it, where int64 would wrap)."""
    if lengths.size and int(lengths.max()) > PAIRS_INT64_MAX:
        return np.array([float(causal_pairs(n)) for n in lengths.tolist()], dtype=np.float64)
    return causal_pairs(lengths).astype(np.float64)


def causal_pairs_total(lengths: np.ndarray) -> float:
    """The causal pairs of all ``lengths`` summed exactly, rounded once to a float: in int64 while the
    total cannot wrap (it is at most S(S + 1) / 2 for S tokens), in Python ints past that."""
    if int(lengths.sum()) <= PAIRS_INT64_MAX:
        return float(causal_pairs(lengths).sum())
    return float(sum(causal_pairs(n) for n in lengths.tolist()))


@functools.lru_cache(maxsize=64)
def _exact(cm: CostModel) -> CostModel:
    """``cm`` counting exact causal pairs (``tile=1``; cached: models are frozen)."""
    return cm.replace(tile=1)


def _exact_pairs(lengths: np.ndarray, cm: CostModel) -> np.ndarray:
    """(D,) exact causal pairs of each whole document (``cm``'s sliding window counted, no tiles)."""
    return _exact(cm).attention_pairs(np.zeros(len(lengths), np.int64), lengths)


def _cheapest(price: float, masked: float | None) -> float:
    """The cheaper of a causal price and its masked counterpart (None: the same)."""
    return min(price, price if masked is None else masked)


def _doc_work_lower_bounds(lengths: np.ndarray, cm: CostModel, pairs: np.ndarray | None = None) -> np.ndarray:
    """(D,) a lower bound of the summed compute of the segments any plan cuts each document into:
    its token-wise work, its exact causal pairs (what tiles, masks and windows add is never
    negative; the pairs of a document's chunks sum to the whole document's) at the cheaper of the
    causal and masked prices, and one kernel call at the cheaper per-call price (every document
    is at least one non-empty segment). ``pairs``: :func:`_exact_pairs`, where the caller has it."""
    price = _cheapest(cm.attn_s_per_pair, cm.masked_attn_s_per_pair)
    call = _cheapest(cm.segment_overhead_s, cm.masked_segment_overhead_s)
    pairs = _exact_pairs(lengths, cm) if pairs is None else pairs
    return lengths * cm.linear_s_per_token + pairs * price + call

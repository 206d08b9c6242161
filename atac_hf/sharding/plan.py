"""`ShardPlan`: which tokens of a packed row each context-parallel rank holds.

A plan is a pure function of (document lengths, cp_size, strategy, cost model):
every rank computes the same plan without talking, so nothing is broadcast. A
debug mode compares :attr:`ShardPlan.digest` across the group.

Coordinates: the packed row (or the rows of a batch, concatenated) holds
documents ``0..D-1`` back to back; document ``d`` covers row indices
``[offsets[d], offsets[d] + lengths[d])``. A *segment* ``(doc, start, end)``
is a run of that document's tokens in document coordinates.

Numpy only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .exchange import EXCHANGES, a2a_rows, a2a_token_counts, needed_ranges
from .routing import routed_pair_counts, routed_tables, routes

__all__ = ["ShardPlan", "LocalLayout", "VarlenLayout"]


@dataclass(frozen=True, eq=False)
class ShardPlan:
    """Placement of a pack's tokens on ``cp_size`` ranks.

    Attributes:
        doc_lengths: (D,) int64 lengths of the documents of the pack, in row order.
        cp_size: number of ranks in the CP group.
        strategy: name of the planner that produced the plan.
        segments: per rank, an (n_r, 3) int64 array of ``(doc, start, end)`` rows in
            the order the rank holds them (ascending row index).
        gathered_docs: sorted ids of documents whose K/V are all-gathered every
            layer. Always includes every document held by more than one rank
            (those need remote keys); strategies modelled on all-gather CP
            (``contiguous``, ``zigzag``) gather every document, as those systems do.
        rank_compute_s: (C,) estimated seconds of compute per rank (one layer, fwd+bwd).
        comm_s: estimated seconds of the whole K/V exchange (one layer, fwd+bwd), hidden or not.
        block_time_s: estimated seconds of one layer for the group: the slowest rank's, where a
            rank's time is its compute with the attention of its local (whole, not gathered)
            documents overlapping the exchange: ``compute - local_attn + max(local_attn,
            comm_s - comm_tail_s) + comm_tail_s``. So ``max(rank_compute_s) <= block_time_s
            <= max(rank_compute_s) + comm_s``; the exchange is exposed only where a rank's
            local attention is shorter than it.
        kv_exchange: how gathered K/V travel: ``"all_gather"`` (every rank receives every
            gathered document) or ``"all_to_all"`` (every rank receives only the key prefixes
            its chunks attend to; see :mod:`atac_hf.sharding.exchange`). The planner picks
            the one its cost model estimates faster.
        kv_window: the sliding window the all-to-all counts (:attr:`kv_recv_tokens`) assume
            (the cost model's; None: whole key prefixes). The runtime exchanges, layer by
            layer, what that layer's own window needs (:meth:`local_layout`).
        kv_route_node: for an ``all_to_all`` plan, the ranks per node its exchange is routed by
            (each row crosses a node boundary once, then proxies forward it inside the node;
            :mod:`atac_hf.sharding.routing`); None: direct.
        comm_tail_s: the part of ``comm_s`` no local attention hides (the routed exchange's
            second, intra-node phase; 0 otherwise).
    """

    doc_lengths: np.ndarray
    cp_size: int
    strategy: str
    segments: tuple[np.ndarray, ...]
    gathered_docs: np.ndarray
    rank_compute_s: np.ndarray
    comm_s: float = 0.0
    block_time_s: float = 0.0
    kv_exchange: str = "all_gather"
    kv_window: int | None = None
    kv_route_node: int | None = None
    comm_tail_s: float = 0.0
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kv_exchange not in EXCHANGES:
            raise ValueError(f"ShardPlan.kv_exchange must be one of {list(EXCHANGES)}, got {self.kv_exchange!r}")
        node = self.kv_route_node
        if node is not None and (self.kv_exchange != "all_to_all" or isinstance(node, bool)
                                 or not isinstance(node, (int, np.integer)) or not routes(self.cp_size, node)):
            raise ValueError(f"ShardPlan.kv_route_node={self.kv_route_node!r} needs kv_exchange='all_to_all' and "
                             f"2 <= kv_route_node < cp_size={self.cp_size} (or None: a direct exchange)")

    # ------------------------------------------------------------------ basic views
    @cached_property
    def doc_offsets(self) -> np.ndarray:
        """(D + 1,) row offset of each document; ``doc_offsets[-1]`` is the row length."""
        out = np.zeros(len(self.doc_lengths) + 1, dtype=np.int64)
        np.cumsum(self.doc_lengths, out=out[1:])
        return out

    @property
    def num_tokens(self) -> int:
        return int(self.doc_offsets[-1])

    @property
    def num_docs(self) -> int:
        return len(self.doc_lengths)

    def rank_segments(self, rank: int) -> np.ndarray:
        """(n, 3) ``(doc, start, end)`` rows held by ``rank``, in local order."""
        self._check_rank(rank)
        return self.segments[rank]

    def rank_token_indices(self, rank: int) -> np.ndarray:
        """Sorted int64 indices into the packed row of the tokens ``rank`` holds."""
        self._check_rank(rank)
        key = ("tok", int(rank))
        if key not in self._cache:
            seg = self.rank_segments(rank)
            self._cache[key] = _expand(self.doc_offsets[seg[:, 0]] + seg[:, 1], seg[:, 2] - seg[:, 1])
        return self._cache[key]

    def rank_num_tokens(self) -> np.ndarray:
        """(C,) tokens held per rank."""
        return np.array([int((s[:, 2] - s[:, 1]).sum()) for s in self.segments], dtype=np.int64)

    @cached_property
    def sharded_docs(self) -> np.ndarray:
        """Sorted ids of documents whose tokens lie on more than one rank (the anchors)."""
        owners = np.concatenate([np.full(len(s), r) for r, s in enumerate(self.segments)] or [np.zeros(0)])
        docs = np.concatenate([s[:, 0] for s in self.segments] or [np.zeros(0, np.int64)])
        if len(docs) == 0:
            return np.zeros(0, dtype=np.int64)
        pairs = np.unique(np.stack([docs, owners.astype(np.int64)]), axis=1)
        d, counts = np.unique(pairs[0], return_counts=True)
        return d[counts > 1].astype(np.int64)

    @property
    def kv_tokens(self) -> int:
        """Tokens whose K/V travel (lengths of the gathered documents, summed)."""
        return int(self.doc_lengths[self.gathered_docs].sum())

    def kv_bytes(self, kv_bytes_per_token: float) -> float:
        """Bytes a rank receives in the forward K/V exchange given one token's (one layer's, as
        :attr:`CostModel.kv_bytes_per_token`, or all layers'): the all-gather's ring ``(C - 1) / C`` of the
        gathered tokens; the all-to-all's most any rank receives (:attr:`kv_recv_tokens`)."""
        b = kv_bytes_per_token  # a finite number >= 0, never a bool (np.bool_ is no np.integer)
        if isinstance(b, bool) or not isinstance(b, (int, float, np.integer, np.floating)) or not 0 <= b < np.inf:
            raise ValueError(f"kv_bytes_per_token={kv_bytes_per_token!r} is invalid: a finite number >= 0 (K/V bytes "
                             "of one token: one layer's, CostModel.kv_bytes_per_token, or all layers)")
        if self.cp_size <= 1:
            return 0.0
        if self.kv_exchange == "all_to_all":
            return float(self.kv_recv_tokens.max()) * kv_bytes_per_token
        return self.kv_tokens * kv_bytes_per_token * (self.cp_size - 1) / self.cp_size

    @cached_property
    def kv_recv_tokens(self) -> np.ndarray:
        """(C,) K/V rows each rank receives per layer (forward) in this plan's exchange: of the
        all-gather, every other rank's rows of the gathered documents (padding not counted); of
        the all-to-all, the key prefixes its chunks attend to that other ranks hold."""
        if self.kv_exchange == "all_to_all" and self.kv_route_node is not None:  # both phases
            first, second = routed_pair_counts(self.segments, self.gathered_mask(), self.kv_window, self.kv_route_node)
            return (first.sum(axis=0) + second.sum(axis=0)).astype(np.int64)
        if self.kv_exchange == "all_to_all":
            return self.a2a_token_counts[0]
        return self.kv_tokens - self._gathered_rows_per_rank()

    @cached_property
    def a2a_token_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(recv, send)``: (C,) K/V rows each rank would receive and send per layer in the
        all-to-all exchange, whichever exchange the plan uses (for comparisons)."""
        return a2a_token_counts(self.segments, self.gathered_mask(), self.kv_window)

    def gathered_mask(self) -> np.ndarray:
        """(D,) bool: which documents' K/V are exchanged."""
        m = np.zeros(self.num_docs, dtype=bool)
        m[self.gathered_docs] = True
        return m

    def _gathered_rows_per_rank(self) -> np.ndarray:
        g = self.gathered_mask()
        return np.array([int((s[g[s[:, 0]], 2] - s[g[s[:, 0]], 1]).sum()) if len(s) else 0 for s in self.segments],
                        dtype=np.int64)

    @property
    def imbalance(self) -> float:
        """Estimated max / mean per-rank compute (1.0 is perfect)."""
        mean = float(np.mean(self.rank_compute_s)) if len(self.rank_compute_s) else 0.0
        return float(np.max(self.rank_compute_s)) / mean if mean > 0 else 1.0

    @cached_property
    def digest(self) -> str:
        """A short hash of everything that decides what each rank computes."""
        h = hashlib.sha1()
        h.update(np.asarray([self.cp_size, len(self.doc_lengths)], dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(self.doc_lengths, dtype=np.int64).tobytes())
        for s in self.segments:
            h.update(np.asarray([len(s)], dtype=np.int64).tobytes())
            h.update(np.ascontiguousarray(s, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(self.gathered_docs, dtype=np.int64).tobytes())
        if self.kv_exchange != "all_gather":  # plans digested before the field existed keep their digest
            h.update(self.kv_exchange.encode())
        if self.kv_route_node is not None:
            h.update(f"route{int(self.kv_route_node)}".encode())
        return h.hexdigest()[:16]

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
            raise ValueError(f"rank {rank!r} is not an int: legal ranks of the CP group of size {self.cp_size}: "
                             f"0..{self.cp_size - 1}")
        if not 0 <= rank < self.cp_size:
            raise ValueError(f"rank {rank} is outside the CP group of size {self.cp_size} (legal: 0..{self.cp_size - 1})")

    # ------------------------------------------------------------------ runtime layouts
    def local_layout(self, rank: int, window: int | None = None) -> "LocalLayout":
        """What rank ``rank`` needs to run attention: segments in local coordinates and the K/V
        exchange layout. ``window``: the layer's sliding window; an ``all_to_all`` plan then
        exchanges only the keys inside it (the all-gather layout does not depend on it)."""
        self._check_rank(rank)
        window = check_window(window)
        if self.kv_exchange != "all_to_all":
            window = None
        key = ("layout", rank, window)
        if key not in self._cache:
            self._cache[key] = _build_local_layout(self, rank, key[2])
        return self._cache[key]

    def validate(self) -> None:
        """Check the plan's invariants (every token exactly once; split docs gathered). Raises AssertionError.
        Costs O(segments), not O(tokens): the segments' row ranges are compared, not expanded."""
        lo, hi = [], []
        for r in range(self.cp_size):
            seg = self.rank_segments(r)
            assert np.all(seg[:, 2] >= seg[:, 1]), f"rank {r}: a segment ends before it starts"
            assert np.all((seg[:, 0] >= 0) & (seg[:, 0] < len(self.doc_lengths))), f"rank {r}: no such document"
            assert np.all((seg[:, 1] >= 0) & (seg[:, 2] <= self.doc_lengths[seg[:, 0]]) | (seg[:, 2] == seg[:, 1])), \
                f"rank {r}: a segment lies outside its document"  # (an empty one holds nothing: allowed anywhere)
            start = self.doc_offsets[seg[:, 0]] + seg[:, 1]
            end = start + (seg[:, 2] - seg[:, 1])
            held = end > start  # an empty segment holds no token
            start, end = start[held], end[held]
            assert np.all(start[1:] >= end[:-1]), f"rank {r}: token indices not strictly increasing"
            lo.append(start)
            hi.append(end)
        start, end = np.concatenate(lo), np.concatenate(hi)
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
        # the ranges tile [0, num_tokens): each starts where the one before it ends
        tiled = np.array_equal(start, np.concatenate([[0], end[:-1]])) and (end[-1] if len(end) else 0) == self.num_tokens
        assert tiled, "some token is held by zero or several ranks"
        assert set(self.sharded_docs.tolist()) <= set(self.gathered_docs.tolist()), "a split document is not gathered"


@dataclass(frozen=True, eq=False)
class LocalLayout:
    """Per-rank index bookkeeping for the attention runtime (all int64 numpy arrays).

    Local tokens are the rank's tokens in ascending row order, ``n_local`` of them.

    Attributes:
        rank, cp_size: where this layout belongs.
        seg_doc: (S,) document of each local segment.
        seg_local_start, seg_local_end: (S,) the segment's query rows in the local tensor.
        seg_doc_start, seg_doc_end: (S,) the segment in document coordinates.
        seg_gathered: (S,) bool; True when its keys come from the gathered buffer.
        send_index: (n_send,) local rows whose K/V this rank contributes to the gather.
        send_counts: (C,) rows each rank contributes; the gather is padded to
            ``max_send`` rows per rank (equal-size collectives).
        doc_key_index: dict doc -> (L_d,) rows of the padded gathered buffer
            ``(C * max_send)`` that hold that document's keys in document order
            (only for gathered documents this rank has queries of).
        exchange: the plan's ``kv_exchange``. For ``"all_to_all"`` the fields above mean:
            ``send_index`` the local rows sent, destination by destination (rank order;
            a row goes once to each rank that needs it); ``send_counts`` (C,) rows sent to
            each rank (0 to itself); ``recv_counts`` (C,) rows received from each rank;
            ``self_index`` this rank's own rows of gathered documents; the key buffer is
            ``cat([own rows, received rows])`` and ``doc_key_index[d]`` maps the positions
            of ``d`` the local chunks attend to into it (-1 elsewhere).
        window: the sliding window an ``all_to_all`` layout exchanges for (None: whole
            key prefixes).
        route: for a node-routed ``all_to_all`` (:mod:`atac_hf.sharding.routing`), the second
            phase: ``send2`` rows of the first phase's receive buffer forwarded, destination by
            destination, ``send2_counts`` and ``recv2_counts`` (C,); the fields above then
            describe the first phase, and the key buffer is ``cat([own rows, first-phase rows,
            second-phase rows])``. None: direct.
    """

    rank: int
    cp_size: int
    n_local: int
    seg_doc: np.ndarray
    seg_local_start: np.ndarray
    seg_local_end: np.ndarray
    seg_doc_start: np.ndarray
    seg_doc_end: np.ndarray
    seg_gathered: np.ndarray
    send_index: np.ndarray
    send_counts: np.ndarray
    doc_key_index: dict
    exchange: str = "all_gather"
    recv_counts: np.ndarray | None = None
    self_index: np.ndarray | None = None
    window: int | None = None
    route: dict | None = None

    @property
    def max_send(self) -> int:
        return int(self.send_counts.max()) if len(self.send_counts) else 0

    @property
    def num_key_rows(self) -> int:
        """Rows of the key buffer the exchange delivers (what ``wait()`` returns)."""
        if self.exchange == "all_to_all":
            extra = 0 if self.route is None else int(self.route["recv2_counts"].sum())
            return int(len(self.self_index) + self.recv_counts.sum()) + extra
        return self.cp_size * self.max_send

    def varlen_layout(self, sliding_window: int | None = None) -> "VarlenLayout":
        """Flattened varlen description for ``flash_attn_varlen_func``-style kernels.

        Keys are taken from ``cat([k_local, k_gathered_padded])`` rows ``k_index``; each
        segment's keys are its document's prefix ``[k_lo, doc_end)`` where ``k_lo`` is 0,
        or ``doc_end - (local queries) - (sliding_window - 1)`` clipped at 0 with a window,
        so that bottom-right causal alignment holds.
        """
        sliding_window = check_window(sliding_window, "sliding_window")
        parts, cu_k, cu_q = [], [0], [0]
        for i in range(len(self.seg_doc)):
            ds, de = int(self.seg_doc_start[i]), int(self.seg_doc_end[i])
            lo = 0 if sliding_window is None else max(0, ds - int(sliding_window) + 1)
            if self.seg_gathered[i]:
                rows = self.n_local + self.doc_key_index[int(self.seg_doc[i])][lo:de]
            else:
                ls = int(self.seg_local_start[i])
                rows = np.arange(ls + lo - ds, ls + de - ds, dtype=np.int64)
            parts.append(rows)
            cu_k.append(cu_k[-1] + len(rows))
            cu_q.append(int(self.seg_local_end[i]))
        k_index = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        cu_q_arr = np.asarray(cu_q, dtype=np.int64)
        cu_k_arr = np.asarray(cu_k, dtype=np.int64)
        return VarlenLayout(
            k_index=k_index.astype(np.int64),
            cu_seqlens_q=cu_q_arr,
            cu_seqlens_k=cu_k_arr,
            max_seqlen_q=int(np.diff(cu_q_arr).max()) if len(cu_q_arr) > 1 else 0,
            max_seqlen_k=int(np.diff(cu_k_arr).max()) if len(cu_k_arr) > 1 else 0,
        )


@dataclass(frozen=True, eq=False)
class VarlenLayout:
    """Query segments are the local rows in order (``cu_seqlens_q``); keys are rows ``k_index``
    of ``cat([k_local, k_gathered_padded])`` cut by ``cu_seqlens_k``. Causal masks are
    bottom-right aligned (query ``i`` of a segment sees keys ``j <= i + Lk - Lq``)."""

    k_index: np.ndarray
    cu_seqlens_q: np.ndarray
    cu_seqlens_k: np.ndarray
    max_seqlen_q: int
    max_seqlen_k: int


def check_window(window, name: str = "window") -> int | None:
    """``window`` as an int, or None.

    Raises:
        ValueError: not None and not an int >= 1 (bools and floats included).
    """
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or int(window) < 1:
        raise ValueError(f"{name} must be None or an int >= 1 (the layer's sliding window in tokens), got {window!r}")
    return int(window)


def _expand(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + l)`` for each pair, vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    keep = lengths > 0
    starts, lengths = np.asarray(starts, dtype=np.int64)[keep], lengths[keep]
    seg_begin = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=seg_begin[1:])
    out = np.ones(total, dtype=np.int64)
    out[0] = starts[0]
    out[seg_begin[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(out)


def _build_local_layout(plan: ShardPlan, rank: int, window: int | None = None) -> LocalLayout:
    if plan.kv_exchange == "all_to_all":
        return _build_a2a_layout(plan, rank, window)
    C = plan.cp_size
    gathered = np.zeros(plan.num_docs, dtype=bool)
    gathered[plan.gathered_docs] = True

    # Per rank: which local rows belong to gathered documents (the send list).
    send_rows, send_counts, send_docs_pos = [], np.zeros(C, dtype=np.int64), []
    for r in range(C):
        seg = plan.segments[r]
        ln = seg[:, 2] - seg[:, 1]
        local_start = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(seg) else np.zeros(0, np.int64)
        g = gathered[seg[:, 0]] if len(seg) else np.zeros(0, bool)
        send_rows.append(_expand(local_start[g], ln[g]))
        send_counts[r] = int(ln[g].sum())
        # document coordinates of the sent rows, to place them in document order
        send_docs_pos.append((np.repeat(seg[g, 0], ln[g]), _expand(seg[g, 1], ln[g])))
    max_send = int(send_counts.max()) if C else 0

    # Row of the padded gathered buffer for every (doc, position) of a gathered doc.
    seg = plan.segments[rank]
    ln = seg[:, 2] - seg[:, 1]
    local_start = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(seg) else np.zeros(0, np.int64)
    needed = set(int(d) for d in seg[:, 0] if gathered[d])
    doc_key_index: dict[int, np.ndarray] = {}
    if needed:
        for d in needed:
            doc_key_index[d] = np.full(int(plan.doc_lengths[d]), -1, dtype=np.int64)
        for r in range(C):
            docs, pos = send_docs_pos[r]
            rows = r * max_send + np.arange(len(docs), dtype=np.int64)
            for d in needed:
                m = docs == d
                if m.any():
                    doc_key_index[d][pos[m]] = rows[m]
        for d, idx in doc_key_index.items():
            assert (idx >= 0).all(), f"document {d}: some keys are on no rank"
    return LocalLayout(
        rank=rank,
        cp_size=C,
        n_local=int(ln.sum()),
        seg_doc=seg[:, 0].copy(),
        seg_local_start=local_start,
        seg_local_end=local_start + ln,
        seg_doc_start=seg[:, 1].copy(),
        seg_doc_end=seg[:, 2].copy(),
        seg_gathered=gathered[seg[:, 0]] if len(seg) else np.zeros(0, bool),
        send_index=send_rows[rank],
        send_counts=send_counts,
        doc_key_index=doc_key_index,
    )


def _build_a2a_layout(plan: ShardPlan, rank: int, window: int | None) -> LocalLayout:
    """The all-to-all exchange of :class:`LocalLayout` (see its ``exchange`` attribute)."""
    C = plan.cp_size
    gathered = plan.gathered_mask()
    seg = plan.segments[rank]
    ln = seg[:, 2] - seg[:, 1]
    local_start = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(seg) else np.zeros(0, np.int64)
    g = gathered[seg[:, 0]] if len(seg) else np.zeros(0, bool)
    self_index = _expand(local_start[g], ln[g])
    self_docs, self_pos = np.repeat(seg[g, 0], ln[g]), _expand(seg[g, 1], ln[g])
    send_parts, send_counts = [], np.zeros(C, dtype=np.int64)
    recv_counts = np.zeros(C, dtype=np.int64)
    recv_docs, recv_pos = [self_docs], [self_pos]
    route = None
    if plan.kv_route_node is not None:  # two phases (see atac_hf.sharding.routing)
        t = routed_tables(plan.segments, gathered, window, plan.kv_route_node, rank)
        send_parts, send_counts, recv_counts = [t["send1"]], t["send1_counts"], t["recv1_counts"]
        recv_docs.append(t["recv_docs"])
        recv_pos.append(t["recv_pos"])
        route = {k: t[k] for k in ("send2", "send2_counts", "recv2_counts")}
    for other in range(C) if route is None else ():
        if other == rank:
            continue
        rows, _, _ = a2a_rows(plan.segments, gathered, rank, other, window)
        send_parts.append(rows)
        send_counts[other] = len(rows)
        _, docs, pos = a2a_rows(plan.segments, gathered, other, rank, window)
        recv_counts[other] = len(docs)
        recv_docs.append(docs)
        recv_pos.append(pos)
    buf_docs, buf_pos = np.concatenate(recv_docs), np.concatenate(recv_pos)
    doc_key_index: dict[int, np.ndarray] = {}
    for d, ranges in needed_ranges(seg, gathered, window).items():
        idx = np.full(int(plan.doc_lengths[d]), -1, dtype=np.int64)
        m = buf_docs == d
        idx[buf_pos[m]] = np.flatnonzero(m)
        for lo, hi in ranges:
            assert (idx[lo:hi] >= 0).all(), f"document {d}: some keys rank {rank} attends to are on no rank"
        doc_key_index[d] = idx
    return LocalLayout(
        rank=rank,
        cp_size=C,
        n_local=int(ln.sum()),
        seg_doc=seg[:, 0].copy(),
        seg_local_start=local_start,
        seg_local_end=local_start + ln,
        seg_doc_start=seg[:, 1].copy(),
        seg_doc_end=seg[:, 2].copy(),
        seg_gathered=g,
        send_index=np.concatenate(send_parts) if send_parts else np.zeros(0, np.int64),
        send_counts=send_counts,
        doc_key_index=doc_key_index,
        exchange="all_to_all",
        recv_counts=recv_counts,
        self_index=self_index,
        window=window,
        route=route,
    )

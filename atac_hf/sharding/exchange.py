"""Which K/V rows each rank needs: the layout of the only-needed K/V exchange (all-to-all).

The all-gather path sends every rank the K/V of every gathered document. A rank's query
chunk ``[start, end)`` of a document attends only to that document's keys ``[lo, end)``,
``lo = 0``, or ``max(0, start - W + 1)`` under a sliding window ``W``; so rank ``r`` needs,
of a gathered document ``d`` it holds queries of, the keys in the union of those ranges over
its chunks of ``d`` (without a window: the prefix below the largest end, ``need_end[r, d]``)
that other ranks hold. One ``all_to_all_single`` with per-pair counts moves exactly those rows.

Coordinates as in :mod:`atac_hf.sharding.plan`. Every function takes the per-rank segment
lists, a (D,) bool mask of gathered documents and the sliding window (None: none). Numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXCHANGES", "a2a_pair_counts", "a2a_rows", "a2a_token_counts", "needed_ranges"]

#: The K/V exchanges the runtime implements: ``all_gather`` (every rank gets every gathered
#: document) and ``all_to_all`` (every rank gets the keys its chunks attend to).
EXCHANGES = ("all_gather", "all_to_all")


def _ranges(seg: np.ndarray, gathered: np.ndarray, window: int | None) -> np.ndarray:
    """(n, 3) ``(doc, lo, hi)``: sorted disjoint key ranges of gathered documents that one
    rank's segments attend to (without a window: one prefix ``[0, need_end)`` per document)."""
    g = seg[gathered[seg[:, 0]]] if len(seg) else np.zeros((0, 3), np.int64)
    if not len(g):
        return np.zeros((0, 3), np.int64)
    lo = np.zeros(len(g), np.int64) if window is None else np.maximum(0, g[:, 1] - int(window) + 1)
    r = np.stack([g[:, 0], lo, g[:, 2]], axis=1)
    r = r[np.lexsort((r[:, 1], r[:, 0]))]
    # merge overlapping or touching ranges of a document: a running max of the ends, reset per document
    shift = (r[:, 0] - r[0, 0]) * (int(r[:, 2].max()) + 1)
    reach = np.maximum.accumulate(r[:, 2] + shift) - shift
    prev = np.concatenate([[-1], reach[:-1]])
    start = (r[:, 0] != np.concatenate([[-1], r[:-1, 0]])) | (r[:, 1] > prev)
    first = np.flatnonzero(start)
    last = np.concatenate([first[1:], [len(r)]]) - 1
    return np.stack([r[first, 0], r[first, 1], reach[last]], axis=1)


def needed_ranges(seg: np.ndarray, gathered: np.ndarray, window: int | None = None) -> dict[int, list]:
    """Of one rank's segments: gathered document -> sorted disjoint ``[lo, hi)`` key ranges
    its chunks attend to (one prefix ``[0, need_end)`` without a window)."""
    out: dict[int, list] = {}
    for d, lo, hi in _ranges(seg, gathered, window).tolist():
        out.setdefault(d, []).append((lo, hi))
    return out


def _overlaps(src: np.ndarray, ranges: np.ndarray, with_range: bool = False):
    """Pairs (segment i of ``src``, range of the same document) that overlap, in ``src`` order
    then range order: (i, a, b) with ``[a, b)`` the overlap in document coordinates; with
    ``with_range``, (i, j, a, b) with ``j`` the range's row. ``ranges`` sorted by document."""
    z = np.zeros(0, np.int64)
    if not len(src) or not len(ranges):
        return (z, z, z, z) if with_range else (z, z, z)
    lo_i = np.searchsorted(ranges[:, 0], src[:, 0], side="left")
    hi_i = np.searchsorted(ranges[:, 0], src[:, 0], side="right")
    cnt = hi_i - lo_i
    i = np.repeat(np.arange(len(src)), cnt)
    if not len(i):
        return (z, z, z, z) if with_range else (z, z, z)
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    j = lo_i[i] + (np.arange(len(i)) - np.repeat(first, cnt))
    a = np.maximum(src[i, 1], ranges[j, 1])
    b = np.minimum(src[i, 2], ranges[j, 2])
    keep = b > a
    return (i[keep], j[keep], a[keep], b[keep]) if with_range else (i[keep], a[keep], b[keep])


def a2a_pair_counts(segments, gathered: np.ndarray, window: int | None = None) -> np.ndarray:
    """(C, C) int64: ``out[s, r]`` K/V rows rank ``s`` sends rank ``r`` per layer in the
    only-needed exchange (row sums: what each rank sends; column sums: what it receives)."""
    C = len(segments)
    if C < 2 or not gathered.any():
        return np.zeros((C, C), dtype=np.int64)
    rank_of = np.repeat(np.arange(C), [len(s) for s in segments])
    return a2a_pair_counts_flat(np.concatenate(segments), rank_of, C, gathered, window, segments)


def a2a_pair_counts_flat(allseg: np.ndarray, rank_of: np.ndarray, C: int, gathered: np.ndarray,
                         window: int | None, segments) -> np.ndarray:
    """:func:`a2a_pair_counts` of ``segments`` given as well concatenated (``allseg``, (S, 3)) with
    the rank of each row (``rank_of``)."""
    out = np.zeros((C, C), dtype=np.int64)
    if C < 2 or not gathered.any():
        return out
    keep = gathered[allseg[:, 0]]
    allseg, rank_of = allseg[keep], rank_of[keep]
    if not len(allseg):
        return out
    if window is None:  # one prefix per (rank, document): vectorised
        # a column per gathered document (each has tokens on some rank); the order does not matter
        docs = np.flatnonzero(gathered)
        lookup = np.zeros(len(gathered), dtype=np.int64)
        lookup[docs] = np.arange(len(docs))
        col = lookup[allseg[:, 0]]
        need = np.zeros((C, len(docs)), dtype=np.int64)
        np.maximum.at(need, (rank_of, col), allseg[:, 2])
        part = np.maximum(np.minimum(allseg[None, :, 2], need[:, col]) - allseg[None, :, 1], 0)  # (C dst, S)
    else:
        part = np.zeros((C, len(allseg)), dtype=np.int64)
        for r in range(C):
            i, lo, hi = _overlaps(allseg, _ranges(segments[r], gathered, window))
            part[r] = np.bincount(i, weights=hi - lo, minlength=len(allseg)).astype(np.int64)
    part[rank_of, np.arange(len(allseg))] = 0
    # out[src, dst] = sum of part[dst, s] over the segments s that src holds: one bincount, O(C x S)
    # (a one-hot matrix product was O(C^2 x S): 11 s a call at CP 4096)
    pair = (rank_of[None, :] * C + np.arange(C)[:, None]).ravel()
    sums = np.bincount(pair, weights=part.ravel(), minlength=C * C)
    return np.rint(sums).astype(np.int64).reshape(C, C)  # exact: integers far below 2**53


def a2a_token_counts(segments, gathered: np.ndarray, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """K/V rows each rank receives and sends per layer in the only-needed exchange.

    Returns:
        ``(recv, send)``: two (C,) int64 arrays (column and row sums of :func:`a2a_pair_counts`).
    """
    m = a2a_pair_counts(segments, gathered, window)
    return m.sum(axis=0).astype(np.int64), m.sum(axis=1).astype(np.int64)


def a2a_rows(segments, gathered: np.ndarray, src: int, dst: int,
             window: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows rank ``src`` sends to rank ``dst`` (``src != dst``), in ``src``'s local order.

    Returns:
        ``(local_rows, docs, positions)``: (n,) int64 each: the rows of ``src``'s local
        tensor, and the document and document position of each.
    """
    seg = np.asarray(segments[src], dtype=np.int64).reshape(-1, 3)
    ln = seg[:, 2] - seg[:, 1]
    local_start = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(seg) else np.zeros(0, np.int64)
    keep = gathered[seg[:, 0]] if len(seg) else np.zeros(0, bool)
    idx = np.flatnonzero(keep)
    i, a, b = _overlaps(seg[idx], _ranges(np.asarray(segments[dst], dtype=np.int64).reshape(-1, 3), gathered,
                                          window))
    i = idx[i]
    n = b - a
    return (_expand(local_start[i] + a - seg[i, 1], n), np.repeat(seg[i, 0], n), _expand(a, n))


def _expand(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + l)`` for each pair (lengths > 0), vectorised."""
    total = int(lengths.sum()) if len(lengths) else 0
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    begin = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out = np.ones(total, dtype=np.int64)
    out[0] = starts[0]
    out[begin[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(out)

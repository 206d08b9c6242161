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


def needed_ranges(seg: np.ndarray, gathered: np.ndarray, window: int | None = None) -> dict[int, list]:
    """Of one rank's segments: gathered document -> sorted disjoint ``[lo, hi)`` key ranges
    its chunks attend to (one prefix ``[0, need_end)`` without a window)."""
    out: dict[int, list] = {}
    g = seg[gathered[seg[:, 0]]] if len(seg) else seg
    for d, s, e in g.tolist():
        lo = 0 if window is None else max(0, s - int(window) + 1)
        out.setdefault(d, []).append((lo, e))
    for d, iv in out.items():
        iv.sort()
        merged = [list(iv[0])]
        for lo, hi in iv[1:]:
            if lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        out[d] = [(a, b) for a, b in merged]
    return out


def a2a_pair_counts(segments, gathered: np.ndarray, window: int | None = None) -> np.ndarray:
    """(C, C) int64: ``out[s, r]`` K/V rows rank ``s`` sends rank ``r`` per layer in the
    only-needed exchange (row sums: what each rank sends; column sums: what it receives)."""
    C = len(segments)
    out = np.zeros((C, C), dtype=np.int64)
    if C < 2 or not gathered.any():
        return out
    rank_of = np.repeat(np.arange(C), [len(s) for s in segments])
    allseg = np.concatenate(segments)
    keep = gathered[allseg[:, 0]]
    allseg, rank_of = allseg[keep], rank_of[keep]
    if not len(allseg):
        return out
    if window is None:  # one prefix per (rank, document): vectorised
        docs, col = np.unique(allseg[:, 0], return_inverse=True)
        need = np.zeros((C, len(docs)), dtype=np.int64)
        np.maximum.at(need, (rank_of, col), allseg[:, 2])
        part = np.clip(np.minimum(allseg[None, :, 2], need[:, col]) - allseg[None, :, 1], 0, None)  # (C dst, S)
    else:
        part = np.zeros((C, len(allseg)), dtype=np.int64)
        for r in range(C):
            for d, ranges in needed_ranges(segments[r], gathered, window).items():
                m = np.flatnonzero(allseg[:, 0] == d)
                for lo, hi in ranges:
                    part[r, m] += np.clip(np.minimum(allseg[m, 2], hi) - np.maximum(allseg[m, 1], lo), 0, None)
    part[rank_of, np.arange(len(allseg))] = 0
    onehot = np.zeros((len(allseg), C))
    onehot[np.arange(len(allseg)), rank_of] = 1.0
    return np.rint((part @ onehot).T).astype(np.int64)  # exact: integers far below 2**53


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
    need = needed_ranges(segments[dst], gathered, window)
    seg = segments[src]
    ln = seg[:, 2] - seg[:, 1]
    local_start = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(seg) else np.zeros(0, np.int64)
    rows, docs, pos = [], [], []
    for i in range(len(seg)):
        d, s, e = (int(x) for x in seg[i])
        for lo, hi in need.get(d, ()) if gathered[d] else ():
            a, b = max(s, lo), min(e, hi)
            if b > a:
                rows.append(np.arange(local_start[i] + a - s, local_start[i] + b - s, dtype=np.int64))
                docs.append(np.full(b - a, d, dtype=np.int64))
                pos.append(np.arange(a, b, dtype=np.int64))
    if not rows:
        z = np.zeros(0, dtype=np.int64)
        return z, z.copy(), z.copy()
    return np.concatenate(rows), np.concatenate(docs), np.concatenate(pos)

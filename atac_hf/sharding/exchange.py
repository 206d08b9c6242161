"""Which K/V rows each rank needs: the layout of the only-needed K/V exchange (all-to-all).

The all-gather path sends every rank the K/V of every gathered document. A rank's query
chunk ``[start, end)`` of a document attends only to that document's key prefix
``[0, end)``, so rank ``r`` needs, of a gathered document ``d`` it holds queries of, the
keys below ``need_end[r, d]`` (the largest end of its chunks of ``d``) that other ranks
hold: one ``all_to_all_single`` with per-pair counts moves exactly those rows.

Coordinates as in :mod:`atac_hf.sharding.plan`. Every function takes the per-rank segment
lists and a (D,) bool mask of gathered documents. Numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXCHANGES", "a2a_pair_counts", "a2a_rows", "a2a_token_counts"]

#: The K/V exchanges the runtime implements: ``all_gather`` (every rank gets every gathered
#: document) and ``all_to_all`` (every rank gets the key prefixes its chunks attend to).
EXCHANGES = ("all_gather", "all_to_all")


def _need_end(segments, gathered: np.ndarray) -> list[dict[int, int]]:
    """Per rank: gathered document -> the end of the key prefix the rank's chunks attend to."""
    out = []
    for seg in segments:
        need: dict[int, int] = {}
        g = seg[gathered[seg[:, 0]]] if len(seg) else seg
        for d, e in zip(g[:, 0].tolist(), g[:, 2].tolist()):
            if e > need.get(d, 0):
                need[d] = e
        out.append(need)
    return out


def a2a_token_counts(segments, gathered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K/V rows each rank receives and sends per layer in the only-needed exchange.

    Rank ``r`` receives, of every gathered document ``d`` it holds, ``need_end[r, d]``
    minus its own rows of ``d`` (all of them lie below ``need_end``); rank ``s`` sends
    each other holder ``r`` of ``d`` its rows of ``d`` below ``need_end[r, d]``.

    Returns:
        ``(recv, send)``: two (C,) int64 arrays.
    """
    C = len(segments)
    recv = np.zeros(C, dtype=np.int64)
    send = np.zeros(C, dtype=np.int64)
    if C < 2 or not gathered.any():
        return recv, send
    rank_of = np.repeat(np.arange(C), [len(s) for s in segments])
    allseg = np.concatenate(segments)
    keep = gathered[allseg[:, 0]]
    allseg, rank_of = allseg[keep], rank_of[keep]
    if not len(allseg):
        return recv, send
    # need_end[r, d] as a dense (C, gathered docs) table of the documents that occur
    docs, col = np.unique(allseg[:, 0], return_inverse=True)
    need = np.zeros((C, len(docs)), dtype=np.int64)
    np.maximum.at(need, (rank_of, col), allseg[:, 2])
    own = np.zeros((C, len(docs)), dtype=np.int64)
    np.add.at(own, (rank_of, col), allseg[:, 2] - allseg[:, 1])
    recv = (need - own).sum(axis=1)
    # rows a segment [s, e) on rank q sends to rank r: |[s, e) ∩ [0, need[r])| for r != q
    ne = need[:, col]  # (C, S): need_end of every rank for each segment's document
    part = np.clip(np.minimum(allseg[None, :, 2], ne) - allseg[None, :, 1], 0, None)
    part[rank_of, np.arange(len(allseg))] = 0
    send = np.bincount(rank_of, weights=part.sum(axis=0), minlength=C).astype(np.int64)
    return recv.astype(np.int64), send


def a2a_pair_counts(segments, gathered: np.ndarray) -> np.ndarray:
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
    docs, col = np.unique(allseg[:, 0], return_inverse=True)
    need = np.zeros((C, len(docs)), dtype=np.int64)
    np.maximum.at(need, (rank_of, col), allseg[:, 2])
    part = np.clip(np.minimum(allseg[None, :, 2], need[:, col]) - allseg[None, :, 1], 0, None)  # (C dst, S)
    part[rank_of, np.arange(len(allseg))] = 0
    onehot = np.zeros((len(allseg), C))
    onehot[np.arange(len(allseg)), rank_of] = 1.0
    return np.rint((part @ onehot).T).astype(np.int64)  # exact: integers far below 2**53


def a2a_rows(segments, gathered: np.ndarray, src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows rank ``src`` sends to rank ``dst`` (``src != dst``), in ``src``'s local order.

    Returns:
        ``(local_rows, docs, positions)``: (n,) int64 each: the rows of ``src``'s local
        tensor, and the document and document position of each.
    """
    need = _need_end([segments[dst]], gathered)[0]
    seg = segments[src]
    ln = seg[:, 2] - seg[:, 1]
    local_start = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(seg) else np.zeros(0, np.int64)
    rows, docs, pos = [], [], []
    for i in range(len(seg)):
        d, s, e = (int(x) for x in seg[i])
        hi = min(e, need.get(d, 0)) if gathered[d] else 0
        if hi > s:
            rows.append(np.arange(local_start[i], local_start[i] + hi - s, dtype=np.int64))
            docs.append(np.full(hi - s, d, dtype=np.int64))
            pos.append(np.arange(s, hi, dtype=np.int64))
    if not rows:
        z = np.zeros(0, dtype=np.int64)
        return z, z.copy(), z.copy()
    return np.concatenate(rows), np.concatenate(docs), np.concatenate(pos)

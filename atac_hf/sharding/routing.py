"""The node-routed all-to-all: the only-needed K/V exchange with each row crossing a node boundary once.

In the direct all-to-all (:mod:`atac_hf.sharding.exchange`) a rank ``s`` sends every other rank
the rows it needs. Where several ranks of one node need the same rows of ``s`` (the ranks of a node
holding the late chunks of one document all need its early chunks), those rows cross the
inter-node link once per rank. Routed, they cross it once per node, in two phases:

1. ``s`` sends each remote node ``N`` the union ``U`` of the rows ``N``'s ranks need, cut in
   ``|N|`` consecutive parts of (within a row) equal size, part ``i`` to the ``(i + s) % |N|``-th
   rank of ``N`` (its *proxy*); rows for ranks of ``s``'s own node go to them directly.
2. Each proxy forwards, inside its node, to every other rank of the node the rows of its parts
   that rank needs.

Every rank then holds exactly the rows the direct exchange gives it (plus the rows it proxied).
Each inter-node link carries a rank's share of its node's union instead of the rank's own needs,
at the price of a second, intra-node phase that nothing overlaps (:func:`route_blocks`).
Nodes are consecutive ranks: rank ``r`` is on node ``r // node``.

Coordinates as in :mod:`atac_hf.sharding.plan`; rows are those of the source rank's local tensor.
Numpy only.
"""

from __future__ import annotations

import numpy as np

from .exchange import _overlaps, _ranges, a2a_rows

__all__ = ["route_blocks", "routed_pair_counts", "routed_tables", "routes"]


def routes(C: int, node: int | None) -> bool:
    """Whether a CP group of ``C`` ranks on nodes of ``node`` ranks spans 2+ nodes with 2+ ranks on
    some node (else routing changes nothing)."""
    return node is not None and 2 <= int(node) < C


def _nodes(C: int, node: int) -> list[list[int]]:
    return [list(range(lo, min(C, lo + node))) for lo in range(0, C, node)]


def _cuts(n: int, k: int) -> list[int]:
    """Part boundaries of ``n`` rows in ``k`` parts: ``(i * n) // k``, i = 0..k."""
    return [(i * n) // k for i in range(k + 1)]


def routed_pair_counts(segments, gathered: np.ndarray, window: int | None, node: int) -> tuple[np.ndarray, np.ndarray]:
    """``(first, second)``: (C, C) int64 rows rank ``s`` sends rank ``r`` per layer in the first
    (to proxies, and directly inside a node) and the second (proxy to node peers) phase.
    Interval arithmetic, vectorised over ranks: no per-row arrays."""
    C = len(segments)
    first = np.zeros((C, C), dtype=np.int64)
    second = np.zeros((C, C), dtype=np.int64)
    if C < 2 or not gathered.any():
        return first, second
    segs = [np.asarray(x, dtype=np.int64).reshape(-1, 3) for x in segments]
    allseg = np.concatenate(segs)
    src = np.repeat(np.arange(C), [len(x) for x in segs])
    local_start = np.concatenate([np.concatenate([[0], np.cumsum(x[:, 2] - x[:, 1])[:-1]]) for x in segs if len(x)]
                                 ).astype(np.int64)
    # an empty segment (d, x, x) of a gathered document is kept: as a destination it needs the prefix
    # [0, x) as exchange._ranges (and so the runtime's tables) says; as a source it sends nothing
    keep = gathered[allseg[:, 0]]
    allseg, src, local_start = allseg[keep], src[keep], local_start[keep]
    # every destination's key ranges at once (exchange._ranges keyed by (rank, document)), then every
    # (source segment, destination range) overlap in one call
    D = len(gathered)
    dest = np.repeat(np.arange(C), [len(x) for x in segs])[keep]
    keyed = np.stack([dest * D + allseg[:, 0], allseg[:, 1], allseg[:, 2]], axis=1)
    ranges = _ranges(keyed, np.ones(C * D, dtype=bool), window)
    ranges = ranges[np.argsort(ranges[:, 0] % D, kind="stable")]
    owner = ranges[:, 0] // D
    ranges[:, 0] %= D
    i, j, a, b = _overlaps(allseg, ranges, with_range=True)
    mine = src[i] != owner[j]
    i, j, a, b = i[mine], j[mine], a[mine], b[mine]
    s_, r_ = src[i], owner[j]
    lo = local_start[i] + a - allseg[i, 1]
    hi = lo + (b - a)
    if not len(s_):
        return first, second
    k = int(node)
    same = s_ // k == r_ // k
    np.add.at(first, (s_[same], r_[same]), hi[same] - lo[same])
    s_, r_, lo, hi = s_[~same], r_[~same], lo[~same], hi[~same]
    if not len(s_):
        return first, second
    # the union of each (source, destination node) group's intervals, merged as exchange._ranges does
    grp = s_ * C + (r_ // k)
    o = np.lexsort((lo, grp))
    g, a, b = grp[o], lo[o], hi[o]
    shift = (g - g[0]) * (int(b.max()) + 1)
    reach = np.maximum.accumulate(b + shift) - shift
    prev = np.concatenate([[-1], reach[:-1]])
    start = (g != np.concatenate([[-1], g[:-1]])) | (a > prev)
    fi = np.flatnonzero(start)
    la = np.concatenate([fi[1:], [len(g)]]) - 1
    ug, ulo, uhi = g[fi], a[fi], reach[la]
    usz = uhi - ulo
    # rows of the group's union below each merged interval, and each group's total
    csum = np.cumsum(usz)
    gfirst = np.flatnonzero(np.concatenate([[True], ug[1:] != ug[:-1]]))
    gtot = np.add.reduceat(usz, gfirst)
    gbase = np.repeat(csum[gfirst] - usz[gfirst], np.diff(np.concatenate([gfirst, [len(ug)]])))
    before = csum - usz - gbase
    groups = ug[gfirst]
    gs, gn = groups // C, groups % C  # source, destination node
    width = np.minimum(C, (gn + 1) * k) - gn * k  # ranks on that node
    # first phase: part i of a group (rows [i n / w, (i + 1) n / w) of its union) to rank (i + s) % w of the node
    for i in range(k):
        ok = i < width
        cut = (i * gtot[ok]) // width[ok], ((i + 1) * gtot[ok]) // width[ok]
        proxy = gn[ok] * k + (i + gs[ok]) % width[ok]
        np.add.at(first, (gs[ok], proxy), cut[1] - cut[0])
    # second phase: each destination's rows in its group's count space, cut by the parts
    key = ug * (int(uhi.max()) + 1) + ulo
    j = np.searchsorted(key, grp * (int(uhi.max()) + 1) + lo, side="right") - 1
    c0 = before[j] + lo - ulo[j]
    c1 = c0 + (hi - lo)
    gi = np.searchsorted(groups, grp)
    w, n = width[gi], gtot[gi]
    for i in range(k):
        ok = i < w
        p0, p1 = (i * n[ok]) // w[ok], ((i + 1) * n[ok]) // w[ok]
        proxy = (r_[ok] // k) * k + (i + s_[ok]) % w[ok]
        got = np.maximum(np.minimum(c1[ok], p1) - np.maximum(c0[ok], p0), 0)
        fwd = proxy != r_[ok]
        np.add.at(second, (proxy[fwd], r_[ok][fwd]), got[fwd])
    return first, second


def routed_tables(segments, gathered: np.ndarray, window: int | None, node: int, rank: int) -> dict:
    """Rank ``rank``'s part of the routed exchange, with explicit rows (the runtime's layout):

    * ``send1`` (n1,) local rows it sends in the first phase, destination by destination, and
      ``send1_counts`` / ``recv1_counts`` (C,);
    * ``send2`` (n2,) rows of its first-phase receive buffer it forwards, destination by
      destination, and ``send2_counts`` / ``recv2_counts`` (C,);
    * ``recv_docs`` / ``recv_pos``: the document and position of every row of
      ``cat([first-phase rows, second-phase rows])`` (sources in rank order in each phase).
    """
    C = len(segments)
    ranks_of = _nodes(C, node)
    mine = ranks_of[rank // node]
    cache: dict = {}
    part_cache: dict = {}

    def rows(s: int, r: int):
        """(local rows of s, docs, positions) s sends r in the direct exchange, in s's local order."""
        if (s, r) not in cache:
            cache[s, r] = a2a_rows(segments, gathered, s, r, window)
        return cache[s, r]

    def parts(s: int, ranks: list[int]) -> dict:
        """proxy -> (local rows of s, docs, positions) of its part of s's union for node ``ranks``."""
        if (s, ranks[0]) not in part_cache:
            got = [rows(s, r) for r in ranks if r != s]
            loc, first = np.unique(np.concatenate([g[0] for g in got]), return_index=True)
            doc = np.concatenate([g[1] for g in got])[first]
            pos = np.concatenate([g[2] for g in got])[first]
            cuts = _cuts(len(loc), len(ranks))
            part_cache[s, ranks[0]] = {ranks[(i + s) % len(ranks)]: (loc[cuts[i]:cuts[i + 1]], doc[cuts[i]:cuts[i + 1]],
                                                                     pos[cuts[i]:cuts[i + 1]]) for i in range(len(ranks))}
        return part_cache[s, ranks[0]]

    def needed(loc: np.ndarray, s: int, r: int) -> np.ndarray:
        """Which of ``loc`` (sorted local rows of s) r needs (bool)."""
        want = rows(s, r)[0]
        i = np.minimum(np.searchsorted(want, loc), max(len(want) - 1, 0))
        return (want[i] == loc) if len(want) else np.zeros(len(loc), dtype=bool)

    empty = np.zeros(0, np.int64)
    send1, send1_counts = [], np.zeros(C, np.int64)
    for ranks in ranks_of:
        if rank in ranks:
            send1.extend((r, rows(rank, r)[0]) for r in ranks if r != rank)
        else:
            send1.extend((p, x[0]) for p, x in parts(rank, ranks).items())
    send1.sort(key=lambda x: x[0])  # destination by destination (a rank proxies one part of a source)
    for r, loc in send1:
        send1_counts[r] += len(loc)
    remote = [s for s in range(C) if s not in mine]
    # first phase, received: from each source in rank order (its rows to this rank, or the part it proxies)
    recv1_counts = np.zeros(C, np.int64)
    docs1, pos1 = [], []
    for s in range(C):
        if s == rank:
            continue
        _, d, p = rows(s, rank) if s in mine else parts(s, mine)[rank]
        recv1_counts[s] = len(d)
        docs1.append(d)
        pos1.append(p)
    # second phase: forward to each node peer the rows of the proxied parts it needs (sources in rank order)
    start = np.concatenate([[0], np.cumsum(recv1_counts)[:-1]])
    send2, send2_counts = [], np.zeros(C, np.int64)
    for r in mine:
        if r == rank:
            continue
        for s in remote:
            want = np.flatnonzero(needed(parts(s, mine)[rank][0], s, r))
            send2.append(start[s] + want)
            send2_counts[r] += len(want)
    recv2_counts = np.zeros(C, np.int64)
    docs2, pos2 = [], []
    for q in mine:
        if q == rank:
            continue
        for s in remote:
            loc, d, p = parts(s, mine)[q]
            want = needed(loc, s, rank)
            docs2.append(d[want])
            pos2.append(p[want])
            recv2_counts[q] += int(want.sum())
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else empty  # noqa: E731
    return dict(send1=cat([loc for _, loc in send1]), send1_counts=send1_counts, recv1_counts=recv1_counts,
                send2=cat(send2), send2_counts=send2_counts, recv2_counts=recv2_counts,
                recv_docs=cat(docs1 + docs2), recv_pos=cat(pos1 + pos2))


def route_blocks(compute: np.ndarray, local_attn: np.ndarray, first_s: float, second_s: float) -> float:
    """Block time of a routed exchange: the first phase overlaps each rank's local attention, the
    second (it starts when the first has landed) overlaps nothing."""
    return float(np.max(compute - local_attn + np.maximum(local_attn, first_s) + second_s))

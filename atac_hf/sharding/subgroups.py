"""Hierarchical ATP: anchors split head-tail over a sub-group of ranks, not all of them.

A document too expensive to stay whole on one rank but too cheap to be worth splitting over
all C ranks is split over just enough ranks to hold its work; only those ranks exchange its
K/V (with the all-to-all exchange, :mod:`atac_hf.sharding.exchange`). A document's *share*
is its estimated cost over a rank's share of the pack (``total / C``). Steps:

1. Anchors are the documents whose share exceeds ``anchor_share`` and that are long enough
   to cut (``>= 4 * min_chunk`` tokens), most expensive first.
2. The anchors are laid end to end on a line of C slots (cutting stock), each as long as its
   share: each anchor covers the ranks its interval overlaps, so its level (the number of
   ranks it is split over) follows from its cost, from 1 (whole) to C, and the ranks of a
   sub-group are consecutive. With ``cm.node_size``, an anchor that fits in one node but
   whose interval would cross a node boundary starts at that boundary instead (the gap goes
   to whole documents): its K/V then never leave the node.
3. The other documents (tails) go whole, most expensive first, to the chain (or lone rank)
   with token room whose load per rank stays lowest in the worst of three cost models, each
   over its per-rank mean: the estimate, and the estimate with attention priced at 0.5x and 2x
   (``two_way``; the estimate only otherwise); inside a chain, to its least-loaded rank.
4. Where anchors share ranks they form a *chain* of consecutive ranks; each chain's anchors
   are re-laid on the room its ranks have left after the tails, so every rank of a chain
   ends level with the others. Two re-splits compete on estimated block time: one levels the
   estimated cost (every anchor split by its share); the *two-way* one levels tokens and
   causal attention pairs separately (the token line sets a rank's share of each anchor,
   where its chunks sit sets its pairs), so the chain stays level whatever the true price
   ratio of token-wise work and attention; it is taken unless it costs over
   :data:`~atac_hf.sharding.atp.TWO_WAY_TOLERANCE` more by the estimate.
5. Each anchor is split head-tail *nested* over its sub-group: the rank with the largest
   share takes the outermost head and tail chunks (it holds the document's first and last
   tokens), the next one the next chunks inward, the smallest share the middle. No length
   needs to divide anything and nothing is padded.

:func:`~atac_hf.sharding.atp.plan_atp` builds this plan for a few ``anchor_share`` values
and keeps it where its estimated block time (compute + exposed K/V exchange, all-gather or
all-to-all, whichever is estimated faster) is no higher than the flat anchor-tail plan's.
Pure numpy (and small pure-Python loops over ranks).
"""

from __future__ import annotations

import bisect
import functools

import numpy as np

from ..cost import CostModel
from ..cost.model import scale_attention_price
from .plan import ShardPlan
from .segments import _doc_work_lower_bounds, causal_pairs, causal_pairs_float, finish_flat, row_offsets

__all__ = ["ANCHOR_SHARES", "plan_subgroups"]

#: ``anchor_share`` values ATP tries: a document is an anchor when it costs more than this
#: fraction of a rank's share of the pack.
ANCHOR_SHARES = (0.5, 0.25)
#: The two-way re-split of a chain is kept unless its estimated block time is more than this
#: fraction above the cost-level one (the same rule as ATP's flat two-way split).
TWO_WAY_TOLERANCE = 0.02


def plan_subgroups(lengths, C: int, cm: CostModel, *, anchor_share: float = 1.0, max_tokens_per_rank=None,
                   min_chunk: int = 1, strategy: str = "atp", two_way: bool = True) -> ShardPlan | None:
    """The hierarchical anchor-tail plan of one pack (see the module docstring).

    Args:
        lengths: (D,) document lengths in row order.
        C: ranks.
        cm: cost model (``cm.node_size``, when set, keeps sub-groups inside a node).
        anchor_share: anchors cost more than this fraction of ``total / C``.
        max_tokens_per_rank: token cap per rank (None: no cap).
        min_chunk: an anchor has at least ``4 * min_chunk`` tokens; a rank's share of it at
            least ``2 * min_chunk``.
        strategy: the name the plan carries.
        two_way: place tails and re-split chains level in tokens and attention pairs too
            (see the module docstring); False: in estimated cost only.

    Returns:
        The plan (K/V exchange chosen by estimated time), or None when the cap cannot be kept,
        a rank would get no token (of a pack of at least C tokens), or no anchor lands on a
        proper sub-group (2..C-1 ranks).
    """
    return _plan_subgroups(lengths, C, cm, anchor_share, max_tokens_per_rank, min_chunk, strategy, two_way)


def _plan_subgroups(lengths, C, cm, anchor_share, max_tokens_per_rank, min_chunk, strategy, two_way,
                    bound: float = np.inf, doc_costs: dict | None = None, exchange="auto") -> ShardPlan | None:
    """:func:`plan_subgroups`, or None too where the plan's slowest rank computes more than ``bound`` (its
    block time, at least that, would be higher: not finished). ``doc_costs``: a cache of the pack's document
    costs and bounds for calls on one pack (see :func:`_layouts`); ``exchange``: :func:`finish_flat`'s."""
    layouts = _layouts(lengths, C, cm, anchor_share, max_tokens_per_rank, min_chunk, two_way, doc_costs)
    if layouts is None:
        return None
    L, found = layouts
    best = None
    for mode, seg, rank, slowest in found:
        if best is None or (mode == "two_way" and slowest <= best[0] * (1 + TWO_WAY_TOLERANCE)):
            best = (slowest, seg, rank)
    return None if best is None else finish_flat(L, C, strategy, best[1], best[2], None, cm, exchange, bound=bound)


def _cached(cache: dict | None, key, compute):
    """``cache[key]``, computed by ``compute()`` and kept there where absent (``cache`` None: computed)."""
    if cache is None:
        return compute()
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def _layouts(lengths, C, cm, anchor_share, max_tokens_per_rank, min_chunk, two_way, doc_costs=None):
    """(lengths, [(re-split mode, (S, 3) segments rank by rank in row order, (S,) rank of each)]) of
    the hierarchical plan, or None."""
    L = np.asarray(lengths, dtype=np.int64)
    cap = np.inf if max_tokens_per_rank is None else float(max_tokens_per_rank)
    if C < 2:
        return None
    # per document (D,): the estimated cost whole (key 1.0; 0.5, 2.0: attention priced so) and a lower
    # bound of what its chunks cost ("work_lower_bound"), kept in doc_costs for the next call on the pack
    whole = _cached(doc_costs, 1.0, lambda: cm.doc_cost(L))
    total = float(whole.sum())
    if total <= 0:
        return None
    order = np.argsort(-whole, kind="stable")
    anchors = order[(whole[order] > anchor_share * total / C) & (L[order] >= 4 * min_chunk)]
    if not len(anchors):
        return None
    node = C if cm.node_size is None else max(1, min(C, int(cm.node_size)))
    spans, ranges = _slot_line(whole[anchors] * (C / total), C, node)
    planned = []  # (anchor, pieces) of the anchors on 2+ ranks; one whose interval lies in one slot is a tail
    is_anchor = np.zeros(len(L), dtype=bool)
    slots = [float(r) for r in range(C + 1)]  # rank r's slot [r, r + 1)
    for d, (start, end) in zip(anchors.tolist(), spans):
        pieces = _pieces((start, end), slots, int(L[d]), min_chunk)
        if len(pieces) > 1:
            planned.append((d, pieces))
            is_anchor[d] = True
    if not any(2 <= len(p) < C for _, p in planned):  # no anchor on a proper sub-group: the flat plan's job
        return None
    chains = _chains(planned, ranges)
    pairs = causal_pairs_float(L)
    # (M, D) work of each document in rank shares: estimated cost, and with two_way the cost with
    # attention priced at 0.5x and 2x (the error a cost model makes in that ratio); costed only
    # where some anchor lands on a proper sub-group
    costs = [whole] + ([_cached(doc_costs, k, lambda k=k: _scaled(cm, k).doc_cost(L)) for k in (0.5, 2.0)]
                       if two_way else [])
    unit = np.stack([c * (C / float(c.sum())) for c in costs])
    tails = order[~is_anchor[order]]
    # two_way: inside a chain, tails go where tokens and pairs (each over its mean) stay lowest,
    # so that the chain's two-way re-split can level both
    shape = np.stack([L * (C / float(L.sum())), pairs * (C / float(pairs.sum()))]) if two_way else None
    # no layout of these anchors computes less on its slowest rank than the mean of the tails' cost and
    # the anchors' exact work (margin: the sums' rounding)
    lower = _cached(doc_costs, "work_lower_bound", lambda: _doc_work_lower_bounds(L, cm))
    floor = (float(whole[tails].sum()) + float(lower[is_anchor].sum())) / C * (1 - 1e-9)
    out: list = []
    # A cap steers the tails to ranks with room; where that leaves no layout under the cap, the
    # uncapped placement is tried too: its layouts are kept where they respect the cap all the same.
    for place_cap in (cap, np.inf) if cap < np.inf else (cap,):
        owner = _place_tails(tails, unit, L, planned, chains, C, place_cap, shape)
        if owner is not None:
            out = _resplit(L, C, cm, chains, tails, owner, whole, pairs, min_chunk, two_way, cap, floor)
            if out:
                break
    return (L, out) if out or owner is not None else None


def _resplit(L, C, cm, chains, tails, owner, whole, pairs, min_chunk, two_way, cap, floor=0.0):
    """The layouts of the chains re-split around the tails ``owner`` places (see :func:`_layouts`), as
    (mode, segments, rank of each, slowest rank's compute), cost-level first. The two-way re-split is
    laid first: where its slowest rank is within TWO_WAY_TOLERANCE of ``floor`` (a lower bound of
    any layout's), it is kept whatever the cost-level one would compute, which is then not laid."""
    # what each rank holds apart from the split anchors: its tails
    held: list[list[tuple[int, int, int]]] = [[] for _ in range(C)]
    for d, r in zip(tails.tolist(), owner.tolist()):
        held[r].append((d, 0, int(L[d])))
    base = np.zeros((3, C))  # cost, tokens, pairs of what each rank holds whole
    np.add.at(base[0], owner, whole[tails])
    np.add.at(base[1], owner, L[tails].astype(np.float64))
    np.add.at(base[2], owner, pairs[tails])
    offsets = row_offsets(L)
    out = []
    for mode in (("two_way", "cost") if two_way else ("cost",)):
        segs = _split_chains(chains, L, whole, pairs, base, C, min_chunk, mode, cm)
        # every rank's segments, rank by rank in row order (as sort_segments per rank: row starts
        # are distinct within a rank)
        seg = np.array([x for h, sg in zip(held, segs) for x in h + sg], dtype=np.int64).reshape(-1, 3)
        rank = np.repeat(np.arange(C), [len(h) + len(sg) for h, sg in zip(held, segs)])
        o = np.lexsort((offsets[seg[:, 0]] + seg[:, 1], rank))
        seg, rank = seg[o], rank[o]
        n_tok = np.bincount(rank, weights=seg[:, 2] - seg[:, 1], minlength=C)
        if n_tok.max() > cap or (n_tok.min() == 0 and L.sum() >= C):
            continue  # every rank gets a token (transformers cannot run on none)
        # the two re-splits exchange about the same K/V: compared on their slowest rank's compute
        slowest = float(np.bincount(rank, weights=cm.segment_cost(seg[:, 1], seg[:, 2]), minlength=C).max())
        out.append((mode, seg, rank, slowest))
        if mode == "two_way" and slowest <= floor * (1 + TWO_WAY_TOLERANCE):
            break
    return out[::-1]


def rank_compute(per_rank: list[np.ndarray], cm: CostModel) -> np.ndarray:
    """(C,) estimated compute seconds of each rank's segments (no exchange)."""
    allseg = np.concatenate(per_rank)
    rank_of = np.repeat(np.arange(len(per_rank)), [len(x) for x in per_rank])
    return np.bincount(rank_of, weights=cm.segment_cost(allseg[:, 1], allseg[:, 2]), minlength=len(per_rank))


@functools.lru_cache(maxsize=64)
def _scaled(cm: CostModel, k: float) -> CostModel:
    """``cm`` with every attention pair price times ``k`` (cached: models are frozen, and
    building one validates every field)."""
    return scale_attention_price(cm, k)


def _slot_line(size: np.ndarray, C: int, node: int) -> tuple[list[tuple[float, float]], list[tuple[int, int]]]:
    """(start, end) of each anchor on the line of C unit slots (rank r holds ``[r, r + 1)``),
    and the rank ranges ``[lo, hi)`` the anchors were laid in (the nodes, or the whole group).

    The anchors are laid end to end, stretched to cover every slot, so that every rank holds a
    share of some anchor (all ranks are then joined in chains and end level). With nodes
    (``node < C``) and every anchor fitting one node, the anchors are first dealt to nodes
    (most expensive first, to the node with the least anchor work per rank) and each node's
    anchors cover that node's slots only: their K/V never leave it.
    """
    nodes = [(lo, min(C, lo + node)) for lo in range(0, C, node)]
    if len(nodes) == 1 or float(size.max()) > node:
        nodes, where = [(0, C)], np.zeros(len(size), dtype=np.int64)
    else:
        work = np.zeros(len(nodes))
        where = np.zeros(len(size), dtype=np.int64)
        width = np.array([hi - lo for lo, hi in nodes], dtype=np.float64)
        for i, s in enumerate(size.tolist()):
            k = int(np.argmin((work + s) / width))
            where[i] = k
            work[k] += s
    out = [(0.0, 0.0)] * len(size)
    for k, (lo, hi) in enumerate(nodes):
        mine = np.flatnonzero(where == k)
        if not len(mine):
            continue
        edges = lo + np.concatenate([[0.0], np.cumsum(size[mine])]) * ((hi - lo) / float(size[mine].sum()))
        for j, i in enumerate(mine.tolist()):
            out[i] = (float(edges[j]), float(edges[j + 1]))
    return out, nodes


def _pieces(span, edges, n: int, min_chunk: int) -> list[tuple[int, int]]:
    """(rank, tokens) of an anchor of ``n`` tokens covering ``span = [start, end)`` of a line
    whose rank ``r`` holds ``[edges[r], edges[r + 1])``; tokens in proportion to the overlaps
    (largest remainders rounded up), pieces under ``2 * min_chunk`` tokens merged into their
    neighbour. Pure Python: a few ranks per anchor."""
    start, end = float(span[0]), float(span[1])
    C = len(edges) - 1
    r0 = min(C - 1, max(0, bisect.bisect_right(edges, start) - 1))
    r1 = min(C - 1, max(r0, bisect.bisect_left(edges, end - 1e-9 * max(1.0, end)) - 1))
    # (edges that are ints give the same values: every one is exact as a float)
    share = [max(min(edges[r + 1], end) - max(edges[r], start), 0.0) for r in range(r0, r1 + 1)]
    share[-1] = max(share[-1], end - max(edges[r1], start))  # past the line's end (rounding): the last rank
    tot = sum(share)
    want = [x / tot * n for x in share] if tot > 0 else [n / len(share)] * len(share)
    got = [int(w) for w in want]
    short = n - sum(got)
    if short:  # largest remainders first, ties to the lower rank (got - want is -(want - got) exactly)
        for _, i in sorted([(g - w, i) for i, (w, g) in enumerate(zip(want, got))])[:short]:
            got[i] += 1
    pieces = [(r0 + i, k) for i, k in enumerate(got) if k > 0]
    while len(pieces) > 1:
        sizes = [k for _, k in pieces]
        i = sizes.index(min(sizes))  # the smallest piece (the first of equals)
        if sizes[i] >= 2 * min_chunk:
            break
        j = i - 1 if i > 0 and (i == len(pieces) - 1 or pieces[i - 1][1] <= pieces[i + 1][1]) else i + 1
        pieces[j] = (pieces[j][0], pieces[j][1] + pieces[i][1])
        del pieces[i]
    return pieces


def _chains(planned: list, ranges: list[tuple[int, int]]) -> list[tuple[int, int, list]]:
    """The chains: every rank range ``[lo, hi)`` the anchors were laid in that holds split
    anchors, as (first rank, last rank, its anchors (doc, pieces) in line order). Its anchors
    are re-laid over all its ranks, so a chain never breaks where an anchor happened to end on
    a rank edge."""
    out = []
    for lo, hi in ranges:
        mine = [(d, p) for d, p in planned if lo <= p[0][0] < hi]
        if mine:
            out.append((lo, hi - 1, mine))
    return out


def _level(base: np.ndarray, amount: float) -> np.ndarray:
    """Water filling: how much of ``amount`` each rank takes so the ranks that take any end at
    one level above ``base`` ((k,) loads); (k,) rooms summing to ``amount``."""
    # In Python floats (k is a CP group's ranks: a few to tens): the same sequential running sum
    # as np.cumsum and the same divisions, without a dozen numpy calls on tiny arrays.
    level, acc = None, 0.0  # the first rank always qualifies (amount >= 0)
    for i, x in enumerate(sorted(base.tolist())):
        acc += x
        lv = (amount + acc) / (i + 1)
        if lv >= x:
            level = lv
    return np.maximum(level - base, 0.0)


def _lay(members, sizes, rooms, a, L, min_chunk):
    """The chain's anchors (in order, ``sizes`` long) laid on the line of ``rooms`` (its ranks
    from ``a``): per anchor, its (rank, tokens) pieces."""
    edges = np.concatenate([[0.0], np.cumsum(rooms)]).tolist()
    spans = np.concatenate([[0.0], np.cumsum(sizes)]).tolist()
    return [(d, [(a + r, k) for r, k in _pieces(spans[i:i + 2], edges, int(L[d]), min_chunk)])
            for i, (d, _) in enumerate(members)]


def _split_chains(chains, L, whole, pairs, base, C, min_chunk, mode, cm):
    """Per rank, the nested segments of every split anchor, each chain re-laid on the room its
    ranks have left (``base``: (3, C) cost, tokens, pairs held whole). ``mode``: ``"cost"``
    levels the estimated cost (laid by cost shares, then once more with each rank's room
    corrected by how far the measured cost of its chunks missed the level: chunk costs are not
    quite proportional to tokens, small pieces merge); ``"two_way"`` levels tokens, then pairs
    by where chunks sit."""
    segs: list[list[tuple[int, int, int]]] = [[] for _ in range(C)]
    for a, b, members in chains:
        docs = np.array([d for d, _ in members], dtype=np.int64)
        if mode == "cost":
            sizes = whole[docs]
            rooms = _level(base[0, a:b + 1], float(sizes.sum()))
            best = None
            for step in range(2):
                split = _lay(members, sizes, rooms, a, L, min_chunk)
                trial: list[list[tuple[int, int, int]]] = [[] for _ in range(b + 1 - a)]
                for d, pieces in split:
                    _nest(d, int(L[d]), [(r - a, k) for r, k in pieces], trial)
                seg = np.array([x for t in trial for x in t], dtype=np.int64).reshape(-1, 3)
                rank_of = np.repeat(np.arange(len(trial)), [len(t) for t in trial])
                got = base[0, a:b + 1] + np.bincount(rank_of, weights=cm.segment_cost(seg[:, 1], seg[:, 2]),
                                                     minlength=len(trial))
                if best is None or got.max() < best[0]:
                    best = (float(got.max()), trial)
                if step == 1:
                    break  # the rooms of a third lay are not needed
                rooms = np.maximum(rooms - (got - got.mean()), 0.0)
                if rooms.sum() <= 0:
                    break
                rooms *= float(sizes.sum()) / float(rooms.sum())
            for i, t in enumerate(best[1]):
                segs[a + i].extend(t)
            continue
        sizes = L[docs].astype(np.float64)
        split = _lay(members, sizes, _level(base[1, a:b + 1], float(sizes.sum())), a, L, min_chunk)
        # pair targets: the chain level in pairs, less what each rank holds whole
        need = np.zeros(C)
        ranks = np.arange(a, b + 1)
        need[ranks] = (base[2, ranks].sum() + pairs[docs].sum()) / len(ranks) - base[2, ranks]
        mirror = np.zeros((len(split), C))  # pairs of a mirrored share: n (L + 1) / 2
        for i, (d, pieces) in enumerate(split):
            for r, k in pieces:
                mirror[i, r] = k * (int(L[d]) + 1) / 2.0
        later = np.cumsum(mirror[::-1], axis=0)[::-1]
        for i, (d, pieces) in enumerate(split):
            target = need - (later[i + 1] if i + 1 < len(split) else 0.0)
            ahead = {r for _, p in split[i + 1:] for r, _ in p}
            cont = next((r for r, _ in reversed(pieces) if r in ahead), None)
            need -= _nest(d, int(L[d]), pieces, segs, target, min_chunk, cont)
    return segs


def _nest(d: int, n: int, pieces: list[tuple[int, int]], segs: list, target=None, min_chunk: int = 1,
          cont: int | None = None) -> np.ndarray:
    """Nested head-tail chunks of document ``d``: largest share outermost, the smallest the middle.

    Without ``target`` a rank's head and tail chunks are equal (within a token); with it
    ((C,) pairs wanted per rank), each rank's head/tail proportion is chosen to bring its
    causal pairs nearest its target (a longer head, a shorter tail: fewer pairs, linearly),
    heads and tails kept at ``min_chunk`` tokens or more where they exist and the outermost
    rank keeping the document's first token. ``cont``: a rank of ``pieces`` that holds later
    anchors of its chain, which passes the pairs on (see :func:`_split_chains`). Returns the
    (C,) pairs each rank got."""
    got = np.zeros(len(segs))
    H, E = 0, n
    ordered = sorted(pieces, key=lambda p: (-p[1], p[0]))
    if target is not None and len(ordered) > 1:
        # a rank that holds later anchors too takes what the others leave: it goes innermost
        # (unless outermost), and its target is the document's pairs less the others' targets
        target = target.copy()
        if cont is not None and any(r == cont for r, _ in ordered):
            if ordered[0][0] != cont:
                ordered = [p for p in ordered if p[0] != cont] + [p for p in ordered if p[0] == cont]
            target[cont] = causal_pairs(n) - sum(target[r] for r, _ in ordered if r != cont)
    for i, (r, k) in enumerate(ordered):
        if i == len(ordered) - 1:
            segs[r].append((d, H, E))
            got[r] += causal_pairs(E) - causal_pairs(H)
            continue
        h = (k + 1) // 2
        if target is not None:
            a, b = H, E - k
            base = (causal_pairs(E) - causal_pairs(a)) + (a - b) * (a + b + 1) / 2.0
            h = int(np.clip(np.rint((target[r] - base) / (a - b)), 0, k)) if a < b else h
            if i == 0 and h == 0:  # the largest share holds the first token
                h = min(k, min_chunk)
            if k >= 2 * min_chunk and (0 < h < min_chunk or 0 < k - h < min_chunk):
                h = int(np.clip(h, min_chunk, k - min_chunk))
        if h:
            segs[r].append((d, H, H + h))
        if k - h:
            segs[r].append((d, E - (k - h), E))
        got[r] += causal_pairs(H + h) - causal_pairs(H) + causal_pairs(E) - causal_pairs(E - (k - h))
        H, E = H + h, E - (k - h)
    return got


def _place_tails(tails, unit, L, planned, chains, C: int, cap: float, shape=None) -> np.ndarray | None:
    """Whole documents (``tails``, most expensive first) to ranks: each to the *bin* (a chain of
    ranks, or a rank in none) with token room whose worst load over the units (``unit``: (M, D)
    document work in rank shares; a bin's load is over its number of ranks, counting the split
    anchors it holds) stays lowest, ties to the lower bin; inside the bin, to the rank with room
    and the least estimated cost (the chain's re-split levels its ranks afterwards), or with
    ``shape`` ((2, D) tokens and pairs in rank shares) the least of the two after adding it
    (a split anchor's share counted as mirrored). Returns the (T,) rank of each document, or
    None if one fits nowhere under the cap."""
    M = unit.shape[0]
    bin_of = list(range(C))
    members = [[r] for r in range(C)]
    for a, b, _ in chains:
        for r in range(a, b + 1):
            bin_of[r] = a
        members[a] = list(range(a, b + 1))
        for r in range(a + 1, b + 1):
            members[r] = []
    bins = [b for b in range(C) if members[b]]
    width = {b: float(len(members[b])) for b in bins}
    bload = {b: [0.0] * M for b in bins}
    cost = [0.0] * C
    toks = [0] * C
    tk, pr = [0.0] * C, [0.0] * C
    for d, pieces in planned:
        n_d = int(L[d])
        for r, k in pieces:
            f = k / n_d
            for m in range(M):
                bload[bin_of[r]][m] += float(unit[m, d]) * f
            cost[r] += float(unit[0, d]) * f
            toks[r] += k
            if shape is not None:
                tk[r] += float(shape[0, d]) * f
                pr[r] += float(shape[1, d]) * f
    if max(toks) > cap:
        return None
    owner = []
    rows = unit[:, tails].T.tolist()
    sh = shape[:, tails].T.tolist() if shape is not None else [(0.0, 0.0)] * len(tails)
    capped = cap < np.inf
    low = {b: min(toks[r] for r in members[b]) for b in bins}  # fewest tokens on a rank of each bin
    line = [(b, bload[b], width[b]) for b in bins]
    for w, n, (x, y) in zip(rows, L[tails].tolist(), sh):
        best, pick = np.inf, -1
        if M == 3:  # the worst of three models (max() inlined: the hot loop, tails x bins)
            w0, w1, w2 = w
            for b, lb, wd in line:
                if capped and low[b] + n > cap:
                    continue
                v = lb[0] + w0
                u = lb[1] + w1
                if u > v:
                    v = u
                u = lb[2] + w2
                if u > v:
                    v = u
                v = v / wd
                if v < best:
                    best, pick = v, b
        else:
            for b, lb, wd in line:
                if capped and low[b] + n > cap:
                    continue
                v = max((lb[m] + w[m]) for m in range(M)) / wd
                if v < best:
                    best, pick = v, b
        if pick < 0:
            return None
        room = [q for q in members[pick] if toks[q] + n <= cap] if capped else members[pick]
        if shape is None:
            r = min(room, key=lambda q: (cost[q], q))
        else:  # min(room, key=(max(tk + x, pr + y), rank)): room is in rank order
            r, low_v = room[0], max(tk[room[0]] + x, pr[room[0]] + y)
            for q in room[1:]:
                v = max(tk[q] + x, pr[q] + y)
                if v < low_v:
                    r, low_v = q, v
            tk[r] += x
            pr[r] += y
        lb = bload[pick]
        for m in range(M):
            lb[m] += w[m]
        cost[r] += w[0]
        toks[r] += n
        if capped and toks[r] - n == low[pick]:  # r held the fewest: the bin's fewest may have moved
            low[pick] = min(toks[q] for q in members[pick])
        owner.append(r)
    return np.array(owner, dtype=np.int64)

"""Hierarchical ATP: anchors split head-tail over a sub-group of ranks, not all of them.

A document too expensive to stay whole on one rank but too cheap to be worth splitting over
all C ranks is split over just enough ranks to hold its work; only those ranks exchange its
K/V (with the all-to-all exchange, :mod:`atac_hf.sharding.exchange`). A document's *share*
is its cost over a rank's share of the pack (``total / C``), under the cost model with
attention priced at 0.5x, 1x and 2x (the price ratio of attention and token-wise work is
what a cost model gets least right); its *worst share* is the largest of the three. Steps:

1. Anchors are the documents whose worst share exceeds ``anchor_share`` and that are long
   enough to cut (``>= 4 * min_chunk`` tokens), most expensive first.
2. The anchors are laid end to end on a line of C slots (cutting stock), each as long as its
   worst share, scaled so that the C slots would hold every document of the pack: each
   anchor covers the ranks its interval overlaps, so its level (the number of ranks it is
   split over) follows from its cost, from 1 (whole) to C, and the ranks of a sub-group are
   consecutive (in one node where the group fits one). A rank's share of an anchor is its
   overlap with the anchor's interval.
3. Each anchor is split head-tail *nested* over its sub-group: the rank with the largest
   share takes the outermost head and tail chunks (it receives only the rest of the
   document), the next one the next chunks inward, the smallest share the middle. A rank's
   head and tail chunks are mirror images of equal size (one token apart), so its share of
   the attention work equals its share of the tokens; no length needs to divide anything
   and nothing is padded.
4. The other documents (tails) go whole, most expensive first, to the rank with token room
   whose worst load over the three models stays lowest; a local search then moves or swaps
   tails off the worst-loaded rank while that helps.

:func:`~atac_hf.sharding.atp.plan_atp` builds this plan for a few ``anchor_share`` values
and keeps it where its estimated block time (compute + exposed K/V exchange, all-gather or
all-to-all, whichever is estimated faster) beats the flat anchor-tail plan. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from ..cost import CostModel
from .plan import ShardPlan
from .segments import finish_plan, row_offsets, sort_segments

__all__ = ["ANCHOR_SHARES", "plan_subgroups"]

#: ``anchor_share`` values ATP tries: a document is an anchor when it costs more than this
#: fraction of a rank's share of the pack.
ANCHOR_SHARES = (1.0, 0.5, 0.25)


def plan_subgroups(lengths, C: int, cm: CostModel, *, anchor_share: float = 1.0, max_tokens_per_rank=None,
                   min_chunk: int = 1, strategy: str = "atp", two_way: bool = True) -> ShardPlan | None:
    """The hierarchical anchor-tail plan of one pack (see the module docstring).

    Args:
        lengths: (D,) document lengths in row order.
        C: ranks.
        cm: cost model.
        anchor_share: anchors cost more than this fraction of ``total / C``.
        max_tokens_per_rank: token cap per rank (None: no cap).
        min_chunk: an anchor has at least ``4 * min_chunk`` tokens.
        strategy: the name the plan carries.
        two_way: level the ranks under the cost model with attention priced at 0.5x, 1x and
            2x at once (see the module docstring); False: under ``cm`` alone.

    Returns:
        The plan (K/V exchange chosen by estimated time), or None when the cap cannot be kept,
        a rank would get no token (of a pack of at least C tokens), or no anchor lands on a
        proper sub-group (2..C-1 ranks).
    """
    L = np.asarray(lengths, dtype=np.int64)
    D = len(L)
    cap = np.inf if max_tokens_per_rank is None else float(max_tokens_per_rank)
    whole = cm.doc_cost(L)
    total = float(whole.sum())
    if C < 2 or total <= 0:
        return None
    models = [cm] + ([_scaled(cm, 0.5), _scaled(cm, 2.0)] if two_way else [])
    costs = np.stack([whole] + [m.doc_cost(L) for m in models[1:]])  # (M, D)
    slots = costs.sum(axis=1) / C
    share = costs / slots[:, None]  # (M, D) in rank shares
    worst = share.max(axis=0)
    size = worst / (worst.sum() / C)  # the slot line: worst shares, C slots hold every document
    order = np.argsort(-whole, kind="stable")
    is_anchor = np.zeros(D, dtype=bool)
    is_anchor[order[(worst[order] > anchor_share) & (L[order] >= 4 * min_chunk)]] = True
    load = np.zeros((len(models), C))
    tok = np.zeros(C, dtype=np.int64)
    segs: list[list[tuple[int, int, int]]] = [[] for _ in range(C)]
    pos = 0.0
    groups = []  # the (rank, tokens) pieces of each split anchor
    whole_docs = []  # anchors whose interval lies in one slot: placed whole there
    for d in order[is_anchor[order]].tolist():
        start, end = pos, pos + float(size[d])
        pos = end
        pieces = _pieces(start, end, 1.0, C, int(L[d]), min_chunk)
        if len(pieces) == 1:
            whole_docs.append((d, pieces[0][0]))
            continue
        _nest(d, int(L[d]), pieces, segs)
        groups.append(pieces)
        for r, n in pieces:
            tok[r] += n
            load[:, r] += costs[:, d] * n / int(L[d])
    for d, r in whole_docs:
        segs[r].append((d, 0, int(L[d])))
        tok[r] += int(L[d])
        load[:, r] += costs[:, d]
    if tok.max(initial=0) > cap:
        return None
    tails = order[~is_anchor[order]]
    owner = _place_tails(tails, share, L, load / slots[:, None], tok, cap)
    if owner is None:
        return None
    for d, r in zip(tails.tolist(), owner.tolist()):
        segs[r].append((d, 0, int(L[d])))
    if tok.min() == 0 and L.sum() >= C:  # every rank gets a token (transformers cannot run on none)
        return None
    if not any(2 <= len(g) < C for g in groups):  # no anchor on a proper sub-group: the flat plan's job
        return None
    offsets = row_offsets(L)
    per_rank = [sort_segments(np.asarray(s, dtype=np.int64).reshape(-1, 3), offsets) for s in segs]
    return finish_plan(L, C, strategy, per_rank, None, cm, "auto")


def _pieces(start: float, end: float, slot: float, C: int, n: int, min_chunk: int) -> list[tuple[int, int]]:
    """(rank, tokens) of an anchor of ``n`` tokens covering ``[start, end)`` of the slot line;
    pieces under ``2 * min_chunk`` tokens are merged into their neighbour."""
    r0 = min(C - 1, int(start // slot))
    r1 = min(C - 1, max(r0, int(np.ceil(end / slot - 1e-9)) - 1))
    cost = end - start
    shares = []
    for r in range(r0, r1 + 1):
        lo = max(start, r * slot)
        hi = end if r == r1 else min(end, (r + 1) * slot)
        shares.append(max(hi - lo, 0.0) / cost)
    want = np.asarray(shares) * n
    got = np.floor(want).astype(np.int64)
    got[np.argsort(-(want - got), kind="stable")[: n - int(got.sum())]] += 1
    pieces = [(r0 + i, int(k)) for i, k in enumerate(got) if k > 0]
    while len(pieces) > 1 and min(k for _, k in pieces) < 2 * min_chunk:
        i = min(range(len(pieces)), key=lambda j: pieces[j][1])
        j = i - 1 if i > 0 and (i == len(pieces) - 1 or pieces[i - 1][1] <= pieces[i + 1][1]) else i + 1
        pieces[j] = (pieces[j][0], pieces[j][1] + pieces[i][1])
        del pieces[i]
    return pieces


def _nest(d: int, n: int, pieces: list[tuple[int, int]], segs: list) -> None:
    """Nested head-tail chunks of document ``d``: largest share outermost, the smallest the middle."""
    H, E = 0, n
    ordered = sorted(pieces, key=lambda p: (-p[1], p[0]))
    for i, (r, k) in enumerate(ordered):
        if i == len(ordered) - 1:
            segs[r].append((d, H, E))
            continue
        h = (k + 1) // 2
        segs[r].append((d, H, H + h))
        if k - h:
            segs[r].append((d, E - (k - h), E))
        H, E = H + h, E - (k - h)


def _scaled(cm: CostModel, k: float) -> CostModel:
    """``cm`` with every attention pair price times ``k``."""
    m = cm.masked_attn_s_per_pair
    return cm.replace(attn_s_per_pair=cm.attn_s_per_pair * k, masked_attn_s_per_pair=None if m is None else m * k)


def _place_tails(tails, share, L, load, tok, cap, max_rounds: int | None = None) -> np.ndarray | None:
    """Whole documents, most expensive first, each to the rank with token room whose worst
    load over the cost models (``share``: (M, D) document costs, ``load``: (M, C) rank loads,
    both in rank shares; updated) stays lowest, ties to the lower rank; then a local search
    moves or swaps documents off the worst-loaded rank while that lowers its pair's worst load
    (at most ``max_rounds``, default twice the number of documents). Returns the (T,) rank of
    each document, or None if one fits nowhere under the cap."""
    T = len(tails)
    owner = np.zeros(T, dtype=np.int64)
    for i, d in enumerate(tails.tolist()):
        n = int(L[d])
        worst = (load + share[:, d:d + 1]).max(axis=0)
        worst[tok + n > cap] = np.inf
        r = int(np.argmin(worst))
        if not np.isfinite(worst[r]):
            return None
        load[:, r] += share[:, d]
        tok[r] += n
        owner[i] = r
    if T == 0:
        return owner
    S = share[:, tails]  # (M, T)
    n_t = L[tails].astype(np.int64)
    for _ in range(2 * T if max_rounds is None else max_rounds):
        worst = load.max(axis=0)
        hi = int(np.argmax(worst))
        mine = np.flatnonzero(owner == hi)
        if not len(mine):
            break
        best, move = worst[hi] * (1 - 1e-9), None
        # move document t of hi to rank q: (k, C)
        hi_after = (load[:, hi:hi + 1] - S[:, mine]).max(axis=0)  # (k,)
        q_after = (load[:, None, :] + S[:, mine, None]).max(axis=0)  # (k, C)
        q_after[:, hi] = np.inf
        q_after[tok[None, :] + n_t[mine, None] > cap] = np.inf
        val = np.maximum(hi_after[:, None], q_after)
        k, q = np.unravel_index(int(np.argmin(val)), val.shape)
        if val[k, q] < best:
            best, move = val[k, q], ("move", int(mine[k]), int(q))
        # swap document t of hi with document u of another rank: (k, T)
        other = owner != hi
        if other.any():
            delta = S[:, other][:, None, :] - S[:, mine][:, :, None]  # (M, k, U): hi gains u, loses t
            hi_sw = (load[:, hi, None, None] + delta).max(axis=0)
            ou = owner[other]
            q_sw = (load[:, ou][:, None, :] - delta).max(axis=0)
            dn = n_t[other][None, :] - n_t[mine][:, None]
            q_sw[(tok[hi] + dn > cap) | (tok[ou][None, :] - dn > cap)] = np.inf
            val = np.maximum(hi_sw, q_sw)
            k, u = np.unravel_index(int(np.argmin(val)), val.shape)
            if val[k, u] < best:
                best, move = val[k, u], ("swap", int(mine[k]), int(np.flatnonzero(other)[u]))
        if move is None:
            break
        kind, t, x = move
        if kind == "move":
            load[:, hi] -= S[:, t]
            load[:, x] += S[:, t]
            tok[hi] -= n_t[t]
            tok[x] += n_t[t]
            owner[t] = x
        else:
            q = int(owner[x])
            load[:, hi] += S[:, x] - S[:, t]
            load[:, q] += S[:, t] - S[:, x]
            tok[hi] += n_t[x] - n_t[t]
            tok[q] += n_t[t] - n_t[x]
            owner[t], owner[x] = q, hi
    return owner

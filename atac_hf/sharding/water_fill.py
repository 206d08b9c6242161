"""ATP's cost-level anchor split (the water fill): anchors split head-tail with per-rank token
shares that level the ranks' estimated loads, under each rank's token room. Used by :mod:`.atp`;
pure numpy and Python.
"""

from __future__ import annotations

import numpy as np

from ..cost import CostModel
from .subgroups import _level

__all__: list[str] = []


def _water_fill(cm: CostModel, lengths: np.ndarray, costs: np.ndarray, load: np.ndarray,
                tok: np.ndarray, cap: float):
    """Split anchors head-tail with per-rank shares that level the loads.

    Args: anchor lengths and whole costs (j,), per-rank load and tokens before them.
    Returns ((j, 2C+1) chunk bounds, (C,) added cost per rank), or None if the cap forbids it.
    """
    C = len(load)
    room = cap - tok
    share = _level(load, float(costs.sum()))
    shared = share.sum()
    frac = share / shared if shared > 0 else np.full(C, 1.0 / C)
    split = _split_by_share(cm, lengths, frac, room)
    if split is None:
        return None
    bounds, n, added = split
    # Tile quantisation makes per-token cost differ a little between ranks: one
    # correction step rescales each rank's tokens by its measured cost per token.
    # Per rank in Python scalars (C of them, elementwise: the same IEEE divisions as numpy's, a few
    # us fewer than a dozen numpy calls on (C,) arrays); only the sum of adj stays numpy's.
    got, add_l = n.sum(axis=0).tolist(), added.tolist()
    if shared > 0 and all(a > 0 for g, a in zip(got, add_l) if g > 0):
        per_tok = [a / max(g, 1) if g > 0 else 0.0 for g, a in zip(got, add_l)]
        adj = np.array([s / p if f > 0 and p > 0 else 0.0
                        for s, p, f in zip(share.tolist(), per_tok, frac.tolist())])
        adj_sum = adj.sum()
        if adj_sum > 0:
            split2 = _split_by_share(cm, lengths, adj / adj_sum, room)
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
    # clip shares at the cap, handing the excess to ranks with room (a few rounds at most). A
    # share a rounding error over its room is not over: the floors below keep each rank's whole
    # tokens within it (refusing there turned away anchors that fit exactly, issue 20).
    want_tot = frac * total
    tol = min(0.5, 1e-9 * total)
    for _ in range(C):
        over = want_tot > room + tol
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
    for d in (n.sum(axis=1) > lengths).nonzero()[0].tolist():  # past 2**53 a float floor can overshoot:
        for r in np.argsort(want[d] - n[d], kind="stable").tolist():  # give back, smallest fraction first
            n[d, r] -= min(int(n[d].sum() - lengths[d]), int(n[d, r]))
    rest = (lengths - n.sum(axis=1)).tolist()
    if any(rest):
        # hand out the remainders (largest fraction first) in Python scalars: a few per document
        prefs = np.argsort(-(want - n), axis=1, kind="stable").tolist()
        left, nl = (room - n.sum(axis=0)).tolist(), n.tolist()
        for d, k in enumerate(rest):
            for r in prefs[d]:
                if k == 0:
                    break
                if left[r] >= 1:
                    nl[d][r] += 1
                    left[r] -= 1
                    k -= 1
            if k:
                for r in [q for q in range(C) if left[q] >= 1][:k]:
                    nl[d][r] += 1
                    left[r] -= 1
                    k -= 1
            for r in range(C):  # still more than the ranks with room: several tokens a rank
                if k == 0:
                    break
                take = int(min(k, left[r]))  # left is inf without a cap
                if take > 0:
                    nl[d][r] += take
                    left[r] -= take
                    k -= take
            if k:
                return None
        n = np.array(nl, dtype=np.int64).reshape(n.shape)
    heads = (n + 1) // 2
    sizes = np.concatenate([heads, (n - heads)[:, ::-1]], axis=1)
    bounds = np.zeros((len(lengths), 2 * C + 1), dtype=np.int64)
    np.cumsum(sizes, axis=1, out=bounds[:, 1:])
    # every chunk costed in one call: rank r holds chunk r (its head) and chunk 2C-1-r (its tail)
    cost = cm.segment_cost(bounds[:, :-1], bounds[:, 1:])
    added = (cost[:, :C] + cost[:, :C - 1:-1]).sum(axis=0)
    return bounds, n, added

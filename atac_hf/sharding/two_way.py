"""ATP's two-way split: anchors split over the ranks so that, with the tails placed whole, every
rank holds the same number of tokens *and* of causal attention pairs (level whatever the true
price ratio of token-wise work and attention). Used by :mod:`.atp`; pure numpy and Python.
"""

from __future__ import annotations

import numpy as np

from .segments import causal_pairs_float, causal_pairs_total

__all__: list[str] = []


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
    flat = _two_way_flat(lengths, C, anchors, owner, cap, min_chunk)
    if flat is None:
        return None
    seg, rank = flat
    ends = np.cumsum(np.bincount(rank, minlength=C)).tolist()
    return [seg[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _proportional_split(A: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """(j, C) int64 token counts: anchor ``d``'s ``A[d]`` tokens split over the ranks in proportion to
    ``goal`` (which sums to ``A.sum()``), each floor's remainder to the largest fractions first.
    In floats where every product is exact enough (below 2**53), else in Python ints."""
    G = int(goal.sum())
    if int(A.max(initial=0)) * G < 2 ** 53:
        want = A[:, None] * (goal / G)[None, :]
        n = np.floor(want).astype(np.int64)
        frac = want - n
    else:  # exact: A[d] * goal[r] overflows int64 and float here
        prod = [[a * g for g in goal.tolist()] for a in A.tolist()]
        n = np.array([[x // G for x in row] for row in prod], dtype=np.int64).reshape(len(A), len(goal))
        frac = np.array([[(x % G) / G for x in row] for row in prod]).reshape(n.shape)
    for d in range(len(A)):  # hand out the rounding remainders, largest fraction first
        short = int(A[d] - n[d].sum())
        n[d, np.argsort(-frac[d], kind="stable")[:short]] += 1
    return n


def _two_way_flat(lengths: np.ndarray, C: int, anchors: np.ndarray, owner: np.ndarray, cap: float,
                  min_chunk: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_two_way_anchor_segments` as one (n, 3) array of every rank's segments in turn and the
    (n,) rank of each: what :func:`finish_flat` takes (two numpy calls, not two per rank)."""
    L = lengths.astype(np.int64)
    tails = (owner >= 0).nonzero()[0]
    tail_int = np.zeros(C, dtype=np.int64)  # exact (the level totals below need it past 2**53)
    np.add.at(tail_int, owner[tails], L[tails])
    tail_tok = tail_int.astype(np.float64)
    tail_pairs = np.bincount(owner[tails], weights=causal_pairs_float(L[tails]), minlength=C)
    need_tok = float(L.sum()) / C - tail_tok
    need_pairs = causal_pairs_total(L) / C - tail_pairs
    if need_tok.min() < 0 or need_pairs.min() < 0 or need_tok.sum() <= 0 or np.ceil(float(L.sum()) / C) > cap:
        return None
    A = L[anchors]
    # level token counts: integer per-rank totals (within a token of level, so under every
    # feasible cap), each anchor split in proportion to them, rounding repaired. The totals are
    # exact integers (past 2**53 tokens a float floor no longer sums to the anchors' tokens, and
    # the repair below never ended, issue 20); the float fractions only order the top-ups.
    q, m = divmod(int(L.sum()), C)
    goal = q - tail_int
    goal[np.argsort(-(need_tok - np.floor(need_tok + 1e-9)), kind="stable")[:m]] += 1
    n = _proportional_split(A, goal)
    off = n.sum(axis=0) - goal
    while off.any():  # per-anchor rounding can leave a rank a token or two over its total
        o, u = int(np.argmax(off)), int(np.argmin(off))
        d = int(np.argmax(n[:, o]))
        k = int(min(off[o], -off[u], n[d, o]))
        n[d, o] -= k
        n[d, u] += k
        off[o] -= k
        off[u] += k
    mirror = n * ((A[:, None] + 1) / 2.0)  # pairs of a mirrored head-tail share (no int64 product)
    remaining = need_pairs.copy()
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(C)]
    for d in range(len(A)):  # scalar work in Python floats and ints (the same IEEE arithmetic as numpy's)
        Ld, doc, nd = int(A[d]), int(anchors[d]), n[d].tolist()
        target = remaining - mirror[d + 1:].sum(axis=0)
        ranks = [r for r in np.argsort(-np.abs(target - mirror[d]), kind="stable").tolist() if nd[r] > 0]
        target = target.tolist()
        H, E = 0, Ld
        for i, r in enumerate(ranks):
            nr = nd[r]
            if i == len(ranks) - 1:  # innermost: the middle, one chunk
                h = nr
            else:
                # pairs(h) = pairs(H + h) - pairs(H) + pairs(E) - pairs(E - nr + h): linear in h
                a, b = H, E - nr
                base = (E * (E + 1) - a * (a + 1)) // 2 + (a - b) * (a + b + 1) / 2.0  # causal_pairs, inlined
                slope = float(a - b)  # < 0: a longer head (a shorter tail) has fewer pairs
                # round() is half to even, as np.rint
                h = min(max(round((target[r] - base) / slope), 0), nr) if slope < 0 else (nr + 1) // 2
                if 0 < h < min_chunk or 0 < nr - h < min_chunk:  # no chunk under min_chunk tokens
                    h = (0 if h < nr - h else nr) if nr < 2 * min_chunk else min(max(h, min_chunk), nr - min_chunk)
            t = E - (nr - h)
            got = ((H + h) * (H + h + 1) - H * (H + 1) + E * (E + 1) - t * (t + 1)) // 2  # exact: each term even
            remaining[r] -= got
            if h > 0:
                out[r].append((doc, H, H + h))
            if nr - h > 0:
                out[r].append((doc, E - (nr - h), E))
            H, E = H + h, E - (nr - h)
    return (np.array([x for r in out for x in r], dtype=np.int64).reshape(-1, 3),
            np.array([r for r, x in enumerate(out) for _ in x], dtype=np.int64))

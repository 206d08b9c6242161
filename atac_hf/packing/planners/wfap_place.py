"""WFAP's tail placement, fill level and local search (steps 4 and 5 of
:mod:`~atac_hf.packing.planners.wfap`).

Every item and pack has ``K`` costs (one per balance model, see
:class:`~atac_hf.packing.planners.window.BalanceModels`; ``K = 1`` without a price band);
a pack's *score* is the largest of its ``K`` costs, and "cheapest", "ceiling" and "lowers
the maximum" all speak of scores. With ``K = 1`` the score is the cost.

Numpy only; deterministic (ties by pack index and data order).
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["fill_level", "place_tails", "local_search"]


def fill_level(tails: list[int], lens: np.ndarray, costs: np.ndarray, light: np.ndarray, max_tokens: int,
               tolerance: float) -> float:
    """Score of a pack filled to the cap with the window's small tails (each at most 1/8 of a
    light pack at every model), plus half the balance tolerance: the level packs may reach,
    so that a pack holding an expensive tail stops below the cap instead of becoming the
    straggler. ``lens``: (n,) and ``costs``: (n, K) of every item; ``tails``: indices."""
    idx = np.asarray(tails, dtype=np.int64)
    if idx.size == 0:
        return 0.0
    ct = costs[idx]
    small = (ct <= (light / 8)[None, :]).all(axis=1)
    if not small.any():
        small[:] = True
    tok = int(lens[idx][small].sum())
    cst = ct[small].sum(axis=0)
    rho = float(cst.max()) / tok if tok else 0.0
    return rho * max_tokens * (1.0 + (tolerance - 1.0) / 2)


def place_tails(tails: list[int], L: list[int], c: list[list[float]], due: list[bool], pc: list[list[float]],
                pt: list[int], tail_of: list[list[int]], C: int, ceiling: float) -> list[int]:
    """Greedy: each tail (in the given order) to the pack of lowest score with room, unless
    that pack's score would pass ``ceiling`` (overdue tails ignore the ceiling). Updates
    ``pc`` (rebinding each changed pack's list), ``pt`` and ``tail_of``; returns the tails left.

    Packs without room for the current tail are parked by room and come back once the
    tails get short enough (the order is by decreasing score, hence length, within each
    phase; a longer tail starts a new phase), so each tail costs O(log P)."""
    P = len(pc)
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
    heap: list[tuple[float, int]] = []
    parked: list[tuple[int, int]] = []  # (-room, pack)
    left: list[int] = []
    prev = -1
    one = len(pc[0]) == 1 if P else True
    two = len(pc[0]) == 2 if P else False
    for i in tails:
        li = L[i]
        if li > prev:  # new phase: rebuild heap and parking
            heap = [(max(pc[j]), j) for j in range(P) if C - pt[j] >= li]
            parked = [(pt[j] - C, j) for j in range(P) if C - pt[j] < li]
            heapq.heapify(heap)
            heapq.heapify(parked)
        prev = li
        while parked and -parked[0][0] >= li:
            j = pop(parked)[1]
            push(heap, (max(pc[j]), j))
        ci = c[i]
        if not heap:
            left.append(i)
            continue
        j = heap[0][1]
        p = pc[j]
        if one:
            new = [p[0] + ci[0]]
            score = new[0]
        elif two:
            a, b = p[0] + ci[0], p[1] + ci[1]
            new = [a, b]
            score = a if a > b else b
        else:
            new = [a + b for a, b in zip(p, ci)]
            score = max(new)
        if score > ceiling and not due[i]:
            left.append(i)
            continue
        tail_of[j].append(i)
        pc[j] = new
        room = C - pt[j] - li
        pt[j] += li
        if room >= li:
            replace(heap, (score, j))
        else:
            pop(heap)
            push(parked, (-room, j))
    return left


def local_search(pc: list[list[float]], pt: list[int], tail_of: list[list[int]], anchor_of: list[list[int]],
                 L: list[int], c: list[list[float]], C: int, max_steps: int | None = None) -> None:
    """Move or swap one tail between the pack of highest and of lowest score while that
    lowers the pair's higher score (hence, step by step, the window's). In place.

    A step costs O(P) numpy (the packs' scores are kept in an array, updated for the two packs a
    step changes) and O(m' x n') for the swaps, m' and n' the two packs' tails of distinct
    (length, cost): tails alike give the same candidates, so only the first of each is tried (the
    choice is the one the full m x n search makes). m' and n' are at most about sqrt(2 x max_tokens):
    thousands of tiny samples in a pack no longer make an (m, n) array of gigabytes."""
    P = len(pc)
    steps = max_steps if max_steps is not None else 2 * P
    sc = np.array([max(v) for v in pc], dtype=np.float64)
    for _ in range(steps):
        p, q = int(np.argmax(sc)), int(np.argmin(sc))  # the first of equal scores, as before
        gap = sc[p] - sc[q]
        if gap <= 1e-12 * max(sc[p], 1e-30) or not tail_of[p]:
            return
        pcp, pcq = np.asarray(pc[p]), np.asarray(pc[q])
        tp, lp, cp = _distinct_tails(tail_of[p], L, c)  # (m,), (m,), (m, K)
        best_val = sc[p]
        best = None
        # move a tail p -> q
        ok = pt[q] + lp <= C
        if len(tail_of[p]) + len(anchor_of[p]) < 2:
            ok[:] = False  # never empty a pack
        if ok.any():
            val = np.maximum((pcp[None, :] - cp).max(axis=1), (pcq[None, :] + cp).max(axis=1))
            val = np.where(ok & (val < sc[p]), val, np.inf)
            k = int(np.argmin(val))
            if val[k] < best_val:
                best_val, best = float(val[k]), ("move", int(tp[k]), -1)
        # swap a tail of p with a tail of q
        if tail_of[q]:
            tq, lq, cq = _distinct_tails(tail_of[q], L, c)
            d = cp[:, None, :] - cq[None, :, :]  # (m, n, K)
            dl = lp[:, None] - lq[None, :]
            ok2 = (pt[q] + dl <= C) & (pt[p] - dl <= C)
            if ok2.any():
                val = np.maximum((pcp - d).max(axis=2), (pcq + d).max(axis=2))
                val = np.where(ok2 & (val < sc[p]), val, np.inf)
                a, b = np.unravel_index(int(np.argmin(val)), val.shape)
                if val[a, b] < best_val:
                    best_val, best = float(val[a, b]), ("swap", int(tp[a]), int(tq[b]))
        if best is None:
            return
        kind, i, u = best
        _move_tail(i, p, q, tail_of, pc, pt, L, c)
        if kind == "swap":
            _move_tail(u, q, p, tail_of, pc, pt, L, c)
        sc[p], sc[q] = max(pc[p]), max(pc[q])


#: Packs with fewer tails than this are searched tail by tail (de-duplicating costs more than it saves).
_DISTINCT_FROM = 64


def _distinct_tails(tails: list[int], L: list[int], c: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, lengths, (m, K) costs) of the first tail of each distinct (length, cost) among ``tails``, in
    their order: a move or swap of a tail is judged by its length and cost alone, and argmin over these
    rows picks the tail the search over every tail picks (the first of the minima, row-major)."""
    ids = np.asarray(tails)
    lens = np.asarray([L[i] for i in tails])
    costs = np.asarray([c[i] for i in tails], dtype=np.float64).reshape(len(tails), -1)
    if len(tails) < _DISTINCT_FROM:
        return ids, lens, costs
    key = np.empty(len(tails), dtype=[("l", np.int64)] + [(f"c{k}", np.float64) for k in range(costs.shape[1])])
    key["l"] = lens
    for k in range(costs.shape[1]):
        key[f"c{k}"] = costs[:, k]
    first = np.sort(np.unique(key, return_index=True)[1])
    return ids[first], lens[first], costs[first]


def _move_tail(i: int, src: int, dst: int, tail_of: list[list[int]], pc: list, pt: list[int], L: list[int],
               c: list) -> None:
    """Move tail ``i`` from pack ``src`` to pack ``dst``, keeping their costs and token counts."""
    tail_of[src].remove(i)
    tail_of[dst].append(i)
    pc[src] = [a - b for a, b in zip(pc[src], c[i])]
    pc[dst] = [a + b for a, b in zip(pc[dst], c[i])]
    pt[src] -= L[i]
    pt[dst] += L[i]

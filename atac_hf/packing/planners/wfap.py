"""WFAP: workload- and fragmentation-aware packing of one window.

Per window (the pool = samples carried from earlier windows + the new ones); a fragment
costs as its own document:

1. *Heavy* items - those that alone cost more than ``balance_tolerance`` x a pack filled
   to the cap with short documents - cannot be balanced by token counts: a pack holding
   one is the window's straggler unless every pack holds one of similar cost. They wait
   (bounded by ``max_defer``) in a pool sorted by *potential* (cost of a pack anchored by
   the item and filled with short documents), and a run of ``packs_per_window`` of them is
   released together once the packs they would anchor are balanced within the tolerance.
   Items arriving in this window are not eligible before the next one, so the release is
   known before the window's arrivals (:func:`wfap_held` lets feeders size it).
2. An overdue heavy item that no balanced run takes is split (``balance_split``) into the
   fewest near-equal light fragments, placed now; without ``balance_split`` it is released
   with the heaviest companions no costlier than it.
3. Overdue items go first: overdue anchors, then overdue tails (largest cost first, to the
   cheapest pack with room), then the released anchors (one per pack).
4. The other tails - carried ones first, then new ones, largest cost first - go to the
   cheapest pack with token room, but no pack may pass the *fill level*: the costliest
   anchor pack, or a pack filled to the cap with the window's small tails (plus half the
   tolerance). A pack holding an expensive tail thus stops below the cap (variable token
   counts) instead of becoming the straggler. When the pool holds more than the window
   takes, the longest new tails are held back instead of many short ones (fewer samples
   wait), if that leaves fewer samples over. What does not fit is carried.
5. Optional local search: move or swap tails between the most and least expensive packs
   while that lowers the maximum.

Numpy only; deterministic (every tie is broken by data order).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from .window import ARRIVAL, END, FRAG, SEQ, SID, START, Item, WindowContext

__all__ = ["plan_wfap", "wfap_held", "HELD_LIMIT"]

# held heavy items per pack of a window beyond which the pool releases its best run anyway
# (and feeders count further heavy samples as a full pack each)
HELD_LIMIT = 3


def _heavy_mask(costs: np.ndarray, ctx: WindowContext) -> np.ndarray:
    if not ctx.config.defer_heavy:
        return np.zeros(costs.shape, dtype=bool)
    return costs > ctx.config.balance_tolerance * ctx.light_pack_cost


def _block_ratios(cost: np.ndarray, potential: np.ndarray, size: int, ctx: WindowContext) -> np.ndarray:
    """Estimated max/mean pack cost of a window anchored by each run of ``size`` consecutive
    heavy items (sorted by potential, descending); packs without an anchor cost a light pack."""
    P, light = ctx.num_packs, ctx.light_pack_cost
    top = np.maximum(cost[: len(cost) - size + 1], light)
    runs = np.lib.stride_tricks.sliding_window_view(potential, size)
    total = np.minimum(top[:, None], runs).sum(axis=1) + (P - size) * light
    return top / (total / P)


def _select_release(items: list[Item], lens: np.ndarray, costs: np.ndarray, heavy: np.ndarray,
                    ctx: WindowContext) -> tuple[list[int], list[int]]:
    """Heavy items to release as anchors this window, and overdue heavy items to split."""
    P, C, cfg = ctx.num_packs, ctx.max_tokens, ctx.config
    tol = cfg.balance_tolerance
    # potential: cost of a pack anchored by the item and filled with short documents to the cap
    potential_all = costs + ctx.ref_cost_per_token * (C - lens)
    # samples that arrive in this window wait at least until the next one (unless overdue),
    # so the release is known before the window's arrivals and feeders can size the window
    eligible = [i for i in np.flatnonzero(heavy).tolist()
                if ctx.final or items[i][ARRIVAL] < ctx.window or ctx.is_overdue(items[i])]
    h = np.asarray(sorted(eligible,
                          key=lambda i: (-potential_all[i], items[i][SEQ], items[i][START])), dtype=np.int64)
    n = len(h)
    if n == 0:
        return [], []
    cost, potential = costs[h], potential_all[h]
    overdue = np.fromiter((ctx.is_overdue(items[i]) for i in h), dtype=bool, count=n)
    splittable = lens[h] >= 2 * int(cfg.min_fragment)

    if n >= P:
        ratio = _block_ratios(cost, potential, P, ctx)
        due_in = np.convolve(overdue.astype(np.int64), np.ones(P, dtype=np.int64), mode="valid")
        ok = (ratio <= tol) & (due_in == overdue.sum())  # balanced and takes every overdue item
        if ctx.final and not overdue.any() and not ok.any():
            ok = ratio <= ratio.min()  # nothing more will arrive: release the best block
        if ok.any():
            best = int(np.argmin(np.where(ok, ratio, np.inf)))
            return h[best:best + P].tolist(), []
        if n >= HELD_LIMIT * P:
            # the pool holds several windows' worth of heavy items (they are common in this
            # stream): release the best-balanced run anyway, preferring runs that take overdue
            # items, rather than let the pool grow and its items run overdue
            best = int(np.lexsort((ratio, -due_in))[0])
            members = np.zeros(n, dtype=bool)
            members[best:best + P] = True
            rest = overdue & ~members
            if cfg.balance_split:
                return h[members | (rest & ~splittable)].tolist(), h[rest & splittable].tolist()
            return h[members | rest].tolist(), []
    elif overdue.any() or ctx.final:
        # too few heavy items for a full group: release them all if that is balanced
        if _block_ratios(cost, potential, n, ctx)[0] <= tol:
            return h.tolist(), []
        if ctx.final:
            overdue = np.ones(n, dtype=bool)
    if not overdue.any():
        return [], []
    # overdue items that no balanced group takes
    if cfg.balance_split:
        # split them into light fragments (this window then releases no group, so the
        # fragments find room)
        return h[overdue & ~splittable].tolist(), h[overdue & splittable].tolist()
    # release them with the heaviest companions that are no costlier
    level = max(float(cost[overdue].max()), ctx.light_pack_cost)
    companions = np.flatnonzero(~overdue & (cost <= level))[: max(0, P - int(overdue.sum()))]
    return h[overdue].tolist() + h[companions].tolist(), []


def _split_light(item: Item, ctx: WindowContext) -> list[Item]:
    """The fewest near-equal fragments (>= min_fragment) that each cost at most a light pack."""
    sid, s, e, arr, seq, _f = item
    L, m = e - s, int(ctx.config.min_fragment)
    k = 2
    while L // (k + 1) >= m and float(ctx.cost_model.doc_cost([-(-L // k)])[0]) > ctx.light_pack_cost:
        k += 1
    base, extra = divmod(L, k)
    out, pos = [], s
    for f in range(k):
        size = base + (f < extra)
        out.append((sid, pos, pos + size, arr, seq, 1))
        pos += size
    return out


def wfap_held(items: list[Item], ctx: WindowContext) -> tuple[int, int]:
    """``(tokens, items)`` of the pool the next window would hold back (so feeders do not
    count them as supply for that window)."""
    if not items:
        return 0, 0
    lens = np.fromiter((it[END] - it[START] for it in items), dtype=np.int64, count=len(items))
    costs = ctx.cost_model.doc_cost(lens)
    heavy = _heavy_mask(costs, ctx)
    if not heavy.any():
        return 0, 0
    released, split = _select_release(items, lens, costs, heavy, ctx)
    out = set(released) | set(split)
    held = [i for i in np.flatnonzero(heavy) if i not in out]
    return int(lens[held].sum()), len(held)


def plan_wfap(items: list[Item], ctx: WindowContext) -> tuple[list[list[Item]], list[Item], list[tuple[int, int]]]:
    """Pack one window with WFAP. Returns ``(packs, carry, newly_split)``; see the module doc."""
    P, C = ctx.num_packs, ctx.max_tokens
    packs: list[list[Item]] = [[] for _ in range(P)]
    if not items:
        return packs, [], []
    lens = np.fromiter((it[END] - it[START] for it in items), dtype=np.int64, count=len(items))
    costs = ctx.cost_model.doc_cost(lens)
    heavy = _heavy_mask(costs, ctx)
    released, to_split = _select_release(items, lens, costs, heavy, ctx) if heavy.any() else ([], [])
    out = set(released) | set(to_split)
    carry = [items[i] for i in np.flatnonzero(heavy) if i not in out]
    newly_split = []
    n_orig = len(items)
    if to_split:
        items = list(items)
        extra: list[Item] = []
        for i in to_split:
            if items[i][FRAG] == 0:
                newly_split.append((items[i][SID], int(lens[i])))
            extra.extend(_split_light(items[i], ctx))
        items.extend(extra)
        new_lens = np.fromiter((it[END] - it[START] for it in extra), dtype=np.int64, count=len(extra))
        lens = np.concatenate([lens, new_lens])
        costs = np.concatenate([costs, ctx.cost_model.doc_cost(new_lens)])
        heavy = np.concatenate([heavy, np.zeros(len(extra), dtype=bool)])
        heavy[to_split] = True  # the originals are replaced by their fragments
    L = lens.tolist()
    c = costs.tolist()
    # overdue items (and the fragments of overdue samples split just now) go first and
    # ignore the ceiling; at the end of the stream the others may still wait a window
    meta = np.array([(it[ARRIVAL], it[SEQ], it[START]) for it in items], dtype=np.int64).reshape(-1, 3)
    due_arr = ctx.window - meta[:, 0] >= ctx.config.max_defer
    due_arr[n_orig:] = True
    due = due_arr.tolist()

    pc = [0.0] * P
    pt = [0] * P
    anchor_of: list[list[int]] = [[] for _ in range(P)]  # never moved by local search
    tail_of: list[list[int]] = [[] for _ in range(P)]

    def place_anchors(group: list[int]) -> None:  # largest cost first, to the cheapest pack with room
        for i in sorted(group, key=lambda i: (-c[i], items[i][SEQ], items[i][START])):
            best = -1
            for j in range(P):
                if pt[j] + L[i] <= C and (best < 0 or pc[j] < pc[best]):
                    best = j
            if best < 0:
                carry.append(items[i])
                continue
            anchor_of[best].append(i)
            pc[best] += c[i]
            pt[best] += L[i]

    # tails: overdue first, then those carried before, then the new ones; within each,
    # largest cost first (ties in data order)
    light = np.flatnonzero(~heavy)
    order = np.lexsort((meta[light, 2], meta[light, 1], -costs[light], meta[light, 0] == ctx.window, ~due_arr[light]))
    tails = light[order].tolist()
    num_due_tails = int(due_arr[light].sum())
    # 3. overdue anchors and tails, then the other anchors
    place_anchors([i for i in released if due[i]])
    left = _place_tails(tails[:num_due_tails], L, c, due, pc, pt, tail_of, C, math.inf)
    carry.extend(items[i] for i in left)
    place_anchors([i for i in released if not due[i]])
    # 4. the other tails: those carried before first, then the new ones; within each,
    # largest cost first, to the cheapest pack with room, up to the ceiling
    ceiling = max(max(pc) if released else 0.0, _fill_level(tails, L, c, ctx),
                  max((c[i] for i in tails[num_due_tails:]), default=0.0))
    rest = tails[num_due_tails:]
    before = (pc[:], pt[:], [t[:] for t in tail_of])
    left = _place_tails(rest, L, c, due, pc, pt, tail_of, C, ceiling)
    over = sum(L[i] for i in left if items[i][ARRIVAL] == ctx.window)
    if over and len(left) > 1:
        # many short samples left over: hold back the longest new tails instead (about as
        # many tokens), so fewer samples wait a window
        first = (pc[:], pt[:], [t[:] for t in tail_of], left)
        held, freed = set(), 0.0
        rate = ceiling / C  # a held tail frees its cost's worth of tokens at the fill level
        for i in rest:  # new tails come last, longest first
            if items[i][ARRIVAL] == ctx.window and freed + c[i] / rate <= over:
                held.add(i)
                freed += c[i] / rate
        pc[:], pt[:] = before[0][:], before[1][:]
        tail_of[:] = [t[:] for t in before[2]]
        left2 = _place_tails([i for i in rest if i not in held], L, c, due, pc, pt, tail_of, C, ceiling) + sorted(held)
        if len(left2) < len(left):
            left = left2
        else:
            pc[:], pt[:], tail_of[:], left = first
    carry.extend(items[i] for i in left)

    if ctx.config.local_search and P > 1:
        _local_search(pc, pt, tail_of, anchor_of, L, c, C)
    for j in range(P):
        packs[j] = [items[i] for i in anchor_of[j] + tail_of[j]]
    carry.sort(key=lambda it: (it[ARRIVAL], it[SEQ], it[START]))
    return packs, carry, newly_split


def _fill_level(tails: list[int], L: list[int], c: list[float], ctx: WindowContext) -> float:
    """Cost of a pack filled to the cap with the window's small tails (each at most 1/8 of a
    light pack), plus half the balance tolerance: the level packs may reach, so that a pack
    holding an expensive tail stops below the cap instead of becoming the straggler."""
    small_cost = ctx.light_pack_cost / 8
    tok = cst = 0
    for i in tails:
        if c[i] <= small_cost:
            tok += L[i]
            cst += c[i]
    if not tok:
        tok = sum(L[i] for i in tails)
        cst = sum(c[i] for i in tails)
    rho = cst / tok if tok else 0.0
    return rho * ctx.max_tokens * (1.0 + (ctx.config.balance_tolerance - 1.0) / 2)


def _place_tails(tails: list[int], L: list[int], c: list[float], due: list[bool], pc: list[float], pt: list[int],
                 tail_of: list[list[int]], C: int, ceiling: float) -> list[int]:
    """Greedy: each tail (in the given order) to the cheapest pack with room, unless that
    pack would pass ``ceiling`` (overdue tails ignore the ceiling). Returns the tails left.

    Packs without room for the current tail are parked by room and come back once the
    tails get short enough (the order is by decreasing cost, hence length, within each
    phase; a longer tail starts a new phase), so each tail costs O(log P)."""
    P = len(pc)
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
    heap: list[tuple[float, int]] = []
    parked: list[tuple[int, int]] = []  # (-room, pack)
    left: list[int] = []
    prev = -1
    for i in tails:
        li = L[i]
        if li > prev:  # new phase: rebuild heap and parking
            heap = [(pc[j], j) for j in range(P) if C - pt[j] >= li]
            parked = [(pt[j] - C, j) for j in range(P) if C - pt[j] < li]
            heapq.heapify(heap)
            heapq.heapify(parked)
        prev = li
        while parked and -parked[0][0] >= li:
            j = pop(parked)[1]
            push(heap, (pc[j], j))
        ci = c[i]
        if not heap or (heap[0][0] + ci > ceiling and not due[i]):
            left.append(i)
            continue
        j = heap[0][1]
        tail_of[j].append(i)
        pc[j] += ci
        room = C - pt[j] - li
        pt[j] += li
        if room >= li:
            replace(heap, (pc[j], j))
        else:
            pop(heap)
            push(parked, (-room, j))
    return left


def _local_search(pc: list[float], pt: list[int], tail_of: list[list[int]], anchor_of: list[list[int]],
                  L: list[int], c: list[float], C: int, max_steps: int | None = None) -> None:
    """Move or swap one tail between the most and least expensive pack while that lowers
    the pair's maximum (hence, step by step, the window's). In place."""
    P = len(pc)
    steps = max_steps if max_steps is not None else 2 * P
    for _ in range(steps):
        p = max(range(P), key=lambda j: (pc[j], -j))
        q = min(range(P), key=lambda j: (pc[j], j))
        gap = pc[p] - pc[q]
        if gap <= 1e-12 * max(pc[p], 1e-30) or not tail_of[p]:
            return
        tp = np.asarray(tail_of[p])
        lp = np.asarray([L[i] for i in tail_of[p]])
        cp = np.asarray([c[i] for i in tail_of[p]])
        best_val = pc[p]
        best = None
        # move a tail p -> q
        ok = (pt[q] + lp <= C) & (cp < gap)
        if len(tail_of[p]) + len(anchor_of[p]) < 2:
            ok[:] = False  # never empty a pack
        if ok.any():
            val = np.where(ok, np.maximum(pc[p] - cp, pc[q] + cp), np.inf)
            k = int(np.argmin(val))
            if val[k] < best_val:
                best_val, best = float(val[k]), ("move", int(tp[k]), -1)
        # swap a tail of p with a cheaper tail of q
        if tail_of[q]:
            tq = np.asarray(tail_of[q])
            lq = np.asarray([L[i] for i in tail_of[q]])
            cq = np.asarray([c[i] for i in tail_of[q]])
            d = cp[:, None] - cq[None, :]
            dl = lp[:, None] - lq[None, :]
            ok2 = (d > 0) & (d < gap) & (pt[q] + dl <= C) & (pt[p] - dl <= C)
            if ok2.any():
                val = np.where(ok2, np.maximum(pc[p] - d, pc[q] + d), np.inf)
                a, b = np.unravel_index(int(np.argmin(val)), val.shape)
                if val[a, b] < best_val:
                    best_val, best = float(val[a, b]), ("swap", int(tp[a]), int(tq[b]))
        if best is None:
            return
        kind, i, u = best
        tail_of[p].remove(i)
        tail_of[q].append(i)
        pc[p] -= c[i]
        pc[q] += c[i]
        pt[p] -= L[i]
        pt[q] += L[i]
        if kind == "swap":
            tail_of[q].remove(u)
            tail_of[p].append(u)
            pc[q] -= c[u]
            pc[p] += c[u]
            pt[q] -= L[u]
            pt[p] += L[u]

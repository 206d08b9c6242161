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
6. At the end of the stream (``ctx.final``) the steps above give way to
   :func:`~atac_hf.packing.planners.wfap_end.plan_end`: the remaining windows are planned
   together, so that the last ones are balanced too.

With ``price_band`` (``(low, high)``), every cost above is a pair: the sample's cost under
the cost model with the attention pair price scaled by ``low`` and by ``high``, each over
that model's light pack cost. A sample is heavy when it is heavy at either end; heavy items
are ordered by length (a run of similar lengths has similar costs at every price: a
length-bucketed release) and a run is balanced when it is at both ends; a pack's *score*
(what "cheapest", the fill level and the local search compare) is the larger of its two
costs: a pack's cost over a light pack is monotone in the price, so keeping the larger end
low bounds every price inside the band (at the price of a little balance at the planning
price itself). With ``band_placement=False`` only step 1 uses the pair; steps 3-5 cost by
the cost model alone. Without a band, the pair is the one cost.

Numpy only; deterministic (every tie is broken by data order).
"""

from __future__ import annotations

import math

import numpy as np

from .window import ARRIVAL, END, FRAG, SEQ, SID, START, Item, WindowContext
from .wfap_end import plan_end
from .wfap_place import fill_level, local_search, place_tails

__all__ = ["plan_wfap", "wfap_held", "heavy_lengths", "HELD_LIMIT"]

# held heavy items per pack of a window beyond which the pool releases its best run anyway
# (and feeders count further heavy samples as a full pack each)
HELD_LIMIT = 3
# step 6 (the end of the stream planned over its remaining windows); False: the final windows
# are planned like the others with nothing held back (a measurement switch)
END_PLAN = True


def _heavy_mask(costs: np.ndarray, ctx: WindowContext) -> np.ndarray:
    """(n,) heavy at any of the balance models (``costs``: (n, K))."""
    if not ctx.config.defer_heavy:
        return np.zeros(costs.shape[0], dtype=bool)
    return (costs > ctx.config.balance_tolerance * ctx.balance.light[None, :]).any(axis=1)


def heavy_lengths(lengths: np.ndarray, ctx: WindowContext) -> np.ndarray:
    """Whether a span of each length is heavy (held back as an anchor) in this context."""
    return _heavy_mask(ctx.balance.costs(np.asarray(lengths, dtype=np.int64)), ctx)


def _block_ratios(cost: np.ndarray, potential: np.ndarray, size: int, ctx: WindowContext) -> np.ndarray:
    """Estimated max/mean pack cost of a window anchored by each run of ``size`` consecutive
    heavy items (in release order), the worse over the balance models (``cost``,
    ``potential``: (n, K)); packs without an anchor cost a light pack."""
    P, light = ctx.num_packs, ctx.balance.light
    top = np.maximum(cost[: len(cost) - size + 1], light[None, :])
    runs = np.lib.stride_tricks.sliding_window_view(potential, size, axis=0)  # (runs, K, size)
    total = np.minimum(top[:, :, None], runs).sum(axis=2) + (P - size) * light[None, :]
    return (top / (total / P)).max(axis=1)


def _select_release(items: list[Item], lens: np.ndarray, costs: np.ndarray, heavy: np.ndarray,
                    ctx: WindowContext) -> tuple[list[int], list[int]]:
    """Heavy items to release as anchors this window, and overdue heavy items to split."""
    P, C, cfg = ctx.num_packs, ctx.max_tokens, ctx.config
    tol = cfg.balance_tolerance
    # potential: cost of a pack anchored by the item and filled with short documents to the cap
    potential_all = costs + ctx.balance.ref[None, :] * (C - lens)[:, None]
    # samples that arrive in this window wait at least until the next one (unless overdue),
    # so the release is known before the window's arrivals and feeders can size the window
    eligible = [i for i in np.flatnonzero(heavy).tolist()
                if ctx.final or items[i][ARRIVAL] < ctx.window or ctx.is_overdue(items[i])]
    if costs.shape[1] == 1:  # by potential, largest first
        key = lambda i: (-potential_all[i, 0], items[i][SEQ], items[i][START])  # noqa: E731
    else:  # by length, longest first: a run of similar lengths is similar at every price
        key = lambda i: (-lens[i], items[i][SEQ], items[i][START])  # noqa: E731
    h = np.asarray(sorted(eligible, key=key), dtype=np.int64)
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
    score = cost.max(axis=1)
    level = max(float(score[overdue].max()), float(ctx.balance.light.max()))
    companions = np.flatnonzero(~overdue & (score <= level))[: max(0, P - int(overdue.sum()))]
    return h[overdue].tolist() + h[companions].tolist(), []


def _split_light(item: Item, ctx: WindowContext) -> list[Item]:
    """The fewest near-equal fragments (>= min_fragment) that each cost at most a light pack."""
    sid, s, e, arr, seq, _f = item
    L, m = e - s, int(ctx.config.min_fragment)
    k = 2
    light = ctx.balance.light
    while L // (k + 1) >= m and (ctx.balance.costs(np.array([-(-L // k)]))[0] > light).any():
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
    costs = ctx.balance.costs(lens)
    heavy = _heavy_mask(costs, ctx)
    if not heavy.any():
        return 0, 0
    released, split = _select_release(items, lens, costs, heavy, ctx)
    out = set(released) | set(split)
    held = [i for i in np.flatnonzero(heavy) if i not in out]
    return int(lens[held].sum()), len(held)


def plan_wfap(items: list[Item], ctx: WindowContext) -> tuple[list[list[Item]], list[Item], list[tuple[int, int]]]:
    """Pack one window with WFAP. Returns ``(packs, carry, newly_split)``; see the module doc."""
    P = ctx.num_packs
    packs: list[list[Item]] = [[] for _ in range(P)]
    if not items:
        return packs, [], []
    lens = np.fromiter((it[END] - it[START] for it in items), dtype=np.int64, count=len(items))
    costs = ctx.balance.costs(lens)  # (n, K)
    if ctx.final and END_PLAN:
        ecosts = (ctx.cost_model.doc_cost(lens)[:, None]
                  if ctx.config.price_band is not None and not ctx.config.band_placement else costs)
        packs, carry = plan_end(items, lens, ecosts, ctx)
        packs += [[] for _ in range(P - len(packs))]
        return packs, carry, []
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
        costs = np.concatenate([costs, ctx.balance.costs(new_lens)])
        heavy = np.concatenate([heavy, np.zeros(len(extra), dtype=bool)])
        heavy[to_split] = True  # the originals are replaced by their fragments
    if ctx.config.price_band is not None and not ctx.config.band_placement:
        # the band chose the anchors; tails balance the cost model alone
        ctx_costs = ctx.cost_model.doc_cost(lens)[:, None]
    else:
        ctx_costs = costs
    meta = np.array([(it[ARRIVAL], it[SEQ], it[START]) for it in items], dtype=np.int64).reshape(-1, 3)
    # overdue items (and the fragments of overdue samples split just now) go first and
    # ignore the ceiling; at the end of the stream the others may still wait a window
    due_arr = ctx.window - meta[:, 0] >= ctx.config.max_defer
    due_arr[n_orig:] = True
    light_level = ctx.balance.light if ctx_costs.shape[1] == costs.shape[1] else np.array([ctx.light_pack_cost])
    plan = _place(items, lens, ctx_costs, light_level, heavy, released, due_arr, meta, ctx)
    anchor_of, tail_of, left = plan
    carry.extend(items[i] for i in left)
    for j in range(P):
        packs[j] = [items[i] for i in anchor_of[j] + tail_of[j]]
    carry.sort(key=lambda it: (it[ARRIVAL], it[SEQ], it[START]))
    return packs, carry, newly_split


def _place(items: list[Item], lens: np.ndarray, costs: np.ndarray, light_level: np.ndarray, heavy: np.ndarray,
           released: list[int], due_arr: np.ndarray, meta: np.ndarray,
           ctx: WindowContext) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Steps 3-5 with item costs ``costs`` ((n, K)): ``(anchor_of, tail_of, left)``, the
    item indices of each pack's anchors and tails and of the items left over."""
    P, C = ctx.num_packs, ctx.max_tokens
    K = costs.shape[1]
    L = lens.tolist()
    c = costs.tolist()  # per item, its K costs
    score = costs.max(axis=1)
    s = score.tolist()
    due = due_arr.tolist()
    pc = [[0.0] * K for _ in range(P)]  # per pack, its K costs
    pt = [0] * P
    anchor_of: list[list[int]] = [[] for _ in range(P)]  # never moved by local search
    tail_of: list[list[int]] = [[] for _ in range(P)]
    carry: list[int] = []

    def place_anchors(group: list[int]) -> None:  # largest score first, to the cheapest pack with room
        for i in sorted(group, key=lambda i: (-s[i], items[i][SEQ], items[i][START])):
            best, best_score = -1, 0.0
            for j in range(P):
                sj = max(pc[j])
                if pt[j] + L[i] <= C and (best < 0 or sj < best_score):
                    best, best_score = j, sj
            if best < 0:
                carry.append(i)
                continue
            anchor_of[best].append(i)
            pc[best] = [a + b for a, b in zip(pc[best], c[i])]
            pt[best] += L[i]

    # tails: overdue first, then those carried before, then the new ones; within each,
    # largest score first (ties in data order)
    light = np.flatnonzero(~heavy)
    order = np.lexsort((meta[light, 2], meta[light, 1], -score[light], meta[light, 0] == ctx.window,
                        ~due_arr[light]))
    tails = light[order].tolist()
    num_due_tails = int(due_arr[light].sum())
    # 3. overdue anchors and tails, then the other anchors
    place_anchors([i for i in released if due[i]])
    carry.extend(place_tails(tails[:num_due_tails], L, c, due, pc, pt, tail_of, C, math.inf))
    place_anchors([i for i in released if not due[i]])
    # 4. the other tails: those carried before first, then the new ones; within each,
    # largest score first, to the cheapest pack with room, up to the ceiling
    ceiling = max(max(max(v) for v in pc) if released else 0.0,
                  fill_level(tails, lens, costs, light_level, C, ctx.config.balance_tolerance),
                  max((s[i] for i in tails[num_due_tails:]), default=0.0))
    rest = tails[num_due_tails:]
    before = ([v[:] for v in pc], pt[:], [t[:] for t in tail_of])
    left = place_tails(rest, L, c, due, pc, pt, tail_of, C, ceiling)
    over = sum(L[i] for i in left if items[i][ARRIVAL] == ctx.window)
    if over and len(left) > 1:
        # many short samples left over: hold back the longest new tails instead (about as
        # many tokens), so fewer samples wait a window
        first = (pc[:], pt[:], [t[:] for t in tail_of], left)
        held, freed = set(), 0.0
        rate = ceiling / C  # a held tail frees its cost's worth of tokens at the fill level
        for i in rest:  # new tails come last, longest first
            if items[i][ARRIVAL] == ctx.window and freed + s[i] / rate <= over:
                held.add(i)
                freed += s[i] / rate
        pc[:], pt[:] = [v[:] for v in before[0]], before[1][:]
        tail_of[:] = [t[:] for t in before[2]]
        left2 = place_tails([i for i in rest if i not in held], L, c, due, pc, pt, tail_of, C, ceiling) + sorted(held)
        if len(left2) < len(left):
            left = left2
        else:
            pc[:], pt[:], tail_of[:], left = first
    carry.extend(left)
    if ctx.config.local_search and P > 1:
        local_search(pc, pt, tail_of, anchor_of, L, c, C)
    return anchor_of, tail_of, carry

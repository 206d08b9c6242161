"""Baseline packers behind the same per-window interface as WFAP.

* ``sequential``: next-fit in data order (what naive pipelines do): fill the current pack
  until the next sample does not fit, then open the next one.
* ``bfd``: best-fit decreasing on tokens (TRL's ``pack_dataset`` default): longest first,
  each into the pack with the least room that still fits it; the window emits the fullest
  ``packs_per_window`` packs (overdue ones first) and carries the rest.
* ``wlb``: WLB-LLM (OSDI'25) variable-length packing with outlier delay: documents of
  length >= ``L_1`` wait in per-threshold FIFO queues; a queue holding ``packs_per_window``
  documents releases that many, one to each pack. The rest is sorted longest first; each
  goes to the pack with the least estimated workload (cost model) if it fits under the
  cap, else to the pack with the fewest tokens if it fits, else it is carried.

Every strategy places overdue items (waited ``max_defer`` windows) before the others so the
delay stays bounded; apart from that they follow the published rules. For ``wlb`` the bound
also needs the feeders to take at most ``WLB_COHORT_SHARE`` of a window in outliers where
``max_defer`` is under ``WLB_COHORT_MAX_DEFER``
(:meth:`~atac_hf.packing.stream.StreamPacker.window_size`), and overdue documents are placed
best-fit decreasing where the least-workload order strands more of them. Numpy only.
"""

from __future__ import annotations

import bisect
import heapq

from .window import ARRIVAL, END, SEQ, START, Item, WindowContext, costs_of

__all__ = ["plan_sequential", "plan_bfd", "plan_wlb", "wlb_held", "WLB_COHORT_MAX_DEFER", "WLB_COHORT_SHARE"]

# ``wlb`` outlier tokens a window takes from the stream, as a share of its capacity (feeders,
# StreamPacker.window_size; an outlier over half a pack counts a whole pack): they mostly fall
# due together ``max_defer`` windows later, and the rest of that window holds what else is due
# then; 1.0 missed the bound in 10-30% of random small streams, 0.75 and 0.5 in none of 15,000
WLB_COHORT_SHARE = 0.75
# ... applied where ``max_defer`` is under this: with more windows to wait the queues release
# their outliers in time (no miss in 3,000 random streams at max_defer 8 with no share at all,
# 1-30% at 3-6 with shares over 1), and the share costs packs (1,082 for 799 on uniform lengths
# 1-100 at cap 100 and max_defer 4, where 76% of samples are outliers)
WLB_COHORT_MAX_DEFER = 8


def _data_order(it: Item) -> tuple:
    return (it[ARRIVAL], it[SEQ], it[START])


def plan_sequential(items: list[Item], ctx: WindowContext) -> tuple[list[list[Item]], list[Item], list]:
    """Next-fit in data order (oldest first)."""
    P, C = ctx.num_packs, ctx.max_tokens
    packs: list[list[Item]] = [[] for _ in range(P)]
    j, used = 0, 0
    carry: list[Item] = []
    for it in sorted(items, key=_data_order):
        n = it[END] - it[START]
        if j < P and used + n > C:
            j, used = j + 1, 0
        if j >= P:
            carry.append(it)
            continue
        packs[j].append(it)
        used += n
    return packs, carry, []


def plan_bfd(items: list[Item], ctx: WindowContext) -> tuple[list[list[Item]], list[Item], list]:
    """Best-fit decreasing on tokens over the whole pool, as many packs as it takes (TRL's
    ``pack_dataset`` bfd on the pool); the window emits ``packs_per_window`` of them: those
    holding overdue items first, then the fullest, and carries the items of the others.

    Emitting the fullest packs (rather than the first ones opened, which hold the longest
    items and the holes next to them) keeps the packs as full as TRL's: the items of a
    poorly filled pack wait a window for new arrivals to fill the holes around them."""
    P, C = ctx.num_packs, ctx.max_tokens
    packs: list[list[Item]] = []
    used: list[int] = []
    due: list[bool] = []
    rooms: list[tuple[int, int]] = []  # sorted (room, pack) of open packs
    order = sorted(items, key=lambda it: (not ctx.is_due(it), -(it[END] - it[START]), it[SEQ], it[START]))
    for it in order:
        n = it[END] - it[START]
        k = bisect.bisect_left(rooms, (n, -1))
        if k < len(rooms):
            room, j = rooms.pop(k)
        else:
            room, j = C, len(packs)
            packs.append([])
            used.append(0)
            due.append(False)
        packs[j].append(it)
        used[j] += n
        due[j] = due[j] or ctx.is_due(it)
        if room - n > 0:
            bisect.insort(rooms, (room - n, j))
    keep = sorted(sorted(range(len(packs)), key=lambda j: (not due[j], -used[j], j))[:P])
    carry = [it for j in range(len(packs)) if j not in set(keep) for it in packs[j]]
    packs = [packs[j] for j in keep]
    packs.extend([] for _ in range(P - len(packs)))
    carry.sort(key=_data_order)
    return packs, carry, []


def _wlb_queues(items: list[Item], ctx: WindowContext) -> tuple[list[int], list[list[int]]]:
    """Split the pool into (free item indices, FIFO queue per threshold)."""
    th = ctx.config.resolved_wlb_thresholds
    queues: list[list[int]] = [[] for _ in th]
    free: list[int] = []
    for i in sorted(range(len(items)), key=lambda i: _data_order(items[i])):
        n = items[i][END] - items[i][START]
        k = bisect.bisect_right(th, n) - 1
        if k < 0:
            free.append(i)
        else:
            queues[k].append(i)
    return free, queues


def _wlb_release(items: list[Item], queues: list[list[int]], ctx: WindowContext) -> tuple[list[list[int]], list[int]]:
    """Per queue, the documents released to the packs this window (a full queue releases
    ``packs_per_window``, oldest first) that are not overdue; plus every overdue queued
    document (placed first, with the other overdue documents, so a released one that no
    longer fits beside them cannot miss its deadline)."""
    P = ctx.num_packs
    released: list[list[int]] = []
    overdue: list[int] = []
    for q in queues:
        out = q[:P] if len(q) >= P else []
        released.append([i for i in out if not ctx.is_due(items[i])])
        overdue.extend(i for i in q if ctx.is_due(items[i]))
    return released, overdue


def wlb_held(items: list[Item], ctx: WindowContext) -> tuple[int, int]:
    """``(tokens, items)`` of queued documents the next window would keep waiting."""
    _free, queues = _wlb_queues(items, ctx)
    released, overdue = _wlb_release(items, queues, ctx)
    out = set(overdue).union(*map(set, released))
    held = [i for q in queues for i in q if i not in out]
    return sum(items[i][END] - items[i][START] for i in held), len(held)


def plan_wlb(items: list[Item], ctx: WindowContext) -> tuple[list[list[Item]], list[Item], list]:
    """WLB-LLM packing with outlier-delay queues (see the module doc). Overdue documents
    (queued or not) go first, then the released queue documents one per pack, then the
    rest, longest first. Where the overdue documents placed for balance leave one out,
    they are placed best-fit decreasing (tokens) instead if that leaves fewer out."""
    P, C = ctx.num_packs, ctx.max_tokens
    packs: list[list[Item]] = [[] for _ in range(P)]
    if not items:
        return packs, [], []
    cost = costs_of(items, ctx.cost_model).tolist()
    size = [it[END] - it[START] for it in items]
    free, queues = _wlb_queues(items, ctx)
    released, overdue = _wlb_release(items, queues, ctx)
    work = [0.0] * P
    tok = [0] * P
    placed: set[int] = set()
    # lazy min-heaps over (workload, pack) and (tokens, pack); both only grow
    by_work = [(0.0, j) for j in range(P)]
    by_tok = [(0, j) for j in range(P)]

    def top(heap: list, current: list) -> int:
        while heap[0][0] != current[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]

    def put(i: int, j: int) -> None:
        packs[j].append(items[i])
        work[j] += cost[i]
        tok[j] += size[i]
        heapq.heappush(by_work, (work[j], j))
        heapq.heappush(by_tok, (tok[j], j))
        placed.add(i)

    def greedy(order: list[int]) -> None:
        # longest first: least estimated workload if it fits, else fewest tokens if it fits
        for i in sorted(order, key=lambda i: (-size[i], items[i][SEQ], items[i][START])):
            j = top(by_work, work)
            if tok[j] + size[i] > C:
                j = top(by_tok, tok)
                if tok[j] + size[i] > C:
                    continue
            put(i, j)

    def restart() -> None:
        for j in range(P):
            packs[j].clear()
            work[j], tok[j] = 0.0, 0
        by_work[:], by_tok[:] = [(0.0, j) for j in range(P)], [(0, j) for j in range(P)]
        placed.clear()

    def best_fit(order: list[int]) -> None:  # best-fit decreasing on tokens
        for i in sorted(order, key=lambda i: (-size[i], items[i][SEQ], items[i][START])):
            fits = [j for j in range(P) if tok[j] + size[i] <= C]
            if fits:
                put(i, max(fits, key=lambda j: (tok[j], -j)))

    due = overdue + [i for i in free if ctx.is_due(items[i])]
    greedy(due)
    if len(placed) < len(due):  # the balance-first order strands a due document: does best fit place more?
        stranded = len(due) - len(placed)
        restart()
        best_fit(due)
        if len(due) - len(placed) >= stranded:
            restart()
            greedy(due)
    for group in released:  # one per pack, heaviest of the group to the least loaded pack
        for i in sorted(group, key=lambda i: (-cost[i], items[i][SEQ])):
            if i in placed:
                continue
            cands = [j for j in range(P) if tok[j] + size[i] <= C]
            if cands:  # else it stays queued
                put(i, min(cands, key=lambda j: (work[j], j)))
    greedy([i for i in free if i not in placed])
    carry = [it for i, it in enumerate(items) if i not in placed]
    carry.sort(key=_data_order)
    return packs, carry, []

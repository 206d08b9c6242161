"""WFAP at the end of the stream: the remaining windows planned together.

When the stream ends (``ctx.final``: the feeder's last window, ``add_window(last=True)``,
or a flush window), nothing more will arrive: the pool - the last arrivals, the heavy
samples held back, what did not fit - is all there is. Planning it one window at a time
(release what is held, fill the rest) leaves a last window of whatever is left over: a
few heavy samples with too little light work to balance them, or a handful of short
samples (max/mean 2-4 on the simulator's streams). Instead, each final window:

1. ``Q``: the fewest packs that hold the pool: ``ceil(tokens / cap)`` rounded up to a
   multiple of ``ctx.pack_multiple`` (the feeders' DP replicas), more while items do not fit
   (:class:`_Counts`: by the packs the items left over fill, at most up to two windows
   beyond the ``ceil(tokens / (P x cap))`` whole windows). The ``Q`` packs form ``m =
   ceil(Q / P)`` windows: ``P`` packs each, the last one ``Q - (m - 1) x P`` (the *short last
   window*: a pool far under one window's capacity is not spread over ``P`` packs of one
   sample each; only the last window: the others stay one optimizer step each).
   An item may wait ``slack`` more windows (``arrival + max_defer - window``, 0 when
   overdue); one whose slack ends before the last of the ``m`` windows goes only into packs
   of the windows it may wait for.
2. Two plans of ``Q`` packs, the better one kept (the lower sum over windows of the
   costliest pack, the worse balance model: the steps' time):

   * *deal*: every item, largest score first, to the pack of lowest score with token room
     (among all packs, or those its slack allows), local search over all packs; the packs
     are then dealt into windows by score rank (the costliest ``P`` together: heavy packs
     share a window when the light work cannot match them) or round-robin by rank (each
     window a slice of every level), the better of the two (same measure), no pack after
     its deadline;
   * *windows*: the largest items anchor the packs, ``P`` per window in rank order, then
     every other item, largest first, goes where it raises its window's max/mean the least.
   Where the short last window's plan has a worst window max/mean pack cost above
   ``balance_tolerance`` x that of the same plans over whole windows (``m x P`` packs, as
   without :data:`SHORT_LAST_WINDOW`), the whole windows are kept: fuller packs must not
   cost WFAP its balance.
3. The plan's first window is emitted (after local search within it); everything else is
   carried, and the next (flush) window plans what is left the same way: the plan is a
   function of the pool alone (and the packer's fixed ``pack_multiple``), so the packer's
   resumable state is unchanged.

No sample is cut here (overdue samples that find no room are left to the generic
:func:`~atac_hf.packing.planners.window.place_overdue`). :func:`rest_fits_window` is the
feeders' one-window lookahead. Numpy only; deterministic (ties by data order, pack index).
"""

from __future__ import annotations

import math

import numpy as np

from ..config import PackingConfig
from .window import ARRIVAL, SEQ, START, Item, WindowContext
from .wfap_place import local_search, place_tails

__all__ = ["plan_end", "rest_fits_window", "LOOKAHEAD_MIN_DEFER"]

VALUE = "time"
MAX_EXTRA_WINDOWS = 2  # windows beyond the token minimum tried before items are carried
# the end plan's last window holds the packs its tokens need, not packs_per_window (False: every
# window of the end plan has packs_per_window packs, as before; a measurement switch)
SHORT_LAST_WINDOW = True
MAX_COUNT_TRIES = 8  # pack counts tried before the largest one (whole windows + MAX_EXTRA_WINDOWS)
MODE = "best"  # which plans step 2 makes: "deal", "windows" or "best" (both; a measurement switch)

WINDOWS_WORK_LIMIT = 4_000_000  # items x packs above which "best" makes the deal plan only (O(n log Q))
LOOKAHEAD = True  # False: rest_fits_window always says no (a measurement switch)
LOOKAHEAD_MIN_DEFER = 2  # rest_fits_window: the merged window's arrivals may need windows 0-2
_REST_BLOCK = 4096  # rest_fits_window: samples summed at a time


def rest_fits_window(config: PackingConfig, lengths: np.ndarray) -> bool:
    """One-window lookahead at the end of a stream of known length: whether the samples that
    would follow the window being fed (``lengths``: all of them, checked ints) hold fewer
    tokens than one window (``packs_per_window * max_tokens``, after ``overlength``
    handling) and at most ``packs_per_window`` samples over half the cap (a pack each).
    Feeders then feed them with that window and pass ``last=True``, so the end is planned
    with more samples (no tiny last window of arrivals). ``wfap`` only, which plans
    the end over several windows together (the others plan one window at a time: a double
    window would only carry its overflow into flush windows where all of it is overdue),
    and with ``max_defer >= 2`` (the merged arrivals plus the carry take about three
    windows, which their deadlines must reach). False for an empty rest."""
    if not LOOKAHEAD or lengths.size == 0 or config.strategy != "wfap" or config.max_defer < LOOKAHEAD_MIN_DEFER:
        return False
    # summed a block at a time up to the window's tokens: a feeder asks once per window, so a
    # whole-rest sum would make a pass quadratic in its samples. Samples over half the cap need
    # a pack each: more of them than one window's packs do not fit it, whatever their tokens
    # (red-team 32: 14 samples of 9 tokens at cap 16 joined a window of 8 packs, and the merged
    # arrivals needed more windows than max_defer=2 gives)
    C, P = int(config.max_tokens), int(config.packs_per_window)
    cap, total, big = (C if config.overlength == "truncate" else None), 0, 0
    for i in range(0, lengths.size, _REST_BLOCK):
        block = lengths[i:i + _REST_BLOCK]
        total += int((block if cap is None else np.minimum(block, cap)).sum())
        big += int(np.count_nonzero(2 * block > C))
        if total >= config.window_tokens or big > P:
            return False
    return True


_Plan = tuple[list[list[int]], list[list[int]]]  # (items of each pack, packs of each window)


class _Counts:
    """The pack counts an end plan tries, fewest first.

    ``mult=None``: whole windows, ``m0 x P`` packs with ``m0 = ceil(tokens / (P x cap))``,
    then one window more at a time (the end plan without :data:`SHORT_LAST_WINDOW`). An int:
    ``ceil(tokens / cap)`` rounded up to a multiple of ``mult`` (at most ``m0 x P``), then, while
    items are left over, more by the packs the items left fill on their own (first fit
    decreasing), again a multiple of ``mult``, for at most :data:`MAX_COUNT_TRIES` counts.
    Either way the last count tried is ``(m0 + MAX_EXTRA_WINDOWS) x P`` (so nothing fits
    worse than with whole windows)."""

    def __init__(self, lens: np.ndarray, P: int, C: int, mult: int | None) -> None:
        tokens = int(lens.sum())
        m0 = max(1, math.ceil(tokens / (P * C)))
        self.P, self.C, self.mult = P, C, mult
        self.top = (m0 + MAX_EXTRA_WINDOWS) * P
        self.first = m0 * P if mult is None else min(m0 * P, _round_up(max(1, math.ceil(tokens / C)), mult))
        self.tries = 0

    def next(self, Q: int, left: list[int]) -> int | None:
        """The count after ``Q`` (where items of the lengths ``left`` found no room), or None
        when ``Q`` was the last."""
        self.tries += 1
        if Q >= self.top:
            return None
        if self.mult is None:
            return Q + self.P
        nxt = _round_up(Q + max(1, _bins(left, self.C)), self.mult)
        return self.top if nxt >= self.top or self.tries >= MAX_COUNT_TRIES else nxt


def _bins(sizes: list[int], C: int) -> int:
    """Packs of ``C`` tokens that first fit decreasing makes of ``sizes``."""
    room: list[int] = []
    for x in sorted(sizes, reverse=True):
        j = next((j for j, r in enumerate(room) if r >= x), -1)
        if j < 0:
            room.append(C - x)
        else:
            room[j] -= x
    return len(room)


def _round_up(x: int, k: int) -> int:
    return -(-x // k) * k


def _sizes(Q: int, P: int) -> list[int]:
    """Packs of each window of a ``Q``-pack plan: ``P`` each, the last one what is left."""
    m = -(-Q // P)
    return [P] * (m - 1) + [Q - (m - 1) * P]


def plan_end(items: list[Item], lens: np.ndarray, costs: np.ndarray,
             ctx: WindowContext) -> tuple[list[list[Item]], list[Item]]:
    """Plan the stream's remaining windows together; ``(packs of this window, carry)``.

    ``lens``: (n,) span lengths; ``costs``: (n, K) costs under the balance models."""
    P, C = ctx.num_packs, ctx.max_tokens
    n = len(items)
    arrival = np.fromiter((it[ARRIVAL] for it in items), dtype=np.int64, count=n)
    slack = np.maximum(arrival + ctx.config.max_defer - ctx.window, 0)  # latest window (0 = this one)
    score = costs.max(axis=1)
    seq = np.fromiter((it[SEQ] for it in items), dtype=np.int64, count=n)
    start = np.fromiter((it[START] for it in items), dtype=np.int64, count=n)
    order = np.lexsort((start, seq, -score))  # largest score first, ties in data order

    def best(mult: int | None) -> _Plan:
        plans = []
        if MODE in ("deal", "best"):
            plans.append(_plan_deal(order, lens, costs, slack, P, C, ctx.config.local_search, mult))
        if MODE == "windows" or (MODE == "best" and n * _Counts(lens, P, C, mult).first <= WINDOWS_WORK_LIMIT):
            plans.append(_plan_windows(order, lens, costs, slack, P, C, mult))
        return min(plans, key=lambda pl: _value(pl, costs))  # the first on ties

    members, wins = plan = best(max(1, int(ctx.pack_multiple)) if SHORT_LAST_WINDOW else None)
    if SHORT_LAST_WINDOW and len(wins[-1]) < P:
        # the short last window keeps WFAP's balance: where its fuller packs balance worse than
        # balance_tolerance x what whole windows give, whole windows are kept
        whole = best(None)
        if _worst_ratio(plan, costs) > ctx.config.balance_tolerance * _worst_ratio(whole, costs):
            members, wins = whole
    packs_idx = [list(members[j]) for j in wins[0]]
    if ctx.config.local_search and P > 1:  # within this window: no item changes window
        pc = [costs[mem].sum(axis=0).tolist() if mem else [0.0] * costs.shape[1] for mem in packs_idx]
        pt = [int(lens[mem].sum()) for mem in packs_idx]
        local_search(pc, pt, packs_idx, [[] for _ in packs_idx], lens.tolist(), costs.tolist(), C,
                     max_steps=2 * P)
    chosen = {i for mem in packs_idx for i in mem}
    return [[items[i] for i in mem] for mem in packs_idx], [items[i] for i in range(n) if i not in chosen]


def _worst_ratio(plan: _Plan, costs: np.ndarray) -> float:
    """The plan's worst window max/mean pack cost (the worse balance model)."""
    members, wins = plan
    K = costs.shape[1]
    pcost = np.array([costs[mem].sum(axis=0) if mem else np.zeros(K) for mem in members]).reshape(-1, K)
    return max(float((pcost[win].max(axis=0) / np.maximum(pcost[win].mean(axis=0), 1e-300)).max())
               for win in wins if win)


def _value(plan: _Plan, costs: np.ndarray) -> float:
    """Sum over the plan's windows of the costliest pack (the worse balance model): the
    steps' time. (The sum of window max/mean instead picks plans that leave a heavy sample
    in a last window of few packs: on the simulator's flush-only feeding, step time over
    its bound 1.111 -> 1.189 on 8b-128K-cp8-pp1-wlbllm; the window figures are equal.)"""
    members, wins = plan
    K = costs.shape[1]
    pcost = np.array([costs[mem].sum(axis=0) if mem else np.zeros(K) for mem in members]).reshape(-1, K)
    return float(sum(pcost[win].max(axis=0).max() for win in wins if win))


def _by_deadline(order: np.ndarray, lim: np.ndarray, m: int) -> tuple[list[int], list[int]]:
    """Items due before the plan's last window (by deadline, then in ``order``), and the rest."""
    early = order[lim[order] < m - 1]
    early = early[np.argsort(lim[early], kind="stable")]
    return early.tolist(), order[lim[order] >= m - 1].tolist()


def _plan_windows(order: np.ndarray, lens: np.ndarray, costs: np.ndarray, slack: np.ndarray, P: int,
                  C: int, mult: int | None = None) -> _Plan:
    """Windows first: items due before the last window go, largest first, to the cheapest
    pack with room of a window they may wait for; the largest others anchor the empty packs,
    ``P`` per window in rank order (the first window the largest); then every other item,
    largest first, to the pack where it raises its window's max/mean the least. Pack counts
    as :class:`_Counts` (``mult``)."""
    K = costs.shape[1]
    counts = _Counts(lens, P, C, mult)
    Q: int | None = counts.first
    while Q is not None:
        sizes = _sizes(Q, P)
        m = len(sizes)
        lim = np.minimum(slack, m - 1)
        pc = np.zeros((Q, K))
        pt = np.zeros(Q, dtype=np.int64)
        member: list[list[int]] = [[] for _ in range(Q)]
        left: list[int] = []  # lengths of the items without room

        def put(i: int, j: int) -> None:
            member[j].append(i)
            pc[j] += costs[i]
            pt[j] += lens[i]

        early, rest = _by_deadline(order, lim, m)
        for i in early:
            room = np.flatnonzero(pt[:(lim[i] + 1) * P] + lens[i] <= C)  # windows before the last: P packs
            if room.size == 0:
                left.append(int(lens[i]))
                continue
            put(i, int(room[np.argmin(pc[room].max(axis=1))]))
        empty = [j for j in range(Q) if not member[j]]
        for i, j in zip(rest, empty):
            put(i, j)
        win = np.repeat(np.arange(m), sizes)
        size = np.asarray(sizes, dtype=float)[:, None]  # (m, 1)
        starts = np.arange(m) * P
        wsum, wmax = np.add.reduceat(pc, starts), np.maximum.reduceat(pc, starts)  # (m, K), kept up to date below
        for i in rest[len(empty):]:
            ok = pt + lens[i] <= C
            if not ok.any():
                left.append(int(lens[i]))
                continue
            ci = costs[i]
            old = (wmax / np.maximum(wsum / size, 1e-300)).max(axis=1)  # (m,)
            nmax = np.maximum(wmax[win], pc + ci)
            nmean = (wsum + ci) / size
            delta = (nmax / np.maximum(nmean[win], 1e-300)).max(axis=1) - old[win]
            j = int(np.argmin(np.where(ok, delta, np.inf)))
            put(i, j)
            w = j // P
            wsum[w] += ci
            np.maximum(wmax[w], pc[j], out=wmax[w])
        if not left:
            break
        Q = counts.next(Q, left)
    return member, [list(range(w * P, w * P + k)) for w, k in enumerate(sizes)]


def _plan_deal(order: np.ndarray, lens: np.ndarray, costs: np.ndarray, slack: np.ndarray, P: int, C: int,
               search: bool, mult: int | None = None) -> _Plan:
    """Packs first: every item, largest first, to the pack of lowest score with room among
    all ``m x P`` (an item due before the last window among the packs of the windows it may
    wait for), local search over all (those items stay); then the packs dealt into windows
    by rank or round-robin by rank, the better of the two, every pack no later than its
    items' deadline. Pack counts as :class:`_Counts` (``mult``)."""
    n, K = len(order), costs.shape[1]
    L, c = lens.tolist(), costs.tolist()
    counts = _Counts(lens, P, C, mult)
    Q: int | None = counts.first
    while Q is not None:
        sizes = _sizes(Q, P)
        m = len(sizes)
        lim = np.minimum(slack, m - 1)
        pc = [[0.0] * K for _ in range(Q)]
        pt = [0] * Q
        anchor_of: list[list[int]] = [[] for _ in range(Q)]  # items due before the last window: never moved
        tail_of: list[list[int]] = [[] for _ in range(Q)]
        left: list[int] = []
        early, rest = _by_deadline(order, lim, m)
        for d in range(m - 1):
            group = [i for i in early if lim[i] == d]
            if group:
                k = (d + 1) * P
                pcd, ptd, td = pc[:k], pt[:k], [[] for _ in range(k)]
                left += place_tails(group, L, c, [False] * n, pcd, ptd, td, C, math.inf)
                pc[:k], pt[:k] = pcd, ptd
                for j in range(k):
                    anchor_of[j] += td[j]
        left += place_tails(rest, L, c, [False] * n, pc, pt, tail_of, C, math.inf)
        if not left:
            break
        Q = counts.next(Q, [L[i] for i in left])
    Q = sum(sizes)
    if search and Q > 1:
        local_search(pc, pt, tail_of, anchor_of, L, c, C, max_steps=2 * P)  # a window's budget (each step O(Q))
    members = [anchor_of[j] + tail_of[j] for j in range(Q)]
    deadline = [min((int(lim[i]) for i in anchor_of[j]), default=m - 1) for j in range(Q)]
    sc = [max(v) for v in pc]
    ranked = sorted(range(Q), key=lambda j: (-sc[j], j))
    prefs = [ranked, [ranked[r] for w in range(m) for r in range(w, Q, m)]]  # by rank; round-robin
    plans = [(members, _assign(pref, deadline, P, m, sizes[-1])) for pref in prefs]
    return min(plans, key=lambda pl: _value(pl, costs))


def _assign(pref: list[int], deadline: list[int], P: int, m: int, last: int | None = None) -> list[list[int]]:
    """Cut the preferred pack order into ``m`` windows of ``P`` packs (the last of ``last``,
    default ``P``), each pack no later than its deadline: each window first takes the
    earliest-deadline packs that cannot wait (so that every later window can still take its
    due ones), then the preferred ones. (Packs due before the last window have only the
    full windows before it to go to.)"""
    rest = list(pref)
    wins = []
    for w in range(m):
        due = sorted(rest, key=lambda j: deadline[j])  # stable: preferred first among equals
        need = 0
        for k, j in enumerate(due):  # packs due by window deadline[j] < m - 1, beyond the windows after w
            if deadline[j] < m - 1:
                need = max(need, k + 1 - (deadline[j] - w) * P)
        take = due[:need]
        taken = set(take)
        size = P if w < m - 1 or last is None else last
        take += [j for j in rest if j not in taken][:size - len(take)]
        wins.append(take)
        taken = set(take)
        rest = [j for j in rest if j not in taken]
    return wins

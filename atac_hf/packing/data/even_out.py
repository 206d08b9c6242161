"""The end of a pass re-cut so that its pack count is a multiple of the DP replicas
(``even_batches``): Accelerate then need not repeat batches, which would train samples twice.

Numpy only, deterministic: a pure function of the packs, the batches released before them
and the configuration (every rank computes the same packs without talking).

In order of preference (fidelity first: a sample that fits the cap stays whole wherever
some count of packs allows it that step 3's search finds):

1. split packs with several documents at a document boundary, costliest first, up to the
   next multiple (never raises a pack's tokens or cost);
2. merge the packs with the fewest tokens down to the multiple below while they fit;
3. repack the documents first-fit decreasing and split at boundaries to the allowed count
   nearest the planned one (any count from the repacked one to one pack per document), or
   below the first-fit count, into an allowed count an exact search finds (a bounded one:
   bin packing is NP-hard, so a whole count that only a longer search would find is missed);
4. (``overlength="split"``) cut the longest fragment of a sample split before, into
   fragments >= ``min_fragment``, and only where none is left a whole sample (fragments of
   the sample cut first are cut again before another is): the documents fill no allowed
   count whole, e.g. 21 samples that each need a pack of their own, on 2 replicas;
5. the same even below ``min_fragment`` (any ``overlength``);
6. re-cut the packs' spans into the multiple below, in near-equal runs that fit the cap.

A sample that fits the cap and is cut here is named in a :class:`SampleCutWarning`.

With ``T`` tokens left, a count in ``[ceil(T / max_tokens), T]`` is reachable, which holds
a multiple whenever ``T >= 2 x num_replicas - 2`` and ``max_tokens >= 2`` (the planner's
reserve sees to it).
"""

from __future__ import annotations

import heapq
import warnings
from typing import Callable, Sequence

from ..config import PackingConfig

__all__ = ["SampleCutWarning", "even_out"]

Span = tuple[int, int, int]
PackCost = Callable[[Sequence[Span]], float]
PackCosts = Callable[[Sequence[Sequence[Span]]], list[float]]


class SampleCutWarning(UserWarning):
    """``even_batches`` cut a sample that fits ``max_tokens``: the pass's last documents fill no
    count of packs that divides evenly among the DP replicas whole."""


NONE, ANY = "none", "any"  # what split_to may cut when no pack has two documents


def even_out(packs: list[list[Span]], *, num_batches: int, num_replicas: int, config: PackingConfig,
             pack_cost: PackCost, pack_costs: PackCosts) -> list[list[Span]]:
    """``packs`` (the pass's last packs, after ``num_batches`` released ones) re-cut so that
    ``num_batches + len(result)`` is a multiple of ``num_replicas``; no token is added or lost.

    Raises:
        ValueError: no count of packs makes the pass a multiple of ``num_replicas``.
    """
    R, cap = int(num_replicas), int(config.max_tokens)
    c = len(packs)
    up = c + (-(num_batches + c) % R)
    if up == c:
        return packs
    total = sum(_tokens(p) for p in packs)
    down = up - R
    cut = _Cutter(config, pack_cost, pack_costs)
    out = cut.split_to(packs, up, NONE)
    if out is None and down >= 1:
        out = _merge_to(packs, down, cap)
    if out is None:
        out = _repack(packs, cap, c, lambda n: (num_batches + n) % R == 0, cut)
    if out is None and config.overlength == "split":
        out = cut.split_to(packs, up, ANY)
    if out is None and up <= total:
        out = cut.split_to(packs, up, ANY, clean=False)
    if out is None and down >= max(1, -(-total // cap)):
        out = _recut(packs, down)
    if out is None:
        raise ValueError(
            f"even_batches: the pass cannot be dealt to num_replicas={R} in equal batch counts without "
            f"repeating a batch (which trains samples twice): after {num_batches} packs, {total} tokens "
            f"are left, and every pack holds 1 to max_tokens={cap} tokens, so no count of packs makes the "
            f"pass a multiple of {R} (a pass needs at least num_replicas tokens, and with max_tokens=1 a "
            "multiple of num_replicas); use fewer replicas, more data or a larger max_tokens, or set "
            "even_batches=False to let Accelerate repeat batches"
        )
    assert (num_batches + len(out)) % R == 0 and sum(_tokens(p) for p in out) == total
    _warn_cut(packs, out, R)
    return out


class _Cutter:
    def __init__(self, config: PackingConfig, pack_cost: PackCost, pack_costs: PackCosts) -> None:
        self.min_fragment = max(1, int(config.min_fragment or 1))
        self.pack_cost, self.pack_costs = pack_cost, pack_costs

    def split_to(self, packs: list[list[Span]], n: int, cut: str, *, clean: bool = True) -> list[list[Span]] | None:
        """Split packs until there are ``n``; ``None`` when that needs a cut ``cut`` forbids.

        The costliest pack with several documents is halved at a document boundary (its
        documents dealt largest first to the lighter half); when none is left (``ANY``) a
        single document is cut in two, into fragments >= ``min_fragment`` where ``clean``:
        the longest fragment of a sample split before (a start above 0, or another span of
        the sample among the packs), else the longest whole document. Heaps keep it
        O((packs + n) log packs)."""
        packs = list(packs)
        least = 2 * self.min_fragment if clean else 2
        split = _split_before(packs)
        multi = [(-c, i) for i, (c, p) in enumerate(zip(self.pack_costs(packs), packs)) if len(p) >= 2]
        single: list[tuple[int, int, int]] = []  # (whole, -tokens, pack)

        def push(i: int) -> None:
            p = packs[i]
            if len(p) >= 2:
                heapq.heappush(multi, (-self.pack_cost(p), i))
            elif cut == ANY and p[0][2] - p[0][1] >= least:
                whole = p[0][1] == 0 and p[0][0] not in split
                heapq.heappush(single, (int(whole), -(p[0][2] - p[0][1]), i))

        heapq.heapify(multi)
        for i, p in enumerate(packs):
            if len(p) == 1:
                push(i)
        while len(packs) < n:
            if multi:
                _c, i = heapq.heappop(multi)
                halves: list[list[Span]] = [[], []]
                load = [0.0, 0.0]
                for span in sorted(packs[i], key=lambda s: (s[1] - s[2], s)):
                    h = 0 if load[0] <= load[1] else 1
                    halves[h].append(span)
                    load[h] += self.pack_cost([span])
            else:  # every pack holds one document here
                if not single:
                    return None
                _w, _t, i = heapq.heappop(single)
                sid, start, end = packs[i][0]
                split.add(sid)
                mid = start + (end - start) // 2
                halves = [[(sid, start, mid)], [(sid, mid, end)]]
            packs[i] = halves[0]
            packs.append(halves[1])
            push(i)
            push(len(packs) - 1)
        return packs


def _split_before(packs: list[list[Span]]) -> set[int]:
    """Samples with more than one span among ``packs`` (fragments of one sample)."""
    seen: set[int] = set()
    twice: set[int] = set()
    for p in packs:
        for sid, _s, _e in p:
            (twice if sid in seen else seen).add(sid)
    return twice


def _merge_to(packs: list[list[Span]], n: int, cap: int) -> list[list[Span]] | None:
    """Merge the two packs with the fewest tokens while they fit the cap, until there are
    ``n`` (the merged pack takes the first one's place); ``None`` if that cannot finish."""
    packs = list(packs)
    alive = len(packs)
    heap = [(_tokens(p), i) for i, p in enumerate(packs)]
    heapq.heapify(heap)
    while alive > n:
        if len(heap) < 2:
            return None
        (ta, a), (tb, b) = heapq.heappop(heap), heapq.heappop(heap)
        if ta + tb > cap:
            return None
        a, b = min(a, b), max(a, b)
        packs[a] = _coalesce(packs[a] + packs[b])
        packs[b] = []
        heapq.heappush(heap, (ta + tb, a))
        alive -= 1
    return [p for p in packs if p]


def _repack(packs: list[list[Span]], cap: int, planned: int, allowed: Callable[[int], bool],
            cut: _Cutter) -> list[list[Span]] | None:
    """The packs' documents (adjacent fragments of one sample joined where they fit) first-fit
    decreasing into packs of ``cap`` tokens, then split at document boundaries to the
    ``allowed`` count nearest ``planned`` (the smaller on a tie); below the first-fit count,
    down to a lower bound (tokens, and documents over half the cap), an exact search of at most
    :data:`SEARCH_NODES` steps per count (up to :data:`SEARCH_DOCS` documents). ``None`` where
    neither finds an allowed count."""
    docs = sorted(_coalesce([s for p in packs for s in p], cap), key=lambda s: (s[1] - s[2], s))
    bins: list[list[Span]] = []
    room: list[int] = []
    for span in docs:
        size = span[2] - span[1]
        j = next((j for j, r in enumerate(room) if r >= size), len(bins))
        if j == len(bins):
            bins.append([])
            room.append(cap)
        bins[j].append(span)
        room[j] -= size
    sizes = [e - s for _, s, e in docs]
    least = max(-(-sum(sizes) // cap), sum(2 * n > cap for n in sizes))
    for n in sorted((n for n in range(least, len(docs) + 1) if allowed(n)), key=lambda n: (abs(n - planned), n)):
        if n >= len(bins):
            return cut.split_to([sorted(b) for b in bins], n, NONE)
        found = _fit(docs, cap, n) if len(docs) <= SEARCH_DOCS else None
        if found is not None:
            return found
    return None


SEARCH_NODES = 20_000  # _fit: placements tried per pack count before giving up
SEARCH_DOCS = 256  # _repack: documents above which no exact search is tried (first-fit only)


def _fit(docs: list[Span], cap: int, n: int) -> list[list[Span]] | None:
    """``docs`` (largest first) in exactly ``n`` packs of at most ``cap`` tokens, each pack
    non-empty (depth-first, a document into each distinct load in turn); ``None`` where none
    is found within :data:`SEARCH_NODES` placements."""
    loads = [0] * n
    where = [0] * len(docs)
    budget = [SEARCH_NODES]

    def place(k: int) -> bool:
        if k == len(docs):
            return all(loads)
        if len(docs) - k < loads.count(0):  # too few documents left to fill the empty packs
            return False
        size, tried = docs[k][2] - docs[k][1], set()
        for j in range(n):
            if loads[j] + size > cap or loads[j] in tried or budget[0] <= 0:
                continue
            tried.add(loads[j])
            budget[0] -= 1
            loads[j] += size
            where[k] = j
            if place(k + 1):
                return True
            loads[j] -= size
        return False

    if not place(0):
        return None
    out: list[list[Span]] = [[] for _ in range(n)]
    for span, j in zip(docs, where):
        out[j].append(span)
    return [sorted(p) for p in out]


def _warn_cut(before: list[list[Span]], after: list[list[Span]], R: int) -> None:
    """Name the samples that were whole in ``before`` (one span, from token 0) and are cut in ``after``."""
    split = _split_before(before)
    whole = {p[k][0] for p in before for k in range(len(p)) if p[k][1] == 0 and p[k][0] not in split}
    cut = sorted(_split_before(after) & whole)
    if cut:
        warnings.warn(
            f"even_batches: the pass's last {sum(len(p) for p in before)} document(s) fill no count of packs "
            f"that divides evenly among num_replicas={R} whole (each needs a pack of its own, say), so "
            f"{len(cut)} sample(s) that fit max_tokens (ids {cut[:5]}) were cut rather than let Accelerate "
            "repeat a batch (which trains its samples twice); set even_batches=False to let it repeat "
            "instead (build_packed_dataloader / ATACAccelerator.packed_dataloader; ATACTrainer always deals "
            "evenly), or use a number of replicas, max_tokens or data that divides evenly",
            SampleCutWarning, stacklevel=2,
        )


def _tokens(pack: Sequence[Span]) -> int:
    return sum(e - s for _, s, e in pack)


def _recut(packs: list[list[Span]], n: int) -> list[list[Span]]:
    """The packs' spans, in order, re-cut into ``n`` runs of near-equal tokens (a span
    crossing a run's end becomes two fragments)."""
    spans = [s for p in packs for s in p]
    total = sum(e - s for _, s, e in spans)
    base, extra = divmod(total, n)
    out: list[list[Span]] = []
    run: list[Span] = []
    room = base + (0 < extra)
    for sid, s, e in spans:
        while s < e:
            take = min(e - s, room)
            run.append((sid, s, s + take))
            s += take
            room -= take
            if room == 0:
                out.append(_coalesce(run))
                run = []
                room = base + (len(out) < extra)
    assert not run and len(out) == n
    return out


def _coalesce(spans: list[Span], cap: int | None = None) -> list[Span]:
    """Join spans of one sample that meet end to start (fragments back into one document),
    while the joined span holds at most ``cap`` tokens."""
    out: list[Span] = []
    for sid, start, end in sorted(spans):
        if out and out[-1][0] == sid and out[-1][2] == start and (cap is None or end - out[-1][1] <= cap):
            out[-1] = (sid, out[-1][1], end)
        else:
            out.append((sid, start, end))
    return out

"""Split-mode packing of a whole pass that fills packs up to ``ceil(tokens / max_tokens)``.

Under ``overlength="split"`` a sample longer than the cap is cut anyway; *where* it is cut
is free. Cutting it into full-cap pieces and a rest (TRL's ``bfd_split``, and
:func:`~atac_hf.packing.planners.window.overlength_pieces`) fixes the rest's length, and
best-fit decreasing then leaves a hole next to every pack it cannot fill exactly. Here the
overlength samples are *poured* into the room whole samples leave instead, so that the only
unused room is what no fragment of at least ``min_fragment`` tokens can fill. Steps, in the
order :func:`plan_split_fill` runs them:

1. Samples that fit the cap stay whole (they are never cut). Those of at least
   ``min_fragment`` tokens are packed best-fit decreasing (longest first, each into the
   open pack with the least room that holds it).
2. The *short* samples (under ``min_fragment`` tokens: no fragment could fill a room that
   small) plug the rooms under ``min_fragment`` that step 1 left, best-fit decreasing.
3. The overlength samples are laid one after another, in data order, over a stream of
   *slots*: the rooms of at least ``min_fragment`` tokens, largest first, then empty packs.
   A sample covers whole slots and ends inside one; every fragment must keep at least
   ``min_fragment`` tokens, and so must the room a sample's end leaves for the next one.
   Among the next :data:`CANDIDATES` samples the one whose end lands cleanly (on a slot's
   end, or at least ``min_fragment`` from both ends of its slot) goes next, else the one
   that wastes the least room: the room after its end left empty, or its last fragment
   lengthened to ``min_fragment`` by shortening the one before (an empty end of that slot),
   or its start moved to the next slot. A sample none of that can place (a rare case near
   small rooms) gets packs of its own, cut as :func:`overlength_pieces` cuts.
4. The short samples left fill the remaining room, best-fit decreasing, then new packs.

Only samples longer than the cap are cut, every fragment has at least ``min_fragment``
tokens, no pack exceeds the cap and every token is placed exactly once (the property tests
in ``tests/test_packing_split.py`` check all four on random inputs). The count is not proven
minimal; on the benchmark's random cases it is within 1% of ``ceil(tokens / max_tokens)``
(``docs/BENCHMARKS.md``, "Split mode"). Numpy only, deterministic.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

from .planners.window import overlength_pieces

__all__ = ["CANDIDATES", "plan_split_fill"]

CANDIDATES = 64  # overlength samples looked at for the next place in the slot stream

Span = tuple[int, int, int]


class _Packs:
    """Packs under construction: their spans, tokens used, and a sorted list of (room, pack)."""

    def __init__(self, max_tokens: int) -> None:
        self.cap = int(max_tokens)
        self.spans: list[list[Span]] = []
        self.used: list[int] = []

    def new(self) -> int:
        self.spans.append([])
        self.used.append(0)
        return len(self.spans) - 1

    def put(self, j: int, sid: int, start: int, end: int) -> None:
        self.spans[j].append((sid, start, end))
        self.used[j] += end - start
        assert self.used[j] <= self.cap

    def room(self, j: int) -> int:
        return self.cap - self.used[j]

    def best_fit(self, items: Sequence[tuple[int, int]], packs: Sequence[int], *, open_new: bool) -> list[tuple[int, int]]:
        """Best-fit decreasing of whole ``(length, sample)`` items into ``packs`` (and, with
        ``open_new``, new packs); returns the items placed nowhere."""
        rooms = sorted((self.room(j), j) for j in packs if self.room(j) > 0)
        left = []
        for n, sid in sorted(items, key=lambda it: (-it[0], it[1])):
            k = bisect.bisect_left(rooms, (n, -1))
            if k < len(rooms):
                _room, j = rooms.pop(k)
            elif open_new:
                j = self.new()
            else:
                left.append((n, sid))
                continue
            self.put(j, sid, 0, n)
            if self.room(j) > 0:
                bisect.insort(rooms, (self.room(j), j))
        return left


def plan_split_fill(lengths: Sequence[int], max_tokens: int, min_fragment: int,
                    sample_ids: Sequence[int] | None = None) -> list[list[Span]]:
    """Pack every sample of a pass, pouring the overlength ones into the room left (steps 1-4).

    Args:
        lengths: token count of each sample (>= 0; zero-length samples are skipped), in
            data order.
        max_tokens: the cap of one pack (>= 1).
        min_fragment: shortest fragment a cut may leave (1 <= min_fragment <= max(1,
            max_tokens // 2), as :class:`~atac_hf.packing.config.PackingConfig` guarantees).
        sample_ids: the id written into each span (default: the index into ``lengths``).

    Returns:
        the packs, each a list of spans ``(sample_id, start, end)``; whole samples as
        ``(id, 0, length)``.
    """
    L = np.asarray(lengths, dtype=np.int64).reshape(-1)
    ids = np.arange(L.size) if sample_ids is None else np.asarray(sample_ids, dtype=np.int64)
    C, m = int(max_tokens), int(min_fragment)
    assert C >= 1 and 1 <= m <= max(1, C // 2) and ids.size == L.size
    P = _Packs(C)
    fits = np.flatnonzero((L > 0) & (L <= C))
    long = np.flatnonzero(L > C)
    short = [(int(L[i]), int(ids[i])) for i in fits if L[i] < m]
    # 1. whole samples of >= min_fragment tokens, best-fit decreasing
    P.best_fit([(int(L[i]), int(ids[i])) for i in fits if L[i] >= m], [], open_new=True)
    # 2. short samples plug the rooms no fragment may fill
    short = P.best_fit(short, [j for j in range(len(P.spans)) if 0 < P.room(j) < m], open_new=False)
    # 3. overlength samples poured over the slots
    if long.size:
        _pour(P, [(int(L[i]), int(ids[i])) for i in long], m)
    # 4. the short samples left: any room, then new packs
    P.best_fit(short, range(len(P.spans)), open_new=True)
    return [p for p in P.spans if p]


def _pour(P: _Packs, samples: list[tuple[int, int]], m: int) -> None:
    """Step 3: lay ``samples`` (length, id), each > the cap, over the rooms >= m, largest
    first, then over empty packs (enough are opened up front)."""
    C = P.cap
    holes = sorted((j for j in range(len(P.spans)) if P.room(j) >= m), key=lambda j: (-P.room(j), j))
    slot_pack = list(holes)
    size = [P.room(j) for j in holes]
    total = sum(n for n, _ in samples)
    fresh = max(0, -(-(total - sum(size)) // C)) + 2 * len(samples) + 2  # every waste is < C per sample
    slot_pack += [P.new() for _ in range(fresh)]
    size += [C] * fresh
    ends = np.cumsum(np.asarray(size, dtype=np.int64))
    starts = ends - np.asarray(size, dtype=np.int64)
    lengths = np.array([n for n, _ in samples], dtype=np.int64)
    remaining = list(range(len(samples)))
    pos = 0  # where the next sample starts in the slot stream (a slot start, or >= m inside one)
    while remaining:
        head = np.asarray(remaining[:CANDIDATES])
        s0 = int(np.searchsorted(ends, pos, side="right"))
        waste = _landing_waste(ends, starts, pos, lengths[head], m)
        start = pos
        if pos > starts[s0]:  # or start at the next slot, leaving the rest of this one empty
            later = _landing_waste(ends, starts, int(ends[s0]), lengths[head], m) + (int(ends[s0]) - pos)
            if later.min() < waste.min():
                waste, start = later, int(ends[s0])
        k = int(np.argmin(waste))
        r = remaining.pop(k)
        n, sid = samples[r]
        if not np.isfinite(waste[k]):  # no clean place: packs of its own
            a = 0
            for piece in overlength_pieces(n, C, m):
                P.put(P.new(), sid, a, a + piece)
                a += piece
            continue
        pos = _lay(P, slot_pack, ends, starts, start, n, sid, m)


def _landing_waste(ends: np.ndarray, starts: np.ndarray, pos: int, n: np.ndarray, m: int) -> np.ndarray:
    """Tokens left empty if each sample of ``n`` tokens is laid from ``pos`` (inf: no legal
    way). The end lands in slot ``s1`` at offset ``o1``: clean on the slot's end or at least
    ``m`` from both of its ends; with ``o1 >= m`` the rest of the slot is left empty; with
    ``o1 < m`` the fragment before gives ``m - o1`` tokens to the last one (legal while it
    keeps ``m``), which leaves the end of its slot empty."""
    end = pos + n
    s1 = np.searchsorted(ends, end, side="left")
    size1 = ends[s1] - starts[s1]
    o1 = end - starts[s1]
    s0 = int(np.searchsorted(ends, pos, side="right"))
    before = np.maximum(s1 - 1, 0)
    prev = np.where(s1 - 1 == s0, ends[before] - pos, ends[before] - starts[before])  # fragment in slot s1-1
    waste = np.full(n.shape, np.inf)
    clean = (o1 == size1) | ((o1 >= m) & (size1 - o1 >= m))
    waste[clean] = 0
    tail = ~clean & (o1 >= m)
    waste[tail] = (size1 - o1)[tail]
    shift = ~clean & (o1 < m) & (s1 > s0) & (prev - (m - o1) >= m)
    after = np.where(size1 - m < m, size1 - m, 0)  # the room after a last fragment of m
    waste[shift] = (m - o1 + after)[shift]
    return waste


def _lay(P: _Packs, slot_pack: list[int], ends: np.ndarray, starts: np.ndarray, pos: int, n: int, sid: int,
         m: int) -> int:
    """Lay one sample from ``pos`` as :func:`_landing_waste` planned it; returns where the
    next sample starts (the slot's end when less than ``m`` is left in it)."""
    end = pos + n
    s1 = int(np.searchsorted(ends, end, side="left"))
    o1 = end - int(starts[s1])
    size1 = int(ends[s1] - starts[s1])
    clean = o1 == size1 or (o1 >= m and size1 - o1 >= m)
    give = 0 if clean or o1 >= m else m - o1  # the fragment in slot s1-1 gives this to the last one
    s = int(np.searchsorted(ends, pos, side="right"))
    x, done = pos, 0
    while True:
        room = int(ends[s]) - x - (give if s == s1 - 1 else 0)
        take = min(room, n - done)
        P.put(slot_pack[s], sid, done, done + take)
        done += take
        x += take
        if done == n:
            break
        s += 1
        x = int(starts[s])
    if x < ends[s] and int(ends[s]) - x < m:
        x = int(ends[s])
    return x

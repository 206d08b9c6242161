"""Window feeding shared by every feeder: a StreamPacker, window sizing, and the order
in which a window's packs are dealt to data-parallel replicas.

Numpy only (no torch): the feeders (:mod:`.feeders`, :mod:`.streaming`,
:mod:`.dataset`) wrap it for DataLoaders and datasets.

**Data parallelism.** Accelerate shards a prepared DataLoader by dealing batches
round-robin (``BatchSamplerShard``, ``split_batches=False``: batch ``b`` goes to DP replica
``b % num_replicas``; for iterable datasets ``IterableDatasetShard`` deals rows the same
way with ``batch_size=1``) and gives every CP rank of a replica the same batches.
:func:`replica_order` therefore orders each window's packs so that this deal hands each
replica a share of the window with a balanced sum of pack costs (LPT), each replica's packs
heaviest first (so any run of consecutive rounds is balanced too). With ``even_batches``
the last window's packs are re-cut (split at document boundaries, else a long document
into two fragments, else the two smallest packs merged, else - rather than let Accelerate
repeat batches, which would train samples twice - a document cut into two fragments even
below ``min_fragment``) until the pass's pack count is a multiple of ``num_replicas``, so
Accelerate need not repeat batches to even out the last round; only a pass with fewer
tokens than replicas cannot be evened out (a warning says so). Set ``packs_per_window`` to a multiple of ``num_replicas`` (e.g. DP replicas x
gradient-accumulation steps: one window per optimizer step).

**Determinism.** Everything is a pure function of (lengths, config, order): every rank
computes the same packs without talking.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ...cost import CostModel, default_cost_model
from ..config import PackingConfig
from ..stream import StreamPacker

__all__ = ["Span", "WindowPlanner", "plan_packs", "replica_order"]

Span = tuple[int, int, int]


def replica_order(costs: Sequence[float], num_replicas: int, *, first_slot: int = 0,
                  prior_loads: Sequence[float] | None = None) -> list[int]:
    """Order packs so that a round-robin deal to ``num_replicas`` replicas is balanced.

    Slot ``first_slot + k`` of the output goes to replica ``(first_slot + k) % num_replicas``
    (how Accelerate deals batches). Packs are assigned, heaviest first, to the replica with
    the least cost in this window among those with a free slot (LPT; ties go to the replica
    with the least ``prior_loads``, so earlier windows' leftovers do not drift one way);
    each replica's packs then fill its slots heaviest first.

    Args:
        costs: cost of each pack.
        num_replicas: DP replicas the batches are dealt to.
        first_slot: global index of the first pack (batches dealt before this window).
        prior_loads: per-replica cost dealt in earlier windows (tie-breaking only).

    Returns:
        a permutation ``perm``: the ``k``-th batch to emit is pack ``perm[k]``.
    """
    n = len(costs)
    if num_replicas <= 1 or n <= 1:
        return list(range(n))
    prior = [0.0] * num_replicas if prior_loads is None else [float(x) for x in prior_loads]
    replica_of_slot = [(first_slot + k) % num_replicas for k in range(n)]
    free = [replica_of_slot.count(r) for r in range(num_replicas)]
    load = [0.0] * num_replicas
    mine: list[list[int]] = [[] for _ in range(num_replicas)]
    for p in sorted(range(n), key=lambda i: (-float(costs[i]), i)):
        r = min((r for r in range(num_replicas) if free[r]), key=lambda r: (load[r], prior[r], r))
        mine[r].append(p)
        load[r] += float(costs[p])
        free[r] -= 1
    taken = [0] * num_replicas
    perm = []
    for r in replica_of_slot:
        perm.append(mine[r][taken[r]])
        taken[r] += 1
    return perm


class WindowPlanner:
    """A StreamPacker plus window sizing and DP ordering; shared by every feeder.

    Window sizing: ``window_size`` new samples per window, or (``None``) as many as the
    packer asks for (:meth:`StreamPacker.window_size`: the window's token capacity minus
    the carry, with held-back samples bounded), as :func:`pack_lengths` does, so the
    carry cannot grow without bound. With ``num_replicas=1`` the packs equal
    ``pack_lengths(lengths, config, cost_model, window=window_size).packs``.
    """

    def __init__(self, config: PackingConfig, cost_model: CostModel | None, *, window_size: int | None,
                 num_replicas: int, even_batches: bool) -> None:
        self.config = config
        self.cost_model = cost_model if cost_model is not None else default_cost_model()
        self.packer = StreamPacker(config, cost_model)
        self.window_size = window_size
        self.num_replicas = num_replicas
        self.even_batches = even_batches
        self.prev_empty = True  # the last window emitted no pack (the next must take a sample)
        self.num_batches = 0  # packs emitted: global batch index of the next pack
        self.loads = [0.0] * num_replicas  # cost dealt to each replica so far

    def effective_lengths(self, lengths: np.ndarray) -> np.ndarray:
        if self.config.overlength == "truncate":
            return np.minimum(lengths, int(self.config.max_tokens))
        return lengths

    def window_count(self, lengths: np.ndarray, pos: int, *, more_coming: bool = False) -> int:
        """New samples for the next window, from the samples ``lengths[pos:]`` (stream order).

        Fixed ``window_size``, or :meth:`StreamPacker.window_size` (token budget, with a
        bound on held-back samples) looking ahead as far as needed, exactly as
        :func:`pack_lengths` does. May be 0 when the carry alone fills the window. With
        ``more_coming`` (a stream whose buffer is ``lengths``), a result equal to the
        buffered count means "read more samples first".
        """
        n = int(lengths.size)
        if self.window_size is not None:
            k = self.window_size
        else:
            look = 4096
            while True:  # look ahead far enough to fill the window
                k = self.packer.window_size(lengths[pos:pos + look])
                if k < look or pos + look >= n:
                    break
                look *= 2
            if k <= 0 and self.prev_empty and not (more_coming and pos >= n):
                k = 1  # always make progress
        return max(0, min(k, n - pos))

    def add(self, sample_ids: Sequence[int], lengths: Sequence[int], *, last: bool = False) -> list[list[Span]]:
        """Pack one window; ``last`` also flushes the packer (end of the pass)."""
        packs: list[Any] = []
        if len(sample_ids) or not last:
            packs += list(self.packer.add_window(list(sample_ids), list(lengths)))
            self.prev_empty = not any(len(p) for p in packs)
        if last:
            packs += list(self.packer.flush())
        return self._emit(packs, final=last)

    def _emit(self, packs: Iterable[Iterable[Sequence[int]]], *, final: bool) -> list[list[Span]]:
        packs = [[(int(s[0]), int(s[1]), int(s[2])) for s in p] for p in packs]
        packs = [p for p in packs if p]
        if final and self.even_batches and self.num_replicas > 1:
            packs = self._even_out(packs)
        costs = [self.pack_cost(p) for p in packs]
        perm = replica_order(costs, self.num_replicas, first_slot=self.num_batches, prior_loads=self.loads)
        for k, i in enumerate(perm):
            self.loads[(self.num_batches + k) % self.num_replicas] += costs[i]
        self.num_batches += len(packs)
        return [packs[i] for i in perm]

    def pack_cost(self, pack: Sequence[Span]) -> float:
        return float(self.cost_model.doc_cost([e - s for _, s, e in pack]).sum())

    def _even_out(self, packs: list[list[Span]]) -> list[list[Span]]:
        """Re-cut the last window's packs so the pass's pack count is a multiple of num_replicas.

        First splits: a pack with several documents at a document boundary (costliest
        first), else, under ``overlength="split"``, the longest document into two fragments
        (each >= ``min_fragment``); splitting never raises a pack's tokens or cost. If no
        pack can be split, merges the two packs with the fewest tokens while they fit the
        cap (re-joining adjacent fragments of one sample). If that fails too, cuts the longest
        document in two even below ``min_fragment`` (in any overlength mode): a short fragment
        costs one next-token target, a repeated batch trains its samples twice. Warns only
        when no pack holds 2 tokens (fewer tokens than replicas).
        """
        need = -(self.num_batches + len(packs)) % self.num_replicas
        min_fragment = max(1, int(getattr(self.config, "min_fragment", 1) or 1))
        while need:
            multi = [i for i, p in enumerate(packs) if len(p) >= 2]
            long = [i for i, p in enumerate(packs) if p[0][2] - p[0][1] >= 2 * min_fragment]
            if multi:
                i = max(multi, key=lambda i: (self.pack_cost(packs[i]), -i))
                halves: list[list[Span]] = [[], []]
                load = [0.0, 0.0]
                for span in sorted(packs[i], key=lambda s: (s[1] - s[2], s)):
                    h = 0 if load[0] <= load[1] else 1
                    halves[h].append(span)
                    load[h] += self.pack_cost([span])
                packs[i:i + 1] = halves
            elif long and self.config.overlength == "split":
                i = max(long, key=lambda i: (packs[i][0][2] - packs[i][0][1], -i))
                sid, start, end = packs[i][0]
                mid = start + (end - start) // 2
                packs[i:i + 1] = [[(sid, start, mid)], [(sid, mid, end)]]
            else:
                merged = self._merge_out(packs)
                if merged is not None:
                    return merged
                # every pack holds one document here (multi is empty)
                two = [i for i, p in enumerate(packs) if p[0][2] - p[0][1] >= 2]
                if not two:
                    warnings.warn(
                        f"even_batches: the pass ends with {self.num_batches + len(packs)} packs, not a multiple "
                        f"of num_replicas={self.num_replicas}, and its last packs can be neither split nor merged; "
                        "Accelerate will even out the last round by repeating batches",
                        stacklevel=4,
                    )
                    return packs
                i = max(two, key=lambda i: (packs[i][0][2] - packs[i][0][1], -i))
                sid, start, end = packs[i][0]
                mid = start + (end - start) // 2
                packs[i:i + 1] = [[(sid, start, mid)], [(sid, mid, end)]]
            need -= 1
        return packs

    def _merge_out(self, packs: list[list[Span]]) -> list[list[Span]] | None:
        """Merge the two smallest packs while they fit the cap until the count is even; None if
        that cannot finish (``packs`` is left unchanged then)."""
        packs = list(packs)
        excess = (self.num_batches + len(packs)) % self.num_replicas
        tokens = lambda p: sum(e - s for _, s, e in p)  # noqa: E731
        while excess:
            order = sorted(range(len(packs)), key=lambda i: (tokens(packs[i]), i))
            if len(order) < 2 or tokens(packs[order[0]]) + tokens(packs[order[1]]) > self.config.max_tokens:
                return None
            a, b = sorted(order[:2])
            merged = _coalesce(packs[a] + packs[b])
            packs[a] = merged
            del packs[b]
            excess -= 1
        return packs

    def state_dict(self) -> dict[str, Any]:
        return {"packer": self.packer.state_dict(), "prev_empty": self.prev_empty, "num_batches": self.num_batches,
                "loads": list(self.loads)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:  # parse everything before changing anything
            prev_empty, num_batches = bool(state["prev_empty"]), int(state["num_batches"])
            loads = [float(x) for x in state["loads"]]
            packer = state["packer"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed window planner state ({e!r}): a truncated or edited checkpoint?") from None
        if len(loads) != self.num_replicas:
            raise ValueError(f"window planner state has {len(loads)} replica loads, expected {self.num_replicas}")
        self.packer.load_state_dict(packer)
        self.prev_empty, self.num_batches, self.loads = prev_empty, num_batches, loads


def _coalesce(pack: list[Span]) -> list[Span]:
    """Join spans of one sample that meet end to start (fragments back into one document)."""
    out: list[Span] = []
    for sid, start, end in sorted(pack):
        if out and out[-1][0] == sid and out[-1][2] == start:
            out[-1] = (sid, out[-1][1], end)
        else:
            out.append((sid, start, end))
    return out


def plan_packs(lengths: Sequence[int], config: PackingConfig, *, order: Sequence[int] | None = None,
               cost_model: CostModel | None = None, window_size: int | None = None, num_replicas: int = 1,
               even_batches: bool = True, progress: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Pack a whole pass over samples of known lengths, window by window.

    Args:
        lengths: token count of every sample; zero-length samples are skipped.
        config: the packing configuration.
        order: sample indices in the order they enter windows (default: 0, 1, ...).
        cost_model, window_size, num_replicas, even_batches: see :class:`WFAPBatchSampler`.
        progress: an object with ``update(n)`` (a tqdm bar), advanced by samples planned.

    Returns:
        ``(spans, offsets)``: ``spans`` (num_spans, 3) int64 rows ``(sample, start, end)``;
        pack ``b`` is ``spans[offsets[b]:offsets[b + 1]]``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.arange(lengths.size) if order is None else np.asarray(order, dtype=np.int64)
    order = order[lengths[order] > 0]
    planner = WindowPlanner(config, cost_model, window_size=window_size, num_replicas=num_replicas,
                             even_batches=even_batches)
    ordered = lengths[order]
    packs: list[list[Span]] = []
    p = 0
    while True:
        ids = order[p:p + planner.window_count(ordered, p)]
        p += len(ids)
        packs.extend(planner.add(ids.tolist(), lengths[ids].tolist(), last=p >= order.size))
        if progress is not None:
            progress.update(len(ids))
        if p >= order.size:
            break
    offsets = np.zeros(len(packs) + 1, dtype=np.int64)
    np.cumsum([len(pk) for pk in packs], out=offsets[1:])
    spans = np.array([s for pk in packs for s in pk], dtype=np.int64).reshape(-1, 3)
    return spans, offsets


def _fingerprint(**parts: Any) -> str:
    h = hashlib.sha256()
    for key in sorted(parts):
        v = parts[key]
        h.update(key.encode())
        h.update(v.tobytes() if isinstance(v, np.ndarray) else json.dumps(v, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _config_parts(config: PackingConfig, cost_model: CostModel | None, **extra: Any) -> dict[str, Any]:
    return {"config": dataclasses.asdict(config),
            "cost_model": None if cost_model is None else dataclasses.asdict(cost_model), **extra}


def _check_common(config: PackingConfig, window_size: int | None, num_replicas: int) -> None:
    if not isinstance(config, PackingConfig):
        raise TypeError(f"config must be a PackingConfig, got {type(config).__name__}")
    if window_size is not None and (not isinstance(window_size, (int, np.integer)) or window_size < 1):
        raise ValueError(f"window_size={window_size!r}: must be None (token budget) or an int >= 1 samples")
    if not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
        raise ValueError(f"num_replicas={num_replicas!r}: must be an int >= 1 (the DP size)")

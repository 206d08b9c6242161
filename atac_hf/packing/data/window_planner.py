"""Window feeding shared by every feeder: a StreamPacker, window sizing, and the order
in which a window's packs are dealt to data-parallel replicas.

Numpy only (no torch): the feeders (:mod:`.sampler`, :mod:`.iterable`,
:mod:`.dataset`) wrap it for DataLoaders and datasets.

**Data parallelism.** Accelerate shards a prepared DataLoader by dealing batches
round-robin (``BatchSamplerShard``, ``split_batches=False``: batch ``b`` goes to DP replica
``b % num_replicas``; for iterable datasets ``IterableDatasetShard`` deals rows the same
way with ``batch_size=1``) and gives every CP rank of a replica the same batches.
:func:`replica_order` therefore orders each window's packs so that this deal hands each
replica a share of the window with a balanced sum of pack costs (LPT), each replica's packs
heaviest first (so any run of consecutive rounds is balanced too). With ``even_batches``
the pass's last packs are re-cut until the pass's pack count is a multiple of
``num_replicas`` (:mod:`.even_out`: split at document boundaries, merged, or repacked, and
only where no count keeps every sample that fits the cap whole, a document cut, with a
warning), so Accelerate need not repeat batches (which would train samples twice) to even
out the last round. A *reserve* of the last planned
packs (at least ``2 x num_replicas`` tokens) is held back until the next window so that a
tiny last window can be evened out too: every pass of ``T >= num_replicas`` tokens is
dealt exactly once (with ``max_tokens=1``: when ``T`` is a multiple of ``num_replicas``),
and any other pass raises ``ValueError``. Set ``packs_per_window`` to a multiple of
``num_replicas`` (e.g. DP replicas x gradient-accumulation steps: one window per optimizer
step). A pass's last window (``wfap``) gets the packs its samples need, a multiple of
``num_replicas`` (the packer's ``pack_multiple``), so it needs no re-cut either.

**Determinism.** Everything is a pure function of (lengths, config, order): every rank
computes the same packs without talking.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ...cost import CostModel, default_cost_model
from ..config import MAX_LENGTH, MAX_PACKS_PER_WINDOW, PackingConfig
from ..feed import MIN_LOOK, next_window
from ..metrics import pack_costs
from ..planners.window import checked_ref_cost_per_token
from ..split_fill import plan_split_fill
from ..stream import StreamPacker
from ..validate import _is_int, _short, check_dealable, check_lengths, check_overlength, check_planner_state
from .even_out import _tokens, even_out

__all__ = ["Span", "WindowPlanner", "plan_packs", "replica_order"]

# the reserve also holds packs (up to this many per replica) until it has num_replicas - 1 documents
# more than packs: the pass's end can then reach the next multiple by splits at document boundaries
RESERVE_PACKS = 4

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
    free = [0] * num_replicas
    for r in replica_of_slot:
        free[r] += 1
    load = [0.0] * num_replicas
    mine: list[list[int]] = [[] for _ in range(num_replicas)]
    # the replica with a free slot and the least (load, prior, index): a heap keyed the same way
    heap = [(0.0, prior[r], r) for r in range(num_replicas) if free[r]]
    heapq.heapify(heap)
    for p in sorted(range(n), key=lambda i: (-float(costs[i]), i)):
        _load, _prior, r = heapq.heappop(heap)
        mine[r].append(p)
        load[r] += float(costs[p])
        free[r] -= 1
        if free[r]:
            heapq.heappush(heap, (load[r], prior[r], r))
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
    ``pack_lengths(lengths, config, cost_model, window=window_size).packs`` for a stream
    without empty samples (the feeders skip those; ``pack_lengths`` places them, and a
    fixed ``window_size`` counts them, so the windows differ).

    **Reserve.** With ``even_batches`` and several replicas, the last packs planned (the
    shortest run of them that holds at least ``2 x num_replicas`` tokens and, within
    :data:`RESERVE_PACKS` packs per replica, ``num_replicas - 1`` documents more than packs,
    so that splits at document boundaries can reach the next multiple without a cut) are
    held back until the next window; the order in which packs are dealt is unchanged. The
    end of the pass re-cuts them together with the last window's packs (:meth:`_even_out`),
    so that however small the last window is, the pass's pack count can be made a multiple
    of ``num_replicas``: a pass of ``T >= num_replicas`` tokens always can (with
    ``max_tokens=1`` only when ``T`` is a multiple of it); one that cannot raises
    ``ValueError`` rather than let Accelerate repeat batches.

    Attributes:
        num_batches: packs released so far (the global batch index of the next one).
        loads: pack cost released to each replica so far.
        reserve: packs planned, in dealing order, not yet released.
    """

    def __init__(self, config: PackingConfig, cost_model: CostModel | None, *, window_size: int | None,
                 num_replicas: int, even_batches: bool) -> None:
        self.config = config
        self.cost_model = cost_model if cost_model is not None else default_cost_model()
        self.packer = StreamPacker(config, cost_model, pack_multiple=int(num_replicas))  # the end's short window
        self.window_size = window_size
        self.num_replicas = int(num_replicas)
        self.even_batches = bool(even_batches)
        self.prev_empty = True  # the last window emitted no pack (the next must take a sample)
        self._look = MIN_LOOK  # samples the next window's sizing looks at first (next_window; not state: no effect)
        self.num_batches = 0
        self.loads = [0.0] * self.num_replicas
        self.reserve: list[list[Span]] = []

    @property
    def reserve_tokens(self) -> int:
        """Tokens the reserve holds at least (0: no reserve, one replica or no ``even_batches``)."""
        return 2 * self.num_replicas if self.even_batches and self.num_replicas > 1 else 0

    def effective_lengths(self, lengths: np.ndarray) -> np.ndarray:
        if self.config.overlength == "truncate":
            return np.minimum(lengths, int(self.config.max_tokens))
        return lengths

    def window_count(self, lengths: np.ndarray, pos: int, *, more_coming: bool = False) -> int:
        """New samples for the next window, from the samples ``lengths[pos:]`` (stream order).

        Fixed ``window_size``, or :meth:`StreamPacker.window_size` (token budget, with a
        bound on held-back samples) looking ahead as far as needed, exactly as
        :func:`pack_lengths` does, including its one-window lookahead (a rest of the pass
        smaller than one window joins this window; not with ``more_coming``). May be 0
        when the carry alone fills the window. With ``more_coming`` (a stream whose buffer
        is ``lengths``), a result equal to the buffered count means "read more samples first".
        """
        n = int(lengths.size)
        if self.window_size is not None:
            return max(0, min(self.window_size, n - pos))
        k, self._look = next_window(self.packer, lengths, pos, self._look, lookahead=not more_coming,
                                    prev_empty=self.prev_empty and not (more_coming and pos >= n))
        return k

    def add(self, sample_ids: Sequence[int], lengths: Sequence[int], *, last: bool = False) -> list[list[Span]]:
        """Pack one window; ``last``: the pass ends here (the packer plans it as its last
        window, ``add_window(last=True)``, then flushes).

        Returns:
            the packs released to the DataLoader, in dealing order.

        Raises:
            ValueError: bad ids or lengths (from the packer), or (``last``, ``even_batches``)
                a pass that cannot be dealt to ``num_replicas`` in equal batch counts.
        """
        packs: list[Any] = []
        if len(sample_ids) or not last:
            packs += list(self.packer.add_window(list(sample_ids), list(lengths), last=bool(last)))
            self.prev_empty = not any(len(p) for p in packs)
        if last:
            packs += list(self.packer.flush())
        return self._emit(packs, final=last)

    def _emit(self, packs: Iterable[Iterable[Sequence[int]]], *, final: bool) -> list[list[Span]]:
        packs = [[(int(s[0]), int(s[1]), int(s[2])) for s in p] for p in packs]
        packs = [p for p in packs if p]
        if final:
            packs = self.reserve + packs
            if self.even_batches and self.num_replicas > 1:
                packs = self._even_out(packs)  # raises before anything changes
            self.reserve = []
            return self._release(self._order(packs))
        held = self.reserve + self._order(packs)
        keep, tokens, spare = len(held), 0, 0  # spare: documents over packs (a boundary split each)
        want = self.num_replicas - 1 if self.reserve_tokens else 0
        while keep > 0 and (tokens < self.reserve_tokens or (
                spare < want and len(held) - keep < RESERVE_PACKS * self.num_replicas)):
            keep -= 1
            tokens += _tokens(held[keep])
            spare += len(held[keep]) - 1
        self.reserve = held[keep:]
        return self._release(held[:keep])

    def _order(self, packs: list[list[Span]]) -> list[list[Span]]:
        """``packs`` in dealing order (:func:`replica_order`), placed after the released
        packs and the reserve."""
        R = self.num_replicas
        prior = list(self.loads)
        for k, c in enumerate(self.pack_costs(self.reserve)):
            prior[(self.num_batches + k) % R] += c
        costs = self.pack_costs(packs)
        perm = replica_order(costs, R, first_slot=self.num_batches + len(self.reserve), prior_loads=prior)
        return [packs[i] for i in perm]

    def _release(self, packs: list[list[Span]]) -> list[list[Span]]:
        for k, c in enumerate(self.pack_costs(packs)):
            self.loads[(self.num_batches + k) % self.num_replicas] += c
        self.num_batches += len(packs)
        return packs

    def pack_cost(self, pack: Sequence[Span]) -> float:
        return float(self.cost_model.doc_cost([e - s for _, s, e in pack]).sum())

    def pack_costs(self, packs: Sequence[Sequence[Span]]) -> list[float]:
        """:meth:`pack_cost` of each pack, in one vectorised call."""
        return pack_costs(packs, self.cost_model).tolist() if packs else []

    def _even_out(self, packs: list[list[Span]]) -> list[list[Span]]:
        """Re-cut the pass's last packs (reserve + last window) so that the pass's pack
        count is a multiple of ``num_replicas``; no token is added or lost; a sample that
        fits the cap stays whole wherever a count found allows it (:func:`.even_out.even_out`).

        Raises:
            ValueError: no count of packs makes the pass a multiple of ``num_replicas``.
        """
        return even_out(packs, num_batches=self.num_batches, num_replicas=self.num_replicas, config=self.config,
                        pack_cost=self.pack_cost, pack_costs=self.pack_costs)

    def state_dict(self) -> dict[str, Any]:
        return {"packer": self.packer.state_dict(), "prev_empty": self.prev_empty, "num_batches": self.num_batches,
                "loads": list(self.loads), "reserve": [[list(s) for s in p] for p in self.reserve]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; validates everything first, then changes all or nothing.

        Raises:
            ValueError: a malformed state (names the field), or a packer state the packer refuses.
        """
        parsed = check_planner_state(state, self.num_replicas, int(self.config.max_tokens))
        self.packer.load_state_dict(state["packer"])  # validates fully before changing the packer
        self.prev_empty, self.num_batches, self.loads, self.reserve = parsed


def plan_packs(lengths: Sequence[int], config: PackingConfig, *, order: Sequence[int] | None = None,
               cost_model: CostModel | None = None, window_size: int | None = None, num_replicas: int = 1,
               even_batches: bool = True, progress: Any = None,
               split_fill: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pack a whole pass over samples of known lengths, window by window.

    Args:
        lengths: token count of every sample; zero-length samples are skipped.
        config: the packing configuration.
        order: sample indices in the order they enter windows (default: 0, 1, ...).
        cost_model, window_size, num_replicas, even_batches: see :class:`WFAPBatchSampler`.
        progress: an object with ``update(n)`` (a tqdm bar), advanced by samples planned.
        split_fill: (``strategy="bfd"``, ``overlength="split"`` only) also plan the whole
            pass at once with :func:`~atac_hf.packing.split_fill.plan_split_fill` (whole
            samples best-fit decreasing, overlength samples poured into the room left) and
            keep that plan when it needs fewer packs; its packs are then dealt window by
            window as usual. Only samples longer than the cap are cut either way.

    Returns:
        ``(spans, offsets)``: ``spans`` (num_spans, 3) int64 rows ``(sample, start, end)``;
        pack ``b`` is ``spans[offsets[b]:offsets[b + 1]]``.

    Raises:
        ValueError / TypeError: bad lengths (:func:`~atac_hf.packing.validate.check_lengths`),
            an ``order`` that is not a permutation of the sample indices, ``split_fill`` with
            another strategy or overlength policy, or (``even_batches``) a pass that cannot be
            dealt to ``num_replicas`` in equal batch counts.
    """
    lengths = check_lengths(lengths, "lengths")
    _check_common(config, window_size, num_replicas)
    if not isinstance(split_fill, (bool, np.bool_)):
        raise TypeError(f"split_fill={_short(split_fill)} must be True or False (set split_fill)")
    if split_fill and (config.strategy, config.overlength) != ("bfd", "split"):
        raise ValueError(f"split_fill=True needs strategy='bfd' and overlength='split', got strategy="
                         f"{config.strategy!r}, overlength={config.overlength!r} (set those, or split_fill=False)")
    if order is None:
        order = np.arange(lengths.size)
    else:
        order = check_lengths(order, "order")
        if order.size != lengths.size or not np.array_equal(np.sort(order), np.arange(lengths.size)):
            raise ValueError(f"order={_short(order.tolist())} is invalid: it must be a permutation of the "
                             f"{lengths.size} sample indices 0..{lengths.size - 1} (set order)")
    check_overlength(lengths, range(lengths.size), config)
    check_dealable(lengths, config, int(num_replicas), bool(even_batches))
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
    if split_fill and bool((ordered > config.max_tokens).any()):
        filled = plan_split_fill(ordered, config.max_tokens, config.min_fragment, sample_ids=order)
        dealer = WindowPlanner(config, cost_model, window_size=window_size, num_replicas=num_replicas,
                               even_batches=even_batches)
        P = config.packs_per_window
        filled = [pk for k in range(0, len(filled), P)
                  for pk in dealer._emit(filled[k:k + P], final=k + P >= len(filled))]
        if len(filled) < len(packs):
            packs = filled
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
    """The settings a feeder's fingerprint covers; refuses a cost model the packers cannot use (at
    construction: the samplers and the iterable feeder plan lazily)."""
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel or None, got {type(cost_model).__name__}")
    checked_ref_cost_per_token(config, default_cost_model() if cost_model is None else cost_model)
    return {"config": dataclasses.asdict(config),
            "cost_model": None if cost_model is None else dataclasses.asdict(cost_model), **extra}


def _check_common(config: PackingConfig, window_size: int | None, num_replicas: int) -> None:
    if not isinstance(config, PackingConfig):
        raise TypeError(f"config must be a PackingConfig, got {type(config).__name__}")
    if window_size is not None and (not _is_int(window_size) or not 1 <= window_size <= MAX_LENGTH):
        raise ValueError(f"window_size={_short(window_size)}: must be None (token budget) or an int >= 1 samples "
                         f"(at most {MAX_LENGTH})")
    if not _is_int(num_replicas) or not 1 <= num_replicas <= MAX_PACKS_PER_WINDOW:
        raise ValueError(f"num_replicas={_short(num_replicas)}: must be an int >= 1 (the DP size, at most "
                         f"{MAX_PACKS_PER_WINDOW})")

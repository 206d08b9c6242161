"""Feeders: WFAP packing in front of a DataLoader (map-style and streaming).

* :class:`WFAPBatchSampler` - a batch sampler over a map-style dataset whose sample
  lengths are known. Each batch is one pack: a list of spans ``(sample, start, end)``.
  Wrap the dataset in :class:`SpanDataset` (it slices the fragments) and collate with
  :class:`~atac_hf.packing.collator.PackedDataCollator`::

      sampler = WFAPBatchSampler(lengths, config, num_replicas=dp_size, seed=0)
      loader = DataLoader(SpanDataset(ds), batch_sampler=sampler, collate_fn=PackedDataCollator())

* :class:`PackedIterableDataset` - packs an iterable of ``{"input_ids": ...}`` samples
  window by window and yields packed rows ``{"input_ids", "seq_lengths", "labels"?, "spans"}``.

**Fragments.** A pack may hold a piece ``(sample, start, end)`` of a sample (split at a
pack end, or the kept part of a truncated sample). The sampler always yields spans, also
for whole samples (``(i, 0, len_i)``); :class:`SpanDataset` turns a span into the sliced
sample, which the collator treats as one document (positions restart at 0, first label
-100: the one next-token target across each split is lost, since its context lives in
another row).

**Data parallelism.** Accelerate shards a prepared DataLoader by dealing batches
round-robin (``BatchSamplerShard``, ``split_batches=False``: batch ``b`` goes to DP replica
``b % num_replicas``; for iterable datasets ``IterableDatasetShard`` deals rows the same
way with ``batch_size=1``) and gives every CP rank of a replica the same batches. The
feeders therefore order each window's packs (:func:`replica_order`) so that this deal
hands each replica a share of the window with a balanced sum of pack costs, each replica's
packs heaviest first (so any run of consecutive rounds is balanced too). With
``even_batches`` the final window's packs are split (at document boundaries) until the
epoch's pack count is a multiple of ``num_replicas``, so Accelerate need not repeat
batches to even out the last round. Set ``packs_per_window`` to a multiple of
``num_replicas`` (e.g. DP replicas x gradient-accumulation steps).

**Determinism and resume.** Everything is a pure function of (lengths, config, seed,
epoch): every rank computes the same packs without talking. See the classes for their
``state_dict`` contents.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import warnings
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

from ..cost import CostModel, default_cost_model
from .config import PackingConfig
from .stream import StreamPacker

__all__ = ["PackedIterableDataset", "SpanDataset", "WFAPBatchSampler", "plan_packs", "replica_order"]

Span = tuple[int, int, int]
_SAMPLER_FORMAT = "atac-hf/wfap-batch-sampler/v1"
_STREAM_FORMAT = "atac-hf/packed-iterable/v1"


# ---------------------------------------------------------------------------- planning
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


class _WindowPlanner:
    """A StreamPacker plus window sizing and DP ordering; shared by every feeder.

    Window sizing: ``window_size`` new samples per window, or (``None``) new samples until
    their token supply (:meth:`StreamPacker.supply_tokens`: held-back samples count 0)
    reaches the packer's :attr:`StreamPacker.tokens_wanted` (the window's
    capacity minus the carried tokens it will pack), as :func:`pack_lengths` does, so the
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

    def window_count(self, eff_csum: np.ndarray, pos: int) -> int:
        """New samples for the next window, given the cumulative token supply
        (:meth:`StreamPacker.supply_tokens`) of the samples in order and the position
        ``pos`` of the next one (token-budget windows; may be 0 when the carry alone fills
        the window)."""
        if self.window_size is not None:
            k = self.window_size
        else:
            before = int(eff_csum[pos - 1]) if pos else 0
            k = int(np.searchsorted(eff_csum, before + self.packer.tokens_wanted, side="left")) + 1 - pos
            if k <= 0 and self.prev_empty:
                k = 1
        return max(0, min(k, eff_csum.size - pos))

    def wants_more(self, num_taken: int, tokens_taken: int) -> bool:
        """Streaming form of :meth:`window_count`: should the window take another sample?"""
        if self.window_size is not None:
            return num_taken < self.window_size
        return tokens_taken < self.packer.tokens_wanted or (num_taken == 0 and self.prev_empty)

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
        cap (re-joining adjacent fragments of one sample).
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
                return self._merge_out(packs)
            need -= 1
        return packs

    def _merge_out(self, packs: list[list[Span]]) -> list[list[Span]]:
        excess = (self.num_batches + len(packs)) % self.num_replicas
        tokens = lambda p: sum(e - s for _, s, e in p)  # noqa: E731
        while excess:
            order = sorted(range(len(packs)), key=lambda i: (tokens(packs[i]), i))
            if len(order) < 2 or tokens(packs[order[0]]) + tokens(packs[order[1]]) > self.config.max_tokens:
                warnings.warn(
                    f"even_batches: the pass ends with {self.num_batches + len(packs)} packs, not a multiple "
                    f"of num_replicas={self.num_replicas}, and its last packs can be neither split nor merged; "
                    "Accelerate will even out the last round by repeating batches",
                    stacklevel=4,
                )
                break
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
        self.packer.load_state_dict(state["packer"])
        self.prev_empty = bool(state["prev_empty"])
        self.num_batches = int(state["num_batches"])
        self.loads = [float(x) for x in state["loads"]]


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
    planner = _WindowPlanner(config, cost_model, window_size=window_size, num_replicas=num_replicas,
                             even_batches=even_batches)
    csum = np.cumsum(planner.packer.supply_tokens(lengths[order]))
    packs: list[list[Span]] = []
    p = 0
    while True:
        ids = order[p:p + planner.window_count(csum, p)]
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


# ---------------------------------------------------------------------------- map-style
class WFAPBatchSampler(Sampler[list[Span]]):
    """Batch sampler: each batch is one WFAP pack, as spans ``(sample, start, end)``.

    The epoch's packs are planned on first use (``len``/``iter``) from
    (lengths, config, seed, epoch) and cached: all ranks compute the same list.

    Args:
        lengths: token count of every sample of the dataset (0 = skipped, counted in
            :attr:`num_empty_skipped`).
        config: packing configuration (cap, packs per window, strategy, overlength policy).
        window_size: new samples per window; ``None`` sizes windows by tokens (see module doc).
        num_replicas: DP replicas the prepared DataLoader deals batches to (not counting CP).
        shuffle: shuffle sample order each epoch (seeded by ``(seed, epoch)``).
        seed: shuffle seed; must be the same on every rank.
        cost_model: costs packs for the packer and for DP ordering (default: the package default).
        even_batches: make the epoch's batch count a multiple of ``num_replicas`` (module doc).

    State (``state_dict``, JSON): ``epoch``, ``seed``, ``position`` (batches of the epoch
    already taken), ``num_batches`` and a ``fingerprint`` of lengths + config. Resuming
    re-plans the epoch (deterministic) and continues at ``position``; the packer state of a
    replayed pass is implied by (seed, epoch), so none is stored.
    """

    def __init__(self, lengths: Sequence[int], config: PackingConfig, *, window_size: int | None = None,
                 num_replicas: int = 1, shuffle: bool = True, seed: int = 0,
                 cost_model: CostModel | None = None, even_batches: bool = True) -> None:
        super().__init__()
        _check_common(config, window_size, num_replicas)
        self.lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if (self.lengths < 0).any():
            raise ValueError(f"lengths must be >= 0; got {self.lengths[self.lengths < 0][:5].tolist()}")
        if not (self.lengths > 0).any():
            raise ValueError(f"every one of the {self.lengths.size} samples is empty: nothing to pack")
        if config.overlength == "error" and self.lengths.max() > config.max_tokens:
            i = int(np.argmax(self.lengths > config.max_tokens))
            raise ValueError(
                f"sample {i} has {int(self.lengths[i])} tokens, more than max_tokens={config.max_tokens}, and "
                "overlength='error'; set overlength to 'split' or 'truncate', or raise max_tokens"
            )
        self.config = config
        self.cost_model = cost_model
        self.window_size = window_size
        self.num_replicas = int(num_replicas)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.even_batches = bool(even_batches)
        self.epoch = 0
        self.num_empty_skipped = int((self.lengths == 0).sum())
        self._position = 0
        self._plan: tuple[int, int, np.ndarray, np.ndarray] | None = None  # (seed, epoch, spans, offsets)
        self.fingerprint = _fingerprint(lengths=self.lengths, **_config_parts(
            config, cost_model, window_size=window_size, num_replicas=self.num_replicas,
            shuffle=self.shuffle, even_batches=self.even_batches))

    @classmethod
    def from_dataset(cls, dataset: Any, config: PackingConfig, *, column: str = "input_ids",
                     **kwargs: Any) -> "WFAPBatchSampler":
        """Build from a dataset's token column (``datasets.Dataset`` or any indexable of dicts)."""
        from .dataset import dataset_lengths

        return cls(dataset_lengths(dataset, column=column), config, **kwargs)

    def _epoch_plan(self) -> tuple[np.ndarray, np.ndarray]:
        if self._plan is None or self._plan[:2] != (self.seed, self.epoch):
            n = self.lengths.size
            if self.shuffle:
                order = np.random.default_rng([self.seed, self.epoch]).permutation(n)
            else:
                order = np.arange(n)
            spans, offsets = plan_packs(self.lengths, self.config, order=order, cost_model=self.cost_model,
                                        window_size=self.window_size, num_replicas=self.num_replicas,
                                        even_batches=self.even_batches)
            self._plan = (self.seed, self.epoch, spans, offsets)
        return self._plan[2], self._plan[3]

    def __len__(self) -> int:
        return len(self._epoch_plan()[1]) - 1

    def __iter__(self) -> Iterator[list[Span]]:
        spans, offsets = self._epoch_plan()
        num_batches = len(offsets) - 1
        if self._position >= num_batches:  # a finished pass: start the epoch over
            self._position = 0
        # one live iterator at a time: the position is shared (it is what state_dict saves)
        for b in range(self._position, num_batches):
            batch = [tuple(s) for s in spans[offsets[b]:offsets[b + 1]].tolist()]
            self._position = b + 1
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (shuffle order); a new epoch starts at its first batch.

        Setting the epoch already selected keeps the position (Trainer calls ``set_epoch``
        after a resume).
        """
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self._position = 0

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state.

        Args:
            position: global batches of this epoch the training loop has consumed (all
                replicas together). Default: batches yielded by this sampler's iterator;
                pass it when a prefetching DataLoader (``num_workers > 0``, Accelerate's
                one-batch look-ahead) has drawn batches the loop has not used.
        """
        pos = self._position if position is None else int(position)
        return {"format": _SAMPLER_FORMAT, "epoch": self.epoch, "seed": self.seed, "position": pos,
                "num_batches": len(self), "fingerprint": self.fingerprint}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was taken: same epoch, seed, and the remaining batches.

        Raises:
            ValueError: a state of another format, dataset or configuration, or a bad position.
        """
        if not isinstance(state, Mapping) or state.get("format") != _SAMPLER_FORMAT:
            raise ValueError(f"not a WFAPBatchSampler state (expected format {_SAMPLER_FORMAT!r})")
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"sampler state fingerprint {state.get('fingerprint')!r} != {self.fingerprint!r}: it was saved "
                "for different lengths or settings (config, cost_model, window_size, num_replicas, shuffle, "
                "even_batches); build the sampler exactly as when the state was saved"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        num_batches = len(self)
        pos = int(state["position"])
        if not 0 <= pos <= num_batches:
            raise ValueError(f"sampler state position={pos} outside [0, {num_batches}]")
        self._position = pos


class SpanDataset(Dataset):
    """Map-style view of a dataset indexed by spans ``(sample, start, end)`` or plain ints.

    ``ds[(i, s, e)]`` is sample ``i`` with ``input_ids`` (and ``labels``, when present)
    sliced to ``[s, e)``; ``ds[i]`` is sample ``i`` unchanged. Only the token columns are
    kept. Works over ``datasets.Dataset`` (batched reads) and any indexable of dicts.
    """

    def __init__(self, dataset: Any, *, columns: Sequence[str] = ("input_ids", "labels")) -> None:
        names = getattr(dataset, "column_names", None)
        if names is not None:
            if "input_ids" not in names:
                raise ValueError(f"dataset has no 'input_ids' column; columns: {list(names)}")
            dataset = dataset.select_columns([c for c in columns if c in names])
        self.dataset = dataset
        self.columns = tuple(columns)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Any) -> dict[str, Any]:
        if isinstance(key, (int, np.integer)):
            return self.dataset[int(key)]
        i, s, e = _as_span(key)
        return self._slice(self.dataset[i], s, e)

    def __getitems__(self, keys: Sequence[Any]) -> list[dict[str, Any]]:
        if getattr(self.dataset, "column_names", None) is None:
            return [self[k] for k in keys]
        spans = [(int(k), 0, None) if isinstance(k, (int, np.integer)) else _as_span(k) for k in keys]
        cols = self.dataset[[i for i, _, _ in spans]]
        rows = [{c: cols[c][j] for c in cols} for j in range(len(spans))]
        return [self._slice(row, s, e) for row, (_, s, e) in zip(rows, spans)]

    def _slice(self, row: Mapping[str, Any], start: int, end: int | None) -> dict[str, Any]:
        return {c: row[c][start:end] for c in self.columns if c in row and row[c] is not None}


def _as_span(key: Any) -> tuple[int, int, int]:
    try:
        i, s, e = key
        return int(i), int(s), int(e)
    except (TypeError, ValueError):
        raise TypeError(f"SpanDataset index must be an int or a (sample, start, end) span, got {key!r}") from None


# ---------------------------------------------------------------------------- streaming
class PackedIterableDataset(IterableDataset):
    """Pack an iterable of samples into rows, window by window (streaming WFAP).

    Yields ``{"input_ids": flat, "seq_lengths": [...], "labels": flat?, "spans": [[id, start, end], ...]}``
    where ``id`` is the sample's position in the source stream; ``labels`` appears when a
    sample of the row has labels (others contribute their ``input_ids``). Rows feed
    :class:`~atac_hf.packing.collator.PackedDataCollator` (use ``batch_size=1``).

    Args:
        source: a re-iterable of mappings with ``input_ids`` (``datasets.IterableDataset``,
            a list, a generator factory's output...); it must replay the same order on each
            ``iter()`` for resume to be exact. Empty samples are skipped and counted.
        config, cost_model, window_size, num_replicas, even_batches: as in :class:`WFAPBatchSampler`.

    Resume: ``state_dict()`` records ``consumed`` (source samples read), the packer state,
    the packs of the current window not yet yielded, and the tokens (and labels) of every
    sample not yet fully yielded. ``load_state_dict`` restores them; the next ``iter()``
    re-positions the source by skipping ``consumed`` samples (``datasets.IterableDataset.skip``,
    else reading and discarding them), so no sample is lost or repeated. Iterate it in the
    process that saves the state (``num_workers=0``; with one worker the state lives in the
    worker; more workers are refused). With Accelerate, ``dispatch_batches=False`` (rows differ in length,
    so the dispatcher cannot concatenate them) - each process then packs the stream and
    ``IterableDatasetShard`` deals rows round-robin, as :func:`replica_order` assumes.
    """

    _KEEP_WINDOWS = 2  # window-boundary snapshots kept, to rewind past a prefetching loader

    def __init__(self, source: Iterable[Mapping[str, Any]], config: PackingConfig, *,
                 window_size: int | None = None, num_replicas: int = 1, cost_model: CostModel | None = None,
                 even_batches: bool = True) -> None:
        _check_common(config, window_size, num_replicas)
        self.source = source
        self.config = config
        self.cost_model = cost_model
        self.window_size = window_size
        self.num_replicas = int(num_replicas)
        self.even_batches = bool(even_batches)
        self.fingerprint = _fingerprint(**_config_parts(config, cost_model, window_size=window_size,
                                                        num_replicas=self.num_replicas,
                                                        even_batches=self.even_batches))
        self._reset()

    def _reset(self) -> None:
        self._planner = _WindowPlanner(self.config, self.cost_model, window_size=self.window_size,
                                       num_replicas=self.num_replicas, even_batches=self.even_batches)
        self._st: dict[str, Any] = {"consumed": 0, "exhausted": False, "num_rows": 0, "num_empty_skipped": 0,
                                    "pending": [], "data": {}, "remaining": {}}
        self._snapshots = [self._snapshot()]

    @property
    def num_empty_skipped(self) -> int:
        return int(self._st["num_empty_skipped"])

    def _snapshot(self) -> dict[str, Any]:
        st = self._st
        return {**st, "pending": list(st["pending"]), "data": dict(st["data"]),
                "remaining": dict(st["remaining"]), "planner": self._planner.state_dict()}

    def _open_source(self) -> Iterator[Mapping[str, Any]]:
        n = self._st["consumed"]
        if n and _is_hf_iterable(self.source):
            return iter(self.source.skip(n))
        return itertools.islice(iter(self.source), n, None)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ValueError(
                f"PackedIterableDataset is a sequential, stateful packer; it cannot run in {info.num_workers} "
                "DataLoader workers (set num_workers to 0 or 1)"
            )
        st = self._st
        if st["exhausted"] and not st["pending"]:  # a finished pass: start over
            self._reset()
            st = self._st
        source = None if st["exhausted"] else self._open_source()
        while True:
            while st["pending"]:
                row = _take_row(st)
                yield row
            if st["exhausted"]:
                return
            ids, lengths = [], []
            tokens = 0
            while self._planner.wants_more(len(ids), tokens):
                try:
                    sample = next(source)
                except StopIteration:
                    st["exhausted"] = True
                    break
                sid = st["consumed"]
                st["consumed"] += 1
                ids_, labels = _sample_tokens(sample, sid)
                if not ids_:
                    st["num_empty_skipped"] += 1
                    continue
                st["data"][sid] = {"input_ids": ids_, "labels": labels}
                st["remaining"][sid] = int(self._planner.effective_lengths(np.int64(len(ids_))))
                ids.append(sid)
                lengths.append(len(ids_))
                tokens += int(self._planner.packer.supply_tokens([len(ids_)])[0])
            packs = self._planner.add(ids, lengths, last=st["exhausted"])
            st["pending"] = [[list(s) for s in p] for p in packs]
            self._snapshots = (self._snapshots + [self._snapshot()])[-self._KEEP_WINDOWS:]

    def state_dict(self, num_rows: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state after ``num_rows`` rows (default: rows yielded so far).

        Pass ``num_rows`` (rows the training loop consumed) when a prefetching loader has
        drawn rows the loop has not used; it may lie up to one window back.

        Raises:
            ValueError: ``num_rows`` outside the rows this object can rewind to.
        """
        k = self._st["num_rows"] if num_rows is None else int(num_rows)
        base = next((s for s in reversed(self._snapshots) if s["num_rows"] <= k), None)
        if base is None or k > base["num_rows"] + len(base["pending"]):
            lo = self._snapshots[0]["num_rows"]
            raise ValueError(f"num_rows={k}: can only take the state at rows {lo}..{self._st['num_rows']}")
        st = {**base, "pending": list(base["pending"]), "data": dict(base["data"]),
              "remaining": dict(base["remaining"])}
        for _ in range(k - base["num_rows"]):
            _take_row(st)
        st["data"] = [[sid, d["input_ids"], d["labels"]] for sid, d in st["data"].items()]
        st["remaining"] = [[sid, n] for sid, n in st["remaining"].items()]
        return {"format": _STREAM_FORMAT, "fingerprint": self.fingerprint, **st}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`; the next ``iter()`` continues from it.

        Raises:
            ValueError: a state of another format or packing configuration.
        """
        if not isinstance(state, Mapping) or state.get("format") != _STREAM_FORMAT:
            raise ValueError(f"not a PackedIterableDataset state (expected format {_STREAM_FORMAT!r})")
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"stream state fingerprint {state.get('fingerprint')!r} != {self.fingerprint!r}: it was saved with "
                "different settings (config, cost_model, window_size, num_replicas, even_batches)"
            )
        self._planner.load_state_dict(state["planner"])
        self._st = {
            "consumed": int(state["consumed"]), "exhausted": bool(state["exhausted"]),
            "num_rows": int(state["num_rows"]), "num_empty_skipped": int(state["num_empty_skipped"]),
            "pending": [[list(s) for s in p] for p in state["pending"]],
            "data": {int(sid): {"input_ids": list(ids), "labels": None if lab is None else list(lab)}
                     for sid, ids, lab in state["data"]},
            "remaining": {int(sid): int(n) for sid, n in state["remaining"]},
        }
        self._snapshots = [self._snapshot()]


def _is_hf_iterable(source: Any) -> bool:
    try:
        from datasets import IterableDataset as HFIterableDataset
    except ImportError:  # pragma: no cover - datasets is a dependency
        return False
    return isinstance(source, HFIterableDataset)


def _sample_tokens(sample: Any, sid: int) -> tuple[list[int], list[int] | None]:
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        found = sorted(sample) if isinstance(sample, Mapping) else type(sample).__name__
        raise ValueError(
            f"source sample {sid} has no 'input_ids'; found: {found} "
            "(tokenize the text, or rename the token column to 'input_ids')"
        )
    ids = _to_list(sample["input_ids"])
    labels = sample.get("labels")
    labels = None if labels is None else _to_list(labels)
    if labels is not None and len(labels) != len(ids):
        raise ValueError(f"source sample {sid}: labels has {len(labels)} entries but input_ids has {len(ids)}")
    return ids, labels


def _to_list(x: Any) -> list[int]:
    if hasattr(x, "tolist"):
        x = x.tolist()
    return [int(v) for v in x]


def _take_row(st: dict[str, Any]) -> dict[str, Any]:
    """Pop the next pending pack of ``st`` and build its row; free samples fully yielded."""
    pack = st["pending"].pop(0)
    ids: list[int] = []
    labels: list[int] = []
    has_labels = False
    for sid, s, e in pack:
        d = st["data"][sid]
        ids += d["input_ids"][s:e]
        if d["labels"] is not None:
            has_labels = True
            labels += d["labels"][s:e]
        else:
            labels += d["input_ids"][s:e]
    row = {"input_ids": ids, "seq_lengths": [e - s for _, s, e in pack]}
    if has_labels:
        row["labels"] = labels
    row["spans"] = [list(span) for span in pack]
    for sid, s, e in pack:
        st["remaining"][sid] -= e - s
        if st["remaining"][sid] <= 0:
            del st["remaining"][sid]
            del st["data"][sid]
    st["num_rows"] += 1
    return row

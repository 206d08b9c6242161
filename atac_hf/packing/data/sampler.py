"""Feeders: WFAP packing in front of a DataLoader.

* :class:`WFAPBatchSampler` - a batch sampler over a map-style dataset whose sample
  lengths are known. Each batch is one pack: a list of spans ``(sample, start, end)``.
  Wrap the dataset in :class:`SpanDataset` (it slices the fragments) and collate with
  :class:`~atac_hf.packing.data.collator.PackedDataCollator`::

      sampler = WFAPBatchSampler(lengths, config, num_replicas=dp_size, seed=0)
      loader = DataLoader(SpanDataset(ds), batch_sampler=sampler, collate_fn=PackedDataCollator())

* :class:`~atac_hf.packing.data.iterable.PackedIterableDataset` (re-exported here) - packs an
  iterable of ``{"input_ids": ...}`` samples window by window and yields packed rows.

**Fragments.** A pack may hold a piece ``(sample, start, end)`` of a sample (split at a
pack end, or the kept part of a truncated sample). The sampler always yields spans, also
for whole samples (``(i, 0, len_i)``); :class:`SpanDataset` turns a span into the sliced
sample, which the collator treats as one document (positions restart at 0, first label
-100: the one next-token target across each split is lost, since its context lives in
another row).

**Data parallelism** (``num_replicas``, ``even_batches``) and window sizing: see
:mod:`atac_hf.packing.data.window_planner`. The batches are ordered for Accelerate's round-robin deal
of a prepared DataLoader's batches to DP replicas.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
from torch.utils.data import Dataset, Sampler

from ...cost import CostModel
from ..config import PackingConfig
from ..validate import (InputTypeError, _is_int, _short, check_dealable, check_lengths, check_overlength, check_seed,
                        one_row, state_int)
from .window_planner import Span, _check_common, _config_parts, _fingerprint
from .window_planner import plan_packs, replica_order
from .iterable import PackedIterableDataset
from .ranks import first_rank_warnings, is_first_rank

__all__ = ["PackedIterableDataset", "SpanDataset", "WFAPBatchSampler", "plan_packs", "replica_order"]

_SAMPLER_FORMAT = "atac-hf/wfap-batch-sampler/v1"
#: Samples from which an epoch's planning shows a progress bar by default (about 2 s of planning).
PROGRESS_MIN_SAMPLES = 100_000


class WFAPBatchSampler(Sampler[list[Span]]):
    """Batch sampler: each batch is one WFAP pack, as spans ``(sample, start, end)``.

    The epoch's packs are planned on first use (``len``/``iter``) from
    (lengths, config, seed, epoch) and cached: all ranks compute the same list.

    Args:
        lengths: token count of every sample of the dataset (0 = skipped, counted in
            :attr:`num_empty_skipped`).
        config: packing configuration (cap, packs per window, strategy, overlength policy).
        window_size: new samples per window; ``None`` sizes windows by tokens
            (:class:`~atac_hf.packing.data.window_planner.WindowPlanner`).
        num_replicas: DP replicas the prepared DataLoader deals batches to (not counting CP).
        shuffle: shuffle sample order each epoch (seeded by ``(seed, epoch)``).
        seed: shuffle seed; must be the same on every rank.
        cost_model: costs packs for the packer and for DP ordering (default: the package default).
        even_batches: make the epoch's batch count a multiple of ``num_replicas``
            (:mod:`atac_hf.packing.data.even_out`), so that Accelerate never repeats a batch;
            a sample that fits is cut only where no count keeps the last documents whole
            (a ``SampleCutWarning`` names it).
        progress: a progress bar while an epoch is planned: ``True`` always, ``False``
            never, ``None`` (default) where the epoch has at least
            :data:`PROGRESS_MIN_SAMPLES` samples (about 2 s of planning), on the main
            process only (rank 0 where ``torch.distributed`` is initialized).
        fixed_epoch_length: every epoch has as many batches as epoch 0 (``Trainer`` sizes every
            epoch by the first one's ``len``): an epoch whose own packing comes out with another
            count trains epoch 0's packs instead, whole windows in a new seeded order (every
            token still once per epoch). Default False: every epoch is packed afresh.

    State (``state_dict``, JSON): ``epoch``, ``seed``, ``position`` (batches of the epoch
    already taken), ``num_batches`` and a ``fingerprint`` of lengths + config. Resuming
    re-plans the epoch (deterministic) and continues at ``position``; the packer state of a
    replayed pass is implied by (seed, epoch), so none is stored.

    Raises:
        TypeError / ValueError: malformed lengths (:func:`~atac_hf.packing.validate.check_lengths`),
            a bad seed, flag, ``window_size`` or ``num_replicas``, every sample empty, a sample
            over the cap with ``overlength="error"`` (or split into too many fragments), or
            (``even_batches``) a pass that cannot be dealt to ``num_replicas`` in equal batch
            counts: fewer kept tokens than replicas, or with ``max_tokens=1`` a token count
            that is not a multiple of them.
    """

    def __init__(self, lengths: Sequence[int], config: PackingConfig, *, window_size: int | None = None,
                 num_replicas: int = 1, shuffle: bool = True, seed: int = 0,
                 cost_model: CostModel | None = None, even_batches: bool = True, progress: bool | None = None,
                 fixed_epoch_length: bool = False) -> None:
        super().__init__()
        _check_common(config, window_size, num_replicas)
        lengths = check_lengths(lengths, "lengths")
        for name, flag in (("shuffle", shuffle), ("even_batches", even_batches),
                           ("fixed_epoch_length", fixed_epoch_length)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name}={flag!r} must be True or False (set {name})")
        if progress is not None and not isinstance(progress, (bool, np.bool_)):
            raise TypeError(f"progress={_short(progress)} must be True, False or None (set progress)")
        seed = check_seed(seed, "seed")
        if lengths.size == 0:
            raise ValueError("the dataset has 0 samples (empty, or a filter kept none): nothing to pack; "
                             "pass a dataset with at least one non-empty sample")
        if not (lengths > 0).any():
            raise ValueError(f"every one of the {lengths.size} samples is empty: nothing to pack")
        check_overlength(lengths, range(lengths.size), config)
        check_dealable(lengths, config, int(num_replicas), bool(even_batches))
        self.lengths = lengths
        self.config = config
        self.cost_model = cost_model
        self.window_size = None if window_size is None else int(window_size)
        self.num_replicas = int(num_replicas)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.even_batches = bool(even_batches)
        self.progress = None if progress is None else bool(progress)
        self.epoch = 0
        self.num_empty_skipped = int((self.lengths == 0).sum())
        self._position = 0
        self._resumed = False  # set by load_state_dict: the next pass continues at _position, even at the end
        self._plan: tuple[int, int, np.ndarray, np.ndarray] | None = None  # (seed, epoch, spans, offsets)
        self.fixed_epoch_length = bool(fixed_epoch_length)
        self._first: tuple[int, np.ndarray, np.ndarray] | None = None  # (seed, spans, offsets) of epoch 0
        self._loaders: list[weakref.ref] = []  # prepared loaders whose epoch counter follows this sampler's
        extra = {"fixed_epoch_length": True} if self.fixed_epoch_length else {}  # older states keep their print
        self.fingerprint = _fingerprint(lengths=self.lengths, **_config_parts(
            config, cost_model, window_size=self.window_size, num_replicas=self.num_replicas,
            shuffle=self.shuffle, even_batches=self.even_batches, **extra))

    @classmethod
    def from_dataset(cls, dataset: Any, config: PackingConfig, *, column: str = "input_ids",
                     **kwargs: Any) -> "WFAPBatchSampler":
        """Build from a dataset's token column (``datasets.Dataset`` or any indexable of dicts)."""
        from .dataset import dataset_lengths

        return cls(dataset_lengths(dataset, column=column), config, **kwargs)

    def _epoch_plan(self, seed: int | None = None, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The packs of epoch ``(seed, epoch)`` (default: the sampler's own), cached."""
        seed = self.seed if seed is None else seed
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan[:2] != (seed, epoch):
            spans, offsets = self._pack(seed, epoch)
            if self.fixed_epoch_length and epoch > 0:
                if self._first is None or self._first[0] != seed:
                    self._first = (seed, *self._pack(seed, 0))
                if len(offsets) != len(self._first[2]):
                    spans, offsets = self._reorder_windows(*self._first[1:], np.random.default_rng([seed, epoch, 1]))
            elif self.fixed_epoch_length:
                self._first = (seed, spans, offsets)
            self._plan = (seed, epoch, spans, offsets)
        return self._plan[2], self._plan[3]

    def _pack(self, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The packs of epoch ``(seed, epoch)`` packed afresh: (spans, batch offsets)."""
        n = self.lengths.size
        order = np.random.default_rng([seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        from tqdm.auto import tqdm

        with tqdm(total=int((self.lengths > 0).sum()), desc=f"Planning WFAP packs (epoch {epoch})",
                  unit="samples", disable=not self._show_progress(n)) as bar, first_rank_warnings():
            return plan_packs(self.lengths, self.config, order=order, cost_model=self.cost_model,
                              window_size=self.window_size, num_replicas=self.num_replicas,
                              even_batches=self.even_batches, progress=bar)

    def _reorder_windows(self, spans: np.ndarray, offsets: np.ndarray, rng: np.random.Generator):
        """The batches ``(spans, offsets)`` with their full windows (``packs_per_window`` batches,
        dealt to the DP replicas together) in an order drawn by ``rng`` (kept without shuffle); a
        last partial window stays last."""
        n, w = len(offsets) - 1, int(self.config.packs_per_window)
        full = n // w
        windows = rng.permutation(full) if self.shuffle else np.arange(full)
        order = np.concatenate([(windows[:, None] * w + np.arange(w)).reshape(-1), np.arange(full * w, n)])
        sizes = np.diff(offsets)[order]
        new_offsets = np.zeros(n + 1, dtype=offsets.dtype)
        np.cumsum(sizes, out=new_offsets[1:])
        index = np.concatenate([np.arange(offsets[b], offsets[b + 1]) for b in order.tolist()] or [np.zeros(0, int)])
        return spans[index], new_offsets

    def _show_progress(self, num_samples: int) -> bool:
        if self.progress is not None:
            return self.progress
        return num_samples >= PROGRESS_MIN_SAMPLES and is_first_rank()

    def __len__(self) -> int:
        return len(self._epoch_plan()[1]) - 1

    def __iter__(self) -> Iterator[list[Span]]:
        spans, offsets = self._epoch_plan()
        num_batches = len(offsets) - 1
        resumed, self._resumed = self._resumed, False
        if self._position >= num_batches and not resumed:  # a finished pass: start the epoch over
            self._position = 0  # (but a state saved at the end of the epoch resumes with nothing left)
        # one live iterator at a time: the position is shared (it is what state_dict saves)
        for b in range(self._position, num_batches):
            batch = [tuple(s) for s in spans[offsets[b]:offsets[b + 1]].tolist()]
            self._position = b + 1
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (shuffle order); a new epoch starts at its first batch.

        Setting the epoch already selected keeps the position (Trainer calls ``set_epoch``
        after a resume).

        Raises:
            ValueError: ``epoch`` is not an int in ``[0, 2**63)`` (nothing changes then).
        """
        epoch = check_seed(epoch, "epoch")
        if epoch != self.epoch:
            self.epoch = epoch
            self._position = 0
        self._step_loaders()

    def keep_in_step(self, loader: Any) -> None:
        """Keep ``loader``'s epoch counter at this sampler's epoch. Accelerate's prepared loader
        (``DataLoaderShard``) calls ``set_epoch(loader.iteration)`` at the start of every pass and,
        with one DP replica, that reaches this sampler: a fresh loader would send epoch 0 after a
        resume into a later epoch. :meth:`set_epoch` and :meth:`load_state_dict` set the counter
        of every loader kept in step (``ATACAccelerator.packed_dataloader`` does this)."""
        self._loaders.append(weakref.ref(loader))
        self._step_loaders()

    def _step_loaders(self) -> None:
        for ref in self._loaders:
            loader = ref()
            if loader is not None and hasattr(loader, "iteration"):
                loader.iteration = self.epoch

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state.

        Args:
            position: global batches of this epoch the training loop has consumed (all
                replicas together). Default: batches yielded by this sampler's iterator;
                pass it when a prefetching DataLoader (``num_workers > 0``, Accelerate's
                one-batch look-ahead) has drawn batches the loop has not used.
        """
        if position is None:
            pos = self._position
        else:
            num_batches = len(self)
            if not _is_int(position) or not 0 <= position <= num_batches:
                raise ValueError(f"position={position!r} is invalid: it must be an int in [0, {num_batches}] "
                                 "(global batches of this epoch consumed, all replicas together)")
            pos = int(position)
        return {"format": _SAMPLER_FORMAT, "epoch": self.epoch, "seed": self.seed, "position": pos,
                "num_batches": len(self), "fingerprint": self.fingerprint}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was taken: same epoch, seed, and the remaining batches
        (none when it was taken at the end of the epoch: call ``set_epoch`` for the next).

        Everything is checked first; a refused state changes nothing.

        Raises:
            ValueError: a state of another format, dataset or configuration, a missing or
                non-integer seed/epoch/position/num_batches, a negative seed or epoch, a
                position outside the epoch, or a batch count the epoch's plan does not have.
        """
        what = "WFAPBatchSampler"
        if not isinstance(state, Mapping) or state.get("format") != _SAMPLER_FORMAT:
            found = f"format {_short(state.get('format'))}" if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"not a WFAPBatchSampler state (expected format {_SAMPLER_FORMAT!r}, got {found}); pass "
                             "the dict WFAPBatchSampler.state_dict() returned")
        if state.get("fingerprint") != self.fingerprint:
            c = self.config
            raise ValueError(
                f"sampler state fingerprint {_short(state.get('fingerprint'))} != {self.fingerprint!r}: it was saved "
                "for different lengths or settings (config, cost_model, window_size, num_replicas, shuffle, "
                "even_batches); build the sampler exactly as when the state was saved (this sampler: "
                f"{self.lengths.size} samples of {int(self.lengths.sum())} tokens, max_tokens={c.max_tokens}, "
                f"packs_per_window={c.packs_per_window} (ATACTrainer / ATACAccelerator: DP replicas x gradient "
                f"accumulation, in whole steps of at least min_window_packs), strategy={c.strategy!r}, "
                f"num_replicas={self.num_replicas} (the DP size), window_size={self.window_size}, "
                f"shuffle={self.shuffle}, even_batches={self.even_batches})")
        seed = state_int(state, "seed", what, 0, 2**63 - 1)
        epoch = state_int(state, "epoch", what, 0, 2**63 - 1)
        pos = state_int(state, "position", what, 0)
        saved_batches = state_int(state, "num_batches", what, 0)
        num_batches = len(self._epoch_plan(seed, epoch)[1]) - 1
        if saved_batches != num_batches:
            raise ValueError(f"malformed {what} state: 'num_batches' = {saved_batches}, but epoch {epoch} with seed "
                             f"{seed} plans {num_batches} batches (a truncated or edited checkpoint?)")
        if pos > num_batches:
            raise ValueError(f"sampler state position={pos} outside [0, {num_batches}] (the epoch's batches): "
                             "a truncated or edited checkpoint?")
        self.seed, self.epoch, self._position, self._resumed = seed, epoch, pos, True
        self._step_loaders()


#: the per-token columns :class:`SpanDataset` keeps and slices by default: everything
#: :class:`~atac_hf.packing.data.collator.PackedDataCollator` reads or checks.
TOKEN_COLUMNS = ("input_ids", "labels", "attention_mask", "completion_mask", "assistant_masks", "position_ids")


class SpanDataset(Dataset):
    """Map-style view of a dataset indexed by spans ``(sample, start, end)`` or plain ints.

    ``ds[(i, s, e)]`` is sample ``i`` with its per-token columns sliced to ``[s, e)``;
    ``ds[i]`` is sample ``i`` unchanged. Only the per-token ``columns`` are kept (default
    :data:`TOKEN_COLUMNS`: ``input_ids``, ``labels`` and the columns the collator checks or
    reads, ``attention_mask``, ``completion_mask``, ``assistant_masks``, ``position_ids``;
    dropping them would train on padding, on prompt tokens or across documents silently).
    Works over ``datasets.Dataset`` (batched reads) and any indexable of dicts.

    Raises:
        InputTypeError: ``columns`` not a sequence of names (a str is one name: ``("input_ids",)``).
        ValueError: ``columns`` without ``input_ids`` or naming a column the dataset lacks; a span
            ``(i, s, e)`` with ``e`` past sample ``i``'s tokens.
        IndexError: a sample id outside ``[0, len(dataset))`` (a negative id does not wrap).
    """

    def __init__(self, dataset: Any, *, columns: Sequence[str] = TOKEN_COLUMNS) -> None:
        if isinstance(columns, (str, bytes, Mapping)) or not hasattr(columns, "__iter__") \
                or not all(isinstance(c, str) for c in tuple(columns)):
            raise InputTypeError(f"SpanDataset: columns={_short(columns)} must be a sequence of column names, e.g. "
                                 "('input_ids', 'labels') (one name is ('input_ids',); set columns)")
        columns = tuple(columns)
        if "input_ids" not in columns:
            raise ValueError(f"SpanDataset: columns={_short(columns)} must include 'input_ids' (the token ids every "
                             f"span slices); default: {list(TOKEN_COLUMNS)} (set columns)")
        names = getattr(dataset, "column_names", None)
        if names is not None:
            if "input_ids" not in names:
                raise ValueError(f"dataset has no 'input_ids' column; columns: {list(names)}")
            unknown = [c for c in columns if c not in names and c not in TOKEN_COLUMNS]
            if unknown:
                raise ValueError(f"SpanDataset: columns {unknown} are not columns of the dataset; its columns: "
                                 f"{list(names)} (set columns)")
            dataset = dataset.select_columns([c for c in columns if c in names])
        self.dataset = dataset
        self.columns = columns
        # columns other than the optional token ones: every row must have them
        self._needed = tuple(c for c in columns if c == "input_ids" or c not in TOKEN_COLUMNS)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Any) -> dict[str, Any]:
        i, s, e = self._key(key, self._size())
        return self.dataset[i] if e is None else self._slice(self.dataset[i], key, s, e)

    def __getitems__(self, keys: Sequence[Any]) -> list[dict[str, Any]]:
        n = self._size()
        spans = [self._key(k, n) for k in keys]
        if getattr(self.dataset, "column_names", None) is None:
            fetch = getattr(self.dataset, "__getitems__", None)
            if fetch is None:
                return [self.dataset[i] if e is None else self._slice(self.dataset[i], k, s, e)
                        for k, (i, s, e) in zip(keys, spans)]
            # the source reads a batch at once (e.g. documents of pre-packed rows: each row read once)
            got = fetch([i for i, _, _ in spans])
            return [row if e is None else self._slice(row, k, s, e) for row, k, (_, s, e) in zip(got, keys, spans)]
        cols = self.dataset[[i for i, _, _ in spans]]
        if hasattr(cols, "to_pydict"):  # a datasets.Dataset in "arrow" format reads a pyarrow.Table
            cols = cols.to_pydict()
        rows = [{c: cols[c][j] for c in cols} for j in range(len(spans))]
        return [self._slice(row, k, s, e) for row, k, (_, s, e) in zip(rows, keys, spans)]

    def _size(self) -> int | None:
        return len(self.dataset) if hasattr(self.dataset, "__len__") else None

    @staticmethod
    def _key(key: Any, n: int | None) -> tuple[int, int, int | None]:
        """``(sample, start, end)`` of an index (``end`` None: a whole sample, an int index)."""
        i, s, e = (int(key), 0, None) if _is_int(key) else _as_span(key)
        if i < 0 or n is not None and i >= n:
            legal = "ids >= 0" if n is None else f"ids 0..{n - 1}" if n else "none (the dataset is empty)"
            raise IndexError(f"SpanDataset: sample {i} (index {_short(key)}) is out of range: legal sample {legal} "
                             "(a negative id does not count from the end)")
        return i, s, e

    def _slice(self, row: Mapping[str, Any], key: Any, start: int, end: int | None) -> dict[str, Any]:
        for c in self._needed:
            if c not in row or row[c] is None:
                raise ValueError(f"SpanDataset[{_short(key)}]: the sample has no {c!r} column; its columns: "
                                 f"{list(row)} (set columns)")
        ids = row["input_ids"]
        n = end if end is None else (ids.shape[1] if hasattr(ids, "shape") else len(ids[0])) if one_row(ids) \
            else len(ids)
        if end is not None and end > n:
            raise ValueError(f"SpanDataset span {_short(key)} ends past the sample's {n} tokens: spans must have "
                             "0 <= start <= end <= the sample's length")
        # a (1, n) row is cut along its tokens and stays one row (the collator flattens it)
        return {c: ([row[c][0][start:end]] if isinstance(row[c], (list, tuple)) else row[c][:, start:end])
                if one_row(row[c]) else row[c][start:end] for c in self.columns if c in row and row[c] is not None}


def _as_span(key: Any) -> tuple[int, int, int]:
    try:
        i, s, e = key
    except (TypeError, ValueError):
        raise TypeError(f"SpanDataset index must be an int or a (sample, start, end) span, got {_short(key)}") from None
    if not all(_is_int(x) for x in (i, s, e)):
        raise TypeError(f"SpanDataset index must be an int or a (sample, start, end) span of ints, got {_short(key)}")
    if not 0 <= s <= e:
        raise ValueError(f"SpanDataset span {_short(key)} must have 0 <= start <= end")
    return int(i), int(s), int(e)

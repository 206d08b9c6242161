"""The WFAP feeder in front of a DataLoader: checks, sampler, collator.

One batch = one pack = one packed row of at most ``config.max_tokens`` tokens. The sampler
deals packs the way Accelerate's ``BatchSamplerShard`` hands batch ``b`` to DP replica
``b % num_replicas``, and every CP rank of a replica receives the same batches.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from .config import ATACConfig

__all__ = ["REQUIRED_COLUMNS", "PackedRowDocuments", "build_packed_dataloader", "check_collator", "check_dataset_columns"]

REQUIRED_COLUMNS = ("input_ids",)


def is_streaming_dataset(dataset: Any) -> bool:
    """A torch ``IterableDataset``, a ``datasets.IterableDataset`` or any iterable without
    ``__getitem__``: fed through the streaming packer (:func:`build_streaming_dataloader`)."""
    if isinstance(dataset, IterableDataset):
        return True
    try:
        import datasets

        if isinstance(dataset, datasets.IterableDataset):
            return True
    except ImportError:  # pragma: no cover - datasets is a dependency
        pass
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def check_dataset_columns(dataset: Any, *, name: str = "dataset", streaming: bool = False) -> None:
    """Refuse a dataset the feeder cannot pack.

    Needs a map-style dataset (``datasets.Dataset`` or any indexable of dicts) with an
    ``input_ids`` column of token ids; ``labels`` is optional (default: the tokens). With
    ``streaming=True`` an iterable dataset is accepted too (its columns are checked when it
    declares them, as a ``datasets.IterableDataset`` with features does; otherwise sample
    by sample while packing).

    Raises:
        ValueError: a ``DatasetDict`` (names its splits), an iterable dataset (unless
            ``streaming``), a stream of pre-packed rows (a ``seq_lengths`` column: their documents
            would attend to each other), or a missing ``input_ids`` column (lists the columns found).
    """
    splits = _splits_of(dataset)
    if splits is not None:
        raise ValueError(f"{name} is a {type(dataset).__name__} of splits {splits}, not one dataset: pass one split, "
                         f"e.g. {name}[{splits[0]!r}]" if splits else f"{name} is an empty {type(dataset).__name__}")
    if is_streaming_dataset(dataset):
        if streaming:
            names = getattr(dataset, "column_names", None)
            if names is not None:
                _check_names(names, name, packed_ok=False)
            return
        raise ValueError(f"{name} is an iterable dataset: the WFAP sampler needs a map-style dataset whose sample "
                         "lengths are known up front (datasets.Dataset, or a list of dicts with 'input_ids')")
    names = getattr(dataset, "column_names", None)
    if names is None:
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty")
        first = dataset[0]
        names = list(first) if hasattr(first, "keys") else [type(first).__name__]
    _check_names(names, name)


def _splits_of(dataset: Any) -> list | None:
    """The split names of a ``datasets.DatasetDict`` / ``IterableDatasetDict``, else None."""
    kind = type(dataset).__name__
    if kind in ("DatasetDict", "IterableDatasetDict") and isinstance(dataset, dict):
        return [str(k) for k in dataset]
    return None


def _check_names(names: Any, name: str, *, packed_ok: bool = True) -> None:
    if "seq_lengths" in names and not packed_ok:
        raise ValueError(
            f"{name} is a stream of pre-packed rows (a 'seq_lengths' column, e.g. from TRL's or atac-hf's "
            "pack_dataset): the streaming packer would treat each row as one document, so the documents of a row "
            "would attend to each other. Pass the unpacked stream, or the packed rows as a map-style dataset "
            "(their documents are then packed again, each kept whole)")
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ValueError(
            f"{name} has no {missing} column; columns found: {list(names)}. Tokenize it first, e.g. "
            "dataset.map(lambda b: tokenizer(b['text']), batched=True), or rename the token column to 'input_ids'"
        )


_COLLATOR_CONTRACT = (
    "a collator for ATACTrainer must turn a list of samples into ONE padding-free packed row: 'input_ids' (1, S), "
    "'labels' (1, S) and 'position_ids' (1, S) restarting at 0 for every sample (or 'seq_lengths' / "
    "'cu_seq_lens_q' giving the document lengths), no padding. Leave data_collator unset (the default "
    "PackedDataCollator) or use transformers' DataCollatorWithFlattening()"
)


def check_collator(collator: Callable, dataset: Any, *, max_tokens: int, name: str = "data_collator") -> None:
    """Dry-run ``collator`` on the first two samples of ``dataset``, as the WFAP sampler hands them.

    ATP-CP needs each batch as one packed row whose documents it can find; a padding
    collator (e.g. ``DataCollatorForLanguageModeling``) would otherwise fail much later, deep
    inside sharding. Samples are cut to ``max_tokens // 2`` tokens, as packing would.

    Raises:
        ValueError: the collator raises on the samples, returns no mapping, no ``input_ids`` or
            no ``labels``, pads, or returns rows whose documents cannot be found or do not
            keep each sample its own document (naming the collator and what it must emit).
    """
    from ..attention import doc_lengths_from_batch
    from ..packing.data.sampler import SpanDataset

    if len(dataset) == 0:
        return
    label = f"{name}={getattr(collator, '__qualname__', None) or type(collator).__name__}"
    view = SpanDataset(dataset)
    cut = max(1, int(max_tokens) // 2)
    features = []
    for i in range(min(2, len(view))):
        n = len(view[i]["input_ids"])
        features.append(view[(i, 0, min(n, cut))] if n else view[i])
    want = [len(f["input_ids"]) for f in features if len(f["input_ids"])]
    try:
        batch = collator(features)
    except Exception as e:  # the collator's own error, with what it was asked to do
        raise ValueError(f"{label} raised {type(e).__name__}: {e} on two samples of the training data; "
                         f"{_COLLATOR_CONTRACT}") from e
    if not hasattr(batch, "keys") or "input_ids" not in batch:
        keys = sorted(batch.keys()) if hasattr(batch, "keys") else type(batch).__name__
        raise ValueError(f"{label} returned {keys} (no 'input_ids'); {_COLLATOR_CONTRACT}")
    if batch.get("labels") is None and batch.get("shift_labels") is None:
        raise ValueError(f"{label} returned no 'labels' (keys {sorted(batch.keys())}); {_COLLATOR_CONTRACT}")
    mask = batch.get("attention_mask")
    if mask is not None and not bool(np.asarray(mask).astype(bool).all()):
        raise ValueError(f"{label} pads its rows (attention_mask has zeros); {_COLLATOR_CONTRACT}")
    try:
        found = [int(x) for x in doc_lengths_from_batch(batch)]
    except ValueError as e:
        raise ValueError(f"{label}: {e} (keys {sorted(batch.keys())}); {_COLLATOR_CONTRACT}") from None
    if len(found) != len(want):  # e.g. samples concatenated into one document: they would attend to each other
        raise ValueError(f"{label} gave {len(found)} document(s) of {found} tokens for {len(want)} samples of {want} "
                         f"tokens (each sample must stay its own document); {_COLLATOR_CONTRACT}")


def build_packed_dataloader(dataset: Any, config: ATACConfig, *, num_replicas: int = 1, grad_accum: int = 1,
                            seed: int = 0, shuffle: bool | None = None, cost_model: Any = None,
                            collate_fn: Callable | None = None, even_batches: bool = True,
                            progress: bool | None = None, fixed_epoch_length: bool = False, **loader_kwargs: Any):
    """A DataLoader whose batches are WFAP packs (one packed row each), and its sampler.

    Args:
        dataset: map-style dataset with ``input_ids`` (and optional ``labels``).
        config: the run's :class:`ATACConfig` (cap, packing strategy and options, window).
        num_replicas: DP replicas (world size // cp_size) the prepared loader deals batches to.
        grad_accum: micro-batches per optimizer step; one window = ``num_replicas x grad_accum`` packs.
        seed: shuffle seed (identical on every rank).
        shuffle: default ``config.shuffle``.
        cost_model: the packer's cost model.
        collate_fn: default :class:`~atac_hf.packing.PackedDataCollator`.
        even_batches: make the batch count a multiple of ``num_replicas``.
        progress: the sampler's progress bar while an epoch is planned (``None``: on rank 0 for
            large datasets; see :class:`~atac_hf.packing.WFAPBatchSampler`).
        fixed_epoch_length: every epoch as many batches as the first (what ``Trainer``, which
            sizes epochs by the first ``len``, needs; see the sampler).
        **loader_kwargs: passed to ``DataLoader`` (``num_workers``, ``pin_memory``, ...).

    Returns:
        ``(loader, sampler)``: prepare the loader with ``accelerator.prepare``; keep the
        :class:`~atac_hf.packing.WFAPBatchSampler` for ``set_epoch`` and ``state_dict``.
    """
    from ..packing.data.collator import PackedDataCollator
    from ..packing.data.dataset import dataset_lengths
    from ..packing.data.sampler import SpanDataset, WFAPBatchSampler

    check_dataset_columns(dataset)
    if "seq_lengths" in _column_names(dataset):  # pre-packed rows (TRL, pack_dataset): pack their documents
        dataset = PackedRowDocuments(dataset)
        lengths = dataset.lengths
    else:
        lengths = dataset_lengths(dataset)
    _warn_small_window(config, num_replicas * grad_accum)
    sampler = WFAPBatchSampler(
        lengths, config.packing_config(num_replicas * grad_accum), window_size=config.window_size,
        num_replicas=num_replicas, shuffle=config.shuffle if shuffle is None else shuffle, seed=seed,
        cost_model=cost_model, even_batches=even_batches, progress=progress, fixed_epoch_length=fixed_epoch_length,
    )
    loader = DataLoader(SpanDataset(dataset), batch_sampler=sampler,
                        collate_fn=collate_fn if collate_fn is not None else PackedDataCollator(), **loader_kwargs)
    return loader, sampler


def build_streaming_dataloader(dataset: Any, config: ATACConfig, *, num_replicas: int = 1, grad_accum: int = 1,
                               cost_model: Any = None, collate_fn: Callable | None = None, **loader_kwargs: Any):
    """A DataLoader of packed rows from a stream of samples (one row = one pack per batch).

    The stream goes through :class:`~atac_hf.packing.data.iterable.PackedIterableDataset`:
    windows of ``num_replicas x grad_accum`` packs, ordered for a round-robin deal to the
    DP replicas (Accelerate's ``IterableDatasetShard`` with ``dispatch_batches=False`` deals
    row ``k`` to replica ``k % num_replicas``), and a pass that ends on a multiple of
    ``num_replicas`` packs, so no replica gets a repeated row. The stream must replay the
    same order on each ``iter()`` (resume skips the rows already trained by replaying it).

    Args:
        dataset: an iterable of mappings with ``input_ids`` (``labels`` optional):
            ``datasets.IterableDataset``, a torch ``IterableDataset``...
        config, num_replicas, grad_accum, cost_model, collate_fn: as in :func:`build_packed_dataloader`.
        **loader_kwargs: passed to ``DataLoader`` (``num_workers`` at most 1).

    Returns:
        ``(loader, packed)``: prepare the loader with ``accelerator.prepare``; ``packed`` is the
        :class:`PackedIterableDataset` (its ``state_dict`` resumes a stream without a replay).
    """
    from ..packing.data.collator import PackedDataCollator
    from ..packing.data.iterable import PackedIterableDataset

    check_dataset_columns(dataset, streaming=True)
    _warn_small_window(config, num_replicas * grad_accum)
    packed = PackedIterableDataset(dataset, config.packing_config(num_replicas * grad_accum),
                                   window_size=config.window_size, num_replicas=num_replicas, cost_model=cost_model)
    loader = DataLoader(packed, batch_size=1,
                        collate_fn=collate_fn if collate_fn is not None else PackedDataCollator(), **loader_kwargs)
    return loader, packed


def _warn_small_window(config: ATACConfig, packs_per_window: int) -> None:
    """Warn where ``window_size`` gives a window fewer new samples than it has packs to fill (DP
    replicas x gradient accumulation): packs then hold about one sample each, mostly padding."""
    if config.window_size is not None and config.window_size < packs_per_window:
        warnings.warn(f"window_size={config.window_size} is smaller than the {packs_per_window} packs each window "
                      "fills (DP replicas x gradient accumulation): packs would hold about one sample each, mostly "
                      f"padding; set window_size to several times {packs_per_window}, or None (windows sized by "
                      "tokens)", stacklevel=3)


def _column_names(dataset: Any) -> list[str]:
    names = getattr(dataset, "column_names", None)
    if names is None and len(dataset) and hasattr(dataset[0], "keys"):
        names = list(dataset[0])
    return list(names or [])


class PackedRowDocuments:
    """The documents of pre-packed rows (``input_ids`` + ``seq_lengths``, e.g. TRL's or
    atac-hf's ``pack_dataset`` output) as a map-style dataset of samples, one per document.

    ``transformers.Trainer`` with ``remove_unused_columns=True`` drops ``seq_lengths`` and the
    documents of a row attend to each other; ATACTrainer reads it instead: each document is
    a sample of its own (its ``input_ids`` and ``labels`` slice), packed again by WFAP.

    Raises:
        ValueError: a row whose ``seq_lengths`` do not sum to its ``input_ids`` length (names the row).
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        if getattr(dataset, "column_names", None) is not None and hasattr(dataset, "select_columns"):
            seq = dataset.select_columns(["seq_lengths"]).with_format(None)["seq_lengths"]
        else:
            seq = [dataset[i]["seq_lengths"] for i in range(len(dataset))]
        from ..packing.data.dataset import dataset_lengths

        totals = dataset_lengths(dataset)
        counts = np.fromiter((len(s) for s in seq), dtype=np.int64, count=len(seq))
        lens = np.fromiter((int(x) for s in seq for x in s), dtype=np.int64, count=int(counts.sum()))
        self.row = np.repeat(np.arange(len(seq), dtype=np.int64), counts)
        sums = np.bincount(self.row, weights=lens, minlength=len(seq)).astype(np.int64)
        bad = np.flatnonzero(sums != totals)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"row {i}: seq_lengths sum to {int(sums[i])} but input_ids has {int(totals[i])} tokens; "
                             "seq_lengths must list the lengths of the row's documents in order")
        starts = np.cumsum(lens) - lens  # each document's start in the concatenation of all rows
        row_base = np.cumsum(totals) - totals  # each row's start in it (seq_lengths sum to the row's length)
        self.offset = starts - row_base[self.row]
        self.lengths = lens

    def __len__(self) -> int:
        return int(self.lengths.size)

    def __getitem__(self, i: int) -> dict[str, Any]:
        r, o, n = int(self.row[i]), int(self.offset[i]), int(self.lengths[i])
        row = self.dataset[r]
        out = {"input_ids": row["input_ids"][o:o + n]}
        if row.get("labels") is not None:
            out["labels"] = row["labels"][o:o + n]
        return out

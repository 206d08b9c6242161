"""Offline packing of a ``datasets.Dataset`` into packed rows (WFAP or a baseline).

:func:`pack_dataset` plans every pack up front (one pass over the sample lengths, with a
progress bar), then materialises the rows with ``Dataset.map`` (``num_proc`` workers).
Each output row is one pack::

    input_ids    flat token ids of the pack's documents
    seq_lengths  document lengths (sum = len(input_ids))
    labels       flat labels (only when the source has a ``labels`` column)
    spans        [[sample, start, end], ...] source rows and token ranges, for audit

Feed the rows to :class:`~atac_hf.packing.data.collator.PackedDataCollator` with
``batch_size=1`` (one pack per step and replica), in order and unshuffled if the packs
were ordered for data parallelism (``num_replicas``).

Pitfall: ``transformers.Trainer`` drops dataset columns that are not arguments of
``model.forward`` (``remove_unused_columns=True``, the default). Without ``seq_lengths`` a
packed row looks like one long document to the collator and its documents would attend to
each other: set ``remove_unused_columns=False``, or keep ``seq_lengths`` among the
signature columns (TRL's SFTTrainer does).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Sequence

import numpy as np

from ...cost import CostModel
from ..config import PackingConfig
from .window_planner import plan_packs

__all__ = ["dataset_lengths", "pack_dataset"]

logger = logging.getLogger(__name__)


def dataset_lengths(dataset: Any, *, column: str = "input_ids", batch_size: int = 10_000,
                    progress: bool = False) -> np.ndarray:
    """Token count of every row of ``dataset`` (int64 array, in row order).

    Reads the Arrow list lengths of a ``datasets.Dataset`` without decoding the tokens;
    any other indexable of mappings is read row by row.

    Raises:
        ValueError: the column is missing (the message lists the columns found).
    """
    names = getattr(dataset, "column_names", None)
    if names is not None:
        if column not in names:
            raise ValueError(_missing_column(column, names))
        import pyarrow.compute as pc
        from tqdm.auto import tqdm

        out = []
        view = dataset.select_columns([column]).with_format("arrow")
        with tqdm(total=len(dataset), desc="Reading lengths", disable=not progress, unit="rows") as bar:
            for table in view.iter(batch_size=batch_size):
                lens = pc.fill_null(pc.list_value_length(table[column]), 0)
                out.append(lens.to_numpy(zero_copy_only=False).astype(np.int64))
                bar.update(len(table))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
    lengths = np.zeros(len(dataset), dtype=np.int64)
    for i in range(len(dataset)):
        row = dataset[i]
        if column not in row:
            raise ValueError(_missing_column(column, list(row), where=f"row {i}"))
        lengths[i] = len(row[column])
    return lengths


def pack_dataset(dataset: Any, *, max_tokens: int, packs_per_window: int = 64, strategy: str = "wfap",
                 overlength: str = "split", window_size: int | None = None, num_replicas: int = 1,
                 shuffle: bool = False, seed: int = 0, cost_model: CostModel | None = None,
                 num_proc: int | None = None, desc: str = "Packing", progress: bool = True,
                 **packing_options: Any) -> Any:
    """Pack a tokenized ``datasets.Dataset`` into packed rows.

    Args:
        dataset: a ``datasets.Dataset`` with an ``input_ids`` column (and optionally ``labels``).
        max_tokens: token cap of one pack.
        packs_per_window: packs planned together (one window); the packer balances cost
            within a window.
        strategy: ``wfap`` | ``sequential`` | ``bfd`` | ``wlb``.
        overlength: policy for samples longer than ``max_tokens``: ``split`` | ``truncate`` | ``error``.
        window_size: new samples per window (``None``: by token budget).
        num_replicas: order packs for a round-robin deal to this many DP replicas.
        shuffle, seed: shuffle the sample order before packing.
        cost_model: the cost model (default: the package default).
        num_proc: worker processes for building rows (planning is sequential).
        desc: progress bar label.
        progress: show progress bars.
        **packing_options: further :class:`~atac_hf.packing.config.PackingConfig` fields
            (``min_fragment``, ``max_defer``, strategy options).

    Returns:
        a ``datasets.Dataset`` with columns ``input_ids``, ``seq_lengths``, ``labels`` (if
        the source has them) and ``spans``. Zero-length samples are skipped (a warning gives
        their count).

    Raises:
        TypeError: ``dataset`` is not a ``datasets.Dataset``.
        ValueError: an empty dataset, no ``input_ids`` column (lists the columns found),
            only empty samples, or invalid packing settings.
    """
    import datasets
    from tqdm.auto import tqdm

    if isinstance(dataset, datasets.IterableDataset):
        raise TypeError("pack_dataset needs a datasets.Dataset; for an IterableDataset use "
                        "atac_hf.packing.data.iterable.PackedIterableDataset (streaming packing)")
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"pack_dataset needs a datasets.Dataset, got {type(dataset).__name__}")
    if "input_ids" not in dataset.column_names:
        raise ValueError(_missing_column("input_ids", dataset.column_names))
    if len(dataset) == 0:
        raise ValueError("pack_dataset got an empty dataset (0 rows): nothing to pack")
    config = PackingConfig(max_tokens=max_tokens, packs_per_window=packs_per_window, strategy=strategy,
                           overlength=overlength, **packing_options)

    lengths = dataset_lengths(dataset, progress=progress)
    num_empty = int((lengths == 0).sum())
    if num_empty == lengths.size:
        raise ValueError(f"every one of the {lengths.size} samples of the dataset is empty (0 input_ids)")
    if num_empty:
        warnings.warn(f"pack_dataset: skipped {num_empty} zero-length samples", stacklevel=2)
    order = np.random.default_rng([seed, 0]).permutation(lengths.size) if shuffle else None
    with tqdm(total=lengths.size, desc=f"{desc}: planning", disable=not progress, unit="samples") as bar:
        spans, offsets = plan_packs(lengths, config, order=order, cost_model=cost_model, window_size=window_size,
                                    num_replicas=num_replicas, progress=bar)
    logger.info("pack_dataset: %d samples -> %d packs (%d spans, %d empty samples skipped)",
                lengths.size, len(offsets) - 1, len(spans), num_empty)

    columns = [c for c in ("input_ids", "labels") if c in dataset.column_names]
    source = dataset.select_columns(columns)
    plan = datasets.Dataset.from_dict(
        {"spans": [spans[offsets[b]:offsets[b + 1]].tolist() for b in range(len(offsets) - 1)]},
        features=datasets.Features({"spans": datasets.List(datasets.List(datasets.Value("int64")))}),
    )
    return plan.map(_build_rows, batched=True, batch_size=256, num_proc=num_proc,
                    fn_kwargs={"source": source, "columns": columns},
                    desc=f"{desc}: building rows", features=_row_features(datasets, "labels" in columns))


def _build_rows(batch: dict[str, list], *, source: Any, columns: Sequence[str]) -> dict[str, list]:
    ids_needed = sorted({s[0] for pack in batch["spans"] for s in pack})
    fetched = source[ids_needed]
    where = {sid: j for j, sid in enumerate(ids_needed)}
    out: dict[str, list] = {"input_ids": [], "seq_lengths": []}
    if "labels" in columns:
        out["labels"] = []
    for pack in batch["spans"]:
        row_ids: list[int] = []
        row_labels: list[int] = []
        for sid, s, e in pack:
            row_ids += fetched["input_ids"][where[sid]][s:e]
            if "labels" in columns:
                lab = fetched["labels"][where[sid]]
                row_labels += (fetched["input_ids"][where[sid]] if lab is None else lab)[s:e]
        out["input_ids"].append(row_ids)
        out["seq_lengths"].append([e - s for _, s, e in pack])
        if "labels" in columns:
            out["labels"].append(row_labels)
    out["spans"] = batch["spans"]
    return out


def _row_features(datasets: Any, with_labels: bool) -> Any:
    ints = datasets.List(datasets.Value("int64"))
    feats = {"input_ids": ints, "seq_lengths": ints}
    if with_labels:
        feats["labels"] = ints
    feats["spans"] = datasets.List(ints)
    return datasets.Features(feats)


def _missing_column(column: str, found: Sequence[str], *, where: str = "the dataset") -> str:
    return (f"{where} has no {column!r} column; columns found: {list(found)}. Tokenize the text into "
            f"{column!r} first, or rename the column holding the token ids "
            f"(dataset.rename_column('<name>', {column!r}))")

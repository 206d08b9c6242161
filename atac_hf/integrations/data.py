"""The WFAP feeder in front of a DataLoader: checks, sampler, collator.

One batch = one pack = one packed row of at most ``config.max_tokens`` tokens. The sampler
deals packs the way Accelerate's ``BatchSamplerShard`` hands batch ``b`` to DP replica
``b % num_replicas``, and every CP rank of a replica receives the same batches.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from .config import ATACConfig

__all__ = ["REQUIRED_COLUMNS", "build_packed_dataloader", "check_collator", "check_dataset_columns"]

REQUIRED_COLUMNS = ("input_ids",)


def check_dataset_columns(dataset: Any, *, name: str = "dataset") -> None:
    """Refuse a dataset the feeder cannot pack.

    Needs a map-style dataset (``datasets.Dataset`` or any indexable of dicts) with an
    ``input_ids`` column of token ids; ``labels`` is optional (default: the tokens).

    Raises:
        ValueError: an iterable dataset, pre-packed rows (a ``seq_lengths`` column: their documents
            would attend to each other), or a missing ``input_ids`` column (lists the columns found).
    """
    if isinstance(dataset, IterableDataset) or (hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")):
        raise ValueError(f"{name} is an iterable dataset: the WFAP sampler needs a map-style dataset whose sample "
                         "lengths are known up front (datasets.Dataset, or a list of dicts with 'input_ids')")
    names = getattr(dataset, "column_names", None)
    if names is None:
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty")
        first = dataset[0]
        names = list(first) if hasattr(first, "keys") else [type(first).__name__]
    if "seq_lengths" in names:
        raise ValueError(
            f"{name} holds pre-packed rows (a 'seq_lengths' column, e.g. from TRL's or atac-hf's pack_dataset): "
            "ATACTrainer packs samples itself and would treat each row as one document, so the documents of a row "
            "would attend to each other. Pass the unpacked tokenized dataset, or train the packed rows with "
            "transformers.Trainer(args=TrainingArguments(..., remove_unused_columns=False), "
            "data_collator=atac_hf.PackedDataCollator())")
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
                            **loader_kwargs: Any):
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
        **loader_kwargs: passed to ``DataLoader`` (``num_workers``, ``pin_memory``, ...).

    Returns:
        ``(loader, sampler)``: prepare the loader with ``accelerator.prepare``; keep the
        :class:`~atac_hf.packing.WFAPBatchSampler` for ``set_epoch`` and ``state_dict``.
    """
    from ..packing.data.collator import PackedDataCollator
    from ..packing.data.dataset import dataset_lengths
    from ..packing.data.sampler import SpanDataset, WFAPBatchSampler

    check_dataset_columns(dataset)
    lengths = dataset_lengths(dataset)
    sampler = WFAPBatchSampler(
        lengths, config.packing_config(num_replicas * grad_accum), window_size=config.window_size,
        num_replicas=num_replicas, shuffle=config.shuffle if shuffle is None else shuffle, seed=seed,
        cost_model=cost_model, even_batches=even_batches,
    )
    loader = DataLoader(SpanDataset(dataset), batch_sampler=sampler,
                        collate_fn=collate_fn if collate_fn is not None else PackedDataCollator(), **loader_kwargs)
    return loader, sampler

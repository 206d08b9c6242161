"""The WFAP feeder in front of a DataLoader: checks, sampler, collator.

One batch = one pack = one packed row of at most ``config.max_tokens`` tokens. The sampler
deals packs the way Accelerate's ``BatchSamplerShard`` hands batch ``b`` to DP replica
``b % num_replicas``, and every CP rank of a replica receives the same batches.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils.data import DataLoader, IterableDataset

from .config import ATACConfig

__all__ = ["REQUIRED_COLUMNS", "build_packed_dataloader", "check_dataset_columns"]

REQUIRED_COLUMNS = ("input_ids",)


def check_dataset_columns(dataset: Any, *, name: str = "dataset") -> None:
    """Refuse a dataset the feeder cannot pack.

    Needs a map-style dataset (``datasets.Dataset`` or any indexable of dicts) with an
    ``input_ids`` column of token ids; ``labels`` is optional (default: the tokens).

    Raises:
        ValueError: an iterable dataset, or a missing ``input_ids`` column (lists the columns found).
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
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ValueError(
            f"{name} has no {missing} column; columns found: {list(names)}. Tokenize it first, e.g. "
            "dataset.map(lambda b: tokenizer(b['text']), batched=True), or rename the token column to 'input_ids'"
        )


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

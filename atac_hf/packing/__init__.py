"""Packing: WFAP (cost-balanced packing with bounded deferral) and the baselines.

* :mod:`.planners` - the pure per-window planners: ``wfap``, ``baselines`` (sequential, bfd,
  wlb) and their shared ``window`` pieces.
* :mod:`.stream` - :class:`StreamPacker`, the window-by-window engine (deferral, overlength
  samples, resumable state), and :func:`pack_lengths`.
* :mod:`.config`, :mod:`.validate`, :mod:`.metrics` - settings, input checks, pack metrics.
* :mod:`.data` - what meets datasets and DataLoaders (torch / datasets, loaded on first use):
  the batch sampler, the iterable dataset, ``pack_dataset``, the collator, and the window
  planning they share.

Everything but :mod:`.data` imports numpy only.
"""

from __future__ import annotations

from typing import Any

from .config import PackingConfig
from .metrics import pack_costs, recount_metrics
from .stream import PackResult, StreamPacker, pack_lengths

__all__ = [
    "PackingConfig",
    "PackResult",
    "StreamPacker",
    "pack_costs",
    "pack_lengths",
    "recount_metrics",
    # lazy (torch / datasets)
    "PackedDataCollator",
    "PackedIterableDataset",
    "SampleCutWarning",
    "SpanDataset",
    "WFAPBatchSampler",
    "pack_dataset",
]

# torch/datasets-backed pieces, imported on first use (keeps planning numpy-only)
_LAZY = {
    "PackedDataCollator": "atac_hf.packing.data.collator",
    "WFAPBatchSampler": "atac_hf.packing.data.sampler",
    "PackedIterableDataset": "atac_hf.packing.data.iterable",
    "SampleCutWarning": "atac_hf.packing.data.even_out",
    "SpanDataset": "atac_hf.packing.data.sampler",
    "pack_dataset": "atac_hf.packing.data.dataset",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'atac_hf.packing' has no attribute {name!r}")

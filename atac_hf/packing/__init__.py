"""Packing: WFAP (cost-balanced packing with bounded deferral) and the baselines.

The planners (``config``, ``stream``, ``wfap``, ``baselines``, ``metrics``) import numpy
only. The collator, feeders and dataset packers (torch / datasets) load on first use.
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
    "SpanDataset",
    "WFAPBatchSampler",
    "pack_dataset",
]

# torch/datasets-backed pieces, imported on first use (keeps planning numpy-only)
_LAZY = {
    "PackedDataCollator": "atac_hf.packing.collator",
    "WFAPBatchSampler": "atac_hf.packing.feeders",
    "PackedIterableDataset": "atac_hf.packing.feeders",
    "SpanDataset": "atac_hf.packing.feeders",
    "pack_dataset": "atac_hf.packing.dataset",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'atac_hf.packing' has no attribute {name!r}")

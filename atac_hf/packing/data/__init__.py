"""Packing meets datasets and DataLoaders (torch / datasets).

* :mod:`.sampler` - :class:`WFAPBatchSampler` (map-style datasets; one batch = one pack) and
  :class:`SpanDataset`, which reads the spans it yields.
* :mod:`.iterable` - :class:`PackedIterableDataset`, resumable streaming packing.
* :mod:`.dataset` - :func:`pack_dataset`: a ``datasets.Dataset`` of packed rows.
* :mod:`.collator` - :class:`PackedDataCollator`: packs -> one padding-free row.
* :mod:`.window_planner` - the window planning all of them share (:class:`WindowPlanner`,
  :func:`plan_packs`, the replica order of a window's packs).

Submodules load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PackedDataCollator", "PackedIterableDataset", "SampleCutWarning", "SpanDataset", "WFAPBatchSampler",
           "WindowPlanner", "pack_dataset", "plan_packs"]

_LAZY = {
    "PackedDataCollator": "collator",
    "PackedIterableDataset": "iterable",
    "SampleCutWarning": "even_out",
    "SpanDataset": "sampler",
    "WFAPBatchSampler": "sampler",
    "WindowPlanner": "window_planner",
    "pack_dataset": "dataset",
    "plan_packs": "window_planner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

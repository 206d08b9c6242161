"""atac-hf: workload-balanced packing (WFAP) and anchor-tail context parallelism (ATP-CP)
for HuggingFace Transformers and Accelerate.

Planning code (``cost``, ``packing``, ``sharding``, ``sim``) imports numpy only; the
torch pieces (``attention``, ``integrations``, ``shard_batch``) load on first use.
"""

from __future__ import annotations

from typing import Any

from .cost import CostModel, ModelDims, default_cost_model
from .sharding import ShardPlan, plan_shards

__version__ = "0.1.0"

__all__ = [
    "CostModel",
    "ModelDims",
    "ShardPlan",
    "default_cost_model",
    "plan_shards",
    "shard_batch",
    "__version__",
]

_LAZY = {
    "shard_batch": ("atac_hf.attention", "shard_batch"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'atac_hf' has no attribute {name!r}")

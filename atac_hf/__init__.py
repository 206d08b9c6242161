"""atac-hf: workload-balanced packing (WFAP) and anchor-tail context parallelism (ATP-CP)
for HuggingFace Transformers and Accelerate.

Planning code (``cost``, ``packing``, ``sharding``, ``sim``) imports numpy only; the
torch pieces (``attention``, ``integrations``, ``shard_batch``) load on first use.

``import atac_hf`` makes ``attn_implementation="atac_cp"`` available: it registers the
attention at once when transformers' model code is loaded, else right after it loads
(a one-shot import hook, :mod:`atac_hf._attention_hook`), so torch is not imported here.
"""

from __future__ import annotations

from typing import Any

from . import _attention_hook
from .cost import CostModel, ModelDims, default_cost_model
from .packing import PackingConfig, StreamPacker, pack_lengths
from .sharding import ShardPlan, plan_shards

__version__ = "0.1.0"

__all__ = [
    "ATACAccelerator",
    "ATACConfig",
    "ATACTrainer",
    "CostModel",
    "ModelDims",
    "PackedDataCollator",
    "PackedIterableDataset",
    "PackingConfig",
    "ShardPlan",
    "StreamPacker",
    "WFAPBatchSampler",
    "check_model",
    "default_cost_model",
    "pack_dataset",
    "pack_lengths",
    "plan_shards",
    "shard_batch",
    "__version__",
]

_LAZY = {
    "shard_batch": ("atac_hf.attention", "shard_batch"),
    "check_model": ("atac_hf.attention.model_check", "check_model"),
    "PackedDataCollator": ("atac_hf.packing.data.collator", "PackedDataCollator"),
    "PackedIterableDataset": ("atac_hf.packing.data.iterable", "PackedIterableDataset"),
    "WFAPBatchSampler": ("atac_hf.packing.data.sampler", "WFAPBatchSampler"),
    "pack_dataset": ("atac_hf.packing.data.dataset", "pack_dataset"),
    "ATACConfig": ("atac_hf.integrations.config", "ATACConfig"),
    "ATACTrainer": ("atac_hf.integrations", "ATACTrainer"),
    "ATACAccelerator": ("atac_hf.integrations", "ATACAccelerator"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'atac_hf' has no attribute {name!r}")


_attention_hook.install()  # last: registering may import atac_hf.attention, which needs the package set up

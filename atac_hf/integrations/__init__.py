"""Transformers and Accelerate integration of WFAP packing and ATP-CP sharding.

* :class:`ATACConfig` - every setting, from YAML, ``ATAC_*`` variables or code.
* :class:`ATACTrainer` - ``Trainer`` that packs, shards after token counting, and logs balance.
* :class:`ATACAccelerator` - ``Accelerator`` with an ATP-CP mesh for plain loops
  (:meth:`~ATACAccelerator.shard`, :meth:`~ATACAccelerator.reduce_loss`).
* :func:`build_parallelism_config`, :func:`bypass_torch_cp_hooks`, :class:`BatchSharder`,
  :func:`sync_cp_gradients`, :func:`build_packed_dataloader` - the pieces, for custom loops.
* :func:`predictions_by_sample` - ``ATACTrainer.predict()``'s packed rows split back into one array per sample.
* :func:`apply_tensor_parallel`, :func:`sync_tp_gradients` - tensor parallel x CP (the model's
  own ``tp_plan`` on the mesh's "tp" axis); :func:`mesh_groups`, :func:`placement_warnings` -
  which ranks form each group, and whether they fit the nodes.

Submodules load on first use (``ATACConfig`` alone does not import transformers).
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import ATACConfig

__all__ = [
    "ATACAccelerator",
    "ATACConfig",
    "ATACParallelismConfig",
    "ATACTrainer",
    "BatchSharder",
    "apply_tensor_parallel",
    "build_packed_dataloader",
    "build_parallelism_config",
    "bypass_torch_cp_hooks",
    "check_dataset_columns",
    "check_model_shardable",
    "mesh_groups",
    "placement_warnings",
    "predictions_by_sample",
    "prepare_model",
    "sync_cp_gradients",
    "sync_tp_gradients",
]

_LAZY = {
    "ATACAccelerator": "accelerate",
    "ATACParallelismConfig": "accelerate",
    "build_parallelism_config": "accelerate",
    "bypass_torch_cp_hooks": "accelerate",
    "ATACTrainer": "trainer",
    "BatchSharder": "sharder",
    "check_model_shardable": "sharder",
    "prepare_model": "sharder",
    "sync_cp_gradients": "sharder",
    "build_packed_dataloader": "data",
    "check_dataset_columns": "data",
    "apply_tensor_parallel": "tensor_parallel",
    "sync_tp_gradients": "tensor_parallel",
    "mesh_groups": "layout",
    "placement_warnings": "layout",
    "predictions_by_sample": "predictions",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The check every CP rank runs on every batch: the same plan and the same rows everywhere.

Ranks holding different batches would train on mismatched shards, or wait on each other's collectives
forever (a different plan runs different collectives). :func:`check_same_batch` compares the plan's
digest and a cheap checksum of the rows in one 32-byte all-gather; ``ATACConfig(debug=True)`` compares
a hash of the copied rows instead (:func:`~atac_hf.attention.shard.batch_digest`).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..sharding.plan import ShardPlan
from . import shard

__all__ = ["check_same_batch", "light_batch_digest"]


def light_batch_digest(batch: Mapping[str, Any]) -> str:
    """16 hex digits of a position-weighted sum of ``input_ids``, ``labels`` and ``shift_labels``, taken
    on their device (a few kernels and one scalar copy, not a hash of the copied rows as
    :func:`~atac_hf.attention.shard.batch_digest`): what :func:`check_same_batch` compares on every batch."""
    total: Any = 0
    for i, key in enumerate(("input_ids", "labels", "shift_labels")):
        v = batch.get(key)
        if isinstance(v, torch.Tensor) and v.numel():
            flat = v.reshape(-1).to(torch.int64)  # int64 products and sums wrap: a checksum, never an error
            weights = torch.arange(1, flat.numel() + 1, device=flat.device, dtype=torch.int64) * (2 * i + 3)
            total = total + (flat * weights).sum()
    value = int(total.item()) if isinstance(total, torch.Tensor) else int(total)
    return f"{value & (2**64 - 1):016x}"


def check_same_batch(plan: ShardPlan, batch: Mapping[str, Any], group: Any = None, *, ranks: str = "CP") -> None:
    """:func:`~atac_hf.attention.shard.check_plan_digest` with :func:`light_batch_digest`: one 32-byte
    all-gather per batch, so that CP (or TP: ``ranks``) ranks holding different batches (which would train
    on mismatched shards, or wait on each other's collectives forever) fail at once, naming the likely cause."""
    try:
        shard.check_plan_digest(plan, group, content=light_batch_digest(batch), what="batch check (every batch)",
                                ranks=ranks)
    except RuntimeError as e:
        if not str(e).startswith(f"the {ranks} ranks hold different"):
            raise
        raise RuntimeError(f"{e}. (Checked on every batch.) A common cause: data shuffled differently in each "
                           "process, e.g. a datasets IterableDataset.shuffle() without a seed: pass "
                           "shuffle(seed=...)") from None

"""Token ids and labels as the model and the loss take them: int64.

A user's own batch may hold them in any integer dtype (a byte-level vocabulary in uint8, a pre-tokenized
corpus in uint16 or int32). Written into in their own dtype, the ``-100`` put at each document's last
target wrapped (to 156 in uint8: trained as a real target), uint16 has no ``index_select``, and int32
labels fail inside ``cross_entropy``; so :func:`~atac_hf.attention.shard.shard_batch` and the sharder
widen them first.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

__all__ = ["ID_KEYS", "as_long_ids", "is_index_dtype"]

#: the batch entries that hold token ids, labels or positions
ID_KEYS = ("input_ids", "labels", "shift_labels", "position_ids")


def is_index_dtype(t: torch.Tensor) -> bool:
    """Whether a tensor holds token ids or labels: an integer dtype (not bool, float or complex)."""
    return not (t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex)


def as_long_ids(batch: Mapping[str, Any]) -> Mapping[str, Any]:
    """``batch`` with its integer :data:`ID_KEYS` tensors as int64 (the same mapping where all already are);
    other entries, and entries of other dtypes (refused later, naming them), are left as they are."""
    def narrow(v: Any) -> bool:
        return isinstance(v, torch.Tensor) and v.dtype != torch.int64 and is_index_dtype(v)

    if not any(narrow(batch.get(k)) for k in ID_KEYS):
        return batch
    return {k: (v.long() if k in ID_KEYS and narrow(v) else v) for k, v in batch.items()}

"""Exact context-parallel attention for Transformers models (``attn_implementation="atac_cp"``).

Importing this package registers ``atac_cp`` in ``transformers.AttentionInterface``
(idempotent; no built-in name is touched); ``import atac_hf`` alone does it too, as soon as
transformers' model code is loaded (:mod:`atac_hf._attention_hook`). Per batch::

    local = shard_batch(batch, plan, rank, group)   # on every CP rank
    loss = model(**local).loss                      # local sum / global target count
    loss.backward()                                 # then all_reduce(SUM) grads over the CP group
"""

from .backends import BACKENDS, varlen_attention_reference
from .runtime import (
    ATTN_IMPLEMENTATION,
    SHARD_KWARG,
    atac_cp_attention,
    check_model_supported,
    emulate_cp_attention,
    register_attention,
)
from .shard import ShardContext, build_shift_labels, doc_lengths_from_batch, shard_batch, unshard

__all__ = [
    "ATTN_IMPLEMENTATION",
    "BACKENDS",
    "SHARD_KWARG",
    "ShardContext",
    "atac_cp_attention",
    "build_shift_labels",
    "check_model_supported",
    "doc_lengths_from_batch",
    "emulate_cp_attention",
    "register_attention",
    "shard_batch",
    "unshard",
    "varlen_attention_reference",
]

register_attention()

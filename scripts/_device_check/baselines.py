"""What a user would otherwise run on one GPU, for part c (the cp_size-1 overhead):

* ``hf_sdpa`` / ``hf_flex``: transformers' own packed-row path. ``create_causal_mask``
  detects the packed documents from ``position_ids`` (positions restarting at 0) and builds
  the document-causal mask for the attention implementation (a dense boolean mask for
  ``sdpa``, a ``BlockMask`` for ``flex_attention``); the layer then calls
  ``ALL_ATTENTION_FUNCTIONS[impl]``. The mask is built once, outside the timed call, as a
  model builds it once per forward for all its layers.
* ``varlen_row``: one ``torch.nn.attention.varlen.varlen_attn`` call over the whole row,
  ``cu_seqlens`` at the document boundaries.
* ``sdpa_loop`` / ``flex_mask``: one causal SDPA call per document; one ``flex_attention``
  call with a document block mask built by this package.

Every builder takes the row as (N, H, D) / (N, K, D) leaves (the layout Transformers' q/k/v
projections give; the attention functions see (1, H, N, D) views of them) and returns a
closure that runs forward and backward once.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import numpy as np
import torch


def _positions(lens: Sequence[int], device) -> torch.Tensor:
    return torch.cat([torch.arange(int(n), device=device) for n in lens])[None]


def _hf_mask(impl: str, cfg, N: int, dtype, device, position_ids: torch.Tensor):
    """``transformers.masking_utils.create_causal_mask`` called with whatever its installed
    signature names (``inputs_embeds``/``input_embeds``, ``cache``/``past_key_values``,
    ``cache_position`` moved between 5.x releases)."""
    from transformers.masking_utils import create_causal_mask

    params = inspect.signature(create_causal_mask).parameters
    kw = {"config": cfg, "attention_mask": None, "position_ids": position_ids}
    embeds = torch.empty(1, N, 1, dtype=dtype, device=device)  # only its shape, dtype and device are read
    kw["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = embeds
    for name in ("cache", "past_key_values"):
        if name in params:
            kw[name] = None
    if "cache_position" in params:
        kw["cache_position"] = torch.arange(N, device=device)
    return create_causal_mask(**kw)


def hf_packed(impl: str, q_NHD, k_NKD, v_NKD, lens, scale: float) -> Callable[[torch.Tensor], None]:
    """transformers' packed-row attention with ``impl`` (``sdpa`` or ``flex_attention``)."""
    from transformers import LlamaConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    N, H, D = q_NHD.shape
    K = k_NKD.shape[1]
    cfg = LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=K, head_dim=D,
                      num_hidden_layers=1, intermediate_size=16, vocab_size=16)
    try:
        cfg._attn_implementation = impl
    except Exception:  # noqa: BLE001 - older configs keep it in a plain attribute
        cfg._attn_implementation_internal = impl
    mask = _hf_mask(impl, cfg, N, q_NHD.dtype, q_NHD.device, _positions(lens, q_NHD.device))
    if mask is None:
        raise RuntimeError(f"create_causal_mask found no packed documents in position_ids ({len(lens)} documents)")
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups, module.config, module.layer_idx = True, H // K, cfg, 0
    fn = ALL_ATTENTION_FUNCTIONS[impl]

    def run(gout_NHD):
        out, _ = fn(module, q_NHD.transpose(0, 1)[None], k_NKD.transpose(0, 1)[None], v_NKD.transpose(0, 1)[None],
                    mask, dropout=0.0, scaling=scale)
        out[0].backward(gout_NHD)

    return run


def varlen_row(q_NHD, k_NKD, v_NKD, lens, scale: float) -> Callable[[torch.Tensor], None]:
    """One torch ``varlen_attn`` call over the whole row (causal, document boundaries)."""
    from atac_hf.attention.varlen import varlen_kernel_source

    kernel = varlen_kernel_source()
    cu = torch.as_tensor(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32), device=q_NHD.device)
    m = int(max(lens))

    def run(gout_NHD):
        kernel(q_NHD, k_NKD, v_NKD, cu, cu, m, m, scale=scale).backward(gout_NHD)

    return run


def sdpa_loop(q_NHD, k_NKD, v_NKD, lens, scale: float) -> Callable[[torch.Tensor], None]:
    from atac_hf.attention.reference import doc_masked_sdpa_loop

    def run(gout_NHD):
        doc_masked_sdpa_loop(q_NHD.transpose(0, 1), k_NKD.transpose(0, 1), v_NKD.transpose(0, 1), lens,
                             scaling=scale).backward(gout_NHD)

    return run


def flex_mask(q_NHD, k_NKD, v_NKD, lens, scale: float) -> Callable[[torch.Tensor], None]:
    from atac_hf.attention.reference import doc_block_mask, doc_masked_flex

    bm = doc_block_mask(lens, q_NHD.device)

    def run(gout_NHD):
        doc_masked_flex(q_NHD.transpose(0, 1), k_NKD.transpose(0, 1), v_NKD.transpose(0, 1), bm,
                        scaling=scale).backward(gout_NHD)

    return run


BUILDERS = {"hf_sdpa": lambda *a: hf_packed("sdpa", *a), "hf_flex": lambda *a: hf_packed("flex_attention", *a),
            "varlen_row": varlen_row, "sdpa_loop": sdpa_loop, "flex_mask": flex_mask}
# per atac backend, the baselines its cp_size-1 time is compared with (the target is on the first)
BASELINES = {"sdpa": ("hf_sdpa", "sdpa_loop"), "flex": ("hf_flex", "flex_mask"), "varlen": ("varlen_row",)}

"""Bytes of the K/V a rank exchanges per token: the planners price them, the logs report them (``atac/kv_mb``)."""

from __future__ import annotations

import torch

from ..cost.presets import key_value_widths

__all__ = ["HALF_AUTOCAST", "kv_element_bytes", "model_kv_bytes_per_token"]

#: Accelerate ``mixed_precision`` values whose autocast computes K/V in 2 bytes (fp8 autocasts to bf16 too:
#: its fp8 matmuls return bf16).
HALF_AUTOCAST = ("bf16", "fp16", "fp8")


def kv_element_bytes(model: torch.nn.Module, autocast_half: bool = False) -> int:
    """Bytes of one K/V element as exchanged: the parameters' width, or 2 where bf16/fp16 autocast
    (``TrainingArguments(bf16=True)``, ``Accelerator(mixed_precision="bf16")``) computes K/V from wider
    parameters (the attention exchanges them in the autocast dtype)."""
    from .sharder import unwrap_base_model

    try:
        width = next(unwrap_base_model(model).parameters()).element_size()
    except StopIteration:
        width = 2
    return min(width, 2) if autocast_half else width


def model_kv_bytes_per_token(model: torch.nn.Module, autocast_half: bool = False) -> float:
    """Bytes of K and V of one token over all layers (``layers x kv_heads x (head_dim + v_head_dim) x`` the
    :func:`kv_element_bytes`; the widths differ under multi-head latent attention, DeepSeek-V3's).

    A heterogeneous config (transformers' ``per_layer_config``, e.g. Gemma 4's wider global
    layers) is summed layer by layer: reading a per-layer attribute off the whole config raises."""
    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    cfg = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if getattr(cfg, "is_heterogeneous", False):
        per_layer = list(cfg.per_layer_config)
    else:
        per_layer = [cfg] * int(getattr(cfg, "num_hidden_layers", 1) or 1)
    values = 0
    for c in per_layer:
        heads = int(getattr(c, "num_attention_heads", 1) or 1)
        kv = int(getattr(c, "num_key_value_heads", None) or heads)
        k_dim, v_dim = key_value_widths(lambda name, c=c: getattr(c, name, None),
                                        int(getattr(c, "head_dim", None) or c.hidden_size // heads))
        values += kv * (k_dim + v_dim)
    return 1.0 * values * kv_element_bytes(base, autocast_half)

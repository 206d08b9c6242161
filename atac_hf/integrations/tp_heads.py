"""How a model's own ``tp_plan`` splits its attention heads over TP ranks (used by :mod:`.tensor_parallel`).

``tp_head_split``: the factor the heads (and K/V) are split by (``tp_size`` where the q/k/v projections are
column-sharded without gathering their output; 1 where the plan gathers it: Olmo2, Olmo3, OlmoE, Phi3 run every head
on each TP rank); the per-layer head counts of configs with per-layer attention (Gemma 4, Dots3); the refusal of a
parameter laid out per head that the plan leaves whole (Cohere's ``use_qk_norm`` norms); the tp sizes a refusal
suggests. Pure: no process group, except the default group's size where a refusal lists sizes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["tp_head_split"]


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _layer_heads(cfg: Any) -> list[tuple[int, int]]:
    """(attention heads, key/value heads) of each layer of a config with per-layer ones (``is_heterogeneous``,
    whose global value is ambiguous), else of the config (0 where it has none)."""
    out = []
    for c in list(cfg.per_layer_config) if getattr(cfg, "is_heterogeneous", False) else [cfg]:
        heads = int(getattr(c, "num_attention_heads", 0) or 0)
        out.append((heads, int(getattr(c, "num_key_value_heads", None) or heads)))
    return out


def _resolved_plan(base: torch.nn.Module, tp_size: int) -> dict[str, str]:
    from transformers.distributed import DistributedConfig

    plan, _, _ = base._resolve_parallel_plans(DistributedConfig(tp_size=int(tp_size)))
    return plan


def _legal_tp_sizes(heads: int, kv: int, world_size: int | None, cp_size: int) -> list[int]:
    """tp sizes dividing both head counts and, where known, ``world_size / cp_size`` (else the default group's size)."""
    if world_size is None and dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()  # (cp_size 1 where unknown: tp must at least divide the world)
    ranks = world_size // max(int(cp_size), 1) if world_size else None
    return [d for d in range(1, max(min(heads, kv), 1) + 1)
            if heads % d == 0 and kv % d == 0 and (not ranks or ranks % d == 0)]


#: Styles whose module output stays sharded over TP (a q/k/v projection with one of them gives each rank its heads).
_SPLIT_OUTPUT_STYLES = ("colwise", "unit_colwise", "packed_colwise", "local_colwise")


def tp_head_split(model: torch.nn.Module, tp_size: int) -> int:
    """The factor the attention heads (and K/V) are split by on each TP rank under the model's own ``tp_plan``.

    ``tp_size`` where the plan column-shards an attention input projection and keeps its
    output sharded (``colwise``: Llama, Qwen3, DeepSeek-V3's ``kv_b_proj``); 1 where the plan
    gathers their outputs (``colwise_gather_output``: Olmo2, Olmo3, Phi3) or has no rule inside
    the attention: every TP rank then runs ``atac_cp`` on all heads and moves the full K/V.
    Divide the K/V bytes per token by this, not by ``tp_size``. Pure (no process group).
    """
    from .sharder import unwrap_base_model

    tp_size = int(tp_size)
    base = unwrap_base_model(model)
    if tp_size <= 1 or not hasattr(base, "_resolve_parallel_plans"):
        return 1
    try:
        plan = _resolved_plan(base, tp_size)
    except ValueError:  # no tp_plan at all (check_tp_model refuses such a model under TP)
        return 1
    return _head_split_of_plan(base, plan, tp_size)


def _attention_prefixes(base: torch.nn.Module) -> list[str]:
    """``"name."`` of every attention block: a class named ``*Attention`` or a module named ``*attn*`` / ``*attention*``
    (LongCat-Flash's ``self_attn`` is a ModuleList of MLA blocks)."""
    return [n + "." for n, m in base.named_modules()
            if n and (type(m).__name__.endswith("Attention") or any(w in n.rpartition(".")[2].lower()
                                                                    for w in ("attn", "attention")))]


def _head_split_of_plan(base: torch.nn.Module, plan: dict[str, str], tp_size: int) -> int:
    modules = dict(base.named_modules())
    prefixes = _attention_prefixes(base)
    styles = {v for k, v in plan.items() if k in modules and any(k.startswith(p) for p in prefixes)}
    return tp_size if styles & set(_SPLIT_OUTPUT_STYLES) else 1


def _check_per_head_params(base: torch.nn.Module, plan: dict[str, str], tp_size: int, heads: int, kv: int) -> None:
    """Refuse a parameter laid out per head, ``(..., heads or kv_heads, head_dim)``, that the plan leaves whole
    while it splits the heads: each TP rank would apply all heads' values to its own heads (Cohere's
    ``use_qk_norm`` norms: a shape error in the first forward, or wrong heads where the counts match)."""
    cfg = _text_config(base.config)
    layers = list(cfg.per_layer_config) if getattr(cfg, "is_heterogeneous", False) else [cfg]  # Gemma 4
    head_shapes = set()
    for c in layers:
        h = int(getattr(c, "num_attention_heads", 0) or heads)
        k = int(getattr(c, "num_key_value_heads", None) or kv or h)
        d = int(getattr(c, "head_dim", None) or (c.hidden_size // h if h else 0))
        head_shapes |= {(n, d) for n in (h, k) if n > 1 and d}
    for pname, p in base.named_parameters():
        if pname in plan or pname.rpartition(".")[0] in plan:
            continue
        if p.dim() >= 2 and tuple(p.shape[-2:]) in head_shapes:
            raise ValueError(
                f"tp_size={tp_size}: {type(base).__name__}'s parameter {pname!r} has a per-head shape "
                f"{tuple(p.shape)} (heads x head_dim) but no entry in its tp_plan, while the plan splits the "
                f"attention heads over TP ranks; it cannot be split with them. Set tp_size=1 "
                "(parallelism_config tp_size / parallelism_config_tp_size) and use cp_size / DP instead")

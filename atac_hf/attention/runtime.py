"""The ``atac_cp`` attention implementation for Transformers models.

Per layer on each rank: start an async all-gather of the local K/V rows of gathered
documents, compute attention of whole local documents while it runs, then attend the
local chunks of gathered documents to their document's key prefix. The result is
single-device document-masked causal attention on the full packed row, forward and
backward (the gather's backward reduce-scatters gradients to the owners). Plans with
``kv_exchange="all_to_all"`` instead send each rank only the K/V rows its chunks attend to
(:mod:`.kv_exchange`; backward: the transposed all-to-all).

Shape legend: H query heads, K key/value heads, S local tokens, D head dim.
"""

from __future__ import annotations

import math
import numbers
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from .compat import rope_types, sub_configs
from ..packing.validate import InputTypeError, _short
from ..sharding.plan import ShardPlan
from .backends import BACKENDS, run_backend
from .collectives import KVGather, attach
from .kv_exchange import start_all_to_all
from .relay import active_context
from .shard import ShardContext

__all__ = [
    "ATTENTION_DROPOUT_FIELDS",
    "ATTN_IMPLEMENTATION",
    "SHARD_KWARG",
    "UncheckedModelWarning",
    "atac_cp_attention",
    "attention_dropout_field",
    "check_model_supported",
    "emulate_cp_attention",
    "mark_checked",
    "register_attention",
]

ATTN_IMPLEMENTATION = "atac_cp"
#: Attention backends that apply attention sinks (``s_aux``) and logit soft-capping (``softcap``);
#: ``auto`` runs ``sdpa`` for them.
SINK_BACKENDS = ("sdpa", "auto")
SHARD_KWARG = "atac_shard"
_POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")
# what check_model_supported refuses: values that are no model or config (a model name, a dict)
_NOT_A_CONFIG = (str, bytes, bytearray, numbers.Number, Mapping, list, tuple, set, frozenset, np.ndarray,
                 torch.Tensor)


def check_model_supported(model_or_config: Any) -> None:
    """Refuse models whose results would change under sharding.

    Args:
        model_or_config: a Transformers model, or its config (any object with config attributes).

    Raises:
        InputTypeError: ``model_or_config`` (or its ``.config``) is None, a str, a number or a
            container, not a model or config.
        ValueError: a RoPE type (``dynamic``, ``longrope``) that depends on the largest
            position a rank sees.
    """
    config = getattr(model_or_config, "config", model_or_config)
    if config is None or isinstance(config, _NOT_A_CONFIG):
        where = "" if config is model_or_config else f" (its .config is {_short(config)})"
        raise InputTypeError(
            f"model_or_config={_short(model_or_config)}{where} is not a model or config: check_model_supported "
            "takes a Transformers model or its config (pass model or model.config), not a name, number or container")
    _refuse_position_dependent_rope(config)


def _refuse_position_dependent_rope(config: Any) -> None:
    """:func:`check_model_supported` on a config already known to be one (the per-batch check)."""
    for cfg in sub_configs(config):
        for t in rope_types(cfg):
            if any(p in t for p in _POSITION_DEPENDENT_ROPE):
                raise ValueError(
                    f"rope type {t!r} (config.rope_parameters) depends on the largest position a rank sees and "
                    "gives wrong results under context parallelism; use a static rope type (default, linear, "
                    "llama3, yarn), or train without atac-hf (its stock attention on unpacked rows: a packed row's "
                    "largest position is not each document's, so atac-hf refuses it at cp_size=1 too)"
                )


# Config fields that hold the attention-probability dropout, by family (Llama, GPT-2, BERT-like, ...).
ATTENTION_DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "attn_dropout",
                            "attention_dropout_prob", "attn_dropout_prob")


def attention_dropout_field(config: Any) -> str:
    """The config field that sets this model's attention dropout (the first one > 0, else the first present)."""
    present = [f for f in ATTENTION_DROPOUT_FIELDS if isinstance(getattr(config, f, None), (int, float))]
    positive = [f for f in present if float(getattr(config, f)) > 0]
    return (positive or present or ["attention_dropout"])[0]


def _context(module: Any, kwargs: dict) -> ShardContext:
    ctx = kwargs.get(SHARD_KWARG)
    if ctx is None:
        # a model that drops its forward's **kwargs before the attention call: the context of the
        # enclosing call, relayed by the hooks of atac_hf.attention.relay (installed by prepare_model)
        ctx = active_context()
    if ctx is None:
        raise ValueError(
            f"attn_implementation={ATTN_IMPLEMENTATION!r} needs the per-batch shard context (kwarg {SHARD_KWARG!r} "
            f"is missing in {type(module).__name__}). After training (ATACTrainer and ATACAccelerator leave the "
            "model on 'atac_cp'), switch the attention back before generate() or a plain forward: "
            "model.set_attn_implementation('sdpa'). In an ATACTrainer subclass, a training_step or prediction_step "
            "override that does not call super() skips the step that shards the batch: call super(). To train by "
            "hand, call model(**atac_hf.shard_batch(batch, plan, rank, "
            "group)); if you did, this model does not pass its forward's **kwargs on to its attention layers: call "
            "atac_hf.integrations.prepare_model(model) first, which relays the context to them"
        )
    if not isinstance(ctx, ShardContext):
        raise TypeError(f"{SHARD_KWARG}= must be a ShardContext from shard_batch, got {type(ctx).__name__}")
    return ctx


def _check_call(module: Any, ctx: ShardContext, query: torch.Tensor, key: torch.Tensor, dropout: float,
                kwargs: dict) -> int | None:
    if dropout and dropout > 0:
        name = attention_dropout_field(getattr(module, "config", None))
        raise NotImplementedError(
            f"attention dropout ({dropout}, config.{name}) is not implemented by "
            f"{ATTN_IMPLEMENTATION!r}; set {name}=0.0"
        )
    if getattr(module, "is_causal", True) is False or kwargs.get("is_causal", True) is False:
        raise NotImplementedError(f"non-causal attention is not implemented by {ATTN_IMPLEMENTATION!r}")
    for name, what in _UNSUPPORTED_SCORE_KWARGS:
        if kwargs.get(name) is not None:  # ignoring it would silently compute another attention
            raise NotImplementedError(
                f"{type(module).__name__} passes {name}= ({what}) to its attention, which {ATTN_IMPLEMENTATION!r} "
                "does not implement; train this model without atac-hf: its stock attention on unpacked rows "
                "(atac-hf refuses it at cp_size=1 too)")
    config = getattr(module, "config", None)
    if config is not None and ctx.cache.get("checked_config") is not config:
        _check_config(module, config, ctx.plan.cp_size)
        _warn_if_unchecked(module, config)
        ctx.cache["checked_config"] = config
    n = ctx.layout.n_local
    if query.shape[0] != 1 or query.shape[2] != n or key.shape[2] != n:
        extra = ("; if it was, the model added tokens of its own (an adapter with virtual tokens or key/value "
                 "prefixes, e.g. PEFT prompt or prefix tuning, cannot be sharded)"
                 if query.shape[0] == 1 and max(query.shape[2], key.shape[2]) > n else "")
        raise ValueError(
            f"rank {ctx.rank} expects one local row of {n} tokens (plan {ctx.plan.digest}), got query of shape "
            f"{tuple(query.shape)}: pass model(**shard_batch(batch, plan, rank, ...)) with the same plan{extra}"
        )
    window = kwargs.get("sliding_window")
    if window is not None and (isinstance(window, bool) or int(window) < 1):
        raise ValueError(f"sliding_window must be None or an int >= 1, got {window!r}")
    sinks, softcap = kwargs.get("s_aux"), kwargs.get("softcap")
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.numel() != query.shape[1]):
        got = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"s_aux (attention sinks) must be a tensor of one logit per query head "
                         f"({query.shape[1]}), got {got}")
    _check_softcap(softcap)
    for name, what, value in (("s_aux", "attention sinks", sinks), ("softcap", "logit soft-capping", softcap)):
        if value is not None and ctx.backend not in SINK_BACKENDS:
            raise NotImplementedError(
                f"{type(module).__name__} uses {what} ({name}), which attention_backend={ctx.backend!r} does not "
                f"apply; legal values with {what}: {list(SINK_BACKENDS)} (set attention_backend='sdpa' in "
                "ATACConfig)")
    return None if window is None else int(window)


#: Attention-call keywords of transformers families that change the scores in a way ``atac_cp`` does
#: not implement (read off transformers 5.25's ``attention_interface(...)`` calls): refused, not ignored.
_UNSUPPORTED_SCORE_KWARGS = (
    ("position_bias", "a relative position bias added to the scores"),
    ("indices", "sparse attention over top-k selected keys"),
    ("block_indices", "block-sparse attention over selected key blocks"),
    ("sinks", "attention sinks under a name atac_cp does not read; GPT-OSS-like s_aux is supported"),
)


class UncheckedModelWarning(UserWarning):
    """``atac_cp`` ran on a model that :func:`atac_hf.check_model` has not accepted."""


# configs of the models check_model accepted (by id, with a weak reference that tells a reused id apart)
_CHECKED: dict[int, weakref.ref] = {}
_WARNED: set[str] = set()


def mark_checked(config: Any) -> None:
    """Record that :func:`atac_hf.check_model` accepted a model with ``config`` (and its text config):
    ``atac_cp`` then runs on it without an :class:`UncheckedModelWarning`."""
    configs = [config] + ([config.get_text_config()] if hasattr(config, "get_text_config") else [])
    for cfg in configs:
        if cfg is not None:
            _CHECKED[id(cfg)] = weakref.ref(cfg)


def _warn_if_unchecked(module: Any, config: Any) -> None:
    ref = _CHECKED.get(id(config))
    if ref is not None and ref() is config:
        return
    name = f"{type(module).__name__} (model_type {getattr(config, 'model_type', '?')!r})"
    if name in _WARNED:
        return
    _WARNED.add(name)
    warnings.warn(
        f"{ATTN_IMPLEMENTATION!r} runs on {name} without atac_hf.check_model(model): some families give silently "
        "wrong results through it (a sliding window applied only through the mask, attention in their own code, "
        "router losses under CP); call atac_hf.check_model(model) once before training (ATACTrainer, "
        "ATACAccelerator and prepare_model do it)", UncheckedModelWarning, stacklevel=4)


def _check_config(module: Any, config: Any, cp_size: int = 1) -> None:
    """Once per batch and config: the config-only rules of :func:`atac_hf.check_model`, and over
    several ranks the router-loss rule (:func:`~.model_check.router_loss_refusal`)."""
    from .model_check import config_refusal, router_loss_refusal  # lazy: model_check imports this module

    _refuse_position_dependent_rope(config)
    refused = config_refusal(config) or (router_loss_refusal(config) if cp_size > 1 else None)
    if refused is not None:
        exc, reason = refused
        raise exc(f"{type(module).__name__} (model_type {getattr(config, 'model_type', '?')!r}) {reason}")


def _send_rows(k_KSD: torch.Tensor, v_KSD: torch.Tensor, send_index: torch.Tensor, max_send: int) -> torch.Tensor:
    """(max_send, K, Dk + Dv): this rank's K/V rows of gathered documents, zero-padded."""
    k_SKD = k_KSD.transpose(0, 1).index_select(0, send_index)
    v_SKD = v_KSD.transpose(0, 1).index_select(0, send_index)
    send = torch.cat([k_SKD, v_SKD], dim=-1)
    return F.pad(send, (0, 0, 0, 0, 0, max_send - send.shape[0]))


def _split(kv_RKX: torch.Tensor, dk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return kv_RKX[..., :dk], kv_RKX[..., dk:]


@torch.compiler.disable  # run as Python under torch.compile: dynamo guarded on each batch's plan and recompiled
def atac_cp_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Exact document-masked causal attention of one CP rank's shard.

    Args:
        module: the attention module (reads ``config`` once per batch for support checks).
        query: (1, H, S, D); key, value: (1, K, S, D), RoPE applied, not repeated for GQA.
        attention_mask: ignored: the document mask comes from the plan (Transformers
            passes None for registered custom implementations).
        dropout: must be 0.
        scaling: softmax scale (``D ** -0.5`` if None).
        **kwargs: ``atac_shard`` (the :class:`ShardContext`), ``sliding_window`` (int W:
            query at position i sees keys i - W < j <= i), ``s_aux`` (attention sinks: one logit
            per query head, GPT-OSS-like models), ``softcap`` (Gemma 2's logit soft-capping), both
            on the ``sdpa`` backend; others ignored.

    Returns:
        ``(out, None)`` with out (1, S, H, D).

    Raises:
        ValueError: no or a mismatched shard context; unsupported RoPE type.
        NotImplementedError: dropout > 0, non-causal modules, ``s_aux`` or ``softcap`` with a
            backend other than ``sdpa`` / ``auto``.
    """
    ctx = _context(module, kwargs)
    window = _check_call(module, ctx, query, key, dropout, kwargs)
    ctx.record_attention(module)  # for the runtime guard: every layer must get here
    if attention_mask is not None and not ctx.cache.get("warned_mask"):
        ctx.cache["warned_mask"] = True
        warnings.warn(f"{ATTN_IMPLEMENTATION!r} ignores attention_mask: the document mask comes from the shard plan",
                      stacklevel=2)
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    query, key, value = _common_dtype(query, key, value)
    q_HSD, k_KSD, v_KSD = query[0], key[0], value[0]
    layout, dk = ctx.layout, key.shape[-1]
    if layout.exchange == "all_to_all" and window is not None:  # exchange only the keys in the window
        layout = ctx.plan.local_layout(ctx.rank, window)

    gather, wait = None, None
    if len(ctx.plan.gathered_docs) and layout.exchange == "all_to_all":  # only the needed K/V rows
        gather, wait = start_all_to_all(k_KSD, v_KSD, layout, ctx.cache, ctx.group, ctx.needs_gather)
    elif len(ctx.plan.gathered_docs):
        idx_key = ("send_index", str(query.device))
        if idx_key not in ctx.cache:
            ctx.cache[idx_key] = torch.as_tensor(layout.send_index, device=query.device)
        send = _send_rows(k_KSD, v_KSD, ctx.cache[idx_key], layout.max_send)
        if ctx.needs_gather:
            gather = KVGather(send, ctx.group)
            wait = lambda: _split(gather.wait(), dk)  # noqa: E731
        else:  # cp_size 1: the "gathered" buffer is this rank's own rows, no collective
            wait = lambda: _split(send, dk)  # noqa: E731

    extra = _score_options(kwargs)
    # only the sdpa backend applies sinks and soft-capping ("auto" picks it for them)
    out_SHD = run_backend("sdpa" if extra else ctx.backend, q_HSD, k_KSD, v_KSD, layout, ctx.cache, wait,
                          scaling=scale, window=window, **extra)
    if gather is not None and not gather.waited:
        # this rank attends to no gathered key: still wait, and keep the backward
        # reduce-scatter in the graph (the other ranks take part in it)
        out_SHD = attach(out_SHD, gather.wait())
    return out_SHD.unsqueeze(0).contiguous(), None


def _common_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """q, k, v in one dtype: some models rotate q/k in fp32 under autocast while v stays in the autocast dtype
    (GPT-OSS with bf16=True: the CPU flash kernel refused "expected scalar type Float but found BFloat16"), and
    the kernels and the K/V exchange take one. Autocast's dtype when it is on (what the stock attention's
    matmuls run in), else the promoted one."""
    if query.dtype == key.dtype == value.dtype:
        return query, key, value
    dev = query.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
    else:
        dt = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    return query.to(dt), key.to(dt), value.to(dt)


def _check_softcap(softcap: Any) -> None:
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(float(softcap)) or not float(softcap) > 0):
        raise ValueError(f"softcap (attention logit soft-capping) must be a finite number > 0 or None, got {softcap!r}")


def _score_options(kwargs: dict) -> dict:
    """The sdpa backend's ``sinks`` / ``softcap`` arguments from a call's ``s_aux`` / ``softcap``."""
    extra = {}
    if kwargs.get("s_aux") is not None:
        extra["sinks"] = kwargs["s_aux"].reshape(-1)
    if kwargs.get("softcap") is not None:
        _check_softcap(kwargs["softcap"])
        extra["softcap"] = float(kwargs["softcap"])
    return extra


def register_attention(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register :func:`atac_cp_attention` in ``transformers.AttentionInterface`` (idempotent).

    Raises:
        InputTypeError: ``name`` is not a str.
        ValueError: ``name`` is empty, or already taken by another function (built-in names included).
    """
    if not isinstance(name, str):
        raise InputTypeError(f"register_attention(name={_short(name)}): name must be a non-empty str, the "
                             f"attn_implementation to register (default {ATTN_IMPLEMENTATION!r})")
    if not name.strip():
        raise ValueError(f"register_attention(name={name!r}): name must be a non-empty str, the "
                         f"attn_implementation to register (default {ATTN_IMPLEMENTATION!r})")
    from transformers import AttentionInterface

    existing = AttentionInterface().get(name)
    if existing is atac_cp_attention:
        return name
    ours = getattr(existing, "__module__", None) == __name__ and getattr(existing, "__qualname__", "") == "atac_cp_attention"
    if existing is not None and not ours:
        raise ValueError(
            f"attention implementation {name!r} is already registered "
            f"({getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', '?')}); pick another name"
        )
    AttentionInterface.register(name, atac_cp_attention)
    return name


# ---------------------------------------------------------------------------- emulation
def emulate_cp_attention(
    q_HND: torch.Tensor,
    k_KND: torch.Tensor,
    v_KND: torch.Tensor,
    plan: ShardPlan,
    *,
    backend: str = "sdpa",
    scaling: float | None = None,
    window: int | None = None,
    caches: list[dict] | None = None,
    per_rank_hook: Callable[[int, torch.Tensor], None] | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Run every rank of ``plan`` in one process (the gather is a concatenation).

    Same bookkeeping and backends as the distributed path; differentiable. For tests
    and single-GPU checks (e.g. ``flash`` against ``sdpa``).

    Args:
        q_HND: (H, N, D) queries of the full packed row; k_KND, v_KND: (K, N, D).
        plan: the shard plan of the row.
        backend: one of ``BACKENDS``.
        scaling, window: as in :func:`atac_cp_attention`.
        caches: optional per-rank dicts for the index tensors (reused across calls).
        per_rank_hook: called with (rank, out_SHD) after each rank.
        sinks: (H,) attention sinks (``s_aux``); softcap: attention logit soft-capping; both
            applied by the ``sdpa`` backend only.

    Returns:
        (N, H, D) output in row order.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; legal values: {sorted(BACKENDS)}")
    extra = _score_options({"s_aux": sinks, "softcap": softcap})
    if extra and backend not in SINK_BACKENDS:
        raise NotImplementedError(f"attention sinks and soft-capping need a backend of {list(SINK_BACKENDS)}, "
                                  f"got {backend!r}")
    backend = "sdpa" if extra else backend
    C, dev = plan.cp_size, q_HND.device
    scale = q_HND.shape[-1] ** -0.5 if scaling is None else float(scaling)
    caches = caches if caches is not None else [{} for _ in range(C)]
    layouts = [plan.local_layout(r, window) for r in range(C)]
    tok = [torch.as_tensor(plan.rank_token_indices(r), device=dev) for r in range(C)]
    local = [(q_HND.index_select(1, t), k_KND.index_select(1, t), v_KND.index_select(1, t)) for t in tok]
    gathered = None
    if len(plan.gathered_docs) and plan.kv_exchange == "all_to_all":
        return _emulate_all_to_all(local, layouts, tok, backend, caches, scale, window, per_rank_hook, extra)
    if len(plan.gathered_docs):
        m = layouts[0].max_send
        sends = [_send_rows(k, v, torch.as_tensor(lay.send_index, device=dev), m)
                 for (_, k, v), lay in zip(local, layouts)]
        gathered = _split(torch.cat(sends, dim=0), k_KND.shape[-1])
    outs = []
    for r in range(C):
        q, k, v = local[r]
        out = run_backend(backend, q, k, v, layouts[r], caches[r], (lambda: gathered) if gathered else None,
                          scaling=scale, window=window, **extra)
        if per_rank_hook is not None:
            per_rank_hook(r, out)
        outs.append(out)
    order = torch.cat(tok)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(len(order), device=dev)
    return torch.cat(outs, dim=0).index_select(0, inv)


def _emulate_all_to_all(local, layouts, tok, backend, caches, scale, window, per_rank_hook,
                        extra: dict | None = None) -> torch.Tensor:
    """:func:`emulate_cp_attention` for ``all_to_all`` plans: rank r's key buffer is its own rows
    of gathered documents, then the rows each other rank sends it (in rank order)."""
    C, dev = len(layouts), local[0][0].device
    kv = [torch.cat([k.transpose(0, 1), v.transpose(0, 1)], dim=-1) for _, k, v in local]
    dk = local[0][1].shape[-1]
    # the rows rank s sends to rank r: s's send buffer, cut by its send counts
    def exchange(send: list, counts: list) -> list:
        parts = [torch.split(x, [int(c) for c in n]) for x, n in zip(send, counts)]
        return [torch.cat([parts[s][r] for s in range(C) if s != r], dim=0) for r in range(C)]

    got = exchange([kv[s].index_select(0, torch.as_tensor(lay.send_index, device=dev))
                    for s, lay in enumerate(layouts)], [lay.send_counts for lay in layouts])
    if layouts[0].route is not None:  # node-routed: the proxies forward the first phase's rows
        second = exchange([got[s].index_select(0, torch.as_tensor(lay.route["send2"], device=dev))
                           for s, lay in enumerate(layouts)], [lay.route["send2_counts"] for lay in layouts])
        got = [torch.cat([a, b], dim=0) for a, b in zip(got, second)]
    outs = []
    for r in range(C):
        q, k, v = local[r]
        own = kv[r].index_select(0, torch.as_tensor(layouts[r].self_index, device=dev))
        buf = torch.cat([own, got[r]], dim=0)
        wait = lambda buf=buf: (buf[..., :dk], buf[..., dk:])  # noqa: E731
        out = run_backend(backend, q, k, v, layouts[r], caches[r], wait, scaling=scale, window=window, **(extra or {}))
        if per_rank_hook is not None:
            per_rank_hook(r, out)
        outs.append(out)
    order = torch.cat(tok)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(len(order), device=dev)
    return torch.cat(outs, dim=0).index_select(0, inv)

"""The empirical half of the model check: a tiny copy of an architecture, run through the ``atac_cp``
path and, document by document, through the stock model.

The tiny copy keeps the model class and every feature of its config that changes what attention
sees (head_dim, GQA groups, layer types, sliding windows, chunk sizes, RoPE), with small widths, few
layers and fp64 weights. The probe row holds several documents longer than any window or chunk of
the tiny config, so a feature the ``atac_cp`` attention never hears of (a window applied only through
the attention mask, a convolution or state-space layer, attention computed outside
``AttentionInterface``) shows up as an error of order 1e-2 or more, far above the fp64 round-off
(about 1e-7 where stock models compute some steps in fp32).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from .probe_compare import (_UNDRAWN_IDS, EmbeddingTap, logits_2d, param_err, param_grads, plain_ids, reference_runs,
                            rel_err)

__all__ = ["PROBE_DOC_LENGTHS", "PROBE_TOLERANCE", "PROBE_WINDOW", "ProbeResult", "ProbeTooLarge", "StockModelError",
           "probe_plan", "run_probe", "sequence_convolutions", "shrink_config"]

PROBE_WINDOW = 8  # sliding window / chunk size of the tiny copy
# one row; all but the 1-token document cross the window, and the first is longer than half the row,
# so at 2 ranks, under probe_plan's cap, it is split (the K/V gather runs)
PROBE_DOC_LENGTHS = (41, 1, 9, 13)
PROBE_TOLERANCE = 1e-5  # max relative error accepted (fp64; stock fp32 steps give ~1e-7)
_WIDTHS = {  # standard config names -> tiny value
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
    "ffn_hidden_size": 128, "d_ff": 128, "n_inner": 128, "ffn_dim": 128, "expert_intermediate_size": 32,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
    "num_shared_experts": 1, "rotary_dim": 8, "hidden_size_per_layer_input": 16,
}
_ALIASES = {"hidden_size": ("n_embd", "d_model"), "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
            "num_attention_heads": ("n_head", "n_heads"), "intermediate_size": ("ffn_dim", "d_ff"),
            "num_key_value_heads": ("kv_n_heads", "n_kv_heads", "num_kv_heads")}
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_MOE_KEYS = _EXPERT_COUNTS + ("num_experts_per_tok", "moe_topk", "n_group", "topk_group", "n_shared_experts")

_MAX_LAYERS = 8
_MAX_PARAMS = 20_000_000  # a tiny copy above this means the shrink missed a size field


class ProbeTooLarge(ValueError):
    """The tiny copy still has too many parameters to probe (a size field the shrink missed)."""


class StockModelError(RuntimeError):
    """The stock model itself (built with its own attention) failed on the tiny copy, before the
    ``atac_cp`` path ran: no exactness can be shown. The original exception is ``__cause__``."""


@dataclass(frozen=True)
class ProbeResult:
    """What the probe measured.

    Attributes:
        max_error: max relative error (``max |a - b| / max |b|``) of logits, input-embedding gradients
            and each parameter's gradient (:func:`~.probe_compare.param_err`), ``atac_cp`` path against
            per-document stock runs (fed token ids, or embeddings to a class that takes only those).
        layers: decoder layers of the tiny copy (``num_hidden_layers``).
        attention_classes: names of the module classes that reached the ``atac_cp`` attention.
        reached: how many distinct modules reached it in one forward.
        stock_attention: the attention implementation of the reference runs.
    """

    max_error: float
    layers: int
    attention_classes: tuple[str, ...]
    reached: int
    stock_attention: str


def _has_moe_hint(d: dict) -> bool:
    return any(isinstance(d.get(k), int) for k in ("moe_intermediate_size", "first_k_dense_replace"))


def _num_layers_for(d: dict, old: int) -> int:
    """Fewest layers that keep every layer type of the config (>= 2, <= 8)."""
    types = d.get("layer_types")
    if not isinstance(types, (list, tuple)) or not types:
        return 2
    seen, n = set(), 0
    for n, t in enumerate(types, start=1):
        seen.add(t)
        if len(seen) == len(set(types)):
            break
    if _pair_blocks(types):
        n += n % 2  # each layer stored as two blocks (attention, then mlp): whole layers only
    return max(2, min(n, _MAX_LAYERS, old))


def _pair_blocks(types: Any) -> bool:
    """Whether ``types`` lists each layer as two blocks: one block type at every odd place and nowhere
    else (e.g. Dory's serialized [attention, "mlp", attention, "mlp", ...])."""
    if not isinstance(types, (list, tuple)) or len(types) < 2 or len(types) % 2:
        return False
    odd = set(types[1::2])
    return len(odd) == 1 and not odd & set(types[0::2])


def _split_counts(d: dict, old: int, new: int, step: int) -> None:
    """Integer fields that split the layers into groups (``n_input_layers + n_recurrent_layers +
    n_output_layers == num_hidden_layers``) split the tiny depth alike, each group kept (>= ``step``)."""
    keys = [k for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0
            and k.endswith("_layers") and k.startswith(("n_", "num_")) and k != "num_hidden_layers"]
    if len(keys) < 2 or sum(d[k] for k in keys) != old or new < step * len(keys):
        return
    parts = {k: step for k in keys}
    rest = (new - step * len(keys)) // step
    shares = sorted(keys, key=lambda k: -d[k])
    for i in range(rest):
        parts[shares[i % len(shares)]] += step
    d.update(parts)


def shrink_config(config: Any, *, window: int = PROBE_WINDOW) -> Any:
    """A tiny copy of ``config`` (a new object; ``config`` is not changed).

    Widths, expert counts and the vocabulary shrink; head_dim (16), the GQA grouping, the layer
    pattern (per-layer lists are cut to the new depth), sliding windows and chunk sizes (both
    ``window``) keep the architecture's structure. Dropout fields become 0.
    """
    cls = type(config)
    d = _shrink_dict(config, window)
    try:
        return cls.from_dict(d)
    except Exception:  # noqa: BLE001 - configs whose dict does not round-trip: change the attributes instead
        tiny = copy.deepcopy(config)
        _set_changed(tiny, d)
        return tiny


def _set_changed(config: Any, d: dict) -> None:
    """Set the entries of ``d`` that differ on ``config``; a sub-config (DBRX's ``attn_config``) is
    changed in place, entry by entry (transformers 5.17's DBRX config dict does not round-trip)."""
    for k, v in d.items():
        old = getattr(config, k, None)
        if hasattr(old, "to_dict"):
            if isinstance(v, dict):
                _set_changed(old, v)
        elif old != v:
            setattr(config, k, v)


def _std_names(config: Any, d: dict) -> dict:
    """Any standard or aliased name -> the key ``d`` stores it under."""
    amap = dict(getattr(config, "attribute_map", {}) or {})  # attribute name -> stored key
    std = {k: k for k in d}
    std.update({a: k for a, k in amap.items() if k in d})
    for name, others in _ALIASES.items():
        if name not in std:
            std.update({name: o for o in others if o in d})
    return std


def _shrink_dict(config: Any, window: int, parent_heads: Any = None) -> dict:
    """``config.to_dict()`` with the tiny sizes; sub-configs (text, vision, attention, ...) shrink
    alike (one that sets the K/V heads of its parent's query heads groups them as the parent)."""
    d = copy.deepcopy(config.to_dict())
    std = _std_names(config, d)
    heads = d.get(std.get("num_attention_heads", ""), None)
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict") and isinstance(d.get(key), dict):
            d[key] = _shrink_dict(sub, window, heads)

    def put(name: str, value: Any) -> None:
        if name in std:
            d[std[name]] = value

    orig = copy.deepcopy(d)
    kv = d.get(std.get("num_key_value_heads", ""), None)
    if heads is None and isinstance(parent_heads, int) and isinstance(kv, int):
        heads = parent_heads  # e.g. DBRX's attn_config.kv_n_heads for the model's n_heads
        put("num_key_value_heads", 1 if kv == 1 else (4 if kv >= heads else 2))
    old_layers = d.get(std.get("num_hidden_layers", ""), None)
    moe = _has_moe_hint(d) or any(isinstance(d.get(std.get(k, "")), int) for k in _EXPERT_COUNTS)
    for name, value in _WIDTHS.items():
        cur = d.get(std.get(name, ""), "absent")
        if isinstance(cur, int) and not isinstance(cur, bool):
            put(name, min(value, cur) if name in ("n_shared_experts", "num_shared_experts") else value)
        elif cur is None and name in _MOE_KEYS and moe:
            put(name, value)  # a MoE family whose default leaves its experts unset
        elif (isinstance(cur, list) and cur and all(isinstance(x, int) and not isinstance(x, bool) for x in cur)
              and max(cur) > 0):  # one width per layer: the tiny value for the widest, the others in proportion
            put(name, [max(1, round(value * x / max(cur))) if x > 0 else x for x in cur])
    if isinstance(heads, int) and "num_attention_heads" in std:
        put("num_attention_heads", 4)
        if isinstance(kv, int):
            put("num_key_value_heads", 1 if kv == 1 else (4 if kv >= heads else 2))
        elif kv is None and "num_key_value_heads" in std:
            put("num_key_value_heads", 4)  # unset means one K/V head per query head
    if "head_dim" in d:  # also when None: some models read it without a fallback
        d["head_dim"] = d["qk_rope_head_dim"] if isinstance(d.get("qk_rope_head_dim"), int) else 16
    if isinstance(d.get("qk_head_dim"), int) and "qk_nope_head_dim" in d and "qk_rope_head_dim" in d:
        d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]  # derived, stored stale
    if isinstance(old_layers, int):
        new = _num_layers_for(d, old_layers)
        shared = d.get("num_kv_shared_layers")
        if isinstance(shared, int) and not isinstance(shared, bool) and 0 < shared:
            # the last `shared` layers reuse the K/V of the last earlier layer of their type: keep a
            # producing prefix with every layer type and a consuming suffix repeating it (or, when every
            # layer reuses K/V from elsewhere, all of them)
            new = new if shared >= old_layers else min(old_layers, new + min(shared, new))
            d["num_kv_shared_layers"] = new if shared >= old_layers else new - _num_layers_for(d, old_layers)
        put("num_hidden_layers", new)
        _split_counts(d, old_layers, new, 2 if _pair_blocks(d.get("layer_types")) else 1)
        for k, v in list(d.items()):
            if isinstance(v, list) and len(v) == old_layers and old_layers != new:
                d[k] = v[:new]
        for k in ("first_k_dense_replace", "max_window_layers"):
            if isinstance(d.get(k), int):
                d[k] = min(d[k], new // 2)
    vocab = 128
    if isinstance(d.get(std.get("vocab_size", "vocab_size")), int):
        put("vocab_size", vocab)
    for k, v in list(d.items()):  # other vocabularies (per-layer input embeddings, ...) shrink alike
        if k.startswith("vocab_size_") and isinstance(v, int) and not isinstance(v, bool) and v > vocab:
            d[k] = vocab
    plain = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")
    for k in plain:
        v = d.get(k)
        if isinstance(v, int) and v >= vocab:
            d[k] = vocab - 1
        elif isinstance(v, list):
            d[k] = [min(int(x), vocab - 1) for x in v]
    # placeholder tokens of multimodal models (image_token_id, audio_token_index, ...): inside the tiny
    # vocabulary (the model embeds them to find placeholders), on ids the probe never draws (0-2)
    spare = 0
    for k, v in list(d.items()):
        if (k.endswith(("_token_id", "_token_index")) and k not in plain and isinstance(v, int)
                and not isinstance(v, bool) and v >= vocab):
            d[k], spare = spare % _UNDRAWN_IDS, spare + 1
    for k in ("sliding_window", "attention_chunk_size"):
        if isinstance(d.get(k), int) and not isinstance(d[k], bool):
            d[k] = window
    for k, v in list(d.items()):
        if isinstance(v, float) and ("dropout" in k or "pdrop" in k):
            d[k] = 0.0
    if isinstance(d.get("per_layer_config"), dict):
        n_layers = d.get(std.get("num_hidden_layers", ""), None)
        d["per_layer_config"] = _shrink_per_layer(d["per_layer_config"], orig, d, n_layers, window)
    for private in ("_attn_implementation_autoset", "dtype", "torch_dtype"):
        d.pop(private, None)
    return d


def _shrink_per_layer(per_layer: dict, orig: dict, new: dict, n_layers: Any, window: int) -> dict:
    """A heterogeneous config's ``per_layer_config`` (layer index -> attribute overrides) for the tiny
    copy: the layers cut away go, and each override scales like the global it overrides (a layer with
    twice the global head_dim keeps twice the tiny one), so the layers still differ as they did."""
    out: dict = {}
    for idx, overrides in per_layer.items():
        try:
            i = int(idx)
        except (TypeError, ValueError):
            continue
        if isinstance(n_layers, int) and not 0 <= i < n_layers or not isinstance(overrides, dict):
            continue
        ov = copy.deepcopy(overrides)
        for k, v in overrides.items():
            if k in ("sliding_window", "attention_chunk_size") and isinstance(v, int) and not isinstance(v, bool):
                ov[k] = window
            elif isinstance(v, float) and ("dropout" in k or "pdrop" in k):
                ov[k] = 0.0
            elif isinstance(v, int) and not isinstance(v, bool):
                was, now = orig.get(k), new.get(k)
                if isinstance(was, int) and isinstance(now, int) and was > 0 and was != now:
                    ov[k] = max(1, round(now * v / was))
        heads = ov.get("num_attention_heads", new.get("num_attention_heads"))
        kv = ov.get("num_key_value_heads")
        if isinstance(heads, int) and isinstance(kv, int) and (kv > heads or heads % kv):
            ov["num_key_value_heads"] = heads if kv > heads else 1  # the GQA grouping must divide
        out[idx] = ov
    return out


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _build(model_cls: type, config: Any, attn: str) -> torch.nn.Module:
    kwargs: dict[str, Any] = {"attn_implementation": attn, "dtype": torch.float64}
    if getattr(model_cls, "_can_set_experts_implementation", lambda: False)():
        kwargs["experts_implementation"] = "eager"  # grouped_mm refuses fp64
    with torch.device("meta"):  # count first: a config the shrink missed must not fill the memory
        size = sum(p.numel() for p in model_cls._from_config(copy.deepcopy(config), **kwargs).parameters())
    if size > _MAX_PARAMS:
        raise ProbeTooLarge(f"the probe's tiny copy still has {size / 1e6:.0f}M parameters (the config's sizes could "
                         "not all be shrunk), too many to probe")
    torch.manual_seed(0)
    return model_cls._from_config(copy.deepcopy(config), **kwargs).eval()


def sequence_convolutions(model_cls: type, tiny: Any) -> list[str]:
    """The convolutions along the sequence in the decoder layers of ``model_cls`` built from ``tiny``
    (on the meta device): ``nn.Conv1d`` with a kernel wider than one token, each named with the class
    of the module that holds it (a Mamba mixer, a short convolution, ...). Such a layer mixes
    neighbouring tokens outside attention. Vision and audio towers are not looked at: only the module
    list that holds one module per decoder layer."""
    kwargs: dict[str, Any] = {"attn_implementation": "eager", "dtype": torch.float64}
    if getattr(model_cls, "_can_set_experts_implementation", lambda: False)():
        kwargs["experts_implementation"] = "eager"
    with torch.device("meta"):
        model = model_cls._from_config(copy.deepcopy(tiny), **kwargs)
    n = getattr(_text_config(tiny), "num_hidden_layers", None)
    layers = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
    if layers is None:
        return []
    named = dict(layers.named_modules())
    found = []
    for name, mod in named.items():
        if isinstance(mod, torch.nn.Conv1d) and mod.kernel_size[0] > 1:
            holder = named.get(name.rpartition(".")[0], mod)
            found.append(f"layers.{name} (kernel {mod.kernel_size[0]}, in {type(holder).__name__})")
    return found


def probe_plan(lengths: list[int], world: int):
    """The probe's ATP plan: capped at an even share of the row's tokens, so a document longer than
    that share is split whatever the cost model says (for rows this short the default model keeps
    every document whole, and the K/V gather would not run)."""
    from ..sharding import plan_shards

    return plan_shards(lengths, world, "atp", max_tokens_per_rank=-(-sum(lengths) // world))


def run_probe(model_cls: type, tiny: Any, *, rank: int = 0, world: int = 1, group: Any = None) -> ProbeResult:
    """Run ``tiny`` (a config from :func:`shrink_config`) through ``atac_cp`` and through the stock model.

    At ``world`` 1 everything runs in this process (cp_size 1); at ``world`` > 1 every rank of
    ``group`` calls it with the same arguments and the plan is sharded over them (gloo works).

    Raises:
        whatever the model raises on either path (the caller names the reason).
    """
    from .relay import install_relay
    from .runtime import ATTN_IMPLEMENTATION, register_attention
    from .shard import shard_batch, unshard

    register_attention()
    own = getattr(model_cls, "config_class", None)
    text = _text_config(tiny)
    if isinstance(own, type) and not isinstance(tiny, own) and isinstance(text, own):
        tiny = text  # a text-only class mapped from its composite config (Emu3ForCausalLM for Emu3Config)
    stock = "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    lengths = list(PROBE_DOC_LENGTHS)
    limit = getattr(_text_config(tiny), "max_position_embeddings", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and 2 <= limit < max(lengths):
        lengths = [min(length, limit) for length in lengths]  # a learned position table of fewer rows (GPT-2 n_positions)
    n = sum(lengths)
    g = torch.Generator().manual_seed(1)
    vocab = int(getattr(_text_config(tiny), "vocab_size", 128) or 128)
    ids = plain_ids(torch.randint(_UNDRAWN_IDS, vocab, (1, n), generator=g), tiny, vocab)
    try:
        model = _build(model_cls, tiny, stock)
        weight = torch.randn(n, vocab, generator=g, dtype=torch.float64)
        # stock reference: each document alone, no cache; fed token ids where the model takes them (a model may
        # read the ids beyond the embedding), else embeddings
        via_ids = True
        try:
            ref = reference_runs(model, ids, lengths, weight, vocab, via_ids=True)
        except Exception:  # noqa: BLE001 - a class that takes only embeddings, or embeds more than once: embeddings
            model.zero_grad(set_to_none=True)
            via_ids, ref = False, reference_runs(model, ids, lengths, weight, vocab, via_ids=False)
    except ProbeTooLarge:
        raise
    except Exception as e:  # noqa: BLE001 - named for the verdict: the stock model, not atac_cp, failed
        raise StockModelError(f"{type(e).__name__}: {str(e)[:300]}") from e
    ref_logits, ref_grads, ref_params = ref
    model.zero_grad(set_to_none=True)

    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    install_relay(model)  # as check_model does for the models it accepts
    pos = torch.cat([torch.arange(m) for m in lengths])[None]
    plan = probe_plan(lengths, world)
    local = shard_batch({"input_ids": ids, "position_ids": pos}, plan, rank, group)
    ctx = local["atac_shard"]
    tok = torch.as_tensor(plan.rank_token_indices(rank))
    with EmbeddingTap(model) as tap:
        if not via_ids:
            local["inputs_embeds"] = tap.embed(local.pop("input_ids"))
        logit = logits_2d(model(**local))
        (logit[:, :vocab] * weight.index_select(0, tok)[:, : logit.shape[1]]).sum().backward()
    reached = ctx.reached_modules()
    full_logits = unshard(logit[None], plan, rank, group)[0]
    full_grads = unshard(tap.grad(), plan, rank, group)[0]
    params = param_grads(model)
    if world > 1:  # each rank holds its share of every parameter's gradient
        flat = torch.cat([p.reshape(-1) for p in params]) if params else torch.zeros(0, dtype=torch.float64)
        torch.distributed.all_reduce(flat, group=group)
        params = [f.view_as(p) for f, p in zip(flat.split([p.numel() for p in params]), params)]
    err = max(rel_err(full_logits, ref_logits), rel_err(full_grads, ref_grads), param_err(params, ref_params))
    return ProbeResult(max_error=err, layers=int(getattr(_text_config(tiny), "num_hidden_layers", 0) or 0),
                       attention_classes=tuple(sorted({type(m).__name__ for m in reached})),
                       reached=len(reached), stock_attention=stock)

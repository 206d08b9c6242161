"""Hardware and model presets of the cost model: peak figures from public spec sheets and
the dimensions of public model shapes, and how a name, an HF config or a :class:`ModelDims`
resolves to them. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

__all__ = ["HARDWARE_PRESETS", "MODEL_PRESETS", "PLAIN_MLP_MODEL_TYPES", "HardwarePreset", "ModelDims",
           "key_value_widths", "model_label", "resolve_hardware", "resolve_model"]



@dataclass(frozen=True, kw_only=True)
class HardwarePreset:
    """Peak figures of one accelerator, from its public spec sheet.

    Attributes:
        name: preset key.
        bf16_flops: dense bf16 tensor-core peak, FLOP/s.
        intra_node_bw: per-GPU one-direction link bandwidth inside a node, bytes/s.
        inter_node_bw: per-GPU network bandwidth between nodes, bytes/s.
        link_latency_s: latency of one collective step.
        source: where the figures come from.
    """

    name: str
    bf16_flops: float
    intra_node_bw: float
    inter_node_bw: float
    link_latency_s: float
    source: str


HARDWARE_PRESETS: dict[str, HardwarePreset] = {
    # NVIDIA A800 SXM4 80GB (the A100 80GB datasheet figures; A800 caps NVLink at
    # 400 GB/s bidirectional): 312 TFLOPS dense BF16, NVLink 400 GB/s -> 200 GB/s
    # one direction; 4x200 Gb/s HDR InfiniBand per 8 GPUs -> 12.5 GB/s per GPU.
    "A800": HardwarePreset(
        name="A800",
        bf16_flops=312e12,
        intra_node_bw=200e9,
        inter_node_bw=12.5e9,
        link_latency_s=10e-6,
        source="NVIDIA A100 Tensor Core GPU datasheet (A800: NVLink 400 GB/s)",
    ),
    # NVIDIA H100 SXM5: 989 TFLOPS dense BF16 (1979 with sparsity), NVLink 900 GB/s
    # bidirectional -> 450 GB/s one direction; 400 Gb/s NDR per GPU -> 50 GB/s.
    "H100": HardwarePreset(
        name="H100",
        bf16_flops=989e12,
        intra_node_bw=450e9,
        inter_node_bw=50e9,
        link_latency_s=8e-6,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5)",
    ),
    # NVIDIA H200 SXM: same compute as H100 SXM (989 TFLOPS dense BF16), 141 GB
    # HBM3e, NVLink 900 GB/s bidirectional; 400 Gb/s NDR per GPU.
    "H200": HardwarePreset(
        name="H200",
        bf16_flops=989e12,
        intra_node_bw=450e9,
        inter_node_bw=50e9,
        link_latency_s=8e-6,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM)",
    ),
}


@dataclass(frozen=True, kw_only=True)
class ModelDims:
    """The dimensions of a decoder-only transformer that the cost depends on.

    Attributes:
        hidden_size: model width.
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads (GQA when smaller than ``num_heads``).
        head_dim: per-head width.
        intermediate_size: MLP width (three matrices, or two: ``gated_mlp``).
        vocab_size: vocabulary (for the LM head in the simulator).
        sliding_window: attention window in tokens, or None for full attention.
        sliding_window_layers: how many of the layers attend within ``sliding_window`` (the
            others attend to whole prefixes, as Gemma 2/3's, GPT-OSS's or Qwen2's
            ``max_window_layers`` full layers); None: all of them.
        v_head_dim: per-head width of the values where it differs from the keys' (``head_dim``:
            multi-head latent attention, DeepSeek-V3's 192-wide keys and 128-wide values); None:
            ``head_dim``.
        tie_word_embeddings: the LM head shares the input embedding's matrix (HF's
            ``tie_word_embeddings``: Gemma, Llama 3.2 1B/3B), so the model holds one
            ``vocab_size x hidden_size`` matrix, not two (the simulator's memory check). False
            (the default, and the presets'): a separate LM head, as Llama 2/3 7B-70B.
        attn_params: weights of one layer's attention projections where they are not
            ``hidden_size x (num_heads + num_kv_heads) x (head_dim + v_head_dim)``: multi-head
            latent attention's low-rank projections (DeepSeek-V2/V3's ``q_lora_rank`` and
            ``kv_lora_rank``); None: that product.
        gated_mlp: the MLP has a gate matrix beside its up and down projections (Llama, Qwen, Gemma,
            Mistral: three ``hidden_size x intermediate_size`` matrices); False: two (GPT-2, GPT-NeoX,
            Falcon, BLOOM, OPT, Phi-2, StarCoder 2: :data:`PLAIN_MLP_MODEL_TYPES`).
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int = 32000
    sliding_window: int | None = None
    sliding_window_layers: int | None = None
    v_head_dim: int | None = None
    tie_word_embeddings: bool = False
    attn_params: int | None = None
    gated_mlp: bool = True

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or v <= 0:
                raise ValueError(f"ModelDims.{f} must be a positive int, got {v!r}")
        for f in ("sliding_window", "v_head_dim", "attn_params"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or v <= 0):
                raise ValueError(f"ModelDims.{f} must be None or a positive int, got {v!r}")
        v = self.sliding_window_layers
        if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_))
                              or not 0 <= v <= self.num_layers):
            raise ValueError(f"ModelDims.sliding_window_layers must be None or an int from 0 to num_layers="
                             f"{self.num_layers}, got {v!r}")
        if not isinstance(self.tie_word_embeddings, (bool, np.bool_)):
            raise ValueError(f"ModelDims.tie_word_embeddings must be a bool, got {_short(self.tie_word_embeddings)}")
        object.__setattr__(self, "tie_word_embeddings", bool(self.tie_word_embeddings))  # np.bool_ -> JSON-able
        if not isinstance(self.gated_mlp, (bool, np.bool_)):
            raise ValueError(f"ModelDims.gated_mlp must be a bool, got {_short(self.gated_mlp)}")
        object.__setattr__(self, "gated_mlp", bool(self.gated_mlp))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelDims.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @classmethod
    def from_hf_config(cls, config: Any) -> "ModelDims":
        """Read dimensions from a transformers ``PretrainedConfig`` (or a dict of its fields).

        A field that differs by layer (a list, as Gemma 3n's ``intermediate_size``, or a
        heterogeneous config's ``per_layer_config``, as Gemma 4's wider global ``head_dim``) is
        read as its mean over the layers for ``head_dim`` and ``intermediate_size`` (the cost
        model prices an average layer) and as its most common value otherwise. A composite config
        (a vision-language model's) is read through its text config (``get_text_config()``);
        ``tie_word_embeddings`` from the text config, else the composite's, else False (a dict
        without it: a separate LM head, the larger memory estimate)."""
        outer = config
        if not isinstance(config, Mapping) and callable(getattr(config, "get_text_config", None)):
            config = config.get_text_config() or config
        elif isinstance(config, Mapping) and "hidden_size" not in config and isinstance(config.get("text_config"),
                                                                                         Mapping):
            config = config["text_config"]  # a composite config's fields (a vision-language model's config.json)
        whole = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        per_layer = (not isinstance(config, Mapping) and getattr(config, "is_heterogeneous", False)
                     and set(config.per_layer_attributes or ()))
        layers = list(config.per_layer_config) if per_layer else []

        def get(k: str, d: Any = None) -> Any:
            values = [getattr(c, k, d) for c in layers] if per_layer and k in per_layer else whole(k, d)
            if not isinstance(values, (list, tuple)) or not values:
                return values
            if k in ("head_dim", "intermediate_size") and all(isinstance(v, (int, np.integer)) for v in values):
                return max(1, round(sum(values) / len(values)))
            return max(values, key=values.count)

        hidden, heads, depth = get("hidden_size"), get("num_attention_heads"), get("num_hidden_layers")
        if any(v is None for v in (hidden, heads, depth)):
            which = "the config's text_config" if config is not outer else "the config"
            raise ValueError(
                f"cannot read model dimensions: {which} has no "
                "hidden_size/num_attention_heads/num_hidden_layers "
                f"ints (got {_short(hidden)}/{_short(heads)}/{_short(depth)}; pass ModelDims(...) explicitly)"
            )

        def size(k: str, default: Any = None) -> Any:  # a size the config gives: a positive int
            v = get(k)
            if default is not None and (v is None or (k == "head_dim" and _ints(v) and v == 0)):  # unset (GLM-5: 0)
                return default
            if not _ints(v) or v <= 0:
                raise ValueError(f"cannot read model dimensions: the config's {k}={_short(v)} is not a positive int "
                                 "(check that field of the model config, or pass ModelDims(...) explicitly)")
            return int(v)

        hidden, heads, depth = size("hidden_size"), size("num_attention_heads"), size("num_hidden_layers")
        head_dim, v_head_dim = key_value_widths(get, size("head_dim", hidden // heads))
        window = get("sliding_window") if get("use_sliding_window", True) else None
        if window is not None and not (_ints(window) and window >= 0):
            raise ValueError(f"cannot read model dimensions: the config's sliding_window={_short(window)} is not a "
                             "window in tokens (an int > 0; null or 0: none); check that field of the model config, or "
                             "pass ModelDims(...) explicitly")
        window = int(window) if window else None
        window_layers = None if window is None else _window_layers(whole, int(depth))
        return cls(
            hidden_size=int(hidden),
            num_layers=int(depth),
            num_heads=int(heads),
            num_kv_heads=size("num_key_value_heads", heads),
            head_dim=int(head_dim),
            intermediate_size=_active_mlp_width(get, whole, int(depth), size("intermediate_size", 4 * hidden)),
            vocab_size=size("vocab_size", 32000),
            sliding_window=window if window_layers != 0 else None,
            sliding_window_layers=window_layers if window_layers != 0 else None,
            v_head_dim=v_head_dim if v_head_dim != head_dim else None,
            tie_word_embeddings=_tied(whole, outer),
            attn_params=_latent_attention_params(get, hidden, heads, head_dim, v_head_dim),
            gated_mlp=str(get("model_type", "")) not in PLAIN_MLP_MODEL_TYPES,
        )

    @property
    def window_share(self) -> float:
        """The share of layers attending within ``sliding_window`` (1.0 without one)."""
        if self.sliding_window is None or self.sliding_window_layers is None:
            return 1.0
        return self.sliding_window_layers / self.num_layers

    @property
    def params_per_layer(self) -> int:
        """Weights of one decoder layer (attention projections + MLP; an MoE layer's active experts)."""
        v = self.head_dim if self.v_head_dim is None else self.v_head_dim
        attn = self.hidden_size * (self.num_heads + self.num_kv_heads) * (self.head_dim + v) \
            if self.attn_params is None else self.attn_params
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return attn + mlp


def key_value_widths(get: Any, head_dim: int) -> tuple[int, int]:
    """The per-head widths ``(keys, values)`` of a config read by ``get(name, default=None)``: ``head_dim``
    for both, but under multi-head latent attention (DeepSeek-V3) ``qk_nope_head_dim + qk_rope_head_dim``
    for the keys and ``v_head_dim`` (else the keys' width) for the values."""
    nope, rope = _field(get, "qk_nope_head_dim"), _field(get, "qk_rope_head_dim")
    if nope is None or rope is None or nope + rope == 0:
        return head_dim, head_dim
    v = _field(get, "v_head_dim")
    return nope + rope, v if v else nope + rope


def _latent_attention_params(get: Any, hidden: int, heads: int, k_dim: int, v_dim: int) -> int | None:
    """Weights of one layer's multi-head latent attention (DeepSeek-V2/V3): queries through a
    ``q_lora_rank`` bottleneck (or one ``hidden x heads x k_dim`` projection without it), keys and values
    through a ``kv_lora_rank`` latent plus the shared RoPE key, and the output projection; None for a
    config without ``kv_lora_rank`` (the projections of :attr:`ModelDims.params_per_layer`)."""
    kv_rank = _field(get, "kv_lora_rank", 1)
    rope, nope = _field(get, "qk_rope_head_dim"), _field(get, "qk_nope_head_dim")
    if kv_rank is None or rope is None or nope is None:
        return None
    q_rank = _field(get, "q_lora_rank", 1)
    q = hidden * heads * k_dim if q_rank is None else hidden * q_rank + q_rank * heads * k_dim
    kv = hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
    return q + kv + heads * v_dim * hidden


def _field(get: Any, k: str, minimum: int = 0) -> int | None:
    """The config's int field ``k`` (None where unset), or ValueError naming it (a string, a float, a
    bool or a value below ``minimum``: never read as unset)."""
    v = get(k)
    if v is None:
        return None
    if not _ints(v) or v < minimum:
        raise ValueError(f"cannot read model dimensions: the config's {k}={_short(v)} is not an int >= {minimum} "
                         "(check that field of the model config, or pass ModelDims(...) explicitly)")
    return int(v)


def _short(v: Any) -> str:
    """A short repr for messages: never huge, never raising (ints of over 4300 digits do)."""
    if isinstance(v, int) and abs(v) > 10**60:
        return f"<int of {v.bit_length()} bits>"
    text = repr(v) if isinstance(v, (int, float, str, type(None), np.generic)) else f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _is_real(v: Any) -> bool:
    """A finite-checkable number (numpy floats and ints too), never a bool."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _ints(*values: Any) -> bool:
    return all(_is_int(v) for v in values)


def _tied(get: Any, outer: Any) -> bool:  # get: the (text) config's fields; outer: the config as given
    """``tie_word_embeddings`` of a config: the text config's, else the composite's, else False."""
    value = get("tie_word_embeddings")
    if value is None and outer is not None:
        value = outer.get("tie_word_embeddings") if isinstance(outer, Mapping) else getattr(
            outer, "tie_word_embeddings", None)
    if value is None:
        return False
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"cannot read model dimensions: the config's tie_word_embeddings={_short(value)} is not a "
                         "bool (check that field of the model config, or pass ModelDims(...) explicitly)")
    return bool(value)


def _window_layers(get: Any, depth: int) -> int | None:  # get: the config's own fields, lists kept
    """How many layers use the sliding window, from ``layer_types`` (transformers' per-layer
    ``"sliding_attention"`` / ``"full_attention"``) or Qwen2's ``max_window_layers`` (the layers
    from that index on slide); None (all) where the config says neither."""
    types = get("layer_types")
    if types is not None:
        if not (isinstance(types, (list, tuple)) and len(types) == depth and all(isinstance(t, str) for t in types)):
            raise ValueError(f"cannot read model dimensions: the config's layer_types={_short(types)} is not a list of "
                             f"num_hidden_layers={depth} layer type names ('sliding_attention', 'full_attention'); check "
                             "that field of the model config, or pass ModelDims(...) explicitly")
        return sum(t == "sliding_attention" for t in types)
    for key in ("sliding_window_pattern", "_sliding_window_pattern"):  # Gemma 3, Cohere 2: every p-th layer is full
        pattern = _field(get, key, 1)
        if pattern is not None:
            return depth - depth // pattern
    first = get("max_window_layers")
    if _ints(first) and get("use_sliding_window", False) is True:
        return depth - min(max(int(first), 0), depth)
    return None


#: Model types whose MLP is two matrices (up, activation, down; no gate). Each family's decoder weights, counted
#: on the meta device from its default transformers 5.25 config, are within 4% of ModelDims.params_per_layer so
#: (33% over with a gate counted); tests/test_model_config_reading.py checks them.
PLAIN_MLP_MODEL_TYPES = frozenset({
    "apertus", "apertus1p5_text", "arcee", "biogpt", "bloom", "codegen", "cpmant", "falcon", "fuyu", "gpt-sw3", "gpt2",
    "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_neox_japanese", "gptj", "jais2", "mpt", "nanochat", "openai-gpt", "opt",
    "persimmon", "phi", "starcoder2", "xglm",
})
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk")
_SHARED_KEYS = ("n_shared_experts", "moe_num_shared_experts", "num_shared_experts")


def _active_mlp_width(get: Any, whole: Any, depth: int, dense: int) -> int:
    """The MLP width one token runs through, averaged over the layers: a mixture-of-experts
    layer runs ``num_experts_per_tok`` experts of ``moe_intermediate_size`` (else
    ``intermediate_size``) plus its shared experts (``shared_expert_intermediate_size``, or a count of
    experts' width: DeepSeek's ``n_shared_experts``, Aria's ``moe_num_shared_experts``, Llama 4's one,
    which no field names); DeepSeek's ``first_k_dense_replace`` first layers and the layers outside
    Llama 4's ``moe_layers`` (``intermediate_size_mlp`` wide) are dense. ``is_moe`` false (Doge): dense.
    ``whole``: the config's fields with lists kept."""
    if get("is_moe") is False:
        return dense
    experts = next((v for k in _EXPERT_KEYS if (v := _field(get, k)) is not None), None)
    top_k = next((v for k in _TOP_K_KEYS if (v := _field(get, k)) is not None), None)
    if experts is None or top_k is None or experts <= 1 or top_k < 1:
        return dense
    if top_k > experts:
        raise ValueError(f"cannot read model dimensions: the config routes each token to {top_k} experts of "
                         f"{experts} (num_experts_per_tok > the experts); check those fields of the model config, "
                         "or pass ModelDims(...) explicitly")
    width = _field(get, "moe_intermediate_size", 1) or dense
    shared = _field(get, "shared_expert_intermediate_size")
    if shared is None:
        n_shared = next((v for k in _SHARED_KEYS if (v := _field(get, k)) is not None), None)
        if n_shared is None and str(get("model_type", "")).startswith("llama4"):
            n_shared = 1
        shared = (n_shared or 0) * width
    moe = top_k * width + shared
    k = min(_field(get, "first_k_dense_replace") or 0, depth)
    layers = whole("moe_layers")
    if isinstance(layers, (list, tuple)) and all(_ints(i) for i in layers):
        k = depth - len({int(i) for i in layers if 0 <= i < depth})
        dense = _field(get, "intermediate_size_mlp", 1) or dense
    return max(1, round((k * dense + (depth - k) * moe) / depth))


# Public model shapes (Llama-2/3 style configs) used by presets and the simulator.
MODEL_PRESETS: dict[str, ModelDims] = {
    "tiny": ModelDims(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=32,
                      intermediate_size=688, vocab_size=512),
    "1b": ModelDims(hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
                    intermediate_size=8192, vocab_size=128256),
    "7b": ModelDims(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
                    intermediate_size=11008, vocab_size=32000),
    "8b": ModelDims(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                    intermediate_size=14336, vocab_size=128256),
    "13b": ModelDims(hidden_size=5120, num_layers=40, num_heads=40, num_kv_heads=40, head_dim=128,
                     intermediate_size=13824, vocab_size=32000),
    "70b": ModelDims(hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
                     intermediate_size=28672, vocab_size=128256),
}


def resolve_model(model: Any) -> ModelDims:
    if isinstance(model, ModelDims):
        return model
    if isinstance(model, str):
        try:
            return MODEL_PRESETS[model.lower()]
        except KeyError:
            raise ValueError(f"unknown model preset {model!r}; legal values: {sorted(MODEL_PRESETS)}, or an HF "
                             "config / ModelDims (set model / --model)") from None
    return ModelDims.from_hf_config(model)


def model_label(model: Any) -> str:
    if isinstance(model, str):
        return model
    if isinstance(model, ModelDims):
        return f"h{model.hidden_size}x{model.num_layers}"
    return str(getattr(model, "model_type", "model"))


def resolve_hardware(hardware: str | HardwarePreset) -> HardwarePreset:
    if isinstance(hardware, HardwarePreset):
        return hardware
    try:
        return HARDWARE_PRESETS[hardware.upper()]
    except (KeyError, AttributeError):
        raise ValueError(
            f"unknown hardware preset {hardware!r}; legal values: {sorted(HARDWARE_PRESETS)} "
            "(or calibrate with `atac-hf calibrate` and pass the profile)"
        ) from None

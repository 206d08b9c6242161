"""Red-team 8 (cost models that are off, docs/RELIABILITY.md): pair counts past int64, models
that mix sliding-window and full-attention layers, mixture-of-experts and latent-attention
dimensions, and a cost profile measured for another model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers as T

from atac_hf.cost import CostModel, ModelDims, default_cost_model
from atac_hf.integrations import ATACConfig
from atac_hf.sharding import plan_shards


# ------------------------------------------------------------------ pair counts past int64
@pytest.mark.parametrize("tile", [1, 3, 128])
@pytest.mark.parametrize("window", [None, 1000, 2**40])
def test_pair_counts_of_documents_past_2_31_tokens_are_positive_and_continuous(tile, window):
    """int64 squares wrapped from about 3e9 tokens: negative costs, negative block times and a
    crash in ATP. Past 2**31 the counts are float64, equal to the int64 path where both apply."""
    cm = default_cost_model().replace(tile=tile, sliding_window=window)
    n = 2**32
    exact = n * (n + 1) // 2 if window is None or window >= n else window * (window + 1) // 2 + (n - window) * window
    got = float(cm.attention_pairs(0, n))
    assert exact <= got <= exact * 1.001 + n * tile
    s = np.array([0, 5, 2**31 - 100, 77])
    e = np.full(4, 2**31)
    via_int = cm._pairs(s, e)[1]
    via_float = cm._pairs_float(s, e, e - s, e > s)[1]
    assert np.allclose(via_int, via_float, rtol=1e-9, atol=0)
    big = np.array([2**31 + 1, 2**40, 2**62])
    pairs = cm.attention_pairs(np.zeros(3, np.int64), big)
    assert np.all(np.isfinite(pairs)) and np.all(pairs > 0) and np.all(np.diff(pairs) > 0)


def test_plans_of_documents_past_2_31_tokens_are_finite_and_atp_no_worse_than_per_doc():
    atp = plan_shards([2**33, 5], 2, "atp")
    per_doc = plan_shards([2**33, 5], 2, "per_doc")
    assert 0 < atp.block_time_s <= per_doc.block_time_s * (1 + 1e-9)
    one = plan_shards([5_000_000_000], 2)  # was: TypeError: unsupported operand type(s) for -: 'NoneType'
    assert one.block_time_s > 0 and one.rank_num_tokens().sum() == 5_000_000_000


# ------------------------------------------------------------------ sliding and full layers
def _windowed_and_full(cm: CostModel, s, e):
    only_window = cm.replace(sliding_window_share=1.0)
    no_window = cm.replace(sliding_window=None, sliding_window_share=1.0)
    return only_window.attention_pairs(s, e), no_window.attention_pairs(s, e)


@pytest.mark.parametrize("config, sliding", [
    (T.GptOssConfig(), None), (T.Gemma2Config(), None), (T.Gemma3TextConfig(), None), (T.Cohere2Config(), None),
    (T.Qwen2Config(use_sliding_window=True, sliding_window=4096, max_window_layers=28), 4),
    (T.Qwen3Config(use_sliding_window=True, sliding_window=512, max_window_layers=4), 28),
])
def test_models_mixing_sliding_and_full_layers_are_priced_as_the_mixture(config, sliding):
    """from_model priced every layer as sliding when some attend to whole prefixes: a 32K-token
    document cost about what 32 documents of 1K cost on GPT-OSS, so the planners balanced tokens."""
    types = getattr(config, "layer_types", None)
    want = sliding if sliding is not None else sum(t == "sliding_attention" for t in types)
    depth = config.num_hidden_layers
    assert 0 < want < depth
    dims = ModelDims.from_hf_config(config)
    assert dims.sliding_window == config.sliding_window and dims.sliding_window_layers == want
    cm = CostModel.from_model(config, "H100")
    assert cm.sliding_window_share == pytest.approx(want / depth)
    assert cm.exchange_window is None  # full layers need whole key prefixes: the exchange is priced for them
    s, e = np.array([0, 0, 5000, 100]), np.array([32768, 4096, 9000, 130000])
    w, f = _windowed_and_full(cm, s, e)
    assert np.allclose(cm.attention_pairs(s, e), want / depth * w + (1 - want / depth) * f, rtol=1e-12)
    # a long document's premium over as many tokens in short ones is the full layers' (all-sliding: about none)
    sliding_only = cm.replace(sliding_window_share=1.0)
    premium = cm.pack_cost([32768]) - cm.pack_cost([1024] * 32)
    assert premium > 1.5 * (sliding_only.pack_cost([32768]) - sliding_only.pack_cost([1024] * 32))
    # plans price the all-to-all for whole prefixes
    plan = plan_shards([30000, 2000, 700], 4, "atp", cm, kv_exchange="all_to_all")
    assert plan.kv_window is None


def test_models_whose_every_layer_slides_keep_the_window_for_the_exchange():
    for config in (T.MistralConfig(sliding_window=4096), {"hidden_size": 64, "num_attention_heads": 4,
                                                          "num_hidden_layers": 2, "sliding_window": 16}):
        cm = CostModel.from_model(config, "H100")
        assert cm.sliding_window_share == 1.0 and cm.exchange_window == cm.sliding_window
    # layer types that never slide: no window at all
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "sliding_window": 16,
           "layer_types": ["full_attention", "full_attention"]}
    assert ModelDims.from_hf_config(cfg).sliding_window is None
    assert CostModel.from_model(cfg, "H100").sliding_window is None


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan"), "0.5", True, None])
def test_sliding_window_share_refused_outside_0_1(bad):
    with pytest.raises(ValueError, match=r"sliding_window_share must be a number in \(0, 1\]"):
        default_cost_model().replace(sliding_window=64, sliding_window_share=bad)


def test_a_profile_round_trips_the_window_share(tmp_path):
    cm = default_cost_model().replace(sliding_window=64, sliding_window_share=0.25)
    cm.save(tmp_path / "p.json")
    back = CostModel.from_profile(tmp_path / "p.json")
    assert back.sliding_window_share == 0.25 and back.exchange_window is None


# ------------------------------------------------------------------ dimensions
def test_mixture_of_experts_prices_the_experts_a_token_runs():
    mixtral = T.MixtralConfig()
    assert ModelDims.from_hf_config(mixtral).intermediate_size == \
        mixtral.num_experts_per_tok * mixtral.intermediate_size
    q2 = T.Qwen2MoeConfig()
    assert ModelDims.from_hf_config(q2).intermediate_size == \
        q2.num_experts_per_tok * q2.moe_intermediate_size + q2.shared_expert_intermediate_size
    q3 = T.Qwen3MoeConfig()
    assert ModelDims.from_hf_config(q3).intermediate_size == q3.num_experts_per_tok * q3.moe_intermediate_size
    ds = T.DeepseekV3Config()
    moe = ds.num_experts_per_tok * ds.moe_intermediate_size + ds.n_shared_experts * ds.moe_intermediate_size
    k, L = ds.first_k_dense_replace, ds.num_hidden_layers
    assert ModelDims.from_hf_config(ds).intermediate_size == round((k * ds.intermediate_size + (L - k) * moe) / L)
    # a dense model is unchanged
    assert ModelDims.from_hf_config(T.LlamaConfig()).intermediate_size == T.LlamaConfig().intermediate_size


def test_latent_attention_prices_its_key_and_value_widths():
    ds = T.DeepseekV3Config()
    dims = ModelDims.from_hf_config(ds)
    qk = ds.qk_nope_head_dim + ds.qk_rope_head_dim
    assert dims.head_dim == qk and dims.v_head_dim == ds.v_head_dim
    cm = CostModel.from_model(ds, "H100", dtype_bytes=2)
    assert cm.kv_bytes_per_token == ds.num_key_value_heads * (qk + ds.v_head_dim) * 2
    plain = CostModel.from_model(dims.__class__(**{**dims.__dict__, "v_head_dim": None}), "H100")
    assert cm.attn_s_per_pair < plain.attn_s_per_pair  # PV runs over 128-wide values, not 192
    # the runtime's K/V byte count reads the same widths
    from atac_hf.integrations.sharder import model_kv_bytes_per_token
    tiny = T.DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None,
                              kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                              n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)
    model = T.AutoModelForCausalLM.from_config(tiny)
    assert model_kv_bytes_per_token(model) == 2 * 2 * (12 + 6) * 4  # layers x kv heads x (k + v) x fp32


@pytest.mark.parametrize("field, bad", [("vocab_size", -1), ("vocab_size", "x"), ("hidden_size", True),
                                        ("sliding_window", 0), ("sliding_window", -4), ("v_head_dim", 0),
                                        ("sliding_window_layers", 5), ("sliding_window_layers", -1)])
def test_model_dims_refuse_bad_values(field, bad):
    kw = dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
              sliding_window=8)
    with pytest.raises(ValueError, match=f"ModelDims.{field} must be"):
        ModelDims(**{**kw, field: bad})


# ------------------------------------------------------------------ a profile of another model
def _profile(tmp_path, hidden: int) -> str:
    path = tmp_path / "p.json"
    default_cost_model().save(path, model={"hidden_size": hidden, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                                           "intermediate_size": 128})
    return str(path)


def test_a_cost_profile_of_another_model_is_refused_for_this_one(tmp_path):
    small = T.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                          num_hidden_layers=2)
    big = T.LlamaConfig(hidden_size=8192, num_attention_heads=64, num_key_value_heads=8, num_hidden_layers=80,
                        intermediate_size=28672)
    cfg = ATACConfig(cost_profile=_profile(tmp_path, 64), max_tokens=512)
    assert cfg.cost_model(small).attn_s_per_pair == default_cost_model().attn_s_per_pair
    assert cfg.cost_model().attn_s_per_pair == default_cost_model().attn_s_per_pair  # no model: nothing to compare
    with pytest.raises(ValueError, match=r"measured for another model \(hidden_size: profile 64 vs model 8192.*"
                                         r"atac-hf calibrate.*cost_profile"):
        cfg.cost_model(big)
    # a profile that does not say which model it was measured for is taken as it is
    path = tmp_path / "anon.json"
    data = json.loads(open(cfg.cost_profile).read())
    data.pop("metadata")
    path.write_text(json.dumps(data))
    assert ATACConfig(cost_profile=str(path), max_tokens=512).cost_model(big).tile == default_cost_model().tile

"""A model's config.json read as transformers reads it, and its fields checked (red-team 53, a sweep of
every transformers 5.25 config family through ``--model`` and ``ModelDims.from_hf_config``): the CLI read
the file's raw fields, so Hub files that leave ``layer_types`` to their config class (Gemma 2/3, Cohere 2)
were priced with every layer sliding and files with field aliases (GPT-2's ``n_embd``) were refused;
DeepSeek's latent attention and several MoE layouts were priced at other widths; bad field values were
read as unset; and ``simulate`` called a model the ``atac_cp`` attention refuses runnable."""

from __future__ import annotations

import json

import pytest
import torch

from atac_hf._argtypes import model_arg, model_or_preset
from atac_hf.cli import main
from atac_hf.cost import ModelDims
from atac_hf.cost.presets import PLAIN_MLP_MODEL_TYPES

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def _file(tmp_path, fields, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(fields))
    return str(path)


@pytest.mark.parametrize("fields, depth, sliding", [
    # Gemma 2 alternates sliding and full layers (its config class, not the file, says so)
    ({"model_type": "gemma2", "hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "sliding_window": 128}, 6, 3),
    # Gemma 3 and Cohere 2 files give a pattern: every p-th layer is full
    ({"model_type": "gemma3_text", "hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4,
      "num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 512, "sliding_window": 128,
      "sliding_window_pattern": 6}, 12, 10),
    ({"model_type": "cohere2", "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4,
      "num_key_value_heads": 1, "intermediate_size": 512, "sliding_window": 128, "sliding_window_pattern": 4}, 8, 6),
])
def test_a_hub_file_without_layer_types_slides_the_layers_its_config_class_says(tmp_path, fields, depth, sliding):
    from transformers import AutoConfig

    dims = model_arg(_file(tmp_path, fields))
    assert (dims.num_layers, dims.sliding_window, dims.sliding_window_layers) == (depth, 128, sliding)
    config = AutoConfig.for_model(**fields)  # transformers' own reading
    assert sum(t == "sliding_attention" for t in config.layer_types) == sliding
    assert dims == ModelDims.from_hf_config(config)


def test_a_pattern_is_read_from_a_dict_of_a_family_transformers_does_not_know():
    fields = {"model_type": "not_a_family", "hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4,
              "intermediate_size": 512, "sliding_window": 64, "sliding_window_pattern": 4}
    assert ModelDims.from_hf_config(fields).sliding_window_layers == 9


def test_field_aliases_are_read_and_an_unknown_family_keeps_the_files_fields(tmp_path):
    gpt2 = model_arg(_file(tmp_path, {"model_type": "gpt2", "n_embd": 128, "n_head": 4, "n_layer": 3,
                                      "vocab_size": 1000}, "gpt2.json"))
    assert (gpt2.hidden_size, gpt2.num_heads, gpt2.num_layers, gpt2.head_dim) == (128, 4, 3, 32)
    fields = {**LLAMA, "model_type": "not_a_family"}
    assert model_arg(_file(tmp_path, fields, "own.json")) == ModelDims.from_hf_config(fields)
    assert model_or_preset(_file(tmp_path, LLAMA)) == ModelDims.from_hf_config(LLAMA)


@pytest.mark.parametrize("change, match", [
    ({"sliding_window": "4096"}, r"sliding_window='4096' is not a window in tokens"),
    ({"sliding_window": -1}, r"sliding_window=-1 is not a window in tokens"),
    ({"sliding_window": 4096.5}, r"sliding_window=4096.5 is not a window in tokens"),
    ({"sliding_window": 64, "layer_types": "sliding_attention"}, r"layer_types=.* is not a list of num_hidden_layers=4"),
    ({"sliding_window": 64, "layer_types": ["sliding_attention"] * 3}, r"is not a list of num_hidden_layers=4"),
    ({"num_key_value_heads": 0}, r"num_key_value_heads=0 is not a positive int"),
    ({"intermediate_size": 0}, r"intermediate_size=0 is not a positive int"),
    ({"num_local_experts": "8", "num_experts_per_tok": 2}, r"num_local_experts='8' is not an int >= 0"),
    ({"num_local_experts": 8, "num_experts_per_tok": 64}, r"routes each token to 64 experts of 8"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": -5},
     r"moe_intermediate_size=-5 is not an int >= 1"),
    ({"qk_nope_head_dim": "128", "qk_rope_head_dim": 64}, r"qk_nope_head_dim='128' is not an int >= 0"),
    ({"sliding_window": 64, "sliding_window_pattern": 0}, r"sliding_window_pattern=0 is not an int >= 1"),
])
def test_a_bad_field_is_refused_by_name_never_read_as_unset(change, match, tmp_path):
    fields = {**LLAMA, "model_type": "not_a_family", **change}
    with pytest.raises(ValueError, match=match):
        ModelDims.from_hf_config(fields)
    with pytest.raises(ValueError, match=r"--model '.*own.json': cannot read model dimensions: .*give --model a preset"):
        model_arg(_file(tmp_path, fields, "own.json"))


def test_unset_fields_stay_unset():
    for change in ({"sliding_window": None}, {"sliding_window": 0}, {"sliding_window": 64, "use_sliding_window": False},
                   {"head_dim": 0}, {"num_key_value_heads": None}):
        dims = ModelDims.from_hf_config({**LLAMA, **change})
        kv_heads = 4 if "num_key_value_heads" in change else 2  # unset: one K/V head per query head
        assert (dims.sliding_window, dims.num_kv_heads, dims.head_dim) == (None, kv_heads, 64), change


def _linear_weights(module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_latent_attention_is_priced_at_its_projections_weights(q_lora_rank):
    """DeepSeek-V3: the attention projections of ModelDims equal the weights of transformers' own layer."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    config = DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
                              kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=16,
                              num_hidden_layers=2, intermediate_size=96, vocab_size=100)
    dims = ModelDims.from_hf_config(config)
    assert (dims.head_dim, dims.v_head_dim) == (12, 16)
    assert dims.attn_params == _linear_weights(DeepseekV3Attention(config, 0))
    assert dims.params_per_layer == dims.attn_params + 3 * 64 * dims.intermediate_size
    plain = ModelDims.from_hf_config(LLAMA)
    assert plain.attn_params is None and plain.params_per_layer == 256 * (4 + 2) * (64 + 64) + 3 * 256 * 512


@pytest.mark.parametrize("fields, width", [
    # Llama 4: one routed expert and one shared expert of intermediate_size; layers outside moe_layers dense
    # at intermediate_size_mlp (here 2 of 4 layers: (2 x 1024 + 2 x (256 + 256)) / 4)
    ({"model_type": "llama4_text", "intermediate_size": 256, "intermediate_size_mlp": 1024, "num_local_experts": 16,
      "num_experts_per_tok": 1, "moe_layers": [1, 3]}, 768),
    # Aria: moe_topk of moe_num_experts, plus moe_num_shared_experts, all intermediate_size wide
    ({"model_type": "aria_text", "intermediate_size": 128, "moe_num_experts": 8, "moe_topk": 2,
      "moe_num_shared_experts": 2}, 512),
    # Doge: expert fields kept with is_moe false: a dense MLP
    ({"model_type": "doge", "intermediate_size": 512, "is_moe": False, "num_experts": 16384,
      "num_experts_per_tok": 64}, 512),
    # DeepSeek: first_k_dense_replace dense layers, n_shared_experts of moe_intermediate_size
    ({"model_type": "deepseek_v3", "intermediate_size": 1024, "moe_intermediate_size": 64, "n_routed_experts": 16,
      "num_experts_per_tok": 4, "n_shared_experts": 2, "first_k_dense_replace": 1}, (1024 + 3 * 6 * 64) // 4),
])
def test_the_active_mlp_width_of_moe_layouts(fields, width):
    base = {k: v for k, v in LLAMA.items() if k not in ("model_type", "intermediate_size")}
    assert ModelDims.from_hf_config({**base, **fields}).intermediate_size == width


def test_simulate_says_the_attention_refuses_a_model_its_config_rules_refuse(tmp_path, capsys):
    hybrid = {**LLAMA, "layer_types": ["full_attention", "linear_attention"] * 2}
    argv = ["simulate", "--steps", "1", "--dp", "1", "--pp", "1", "--cp", "2", "--micro-batches", "2", "--max-tokens",
            "4K", "--combos", "named", "--model"]
    assert main([*argv, _file(tmp_path, hybrid, "hybrid.json")]) == 0
    out = capsys.readouterr().out
    assert "what-if: the atac_cp attention refuses this model: mixes tokens outside attention" in out
    assert main([*argv, _file(tmp_path, hybrid, "hybrid.json"), "--json"]) == 0
    assert "mixes tokens outside attention" in json.loads(capsys.readouterr().out)["model_refusal"]
    assert main([*argv, _file(tmp_path, LLAMA)]) == 0
    assert "runs with the atac-hf integration" in capsys.readouterr().out


def test_simulate_says_an_encoder_decoder_is_refused(tmp_path, capsys):
    bart = {"model_type": "bart", "d_model": 128, "encoder_layers": 2, "decoder_layers": 2,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 1000}
    assert main(["simulate", "--steps", "1", "--dp", "1", "--pp", "1", "--cp", "2", "--micro-batches", "2",
                 "--max-tokens", "4K", "--combos", "named", "--model", _file(tmp_path, bart)]) == 0
    assert "the atac_cp attention refuses this model: is an encoder-decoder model" in capsys.readouterr().out


def test_a_file_with_an_absurd_layer_count_is_read_from_its_own_fields(tmp_path):
    """A config class builds per-layer lists of ``num_hidden_layers`` entries at once: 10**12 layers hung
    `--model` (and a CLI run) before its fields were read; such a file is read as its own fields."""
    huge = {"model_type": "gemma3_text", "hidden_size": 256, "num_hidden_layers": 10**12, "num_attention_heads": 4,
            "sliding_window": 64, "sliding_window_pattern": 6}
    dims = model_arg(_file(tmp_path, huge))
    assert (dims.num_layers, dims.sliding_window_layers) == (10**12, 10**12 - 10**12 // 6)


def _decoder_weights(config) -> int:
    """Weights of a causal LM built from ``config`` on the meta device, its embeddings and LM head left out."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    skip = ("embed", "lm_head", "wte", "wpe")
    return sum(p.numel() for n, p in model.named_parameters() if not any(s in n for s in skip))


@pytest.mark.parametrize("model_type", sorted(PLAIN_MLP_MODEL_TYPES | {
    "llama", "qwen2", "qwen3", "mistral", "gemma2", "olmo2", "phi3", "granite", "cohere2", "deepseek_v3"}))
def test_the_priced_weights_of_a_layer_are_the_models(model_type):
    """A layer's linear work is priced by its weights (``params_per_layer``): within 5% of transformers' own
    decoder layers (default config; red-team 53: the two-matrix MLPs of GPT-2, GPT-NeoX, Falcon, BLOOM, OPT,
    Phi-2, StarCoder 2, ... were priced a third over, as gated; DeepSeek's latent attention 1.69x)."""
    import warnings

    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    if model_type == "deepseek_v3":  # dense: its MoE layers are priced at their active experts, not all of them
        config.first_k_dense_replace = config.num_hidden_layers
    dims = ModelDims.from_hf_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = _decoder_weights(config)
    assert dims.num_layers * dims.params_per_layer == pytest.approx(real, rel=0.05)


def test_calibration_measures_a_plain_mlp_for_a_plain_mlp_model():
    """`atac-hf calibrate` times the layer it prices: two MLP matrices for a GPT-2-style model, three for Llama's."""
    from atac_hf.cost.calibrate import _Block

    plain = ModelDims.from_hf_config({"model_type": "gpt2", "hidden_size": 64, "num_attention_heads": 4,
                                      "num_hidden_layers": 2, "intermediate_size": 128})
    assert plain.gated_mlp is False
    for dims, gated in ((plain, False), (ModelDims.from_hf_config({**LLAMA, "hidden_size": 64}), True)):
        block = _Block(dims, 1, "cpu", torch.float32, 0, "sdpa")
        assert (block.gate is not None) is gated
        x = block.input(8)
        assert block.layer(x, None).shape == (8, 64)

"""The probe's config shrinking on the kinds of config that made it crash (issue: rows refused only
because the probe itself failed), and the refusal reasons the check now gives instead.

Config-level tests run in a fraction of a second (no model, or a meta-device one); the probes
that build and run a tiny model sit under ``slow``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from atac_hf.attention.model_check import check_architecture, config_refusal
from atac_hf.attention.model_probe import (PROBE_TOLERANCE, StockModelError, _shrink_dict, run_probe,
                                           sequence_convolutions, shrink_config)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers

        transformers.logging.set_verbosity_error()
        yield


def _config(family: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if family not in CONFIG_MAPPING:  # a family newer than the installed transformers (the GPU image has 5.17)
        pytest.skip(f"transformers {__import__('transformers').__version__} has no {family!r} family")
    return CONFIG_MAPPING[family]()


def _cls(cfg):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]


def _params_on_meta(cfg) -> int:
    cls = _cls(cfg)
    with torch.device("meta"):
        return sum(p.numel() for p in cls._from_config(copy.deepcopy(cfg)).parameters())


# ---------------------------------------------------------------------------- per-layer configs
def test_heterogeneous_per_layer_config_is_cut_and_scaled():
    """gemma4_text: per_layer_config keyed by layer index (head_dim 512 on the full-attention layers)
    crashed the shrink (indices past the tiny depth, then AmbiguousGlobalPerLayerAttributeError)."""
    tiny = shrink_config(_config("gemma4_text"))
    assert tiny.is_heterogeneous and tiny.num_hidden_layers == 6
    assert tiny.layer_types[-1] == "full_attention"
    dims = [tiny.per_layer_config[i].head_dim for i in range(tiny.num_hidden_layers)]
    assert dims == [16] * 5 + [32]  # twice the tiny global, as 512 is twice 256: the layers still differ
    assert tiny.vocab_size_per_layer_input == 128 and tiny.hidden_size_per_layer_input == 16
    assert _params_on_meta(tiny) < 1_000_000


def test_per_layer_head_counts_keep_a_valid_grouping():
    """dots3_note_text: per-layer num_attention_heads / num_key_value_heads / MLA ranks scale with
    their globals and the K/V grouping still divides (read off the shrunk dict: the family is refused
    by rule, DeepSeek sparse attention, before any probe)."""
    d = _shrink_dict(_config("dots3_note_text"), 8)
    spec = d["per_layer_config"]
    assert spec and all(0 <= int(i) < d["num_hidden_layers"] for i in spec)
    for ov in spec.values():
        assert ov["num_attention_heads"] == 2 and ov["num_key_value_heads"] == 2  # 64 of 128 -> 2 of 4
        assert ov["kv_lora_rank"] == 32 and ov["qk_nope_head_dim"] == 12  # 1024/512 x 16, 192/128 x 8


def test_multimodal_composite_with_per_layer_text_config_shrinks():
    """gemma4 / gemma4_unified: the tiny copy still had billions of parameters (the text sub-config's
    shrink fell back), and the image/audio placeholder ids lay outside the tiny vocabulary."""
    for family in ("gemma4", "gemma4_unified"):
        tiny = shrink_config(_config(family))
        assert _params_on_meta(tiny) < 5_000_000, family
        for k in ("image_token_id", "audio_token_id", "video_token_id"):
            assert 0 <= getattr(tiny, k) < 3, (family, k)  # ids the probe never draws


def test_per_layer_width_lists_shrink():
    """gemma3n_text: intermediate_size is one int per layer; it stayed 16384 wide."""
    tiny = shrink_config(_config("gemma3n_text"))
    assert tiny.intermediate_size == [128] * tiny.num_hidden_layers
    assert _params_on_meta(tiny) < 2_000_000


def test_kv_shared_layers_keep_producers_and_consumers():
    """gemma3n_text: the last num_kv_shared_layers reuse earlier layers' K/V; cut to 2 layer types x 5
    with 5 consumers, every consumer type still has a producer."""
    tiny = shrink_config(_config("gemma3n_text"))
    n, shared = tiny.num_hidden_layers, tiny.num_kv_shared_layers
    assert 0 < shared < n
    assert set(tiny.layer_types[: n - shared]) == set(tiny.layer_types)


def test_every_layer_kv_shared_is_refused_by_rule():
    """gemma4_unified_assistant reads all its K/V from a target model (shared_kv_states)."""
    cfg = _config("gemma4_unified_assistant")
    if getattr(cfg, "text_config", None) is None:  # transformers 5.17's default config has no text config
        pytest.skip("this transformers' default gemma4_unified_assistant config has no text_config")
    exc, reason = config_refusal(cfg)
    assert exc is NotImplementedError and "num_kv_shared_layers" in reason and "another model" in reason


def test_layer_group_counts_and_paired_blocks():
    """dory: layer_types serialized as (attention, "mlp") pairs and n_input/n_recurrent/n_output
    layers summing to num_hidden_layers; an odd cut and stale group counts crashed (KeyError 'mlp')."""
    tiny = shrink_config(_config("dory"))
    assert "mlp" not in tiny.layer_types
    assert tiny.n_input_layers + tiny.n_recurrent_layers + tiny.n_output_layers == tiny.num_hidden_layers
    assert min(tiny.n_input_layers, tiny.n_recurrent_layers, tiny.n_output_layers) >= 1
    assert {"sliding_attention", "full_attention"} <= set(tiny.layer_types)


def test_sub_config_kv_heads_follow_the_parents_heads():
    """dbrx: attn_config.kv_n_heads (a sub-config without query heads) stayed 8 against 4 tiny heads."""
    from transformers import DbrxConfig

    cfg = DbrxConfig(d_model=512, n_heads=16, n_layers=4, attn_config={"kv_n_heads": 8, "rope_theta": 5e5})
    tiny = shrink_config(cfg)
    assert tiny.n_heads == 4 and tiny.attn_config.kv_n_heads == 2


# ---------------------------------------------------------------------------- refusals by rule
@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4", "dots3_note_text"])
def test_sparse_attention_indexer_refused_by_rule(family):
    exc, reason = config_refusal(_config(family))
    assert exc is NotImplementedError and "index_topk" in reason and "sparse attention" in reason


def test_compressed_sparse_attention_named():
    exc, reason = config_refusal(_config("deepseek_v4"))
    assert "compress_rates" in reason and "index_topk" in reason


@pytest.mark.parametrize("family, where", [("falcon_h1", "FalconH1Mixer"), ("inkling2_text", "ShortConvolution"),
                                           ("zaya", "ZayaCCAProjection"), ("inkling_text", "ShortConvolution")])
def test_sequence_convolutions_found_in_decoder_layers(family, where):
    cfg = _config(family)
    convs = sequence_convolutions(_cls(cfg), shrink_config(cfg))
    assert convs and any(where in c for c in convs), convs


def test_no_sequence_convolution_in_plain_decoders():
    for family in ("llama", "gemma3_text", "gpt2"):  # gpt2's Conv1D is a linear layer
        cfg = _config(family)
        assert sequence_convolutions(_cls(cfg), shrink_config(cfg)) == [], family


# ---------------------------------------------------------------------------- probes (build and run a model)
@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma4_text", "gemma3n_text", "dory", "emu3"])
def test_families_the_probe_crashed_on_are_exact(family):
    cfg = _config(family)
    for c in {id(c): c for c in (cfg, cfg.get_text_config())}.values():
        if isinstance(getattr(c, "attention_dropout", None), float):
            c.attention_dropout = 0.0  # as `atac-hf check-model` probes a family's default
    verdict = check_architecture(_cls(cfg), cfg)
    assert verdict.exact, verdict.reason
    assert verdict.max_error <= PROBE_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("family", ["falcon_h1", "inkling2_text", "zaya"])
def test_convolving_families_refused_naming_the_convolution(family):
    cfg = _config(family)
    verdict = check_architecture(_cls(cfg), cfg)
    assert not verdict.exact and "convolve along the sequence" in verdict.reason, verdict.reason


@pytest.mark.slow
def test_stock_model_failure_is_named_as_such():
    """dbrx's default config lacks attn_config.rope_theta: the stock model cannot be built, which
    the reason says (and that a checkpoint's config can be checked), instead of blaming atac_cp."""
    cfg = _config("dbrx")
    with pytest.raises(StockModelError):
        run_probe(_cls(cfg), shrink_config(cfg))
    verdict = check_architecture(_cls(cfg), cfg)
    assert not verdict.exact and "its stock model" in verdict.reason and "--config" in verdict.reason

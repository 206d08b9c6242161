"""Cost model: hand-checked pair counts, presets, profiles, errors."""

import json

import numpy as np
import pytest

from atac_hf.cost import HARDWARE_PRESETS, MODEL_PRESETS, CostModel, ModelDims, default_cost_model


def brute_tiles(s, e, t):
    """Key tiles touched by query tiles [s + k t, ...) against keys [0, row end), times t*t."""
    total = 0
    for q0 in range(s, e, t):
        q1 = min(q0 + t, e)
        total += -(-q1 // t) * t * t
    return total


def test_exact_pairs():
    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1)
    assert cm.attention_pairs(0, 1) == 1
    assert cm.attention_pairs(0, 4) == 10  # 1 + 2 + 3 + 4
    assert cm.attention_pairs(3, 5) == 4 + 5
    assert cm.attention_pairs(5, 5) == 0
    assert np.array_equal(cm.attention_pairs([0, 2], [3, 4]), [6, 7])


def test_tile_quantised_pairs_match_brute_force():
    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=4)
    for s in range(0, 20):
        for e in range(s, 40):
            assert cm.attention_pairs(s, e) == brute_tiles(s, e, 4), (s, e)
    # a 20-token chunk costs like a full tile-row on a 128 kernel
    gpu = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=128)
    assert gpu.attention_pairs(0, 20) == 128 * 128


def test_head_tail_mirror_chunks_cost_the_same_per_token():
    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1)
    L = 100
    a = cm.attention_pairs(0, 10) + cm.attention_pairs(90, 100)
    b = cm.attention_pairs(40, 50) + cm.attention_pairs(50, 60)
    assert a == b == 20 * (L + 1) / 2


def test_sliding_window_pairs():
    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1, sliding_window=3)
    # rows 0..5 see 1, 2, 3, 3, 3, 3 keys
    assert cm.attention_pairs(0, 6) == 15
    assert cm.attention_pairs(2, 6) == 12


def test_doc_chunk_pack_costs_are_one_function():
    cm = CostModel(linear_s_per_token=2.0, attn_s_per_pair=1.0, segment_overhead_s=5.0, tile=1)
    assert cm.doc_cost([4]).tolist() == [8 + 10 + 5]
    assert cm.segment_cost(2, 4) == 4 + 3 + 4 + 5
    assert cm.pack_cost([4, 1]) == (8 + 10 + 5) + (2 + 1 + 5)
    assert cm.segment_cost(3, 3) == 0.0


def test_quadratic_growth_of_long_documents():
    cm = CostModel.from_model("7b", "A800")
    one_long = cm.pack_cost([65536])
    many_short = cm.pack_cost([2048] * 32)
    assert 2.0 < one_long / many_short < 4.0  # DESIGN.md: about 2.7x


def test_presets_and_hf_config():
    for hw in HARDWARE_PRESETS:
        for m in MODEL_PRESETS:
            cm = CostModel.from_model(m, hw)
            assert cm.linear_s_per_token > 0 and cm.attn_s_per_pair > 0 and cm.kv_bytes_per_token > 0
    from transformers import LlamaConfig, MistralConfig

    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128)
    dims = ModelDims.from_hf_config(cfg)
    assert (dims.head_dim, dims.num_kv_heads, dims.num_layers) == (16, 2, 2)
    cm = CostModel.from_model(cfg, "H100")
    assert cm.kv_bytes_per_token == 2 * 2 * 16 * 2
    mcfg = MistralConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, sliding_window=32)
    assert CostModel.from_model(mcfg, "H100").sliding_window == 32


def test_masked_segments_priced_by_the_kernel_that_runs_them():
    """Chunks after a document's first token (and segments longer than the window) run on
    other kernels in the sdpa backend: their own pair price, and with ``mask_block`` whole
    rectangles of ``mask_block`` rows, one call each."""
    base = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, segment_overhead_s=100.0, tile=1)
    assert not base.models_masking
    m = base.replace(masked_attn_s_per_pair=2.0)
    assert m.models_masking
    assert m.needs_mask([0, 5, 3], [10, 10, 3]).tolist() == [False, True, False]  # empty: no kernel
    # whole documents cost as before; a chunk's causal pairs at the masked price
    assert m.attention_cost(0, 10) == base.attention_cost(0, 10)
    assert m.attention_cost(5, 10) == 2.0 * (5 * 5 + 15) + 100.0
    assert m.replace(masked_segment_overhead_s=7.0).attention_cost(5, 10) == 2.0 * (5 * 5 + 15) + 7.0
    assert base.replace(masked_segment_overhead_s=7.0).attention_cost(0, 10) == base.attention_cost(0, 10)
    # blocks of 4 rows over the chunk [5, 15): rows 5-8 see keys < 9, 9-12 < 13, 13-14 < 15
    b = m.replace(mask_block=4)
    rect = 4 * 9 + 4 * 13 + 2 * 15
    assert b.attention_cost(5, 15) == pytest.approx(2.0 * rect + 3 * 100.0)
    assert b.attention_cost(0, 15) == base.attention_cost(0, 15)  # unmasked: one causal call
    # with a window, a whole document longer than the window needs the mask too
    w = m.replace(sliding_window=8)
    assert w.needs_mask([0, 0, 2], [8, 9, 5]).tolist() == [False, True, True]
    # the profile keeps the fields
    assert CostModel.from_dict(b.to_dict()) == b


def test_comm_cost():
    cm = CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0, kv_bytes_per_token=100.0,
                   link_bandwidth=1000.0, link_latency_s=0.5)
    assert cm.comm_cost(0, 4) == 0.0
    assert cm.comm_cost(40, 1) == 0.0
    # 40 tokens x 100 B, 3/4 received, 1000 B/s, 3 steps of latency; x2 for the backward
    assert cm.comm_cost(40, 4) == pytest.approx(2 * (1.5 + 3.0))


def test_profile_round_trip(tmp_path):
    cm = CostModel.from_model("8b", "H200")
    path = tmp_path / "p.json"
    cm.save(path, device="test")
    assert CostModel.from_profile(path) == cm
    assert json.loads(path.read_text())["metadata"] == {"device": "test"}
    assert default_cost_model() == CostModel.from_model("8b", "H100")


@pytest.mark.parametrize(
    "content, match",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"format": "other"}', "expected 'atac-hf/cost-profile/v1'"),
        ('{"format": "atac-hf/cost-profile/v1", "cost_model": {"linear_s_per_token": 1, "attn_s_per_pair": 1, '
         '"evil": 1}}', r"unknown fields \['evil'\]"),
        ('{"format": "atac-hf/cost-profile/v1", "cost_model": {"linear_s_per_token": -1, "attn_s_per_pair": 1}}',
         "linear_s_per_token must be a finite number >= 0"),
    ],
)
def test_profile_errors(tmp_path, content, match):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        CostModel.from_profile(path)


def test_errors():
    with pytest.raises(ValueError, match="does not exist"):
        CostModel.from_profile("/nonexistent/profile.json")
    with pytest.raises(ValueError, match=r"unknown hardware preset 'TPU'; legal values: \['A800', 'H100', 'H200'\]"):
        CostModel.from_model("7b", "TPU")
    with pytest.raises(ValueError, match="unknown model preset '3b'"):
        CostModel.from_model("3b", "H100")
    with pytest.raises(ValueError, match=r"efficiency must be in \(0, 1\]"):
        CostModel.from_model("7b", "H100", efficiency=1.5)
    with pytest.raises(ValueError, match="tile must be an int >= 1"):
        CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=0)
    with pytest.raises(ValueError, match="masked_attn_s_per_pair must be None or a finite number >= 0"):
        CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, masked_attn_s_per_pair=-1.0)
    with pytest.raises(ValueError, match="masked_segment_overhead_s must be None or a finite number >= 0"):
        CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, masked_segment_overhead_s=float("nan"))
    with pytest.raises(ValueError, match="mask_block must be an int >= 0"):
        CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, mask_block=-3)
    with pytest.raises(ValueError, match="link_bandwidth must be > 0"):
        CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, link_bandwidth=0)
    with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
        ModelDims(hidden_size=8, num_layers=1, num_heads=6, num_kv_heads=4, head_dim=2, intermediate_size=8)
    with pytest.raises(ValueError, match="no hidden_size"):
        ModelDims.from_hf_config({"foo": 1})

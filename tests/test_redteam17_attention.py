"""Red-team 17: hostile arguments to the attention runtime's public helpers are refused at the call."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from atac_hf.attention import check_model_supported, register_attention, varlen_attention_reference
from atac_hf.packing.validate import InputTypeError


class TestRegisterAttention:
    """red-team 17: register_attention refuses a name that is not a non-empty str, registering nothing."""

    @pytest.mark.parametrize("name", [None, 5, 2.5, True, b"atac_cp", ["atac_cp"]])
    def test_register_attention_refuses_non_str_name(self, name):
        from transformers import AttentionInterface

        before = dict(AttentionInterface._global_mapping)
        with pytest.raises(InputTypeError, match=r"register_attention\(name=.*\): name must be a non-empty str"):
            register_attention(name)
        assert dict(AttentionInterface._global_mapping) == before

    @pytest.mark.parametrize("name", ["", "   "])
    def test_register_attention_refuses_empty_name(self, name):
        from transformers import AttentionInterface

        before = dict(AttentionInterface._global_mapping)
        with pytest.raises(ValueError, match=r"register_attention\(name='\s*'\): name must be a non-empty str"):
            register_attention(name)
        assert dict(AttentionInterface._global_mapping) == before

    def test_register_attention_default_still_works(self):
        assert register_attention() == "atac_cp"


class TestCheckModelSupported:
    """red-team 17: check_model_supported refuses values that are no model or config."""

    @pytest.mark.parametrize("value, shown", [(None, "None"), ("llama", "'llama'"), (3, "3"), (True, "True"),
                                              ({"rope_parameters": {"rope_type": "dynamic"}}, r"\{'rope_parameters'"),
                                              ([1, 2], r"\[1, 2\]"), (np.zeros(2), "array")])
    def test_check_model_supported_refuses_non_config(self, value, shown):
        with pytest.raises(InputTypeError, match=rf"model_or_config={shown}.* is not a model or config: "
                                                 r"check_model_supported takes a Transformers model or its config"):
            check_model_supported(value)

    def test_check_model_supported_refuses_model_whose_config_is_none(self):
        with pytest.raises(InputTypeError, match=r"its \.config is None\) is not a model or config"):
            check_model_supported(types.SimpleNamespace(config=None))

    def test_check_model_supported_still_takes_models_and_configs(self):
        def model(rope_type):
            return types.SimpleNamespace(config=types.SimpleNamespace(rope_parameters={"rope_type": rope_type}))

        check_model_supported(types.SimpleNamespace())
        check_model_supported(model("yarn"))
        with pytest.raises(ValueError, match=r"rope type 'dynamic'"):
            check_model_supported(model("dynamic"))


_Q = torch.randn(5, 2, 4, generator=torch.Generator().manual_seed(0))


def _ref(cu_q, cu_k=None, **kw):
    cu_k = cu_q if cu_k is None else cu_k
    return varlen_attention_reference(_Q, _Q, _Q, cu_q, cu_k, **kw)


class TestVarlenAttentionReference:
    """red-team 17: varlen_attention_reference checks cu_seqlens (1-D ints, 0 .. row count, sorted) and window."""

    @pytest.mark.parametrize("cu, shown", [([0, 3], r"\[0, 3\]"), ([0, 4, 3, 5], r"\[0, 4, 3, 5\]"),
                                           ([1, 3, 5], r"\[1, 3, 5\]"), ([0, 3, 6], r"\[0, 3, 6\]")])
    def test_varlen_reference_refuses_bad_boundaries(self, cu, shown):
        with pytest.raises(ValueError, match=rf"cu_seqlens_q={shown} must start at 0, never decrease and end at the "
                                             r"row count 5"):
            _ref(torch.tensor(cu))

    @pytest.mark.parametrize("cu", [torch.tensor([0.0, 3.0, 5.0]), torch.tensor([[0, 3, 5]]), [0, 3, 5],
                                    torch.tensor([True, False]), np.array([0.0, 5.0])])
    def test_varlen_reference_refuses_non_integer_boundaries(self, cu):
        with pytest.raises(InputTypeError, match=r"cu_seqlens_q=.* is not a 1-D integer tensor"):
            _ref(cu, torch.tensor([0, 3, 5]))

    def test_varlen_reference_refuses_mismatched_segment_counts(self):
        with pytest.raises(ValueError, match=r"cu_seqlens_q has 2 segments and cu_seqlens_k 1"):
            _ref(torch.tensor([0, 3, 5]), torch.tensor([0, 5]))

    @pytest.mark.parametrize("window", [-1, 0, 2.0, True, "3"])
    def test_varlen_reference_refuses_bad_window(self, window):
        with pytest.raises(ValueError, match=rf"window must be None or an int >= 1 .*got {window!r}"):
            _ref(torch.tensor([0, 3, 5]), window=window)

    def test_varlen_reference_legal_inputs_unchanged(self):
        cu = torch.tensor([0, 3, 5], dtype=torch.int32)
        assert _ref(cu).shape == (5, 2, 4)
        assert torch.equal(_ref(cu, window=np.int64(2)), _ref(np.array([0, 3, 5]), window=2))
        assert _ref(torch.tensor([0, 0, 5])).shape == (5, 2, 4)  # an empty segment is legal

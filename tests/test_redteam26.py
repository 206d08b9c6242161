"""Red-team 26: model classes of the user's own (not stock transformers families).

A class that computes something from each rank's *local* row (RoPE angles from ``arange`` of the row length
instead of ``position_ids``; a token shift restarted where ``position_ids`` is 0) is exact at cp_size 1, where
every document of the packed row is contiguous, and wrong under CP, where a rank holds a split document's
chunks beside other documents (a helper measured grads 12% and 0.15% off at CP 2). ``check_model``'s probe
runs in one process, so both were accepted; ATACAccelerator and ATACTrainer now also run the probe sharded
over the CP ranks before training (:mod:`atac_hf.integrations.sharded_check`).
"""

from __future__ import annotations

import pytest
import torch

from _launch import torchrun_modes
from _redteam26_worker import BigramLlama, IdsOnlyLlama, LocalRopeLlama, ResetShiftLlama, ZeroGateShiftLlama, custom


def test_the_cp_only_classes_are_exact_in_one_process_and_nothing_is_probed_at_cp_size_1():
    from atac_hf import check_model
    from atac_hf.integrations.sharded_check import _VERDICTS, check_model_sharded

    for cls in (LocalRopeLlama, ResetShiftLlama):
        model = custom(cls)
        assert check_model(model).exact
        before = dict(_VERDICTS)
        check_model_sharded(model, 0, None, 1)  # cp_size 1: no group, nothing to do
        assert _VERDICTS == before


def test_a_zero_initialised_token_mixing_branch_is_refused_by_its_parameter_gradients():
    # the fresh copy's logits and input gradients are exact (the gate is 0), but the gate's own gradient is wrong
    # (13-25% in the helper's variants), and a trained checkpoint's non-zero gate mixes the documents
    from atac_hf.attention.model_check import check_architecture

    model = custom(ZeroGateShiftLlama)
    verdict = check_architecture(type(model), model.config)
    assert not verdict.exact and verdict.max_error > 1e-3, verdict
    assert "gives different results through 'atac_cp'" in verdict.reason


def test_the_probe_feeds_token_ids_so_a_model_reading_them_is_checked_and_an_ids_only_forward_is_accepted():
    from atac_hf.attention.model_check import check_architecture

    model = custom(BigramLlama)  # an embedding of the previous id: read only from input_ids
    verdict = check_architecture(type(model), model.config)
    assert not verdict.exact and verdict.max_error > 1e-3, verdict
    model = custom(IdsOnlyLlama)  # was "could not be probed" (TypeError: missing input_ids)
    verdict = check_architecture(type(model), model.config)
    assert verdict.exact and verdict.max_error < 1e-12, verdict


def test_special_token_ids_are_not_drawn():
    from transformers import LlamaConfig

    from atac_hf.attention.probe_compare import plain_ids

    cfg = LlamaConfig(vocab_size=16, pad_token_id=5, bos_token_id=3, eos_token_id=[4, 9])
    ids = torch.arange(3, 16)[None]
    out = plain_ids(ids, cfg, 16)
    assert not set(out[0].tolist()) & {3, 4, 5, 9} and set(out[0].tolist()) <= set(range(3, 16))
    assert (out[ids != out] == 6).all()  # each replaced by the smallest plain id
    assert plain_ids(ids, LlamaConfig(vocab_size=16, pad_token_id=None, bos_token_id=None, eos_token_id=None), 16
                     ) is ids


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return torchrun_modes(tmp_path_factory, "_redteam26_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["accelerate", "trainer"])
def test_a_class_wrong_only_under_cp_is_refused_before_training_and_left_as_it_came(runs, mode):
    res = runs[mode]
    for name in ("LocalRopeLlama", "ResetShiftLlama"):
        assert res[name + "_one_process"] is True
        got = res[name]
        assert got["error"] and got["error"].startswith("NotImplementedError: " + name), got
        assert "exact at cp_size=1 but not with its packed row sharded over 2 CP ranks" in got["error"]
        assert "Set cp_size=1" in got["error"]
        assert got["attention"] == "sdpa", got  # the attention prepare had selected is put back
    assert res["stock"] == {"error": None, "attention": "atac_cp"}


@pytest.mark.slow
def test_an_nccl_cp_group_probes_on_gloo_twins_and_ranks_past_the_probes_take_its_verdict(runs):
    twin = runs["accelerate"]["twin"]
    assert "not with its packed row sharded over 2 CP ranks" in twin["twin_rope"] and twin["twin_stock"] is None
    assert twin["twins_made"] == ["gloo", "gloo"]  # one twin of the one CP group, per architecture probed
    assert twin["groups_left"] == 0  # each destroyed after its probe (one left to exit can abort the interpreter)
    # rank 0 (which writes the result) probed alone; rank 1 asserts its "refused on CP rank 0" in the worker
    assert "sharded over 1 CP ranks" in twin["subset_zero_gate"] and twin["subset_rope"] is None

"""Red-team 13: a user of stock ``Trainer`` switching to ``ATACTrainer`` with the Trainer features they rely on.

Under CP 2 (2 gloo processes, ``tests/_redteam13_worker.py``): an ``evaluate()`` or ``predict()``
before ``train()`` left the model without DDP (Accelerate's evaluation-mode prepare marks it
prepared), so the CP ranks' gradient shares were never summed and their weights drifted apart; a
``compute_loss`` override returning ``model(**inputs).loss`` trained on half the loss; a model whose
loss ignores ``num_items_in_batch`` trained on twice it. In one process: ``label_names`` the packed
batch does not hold failed late or in other words. (``metric_for_best_model`` naming a
``compute_metrics`` metric was refused under CP while evaluation there returned the loss only; it is
taken since predictions are gathered into full rows: ``tests/test_cp_predictions.py``.)
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _launch import torchrun_json  # noqa: E402


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    return torchrun_json(2, "_redteam13_worker.py", tmp_path_factory.mktemp("rt13"))


@pytest.mark.slow
@pytest.mark.parametrize("first", ["evaluate_first", "predict_first"])
def test_training_after_an_evaluation_sums_the_cp_ranks_gradients(cp2, first):
    ref, got = cp2["train_only"], cp2[first]
    assert got["wrapper"] == ref["wrapper"] == "DistributedDataParallel"
    np.testing.assert_allclose(got["sums"][0], got["sums"][1], rtol=0, atol=1e-9)  # the ranks agree
    np.testing.assert_allclose(got["sums"], ref["sums"], rtol=1e-9)
    np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-6)
    np.testing.assert_allclose(got["eval_after"], ref["eval_after"], rtol=1e-6)


@pytest.mark.slow
def test_a_compute_loss_override_that_bypasses_trainer_is_refused_before_any_step(cp2):
    got = cp2["plain"]
    assert got["error"] and "PlainLoss.compute_loss returned a loss without calling super().compute_loss" in got["error"]
    assert "cp_size=1" in got["error"]
    assert got["after"] == got["before"]  # refused before the backward: no weight changed


@pytest.mark.slow
@pytest.mark.parametrize("how", ["super", "direct"])  # super().compute_loss, Trainer.compute_loss(self, ...)
def test_a_compute_loss_override_through_trainers_trains_as_without_it(cp2, how):
    np.testing.assert_allclose(cp2[how]["loss"], cp2["train_only"]["loss"], rtol=1e-6)
    np.testing.assert_allclose(cp2[how]["sums"], cp2["train_only"]["sums"], rtol=1e-9)


@pytest.mark.slow
def test_a_model_whose_loss_ignores_num_items_is_refused_under_cp(cp2):
    got = cp2["mean_model"]
    assert got["error"] and "MeanLossLlama" in got["error"] and "its loss ignores num_items_in_batch" in got["error"]
    assert "cp_size=2" in got["error"]
    assert got["attn"] != "atac_cp"  # refused before the model was switched


# ------------------------------------------------------------------ in one process
def _tiny():
    from transformers import AutoModelForCausalLM

    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=64,
                                                              max_position_embeddings=512))


def _ds(n=12):
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    return Dataset.from_list([{"input_ids": torch.randint(3, 64, (int(L),), generator=g).tolist()}
                              for L in torch.randint(5, 60, (n,), generator=g)])


def _args(tmp_path, **kw):
    from transformers import TrainingArguments

    kw = {"save_strategy": "no", **kw}
    return TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=1, report_to="none",
                             disable_tqdm=True, use_cpu=True, **kw)


def test_label_names_the_packed_batch_lacks_are_refused_in_words(tmp_path):
    from atac_hf.integrations import ATACConfig, ATACTrainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = ATACTrainer(model=_tiny(), args=_args(tmp_path, label_names=["labels", "my_weights"]),
                         train_dataset=_ds(), eval_dataset=_ds(), atac_config=ATACConfig(cp_size=1, max_tokens=128))
        with pytest.raises(ValueError, match=r"label_names=\['labels', 'my_weights'\]: the packed batch has no "
                                             r"'my_weights'.*label_names=\['labels'\]"):
            tr.evaluate()


def test_the_loss_probe_refuses_only_a_loss_shown_to_ignore_num_items():
    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    class Broken(torch.nn.Module):  # a model the 4-token check cannot run: not refused (no verdict)
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, **kw):
            raise RuntimeError("needs pixel_values")

    assert loss_scale_refusal(Broken(), stale=False, cp_size=2) is None
    assert "failed" in loss_scale_refusal(Broken(), stale=True, cp_size=2)  # declared stale: shown or refused
    assert loss_scale_refusal(_tiny(), stale=False, cp_size=2) is None  # a stock model honours it
    assert loss_scale_refusal(Broken(), stale=False, cp_size=1) is None  # not checked without CP

    class NaNLoss(torch.nn.Module):  # an overflowing check (fp16): no verdict, not refused under CP
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, **kw):
            return type("Out", (), {"loss": torch.tensor(float("nan"))})()

    assert loss_scale_refusal(NaNLoss(), stale=False, cp_size=2) is None
    assert "gave nan" in loss_scale_refusal(NaNLoss(), stale=True, cp_size=2)


def test_release_eval_preparation_resets_a_compiled_copy_too():
    """With torch_compile the evaluation prepare marks a compiled copy (``_orig_mod`` is the model) and
    Trainer holds it as model_wrapped, which train() would take as wrapped already (no DDP)."""
    from types import SimpleNamespace

    from atac_hf.integrations.trainer_guards import release_eval_preparation

    model = torch.nn.Linear(2, 2)
    compiled = SimpleNamespace(_orig_mod=model, _is_accelerate_prepared=True)
    other = torch.nn.Linear(2, 2)
    acc = SimpleNamespace(_models=[compiled, other])
    args = SimpleNamespace(world_size=2, torch_compile=True)
    tr = SimpleNamespace(model=model, model_wrapped=compiled, accelerator=acc, args=args, is_deepspeed_enabled=False,
                         is_fsdp_enabled=True, atac_tp_size=1)
    release_eval_preparation(tr)
    assert tr.model_wrapped is model and acc._models == [other]
    assert not hasattr(compiled, "_is_accelerate_prepared")
    tr.args = SimpleNamespace(world_size=2, torch_compile=False)  # FSDP's own evaluation prepare: left alone
    model._is_accelerate_prepared = True
    tr.model_wrapped, acc._models = model, [model]
    release_eval_preparation(tr)
    assert acc._models == [model] and model._is_accelerate_prepared



@pytest.mark.slow
def test_tokens_seen_count_a_tiny_pack_without_its_padding(cp2):
    """A 1-token pack is padded to one token per CP rank; the count is the pack's (the general case,
    CP 2 against CP 1 on 160 samples, is in test_integration_trainer)."""
    assert cp2["tokens_tiny"] == 1

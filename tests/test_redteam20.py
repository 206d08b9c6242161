"""Red-team 20: user loss code that trained silently wrong under CP.

- A model whose loss shifts ``labels`` itself (its own forward, or ``model.loss_function`` replaced)
  passed every guard: under CP a rank's ``labels`` are its shard's tokens, and only ``shift_labels``
  hold the row's targets (gradients 30-48% off at CP 2). Refused at construction by a 4-token check.
- A ``training_step`` override with transformers 4.x's signature, or a ``compute_loss`` calling
  ``super()`` without ``num_items_in_batch``, trained on 1/cp of the loss: the shard's count now
  falls back to the pack's count over cp, so such a step trains each pack's mean, as one device does.
- The ``compute_loss`` guard counted any read of ``compute_loss_func`` as reaching Trainer's loss (a
  copy of an older Trainer's ``compute_loss`` passed and trained on half the loss), and checked only
  the class's ``compute_loss``, not one set on the instance after construction. Both are refused now.

Slow cases: 2 gloo processes (``tests/_redteam20_worker.py``).
"""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _launch import torchrun_json  # noqa: E402


def _config():
    from atac_hf.integrations.demo import tiny_llama_config

    return tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=64, max_position_embeddings=512)


def _self_shift_model(supports_sdpa: bool = True):
    from transformers import LlamaForCausalLM

    class SelfShiftLlama(LlamaForCausalLM):  # its own loss: labels shifted on whatever rows it gets
        _supports_sdpa = supports_sdpa

        def forward(self, input_ids=None, labels=None, num_items_in_batch=None, shift_labels=None, **kw):
            out = super().forward(input_ids=input_ids, **kw)
            if labels is not None:
                lg = out.logits[:, :-1].float()
                out.loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels[:, 1:].reshape(-1),
                                           ignore_index=-100, reduction="sum") / num_items_in_batch
            return out

    torch.manual_seed(0)
    return SelfShiftLlama(_config())


def _stock_model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_config())


def _user_loss_function(logits, labels, vocab_size, num_items_in_batch=None, **kwargs):
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab_size), labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction="sum") / num_items_in_batch


def test_a_loss_that_shifts_labels_itself_is_found_and_a_stock_loss_is_not():
    from atac_hf.integrations.trainer_guards import loss_scale_refusal, loss_shift_refusal

    stock = _stock_model().train()
    assert loss_shift_refusal(stock) is None and stock.training  # the mode is restored
    own = _self_shift_model()
    replaced = _stock_model()
    replaced.loss_function = _user_loss_function
    for m in (own, replaced):
        why = loss_shift_refusal(m)
        assert why and why.startswith("its loss does not train the targets given as shift_labels")
        assert "loss_function(" in why and "cp_size=1" in why
        assert loss_scale_refusal(m, stale=False, cp_size=2) == why
        assert loss_scale_refusal(m, stale=False, cp_size=1) is None  # rows are whole at CP 1: the shift is right

    class NoLogits(torch.nn.Module):  # gives a loss but no logits: no verdict, no refusal
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, **kw):
            return SimpleNamespace(loss=self.w.sum(), logits=None)

    assert loss_shift_refusal(NoLogits()) is None


def _guarded_trainer(base=None):
    """A bare trainer with the loss guard (what Trainer.compute_loss reads), no model or accelerator set up;
    ``base``: a subclass of the guard to build instead."""
    from transformers import Trainer

    from atac_hf.integrations.trainer_guards import LossGuardMixin

    class Guarded(LossGuardMixin, Trainer):
        pass

    t = (base or Guarded).__new__(base or Guarded)
    t.label_smoother, t.compute_loss_func, t.model_accepts_loss_kwargs = None, None, True
    t.args = SimpleNamespace(average_tokens_across_devices=True, n_gpu=1)
    t.accelerator = SimpleNamespace(num_processes=2, parallelism_config=None)
    t.get_tp_size = lambda: 1
    return t


def _model(**inputs):
    return {"loss": torch.tensor(float(inputs.get("num_items_in_batch", 1.0)))}


def test_the_loss_guard_counts_only_trainers_compute_loss():
    from transformers import Trainer

    from atac_hf.integrations.trainer_guards import install_loss_override_check

    t = _guarded_trainer()

    def old_trainer_body(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        assert self.compute_loss_func is None  # read, as Trainer 4.46 did, outside Trainer's compute_loss
        return model(**inputs, num_items_in_batch=num_items_in_batch)["loss"]

    def through_trainer(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return Trainer.compute_loss(self, model, inputs, num_items_in_batch=num_items_in_batch)

    t.compute_loss = types.MethodType(through_trainer, t)
    install_loss_override_check(t, 2)
    assert float(t.compute_loss(_model, {}, num_items_in_batch=3.0)) == 6.0  # reached: scaled by the world size
    checked = t.compute_loss
    install_loss_override_check(t, 2)  # at every step: a wrapped loss is not wrapped again
    assert t.compute_loss is checked
    t.compute_loss = types.MethodType(old_trainer_body, t)  # set on the instance after construction
    install_loss_override_check(t, 2)
    with pytest.raises(ValueError, match=r"Guarded \(set on the instance\)\.compute_loss returned a loss without "
                                         r"calling super\(\)\.compute_loss"):
        t.compute_loss(_model, {}, num_items_in_batch=3.0)
    plain = _guarded_trainer()
    install_loss_override_check(plain, 2)  # the class's own (Trainer's through the guard): not wrapped
    assert "compute_loss" not in vars(plain)
    install_loss_override_check(t, 1)  # no CP: nothing to check


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    return torchrun_json(2, "_redteam20_worker.py", tmp_path_factory.mktemp("rt20"))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["drop_count_step", "drop_count_loss"])
def test_a_step_that_drops_the_count_trains_as_one_device(cp2, case):
    ref, got = cp2["reference"], cp2[case]
    np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-6)
    np.testing.assert_allclose(got["sums"], ref["sums"], rtol=1e-9)
    np.testing.assert_allclose(got["sums"][0], got["sums"][1], rtol=0, atol=1e-9)


@pytest.mark.slow
def test_trainer_refuses_a_self_shifting_loss_under_cp_before_it_changes_anything(cp2):
    got = cp2["self_shift"]
    assert got["error"] and "SelfShiftLlama: its loss does not train the targets given as shift_labels" in got["error"]
    assert got["attn"] != "atac_cp"  # refused before the model was switched


@pytest.mark.slow
@pytest.mark.parametrize("case,owner", [("old_trainer_loss", "OldTrainerLoss"),
                                        ("set_on_instance", "ATACTrainer (set on the instance)")])
def test_a_loss_that_never_reaches_trainers_is_refused_before_any_step(cp2, case, owner):
    got = cp2[case]
    assert got["error"] and f"{owner}.compute_loss returned a loss without calling super().compute_loss" in got["error"]
    assert got["after"] == got["before"]

"""Red-team 24: ``ATACTrainer`` subclassed and customised the way users customise ``Trainer`` (CP 2 against CP 1
in float64). Silently wrong, now refused:

- ``super().compute_loss(self.model, inputs, ...)`` in an override: the forward ran outside the step's DDP
  wrapper, so the CP ranks' gradients were never summed (grad norm 41% off, the ranks' weights drifting apart).
  :func:`~atac_hf.integrations.trainer_guards.watch_step_forwards` watches the step's wrapper and its module and
  refuses the backward; a second forward of ``self.model`` beside the loss through ``model`` is exact and passes.
- ``inputs["labels"]`` masked in an override before ``super().compute_loss``: the loss trains the
  ``shift_labels`` the sharder built before ``compute_loss`` ran, so the mask was ignored at every ``cp_size``
  (:func:`~atac_hf.integrations.trainer_guards.check_target_edits`).
- a parameter unfrozen by a callback mid-run: DDP fixed its gradient buckets when it wrapped the model, so
  the parameter's gradient was never summed (grad norm 23% off, the ranks' embeddings drifting apart); refused
  at the next step.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from atac_hf.integrations.trainer_guards import check_target_edits

sys.path.insert(0, os.path.dirname(__file__))
from _launch import torchrun_json  # noqa: E402


def test_labels_changed_without_their_shift_labels_are_refused():
    labels = torch.tensor([[5, 6, 7, -100]])
    shift = torch.tensor([[6, 7, -100, -100]])
    sharded = {"labels": labels.clone(), "shift_labels": shift.clone()}
    check_target_edits(sharded, {"labels": labels, "shift_labels": shift})  # unchanged
    check_target_edits(sharded, {"labels": labels.clone(), "shift_labels": shift})  # replaced by an equal tensor
    check_target_edits(None, {"labels": labels})  # no shard recorded (a bare trainer)
    masked = labels.masked_fill(labels < 7, -100)
    with pytest.raises(ValueError, match=r"inputs\['labels'\] was changed before super\(\)\.compute_loss, but under "
                                         r"ATACTrainer the loss trains inputs\['shift_labels'\].*apply it to "
                                         r"inputs\['shift_labels'\] too"):
        check_target_edits(sharded, {"labels": masked, "shift_labels": shift})
    labels[0, 0] = -100  # in place
    with pytest.raises(ValueError, match="was changed before super"):
        check_target_edits(sharded, {"labels": labels, "shift_labels": shift})
    check_target_edits(sharded, {"labels": masked, "shift_labels": shift.masked_fill(shift < 7, -100)})  # both: fine


def test_a_compute_loss_that_masks_labels_only_is_refused_at_cp1_before_any_change(tmp_path):
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    from _integration_worker import dataset, model
    from atac_hf.integrations import ATACConfig, ATACTrainer

    class MaskLabels(ATACTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs["labels"] = inputs["labels"].masked_fill(inputs["labels"] < 128, -100)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    class MaskBoth(MaskLabels):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs["shift_labels"] = inputs["shift_labels"].masked_fill(inputs["shift_labels"] < 128, -100)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def build(cls, name):
        args = TrainingArguments(output_dir=str(tmp_path / name), optim="sgd", learning_rate=0.5, max_steps=1,
                                 use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True, log_level="error")
        return cls(model=model(), args=args, train_dataset=dataset(20, seed=1),
                   atac_config=ATACConfig(cp_size=1, max_tokens=384, min_chunk=8))

    AcceleratorState._reset_state(True)
    try:
        t = build(MaskLabels, "a")
        before = [p.detach().clone() for p in t.model.parameters()]
        with pytest.raises(ValueError, match=r"inputs\['labels'\] was changed before super\(\)\.compute_loss"):
            t.train()
        assert all(torch.equal(a, p) for a, p in zip(before, t.model.parameters()))
        AcceleratorState._reset_state(True)
        build(MaskBoth, "b").train()  # the change applied to the targets the loss trains: accepted
    finally:
        AcceleratorState._reset_state(True)


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    return torchrun_json(2, "_redteam24_worker.py", tmp_path_factory.mktemp("rt24"))


@pytest.mark.slow
def test_super_compute_loss_given_self_model_is_refused_on_every_rank_before_any_change(cp2):
    r = cp2["self_model"]
    assert r["error"] and "ran a forward with autograd on only outside the wrapper" in r["error"]
    assert "pass the model argument on (super().compute_loss(model, inputs, ...)), not self.model" in r["error"]
    assert r["before"] == r["after"] and r["before"][0] == r["before"][1] and r["grads"] == 0


@pytest.mark.slow
def test_an_extra_forward_of_self_model_beside_the_wrapped_loss_trains_in_step(cp2):
    sums = cp2["extra_term"]["sums"]
    assert sums[0] == sums[1] and len(cp2["extra_term"]["losses"]) == 3


@pytest.mark.slow
def test_a_parameter_unfrozen_after_ddp_wrapped_the_model_is_refused_at_the_next_step(cp2):
    r = cp2["unfreeze"]
    assert r["error"] and "embed_tokens.weight'] were unfrozen (1 in all) after DDP wrapped the model" in r["error"]
    assert r["step"] == 1  # the first step trained; the second was refused before its forward

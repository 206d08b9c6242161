"""Thirty-sixth mutation pass: survivors of mutants planted by hand in red-team 24's guards.

Killed here, in process (no process group; fakes for the trainer and DDP): ``check_target_edits`` leaving
recorded targets without one of the keys, inputs without ``labels`` and inputs without a ``shift_labels`` tensor
alone, and seeing a label changed by one id; ``ATACTrainer._prepare_context_parallel_inputs`` recording clones of
the shard's own targets, in evaluation too (a mask made in place refused, before Trainer's ``compute_loss``);
``watch_step_forwards`` checking before Accelerate's ``backward`` runs (its keyword arguments passed on, the
trainer's fix named), installed once per trainer, watching the new wrapper of a second ``train()``, installing
nothing at ``cp_size=1`` or for a model no wrapper holds, refusing a second backward of one forward (red-team 25:
DDP sums once per forward; this pass first pinned it as allowed), called by
``training_step`` with the step's model before Trainer's step, and its unfreeze check (three names, sorted, as the
step's model names them, the count, a parameter frozen mid-run and a new wrap accepted); ``PreparedForwardCheck``'s
per-module counts kept when another wrapper of the module is watched, and holding their modules weakly (the
last three were killed only by the slow 2-process tests of ``test_redteam24.py``).
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_unprepared_module import Wrapper  # noqa: E402

from atac_hf.integrations.forward_check import PreparedForwardCheck  # noqa: E402
from atac_hf.integrations.trainer_guards import check_target_edits, watch_step_forwards  # noqa: E402

nn = torch.nn
BYPASS = r"ran a forward with autograd on only outside the wrapper"


def _targets():
    labels = torch.tensor([[5, 6, 7, -100]])
    shift = torch.tensor([[6, 7, -100, -100]])
    return labels, shift


# ---------------------------------------------------------------------------- check_target_edits
def test_targets_without_one_of_the_keys_and_inputs_without_labels_are_not_checked():
    # kills: `"labels" not in sharded` or `"shift_labels" not in sharded` dropped (KeyError), `"labels" not in
    # inputs` dropped or made `"shift_labels" not in inputs` (labels popped by an override: refused)
    labels, shift = _targets()
    masked = labels.masked_fill(labels < 7, -100)
    check_target_edits({"shift_labels": shift.clone()}, {"labels": masked, "shift_labels": shift})
    check_target_edits({"labels": labels.clone()}, {"labels": masked, "shift_labels": shift})
    both = {"labels": labels.clone(), "shift_labels": shift.clone()}
    check_target_edits(both, {"shift_labels": shift})  # labels popped (no labels edit to ignore)


def test_labels_changed_where_shift_labels_were_dropped_or_are_not_a_tensor_pass():
    # kills: `isinstance(x, torch.Tensor) and` dropped from same() (AttributeError on None)
    labels, shift = _targets()
    masked = labels.masked_fill(labels < 7, -100)
    both = {"labels": labels.clone(), "shift_labels": shift.clone()}
    check_target_edits(both, {"labels": masked})
    check_target_edits(both, {"labels": masked, "shift_labels": None})


def test_one_label_changed_by_one_id_is_seen():
    # kills: torch.equal loosened to a tolerance (an edit of a token id by one passed)
    labels, shift = _targets()
    both = {"labels": labels.clone(), "shift_labels": shift.clone()}
    edited = labels.clone()
    edited[0, 1] += 1
    with pytest.raises(ValueError, match=r"inputs\['labels'\] was changed before super\(\)\.compute_loss"):
        check_target_edits(both, {"labels": edited, "shift_labels": shift})


# ---------------------------------------------------------------------------- the targets recorded per shard
def _bare_trainer(cp: int = 1):
    from atac_hf.integrations.trainer import ATACTrainer

    def sharder(inputs, record):  # a shard of the first 3 tokens, shift_labels built from the labels
        labels = inputs.get("labels")
        out = {"input_ids": inputs["input_ids"][:, :3]}
        if labels is not None:
            out["labels"] = labels[:, :3]
            out["shift_labels"] = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)[:, :3]
        return out

    t = ATACTrainer.__new__(ATACTrainer)
    t.atac_config, t.atac_tp_size = SimpleNamespace(cp_size=cp), 1
    t.atac_sharder = sharder
    t.accelerator = SimpleNamespace(sync_gradients=True)  # (training_step notes the gradients of a syncing step)
    return t


@pytest.mark.parametrize("training", [True, False])
def test_the_shards_own_targets_are_recorded_as_clones_and_an_in_place_mask_is_refused(training):
    # kills: `local[k].clone()` -> `local[k]` or `.detach()` (the record was the tensor edited in place: a mask
    # in place passed), the record made in training only (an evaluation checked the last training step's targets,
    # or none), and the check made after Trainer's compute_loss (the model ran first; model=None here)
    t = _bare_trainer()
    t._atac_training_step = training
    t._atac_docs_trained = 0
    t.atac_sharder.last_stats = SimpleNamespace(num_docs=1)
    inputs = {"input_ids": torch.tensor([[1, 2, 3, 4, 5]]), "labels": torch.tensor([[1, 2, 3, 4, 5]])}
    local = t._prepare_context_parallel_inputs(None, inputs)[1]
    assert set(t._atac_targets) == {"labels", "shift_labels"}
    assert torch.equal(t._atac_targets["shift_labels"], torch.tensor([[2, 3, 4]]))
    assert all(t._atac_targets[k] is not local[k] for k in t._atac_targets)
    local["labels"][local["labels"] < 3] = -100  # masked in place, shift_labels not
    with pytest.raises(ValueError, match=r"inputs\['labels'\] was changed before super\(\)\.compute_loss"):
        t.compute_loss(None, local)


# ---------------------------------------------------------------------------- watch_step_forwards
def _step_trainer(cp: int = 2, world: int = 2, model=None):
    """A trainer stand-in: its accelerator's ``backward`` records (loss, kwargs)."""
    calls = []

    def backward(loss, **kwargs):
        calls.append((loss, kwargs))

    t = SimpleNamespace(atac_config=SimpleNamespace(cp_size=cp), args=SimpleNamespace(world_size=world),
                        accelerator=SimpleNamespace(backward=backward), model=model)
    return t, calls, backward


def test_the_steps_backward_is_checked_before_accelerate_runs_it_and_gets_its_arguments():
    # kills: the check after the backward or dropped, the backward called without **kwargs, or read again from
    # the accelerator (itself: recursion), the step's wrapper not watched (or trainer.model watched), and the
    # check built without the trainer's fix
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    t, calls, _ = _step_trainer(model=inner)
    watch_step_forwards(t, wrapper)
    x = torch.ones(2, 3)
    loss = inner(x).sum()  # super().compute_loss(self.model, ...): outside the step's wrapper
    with pytest.raises(ValueError, match=BYPASS + r".*pass the model argument on \(super\(\)\.compute_loss\(model, "
                                                  r"inputs, \.\.\.\)\), not self\.model"):
        t.accelerator.backward(loss, scale_wrt_gas=False)
    assert calls == []  # refused before the backward
    loss = wrapper(x).sum() + 0.1 * inner(x).sum()  # an extra term from self.model beside the loss through model
    t.accelerator.backward(loss, scale_wrt_gas=False)
    assert calls == [(loss, {"scale_wrt_gas": False})]


def test_the_check_is_installed_once_per_trainer_and_the_wrapper_of_a_second_train_is_watched():
    # kills: the check not kept on the trainer or looked up under another name (a new check and one more wrapped
    # backward at every step), and watch() only where the check is built (a second train()'s new DDP wrapper
    # unwatched: its forwards counted as outside it and refused)
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    t, calls, _ = _step_trainer(model=inner)
    watch_step_forwards(t, wrapper)
    checked, check = t.accelerator.backward, t._atac_forward_check
    watch_step_forwards(t, wrapper)
    assert t.accelerator.backward is checked and t._atac_forward_check is check
    assert len(inner._forward_pre_hooks) == 1 and len(wrapper._forward_pre_hooks) == 1
    x = torch.ones(2, 3)
    t.accelerator.backward(wrapper(x).sum())
    again = Wrapper(inner)  # train() again: DDP wraps the model anew
    watch_step_forwards(t, again)
    t.accelerator.backward(again(x).sum())
    assert len(calls) == 2


@pytest.mark.parametrize("cp, world, wrapped", [(1, 2, True), (2, 2, False)])
def test_nothing_is_installed_at_cp1_or_for_a_model_no_wrapper_holds(cp, world, wrapped):
    # kills: `cp_size <= 1` dropped (DP-only runs checked) and `not is_wrapper(model)` dropped (FSDP2 and TP
    # models, no wrapper: the backward wrapped and the unfreeze check run where DDP fixed no buckets)
    inner = nn.Linear(3, 1)
    t, calls, backward = _step_trainer(cp, world, model=inner)
    model = Wrapper(inner) if wrapped else inner
    inner.bias.requires_grad_(False)
    watch_step_forwards(t, model)
    inner.bias.requires_grad_(True)
    watch_step_forwards(t, model)
    assert t.accelerator.backward is backward
    assert not hasattr(t, "_atac_forward_check") and not hasattr(t, "_atac_ddp_trainable")


def test_each_training_step_watches_its_wrapper_before_trainers_step_runs(monkeypatch):
    # kills: watch_step_forwards not called by ATACTrainer.training_step, called with self.model (no wrapper:
    # nothing watched), or after super().training_step (the first step's backward unchecked)
    from transformers import Trainer

    from atac_hf.integrations.trainer import ATACTrainer

    def step(self, model, inputs, *args, **kwargs):  # super().compute_loss(self.model, ...), then the backward
        loss = self.model(torch.ones(2, 3)).sum()
        self.accelerator.backward(loss)
        return loss.detach()

    monkeypatch.setattr(Trainer, "training_step", step)
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    ran = []
    t = ATACTrainer.__new__(ATACTrainer)
    t.atac_config, t.atac_tp_size, t.label_smoother = SimpleNamespace(cp_size=2), 1, None
    t.model, t._atac_base, t.args = inner, inner, SimpleNamespace(world_size=2)
    t.accelerator = SimpleNamespace(backward=lambda loss, **kwargs: ran.append(loss), _models=[wrapper],
                                    sync_gradients=True)
    with pytest.raises(ValueError, match=BYPASS):
        t.training_step(wrapper, {})
    assert ran == [] and not t._atac_training_step


def test_a_second_backward_of_one_forward_through_the_wrapper_is_refused():
    # red-team 25: DDP sums the gradients once per forward through it, so a second backward of one forward stayed
    # on each rank (12-28% off); the trainer's backward refuses it as the accelerator's does, and runs nothing
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    t, calls, _ = _step_trainer(model=inner)
    watch_step_forwards(t, wrapper)
    out = wrapper(torch.ones(2, 3)).sum()
    t.accelerator.backward(out)
    with pytest.raises(ValueError, match=r"ran a forward with autograd on since the last backward.*second backward"):
        t.accelerator.backward(out)
    assert len(calls) == 1
    wrapper(torch.ones(2, 3))  # the next forward through the wrapper: its backward runs
    t.accelerator.backward(out)
    assert len(calls) == 2


def test_parameters_unfrozen_after_the_wrap_are_refused_by_name_and_count_and_a_new_wrap_takes_them():
    # kills: `trainable - first` reversed (a parameter frozen mid-run refused, one unfrozen passed), the frozen set
    # taken (`not p.requires_grad`) or only parameters holding a gradient, the first set recorded at every step or
    # for trainer.model or under another name (never refused), the refusal returned, the names cut at 2 or not
    # sorted, and the count of every trainable parameter
    layers = nn.ModuleDict({k: nn.Linear(2, 2) for k in "dcba"})
    for layer in layers.values():
        layer.weight.requires_grad_(False)
    wrapper = Wrapper(layers)
    t, _, _ = _step_trainer(model=layers)
    watch_step_forwards(t, wrapper)
    layers["a"].bias.requires_grad_(False)  # frozen mid-run: fine (its gradient is simply not computed)
    watch_step_forwards(t, wrapper)
    for layer in layers.values():
        layer.weight.requires_grad_(True)
    names = r"\['module\.a\.weight', 'module\.b\.weight', 'module\.c\.weight'\]"
    with pytest.raises(ValueError, match=rf"parameters {names} were unfrozen \(4 in all\) after DDP wrapped the model"):
        watch_step_forwards(t, wrapper)
    watch_step_forwards(t, Wrapper(layers))  # train() again: DDP's new buckets hold them
    layers["a"].bias.requires_grad_(True)
    with pytest.raises(ValueError, match=r"parameters \['module\.a\.bias'\] were unfrozen \(1 in all\)"):
        watch_step_forwards(t, t._atac_ddp_trainable[0])


# ---------------------------------------------------------------------------- PreparedForwardCheck's counts
def test_another_wrapper_of_a_watched_module_keeps_its_counts():
    # kills: the module's counts set again (to [0, 0]) whenever a new wrapper of it is watched (a bypass before a
    # second prepare passed)
    inner = nn.Linear(3, 1)
    check = PreparedForwardCheck()
    check.watch([Wrapper(inner)])
    inner(torch.ones(2, 3))
    check.watch([Wrapper(inner)])
    with pytest.raises(ValueError, match=BYPASS):
        check.before_backward()


def test_the_counts_hold_their_modules_weakly():
    # kills: `_since` a plain dict (every module a check ever watched kept alive: free_memory() freed nothing)
    check = PreparedForwardCheck()
    inner = nn.Linear(3, 1)
    check.watch([Wrapper(inner)])
    ref = weakref.ref(inner)
    del inner
    gc.collect()
    assert ref() is None and len(check._since) == 0

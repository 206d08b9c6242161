"""Red-team 25: legitimate workflows the guards refused, and two that trained silently wrong (CP 2 against one
process in fp64, ``/tmp/rt72``).

- A second backward of one forward (``backward(loss1, retain_graph=True)`` then ``backward(loss2)``, or two forwards
  then two backwards): DDP sums once per forward through it, so the second stayed on each rank (grad norms 12-28%
  off). Now refused by the forward check, in ``ATACAccelerator`` and ``ATACTrainer`` alike.
- ``model.forward(...)`` called on the prepared wrapper ran no hooks and was refused as a forward outside it (exact).
- ``trainer.train()`` a second time: Trainer runs the first DDP wrapper, which Accelerate no longer lists; refused as
  "not prepared" (exact). And a parameter unfrozen in ``on_train_begin`` (after the wrap, before the first step) was
  never refused (a mutation pass): the set DDP sums is now recorded at the wrap.
- A ``loss_function`` that reads ``shift_labels`` but is not plain cross-entropy (label smoothing, a z-loss) was
  refused as "shifts labels itself" (exact).
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _launch import torchrun_json  # noqa: E402
from test_unprepared_module import Wrapper  # noqa: E402

from atac_hf.integrations.trainer_guards import (check_step_model, loss_scale_refusal,  # noqa: E402
                                                 record_wrap_trainable, watch_step_forwards)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=32, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).double()
    with torch.no_grad():  # a head far from uniform, as in a trained model
        model.lm_head.weight.mul_(40)
    return model


def _smoothed(smoothing: float = 0.1, z_loss: float = 0.0):
    def loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kw):
        if shift_labels is None:  # only outside CP: a whole row's labels, shifted
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        lg, tg = logits.reshape(-1, vocab_size).float(), shift_labels.reshape(-1)
        total = F.cross_entropy(lg, tg, ignore_index=ignore_index, reduction="sum", label_smoothing=smoothing)
        total = total + z_loss * (torch.logsumexp(lg, -1)[tg != ignore_index] ** 2).sum()
        return total / (num_items_in_batch if num_items_in_batch is not None else (tg != ignore_index).sum())
    return loss


def _own_shift(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kw):
    tg = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1)  # shifts labels itself: wrong on a shard
    total = F.cross_entropy(logits.reshape(-1, vocab_size).float(), tg, ignore_index=ignore_index, reduction="sum")
    return total / num_items_in_batch


def _no_targets(logits, labels, vocab_size, num_items_in_batch=None, **kw):
    return torch.logsumexp(logits.float(), -1).pow(2).sum() / num_items_in_batch  # reads no targets at all


@pytest.mark.parametrize("loss", [_smoothed(0.1), _smoothed(0.0, z_loss=1e-2), _smoothed(0.2, z_loss=1e-3)])
def test_a_loss_function_that_reads_shift_labels_is_accepted_whatever_its_form(loss):
    model = _tiny_llama()
    model.loss_function = loss
    assert loss_scale_refusal(model, False, 2) is None


@pytest.mark.parametrize("loss,found", [(_own_shift, "it changes with labels"),
                                        (_no_targets, "it does not change with shift_labels")])
def test_a_loss_function_that_shifts_labels_or_reads_no_targets_is_refused_saying_which(loss, found):
    model = _tiny_llama()
    model.loss_function = loss
    why = loss_scale_refusal(model, False, 2)
    assert why.startswith("its loss does not train the targets given as shift_labels") and found in why
    assert "reads its targets from shift_labels" in why
    assert loss_scale_refusal(model, False, 1) is None  # one device: nothing to refuse
    assert model.training  # the check's eval mode is restored


def test_a_second_train_runs_the_first_trains_wrapper_and_is_not_refused():
    inner = nn.Linear(2, 2)
    trainer = SimpleNamespace(_atac_base=inner, model=inner, args=SimpleNamespace(world_size=2), atac_tp_size=1,
                              accelerator=SimpleNamespace(_models=[]))  # free_memory() emptied Accelerate's list
    check_step_model(trainer, Wrapper(inner), training=True)
    with pytest.raises(RuntimeError, match="that Accelerate did not prepare"):  # a bare module: no gradient sum
        check_step_model(trainer, inner, training=True)
    other = Wrapper(nn.Linear(2, 2))
    trainer.model = other.module  # (a wrapper of another module than trainer.model: refused as before)
    with pytest.raises(ValueError, match="was trainer.model replaced"):
        check_step_model(trainer, Wrapper(inner), training=True)


def test_the_parameters_ddp_sums_are_recorded_at_the_wrap_so_an_unfreeze_before_the_first_step_is_refused():
    layers = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    layers["a"].weight.requires_grad_(False)
    wraps = []

    def prepare_model(model, *args, **kwargs):
        wraps.append((args, kwargs))
        return model if kwargs.get("evaluation_mode") else Wrapper(model)

    t = SimpleNamespace(atac_config=SimpleNamespace(cp_size=2), args=SimpleNamespace(world_size=2), model=layers,
                        accelerator=SimpleNamespace(backward=lambda loss, **kw: None, prepare_model=prepare_model))
    record_wrap_trainable(t)
    record_wrap_trainable(t)  # installed once per trainer
    assert t.accelerator.prepare_model(layers, evaluation_mode=True) is layers  # an evaluation prepare: no record
    assert not hasattr(t, "_atac_ddp_trainable")
    wrapper = t.accelerator.prepare_model(layers, device_placement=True)
    assert wraps[-1] == ((), {"device_placement": True}) and len(wraps) == 2
    layers["a"].weight.requires_grad_(True)  # on_train_begin: after the wrap, before the first step
    with pytest.raises(ValueError, match=r"\['module\.a\.weight'\] were unfrozen \(1 in all\) after DDP wrapped"):
        watch_step_forwards(t, wrapper)


def test_labels_edited_in_a_mapping_that_is_not_a_dict_are_refused_too():
    # a mutation pass: only dict inputs were compared, so a BatchEncoding / UserDict mask of labels was ignored
    from collections import UserDict

    from atac_hf.integrations.trainer_guards import check_target_edits

    labels, shift = torch.arange(6).view(1, 6), torch.arange(1, 7).view(1, 6)
    sharded = {"labels": labels.clone(), "shift_labels": shift.clone()}
    masked = labels.clone()
    masked[0, :2] = -100
    with pytest.raises(ValueError, match=r"inputs\['labels'\] was changed before super\(\)\.compute_loss"):
        check_target_edits(sharded, UserDict({"labels": masked, "shift_labels": shift}))
    check_target_edits(sharded, UserDict({"labels": labels, "shift_labels": shift}))  # unchanged: passes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {n: torchrun_json(n, "_redteam25_worker.py", tmp_path_factory.mktemp(f"rt25_{n}")) for n in (1, 2)}


@pytest.mark.slow
def test_train_called_twice_at_cp2_equals_one_process(runs):
    one, two = runs[1]["twice"], runs[2]["twice"]
    assert one["steps"] == two["steps"] == 2  # (each train() counts its own steps; the weights go on)
    assert max(abs(a - b) for a, b in zip(one["params"], two["params"])) <= 1e-9
    assert two["rank_sums"][0] == two["rank_sums"][1]


@pytest.mark.slow
def test_a_parameter_unfrozen_in_on_train_begin_is_refused_before_the_first_step(runs):
    assert runs[1]["unfreeze"]["error"] is None  # one process: no DDP, nothing to refuse
    err = runs[2]["unfreeze"]
    assert err["step"] == 0 and "embed_tokens.weight" in err["error"] and "unfrozen (1 in all)" in err["error"]

"""Thirty-seventh mutation pass: survivors of mutants planted by hand in red-team 25's changes.

Killed here, in process (no process group; fakes for the trainer, DDP and the model): ``PreparedForwardCheck``'s
stack search for a wrapper's ``forward`` called directly (a bypass from a shallow stack, a wrapper method other than
``forward``, a watched wrapper of another module, a wrapper that runs its module through a helper's ``forward``, an
unhashable object's ``forward`` on the stack); ``check_step_model``'s second-``train()`` clause for a PEFT-style
``trainer.model``; ``record_wrap_trainable`` installed once per trainer (not per accelerator), passing
``prepare_model``'s positional arguments on, and called by ``ATACTrainer.train`` before Trainer's (only the slow
test of ``test_redteam25.py`` saw it); ``loss_shift_refusal``'s two extra comparisons (their tolerances, their
absolute floor for a loss under 1, a loss reading both labels and shift_labels). The refusal's "since the last
accelerator.shard(batch)" clause is pinned in all four states too (its mutants were killed by pass 36's test).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from test_unprepared_module import Wrapper  # noqa: E402

from atac_hf.integrations.forward_check import PreparedForwardCheck  # noqa: E402
from atac_hf.integrations.trainer_guards import (check_step_model, loss_shift_refusal,  # noqa: E402
                                                 record_wrap_trainable, watch_step_forwards)

nn = torch.nn
BYPASS = r"ran a forward with autograd on only outside the wrapper"
NONE_RAN = r"no model returned by accelerator\.prepare \(Wrapper\) ran a forward with autograd on"
SINCE = " since the last accelerator.shard(batch) and since the last backward"


def _watched(*wrappers):
    check = PreparedForwardCheck()
    check.watch(wrappers)
    return check


# ---------------------------------------------------------------------------- the stack search
def test_a_bypass_from_a_shallow_stack_is_refused():
    # kills: `return True` where the stack ends before _STACK_FRAMES frames (a script's top level, a thread: every
    # forward outside the wrapper counted as through it)
    inner = nn.Linear(3, 1)
    check = _watched(Wrapper(inner))
    thread = threading.Thread(target=lambda: inner(torch.ones(2, 3)))  # a few frames deep only
    thread.start()
    thread.join()
    assert (check.num_forwards, check.num_bypassed) == (0, 1)
    with pytest.raises(ValueError, match=BYPASS):
        check.before_backward()


class _Generating(Wrapper):
    def generate(self, x):  # not the wrapper's forward: DDP sets up no gradient sum here
        return self.module(x)


def test_a_wrapper_method_other_than_forward_running_its_module_is_a_bypass():
    # kills: any frame whose self is the wrapper counted, whatever its name
    inner = nn.Linear(3, 1)
    wrapper = _Generating(inner)
    check = _watched(wrapper)
    wrapper.generate(torch.ones(2, 3))
    with pytest.raises(ValueError, match=BYPASS):
        check.before_backward()


class _Calls(nn.Module):
    def __init__(self, other):
        super().__init__()
        self.lin, self.other = nn.Linear(3, 3), other

    def forward(self, x):
        return self.other(self.lin(x))


def test_a_direct_forward_of_one_wrapper_does_not_vouch_for_another_wrappers_module():
    # kills: `getattr(owner, "module", None) is module` dropped (b, run inside a's forward outside its own wrapper,
    # counted as a forward through wrapper_b)
    b = nn.Linear(3, 1)
    a = _Calls(b)
    wrapper_a, wrapper_b = Wrapper(a), Wrapper(b)
    check = _watched(wrapper_a, wrapper_b)
    wrapper_a.forward(torch.ones(2, 3))  # through wrapper_a (direct call), b outside wrapper_b
    assert (check.num_forwards, check.num_bypassed) == (1, 1)
    with pytest.raises(ValueError, match=r"\(Linear, in Wrapper\) ran a forward with autograd on only outside"):
        check.before_backward()


class _Runner(nn.Module):
    def __init__(self, owner):
        super().__init__()
        self._owner = [owner]  # (not a submodule)

    def forward(self, x):
        return self._owner[0].module(x)


class _ViaRunner(Wrapper):
    def __init__(self, module):
        super().__init__(module)
        self.runner = _Runner(self)

    def forward(self, x):
        return self.runner(x)


def test_a_wrappers_forward_that_runs_its_module_through_a_helpers_forward_counts_as_through_it():
    # kills: the search stopped at the first frame named forward (a helper's forward between the wrapper's and the
    # module's hook: a forward through the wrapper refused as a bypass)
    inner = nn.Linear(3, 1)
    wrapper = _ViaRunner(inner)
    check = _watched(wrapper)
    wrapper.forward(torch.ones(2, 3))
    assert (check.num_forwards, check.num_bypassed) == (1, 0)
    check.before_backward()


@dataclasses.dataclass
class _Step:  # (eq=True: unhashable)
    model: nn.Module

    def forward(self, x):
        return self.model(x)


def test_an_unhashable_object_with_a_forward_on_the_stack_is_skipped():
    # kills: `isinstance(owner, torch.nn.Module) and` dropped (the WeakSet test hashed an unhashable frame's self:
    # TypeError out of the module's hook, in the user's forward)
    inner = nn.Linear(3, 1)
    check = _watched(Wrapper(inner))
    _Step(inner).forward(torch.ones(2, 3))
    with pytest.raises(ValueError, match=BYPASS):
        check.before_backward()


# ---------------------------------------------------------------------------- the refusal's message
def _message(check):
    with pytest.raises(ValueError, match=NONE_RAN) as err:
        check.before_backward()
    return str(err.value)


def test_the_refusal_names_the_shard_only_where_shard_ran_with_no_forward_since():
    # the "since the last accelerator.shard(batch) and" clause: never sharded, sharded with no forward since, a second
    # backward of one forward, sharded after it (its condition negated or always true: also pass 36's test)
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    check = _watched(wrapper)
    assert SINCE not in _message(check)  # shard() never called
    check.on_shard()
    assert SINCE in _message(check)  # shard() called, no forward since
    wrapper(torch.ones(2, 3))
    check.before_backward()
    assert " with autograd on since the last backward" in _message(check)  # a second backward of one forward
    check.on_shard()
    assert SINCE in _message(check)


# ---------------------------------------------------------------------------- check_step_model / record_wrap
class _Peft(nn.Module):
    def __init__(self, base):
        super().__init__()
        self.base_model = base

    def get_base_model(self):
        return self.base_model


def test_a_second_train_of_a_peft_model_runs_the_first_wrapper_and_is_not_refused():
    # kills: `reused` tested against trainer._atac_base (the transformers model under PEFT) instead of trainer.model
    # (what DDP wraps)
    base = nn.Linear(2, 2)
    peft = _Peft(base)
    trainer = SimpleNamespace(_atac_base=base, model=peft, args=SimpleNamespace(world_size=2), atac_tp_size=1,
                              accelerator=SimpleNamespace(_models=[]))
    check_step_model(trainer, Wrapper(peft), training=True)


def _recording_trainer(layers, wraps):
    def prepare_model(model, *args, **kwargs):
        wraps.append((args, kwargs))
        return model if kwargs.get("evaluation_mode") else Wrapper(model)

    return SimpleNamespace(atac_config=SimpleNamespace(cp_size=2), args=SimpleNamespace(world_size=2), model=layers,
                           accelerator=SimpleNamespace(backward=lambda loss, **kw: None, prepare_model=prepare_model))


def test_the_wrap_recorder_is_installed_once_and_passes_positional_arguments_on():
    # kills: the once-per-trainer test dropped or its mark not set (a recorder layered on at every train()), and
    # prepare_model's positional arguments dropped
    layers = nn.ModuleDict({"a": nn.Linear(2, 2)})
    wraps = []
    t = _recording_trainer(layers, wraps)
    record_wrap_trainable(t)
    installed = t.accelerator.prepare_model
    record_wrap_trainable(t)
    assert t.accelerator.prepare_model is installed
    wrapper = t.accelerator.prepare_model(layers, True, evaluation_mode=False)
    assert wraps == [((True,), {"evaluation_mode": False})] and t._atac_ddp_trainable[0] is wrapper


def test_a_second_trainer_on_the_same_accelerator_records_its_own_wrap():
    # kills: the recorder installed once per accelerator (`is not None`): the second trainer's wrap recorded on the
    # first, and a parameter unfrozen before its first step missed
    layers = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    layers["a"].weight.requires_grad_(False)
    wraps = []
    first = _recording_trainer(layers, wraps)
    record_wrap_trainable(first)
    second = SimpleNamespace(**{**vars(first), "accelerator": first.accelerator})
    record_wrap_trainable(second)
    wrapper = second.accelerator.prepare_model(layers)
    assert second._atac_ddp_trainable[0] is wrapper
    layers["a"].weight.requires_grad_(True)
    with pytest.raises(ValueError, match=r"\['module\.a\.weight'\] were unfrozen \(1 in all\)"):
        watch_step_forwards(second, wrapper)


def test_train_installs_the_wrap_recorder_before_trainers_train(monkeypatch):
    # kills: record_wrap_trainable(self) not called by ATACTrainer.train (the slow test of test_redteam25.py only)
    from transformers import Trainer

    from atac_hf.integrations import trainer as trainer_module
    from atac_hf.integrations.trainer import ATACTrainer

    layers = nn.ModuleDict({"a": nn.Linear(2, 2)})
    seen = []

    def train(self, *args, **kwargs):  # Trainer's train(): Accelerate wraps the model
        seen.append(self.accelerator.prepare_model(self.model))
        return "trained"

    monkeypatch.setattr(Trainer, "train", train)
    monkeypatch.setattr(trainer_module, "drain_gloo_workers", lambda *a: None)
    t = ATACTrainer.__new__(ATACTrainer)
    t.model, t.train_dataset, t._atac_skip_flag = layers, None, None
    t.accelerator = SimpleNamespace(prepare_model=lambda model, *a, **k: Wrapper(model))
    assert t.train() == "trained"
    assert t._atac_ddp_trainable[0] is seen[0] and t._atac_ddp_trainable[1] == {"module.a.weight", "module.a.bias"}


# ---------------------------------------------------------------------------- loss_shift_refusal
V = 8


class _Model(nn.Module):
    """A 4-token causal LM stand-in: fixed logits per input id, the loss from ``loss(logits, labels, shift)``."""

    def __init__(self, loss):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.table = nn.Parameter(3 * torch.randn(5, V, generator=gen, dtype=torch.float64))
        self.loss, self.grad_modes = loss, []

    def forward(self, input_ids, labels=None, shift_labels=None, num_items_in_batch=None, use_cache=None):
        self.grad_modes.append(torch.is_grad_enabled())
        logits = self.table[input_ids]
        return SimpleNamespace(loss=self.loss(logits, labels, shift_labels), logits=logits)


def _ce(logits, targets):
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100, reduction="sum") / 2


def _own(logits, labels):
    return _ce(logits, F.pad(labels, (0, 1), value=-100)[..., 1:])


def _refusal(loss):
    model = _Model(loss)
    model.train()
    why = loss_shift_refusal(model)
    assert model.training
    return why, model.grad_modes


def test_plain_cross_entropy_runs_one_forward_and_every_check_runs_under_no_grad():
    # the extra forwards only where the first comparison fails, all three under no_grad (also pass 30's test)
    why, modes = _refusal(lambda lg, labels, shift: _ce(lg, shift))
    assert why is None and modes == [False]
    why, modes = _refusal(lambda lg, labels, shift: _ce(lg, shift) + 1.0)  # an offset: not plain cross-entropy
    assert why is None and modes == [False, False, False]


def _reads(base, on_targets, on_labels):
    """A loss of ``base``, plus ``on_targets`` where shift_labels are the check's (not the other targets), plus
    ``on_labels`` where labels are the row's ids (not flipped): its changes with each are exactly these."""
    def loss(logits, labels, shift):
        return (torch.tensor(base, dtype=torch.float64) + on_targets * (shift[0, 0] == 4).double()
                + on_labels * (labels[0, 0] == 1).double())
    return loss


def test_a_loss_that_moves_little_with_shift_labels_is_accepted():
    # kills: the shift_labels tolerance loosened (1e-6 relative -> 1e-5 or 1e-1): a loss dominated by a term
    # without targets (a large z-loss) refused
    why, _ = _refusal(_reads(100.0, 5e-4, 0.0))
    assert why is None
    why, _ = _refusal(_reads(100.0, 5e-5, 0.0))  # under 1e-6 relative: not shown to read them
    assert why is not None and "; it does not change with shift_labels)" in why


def test_a_loss_that_reads_labels_besides_shift_labels_is_refused():
    # kills: `reads_targets and not reads_labels` -> `reads_targets` (a loss reading both accepted), and the labels
    # tolerance loosened (1e-7 relative -> 1e-6 or 1e-1): a small term of labels shifted on the shard accepted
    for on_labels in (1.0, 5e-5):
        why, _ = _refusal(_reads(100.0, 1.0, on_labels))
        assert why is not None and "; it changes with labels)" in why
    why, _ = _refusal(_reads(100.0, 1.0, 5e-6))  # under 1e-7 relative: noise
    assert why is None


def test_the_tolerances_are_absolute_for_a_loss_under_one():
    # kills: `max(1.0, abs(got))` -> `abs(got)` in either tolerance (for a loss under 1, changes under 1e-6 with
    # shift_labels and under 1e-7 with labels are noise)
    why, _ = _refusal(_reads(0.01, 5e-7, 0.0))
    assert why is not None and "; it does not change with shift_labels)" in why
    why, _ = _refusal(_reads(0.001, 1e-3, 5e-8))
    assert why is None

"""Red-team 60 (F5): an ``ATACAccelerator`` loop under CP that trains the module ``prepare`` did not return.

``_, opt = accelerator.prepare(model, opt)`` followed by ``model(**accelerator.shard(batch))`` on the
original module ran no gradient all-reduce: each CP rank stepped on its own shard's gradient and the
ranks' weights drifted apart (``reduce_loss`` looked normal). ``accelerator.backward`` now refuses such a
loss (:mod:`atac_hf.integrations.forward_check`) before running the backward.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from atac_hf.integrations.forward_check import PreparedForwardCheck, is_wrapper

sys.path.insert(0, os.path.dirname(__file__))
from _launch import torchrun_json  # noqa: E402

REFUSAL = (r"a model that accelerator\.prepare wrapped \(Linear, in Wrapper\) ran a forward with autograd on only "
           r"outside the wrapper"
           r".*model, optimizer = accelerator\.prepare")  # the module prepare wrapped, called itself


class Wrapper(torch.nn.Module):
    """A stand-in for DDP: a separate module whose forward calls the wrapped one."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def _setup():
    inner = torch.nn.Linear(3, 1)
    check = PreparedForwardCheck()
    wrapper = Wrapper(inner)
    check.watch([wrapper, torch.optim.SGD(inner.parameters(), lr=0.1), inner])
    return inner, wrapper, check


def test_only_a_module_wrapping_another_is_watched():
    inner = torch.nn.Linear(3, 1)
    assert is_wrapper(Wrapper(inner)) and not is_wrapper(inner) and not is_wrapper(object())
    check = PreparedForwardCheck()
    check.watch([inner, None])
    check.on_shard()
    check.before_backward()  # nothing watched (CP 1, FSDP2, TP): never refused


def test_a_loss_from_the_wrapped_module_is_refused_and_from_the_wrapper_accepted():
    inner, wrapper, check = _setup()
    x = torch.ones(2, 3)
    check.on_shard()
    inner(x)
    with pytest.raises(ValueError, match=REFUSAL):
        check.before_backward()
    check.on_shard()
    wrapper(x)
    check.before_backward()
    with pytest.raises(ValueError, match=r"second backward of one forward"):  # DDP summed in the first only
        check.before_backward()
    with pytest.raises(ValueError, match=REFUSAL):  # the next micro-batch, unprepared again
        check.on_shard()
        inner(x)
        check.before_backward()


def test_an_evaluation_does_not_count_and_a_shard_ahead_of_the_backward_passes():
    inner, wrapper, check = _setup()
    x = torch.ones(2, 3)
    with torch.no_grad():  # an evaluation through the prepared model does not vouch for the next loss
        check.on_shard()
        wrapper(x)
    check.on_shard()
    inner(x)
    with pytest.raises(ValueError, match=REFUSAL):
        check.before_backward()
    check.on_shard()
    wrapper(x)
    check.on_shard()  # the next batch sharded (or evaluated) before this backward
    check.before_backward()


def test_a_direct_call_of_the_wrappers_forward_counts_as_a_forward_through_it():
    """Red-team 25: ``model.forward(**inputs)`` on the prepared wrapper runs no hooks, but DDP's ``forward`` sets
    up the gradient sum; it was refused as a forward outside the wrapper (exact with the check off)."""
    inner, wrapper, check = _setup()
    x = torch.ones(2, 3)
    check.on_shard()
    wrapper.forward(x)
    assert (check.num_forwards, check.num_bypassed) == (1, 0)
    check.before_backward()
    check.on_shard()
    inner.forward(x)  # the wrapped module's own forward: no hook, no count (as before)
    inner(x)  # called outside the wrapper, with the wrapper's forward nowhere on the stack
    with pytest.raises(ValueError, match=REFUSAL):
        check.before_backward()
    other = Wrapper(inner)  # a wrapper the check does not watch vouches for nothing
    check.on_shard()
    other(x)
    with pytest.raises(ValueError, match=REFUSAL):
        check.before_backward()


def test_watching_the_same_wrapper_twice_counts_each_forward_once():
    inner, wrapper, check = _setup()
    check.watch([wrapper])
    wrapper(torch.ones(1, 3))
    assert check.num_forwards == 1


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    return torchrun_json(2, "_unprepared_worker.py", tmp_path_factory.mktemp("unprepared"))


@pytest.mark.slow
def test_training_the_unprepared_module_under_cp_is_refused_on_every_rank_before_any_change(cp2):
    assert cp2["wrapper"] == "DistributedDataParallel"
    assert cp2["ranks_refused"] == 2
    assert "model, optimizer = accelerator.prepare(model, optimizer)" in cp2["refused"]
    assert cp2["grads_after_refusal"] == 0 and cp2["changed_after_refusal"] == 0.0


@pytest.mark.slow
def test_the_prepared_loop_still_trains_in_step_across_cp_ranks(cp2):
    assert cp2["before_spread"] == 0.0
    assert cp2["trained_change"] > 1e-4  # it trained (three optimizer steps at lr 0.1)
    assert cp2["trained_spread"] < 1e-6  # the CP ranks' gradients were summed: the same weights
    assert len(cp2["losses"]) == 4 and all(l > 0 for l in cp2["losses"])
    assert cp2["eval_loss"] > 0


@pytest.mark.slow
def test_a_model_whose_loss_shifts_labels_itself_is_refused_by_prepare_under_cp(cp2):
    assert cp2["self_shift"] and "SelfShiftLlama: its loss does not train the targets given as shift_labels" in \
        cp2["self_shift"]
    assert cp2["self_shift_attn"] != "atac_cp" and cp2["models_after_refusal"] == 0  # nothing changed

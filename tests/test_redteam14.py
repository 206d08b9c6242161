"""Red-team 14: an Accelerate user's own loop with ``ATACAccelerator``.

Under CP 2 (``tests/_redteam14_worker.py``): a scheduler passed to ``prepare`` stepped once per
process (twice per optimizer step at CP 2: half the run at learning rate 0 for a schedule sized in
steps); ``reduce_loss`` of an evaluation batch divided by ``gradient_accumulation_steps`` (half the
loss at GA 2); ``register_for_checkpointing(sampler)`` saved the batches drawn, including Accelerate's
look-ahead (a resume skipped packs); ``dispatch_batches`` / ``split_batches`` failed in Accelerate's
words. In one process: ``examples/accelerate_loop.py``'s gradient-accumulation loop made two
optimizer updates in an epoch's last step, or dropped its leftover packs.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _launch import run, torchrun_json  # noqa: E402


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    return torchrun_json(2, "_redteam14_worker.py", tmp_path_factory.mktemp("rt14"))


@pytest.mark.slow
def test_a_prepared_scheduler_steps_once_per_optimizer_step_under_cp(cp2):
    np.testing.assert_allclose(cp2["lrs"], [0.875, 0.75, 0.625, 0.5])  # LambdaLR 1 - s/8, as on one device


@pytest.mark.slow
def test_an_evaluation_loss_is_the_batch_loss_whatever_the_accumulation(cp2):
    assert cp2["eval_ga2"] == pytest.approx(cp2["eval_ga1"], rel=1e-6)
    assert cp2["eval_ga2_count"] == pytest.approx(cp2["eval_ga1"], rel=1e-6)
    assert cp2["eval_ga2_late"] == pytest.approx(cp2["eval_ga1"], rel=1e-6)  # shard() outside no_grad


@pytest.mark.slow
def test_registering_the_sampler_for_checkpointing_is_refused_with_the_recipe(cp2):
    assert "register_for_checkpointing(sampler)" in cp2["register"]
    assert "sampler.state_dict(position=" in cp2["register"] and "skip_first_batches" in cp2["register"]
    assert cp2["registered_objects"] == 0  # refused: nothing registered


@pytest.mark.slow
def test_dispatching_loader_options_are_refused_in_words(cp2):
    assert cp2["dispatch"].startswith("DataLoaderConfiguration(dispatch_batches=True): a packed batch is one row")


_COUNT = """
import sys, torch
sys.argv = ["accelerate_loop.py"]
sys.path.insert(0, "examples")
import accelerate_loop
steps = []
orig = torch.optim.AdamW.step
def counted(self, *a, **k):
    steps.append(1)
    return orig(self, *a, **k)
torch.optim.AdamW.step = counted
rc = accelerate_loop.main({args!r})
print("optimizer updates", len(steps))
"""


@pytest.mark.slow  # 10-20 s on 2 cores: run with -m slow (CI runs it after the default suite)
def test_the_example_loop_makes_one_update_per_step_and_trains_an_epochs_leftover_pack():
    """10 samples at 512 tokens are 3 packs an epoch: with GA 2 a step of 2 packs and one of 1 (the loop
    used to drop that one), one optimizer update a step (it used to make two in a step that ended an
    epoch: 9 updates for 6 steps at 24 samples and 1,024 tokens)."""
    for samples, tokens, packs in (("10", "512", [2, 1] * 3), ("24", "1024", [2] * 6)):
        args = ["--cp_size", "1", "--num_samples", samples, "--max_tokens", tokens, "--gradient_accumulation_steps",
                "2", "--max_steps", "6"]
        out = run([sys.executable, "-c", _COUNT.format(args=args)]).stdout
        got = [int(p) for p in re.findall(r"step +\d+ \| loss [0-9.]+ .* packs (\d+)", out)]
        assert got == packs, out[-2000:]
        assert "optimizer updates 6" in out, out[-2000:]

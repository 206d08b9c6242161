"""The model a training or evaluation step runs must be the one ``ATACTrainer`` was built with, as Accelerate
prepared it (``check_step_model``).

``trainer.model`` assigned after construction leaves Trainer in a state it does not check. A replaced model
was never switched to ``atac_cp`` nor checked. A model wrapped by ``get_peft_model`` after construction is
trained without its DDP wrapper (Trainer prepares ``trainer.model`` only while it is the module it wraps):
at CP 2 the ranks' LoRA weights drifted apart (parameter sums -2.68 and -3.07 after 2 steps, one process
-2.92), with no error. Both are refused before the first step.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _launch import torchrun_json  # noqa: E402
from test_redteam20 import _stock_model  # noqa: E402


def _trainer(base, models, world=2, tp=1):
    return SimpleNamespace(_atac_base=base, model=base, accelerator=SimpleNamespace(_models=models),
                           args=SimpleNamespace(world_size=world), atac_tp_size=tp)


def test_a_step_on_another_model_or_one_accelerate_did_not_prepare_is_refused():
    from peft import LoraConfig, get_peft_model

    from atac_hf.integrations.trainer_guards import check_step_model

    base = _stock_model()
    ddp = SimpleNamespace(module=base)  # DDP's shape: the prepared module under .module
    t = _trainer(base, [base])
    check_step_model(t, ddp, training=True)
    check_step_model(t, base, training=True)  # (a module Accelerate holds itself: FSDP2, compiled, ...)
    with pytest.raises(RuntimeError, match=r"train\(\) runs a LlamaForCausalLM that Accelerate did not prepare .*"
                                           r"2 processes.* pass the final model .* to ATACTrainer\(model=...\)"):
        check_step_model(_trainer(base, []), base, training=True)
    check_step_model(_trainer(base, []), base, training=False)  # evaluation: no gradients to sum
    check_step_model(_trainer(base, [], world=1), base, training=True)  # one process: nothing to sum
    check_step_model(_trainer(base, [], tp=2), base, training=True)  # TP: training_step averages the gradients
    other = _stock_model()
    for m, model in ((base, other), (other, base)):  # the step's model, or trainer.model, replaced
        t = _trainer(base, [base, other])
        t.model = m
        with pytest.raises(ValueError, match=r"this step runs a LlamaForCausalLM \(attn_implementation='\w+'\) that "
                                             r"is not the LlamaForCausalLM ATACTrainer was built with .*build a new "
                                             r"ATACTrainer with model="):
            check_step_model(t, model, training=False)
    t = _trainer(base, [base])
    t.model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))  # the same base under PEFT
    check_step_model(t, base, training=False)


def test_a_model_assigned_after_construction_is_refused_before_it_trains(tmp_path):
    import numpy as np
    from datasets import Dataset
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer

    rng = np.random.default_rng(0)
    ds = Dataset.from_dict({"input_ids": [rng.integers(1, 64, n).tolist() for n in (30, 50, 20, 40)]})
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True)
    built = _stock_model()
    t = ATACTrainer(model=built, args=args, train_dataset=ds, atac_config=ATACConfig(cp_size=1, max_tokens=128))
    t.model = other = _stock_model()  # Trainer would train `built` (its model_wrapped) and save `other`
    before = [p.detach().clone() for p in (*built.parameters(), *other.parameters())]
    with pytest.raises(ValueError, match="was trainer.model replaced after construction"):
        t.train()
    assert all(torch.equal(a, b) for a, b in zip(before, (*built.parameters(), *other.parameters())))


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    return torchrun_json(2, "_step_model_worker.py", tmp_path_factory.mktemp("step_model"))


@pytest.mark.slow
@pytest.mark.parametrize("case, error", [("peft_after", "RuntimeError: train() runs a LlamaForCausalLM that Accelerate "
                                                        "did not prepare"),
                                         ("replaced", "ValueError: this step runs a LlamaForCausalLM")])
def test_a_model_changed_after_construction_is_refused_on_every_rank_before_any_change(cp2, case, error):
    r = cp2[case]
    assert r["error"] is not None and r["error"].startswith(error), r["error"]
    assert r["before"] == r["after"]


@pytest.mark.slow
def test_the_peft_model_given_at_construction_trains_in_step_across_cp_ranks(cp2):
    s = cp2["peft_given"]["sums"]
    assert s[0] == s[1]

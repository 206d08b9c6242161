"""Red-teams 29 and 30 at cp_size 2 (2 gloo processes, ``tests/_redteam29_worker.py``; the in-process cases and
what the helpers found: ``tests/test_redteam29_30.py``)."""

from __future__ import annotations

import pytest

from _launch import torchrun_modes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return torchrun_modes(tmp_path_factory, "_redteam29_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["accelerate", "trainer"])
def test_prompt_tuning_is_refused_for_its_virtual_tokens_not_for_its_loss(runs, mode):
    # was: "its loss ignores num_items_in_batch" (the loss check ran before the PEFT rules)
    assert runs[mode]["prompt"].startswith("NotImplementedError: LlamaForCausalLM (model_type 'llama') is wrapped by "
                                           "a PEFT PROMPT_TUNING adapter ('default'): its virtual tokens")


@pytest.mark.slow
def test_adalora_trains_exact_through_the_accelerator_and_is_refused_by_the_trainer_naming_its_weight(runs):
    acc = runs["accelerate"]
    # every trainable parameter compared: each layer's q/v lora_A, lora_B and lora_E (and `ranknum`, which peft
    # before 0.22 left trainable: 16 then, 12 since)
    assert acc["adalora_grads"] == acc["adalora_trainable"] in (12, 16)
    assert {f"{m}.lora_{w}@{layer}" for m in ("q_proj", "v_proj") for w in "ABE" for layer in "01"} <= set(
        acc["adalora_compared"])
    assert acc["adalora_loss_err"] < 1e-6 and acc["adalora_grad_err"] < 1e-6, acc  # was: refused (a false refusal)
    why = runs["trainer"]["adalora"]
    assert why.startswith("ValueError: LlamaForCausalLM: its loss ignores num_items_in_batch")
    assert why.endswith("its PEFT adapter 'default' adds a loss term of its own (orth_reg_weight=0.5: set it to 0)")


@pytest.mark.slow
def test_a_parameter_the_loss_does_not_reach_is_refused_at_the_syncing_backward(runs):
    got = runs["accelerate"]["unused"]  # a loss on hidden_states[1]: layer 1 and the final norm unused
    assert got.startswith("ValueError: 10 trainable parameter(s) got no gradient in this backward "
                          "(layers.1.self_attn.q_proj.weight, ")  # (the AdaLoRA model ran no forward: not counted)
    assert "DistributedDataParallelKwargs(find_unused_parameters=True)" in got
    assert runs["accelerate"]["unused_in_no_sync"] is None  # a micro-step under no_sync: DDP reduces nothing there
    got = runs["trainer"]["unused"]
    assert got.startswith("ValueError: 2 trainable parameter(s) got no gradient in this backward (unused.weight, "
                          "unused.bias)") and "TrainingArguments(ddp_find_unused_parameters=True)" in got


@pytest.mark.slow
def test_a_router_loss_switched_on_per_call_is_refused_under_cp(runs):
    assert runs["accelerate"]["router_per_call"].startswith(
        "NotImplementedError: MixtralForCausalLM: adds a router load-balancing loss (output_router_logits=True "
        "passed to the forward, router_aux_loss_coef=0.5)")


@pytest.mark.slow
def test_the_documented_per_document_pooling_recipe_is_exact_under_cp(runs):
    acc = runs["accelerate"]  # docs/INTEGRATION.md's recipe against each document alone through the stock model
    assert acc["pool_loss_err"] < 1e-6 and acc["pool_grad_err"] < 1e-6, acc

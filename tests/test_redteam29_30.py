"""Red-teams 29 (PEFT methods beyond LoRA on q/v) and 30 (models and objectives other than a causal LM's
next-token loss), in one process; ``tests/test_redteam29_30_dist.py`` runs the CP 2 cases.

Found by the helpers, each against each document run alone through the stock model in fp64:

- **Task heads trained silently wrong.** ``LlamaForTokenClassification`` through ``ATACTrainer`` or
  ``ATACAccelerator``: gradients 45% off at cp_size 1 (the collator drops each document's first label, right
  for a causal LM's shift only) and 51-177% at cp_size 2. Sequence classification and question answering
  were refused, with a message about an internal shape or a config to check. Now every such head is
  refused by its class before anything runs (:func:`atac_hf.attention.kind_rules.head_refusal`).
- **PEFT adapters trained silently wrong.** aLoRA (``alora_invocation_tokens``: activated from the row's last
  invocation) and Lily (its router averages over the row's tokens): gradients 91-133% off at cp_size 1 and 2.
  PEFT types are now accepted from a list of per-token types, with aLoRA, ``layer_replication`` and a batch-mean
  VeLoRA excluded; any other type is refused by name.
- **Refused for the wrong reason / refused though exact.** Prompt tuning and P-tuning at cp_size 2 were refused
  by the loss check ("ignores num_items_in_batch"); the PEFT rules now run first. AdaLoRA's orthogonal
  regulariser (parameters only) failed the loss check, though exact in an ``ATACAccelerator`` loop; Trainer
  scales it by the number of processes, so it is refused there naming ``orth_reg_weight``.
- **Unreduced DDP buckets.** A trainable parameter the loss does not reach (a loss on an intermediate layer, a
  PEFT branch unused) left its DDP bucket unreduced at cp_size 2: 117-230% off, DDP's own error only at the
  next forward. A gradient-sync backward now refuses it (:class:`~atac_hf.integrations.forward_check.
  UnusedParameterCheck`).
- **A router loss passed per call.** ``model(**shard, output_router_logits=True)`` on Mixtral at cp_size 2
  (the config's flag off): router gradients 50% off; the runtime guard now refuses it.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import _dist
from atac_hf import check_model
from atac_hf.attention.kind_rules import PER_TOKEN_PEFT_TYPES, head_refusal, peft_refusal

peft = pytest.importorskip("peft")


def _llama_config():
    return _dist.tiny_config("llama")


def _head(cls_name: str, **over):
    import transformers

    cfg = _llama_config()
    for k, v in over.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(cfg)


# ---------------------------------------------------------------------------- task heads
@pytest.mark.parametrize("cls_name,what", [("LlamaForTokenClassification", "labels each token without a shift"),
                                           ("LlamaForSequenceClassification", "pools one output per row"),
                                           ("LlamaForQuestionAnswering", "predicts one answer span per row")])
def test_task_heads_are_refused_by_class_naming_what_breaks_and_what_trains(cls_name, what):
    model = _head(cls_name, num_labels=3)
    before = model.config._attn_implementation
    with pytest.raises(ValueError, match=rf"^{cls_name} \(model_type 'llama'\) is a \w+ head: it {what}.*"
                                         r"AutoModelForCausalLM.*base model \(AutoModel\).*ATACAccelerator loop"):
        check_model(model)
    assert model.config._attn_implementation == before
    assert not hasattr(model, "_atac_cp_guard")


def test_a_head_class_of_the_users_own_is_refused_by_the_class_it_derives_from():
    from transformers import LlamaForTokenClassification

    class NerTagger(LlamaForTokenClassification):
        pass

    assert head_refusal(NerTagger)[1].startswith(
        "is a TokenClassification head (it derives from LlamaForTokenClassification): it labels each token")


def test_causal_lms_and_base_models_pass_the_head_rule():
    from transformers import LlamaForCausalLM, LlamaModel

    class MyForCausalLM(LlamaForCausalLM):
        pass

    for cls in (LlamaForCausalLM, LlamaModel, MyForCausalLM, torch.nn.Linear):
        assert head_refusal(cls) is None


def test_the_trainer_refuses_a_token_classifier_at_cp_size_1_before_any_change(tmp_path):
    import datasets
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer

    model = _head("LlamaForTokenClassification", num_labels=3)
    ds = datasets.Dataset.from_dict({"input_ids": [[1 + i % 50] * (5 + i) for i in range(8)],
                                     "labels": [[i % 3] * (5 + i) for i in range(8)]})
    args = TrainingArguments(str(tmp_path), max_steps=1, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="LlamaForTokenClassification .* is a TokenClassification head"):
        ATACTrainer(model=model, args=args, train_dataset=ds, atac_config=ATACConfig(cp_size=1, max_tokens=64))
    assert model.config._attn_implementation != "atac_cp"


def test_the_accelerator_refuses_a_token_classifier_at_cp_size_1():
    from accelerate.state import AcceleratorState

    from atac_hf import ATACAccelerator, ATACConfig

    model = _head("LlamaForTokenClassification", num_labels=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    AcceleratorState._reset_state(True)
    try:
        acc = ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True)
        with pytest.raises(ValueError, match="is a TokenClassification head"):
            acc.prepare(model, opt)
        assert model.config._attn_implementation != "atac_cp"
        acc.end_training()
    finally:
        AcceleratorState._reset_state(True)


# ---------------------------------------------------------------------------- PEFT adapters
def _peft(cfg):
    return peft.get_peft_model(_dist.tiny_model("llama", torch.float32), cfg)


def test_alora_lily_layer_replication_and_a_batch_mean_velora_are_refused_naming_the_setting():
    lora = dict(task_type="CAUSAL_LM", r=2, target_modules=["q_proj", "v_proj"])
    cases = [
        (peft.LoraConfig(alora_invocation_tokens=[7, 8, 9], **lora), r"activated LoRA \(aLoRA\) adapter \('default', "
         r"alora_invocation_tokens=\[7, 8, 9\]\): PEFT switches it on from the last invocation"),
        (peft.LilyConfig(task_type="CAUSAL_LM", r=2, target_modules=["q_proj", "v_proj"]),
         r"PEFT LILY adapter \('default'\), which averages its router's probabilities over every token"),
        (peft.LoraConfig(layer_replication=[[0, 2], [1, 2]], **lora), r"layer_replication=\[\[0, 2\], \[1, 2\]\]"),
    ]
    for cfg, match in cases:
        model = _peft(cfg)
        with pytest.raises(NotImplementedError, match=match):
            check_model(model)
    velora = types.SimpleNamespace(peft_type="LORA", velora_config={"init_type": "batch_average"})
    assert "VeLoRA (init_type='batch_average')" in peft_refusal(_holder(velora))[1]
    assert peft_refusal(_holder(types.SimpleNamespace(peft_type="LORA", velora_config={"init_type": "random"}))) \
        is None


def _holder(cfg, name="default"):
    """A module carrying PEFT's ``peft_config`` dict (what peft_refusal reads), wrapped as DDP would wrap it."""
    inner = torch.nn.Module()
    inner.peft_config = {name: cfg}
    outer = torch.nn.Module()
    outer.module = inner
    return outer


def test_peft_types_not_known_per_token_are_refused_by_name():
    for kind, match in [("POLY", "routes every token of a row by the row's task_ids"),
                        ("XLORA", "classifier run on a first pass"),
                        ("SOMETHING_NEW", "a type atac-hf does not know to act on each token alone \\(it knows "
                                          "ADALORA")]:
        exc, why = peft_refusal(_holder(types.SimpleNamespace(peft_type=kind), name="a1"))
        assert exc is NotImplementedError and f"PEFT {kind} adapter ('a1')" in why
        assert __import__("re").search(match, why), why
    for kind in sorted(PER_TOKEN_PEFT_TYPES - {"LORA"}):
        assert peft_refusal(_holder(types.SimpleNamespace(peft_type=kind))) is None, kind
    # an enum member is read by its value, as PEFT's configs carry it
    assert peft_refusal(_holder(types.SimpleNamespace(peft_type=peft.PeftType.IA3))) is None


def test_weight_adapters_of_every_flavour_pass():
    lora = dict(task_type="CAUSAL_LM", r=2, target_modules=["q_proj", "v_proj"])
    for cfg in (peft.LoraConfig(use_dora=True, **lora), peft.LoraConfig(use_rslora=True, **lora),
                peft.LoraConfig(modules_to_save=["lm_head"], **lora),
                peft.IA3Config(task_type="CAUSAL_LM", target_modules=["k_proj", "down_proj"],
                               feedforward_modules=["down_proj"])):
        assert peft_refusal(_peft(cfg)) is None


def test_adalora_passes_the_loss_check_where_its_regulariser_is_exact_and_is_named_where_not():
    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    model = _peft(peft.AdaLoraConfig(task_type="CAUSAL_LM", r=2, target_modules=["q_proj", "v_proj"], total_step=10,
                                     init_r=2, target_r=1))
    assert model.peft_config["default"].orth_reg_weight == 0.5
    assert loss_scale_refusal(model, False, 2, parameter_terms=True) is None  # ATACAccelerator: exact
    why = loss_scale_refusal(model, False, 2)  # Trainer: multiplied by the number of processes
    assert why is not None and why.endswith("its PEFT adapter 'default' adds a loss term of its own "
                                            "(orth_reg_weight=0.5: set it to 0)")
    assert model.peft_config["default"].orth_reg_weight == 0.5  # put back after the check
    model.peft_config["default"].orth_reg_weight = 0.0
    assert loss_scale_refusal(model, False, 2) is None


def test_a_peft_auxiliary_loss_is_named_in_the_loss_refusal():
    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    model = _peft(peft.ShadowConfig(task_type="CAUSAL_LM", shadow_dropout=0.0))
    weight = model.peft_config["default"].auxiliary_loss_weight
    why = loss_scale_refusal(model, False, 2, parameter_terms=True)
    assert why is not None and why.startswith("its loss ignores num_items_in_batch")
    assert f"adds a loss term of its own (auxiliary_loss_weight={weight}: set it to 0)" in why


# ---------------------------------------------------------------------------- unreduced DDP buckets
class _AnyWrapper:
    """UnusedParameterCheck watching any wrapper (a stand-in for DDP without a process group)."""

    @staticmethod
    def make():
        from atac_hf.integrations.forward_check import UnusedParameterCheck

        class Check(UnusedParameterCheck):
            @staticmethod
            def _watched(wrapper):
                return True

        return Check()


def _wrapped():
    inner = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    outer = torch.nn.Module()
    outer.module = inner
    return outer, inner


def test_a_parameter_without_a_gradient_in_a_syncing_backward_is_refused_naming_it_and_the_fix():
    outer, inner = _wrapped()
    check = _AnyWrapper.make()
    x = torch.ones(2, 3)
    check.before([outer])
    inner[0](x).sum().backward()  # inner[1] unused
    with pytest.raises(ValueError, match=r"^2 trainable parameter\(s\) got no gradient in this backward \(1.weight, "
                                         r"1.bias\) while DDP runs with find_unused_parameters=False.*Fix: "
                                         r"ATACAccelerator\(\.\.\., kwargs_handlers=\[DistributedDataParallelKwargs\("
                                         r"find_unused_parameters=True\)\]\), or freeze"):
        check.after()
    check.after()  # told once
    # accumulated gradients that this backward did not change count as unused too (gradient accumulation)
    check.before([outer])
    inner[0](x).sum().backward()
    with pytest.raises(ValueError, match=r"2 trainable parameter\(s\) got no gradient.*\(1.weight, 1.bias\)"):
        check.after()
    check.before([outer])
    inner(x).sum().backward()
    check.after()  # every parameter reached
    inner[1].requires_grad_(False)
    check.before([outer])
    inner[0](x).sum().backward()
    check.after()  # frozen: not counted


def test_the_unused_parameter_check_skips_ignored_parameters_and_non_ddp_wrappers():
    from atac_hf.integrations.forward_check import UnusedParameterCheck

    outer, inner = _wrapped()
    outer.parameters_to_ignore = {"1.weight", "1.bias"}
    check = _AnyWrapper.make()
    check.before([outer])
    inner[0](torch.ones(1, 3)).sum().backward()
    check.after()
    plain = UnusedParameterCheck("TrainingArguments(ddp_find_unused_parameters=True)")
    assert not plain._watched(outer)  # not DDP: nothing to note
    plain.before([outer])
    assert plain._seen == []


# ---------------------------------------------------------------------------- router loss per call
def test_a_router_loss_passed_to_a_sharded_forward_is_refused_under_cp():
    from transformers import MixtralConfig, MixtralForCausalLM

    from atac_hf.attention import SHARD_KWARG
    from atac_hf.attention.shard import ShardContext
    from atac_hf.sharding import plan_shards

    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.5,
                        output_router_logits=False, max_position_embeddings=128, attention_dropout=0.0)
    model = MixtralForCausalLM(cfg)
    check_model(model)
    guard = model._atac_cp_guard
    for cp, kwargs, refused in [(2, {"output_router_logits": True}, True), (2, {}, False),
                                (2, {"output_router_logits": False}, False),
                                (1, {"output_router_logits": True}, False)]:
        plan = plan_shards(np.array([9, 7]), cp, "atp")
        ctx = ShardContext(plan=plan, rank=0, layout=plan.local_layout(0))
        call = {SHARD_KWARG: ctx, **kwargs}
        if refused:
            with pytest.raises(NotImplementedError, match=r"^MixtralForCausalLM: adds a router load-balancing loss "
                                                          r"\(output_router_logits=True passed to the forward, "
                                                          r"router_aux_loss_coef=0.5\).*do not pass"):
                guard.before(model, (), call)
        else:
            guard.before(model, (), call)
    from atac_hf.attention.model_check import router_loss_refusal

    assert router_loss_refusal(_llama_config(), per_call=True) is None  # a dense model given the flag: no router
    model.config.router_aux_loss_coef = 0.0  # weighted 0: the loss is the language model's
    plan = plan_shards(np.array([9, 7]), 2, "atp")
    guard.before(model, (), {SHARD_KWARG: ShardContext(plan=plan, rank=0, layout=plan.local_layout(0)),
                             "output_router_logits": True})

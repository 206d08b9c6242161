"""Red-team 36: a refused operation changes nothing, class-wide (``atac_hf/integrations/rollback.py``).

Found: ``ATACTrainer`` switched the model to ``atac_cp`` (with the guard's hooks), set
``args.parallelism_config`` / ``ddp_find_unused_parameters`` / ``dispatch_batches`` and Trainer set
``config.use_cache`` before refusals of Trainer's own (``tokenizer=``, ``optimizers`` with
``optimizer_cls_and_kwargs``) or atac-hf's later ones; ``prepare_model`` added the hooks before its router-loss and
soft-capping refusals; ``ATACAccelerator.prepare`` set up every model (and replaced its sharder) before Accelerate's
own argument checks and before a later model's refusal; ``ATACAccelerator(...)`` refused an attention backend after
Accelerate's shared state was set, so a corrected retry was refused ("AcceleratorState has already been
initialized"); ``load_state`` loaded the weights before refusing an unreadable ``atac_layout.json`` (pass 45's tests).
"""

from __future__ import annotations

import pytest
import torch

from atac_hf.integrations import ATACConfig


def _llama(**overrides):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=64, max_position_embeddings=256)
    cfg.update(overrides)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation="sdpa")


def _gemma2_softcap():
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, vocab_size=64, attn_logit_softcapping=50.0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def _state(model) -> tuple:
    """What a refusal must leave alone: attention, use_cache, every module's hooks, the parameters."""
    hooks = [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]
    return (model.config._attn_implementation, model.config.use_cache, hooks,
            [p.detach().clone() for p in model.parameters()])


def _same(a: tuple, b: tuple) -> bool:
    return a[:3] == b[:3] and all(torch.equal(x, y) for x, y in zip(a[3], b[3]))


def _ds():
    import datasets

    return datasets.Dataset.from_dict({"input_ids": [list(range(1, 9))] * 4})


@pytest.mark.parametrize("extra", ["tokenizer", "optimizers"])
def test_trainer_refused_by_trainer_itself_changes_neither_model_nor_args(tmp_path, extra):
    from transformers import TrainingArguments

    from atac_hf.integrations import ATACTrainer

    model = _llama()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    fields, before = dict(vars(args)), _state(model)
    kwargs = ({"tokenizer": object()} if extra == "tokenizer" else
              {"optimizers": (torch.optim.SGD(model.parameters(), lr=0.1), None),
               "optimizer_cls_and_kwargs": (torch.optim.SGD, {"lr": 0.1})})
    with pytest.raises((TypeError, RuntimeError)):
        ATACTrainer(model=model, args=args, train_dataset=_ds(), atac_config=ATACConfig(max_tokens=16), **kwargs)
    assert _same(_state(model), before) and dict(vars(args)) == fields
    assert args.parallelism_config is None and args.ddp_find_unused_parameters is None
    trainer = ATACTrainer(model=model, args=args, train_dataset=_ds(), atac_config=ATACConfig(max_tokens=16))
    assert trainer.model.config._attn_implementation == "atac_cp"  # the corrected retry goes through


def test_trainer_refusals_after_args_defaults_put_them_back(tmp_path):
    """_default_device_args / stream_dispatch ran before atac-hf's own refusals (label smoothing here)."""
    import datasets
    from transformers import TrainingArguments

    from atac_hf.integrations import ATACTrainer

    model = _llama()
    stream = datasets.Dataset.from_dict({"input_ids": [list(range(1, 9))] * 4}).to_iterable_dataset()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], label_smoothing_factor=0.1,
                             max_steps=2)
    fields, acc_fields, before = dict(vars(args)), dict(vars(args.accelerator_config)), _state(model)
    with pytest.raises(ValueError, match=r"label_smoothing_factor=0.1: .*set it to 0"):
        ATACTrainer(model=model, args=args, train_dataset=stream, atac_config=ATACConfig(max_tokens=16))
    assert dict(vars(args)) == fields and dict(vars(args.accelerator_config)) == acc_fields
    assert args.accelerator_config.dispatch_batches is None and _same(_state(model), before)


def test_trainer_cp_mismatch_names_the_fix(tmp_path):
    from accelerate.parallelism_config import ParallelismConfig
    from transformers import TrainingArguments

    from atac_hf.integrations import ATACTrainer

    model = _llama()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                             parallelism_config=ParallelismConfig(cp_size=1))
    with pytest.raises(ValueError, match=r"^args.parallelism_config.cp_size=1 disagrees with atac_config.cp_size=2: "
                                         r"set both to the CP size you want$"):
        ATACTrainer(model=model, args=args, train_dataset=_ds(), atac_config=ATACConfig(cp_size=2, max_tokens=16))
    assert model.config._attn_implementation == "sdpa"


def test_prepare_model_refuses_soft_capping_before_adding_hooks():
    from atac_hf.integrations.sharder import prepare_model

    model = _gemma2_softcap()
    before = _state(model)
    with pytest.raises(NotImplementedError, match=r"logit soft-capping .*attention_backend='varlen_reference' does "
                                                  r"not apply"):
        prepare_model(model, ATACConfig(attention_backend="varlen_reference"))
    assert _same(_state(model), before)


@pytest.fixture
def accelerator():
    from accelerate.state import AcceleratorState

    from atac_hf.integrations.accelerate import ATACAccelerator

    AcceleratorState._reset_state(True)
    try:
        yield lambda config=None, **kw: ATACAccelerator(config or ATACConfig(max_tokens=64), cpu=True, **kw)
    finally:
        AcceleratorState._reset_state(True)


def test_accelerator_prepare_refused_by_accelerate_or_a_later_model_changes_nothing(accelerator):
    acc = accelerator()
    model = _llama()
    before, sharder = _state(model), acc.sharder
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="device_placement"):
        acc.prepare(model, opt, device_placement=[True])
    assert _same(_state(model), before) and acc.sharder is sharder
    acc = accelerator(ATACConfig(max_tokens=64, attention_backend="varlen_reference"))
    good, bad = _llama(), _gemma2_softcap()
    good_before, bad_before = _state(good), _state(bad)
    with pytest.raises(NotImplementedError, match="logit soft-capping"):
        acc.prepare(good, bad)
    assert _same(_state(good), good_before) and _same(_state(bad), bad_before) and acc.sharder is None
    prepared = acc.prepare(good)  # the corrected call goes through
    assert prepared.config._attn_implementation == "atac_cp" and acc.sharder is not None


def test_accelerator_refused_backend_leaves_no_accelerator_state_behind(accelerator):
    from accelerate.state import AcceleratorState

    from atac_hf.attention.varlen import flash_attn_installed

    if flash_attn_installed() and torch.cuda.is_available():
        pytest.skip("flash runs here")
    with pytest.raises(ValueError, match=r"attention_backend='flash' .*set attention_backend='sdpa'"):
        accelerator(ATACConfig(max_tokens=64, attention_backend="flash"))
    assert not AcceleratorState._shared_state
    acc = accelerator(mixed_precision="bf16")  # the corrected retry, with another setting Accelerate keeps
    assert acc.mixed_precision == "bf16"


def test_accelerator_cp_mismatch_names_the_fix(accelerator):
    from accelerate.parallelism_config import ParallelismConfig

    with pytest.raises(ValueError, match=r"^parallelism_config.cp_size=1 disagrees with atac_config.cp_size=2: set "
                                         r"both to the CP size you want$"):
        accelerator(ATACConfig(cp_size=2, max_tokens=64), parallelism_config=ParallelismConfig(cp_size=1))


def test_a_failing_put_back_leaves_the_others_and_the_refusal_raised(monkeypatch):
    """Review: a restore step that raised (e.g. set_attn_implementation of the original) skipped the others and
    replaced the refusal with its own error."""
    from types import SimpleNamespace

    from atac_hf.integrations.rollback import refused_changes_nothing

    model = _llama()
    args = SimpleNamespace(accelerator_config=SimpleNamespace(dispatch_batches=None), parallelism_config=None)
    owner = SimpleNamespace(sharder="old")

    def broken(*a, **k):
        raise RuntimeError("cannot switch back")

    with pytest.raises(ValueError, match="the refusal") as got:
        with refused_changes_nothing((model,), args, owner, ("sharder",)):
            model.config._attn_implementation = "eager"  # what the call changed
            monkeypatch.setattr(type(model), "set_attn_implementation", broken)
            args.parallelism_config, args.accelerator_config.dispatch_batches, owner.sharder = "pc", False, "new"
            raise ValueError("the refusal")
    assert args.parallelism_config is None and args.accelerator_config.dispatch_batches is None
    assert owner.sharder == "old"
    if hasattr(got.value, "add_note"):
        assert any("cannot switch back" in n for n in got.value.__notes__)

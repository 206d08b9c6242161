"""Red-team 52: the ``ATACAccelerator`` loop and FSDP2 with red-team 49's families, ``ATACTrainer`` at DP 2 x CP 3
on Qwen2 (sliding window), and resume with AdamW (docs/RELIABILITY.md, "Red-team 52").

Red-team 44's harnesses (``tests/_redteam44_fsdp.py``: the README's Accelerate loop at GA 2 with ``accumulate`` or
the step's target count; ``fully_shard`` per decoder block and the root over ``dp_shard_cp``) run red-team 49's tiny
fp64 families (``tests/_redteam49_worker.py``, transformers' fp32 steps kept in fp64 on both sides) through
``tests/_redteam52_worker.py`` and are replayed on one device, each document alone.

Found: Trainer's resume and ``load_best_model_at_end`` loaded an MoE checkpoint (Mixtral, Qwen2-MoE) without
transformers' weight conversion: ``save_pretrained`` writes per-expert tensors, ``load_state_dict(strict=False)``
skipped them, and the fused experts (and Mixtral's router) kept their pre-load weights with a warning only: the
resumed AdamW run ended 34% off the uninterrupted one (stock Trainer too; transformers #48805).
``ATACTrainer`` now loads them through ``from_pretrained`` (``_hf_compat.ConvertedCheckpointMixin``).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _launch import ROOT, torchrun  # noqa: E402

TOL = 1e-12
WORKER49 = ROOT / "tests" / "_redteam49_worker.py"


def _fresh(path):
    """``path`` created (a run's own output folder under pytest's tmp_path), as a str."""
    path.mkdir(parents=True)
    return str(path)


@pytest.mark.slow  # ~35 s on the shared 2-core machine
def test_atac_accelerator_loop_equals_one_device_per_family(tmp_path):
    """One epoch of ``packed_dataloader`` at GA 2: Qwen2 (sliding window) at CP 3 inside ``accumulate(model)``,
    Mixtral at CP 2 with the step's count; parameters and every ``reduce_loss`` against the replay."""
    import _redteam52_worker as r52

    for family, cp, counted in (("qwen2_sw", 3, False), ("mixtral", 2, True)):
        e = r52.run_accel(family, cp, cp, 2, counted, _fresh(tmp_path / f"acc_{family}"))
        print(f"\nATACAccelerator {family} CP {cp} GA 2 counted={counted}: {e}")
        assert e["steps"] >= 3 and e["moved"] > 1e-2, e
        assert e["params"] <= TOL and e["loss"] <= TOL and e["rank_spread"] == 0.0, e


@pytest.mark.slow  # ~45 s
def test_fsdp2_dp2_x_cp2_equals_one_device_per_family(tmp_path):
    """``fully_shard`` over ``dp_shard_cp`` (4 ranks, DP 2 x CP 2), Gemma2 (soft-capping, sliding layers, tied
    embeddings) and Mixtral: every step's loss, full gradients and parameters against one device."""
    import _redteam52_worker as r52

    for family in ("gemma2", "mixtral"):
        res, e = r52.run_fsdp(family, 4, 2, _fresh(tmp_path / f"fsdp_{family}"))
        print(f"\nFSDP2 {family} DP 2 x CP 2: {e}")
        assert e["sharded"] and e["mesh"] == 4 and all(n > 0 for n in e["split"]), e
        assert [r["cp_rank"] for r in res] == [0, 1, 0, 1]
        # Gemma2's replay amplifies round-off: 1e-15 at step 1, 3e-14 at step 4 (a 1e-15 change of its initial
        # weights moves its step-4 gradients by 1.7e-13)
        assert e["loss"] <= TOL and e["grads"] <= TOL and e["params"] <= TOL, e


@pytest.mark.slow  # ~60 s: 6 ranks
def test_atac_trainer_dp2_x_cp3_qwen2_sliding_window(tmp_path):
    """``ATACTrainer`` at DP 2 x CP 3 with Qwen2 (one sliding layer): replayed; and an AdamW run (linear
    schedule, GA 2) resumed from step 3 against the uninterrupted one."""
    import test_redteam44_trainer_exactness as t44
    import _redteam49_worker as w49

    torchrun(6, WORKER49, tmp_path, 3, "qwen2_sw", "full", "adam_full", "adam_from", timeout=900)
    e = w49.compare(str(tmp_path), "qwen2_sw", "full", 6)
    print(f"\nqwen2_sw DP 2 x CP 3: {e}")
    assert e["steps"] >= 3 and e["moved"] > 1e-2 and e["loss"] <= 1e-6, e  # (Trainer logs through fp32)
    assert e["params"] <= TOL and e["rank_spread"] == 0.0 and e["grad_norm"] <= TOL, e
    # under DP the eval loss is Trainer's figure (red-team 44), not the packs' mean
    assert e["eval_steps"][0] == e["eval_steps"][1] and e["eval_steps"][0] and e["eval_dp"] <= TOL, e
    _link(tmp_path, "qwen2_sw", ("adam_full", "adam_from"), 6)
    # (the resumed AdamW run: 2.6e-14, red-team 44's DDP bucket order)
    t44._check_resumed(str(tmp_path / "qwen2_sw"), "adam_full", "adam_from", 6)


@pytest.mark.slow  # ~40 s
def test_mixtral_resume_and_best_model_load_its_experts(tmp_path):
    """Mixtral at CP 2: the AdamW run resumed from step 3 equals the uninterrupted one (was 34% off: the experts and
    router were not loaded), and ``load_best_model_at_end`` gives the best step's parameters."""
    import test_redteam44_trainer_exactness as t44
    import _redteam49_worker as w49

    torchrun(2, WORKER49, tmp_path, 2, "mixtral", "adam_full", "adam_from", "best", timeout=900)
    _link(tmp_path, "mixtral", ("adam_full", "adam_from"), 2)
    t44._check_resumed(str(tmp_path / "mixtral"), "adam_full", "adam_from", 2)
    e = w49.compare(str(tmp_path), "mixtral", "best", 2)
    assert e["best_params"] <= TOL and e["last_params"] > 1e-3 and e["rank_spread"] == 0.0, e


def _link(out, family: str, names, world: int) -> None:
    """``<family>-<name>.<rank>.pt`` as ``<family>/<name>.<rank>.pt`` (red-team 44's checks read those)."""
    os.makedirs(out / family, exist_ok=True)
    for name in names:
        for r in range(world):
            os.symlink(out / f"{family}-{name}.{r}.pt", out / family / f"{name}.{r}.pt")


# ---------------------------------------------------------------------------- fast: one process
def _moe(seed: int):
    from transformers import AutoModelForCausalLM, MixtralConfig

    cfg = MixtralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=64, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


@pytest.mark.parametrize("load", ["resume", "best"])
def test_moe_checkpoint_is_loaded_through_its_weight_conversion(load, tmp_path):
    """A Mixtral checkpoint (per-expert tensors on disk, fused in the model) loaded by ``ATACTrainer``'s resume and
    best-model paths: every tensor equals the saved model's (Trainer's own load left the experts and the router at
    the model's weights)."""
    from transformers import TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    saved = _moe(1)
    ckpt = tmp_path / "checkpoint-3"
    saved.save_pretrained(ckpt)
    trainer = ATACTrainer(model=_moe(0), args=TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True,
                                                               report_to=[], max_steps=1),
                          train_dataset=[{"input_ids": [1, 2, 3, 4]}] * 4, atac_config=ATACConfig(max_tokens=8))
    if load == "resume":
        trainer._load_from_checkpoint(str(ckpt))
    else:
        trainer.state.best_model_checkpoint = str(ckpt)
        trainer._load_best_model()
    want, got = saved.state_dict(), trainer.model.state_dict()
    assert any(".experts." in k for k in want)
    assert {k: bool(torch.equal(got[k], v)) for k, v in want.items()} == {k: True for k in want}


def test_checkpoint_without_conversion_keeps_trainers_load(tmp_path):
    """A tied, non-MoE model's checkpoint (``lm_head.weight`` not saved) is Trainer's own load, not a reload."""
    from transformers import AutoModelForCausalLM, GPT2Config

    from atac_hf.integrations._hf_compat import load_converted_checkpoint

    model = AutoModelForCausalLM.from_config(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64))
    model.save_pretrained(tmp_path)
    trainer = type("T", (), {"is_fsdp_enabled": False, "is_deepspeed_enabled": False})()
    assert load_converted_checkpoint(trainer, model, str(tmp_path)) is False
    assert load_converted_checkpoint(trainer, _moe(0), str(tmp_path)) is False  # names not a conversion: Trainer's


def test_checkpoint_from_pretrained_cannot_read_falls_back_to_trainers_load(tmp_path, monkeypatch):
    """A model class whose ``from_pretrained`` fails on the checkpoint: a warning naming the class and the reason,
    and Trainer's own load follows (False), as without atac-hf; the model is left as it was."""
    from atac_hf.integrations._hf_compat import load_converted_checkpoint

    _moe(1).save_pretrained(tmp_path)
    model = _moe(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def broken(*_a, **_k):
        raise OSError("no such file")

    monkeypatch.setattr(type(model), "from_pretrained", broken)
    trainer = type("T", (), {"is_fsdp_enabled": False, "is_deepspeed_enabled": False})()
    with pytest.warns(UserWarning, match=r"MixtralForCausalLM\.from_pretrained \(OSError: no such file\)"):
        assert load_converted_checkpoint(trainer, model, str(tmp_path)) is False
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_mixed_dtype_moe_checkpoint_restores_every_weight_exactly(tmp_path):
    """A bf16 Mixtral whose routers are kept in fp32: read through ``from_pretrained`` in the widest dtype, every
    weight (the fp32 routers included) comes back bitwise, each in its own dtype (read in the first parameter's
    dtype, the routers were rounded to bf16); a compiled model's wrapper is looked through."""
    from atac_hf.integrations._hf_compat import load_converted_checkpoint

    saved = _moe(1).to(torch.bfloat16)
    torch.manual_seed(2)
    for name, module in saved.named_modules():
        if name.endswith(".gate"):  # fp32 router weights no bf16 holds
            module.float()
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape))
    saved.save_pretrained(tmp_path)
    model = _moe(0).to(torch.bfloat16)
    for name, module in model.named_modules():
        if name.endswith(".gate"):
            module.float()
    trainer = type("T", (), {"is_fsdp_enabled": False, "is_deepspeed_enabled": False})()
    assert load_converted_checkpoint(trainer, torch.compile(model), str(tmp_path)) is True
    want, got = saved.state_dict(), model.state_dict()
    assert {v.dtype for v in got.values()} == {torch.bfloat16, torch.float32}
    assert {k: (got[k].dtype, bool(torch.equal(got[k], v))) for k, v in want.items()} == \
        {k: (v.dtype, True) for k, v in want.items()}


def test_tensor_parallel_trainer_keeps_trainers_load(tmp_path):
    """Under TP (DTensor parameters) the checkpoint is Trainer's own load and refusals, not a full reload."""
    from atac_hf.integrations._hf_compat import load_converted_checkpoint

    _moe(1).save_pretrained(tmp_path)
    model = _moe(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = type("T", (), {"is_fsdp_enabled": False, "is_deepspeed_enabled": False, "atac_tp_size": 2})()
    assert load_converted_checkpoint(trainer, model, str(tmp_path)) is False
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())

"""Worker of tests/test_redteam49_families.py: red-team 44's recorded ``ATACTrainer`` runs and single-device
replay (``tests/_redteam44_worker.py``) with model families other than GPT-2, and bf16.

Run as ``torchrun --nproc_per_node W tests/_redteam49_worker.py OUT_DIR CP FAMILY SCENARIO...``: every rank writes
``OUT_DIR/<family>-<scenario>.<rank>.pt`` (red-team 44's record). :func:`compare` replays a run on one device
(each document alone, fp64, the family's stock attention) with red-team 44's ``compare``. fp64 runs keep
transformers' fp32 steps in fp64 on both sides (:class:`Fp64Steps`; ``RT49_FP32_STEPS=1`` leaves them in fp32: the
mode does not reach activation checkpointing's recompute, which runs in backward). Scenarios ``bf16`` (autocast),
``fp32`` and ``bf16w`` (bf16 weights) build fp32/bf16 models with Transformers' own loss; LoRA scenarios wrap the
Llama-like families. ``python _redteam49_worker.py OUT CP sft``: :func:`sft_eval`.
"""

from __future__ import annotations

import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))
import _redteam44_worker as w  # noqa: E402
from _redteam41_worker import _fp64_loss  # noqa: E402

# extra scenarios (red-team 44's settings plus TrainingArguments)
w.SCENARIOS.update({
    "bf16": dict(steps=3, ga=2, eval_steps=3, args=dict(bf16=True), lr=0.05),
    "fp32": dict(steps=3, ga=2, eval_steps=3, lr=0.05),
    "bf16w": dict(steps=3, ga=2, eval_steps=3, lr=0.05),  # bf16 weights, no autocast
})
_COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=w.VOCAB, max_position_embeddings=512, attention_dropout=0.0, bos_token_id=None,
               eos_token_id=None, pad_token_id=None)
#: families whose reference runs through eager attention (sdpa drops the attention logits' soft-capping)
EAGER = ("gemma2",)


def _config(family: str):
    import transformers as t

    c = dict(_COMMON)
    if family == "llama":  # GQA, rope
        return t.LlamaConfig(**c)
    if family == "llama3_rope":  # llama3 rope scaling (position-dependent frequencies)
        return t.LlamaConfig(**c, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16})
    if family == "qwen2_sw":  # layer 0 full, layer 1 window 8
        return t.Qwen2Config(**c, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    if family == "qwen3":  # qk-norm
        return t.Qwen3Config(**c, head_dim=8)
    if family == "mistral_sw":
        return t.MistralConfig(**c, sliding_window=6)
    if family == "gemma2":  # logit soft-capping, alternating sliding layers, tied embeddings scaled
        return t.Gemma2Config(**c, head_dim=8, sliding_window=6, attn_logit_softcapping=5.0,
                              final_logit_softcapping=3.0, query_pre_attn_scalar=8)
    if family == "gemma3":
        return t.Gemma3TextConfig(**c, head_dim=8, sliding_window=6,
                                  layer_types=["sliding_attention", "full_attention"])
    if family == "phi3":
        return t.Phi3Config(**c)
    if family == "olmo2":
        return t.Olmo2Config(**c)
    if family == "gpt_neox":  # partial rotary, parallel residual
        return t.GPTNeoXConfig(**{k: v for k, v in c.items() if k != "num_key_value_heads"}, rotary_pct=0.5,
                               hidden_dropout=0.0)
    if family == "qwen2_moe":  # router loss off (refused under CP)
        return t.Qwen2MoeConfig(**c, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                shared_expert_intermediate_size=32, decoder_sparse_step=1)
    if family == "qwen2_moe_aux":  # router load-balancing loss on: refused under CP
        return t.Qwen2MoeConfig(**c, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                shared_expert_intermediate_size=32, decoder_sparse_step=1, output_router_logits=True)
    if family == "mixtral":
        return t.MixtralConfig(**c, num_local_experts=4, num_experts_per_tok=2)
    raise ValueError(family)


FAMILY = os.environ.get("RT49_FAMILY", "llama")
FP64_STEPS = os.environ.get("RT49_FP32_STEPS") != "1"  # keep transformers' fp32 steps in fp64 (fp64 runs)
DTYPE = torch.float64


def build_model(lora: bool = False, layers: int = 2):
    from transformers import AutoModelForCausalLM

    import atac_hf.attention  # noqa: F401  (registers atac_cp)

    cfg = _config(FAMILY)
    torch.manual_seed(0)
    kw = {"experts_implementation": "eager"} if "moe" in FAMILY or FAMILY == "mixtral" else {}
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager" if FAMILY in EAGER else "sdpa",
                                         dtype=DTYPE, **kw)
    if DTYPE == torch.float64:
        m.loss_function = _fp64_loss
    if lora:  # attention and MLP projections of the Llama-like families
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"],
                                         lora_dropout=0.0, task_type="CAUSAL_LM"))
        if DTYPE == torch.float64:
            m.get_base_model().loss_function = _fp64_loss
    return m


def _set_reference_attention(model) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation("eager" if FAMILY in EAGER else "sdpa")
    model.train()


def _from_transformers() -> bool:
    """Whether the first caller outside torch's own files (F.softmax -> handle_torch_function) is transformers."""
    f = sys._getframe(2)
    while f is not None and os.sep + "torch" + os.sep in f.f_code.co_filename:
        f = f.f_back
    return f is not None and os.sep + "transformers" + os.sep in f.f_code.co_filename


class Fp64Steps(torch.overrides.TorchFunctionMode):
    """Transformers' fp32 steps (RMSNorm, rotary, routers, eager softmax, soft-capping: ``.float()``,
    ``.to(torch.float32)``, ``softmax(dtype=torch.float32)``) kept in fp64 on fp64 tensors, for calls made from
    transformers' own code only (atac-hf's casts are left alone): the CP run and the replay then agree to fp64
    round-off instead of ~1e-7."""

    _CASTS = {torch.Tensor.float, torch.Tensor.to, torch.Tensor.type}
    _SOFTMAX = {torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax, torch.nn.functional.log_softmax}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if (func in self._CASTS or func in self._SOFTMAX) and args and isinstance(args[0], torch.Tensor) \
                and args[0].dtype == torch.float64 and _from_transformers():
            if func is torch.Tensor.float or (func in self._CASTS and (
                    torch.float32 in args[1:] or kwargs.get("dtype") == torch.float32)):
                if func is torch.Tensor.float or (len(args) == 2 and not kwargs):
                    return args[0]
            if func in self._SOFTMAX and kwargs.get("dtype") == torch.float32:
                kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


w.build_model = build_model
w._dist_set_sdpa = _set_reference_attention


def compare(out_dir: str, family: str, name: str, world: int, dtype=torch.float64) -> dict:
    """Red-team 44's errors of the run ``family-name`` against its one-device replay (in ``dtype``)."""
    global FAMILY, DTYPE
    FAMILY, DTYPE = family, dtype
    tag = f"{family}-{name}"
    for r in range(world):  # red-team 44's compare reads <name>.<rank>.pt
        src = os.path.join(out_dir, f"{tag}.{r}.pt")
        os.makedirs(os.path.join(out_dir, family), exist_ok=True)
        dst = os.path.join(out_dir, family, f"{name}.{r}.pt")
        if not os.path.exists(dst):
            os.symlink(src, dst)
    with Fp64Steps() if dtype == torch.float64 and FP64_STEPS else _nothing():
        return w.compare(os.path.join(out_dir, family), name, world)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def sft_eval(out: str, cp: int) -> None:
    """red-team 45's ``ATACSFTTrainer`` (docs/INTEGRATION.md, "TRL's SFTTrainer"): evaluated before and after its
    3 training steps on 10 held-out chats; rank 0 writes the eval metrics (loss and TRL's) to ``out``."""
    import json

    import datasets
    from _newcomer45_sft_worker import build, chat_rows

    trainer = build(os.path.dirname(out), cp)
    evals = datasets.Dataset.from_dict(chat_rows(10, seed=1))
    res = [trainer.evaluate(evals)]
    trainer.train()
    res.append(trainer.evaluate(evals))
    if trainer.accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump(res, f)
    trainer.accelerator.end_training()


if __name__ == "__main__":
    if sys.argv[3] == "sft":
        sft_eval(sys.argv[1], int(sys.argv[2]))
        sys.exit(0)
    out, cp, FAMILY, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    rank = int(os.environ.get("RANK", "0"))
    for nm in names:
        DTYPE = {"bf16": torch.float32, "fp32": torch.float32, "bf16w": torch.bfloat16}.get(nm, torch.float64)
        with Fp64Steps() if DTYPE == torch.float64 and FP64_STEPS else _nothing():
            w.run(out, cp, nm)
        os.replace(os.path.join(out, f"{nm}.{rank}.pt"), os.path.join(out, f"{FAMILY}-{nm}.{rank}.pt"))
    from _integration_worker import end_processes

    end_processes()

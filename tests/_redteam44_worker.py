"""Worker of tests/test_redteam44_trainer_exactness.py: ``ATACTrainer`` runs at CP 3 (x DP) recorded for an
exact single-device replay.

Run as ``torchrun --nproc_per_node W tests/_redteam44_worker.py OUT_DIR CP SCENARIO...``. Every rank writes
``OUT_DIR/<scenario>.<rank>.pt``: the packs it was handed (the full rows, before sharding; training micro-batches
with their optimizer step, evaluation packs with the step they were evaluated at), the trainable parameters
before training and after, the logged losses, grad norms and eval losses. :func:`replay` then trains the same
model on one device, each document on its own (document masking by construction), plain SGD with Trainer's
per-step normalisation (the step's targets over every DP replica and micro-batch), and evaluates the same packs.

Model: GPT-2 in fp64 (its LayerNorm keeps fp64; Llama's RMSNorm computes in fp32) with Transformers' causal-LM
loss patched to fp64 (it casts logits to fp32): CP and one device then agree to round-off.
"""

from __future__ import annotations

import copy
import inspect
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))
from _redteam41_worker import _fp64_loss  # noqa: E402  (Transformers' causal-LM loss in fp64)

VOCAB = 64
LR = 0.2
MAX_TOKENS = 96


def build_model(lora: bool = False, layers: int = 2):
    from transformers import AutoModelForCausalLM, GPT2Config

    import atac_hf.attention  # noqa: F401  (registers atac_cp)

    cfg = GPT2Config(vocab_size=VOCAB, n_embd=24, n_layer=layers, n_head=2, n_positions=256, attn_pdrop=0.0,
                     resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float64)
    m.loss_function = _fp64_loss
    if lora:
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn", "c_fc"], lora_dropout=0.0,
                                         fan_in_fan_out=True, task_type="CAUSAL_LM"))
        m.get_base_model().loss_function = _fp64_loss
    return m


def dataset(num: int, seed: int, ignore_prompt: bool = False, tiny: bool = False) -> list[dict]:
    """Samples of 1-70 tokens (1-token ones too; ``tiny``: 1-3 tokens); with ``ignore_prompt`` the first half of
    each is -100."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num):
        n = int(rng.choice([1, 2, 3])) if i % 7 == 0 or tiny else int(rng.integers(4, 70))
        ids = rng.integers(0, VOCAB, n).tolist()
        row = {"input_ids": ids}
        if ignore_prompt:
            row["labels"] = [-100] * (n // 2) + ids[n // 2:]
        out.append(row)
    return out


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


SCENARIOS = {
    # name: (trainer settings, train settings)
    "full": dict(steps=4, ga=1, eval_steps=2),
    "ga3": dict(steps=2, ga=3),
    "lora_ckpt": dict(steps=3, ga=2, lora=True, ckpt=True, eval_steps=3),
    "ckpt_reentrant": dict(steps=2, ga=1, ckpt=True, reentrant=True),
    "prompt_masked": dict(steps=3, ga=1, ignore_prompt=True, eval_steps=3),
    "resume_full": dict(steps=4, ga=1, save_steps=2),
    "resume_from": dict(steps=4, ga=1, save_steps=2, resume="resume_full"),
    "zigzag_a2a": dict(steps=2, ga=2, strategy="zigzag", exchange="all_to_all"),
    # gradient clipping active (norms 0.6-1.3), a pack of every replica's window per micro-batch
    "clip": dict(steps=3, ga=2, clip=0.3),
    # two epochs of a small dataset with GA 3: the epoch's last step may be short; set_epoch reshuffles
    "epochs_ga3": dict(steps=-1, epochs=2, ga=3, train_docs=25),
    # packs of at most 4 tokens from 1-3-token samples: packs shorter than the CP group (padded by the sharder),
    # ranks without a target
    "tiny": dict(steps=4, ga=2, max_tokens=4, tiny=True, eval_steps=4),
    # evaluation before the first step too, every step saved, the best (lowest eval loss) loaded at the end; a large
    # learning rate so that the eval loss does not just fall
    "best": dict(steps=4, ga=1, eval_steps=1, save_steps=1, eval_on_start=True, best=True, lr=2.0),
    # LoRA checkpoints (the adapter only) resumed
    "lora_resume_full": dict(steps=4, ga=1, save_steps=2, lora=True),
    "lora_resume_from": dict(steps=4, ga=1, save_steps=2, lora=True, resume="lora_resume_full"),
    # a streaming dataset (torch IterableDataset): packed window by window, rows dealt round-robin
    "stream": dict(steps=3, ga=2, stream=True, eval_steps=3),
    # a streaming run's checkpoint (atac_stream.json) resumed, GA 2
    "stream_full": dict(steps=4, ga=2, stream=True, save_steps=2),
    "stream_from": dict(steps=4, ga=2, stream=True, save_steps=2, resume="stream_full"),
    # an eval set of 3 samples of 1-2 tokens at DP 2: fewer tokens than replicas x CP ranks (probe)
    "eval_few": dict(steps=1, ga=1, eval_steps=1, eval_rows=[[3], [4, 5], [6]]),
    # torch_compile=True (probe only: slow on CPU)
    "compile": dict(steps=2, ga=1, compile=True),
    # AdamW (state in the checkpoint), linear warm-up and decay, GA 2: the resumed run against the uninterrupted
    "adam_full": dict(steps=5, ga=2, save_steps=3, optim="adamw_torch"),
    "adam_from": dict(steps=5, ga=2, save_steps=3, optim="adamw_torch", resume="adam_full"),
}


def make_trainer(cp: int, out_dir: str, name: str):
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    s = SCENARIOS[name]

    class Recording(ATACTrainer):
        def _prepare_context_parallel_inputs(self, model, inputs):
            rec = {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in inputs.items()
                   if k in ("input_ids", "position_ids", "labels", "seq_lengths")}
            rec["training"] = bool(getattr(self, "_atac_training_step", False))
            rec["step"] = int(self.state.global_step)
            self.recorded.append(rec)
            return super()._prepare_context_parallel_inputs(model, inputs)

    ckpt_name = "activation_checkpointing" if "activation_checkpointing" in inspect.signature(
        TrainingArguments).parameters else "gradient_checkpointing"
    extra = {ckpt_name: bool(s.get("ckpt"))}
    if s.get("ckpt"):
        extra["gradient_checkpointing_kwargs"] = {"use_reentrant": bool(s.get("reentrant"))}
    if s.get("eval_steps"):
        extra.update(eval_strategy="steps", eval_steps=s["eval_steps"], eval_on_start=bool(s.get("eval_on_start")))
    if s.get("compile"):
        extra.update(torch_compile=True)
    if s.get("best"):
        extra.update(load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False,
                     save_total_limit=None)
    extra.update(s.get("args", {}))  # more TrainingArguments (red-team 49: bf16)
    if "optim" in s:  # AdamW, warm-up and linear decay (compared with the uninterrupted run only)
        extra.update(optim=s["optim"], learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=2)
    else:  # plain SGD at a constant rate (replayed on one device)
        extra.update(optim="sgd", learning_rate=s.get("lr", LR), lr_scheduler_type="constant")
    args = TrainingArguments(
        output_dir=out_dir, max_steps=s["steps"], num_train_epochs=s.get("epochs", 1), weight_decay=0.0,
        max_grad_norm=s.get("clip", 1e9), gradient_accumulation_steps=s["ga"], logging_steps=1,
        per_device_train_batch_size=1, per_device_eval_batch_size=1, use_cpu=True, report_to=[], seed=0,
        save_strategy="steps" if s.get("save_steps") else "no", save_steps=s.get("save_steps") or 500,
        disable_tqdm=True, log_level="error", ddp_find_unused_parameters=False, **extra)
    cfg_kw = dict(cp_size=cp, max_tokens=s.get("max_tokens", MAX_TOKENS), min_chunk=1, debug=True,
                  sharding_strategy=s.get("strategy", "atp"))
    if s.get("exchange"):
        cfg_kw["kv_exchange"] = s["exchange"]
    cfg = ATACConfig(**cfg_kw)
    model = build_model(lora=bool(s.get("lora")))
    init = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
    ip = bool(s.get("ignore_prompt"))
    train = dataset(s.get("train_docs", 90), 1, ip, s.get("tiny", False))
    if s.get("stream"):
        train = _Stream(train)
    evals = dataset(20, 2, ip, s.get("tiny", False)) if s.get("eval_steps") else None
    if s.get("eval_rows"):
        evals = [{"input_ids": r} for r in s["eval_rows"]]
    trainer = Recording(model=model, args=args, train_dataset=train, eval_dataset=evals, atac_config=cfg)
    trainer.remove_callback(PrinterCallback)
    trainer.recorded = []
    return trainer, init


def run(out_dir: str, cp: int, name: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    s = SCENARIOS[name]
    run_dir = os.path.join(out_dir, "runs", s.get("resume", name))
    trainer, init = make_trainer(cp, run_dir if not s.get("resume") else run_dir + "_b", name)
    if s.get("resume"):
        trainer.train(resume_from_checkpoint=os.path.join(run_dir, f"checkpoint-{s['save_steps']}"))
    else:
        trainer.train()
    model = trainer.model
    base = model.module if hasattr(model, "module") else model
    final = {k.removeprefix("module."): p.detach().clone() for k, p in base.named_parameters() if p.requires_grad}
    logs = trainer.state.log_history
    res = {"init": init, "final": final, "recorded": trainer.recorded, "cp_rank": int(trainer.cp_rank),
           "world": int(trainer.args.world_size),
           "loss": [h["loss"] for h in logs if "loss" in h and "train_loss" not in h],
           "grad_norm": [h["grad_norm"] for h in logs if "grad_norm" in h],
           "eval": [(h["step"], h["eval_loss"]) for h in logs if "eval_loss" in h]}
    torch.save(res, os.path.join(out_dir, f"{name}.{rank}.pt"))


# ---------------------------------------------------------------------------- single-device replay
def _pack_loss_sum(model, rec) -> tuple[torch.Tensor, int]:
    """Sum of the CE over a pack's targets (each document run alone), and the number of targets."""
    from atac_hf.attention import build_shift_labels, doc_lengths_from_batch

    lengths = doc_lengths_from_batch(rec)
    ids = rec["input_ids"].reshape(1, -1)
    offs = np.concatenate([[0], np.cumsum(lengths)])
    logits = torch.cat([model(input_ids=ids[:, a:b], use_cache=False).logits[0] for a, b in zip(offs[:-1], offs[1:])])
    shift = build_shift_labels(rec["labels"], lengths).reshape(-1)
    return F.cross_entropy(logits.double(), shift, reduction="sum"), int((shift != -100).sum())


def replay(results: list[dict], name: str) -> dict:
    """One device: the recorded packs of every DP replica (first CP rank of each), step by step."""
    s = SCENARIOS[name]
    ranks = [r for r in results if r["cp_rank"] == 0]
    model = build_model(lora=bool(s.get("lora")))
    _dist_set_sdpa(model)
    params = dict((k, p) for k, p in model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        for k, v in ranks[0]["init"].items():
            params[k].copy_(v)
    train = [[rec for rec in r["recorded"] if rec["training"]] for r in ranks]
    evals = [[rec for rec in r["recorded"] if not rec["training"]] for r in ranks]
    steps = sorted({rec["step"] for t in train for rec in t})
    out = {"loss": [], "grad_norm": [], "eval": [], "eval_dp": []}
    eval_steps = sorted({rec["step"] for e in evals for rec in e})

    def evaluate(at: int):
        """The mean of the packs' losses (one device); and Trainer's figure under DP (its count of a batch's
        targets is summed over the replicas): the mean over the loader's steps of the step's packs' token mean."""
        losses, steps = [], {}
        with torch.no_grad():
            for e in evals:
                for i, rec in enumerate(r for r in e if r["step"] == at):
                    tot, n = _pack_loss_sum(model, rec)
                    losses.append(float(tot / n))
                    steps.setdefault(i, []).append((float(tot), n))
        out["eval"].append((at, float(np.mean(losses))))
        out["eval_dp"].append((at, float(np.mean([sum(t for t, _ in v) / sum(n for _, n in v)
                                                   for v in steps.values()]))))

    lr = s.get("lr", LR)
    out["snap"] = {0: {k: p.detach().clone() for k, p in params.items()}}
    if 0 in eval_steps:
        evaluate(0)
    for step in steps:
        recs = [rec for t in train for rec in t if rec["step"] == step]
        n_total = 0
        sums = []
        model.zero_grad(set_to_none=True)
        for rec in recs:
            tot, n = _pack_loss_sum(model, rec)
            sums.append(tot)
            n_total += n
        loss = sum(sums) / n_total
        loss.backward()
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params.values() if p.grad is not None))
        out["loss"].append(float(loss.detach()))
        out["grad_norm"].append(float(norm))
        coef = min(1.0, s.get("clip", 1e9) / (float(norm) + 1e-6))  # torch's clip_grad_norm_
        with torch.no_grad():
            for p in params.values():
                if p.grad is not None:
                    p -= lr * coef * p.grad
        out["snap"][step + 1] = {k: p.detach().clone() for k, p in params.items()}
        if step + 1 in eval_steps:
            evaluate(step + 1)
    out["final"] = {k: p.detach().clone() for k, p in params.items()}
    return out


def _dist_set_sdpa(model) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation("sdpa")
    model.train()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    d = (a - b).abs().max().item()
    return d / scale if scale > 0 else d


def compare(out_dir: str, name: str, world: int) -> dict:
    """Errors of the CP run against the replay (parameters: max over tensors of max|diff|/max|ref|)."""
    results = [torch.load(os.path.join(out_dir, f"{name}.{r}.pt"), weights_only=False) for r in range(world)]
    ref = replay(results, name)
    r0 = results[0]
    s = SCENARIOS[name]
    errs = {"params": max(rel(r0["final"][k], v) for k, v in ref["final"].items()),
            "rank_spread": max(rel(r["final"][k], r0["final"][k]) for r in results[1:] for k in r0["final"])
            if world > 1 else 0.0,
            "moved": max(rel(r0["final"][k], r0["init"][k]) for k in r0["final"]),
            "steps": len(ref["loss"])}
    n = min(len(ref["loss"]), len(r0["loss"]))
    # Trainer logs the step's loss through float32 (~1e-7 relative)
    errs["loss"] = max((abs(a - b) / abs(b) for a, b in zip(r0["loss"][-n:], ref["loss"][-n:])), default=0.0)
    errs["grad_norm"] = max((abs(a - b) / abs(b) for a, b in zip(r0["grad_norm"][-n:], ref["grad_norm"][-n:])),
                            default=0.0)
    if ref["eval"] or r0["eval"]:
        errs["eval_steps"] = [[s for s, _ in r0["eval"]], [s for s, _ in ref["eval"]]]
        errs["eval"] = max((abs(a[1] - b[1]) / abs(b[1]) for a, b in zip(r0["eval"], ref["eval"])), default=None)
        errs["eval_dp"] = max((abs(a[1] - b[1]) / abs(b[1]) for a, b in zip(r0["eval"], ref["eval_dp"])),
                              default=None)
        errs["eval_values"] = [r0["eval"], ref["eval"]]
    if s.get("best"):  # the final parameters: those of the step with the lowest eval loss
        best = min((e for e in ref["eval"] if e[0] > 0), key=lambda e: (e[1], e[0]))[0]  # (saved steps only)
        errs["match"] = {at: max(rel(r0["final"][k], v) for k, v in snap.items()) for at, snap in ref["snap"].items()}
        errs["best_step"] = best
        errs["best_params"] = max(rel(r0["final"][k], v) for k, v in ref["snap"][best].items())
        errs["last_params"] = max(rel(r0["final"][k], v) for k, v in ref["snap"][len(ref["loss"])].items())
    errs["cp_loss"] = r0["loss"]
    errs["ref_loss"] = ref["loss"]
    return errs


if __name__ == "__main__":
    out, cp, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for nm in names:
        run(out, cp, nm)
    from _integration_worker import end_processes

    end_processes()

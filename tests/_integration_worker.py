"""Worker for the Trainer integration tests: runs every scenario in one process group.

Run as ``python tests/_integration_worker.py OUT.json CP_SIZE [dp]`` (one process) or under
``torchrun --nproc_per_node 2`` (CP 2; with ``dp`` and 4 processes: DP 2 x CP 2, one scenario). Writes (rank 0) per scenario the logged loss and grad
norm per step, the eval loss, and a digest of every training batch the loop consumed. The
parent test compares CP 2 against CP 1, and a resumed run against an uninterrupted one.

Tiny model (hidden 64, 2 layers), small packs (max_tokens 384): seconds per scenario.
"""

from __future__ import annotations

import inspect

import json
import os
import sys

import torch

torch.set_num_threads(1)

VOCAB = 128


def dataset(num_docs: int, seed: int):
    import datasets
    import numpy as np

    from atac_hf.integrations.demo import synthetic_lengths

    rng = np.random.default_rng(seed)
    lengths = synthetic_lengths(num_docs, seed=seed, max_len=900)
    ids = [rng.integers(0, VOCAB, int(n)).tolist() for n in lengths]
    return datasets.Dataset.from_dict({"input_ids": ids})


def model(peft: bool = False):
    from transformers import AutoModelForCausalLM

    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    cfg = tiny_llama_config(hidden_size=64, num_layers=2, vocab_size=VOCAB, max_position_embeddings=2048)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if peft:
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                         task_type="CAUSAL_LM"))
    return m


def make_trainer(cp_size: int, out_dir: str, *, peft: bool = False, grad_accum: int = 1, max_steps: int = 3,
                 save_steps: int = 0, eval_ds=None, checkpointing: bool = False, sharding_strategy: str = "atp"):
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    class RecordingTrainer(ATACTrainer):
        digests: list

        def _prepare_context_parallel_inputs(self, model, inputs):
            if model.training:
                ids = inputs["input_ids"]
                self.digests.append([int(ids.shape[1]), int(ids.sum()), int((ids * inputs["position_ids"]).sum())])
            return super()._prepare_context_parallel_inputs(model, inputs)

    args = TrainingArguments(
        output_dir=out_dir, max_steps=max_steps, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=1,
        weight_decay=0.0, max_grad_norm=1.0, gradient_accumulation_steps=grad_accum, logging_steps=1,
        per_device_train_batch_size=1, per_device_eval_batch_size=1, use_cpu=True, report_to=[], seed=0,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, disable_tqdm=True,
        log_level="error", ddp_find_unused_parameters=False, include_num_input_tokens_seen="all",
        # transformers renamed gradient_checkpointing to activation_checkpointing during 5.x (5.17: the old name)
        **{"activation_checkpointing" if "activation_checkpointing" in inspect.signature(TrainingArguments).parameters
           else "gradient_checkpointing": checkpointing},
    )
    cfg = ATACConfig(cp_size=cp_size, max_tokens=384, cost_preset="H100", min_chunk=8,
                     sharding_strategy=sharding_strategy)
    trainer = RecordingTrainer(model=model(peft), args=args, train_dataset=dataset(160, seed=1), eval_dataset=eval_ds,
                               atac_config=cfg)
    trainer.remove_callback(PrinterCallback)
    trainer.digests = []
    return trainer


def history(trainer) -> dict:
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    return {"step": [h["step"] for h in logs], "loss": [h["loss"] for h in logs],
            "grad_norm": [h["grad_norm"] for h in logs],
            "imbalance": [h["atac/imbalance"] for h in logs], "kv_mb": [h["atac/kv_mb"] for h in logs],
            "planner_ms": [h["atac/planner_ms"] for h in logs], "digests": trainer.digests,
            "tokens_seen": trainer.state.num_input_tokens_seen, "total_flos": trainer.state.total_flos}


def main(out_path: str, cp_size: int, mode: str = "all") -> None:
    results: dict = {}
    tmp = out_path + ".runs"  # shared by the ranks (checkpoints are read back by every rank)
    if mode == "dp":  # DP x CP world (e.g. 4 = 2 x 2): one pack per replica and step
        t = make_trainer(cp_size, os.path.join(tmp, "dp"), max_steps=3)
        t.train()
        results["dp"] = history(t)
        results["world_size"] = t.args.world_size
        if int(os.environ.get("RANK", "0")) == 0:
            with open(out_path, "w") as f:
                json.dump(results, f)
        return
    # 1. full fine-tuning, 2. gradient accumulation (+ activation checkpointing, zigzag sharding: every
    # document's K/V gathered), 3. LoRA
    t = make_trainer(cp_size, os.path.join(tmp, "full"), max_steps=4)
    t.train()
    results["full"] = history(t)
    t = make_trainer(cp_size, os.path.join(tmp, "ga"), grad_accum=2, max_steps=3, checkpointing=True,
                     sharding_strategy="zigzag")
    t.train()
    results["ga"] = history(t)
    t = make_trainer(cp_size, os.path.join(tmp, "lora"), peft=True, max_steps=3)
    t.train()
    results["lora"] = history(t)
    # 4. evaluation of a fresh model (every eval pack)
    t = make_trainer(cp_size, os.path.join(tmp, "eval"), eval_ds=dataset(60, seed=2))
    # predict() packs the test set like the eval set, and its loss is every CP rank's share
    # (a second loop: Trainer resets its gather function after each one)
    seen = []
    orig = t._prepare_context_parallel_inputs
    t._prepare_context_parallel_inputs = lambda m, inputs: seen.append(int(inputs["input_ids"].numel())) or orig(m, inputs)
    first = t.evaluate()["eval_loss"]
    eval_rows, seen[:] = list(seen), []
    pred = t.predict(dataset(60, seed=2)).metrics["test_loss"]
    t._prepare_context_parallel_inputs = orig
    results["eval"] = {"eval_loss": first, "test_loss": pred, "again": t.evaluate()["eval_loss"],
                       "eval_rows": eval_rows, "predict_rows": seen}
    # 5. checkpoint at step 3 of 6 (mid-epoch), then resume in a fresh trainer
    run_dir = os.path.join(tmp, "resume")
    t = make_trainer(cp_size, run_dir, max_steps=6, save_steps=3)
    t.train()
    results["uninterrupted"] = history(t)
    t = make_trainer(cp_size, run_dir + "_b", max_steps=6, save_steps=3)
    t.train(resume_from_checkpoint=os.path.join(run_dir, "checkpoint-3"))
    results["resumed"] = history(t)
    with open(os.path.join(run_dir, "checkpoint-3", "atac_sampler.json")) as f:
        results["sampler_state"] = json.load(f)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def end_processes() -> None:
    """Destroy the process group before exit (gloo can abort at interpreter shutdown without it)."""
    from accelerate import PartialState

    from atac_hf.integrations._hf_compat import drain_gloo_workers

    state = PartialState()
    state.wait_for_everyone()
    drain_gloo_workers()  # the last collectives' tensors freed first (_hf_compat 8)
    state.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4])
    end_processes()

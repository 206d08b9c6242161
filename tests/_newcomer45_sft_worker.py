"""TRL's SFTTrainer combined with ATACTrainer (``class ATACSFTTrainer(ATACTrainer, SFTTrainer)``,
docs/INTEGRATION.md "TRL's SFTTrainer"), on chat-like samples tokenized beforehand with
``assistant_masks``. ``python _newcomer45_sft_worker.py OUT CP``: alone for cp_size 1, under
torchrun (2 processes) for cp_size 2; rank 0 writes the logged losses and grad norms to OUT. With a
third argument ``plain``: ATACTrainer alone, every rank writing its final train_loss to OUT.rank<r>."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

V = 64


def chat_rows(n: int = 24, seed: int = 0) -> dict:
    """``input_ids`` and ``assistant_masks`` of ``n`` samples: a prompt (mask 0) then an answer (mask 1)."""
    rng = np.random.default_rng(seed)
    ids, masks = [], []
    for _ in range(n):
        p, a = int(rng.integers(3, 30)), int(rng.integers(3, 50))
        ids.append(rng.integers(0, V, size=p + a).tolist())
        masks.append([0] * p + [1] * a)
    return {"input_ids": ids, "assistant_masks": masks}


def build(out_dir: str, cp_size: int):
    import datasets
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from atac_hf import ATACConfig, ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    class ATACSFTTrainer(ATACTrainer, SFTTrainer):
        pass

    vocab = {str(i): i for i in range(V)} | {"<pad>": V, "<eos>": V + 1}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="0")),
                                  pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_llama_config(hidden_size=32, num_layers=2, vocab_size=V + 2, max_position_embeddings=256),
        dtype=torch.float32)
    args = SFTConfig(output_dir=out_dir, max_length=None, max_steps=3, logging_steps=1, learning_rate=1e-3,
                     per_device_train_batch_size=1, use_cpu=True, report_to=[], disable_tqdm=True,
                     save_strategy="no", bf16=torch.cuda.is_available())
    return ATACSFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict(chat_rows()),
                          processing_class=tok,
                          atac_config=ATACConfig(cp_size=cp_size, max_tokens=128, cost_preset="default",
                                                 shuffle=False))


def build_plain(out_dir: str, cp_size: int):
    """ATACTrainer alone, logging every 10 steps of a 3-step run: train_loss is the steps' mean, never logged before."""
    import datasets
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_llama_config(hidden_size=32, num_layers=2, vocab_size=V + 2, max_position_embeddings=256),
        dtype=torch.float32)
    args = TrainingArguments(output_dir=out_dir, max_steps=3, logging_steps=10, learning_rate=1e-3, use_cpu=True,
                             report_to=[], disable_tqdm=True, save_strategy="no")
    rows = {"input_ids": chat_rows()["input_ids"]}
    return ATACTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict(rows),
                       atac_config=ATACConfig(cp_size=cp_size, max_tokens=128, cost_preset="default", shuffle=False))


def main() -> None:
    out, cp = sys.argv[1], int(sys.argv[2])
    if sys.argv[3:] == ["plain"]:  # every rank writes its own train_loss
        trainer = build_plain(os.path.dirname(out), cp)
        result = trainer.train()
        with open(f"{out}.rank{trainer.args.process_index}", "w") as f:
            json.dump({"train_loss": result.training_loss, "metric": result.metrics["train_loss"]}, f)
        trainer.accelerator.end_training()
        return
    trainer = build(os.path.dirname(out), cp)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    if trainer.accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump({k: [h[k] for h in logs] for k in ("loss", "grad_norm", "mean_token_accuracy", "entropy",
                                                          "num_tokens")}, f)
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()

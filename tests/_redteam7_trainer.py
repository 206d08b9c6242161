"""Red-team 7 worker: a tiny Gemma 4 (heterogeneous per-layer head_dim, accepts_loss_kwargs=False) trained by
ATACTrainer for 4 steps with gradient accumulation 2; writes each logged (loss, grad_norm) to OUT as JSON.

Usage: ``[accelerate launch --config_file configs/cpu_cp2.yaml] tests/_redteam7_trainer.py CP OUT``."""

from __future__ import annotations

import copy
import json
import os
import random
import sys

import datasets
import torch
import transformers

from atac_hf import ATACConfig, ATACTrainer
from atac_hf.attention.model_probe import shrink_config

cp, out = int(sys.argv[1]), sys.argv[2]
tiny = shrink_config(transformers.AutoConfig.for_model("gemma4"))
torch.manual_seed(0)
model = transformers.Gemma4ForConditionalGeneration._from_config(copy.deepcopy(tiny)).float()
random.seed(0)
rows = [[random.randrange(1, 60) for _ in range(random.randrange(2, 30))] for _ in range(40)]
args = transformers.TrainingArguments(output_dir=os.path.join(os.path.dirname(out), f"run{cp}"), report_to=[],
                                      use_cpu=True, max_steps=4, logging_steps=1, learning_rate=1e-3,
                                      save_strategy="no", gradient_accumulation_steps=2, disable_tqdm=True)
trainer = ATACTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": rows}),
                      atac_config=ATACConfig(cp_size=cp, max_tokens=64, shuffle=False))
trainer.train()
if int(os.environ.get("RANK", "0")) == 0:
    with open(out, "w") as f:
        json.dump([(h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h], f)
trainer.accelerator.end_training()

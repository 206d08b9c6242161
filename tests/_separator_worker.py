"""One ATACTrainer step with a separator collator, at the launched cp_size (test_document_targets):
the logged loss and the one-device reference of the same pack (each document run alone, the row's
plain shift of the collator's labels as targets, separators included), written to argv[1] by rank 0."""

import copy
import json
import os
import sys
import warnings

import torch
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, LlamaConfig, TrainingArguments

from atac_hf import ATACConfig, ATACTrainer, PackedDataCollator

SEP = 2
world = int(os.environ.get("WORLD_SIZE", "1"))
cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=64, max_position_embeddings=512)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").double()
ref_model = copy.deepcopy(model)
g = torch.Generator().manual_seed(0)
data = [{"input_ids": torch.randint(3, 64, (n,), generator=g).tolist()} for n in [30, 5, 14, 1, 20, 11, 9, 25]]
captured = []


class Capturing(ATACTrainer):
    def _prepare_context_parallel_inputs(self, m, inputs):
        if m.training and not captured:
            captured.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return super()._prepare_context_parallel_inputs(m, inputs)


collator = DataCollatorWithFlattening(separator_id=SEP, return_tensors="pt") if sys.argv[2] == "hf" else \
    PackedDataCollator(separator_id=SEP)
args = TrainingArguments(output_dir=sys.argv[1] + ".out", max_steps=1, per_device_train_batch_size=1, logging_steps=1,
                         report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True, learning_rate=0.0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    trainer = Capturing(model=model, args=args, train_dataset=data, data_collator=collator,
                        atac_config=ATACConfig(cp_size=world, max_tokens=64, shuffle=False))
    trainer.train()
logged = [h["loss"] for h in trainer.state.log_history if "loss" in h][0]
b = captured[0]
ids, pos, labels = b["input_ids"], b["position_ids"], b["labels"]
starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
with torch.no_grad():
    logits = torch.cat([ref_model(input_ids=ids[:, a:e]).logits for a, e in zip(starts[:-1], starts[1:])], dim=1)
    target = torch.full_like(labels, -100)
    target[:, :-1] = labels[:, 1:]
    n = int(target.ne(-100).sum())
    ref = float(torch.nn.functional.cross_entropy(logits[0], target[0], ignore_index=-100, reduction="sum") / n)
if int(os.environ.get("RANK", "0")) == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"logged": logged, "ref": ref, "separators": int((target == SEP).sum()),
                   "docs": len(starts) - 1}, f)
trainer.accelerator.end_training()

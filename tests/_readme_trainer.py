"""The README's Trainer snippet as a new user writes it: no use_cpu, default batch size (test_first_hour)."""

import gc
import json
import sys

import datasets
import torch
from transformers import AutoModelForCausalLM, TrainingArguments

from atac_hf import ATACConfig, ATACTrainer
from atac_hf.integrations.demo import ByteTokenizer, synthetic_corpus, tiny_llama_config

torch.manual_seed(0)
tok = ByteTokenizer()
tokenized = datasets.Dataset.from_dict({"input_ids": [tok.encode(t) for t in synthetic_corpus(40, seed=0,
                                                                                              max_len=700)]})
model = AutoModelForCausalLM.from_config(tiny_llama_config(num_layers=1), dtype=torch.float32)
training_args = TrainingArguments(output_dir=sys.argv[1], max_steps=3, report_to=[], disable_tqdm=True)

trainer = ATACTrainer(model=model, args=training_args, train_dataset=tokenized,
                      atac_config=ATACConfig(cp_size=2, max_tokens=1024))
out = trainer.train()
trainer.accelerator.end_training()   # destroy the process group before exit (gloo can abort otherwise)

# test-only: what the atexit handler (_hf_compat item 6) does at exit, run now to see its effect
from atac_hf.integrations._hf_compat import release_groups_after_shutdown  # noqa: E402


def gloo_threads():
    import os
    return sum(open(f"/proc/self/task/{t}/comm").read().startswith(("gloo", "pt_gloo")) for t in os.listdir("/proc/self/task"))


before = gloo_threads()
released = release_groups_after_shutdown()
del trainer, model  # as when main() returns: the DDP wrapper holds the group too
gc.collect()
if training_args.process_index == 0:
    print("RESULT " + json.dumps({"world_size": training_args.world_size, "use_cpu": training_args.use_cpu,
                                  "steps": out.global_step, "gloo_threads_before": before, "released": released,
                                  "gloo_threads_after": gloo_threads(), **out.metrics}))

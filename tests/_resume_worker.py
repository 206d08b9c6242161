"""Worker for the resume-across-an-epoch-boundary test (tests/test_mutation_survivors.py).

Run under ``torchrun --nproc_per_node 2 tests/_resume_worker.py OUT``: DP 2 (CP 1), gradient
accumulation 2, two epochs. Per scenario (even: WFAP, 68 documents, an epoch of 12 packs = 6 per
replica = 3 optimizer steps; uneven: bfd, an epoch of 6 packs = 3 per replica, so Trainer makes 2
steps, the last of one micro-batch. WFAP's last window holds the packs its samples need, a multiple
of DP: 60 documents made 10 packs, an uneven epoch, since the short last window):

1. an uninterrupted run (seed 0) that checkpoints every step;
2. a fresh trainer with another data seed (5) resumed from a checkpoint one step into epoch 1.

The sampler state must come from the checkpoint (epoch 1, seed 0, not the new trainer's seed),
and the resumed run must train on exactly the batches the uninterrupted run trained on after
that step. Each rank writes ``OUT.rank<r>.json`` with its own batches.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, end_processes, model  # noqa: E402

torch.set_num_threads(1)
GA = 2
SCENARIOS = {"uneven": (40, "bfd"), "even": (68, "wfap")}  # documents, packing: 6 and 12 packs per epoch


def make_trainer(out_dir: str, num_docs: int, packing: str, *, data_seed: int | None):
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    class Recording(ATACTrainer):
        def _prepare_context_parallel_inputs(self, model, inputs):
            if model.training:
                ids = inputs["input_ids"]
                self.digests.append([int(ids.shape[1]), int(ids.sum()), int((ids * inputs["position_ids"]).sum())])
                self.sampler_seen.append([self.atac_sampler.epoch, self.atac_sampler.seed])
            return super()._prepare_context_parallel_inputs(model, inputs)

        def _atac_sampler_check_resume(self, checkpoint):
            super()._atac_sampler_check_resume(checkpoint)
            self.restored = self._atac_sampler_restored[1].state_dict()

    args = TrainingArguments(
        output_dir=out_dir, num_train_epochs=2, learning_rate=1e-3, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, gradient_accumulation_steps=GA, logging_steps=1,
        per_device_train_batch_size=1, use_cpu=True, report_to=[], seed=0, data_seed=data_seed,
        save_strategy="steps", save_steps=1, disable_tqdm=True, log_level="error", ddp_find_unused_parameters=False,
    )
    cfg = ATACConfig(cp_size=1, max_tokens=384, cost_preset="H100", min_chunk=8, packing_strategy=packing)
    trainer = Recording(model=model(), args=args, train_dataset=dataset(num_docs, seed=1), atac_config=cfg)
    trainer.remove_callback(PrinterCallback)
    trainer.digests, trainer.sampler_seen, trainer.restored = [], [], None
    return trainer


def losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]


def main(out_path: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict = {}
    for name, (num_docs, packing) in SCENARIOS.items():
        run_dir = f"{out_path}.runs/{name}"
        full = make_trainer(run_dir, num_docs, packing, data_seed=None)
        full.train()
        steps_per_epoch = full.state.max_steps // 2
        kill = steps_per_epoch + 1  # one optimizer step into epoch 1
        ckpt = os.path.join(run_dir, f"checkpoint-{kill}")
        with open(os.path.join(ckpt, "atac_sampler.json")) as f:
            saved = json.load(f)
        resumed = make_trainer(run_dir + "_b", num_docs, packing, data_seed=5)
        resumed.train(resume_from_checkpoint=ckpt)
        results[name] = {
            "num_batches": len(full.atac_sampler), "dp_size": full.dp_size, "max_steps": full.state.max_steps,
            "kill": kill, "saved": saved, "restored": resumed.restored,
            "full_digests": full.digests, "full_seen": full.sampler_seen, "full_loss": losses(full),
            "resumed_digests": resumed.digests, "resumed_seen": resumed.sampler_seen, "resumed_loss": losses(resumed),
            "resumed_steps": resumed.state.global_step,
        }
    with open(f"{out_path}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
    end_processes()

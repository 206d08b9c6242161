"""Worker for the Trainer TP x CP test: ``python tests/_tp_cp_worker.py OUT.json CP TP`` (one process
with ``1 1``) or under ``torchrun --nproc_per_node 4`` with ``2 2`` (tp 2 x cp 2, through
``TrainingArguments.parallelism_config``). Trains 3 steps with gradient accumulation 2 on the
integration tests' tiny Llama (tied embeddings) and data, then evaluates; rank 0 writes the logged
losses, grad norms, balance figures, token and FLOP counters, eval loss and a digest of every
training batch; the trained weights are saved to ``OUT.json.model`` (a checkpoint at step 2 too,
``save_only_model``).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import _integration_worker as iw  # noqa: E402

torch.set_num_threads(1)


def main(out_path: str, cp_size: int, tp_size: int) -> None:
    from accelerate.parallelism_config import ParallelismConfig
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    class RecordingTrainer(ATACTrainer):
        digests: list

        def _prepare_context_parallel_inputs(self, model, inputs):
            if model.training:
                ids = inputs["input_ids"]
                self.digests.append([int(ids.shape[1]), int(ids.sum()), int((ids * inputs["position_ids"]).sum())])
            return super()._prepare_context_parallel_inputs(model, inputs)

    pc = ParallelismConfig(tp_size=tp_size, cp_size=cp_size) if tp_size * cp_size > 1 else None
    args = TrainingArguments(
        output_dir=out_path + ".run", max_steps=3, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=1,
        weight_decay=0.0, max_grad_norm=1.0, gradient_accumulation_steps=2, logging_steps=1,
        per_device_train_batch_size=1, per_device_eval_batch_size=1, use_cpu=True, report_to=[], seed=0,
        save_strategy="steps", save_steps=2, save_only_model=True, disable_tqdm=True, log_level="error", ddp_find_unused_parameters=False,
        include_num_input_tokens_seen="all", parallelism_config=pc,
    )
    cfg = ATACConfig(cp_size=cp_size, max_tokens=384, cost_preset="H100", min_chunk=8, sharding_strategy="zigzag")
    trainer = RecordingTrainer(model=iw.model(), args=args, train_dataset=iw.dataset(160, seed=1),
                               eval_dataset=iw.dataset(40, seed=2), atac_config=cfg)
    trainer.remove_callback(PrinterCallback)
    trainer.digests = []
    trainer.train()
    res = iw.history(trainer)
    res["eval_loss"] = trainer.evaluate()["eval_loss"]
    trainer.save_model(out_path + ".model")  # every rank: the TP shards are gathered, rank 0 writes
    res.update(world_size=trainer.args.world_size, tp_size=trainer.atac_tp_size, dp_size=trainer.dp_size)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    iw.end_processes()

"""Worker for ``tests/test_redteam25.py``: ``ATACTrainer`` at CP = world size (under ``torchrun --nproc_per_node N``;
OUT.json from rank 0; fp64). ``train()`` called twice on one trainer (a second stage): the second runs the first's DDP
wrapper, which Accelerate no longer lists (``free_memory``), and was refused as "not prepared"; it trains as on one
process. A parameter unfrozen in ``on_train_begin`` (after DDP wrapped the model, before the first step) is
refused: DDP never sums its gradient."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model  # noqa: E402
from _redteam13_worker import per_rank_sum  # noqa: E402

torch.set_num_threads(1)


def make(out_dir: str, max_steps: int = 2):
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    args = TrainingArguments(
        output_dir=out_dir, optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", max_grad_norm=1.0,
        weight_decay=0.0, logging_steps=1, per_device_train_batch_size=1, use_cpu=True, report_to=[], seed=0,
        save_strategy="no", disable_tqdm=True, log_level="error", ddp_find_unused_parameters=False,
        max_steps=max_steps)
    t = ATACTrainer(model=model().double(), args=args, train_dataset=dataset(60, seed=1),
                    atac_config=ATACConfig(cp_size=int(os.environ["WORLD_SIZE"]), max_tokens=384, min_chunk=8))
    t.remove_callback(PrinterCallback)
    return t


def params(t) -> list[float]:
    m = getattr(t.model_wrapped, "module", t.model_wrapped)
    return [float(x) for x in torch.cat([p.detach().double().reshape(-1) for p in m.parameters()])[::97]]


def main(out_path: str) -> None:
    from transformers import TrainerCallback

    tmp = out_path + ".runs"
    res: dict = {}
    t = make(os.path.join(tmp, "twice"))
    t.train()
    t.train()  # a second stage on the same trainer
    res["twice"] = {"params": params(t), "steps": t.state.global_step, "rank_sums": per_rank_sum(t)}

    class UnfreezeAtBegin(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            model.get_input_embeddings().weight.requires_grad_(True)

    t = make(os.path.join(tmp, "unfreeze"))
    t.model.get_input_embeddings().weight.requires_grad_(False)
    t.add_callback(UnfreezeAtBegin())
    try:
        t.train()
        res["unfreeze"] = {"error": None}
    except ValueError as e:
        res["unfreeze"] = {"error": str(e), "step": t.state.global_step}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])

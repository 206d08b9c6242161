"""Worker for ``tests/test_redteam24.py``: ``ATACTrainer`` subclasses at CP 2 (under ``torchrun --nproc_per_node 2``;
OUT.json from rank 0). A ``compute_loss`` override that passes ``self.model`` (outside the step's DDP wrapper) to
``super().compute_loss`` is refused before the first backward; one that adds a term from a second forward of
``self.model`` beside the loss through ``model`` trains in step across the ranks (DDP sums the whole gradient); a
parameter unfrozen by a callback after DDP wrapped the model is refused at the next step."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _redteam13_worker import make, per_rank_sum  # noqa: E402

torch.set_num_threads(1)


def main(out_path: str) -> None:
    from atac_hf.integrations import ATACTrainer

    class SelfModel(ATACTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(self.model, inputs, return_outputs, num_items_in_batch)

    class ExtraTerm(ATACTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss + 0.1 * self.model(**inputs).loss

    tmp = out_path + ".runs"
    res: dict = {}
    t = make(SelfModel, os.path.join(tmp, "self_model"))
    before = per_rank_sum(t)
    try:
        t.train()
        res["self_model"] = {"error": None}
    except ValueError as e:
        res["self_model"] = {"error": str(e), "before": before, "after": per_rank_sum(t),
                             "grads": sum(p.grad is not None for p in t.model.parameters())}
    from transformers import TrainerCallback

    class Unfreeze(TrainerCallback):  # gradual unfreezing: the embeddings after the first step
        def on_step_end(self, args, state, control, model=None, **kw):
            model.get_input_embeddings().weight.requires_grad_(True)

    t = make(ATACTrainer, os.path.join(tmp, "unfreeze"))
    t.model.get_input_embeddings().weight.requires_grad_(False)
    t.add_callback(Unfreeze())
    try:
        t.train()
        res["unfreeze"] = {"error": None}
    except ValueError as e:
        res["unfreeze"] = {"error": str(e), "step": t.state.global_step}
    t = make(ExtraTerm, os.path.join(tmp, "extra_term"))
    t.train()
    res["extra_term"] = {"sums": per_rank_sum(t), "losses": [h["loss"] for h in t.state.log_history if "loss" in h]}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])

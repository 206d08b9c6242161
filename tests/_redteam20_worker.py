"""Worker for ``tests/test_redteam20.py``: loss overrides under CP 2 (run under ``torchrun
--nproc_per_node 2``; writes OUT.json from rank 0). The trainer set-up of ``_redteam13_worker``.

Scenarios: a ``training_step`` override that drops ``num_items_in_batch`` (the 4.x signature) and a
``compute_loss`` override that calls ``super()`` without it train as one device does (the pack's
mean); a ``compute_loss`` that copies an older Trainer's body (reads ``compute_loss_func``, never
scales the loss) and one set on the instance after construction are refused before any backward; a
model whose loss shifts ``labels`` itself is refused at construction.
"""

from __future__ import annotations

import json
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _redteam13_worker import losses, make, per_rank_sum  # noqa: E402

torch.set_num_threads(1)


def main(out_path: str) -> None:
    from atac_hf.integrations import ATACTrainer

    tmp = out_path + ".runs"
    res: dict = {}

    class DropCountStep(ATACTrainer):  # transformers 4.x's signature: the count is dropped
        def training_step(self, model, inputs, num_items_in_batch=None):
            return super().training_step(model, inputs)

    class DropCountLoss(ATACTrainer):  # Trainer's loss, the count dropped
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            return super().compute_loss(model, inputs, return_outputs)

    class OldTrainerLoss(ATACTrainer):  # Trainer.compute_loss of transformers 4.46-4.48, copied: no world-size scale
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs:
                inputs.pop("labels")
            if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
                inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
            outputs = model(**inputs)
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs[0]
            return (loss, outputs) if return_outputs else loss

    for name, cls in (("reference", ATACTrainer), ("drop_count_step", DropCountStep),
                      ("drop_count_loss", DropCountLoss)):
        t = make(cls, os.path.join(tmp, name))
        t.train()
        res[name] = {"loss": losses(t), "sums": per_rank_sum(t)}

    def plain_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs)
        return (out.loss, out) if return_outputs else out.loss

    for name in ("old_trainer_loss", "set_on_instance"):
        t = make(OldTrainerLoss if name == "old_trainer_loss" else ATACTrainer, os.path.join(tmp, name))
        if name == "set_on_instance":
            t.compute_loss = types.MethodType(plain_loss, t)
        before = per_rank_sum(t)
        try:
            t.train()
            res[name] = {"error": None}
        except ValueError as e:
            res[name] = {"error": str(e), "before": before, "after": per_rank_sum(t)}
    from transformers import LlamaForCausalLM

    from _integration_worker import model

    class SelfShiftLlama(LlamaForCausalLM):  # its own loss: labels shifted on whatever rows it gets (a shard's)
        def forward(self, input_ids=None, labels=None, num_items_in_batch=None, shift_labels=None, **kw):
            out = super().forward(input_ids=input_ids, **kw)
            if labels is not None:
                lg = out.logits[:, :-1].float()
                out.loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels[:, 1:].reshape(-1),
                                                             ignore_index=-100, reduction="sum") / num_items_in_batch
            return out

    torch.manual_seed(0)
    shifting = SelfShiftLlama(model().config)
    try:
        make(ATACTrainer, os.path.join(tmp, "self_shift"), m=shifting)
        res["self_shift"] = {"error": None}
    except ValueError as e:
        res["self_shift"] = {"error": str(e), "attn": shifting.config._attn_implementation}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])

"""Worker for ``tests/test_redteam13.py``: Trainer features under CP 2 (run under ``torchrun
--nproc_per_node 2``; writes OUT.json from rank 0).

Scenarios: training after an ``evaluate()`` / ``predict()`` (DDP must still sum the CP ranks'
gradients), a ``compute_loss`` override that bypasses Trainer's (refused before any backward) or
calls ``super()`` (trains as without it), a model whose loss ignores ``num_items_in_batch``
(refused at construction). SGD with a large step, so that a missed gradient sum shows in the weights.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model  # noqa: E402

torch.set_num_threads(1)


def make(cls, out_dir: str, m=None, eval_ds=None, train_ds=None, **kw):
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig

    kw = {"max_steps": 3, **kw}
    args = TrainingArguments(
        output_dir=out_dir, optim="sgd", learning_rate=0.5, lr_scheduler_type="constant",
        max_grad_norm=0.0, weight_decay=0.0, logging_steps=1, per_device_train_batch_size=1,
        per_device_eval_batch_size=1, use_cpu=True, report_to=[], seed=0, save_strategy="no", disable_tqdm=True,
        log_level="error", ddp_find_unused_parameters=False, **kw)
    t = cls(model=m if m is not None else model(), args=args,
            train_dataset=dataset(60, seed=1) if train_ds is None else train_ds,
            eval_dataset=eval_ds, atac_config=ATACConfig(cp_size=2, max_tokens=384, min_chunk=8))
    t.remove_callback(PrinterCallback)
    return t


def per_rank_sum(t) -> list[float]:
    m = getattr(t.model_wrapped, "module", t.model_wrapped)
    s = torch.tensor([float(sum(p.detach().double().sum() for p in m.parameters()))], dtype=torch.float64)
    out = [torch.zeros_like(s) for _ in range(dist.get_world_size())]
    dist.all_gather(out, s)
    return [float(x) for x in out]


def losses(t) -> list[float]:
    return [h["loss"] for h in t.state.log_history if "loss" in h and "train_loss" not in h]


def main(out_path: str) -> None:
    from transformers import LlamaForCausalLM, Trainer

    from atac_hf.integrations import ATACTrainer

    tmp = out_path + ".runs"
    res: dict = {}
    evds = dataset(20, seed=2)
    for name in ("train_only", "evaluate_first", "predict_first"):
        t = make(ATACTrainer, os.path.join(tmp, name), eval_ds=evds)
        if name == "evaluate_first":
            t.evaluate()
        if name == "predict_first":
            t.predict(evds)
        t.train()
        res[name] = {"loss": losses(t), "sums": per_rank_sum(t), "wrapper": type(t.model_wrapped).__name__,
                     "eval_after": t.evaluate()["eval_loss"]}

    class PlainLoss(ATACTrainer):  # correct with stock Trainer; a wrong share under CP
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = model(**inputs)
            return (out.loss, out) if return_outputs else out.loss

    class SuperLoss(ATACTrainer):  # Trainer's loss plus a term: exact
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            got = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                       num_items_in_batch=num_items_in_batch)
            return got if return_outputs else got + 0.0

    class DirectLoss(ATACTrainer):  # Trainer's loss called by name, not through super(): exact too
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return Trainer.compute_loss(self, model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    t = make(DirectLoss, os.path.join(tmp, "direct"))
    t.train()
    res["direct"] = {"loss": losses(t), "sums": per_rank_sum(t)}
    t = make(PlainLoss, os.path.join(tmp, "plain"))
    before = per_rank_sum(t)
    try:
        t.train()
        res["plain"] = {"error": None}
    except ValueError as e:
        res["plain"] = {"error": str(e), "before": before, "after": per_rank_sum(t)}
    t = make(SuperLoss, os.path.join(tmp, "super"))
    t.train()
    res["super"] = {"loss": losses(t), "sums": per_rank_sum(t)}

    class MeanLossLlama(LlamaForCausalLM):  # its own per-rank mean, num_items_in_batch swallowed
        def forward(self, input_ids=None, labels=None, **kwargs):
            kwargs.pop("num_items_in_batch", None)
            out = super().forward(input_ids=input_ids, **kwargs)
            if labels is not None:
                logits = out.logits[:, :-1].flatten(0, 1).float()
                out.loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=-100)
            return out

    torch.manual_seed(0)
    mean_model = MeanLossLlama(model().config)
    try:
        make(ATACTrainer, os.path.join(tmp, "mean"), m=mean_model)
        res["mean_model"] = {"error": None}
    except ValueError as e:
        res["mean_model"] = {"error": str(e), "attn": mean_model.config._attn_implementation}
    # tokens seen: a 1-token pack (padded to one token per CP rank) counts 1
    import datasets

    t = make(ATACTrainer, os.path.join(tmp, "tokens"), train_ds=datasets.Dataset.from_dict({"input_ids": [[5]]}),
             max_steps=1, include_num_input_tokens_seen="all")
    t.train()
    res["tokens_tiny"] = t.state.num_input_tokens_seen
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])

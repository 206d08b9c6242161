"""Worker for ``tests/test_cp_predictions.py``: ``predict()`` and ``compute_metrics`` under CP.

Run as ``python -m torch.distributed.run --nproc_per_node N tests/_predictions_worker.py OUT.json CP``
(N = dp x CP). Rank 0 writes OUT.json (metrics, best-model figures) and OUT.npz (predictions, label ids,
inputs). The parent test compares CP 2 against CP 1 at the same DP size.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model  # noqa: E402

torch.set_num_threads(1)


def argmax(logits, labels):
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(-1)


def token_accuracy(p) -> dict:
    """run_clm.py's accuracy: the prediction at t against the label at t + 1 (padding and -100 left out)."""
    preds, labels = np.asarray(p.predictions)[:, :-1], np.asarray(p.label_ids)[:, 1:]
    mask = labels != -100
    out = {"accuracy": float((preds[mask] == labels[mask]).mean()), "rows": int(preds.shape[0]),
           "targets": int(mask.sum())}
    if p.inputs is not None:
        out["input_tokens"] = int((np.asarray(p.inputs) != -100).sum())
    return out


def make(cp: int, out_dir: str, **kw):
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    args = TrainingArguments(
        output_dir=out_dir, optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", max_grad_norm=0.0,
        per_device_train_batch_size=1, per_device_eval_batch_size=1, use_cpu=True, report_to=[], seed=0,
        disable_tqdm=True, log_level="error", ddp_find_unused_parameters=False, **kw)
    t = ATACTrainer(model=model(), args=args, train_dataset=dataset(40, seed=1), eval_dataset=dataset(24, seed=2),
                    compute_metrics=token_accuracy, preprocess_logits_for_metrics=argmax,
                    atac_config=ATACConfig(cp_size=cp, max_tokens=384, min_chunk=8))
    t.remove_callback(PrinterCallback)
    return t


def main(out_path: str, cp: int) -> None:
    tmp = out_path + ".runs"
    res: dict = {"world": int(os.environ.get("WORLD_SIZE", "1"))}
    # 1. evaluate() with compute_metrics (argmax kept per token), the inputs passed too
    t = make(cp, os.path.join(tmp, "eval"), include_for_metrics=["inputs"], save_strategy="no")
    res["evaluate"] = t.evaluate()
    # 2. predict(): full logits, no preprocessing
    t.preprocess_logits_for_metrics = None
    t.compute_metrics = None
    pred = t.predict(dataset(24, seed=2))
    res["predict_metrics"] = pred.metrics
    arrays = {"logits": np.asarray(pred.predictions), "label_ids": np.asarray(pred.label_ids)}
    # the packed rows split back into samples (dataset order), and which samples the packs kept whole
    from atac_hf.integrations import predictions_by_sample

    test_set = dataset(24, seed=2)
    pred = t.predict(test_set)
    by_sample = predictions_by_sample(t, pred.predictions, test_set)
    arrays.update({f"sample_{i:02d}": x for i, x in enumerate(by_sample)})
    spans = t._atac_eval_loaders["test"][2]._epoch_plan()[0]
    whole = [sum(1 for s in spans.tolist() if s[0] == i) == 1 for i in range(len(test_set))]
    arrays["whole"] = np.asarray(whole)
    arrays["sample_labels_05"] = predictions_by_sample(t, pred.label_ids, test_set)[5]
    # 3. predict(ignore_keys=None) on a model that also returns its hidden states: a tuple of per-token outputs
    t.model.config.output_hidden_states = True
    hidden = t.predict(dataset(8, seed=3)).predictions
    t.model.config.output_hidden_states = False
    arrays["hidden_last"] = np.asarray(hidden[1][-1])
    arrays["hidden_logits"] = np.asarray(hidden[0])
    # 4. outputs that cannot be put back in row order: a scalar (every rank), a tensor per-token on CP rank 0 only,
    # or on the first DP replica only; every rank refuses (none waits in a collective the others left)
    import torch.distributed as dist

    from atac_hf.integrations import ATACTrainer

    class ExtraOutputs(ATACTrainer):
        extra = "scalar"

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, out = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
            n0 = int(self.atac_sharder.last_plan.rank_num_tokens()[0])
            here = int(self.atac_sharder.last_plan.rank_num_tokens()[self.cp_rank])
            first_replica = int(os.environ.get("RANK", "0")) < self.atac_config.cp_size
            out["extra"] = (loss.detach() * 0 if self.extra == "scalar" else torch.zeros(1, n0, 2)
                            if self.extra == "rank0" else torch.zeros(1, here if first_replica else 7, 2))
            return (loss, out) if return_outputs else loss

    t.__class__ = ExtraOutputs
    refusals = {}
    for kind in ("scalar", "rank0", "replica0"):  # replica0: per-token on the first DP replica's ranks only
        t.extra = kind
        try:
            t.predict(dataset(8, seed=3))
            got = None
        except ValueError as e:
            got = str(e)
        every = [None] * (dist.get_world_size() if dist.is_initialized() else 1)
        if dist.is_initialized():
            dist.all_gather_object(every, got)
        else:
            every = [got]
        refusals[kind] = every
    res["refusals"] = refusals
    res["ignored"] = list(np.asarray(t.predict(dataset(8, seed=3), ignore_keys=["extra"]).predictions).shape)
    t.__class__ = ATACTrainer
    # 5. TRL's SFTTrainer after ATACTrainer (its own prediction_step returns the shard's labels)
    try:
        import trl  # noqa: F401
    except ImportError:
        trl = None
    if trl is not None:
        import datasets
        from _newcomer45_sft_worker import build, chat_rows

        sft = build(os.path.join(tmp, "sft"), cp)
        sft.compute_metrics, sft.preprocess_logits_for_metrics = token_accuracy, argmax
        evals = datasets.Dataset.from_dict(chat_rows(10, seed=1))
        res["sft_evaluate"] = sft.evaluate(evals)
        sft.compute_metrics = sft.preprocess_logits_for_metrics = None
        pred = sft.predict(evals)
        arrays["sft_logits"], arrays["sft_label_ids"] = np.asarray(pred.predictions), np.asarray(pred.label_ids)
    # 6. the best model by a compute_metrics metric, evaluated every step (not under TP, which saves no checkpoint)
    if os.environ.get("PARALLELISM_CONFIG_TP_SIZE", "1") != "1":
        return save(out_path, res, arrays)
    t = make(cp, os.path.join(tmp, "best"), max_steps=3, eval_strategy="steps", eval_steps=1, save_strategy="steps",
             save_steps=1, load_best_model_at_end=True, metric_for_best_model="accuracy", greater_is_better=True,
             logging_steps=1)
    t.train()
    res["best"] = {"metric": t.state.best_metric, "checkpoint": os.path.basename(t.state.best_model_checkpoint or ""),
                   "accuracies": [h["eval_accuracy"] for h in t.state.log_history if "eval_accuracy" in h],
                   "losses": [h["eval_loss"] for h in t.state.log_history if "eval_loss" in h]}
    save(out_path, res, arrays)


def save(out_path: str, res: dict, arrays: dict) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        np.savez(out_path[:-len(".json")] + ".npz", **arrays)
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

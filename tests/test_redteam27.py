"""Red-team 27: long runs, resource growth. Found: every ``evaluate()`` / ``predict()`` made and prepared a new
WFAP loader, which Accelerate keeps for good (with its packing plan, about 0.8 MB per 100K eval samples), and
with ``dataloader_persistent_workers`` its worker processes (+1 process and +6 file descriptors an evaluation:
"Too many open files" after about 170 evaluations); ``BatchSharder`` kept one stats record per step in a loop
that never logs (``tests/test_integration_config.py``). Flat under the helper's 1,500-3,000-step runs: RSS after
warm-up, file descriptors, threads, process groups (no ``new_group`` per layout), hooks, module-level caches."""

from __future__ import annotations

import os

import pytest
import torch

from _integration_worker import dataset, model


def _children() -> int:
    pid = os.getpid()
    n = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                n += len(f.read().split())
        except OSError:
            pass
    return n


def _trainer(tmp_path, workers: int, eval_dataset):
    from accelerate.state import AcceleratorState
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    AcceleratorState._reset_state(True)
    extra = {"dataloader_persistent_workers": True} if workers else {}
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", max_steps=1,
                             disable_tqdm=True, log_level="error", dataloader_num_workers=workers, **extra)
    t = ATACTrainer(model=model(), args=args, train_dataset=dataset(30, seed=1), eval_dataset=eval_dataset,
                    atac_config=ATACConfig(cp_size=1, max_tokens=1024, min_chunk=8))
    t.remove_callback(PrinterCallback)
    return t


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts child processes from /proc")
def test_persistent_eval_workers_are_reused_not_leaked_per_evaluation(tmp_path):
    t = _trainer(tmp_path, 1, dataset(20, seed=2))
    first = t.evaluate()["eval_loss"]
    children, loaders = _children(), len(t.accelerator._dataloaders)
    for _ in range(3):
        assert t.evaluate()["eval_loss"] == pytest.approx(first, rel=1e-6)
    assert (_children(), len(t.accelerator._dataloaders)) == (children, loaders)
    t.predict(dataset(8, seed=3))
    t.predict(dataset(8, seed=4))  # another test set: the first's loader and workers released
    assert (_children(), len(t.accelerator._dataloaders)) == (children + 1, loaders + 1)


def test_eval_loaders_are_not_kept_one_per_evaluation(tmp_path):
    evals = {"a": dataset(12, seed=2), "b": dataset(9, seed=5)}
    t = _trainer(tmp_path, 0, evals)
    first = t.evaluate()
    loaders = len(t.accelerator._dataloaders)
    for _ in range(3):
        again = t.evaluate()
        assert again["eval_a_loss"] == pytest.approx(first["eval_a_loss"], rel=1e-6)
        assert again["eval_b_loss"] == pytest.approx(first["eval_b_loss"], rel=1e-6)
    assert len(t.accelerator._dataloaders) == loaders
    with torch.no_grad():
        loss = t.evaluate(eval_dataset=evals["b"])["eval_loss"]  # a dataset given directly: its own loader
    assert loss == pytest.approx(first["eval_b_loss"], rel=1e-6)
    assert len(t.accelerator._dataloaders) == loaders + 1

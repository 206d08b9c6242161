"""Reliability: exactly-once data through ``ATACTrainer`` with a kill and resume (issue #6, item 1).

One process (CP 1), gradient accumulation 2, WFAP with deferral and fragments. Every token of
the dataset is a distinct id, and the trainer records the ``input_ids`` of every micro-batch it
trains on. A run checkpointed at step k, then resumed in a fresh trainer from that checkpoint,
trains on every token exactly once over the epoch: steps 1..k of the first run plus the resumed
run. A checkpoint at the last step resumes with nothing left.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _reliability  # noqa: E402
from _recording import recording_trainer  # noqa: E402

pytestmark = pytest.mark.slow


def _dataset():
    import datasets

    rng = np.random.default_rng(11)
    lengths = np.concatenate([rng.integers(1, 60, 50), rng.integers(150, 400, 6), [1, 1, 2]])
    rng.shuffle(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    ids = [list(range(int(starts[i]), int(starts[i + 1]))) for i in range(len(lengths))]
    return datasets.Dataset.from_dict({"input_ids": ids}), int(starts[-1])


def _trainer(out_dir: str, dataset, vocab: int, *, save_steps: int):
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    cfg = tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=vocab, max_position_embeddings=512)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    args = TrainingArguments(output_dir=out_dir, num_train_epochs=1, learning_rate=1e-3, gradient_accumulation_steps=2,
                             per_device_train_batch_size=1, use_cpu=True, report_to=[], seed=3, save_strategy="steps",
                             save_steps=save_steps, logging_steps=1, disable_tqdm=True, log_level="error")
    atac = ATACConfig(cp_size=1, max_tokens=256, cost_preset="default",
                      packing_options={"max_defer": 2, "min_fragment": 16, "reference_doc_tokens": 16})
    return recording_trainer(model, args, dataset, atac)


def test_trainer_kill_and_resume_trains_every_token_exactly_once(tmp_path):
    dataset, total = _dataset()
    want = Counter(range(total))
    first = _trainer(str(tmp_path / "a"), dataset, total + 1, save_steps=1)
    first.train()
    steps = first.state.global_step
    assert steps >= 6, "the epoch must be long enough to kill it in the middle"
    print(f"\n{len(dataset)} samples, {total} tokens, {steps} steps of 2 micro-batches")
    uninterrupted = Counter(t for _, ids in first.seen for t in ids)
    assert uninterrupted == want, "an uninterrupted epoch trains on every token once"
    checked = 0
    for kill in (3, steps - 1, steps):  # mid-epoch, one step before the end, at the end
        ckpt = tmp_path / "a" / f"checkpoint-{kill}"
        assert ckpt.is_dir() and (ckpt / "atac_sampler.json").is_file()
        before = Counter(t for step, ids in first.seen if step < kill for t in ids)
        resumed = _trainer(str(tmp_path / f"b{kill}"), dataset, total + 1, save_steps=1000)
        resumed.train(resume_from_checkpoint=str(ckpt))
        after = Counter(t for _, ids in resumed.seen for t in ids)
        assert before + after == want, (f"kill at step {kill}/{steps}: lost {sum((want - before - after).values())}, "
                                        f"repeated {sum((before + after - want).values())} tokens")
        checked += 1
    _reliability.count("exactly_once.trainer_resumes", checked)
    _reliability.count("exactly_once.samples", len(dataset) * (checked + 1))
    _reliability.flush(__name__)

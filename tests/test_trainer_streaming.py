"""Streaming datasets in ATACTrainer: an ``IterableDataset`` / ``datasets.IterableDataset``
goes through the resumable ``PackedIterableDataset``.

One process (CP 1), gradient accumulation 2, WFAP with deferral and fragments; every token of
the stream is a distinct id and the trainer records the ``input_ids`` of every micro-batch.
Checked as for the map-style path (tests/test_reliability_trainer.py): one pass trains every
token exactly once; ``max_steps`` bounds a run whose length is unknown; a run resumed from a
checkpoint trains the rest of the pass, no token lost or repeated. The DP 2 x GA 2 deal is in
test_dp2_streaming_trains_every_token_once (slow, 2 gloo processes under torchrun).
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from atac_hf.integrations import ATACConfig
from atac_hf.packing.data.iterable import PackedIterableDataset

sys.path.insert(0, os.path.dirname(__file__))
from _recording import recording_trainer  # noqa: E402

ATAC = dict(cp_size=1, max_tokens=256, cost_preset="default",
            packing_options={"max_defer": 2, "min_fragment": 16, "reference_doc_tokens": 16})


def _samples(seed: int = 11):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(1, 60, 50), rng.integers(150, 400, 6), [1, 1, 2]])
    rng.shuffle(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return [list(range(int(starts[i]), int(starts[i + 1]))) for i in range(len(lengths))], int(starts[-1])


class _TorchStream(torch.utils.data.IterableDataset):
    """A plain torch IterableDataset (no length, no column names)."""

    def __init__(self, ids):
        self.ids = ids

    def __iter__(self):
        for row in self.ids:
            yield {"input_ids": row}


def _stream(kind: str, ids):
    if kind == "torch":
        return _TorchStream(ids)
    import datasets

    return datasets.Dataset.from_dict({"input_ids": ids}).to_iterable_dataset(num_shards=1)


def _model_config(vocab: int):
    from atac_hf.integrations.demo import tiny_llama_config

    return tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=vocab, max_position_embeddings=512)


def _num_rows(stream, vocab: int, grad_accum: int = 2, dp: int = 1) -> int:
    """Rows of one pass, packed as the trainer packs them (same config and cost model)."""
    cfg = ATACConfig(**ATAC)
    cost = cfg.cost_model(_model_config(vocab), dtype_bytes=2)
    packed = PackedIterableDataset(stream, cfg.packing_config(dp * grad_accum), num_replicas=dp, cost_model=cost)
    return sum(1 for _ in packed)


def _trainer(out_dir: str, stream, vocab: int, *, max_steps: int, save_steps: int | None = None, **args_kw):
    from transformers import AutoModelForCausalLM, TrainingArguments

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_model_config(vocab), dtype=torch.float32)
    save = {"save_strategy": "steps", "save_steps": save_steps} if save_steps else {"save_strategy": "no"}
    args = TrainingArguments(output_dir=out_dir, max_steps=max_steps, learning_rate=1e-3, gradient_accumulation_steps=2,
                             use_cpu=True, report_to=[], seed=3, logging_steps=1, disable_tqdm=True, log_level="error",
                             **save, **args_kw)
    return recording_trainer(model, args, stream, ATACConfig(**ATAC))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["datasets", "torch"])
def test_one_pass_of_a_stream_trains_every_token_once(tmp_path, kind):
    ids, total = _samples()
    rows = _num_rows(_stream(kind, ids), total + 1)
    steps = math.ceil(rows / 2)
    assert steps >= 6, "the pass must hold several steps"
    t = _trainer(str(tmp_path), _stream(kind, ids), total + 1, max_steps=steps)
    t.train()
    assert t.state.global_step == steps and len(t.seen) == rows
    assert Counter(x for _, s in t.seen for x in s) == Counter(range(total))
    assert t.atac_sampler is None  # no map-style sampler behind a stream


@pytest.mark.slow
def test_max_steps_bounds_a_stream_of_unknown_length(tmp_path):
    ids, total = _samples()
    t = _trainer(str(tmp_path), _stream("torch", ids), total + 1, max_steps=3)
    t.train()
    assert t.state.global_step == 3 and len(t.seen) == 6
    seen = Counter(x for _, s in t.seen for x in s)
    assert max(seen.values()) == 1 and 0 < sum(seen.values()) < total


@pytest.mark.slow
def test_resume_a_stream_from_a_checkpoint_trains_every_token_once(tmp_path):
    ids, total = _samples()
    steps = math.ceil(_num_rows(_stream("datasets", ids), total + 1) / 2)
    want = Counter(range(total))
    first = _trainer(str(tmp_path / "a"), _stream("datasets", ids), total + 1, max_steps=steps, save_steps=1)
    first.train()
    assert Counter(x for _, s in first.seen for x in s) == want
    for kill in (2, steps - 1):
        ckpt = tmp_path / "a" / f"checkpoint-{kill}"
        assert ckpt.is_dir()
        before = Counter(x for step, s in first.seen if step < kill for x in s)
        resumed = _trainer(str(tmp_path / f"b{kill}"), _stream("datasets", ids), total + 1, max_steps=steps)
        resumed.train(resume_from_checkpoint=str(ckpt))
        after = Counter(x for _, s in resumed.seen for x in s)
        assert before + after == want, (f"resume at step {kill}/{steps}: lost {sum((want - before - after).values())}, "
                                        f"repeated {sum((before + after - want).values())} tokens")


@pytest.mark.slow
def test_streaming_errors(tmp_path):
    import datasets
    from transformers.trainer_pt_utils import AcceleratorConfig

    ids, total = _samples()
    with pytest.raises(ValueError, match=r"dispatch_batches=True with a streaming dataset.*set dispatch_batches"):
        _trainer(str(tmp_path), _stream("torch", ids), total + 1, max_steps=2,
                 accelerator_config=AcceleratorConfig(dispatch_batches=True))
    packed = datasets.Dataset.from_dict({"input_ids": [[1, 2]], "seq_lengths": [[2]]}).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"train_dataset is a stream of pre-packed rows \(a 'seq_lengths' column"):
        _trainer(str(tmp_path), packed, total + 1, max_steps=2)
    no_ids = datasets.Dataset.from_dict({"text": ["a"]}).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"train_dataset has no \['input_ids'\] column"):
        _trainer(str(tmp_path), no_ids, total + 1, max_steps=2)


_DP2_WORKER = r'''
import json, math, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from collections import Counter
import test_trainer_streaming as T
ids, total = T._samples()
rows = T._num_rows(T._stream("datasets", ids), total + 1, dp=2)
steps = math.ceil(rows / 2 / 2)
t = T._trainer(sys.argv[2], T._stream("datasets", ids), total + 1, max_steps=steps)
t.train()
seen = [x for _, s in t.seen for x in s]
with open(os.path.join(sys.argv[2], f"seen{t.args.process_index}.json"), "w") as f:
    json.dump({"seen": seen, "rows": rows, "micro": len(t.seen)}, f)
t.accelerator.end_training()
'''


@pytest.mark.slow
def test_dp2_streaming_trains_every_token_once(tmp_path):
    """DP 2 x GA 2 over gloo (torchrun): the two replicas together train every token of one
    pass exactly once (rows dealt round-robin by Accelerate's IterableDatasetShard)."""
    import json

    sys.path.insert(0, os.path.dirname(__file__))
    from _launch import torchrun

    script = tmp_path / "worker.py"
    script.write_text(_DP2_WORKER)
    torchrun(2, script, os.path.dirname(__file__), tmp_path, timeout=600)
    parts = [json.loads((tmp_path / f"seen{r}.json").read_text()) for r in (0, 1)]
    _ids, total = _samples()
    assert parts[0]["micro"] + parts[1]["micro"] == parts[0]["rows"]
    assert Counter(parts[0]["seen"]) + Counter(parts[1]["seen"]) == Counter(range(total))


def test_streaming_loader_and_column_checks():
    from atac_hf.integrations.data import build_streaming_dataloader, check_dataset_columns, is_streaming_dataset

    ids, total = _samples()
    for kind in ("datasets", "torch"):
        stream = _stream(kind, ids)
        assert is_streaming_dataset(stream)
        loader, packed = build_streaming_dataloader(stream, ATACConfig(**ATAC), grad_accum=2)
        assert isinstance(packed, PackedIterableDataset)
        seen = Counter(x for batch in loader for x in batch["input_ids"].reshape(-1).tolist())
        assert seen == Counter(range(total))
    assert not is_streaming_dataset([{"input_ids": [1]}])
    with pytest.raises(ValueError, match="is an iterable dataset: the WFAP sampler needs a map-style dataset"):
        check_dataset_columns(_stream("torch", ids))
    check_dataset_columns(_stream("torch", ids), streaming=True)  # columns unknown up front: checked per sample

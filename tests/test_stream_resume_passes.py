"""A streaming run resumed from a checkpoint in a later pass of the stream is the uninterrupted run.

The stream is a shuffled ``datasets.IterableDataset`` (two shards, a shuffle buffer), so every
pass has another order (``set_epoch(pass)``): a resume that replayed the first pass's order, or
restarted at a pass start, would show. Every token of the stream is a distinct id, and the
trainer records the ``input_ids`` of every micro-batch. An uninterrupted run of about two and a
half passes checkpoints every step; a fresh trainer resumed from a checkpoint inside the second
pass must train exactly the micro-batches (token for token) and log exactly the losses of the
uninterrupted run after that step. Gradient accumulation 2 in one process; DP 2 x GA 2 over gloo
(torchrun) in the slow test. A checkpoint whose stream state does not match the run (other
``max_tokens``, gradient accumulation, packing strategy) is refused before anything changes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from atac_hf.integrations import ATACConfig
from atac_hf.packing.data.iterable import PackedIterableDataset

sys.path.insert(0, os.path.dirname(__file__))
from _recording import recording_trainer  # noqa: E402

ATAC = dict(cp_size=1, max_tokens=128, cost_preset="default",
            packing_options={"max_defer": 2, "min_fragment": 16, "reference_doc_tokens": 16})
GA = 2
pytestmark = pytest.mark.filterwarnings("ignore:.*longer than max_tokens")


def _samples(seed: int = 5):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(4, 40, 24), [90, 150]])
    rng.shuffle(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return [list(range(int(starts[i]), int(starts[i + 1]))) for i in range(len(lengths))], int(starts[-1])


def _stream(ids):
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": ids}).to_iterable_dataset(num_shards=2)
    return ds.shuffle(seed=7, buffer_size=6)


def _model_config(vocab: int):
    from atac_hf.integrations.demo import tiny_llama_config

    return tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=vocab, max_position_embeddings=256)


def _trainer(out_dir, stream, vocab: int, *, max_steps: int, save: bool = False, atac=None, **args_kw):
    from transformers import AutoModelForCausalLM, TrainingArguments

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_model_config(vocab), dtype=torch.float32)
    saving = {"save_strategy": "steps", "save_steps": 1} if save else {"save_strategy": "no"}
    kw = dict(output_dir=str(out_dir), max_steps=max_steps, learning_rate=3e-3, gradient_accumulation_steps=GA,
              use_cpu=True, report_to=[], seed=3, logging_steps=1, disable_tqdm=True, log_level="error",
              lr_scheduler_type="constant", **saving)
    kw.update(args_kw)
    return recording_trainer(model, TrainingArguments(**kw), stream, ATACConfig(**(atac or ATAC)))


def _losses(trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def _stream_states(run_dir: Path) -> dict[int, dict]:
    out = {}
    for ckpt in run_dir.glob("checkpoint-*"):
        out[int(ckpt.name.split("-")[1])] = json.loads((ckpt / "atac_stream.json").read_text())["stream"]
    return out


def _pass_rows(ids, vocab: int, passes: int, dp: int = 1) -> list[int]:
    """Rows of each pass, packed as the trainer packs them."""
    cfg = ATACConfig(**ATAC)
    cost = cfg.cost_model(_model_config(vocab), dtype_bytes=2)
    packed = PackedIterableDataset(_stream(ids), cfg.packing_config(dp * GA), num_replicas=dp, cost_model=cost)
    return [sum(1 for _ in packed) for _ in range(passes)]


def _kill_step(states: dict[int, dict]) -> int:
    """A checkpoint inside the second pass (rows of it consumed, rows of it left)."""
    inside = sorted(s for s, st in states.items() if st["epoch"] == 1 and st["num_rows"] > 0
                    and (st["pending"] or st["lookahead"] or not st["exhausted"]))
    assert inside, f"no checkpoint inside the second pass: {[(s, st['epoch']) for s, st in sorted(states.items())]}"
    return inside[len(inside) // 2]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    ids, total = _samples()
    rows = _pass_rows(ids, total + 1, 3)
    steps = math.ceil(rows[0] / GA) + math.ceil(rows[1] / GA) + 2  # into the third pass
    run_dir = tmp_path_factory.mktemp("stream_passes") / "full"
    full = _trainer(run_dir, _stream(ids), total + 1, max_steps=steps, save=True)
    full.train()
    return ids, total, rows, run_dir, full


def test_the_passes_differ_and_every_pass_trains_every_token_once(full_run):
    ids, total, rows, run_dir, full = full_run
    assert full.state.global_step == full.args.max_steps
    first, second = full.seen[:rows[0]], full.seen[rows[0]:rows[0] + rows[1]]
    for part in (first, second):
        tokens = sorted(t for _, s in part for t in s)
        assert tokens == list(range(total))
    assert [s for _, s in first] != [s for _, s in second], "set_epoch(pass) must reshuffle the second pass"
    states = _stream_states(run_dir)
    assert {st["epoch"] for st in states.values()} == {0, 1, 2}


def test_resume_inside_the_second_pass_equals_the_uninterrupted_run(full_run, tmp_path):
    ids, total, rows, run_dir, full = full_run
    states = _stream_states(run_dir)
    kill = _kill_step(states)
    resumed = _trainer(tmp_path / "resumed", _stream(ids), total + 1, max_steps=full.args.max_steps)
    resumed.train(resume_from_checkpoint=str(run_dir / f"checkpoint-{kill}"))
    want = [(step, s) for step, s in full.seen if step >= kill]
    assert len(want) > 2 * GA and resumed.seen[0][0] == kill
    assert resumed.seen == want, "the resumed run trains other micro-batches than the uninterrupted one"
    before, history = _losses(full), _losses(resumed)  # the resumed history starts with the checkpoint's
    assert {s: v for s, v in history.items() if s <= kill} == {s: v for s, v in before.items() if s <= kill}
    after = {s: v for s, v in history.items() if s > kill}
    assert sorted(after) == [s for s in sorted(before) if s > kill]
    assert [after[s] for s in sorted(after)] == [before[s] for s in sorted(after)]
    assert resumed.args.ignore_data_skip is False  # put back after the resumed train()
    print(f"\nresume at step {kill} (pass 2, row {states[kill]['num_rows']} of {rows[1]}): losses "
          + ", ".join(f"{s}: {before[s]:.6f} / {after[s]:.6f}" for s in sorted(after)))


def test_resume_at_the_end_of_a_pass_goes_on_with_the_next_pass(full_run, tmp_path):
    """A checkpoint whose pass has nothing left: the resumed run starts the next pass, as the
    uninterrupted run did (not an empty epoch that stops training)."""
    ids, total, rows, run_dir, full = full_run
    states = _stream_states(run_dir)
    ends = [s for s, st in sorted(states.items()) if st["exhausted"] and not st["pending"] and not st["lookahead"]
            and s < full.args.max_steps]
    if not ends:
        pytest.skip("no checkpoint at the end of a pass with these lengths")
    kill = ends[0]
    resumed = _trainer(tmp_path / "resumed", _stream(ids), total + 1, max_steps=full.args.max_steps)
    resumed.train(resume_from_checkpoint=str(run_dir / f"checkpoint-{kill}"))
    assert resumed.seen == [(step, s) for step, s in full.seen if step >= kill]


def test_a_checkpoint_without_stream_state_warns_and_is_not_exact(full_run, tmp_path):
    """The case that still cannot be exact: no ``atac_stream.json`` (an earlier atac-hf). Trainer
    replays the stream from its first pass, so a checkpoint in the second pass diverges."""
    import shutil

    ids, total, rows, run_dir, full = full_run
    kill = _kill_step(_stream_states(run_dir))
    ckpt = tmp_path / f"checkpoint-{kill}"
    shutil.copytree(run_dir / f"checkpoint-{kill}", ckpt)
    (ckpt / "atac_stream.json").unlink()
    resumed = _trainer(tmp_path / "resumed", _stream(ids), total + 1, max_steps=kill + 1)
    with pytest.warns(UserWarning, match=r"atac_stream.json not found .*exact inside the stream's first pass only"):
        resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.seen != [(step, s) for step, s in full.seen if kill <= step < kill + 1]


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("change, match", [
    ({"atac": {**ATAC, "max_tokens": 96}},
     r"saved with max_tokens=128, this run has max_tokens=96; it resumes only with max_tokens=128: .*"
     r"ATACConfig\(max_tokens=128\) \(or ATAC_MAX_TOKENS=128\)"),
    ({"gradient_accumulation_steps": 1},
     r"saved with gradient_accumulation_steps=2, this run has gradient_accumulation_steps=1; .*"
     r"TrainingArguments\(gradient_accumulation_steps=2\)"),
    ({"atac": {**ATAC, "packing_strategy": "bfd"}},
     r"different settings: config\.strategy saved 'wfap', here 'bfd'"),
])
def test_a_mismatched_stream_state_is_refused_and_changes_nothing(full_run, tmp_path, change, match):
    ids, total, rows, run_dir, full = full_run
    kill = _kill_step(_stream_states(run_dir))
    ckpt = run_dir / f"checkpoint-{kill}"
    digest = _digest(ckpt)
    change = dict(change)  # (a copy: pytest shares the parameter between runs in one process, as mutmut makes)
    atac = change.pop("atac", None)
    t = _trainer(tmp_path / "refused", _stream(ids), total + 1, max_steps=full.args.max_steps, atac=atac, **change)
    weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    with pytest.raises(ValueError, match=match) as err:
        t.train(resume_from_checkpoint=str(ckpt))
    assert "atac_stream.json" in str(err.value)
    assert t.seen == [] and t.state.global_step == 0 and t.atac_stream is None
    assert all(torch.equal(v, weights[k]) for k, v in t.model.state_dict().items()), "weights were loaded"
    assert t.args.ignore_data_skip is False
    assert _digest(ckpt) == digest


def test_stream_state_in_a_later_pass_resumes_a_shuffled_source_exactly():
    """PackedIterableDataset alone: states taken anywhere in passes 1 and 2 of a reshuffled
    ``datasets`` stream resume to the same rows (``set_epoch``, no ``skip`` in a later epoch)."""
    ids, total = _samples()
    cfg = ATACConfig(**ATAC).packing_config(2)

    def rows_of(ds):
        return [r["input_ids"] for r in ds]

    ref = PackedIterableDataset(_stream(ids), cfg)
    passes = [rows_of(ref) for _ in range(5)]
    assert passes[0] != passes[1] != passes[2]
    for epoch in (1, 2):
        for cut in range(0, len(passes[epoch]) + 1, 2):
            ds = PackedIterableDataset(_stream(ids), cfg)
            for _ in range(epoch):
                rows_of(ds)
            it = iter(ds)
            head = [next(it)["input_ids"] for _ in range(cut)]
            state = json.loads(json.dumps(ds.state_dict()))
            # before its first row a pass has not started: the state is the end of the one before
            assert (state["epoch"], state["num_rows"]) == ((epoch, cut) if cut else (epoch - 1, len(passes[epoch - 1])))
            twin = PackedIterableDataset(_stream(ids), cfg)
            twin.load_state_dict(state, roll_over=True)
            rest = rows_of(twin)
            if cut == 0:
                assert rest == passes[epoch]
            elif cut == len(passes[epoch]):  # nothing left of this pass: roll_over goes on with the next
                assert rest == passes[epoch + 1]
                assert rows_of(twin) == passes[epoch + 2]
            else:
                assert head + rest == passes[epoch]
                assert rows_of(twin) == passes[epoch + 1]


_DP2_WORKER = r'''
import json, math, os, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import test_stream_resume_passes as T
out = Path(sys.argv[2])
ids, total = T._samples()
rows = T._pass_rows(ids, total + 1, 2, dp=2)
steps = math.ceil(rows[0] / 2 / T.GA) + math.ceil(rows[1] / 2 / T.GA) + 1
full = T._trainer(out / "full", T._stream(ids), total + 1, max_steps=steps, save=True)
full.train()
full.accelerator.wait_for_everyone()
kill = T._kill_step(T._stream_states(out / "full"))
resumed = T._trainer(out / "resumed", T._stream(ids), total + 1, max_steps=steps)
resumed.train(resume_from_checkpoint=str(out / "full" / f"checkpoint-{kill}"))
rank = full.args.process_index
with open(out / f"rank{rank}.json", "w") as f:
    json.dump({"kill": kill, "rows": rows, "full": full.seen, "resumed": resumed.seen,
               "full_loss": T._losses(full), "resumed_loss": T._losses(resumed)}, f)
resumed.accelerator.end_training()
'''


@pytest.mark.slow
def test_dp2_resume_inside_the_second_pass_equals_the_uninterrupted_run(tmp_path):
    """DP 2 x GA 2 over gloo (torchrun): the saved position is the global one (micro-batches x
    DP), and each replica's resumed micro-batches and the losses equal the uninterrupted run's."""
    sys.path.insert(0, os.path.dirname(__file__))
    from _launch import torchrun

    script = tmp_path / "worker.py"
    script.write_text(_DP2_WORKER)
    torchrun(2, script, os.path.dirname(__file__), tmp_path, timeout=600)
    parts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    _ids, total = _samples()
    kill = parts[0]["kill"]
    for r, part in enumerate(parts):
        want = [s for s in part["full"] if s[0] >= kill]
        assert len(want) >= GA and part["resumed"] == want, f"rank {r}: other micro-batches after the resume"
        after = {s: v for s, v in part["resumed_loss"].items() if int(s) > kill}
        assert after and all(after[s] == part["full_loss"][s] for s in after), f"rank {r}: other losses"
    first, second = parts[0]["rows"][0] // 2, parts[0]["rows"][1] // 2  # micro-batches of a replica per pass
    tokens = [t for part in parts for _, s in part["full"][first:first + second] for t in s]
    assert sorted(tokens) == list(range(total)), "the replicas together train the second pass once"

"""Forty-fourth mutation pass: survivors of mutmut and hand-planted mutants in what came after the forty-third: token
ids and labels widened to int64 (``attention/ids.py`` and its call sites in ``shard_batch`` and the sharder),
fixed-length token columns (``_variable_lists``, ``_features``), ``pack_dataset``'s widened null-filled columns
(``_widened``, the casts and list types of ``_build_batches``), a dataset in ``"arrow"`` format read by
``SpanDataset``, and the layout a map-style resume keeps (``atac_sampler.json``: ``stream_state`` and the resume path
of ``ATACTrainer``).

Killed here, in process: ``as_long_ids`` widening only integer id entries (not masks, float labels, other
entries); ``pack_dataset`` widening only null-filled non-mask columns of another type than ``input_ids``, a null mask
row filled with ones of the mask's own type, a fixed-length-1 column packed into rows of any length;
``SpanDataset.__getitems__`` reading an int index as ``__getitem__`` does and naming a bad sample's span; the
checkpoint's sampler (its seed and epoch, not this run's) behind the train loader of a resume, a second loader of the
same ``train()`` call getting the checkpoint's state afresh, ``train()`` forgetting it after the call, a resume without
a train set left to Trainer, prepared loaders; the position ``atac_sampler.json`` saves (GA and the rounded-up steps
of an epoch, 0 at an epoch end, nothing written into a missing folder); the refusals' and the warning's full text and
where the warning points (the caller of ``train()``; not checked under mutmut, whose trampoline adds frames).
"""

from __future__ import annotations

import json
import os
import tempfile

import datasets
import pytest
import torch
from datasets import Features, Sequence, Value
from test_mutants_pass24_sampler import BatchSource
from test_resume_layout import _trainer

from atac_hf import pack_dataset


# ---------------------------------------------------------------------------- pack_dataset: null masks
def test_a_null_mask_row_is_filled_with_ones_of_the_masks_type():
    ds = datasets.Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "attention_mask": [[1, 1, 1], None, [1, 1, 1, 1]]},
        features=Features({"input_ids": Sequence(Value("int32")), "attention_mask": Sequence(Value("int64"))}))
    packed = pack_dataset(ds, max_tokens=16, shuffle=False, progress=False)
    assert packed.features["attention_mask"].feature.dtype == "int64"
    assert packed["attention_mask"] == [[1] * 9] and packed["input_ids"] == [list(range(1, 10))]


# ---------------------------------------------------------------------------- ATACTrainer: the map-style resume
def _saved_state(tmp_path, *, seed, epoch):
    """A checkpoint folder holding only ``atac_sampler.json``: the sampler of a run with ``data_seed=seed``, one step
    into ``epoch`` (written by ``_atac_save_sampler_state``), and that run's sampler (at the saved epoch)."""
    a = _trainer(str(tmp_path / "a"), data_seed=seed)
    a.get_train_dataloader()
    a.atac_sampler.set_epoch(epoch)
    ckpt = tmp_path / "checkpoint-x"
    ckpt.mkdir()
    a._atac_save_sampler_state(str(ckpt))
    return str(ckpt), a.atac_sampler


def _batches(sampler):
    sampler.set_epoch(sampler.epoch)
    return [list(b) for b in sampler]


def test_the_resumed_loader_has_the_checkpoints_seed_and_epoch_and_a_second_loader_too(tmp_path):
    ckpt, saved = _saved_state(tmp_path, seed=7, epoch=1)
    with open(os.path.join(ckpt, "atac_sampler.json")) as f:
        state = json.load(f)
    assert {k: state[k] for k in ("seed", "epoch", "position")} == {"seed": 7, "epoch": 1, "position": 0}
    b = _trainer(str(tmp_path / "b"), data_seed=3)
    b._atac_sampler_check_resume(ckpt)
    b.get_train_dataloader()
    first = b.atac_sampler
    assert (first.seed, first.epoch) == (7, 1)
    want = _batches(saved)
    assert _batches(first) == want
    first.set_epoch(2)  # the first loader ran on (auto_find_batch_size builds the loader again)
    b.get_train_dataloader()
    again = b.atac_sampler
    assert again is not first and (again.seed, again.epoch) == (7, 1)
    assert _batches(again) == want


# ---------------------------------------------------------------------------- pack_dataset: which columns widen
def test_only_null_filled_columns_of_another_type_than_the_ids_are_widened():
    # labels of the ids' own type (int32) with a null row keep it; a mask (int8, null rows too) keeps its own
    ds = datasets.Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "labels": [[1, 2, 3], None, [-100, 7, 8, 9]],
         "attention_mask": [[1, 1, 1], None, [1, 1, 1, 1]]},
        features=Features({"input_ids": Sequence(Value("int32")), "labels": Sequence(Value("int32")),
                           "attention_mask": Sequence(Value("int8"))}))
    packed = pack_dataset(ds, max_tokens=16, shuffle=False, progress=False)
    assert {c: packed.features[c].feature.dtype for c in ("input_ids", "labels", "attention_mask")} == \
        {"input_ids": "int32", "labels": "int32", "attention_mask": "int8"}
    assert packed["labels"] == [[1, 2, 3, 4, 5, -100, 7, 8, 9]] and packed["attention_mask"] == [[1] * 9]


def test_labels_of_another_type_without_nulls_keep_their_type():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]], "labels": [[1, 2, 3], [-100, 5]]},
                                    features=Features({"input_ids": Sequence(Value("int32")),
                                                       "labels": Sequence(Value("int16"))}))
    packed = pack_dataset(ds, max_tokens=8, shuffle=False, progress=False)
    assert packed.features["labels"].feature.dtype == "int16" and packed["labels"] == [[1, 2, 3, -100, 5]]


def test_a_fixed_length_1_column_packs_into_rows_of_any_length():
    ids = [[i] for i in range(1, 9)]
    fixed = datasets.Dataset.from_dict({"input_ids": ids}, features=Features(
        {"input_ids": Sequence(Value("int64"), length=1)}))
    packed = pack_dataset(fixed, max_tokens=4, shuffle=False, progress=False)
    assert packed.features["input_ids"] == Sequence(Value("int64"))
    assert sorted(t for row in packed["input_ids"] for t in row) == list(range(1, 9))
    assert max(len(row) for row in packed["input_ids"]) == 4


# ---------------------------------------------------------------------------- ATACTrainer: loaders, train()'s reset
def test_the_train_and_eval_loaders_are_accelerates_prepared_ones(tmp_path):
    from accelerate.data_loader import DataLoaderShard

    t = _trainer(str(tmp_path / "a"))
    assert isinstance(t.get_train_dataloader(), DataLoaderShard)
    assert isinstance(t.get_eval_dataloader(t.train_dataset), DataLoaderShard)


@pytest.fixture
def no_trainer_loop(monkeypatch):
    """``Trainer.train`` as a stub: ``ATACTrainer.train`` runs its resume checks and its ``finally`` only."""
    import transformers

    monkeypatch.setattr(transformers.Trainer, "train", lambda self, *a, **k: "trained")


def test_train_forgets_the_resumes_sampler_after_the_call(tmp_path, no_trainer_loop):
    ckpt, _ = _saved_state(tmp_path, seed=7, epoch=1)
    b = _trainer(str(tmp_path / "b"), data_seed=3)
    assert b.train(resume_from_checkpoint=ckpt) == "trained"
    b.get_train_dataloader()  # a later train() without resume: this run's seed, from epoch 0
    assert (b.atac_sampler.seed, b.atac_sampler.epoch) == (3, 0)


def test_a_resume_without_a_train_dataset_is_left_to_trainer(tmp_path, no_trainer_loop):
    ckpt, _ = _saved_state(tmp_path, seed=7, epoch=1)
    b = _trainer(str(tmp_path / "b"))
    b.train_dataset = None
    assert b.train(resume_from_checkpoint=ckpt) == "trained"  # Trainer refuses it ("requires a train_dataset")


# ---------------------------------------------------------------------------- atac_sampler.json
def _save_at(t, step):
    out = tempfile.mkdtemp(dir=t.args.output_dir)
    t.state.global_step = step
    t._atac_save_sampler_state(out)
    with open(os.path.join(out, "atac_sampler.json")) as f:
        return json.load(f)


def test_the_saved_position_counts_the_packs_of_this_epoch_the_steps_consumed(tmp_path):
    t = _trainer(str(tmp_path / "a"), ga=2)
    t.get_train_dataloader()
    n = len(t.atac_sampler)  # packs an epoch (one replica); Trainer makes ceil(n / 2) steps of it
    assert n == 32
    assert [_save_at(t, s)["position"] for s in (0, 1, 5, 15, 16, 17, 21)] == [0, 2, 10, 30, 0, 2, 10]
    assert not os.path.exists(os.path.join(t.args.output_dir, "nowhere"))
    t._atac_save_sampler_state(os.path.join(t.args.output_dir, "nowhere"))  # no such folder: nothing written
    assert not os.path.exists(os.path.join(t.args.output_dir, "nowhere"))


def test_at_every_epoch_end_of_a_one_step_epoch_the_saved_position_is_0(tmp_path):
    from _integration_worker import dataset

    t = _trainer(str(tmp_path / "a"), data=dataset(2, seed=1))
    t.get_train_dataloader()
    assert len(t.atac_sampler) == 1
    assert [_save_at(t, s)["position"] for s in (1, 2, 3)] == [0, 0, 0]


def _sampler_state_file(tmp_path, text):
    ckpt = tmp_path / "checkpoint-y"
    ckpt.mkdir()
    if text is not None:
        (ckpt / "atac_sampler.json").write_text(text)
    return str(ckpt)


def test_a_checkpoint_without_a_sampler_state_resumes_with_a_fresh_sampler_and_says_so(tmp_path, no_trainer_loop):
    import atac_hf.integrations.stream_state as stream_state

    ckpt = _sampler_state_file(tmp_path, None)
    b = _trainer(str(tmp_path / "b"))
    with pytest.warns(UserWarning, match=r"checkpoint-y/atac_sampler\.json not found \(a checkpoint of an earlier "
                                         r"atac-hf, or the file removed\): resuming with a fresh WFAP sampler, whose "
                                         r"packs match the checkpoint's only with the same dataset, seed, max_tokens, "
                                         r"DP size and gradient accumulation, none of which can be checked$") as got:
        assert b.train(resume_from_checkpoint=ckpt) == "trained"
    [w] = [w for w in got if "not found" in str(w.message)]
    if not hasattr(stream_state, "_mutmut_mutated"):  # (mutmut's trampoline adds frames: stacklevel reads them)
        assert w.filename == __file__  # stacklevel: the caller of train()


def test_a_sampler_state_not_a_json_object_is_refused_naming_it(tmp_path):
    b = _trainer(str(tmp_path / "b"))
    ckpt = _sampler_state_file(tmp_path, "[1, 2]")
    with pytest.raises(ValueError, match=r"^.*checkpoint-y/atac_sampler\.json: not a WFAPBatchSampler state \(a JSON "
                                         r"object\); resume from a checkpoint ATACTrainer saved$"):
        b._atac_sampler_check_resume(ckpt)


def test_a_sampler_state_of_other_data_is_refused_with_the_whole_advice(tmp_path):
    ckpt, _ = _saved_state(tmp_path, seed=7, epoch=1)
    with open(os.path.join(ckpt, "atac_sampler.json")) as f:
        state = json.load(f)
    state["fingerprint"] = "0" * len(state["fingerprint"])
    with open(os.path.join(ckpt, "atac_sampler.json"), "w") as f:
        json.dump(state, f)
    b = _trainer(str(tmp_path / "b"))
    with pytest.raises(ValueError, match=r"\. Resume with the train_dataset, ATACConfig and model \(its cost model\) "
                                         r"of the checkpoint's run, or pass TrainingArguments\(ignore_data_skip=True\) "
                                         r"to start the checkpoint's epoch over with this run's packs$"):
        b._atac_sampler_check_resume(ckpt)


# ---------------------------------------------------------------------------- the layout and the stream state's form
_FORMAT = "atac-hf/trainer-stream/v1"


def _layout(t, **change):
    return {"max_tokens": int(t.atac_config.max_tokens), "dp_size": 1, "gradient_accumulation_steps":
            int(t.args.gradient_accumulation_steps), **change}


def test_a_stream_state_not_of_atactrainer_is_refused(tmp_path):
    t = _trainer(str(tmp_path / "a"))
    msg = (r"^P: not an ATACTrainer stream state \(expected format 'atac-hf/trainer-stream/v1' with a 'stream' "
           r"mapping\); resume from a checkpoint ATACTrainer saved$")
    t._atac_stream_check_settings({"format": _FORMAT, "stream": {}, **_layout(t)}, "P")  # the form passes
    for saved in ([], "x", {"format": "other", "stream": {}, **_layout(t)},
                  {"format": _FORMAT, "stream": [1], **_layout(t)}, {"format": _FORMAT, **_layout(t)}):
        with pytest.raises(ValueError, match=msg):
            t._atac_stream_check_settings(saved, "P")


def test_a_stream_state_without_a_layout_setting_is_refused_naming_the_stream_state(tmp_path):
    t = _trainer(str(tmp_path / "a"))
    for key in ("max_tokens", "dp_size", "gradient_accumulation_steps"):
        saved = {"format": _FORMAT, "stream": {}, **_layout(t)}
        del saved[key]
        with pytest.raises(ValueError, match=rf"^P: the stream state was saved with {key}=None, this run has {key}="):
            t._atac_stream_check_settings(saved, "P")
    with pytest.raises(ValueError, match=r"^P: the stream state was saved with max_tokens=1, this run has max_tokens"):
        t._atac_stream_check_settings({"format": _FORMAT, "stream": {}, **_layout(t, max_tokens=1)}, "P")


def test_the_layout_refusals_name_the_tp_size_and_the_window_rule(tmp_path):
    t = _trainer(str(tmp_path / "a"))
    t.atac_tp_size = 2  # (the world size the message asks for: dp x cp x tp)
    with pytest.raises(ValueError, match=r"launch world_size = dp_size x cp_size x tp_size = 4 x 1 x 2 processes "
                                         r"to resume"):
        t._atac_check_layout(_layout(t, dp_size=4), "P", "W")
    with pytest.raises(ValueError, match=r"^P: the W was saved with gradient_accumulation_steps=3, this run has "
                                         r"gradient_accumulation_steps=1; it resumes only with "
                                         r"gradient_accumulation_steps=3: a window holds a multiple of dp_size x "
                                         r"gradient_accumulation_steps packs, and Trainer skips that many a step: set "
                                         r"TrainingArguments\(gradient_accumulation_steps=3\) to resume from this "
                                         r"checkpoint, or pass TrainingArguments\(ignore_data_skip=True\) to skip no "
                                         r"data \(the data order starts over\), or train without "
                                         r"resume_from_checkpoint$"):
        t._atac_check_layout(_layout(t, gradient_accumulation_steps=3), "P", "W")


# ---------------------------------------------------------------------------- as_long_ids: which entries widen
def test_only_integer_id_entries_are_widened():
    from atac_hf.attention.ids import as_long_ids

    mask, pix, labels = torch.ones(1, 4, dtype=torch.int8), torch.rand(1, 4), torch.rand(1, 4)
    out = as_long_ids({"input_ids": torch.arange(4, dtype=torch.uint8)[None], "attention_mask": mask,
                       "pixel_values": pix, "labels": labels, "meta": "x", "seq_lengths": [4]})
    assert out["input_ids"].dtype == torch.int64 and out["input_ids"].tolist() == [[0, 1, 2, 3]]
    assert out["attention_mask"] is mask and out["pixel_values"] is pix  # not id entries
    assert out["labels"] is labels  # float labels: left for the refusal that names them
    assert out["meta"] == "x" and out["seq_lengths"] == [4]


# ---------------------------------------------------------------------------- SpanDataset.__getitems__
def test_getitems_of_a_plain_list_reads_as_getitem_does():
    from atac_hf.packing.data.sampler import SpanDataset

    rows = [{"input_ids": [1, 2, 3], "labels": None, "meta": "a"}, {"input_ids": [4, 5, 6, 7], "labels": [4, 5, 6, 7]}]
    ds = SpanDataset(rows)
    keys = [0, (1, 1, 3), 1]
    assert ds.__getitems__(keys) == [ds[k] for k in keys]
    assert ds.__getitems__([0])[0] == rows[0]  # an int index: the sample unchanged


def test_getitems_of_a_batch_reader_names_the_span_of_a_bad_sample():
    from atac_hf.packing.data.sampler import SpanDataset

    ds = SpanDataset(BatchSource([{"input_ids": [1, 2, 3]}, {"labels": [1, 2]}]))
    assert ds.__getitems__([(0, 1, 3), 0]) == [{"input_ids": [2, 3]}, {"input_ids": [1, 2, 3]}]
    with pytest.raises(ValueError, match=r"^SpanDataset\[\(1, 0, 2\)\]: the sample has no 'input_ids' column"):
        ds.__getitems__([(0, 0, 1), (1, 0, 2)])

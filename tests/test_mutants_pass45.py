"""Forty-fifth mutation pass: survivors of mutmut and hand-planted mutants in what red-team 34 and its review added:
``ATACAccelerator``'s resume layout (``accelerate_resume.py``: ``save_state`` writing ``atac_layout.json``,
``load_state`` reading it, ``skip_first_batches`` refusing another layout), ``stream_state``'s shared readers
(``read_json``, ``layout_mismatch``, ``launch_hint``, ``_global_step``), the ``epoch_start_offset`` lineage refusal,
``_atac_stream_end_train``, the stream-state read of ``_atac_stream_check_resume`` and the sampler's fingerprint
message.

Killed here, in process: the warnings and refusals of ``_atac_stream_check_resume`` in full (a DataLoader worker, a
missing or unreadable stream state, rows not a multiple of the DP size); ``_global_step`` on a trainer state that is
not a JSON object; the mixin's ``skip_first_batches``, ``save_state`` and ``load_state`` over a stand-in for
``Accelerator`` (no mesh, no model): which loaders are checked, the whole refusal per setting (the launch hint at this
CP and TP size), the arguments passed on to Accelerate, the main process alone writing the file, a loaded layout
that is not a JSON object, automatic checkpoint naming (the latest ``checkpoint_<n>`` by number, a project without
checkpoints); ``layout_mismatch``'s first differing key and ``missing_ok``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.dirname(__file__))
pytestmark = pytest.mark.filterwarnings("ignore:.*longer than max_tokens")


# ---------------------------------------------------------------------------- _atac_stream_check_resume
def _stream_trainer(tmp_path, **args):
    from test_stream_resume_passes import _samples, _stream, _trainer

    ids, total = _samples()
    return _trainer(tmp_path / "out", _stream(ids), total + 1, max_steps=4, **args)


def _stream_checkpoint(t, tmp_path, rows: int, text: str | None = None) -> str:
    """A checkpoint folder holding ``atac_stream.json``: ``t``'s layout and stream after ``rows`` rows (or ``text``)."""
    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    if text is None:
        _loader, packed = t._atac_stream_build(t.train_dataset)
        it = iter(packed)
        for _ in range(rows):
            next(it)
        state = {"format": "atac-hf/trainer-stream/v1", **t._atac_layout(), "cp_size": 1,
                 "stream": packed.state_dict(num_rows=rows)}
        text = json.dumps(state)
    (ckpt / "atac_stream.json").write_text(text)
    return str(ckpt)


def test_a_stream_state_of_an_odd_row_count_resumes_at_dp_1(tmp_path):
    """_atac_stream_check_resume 52 (``max(dp_size, 2)``)."""
    t = _stream_trainer(tmp_path)
    t._atac_stream_check_resume(_stream_checkpoint(t, tmp_path, 3))
    assert t._atac_stream_restored[1].num_rows == 3


def test_rows_not_a_multiple_of_the_dp_size_are_refused_in_full(tmp_path):
    """_atac_stream_check_resume 53-55 (the refusal's text)."""
    t = _stream_trainer(tmp_path)
    t.dp_size = 2  # (one process: the stream is dealt to 2 replicas all the same)
    ckpt = _stream_checkpoint(t, tmp_path, 3)
    with pytest.raises(ValueError) as err:
        t._atac_stream_check_resume(ckpt)
    assert str(err.value) == (f"{ckpt}/atac_stream.json: 3 rows consumed is not a multiple of dp_size=2 (a truncated "
                              "or edited checkpoint?)")
    assert t._atac_stream_restored is None


def test_a_dataloader_worker_warns_in_full_and_reads_nothing(tmp_path):
    """_atac_stream_check_resume 7 (``num_workers > 1``), 8-15 (the warning's text)."""
    t = _stream_trainer(tmp_path)
    t.args.dataloader_num_workers = 1
    ckpt = _stream_checkpoint(t, tmp_path, 0, text="{not json")  # not read: a worker's stream has no position
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        t._atac_stream_check_resume(ckpt)
    assert [str(w.message) for w in got] == [
        "resuming a streaming run: dataloader_num_workers=1: the stream is packed in the DataLoader worker, whose "
        "position a checkpoint cannot hold, so Trainer replays the stream up to the checkpoint, which is exact inside "
        "the stream's first pass only (from a later pass the run restarts at a pass start); set "
        "dataloader_num_workers=0 to save and resume the stream's position exactly"]
    assert t._atac_stream_restored is None


def test_a_missing_stream_state_warns_in_full(tmp_path):
    """_atac_stream_check_resume 20, 24, 25 (the warning's text)."""
    t = _stream_trainer(tmp_path)
    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        t._atac_stream_check_resume(str(ckpt))
    assert [str(w.message) for w in got] == [
        f"resuming a streaming run: {ckpt}/atac_stream.json not found (a checkpoint saved by an earlier atac-hf, or "
        "with dataloader_num_workers=1): Trainer replays the stream up to the checkpoint, which is exact inside the "
        "stream's first pass only (from a later pass the run restarts at a pass start); checkpoints saved with "
        "dataloader_num_workers=0 resume exactly in any pass"]


def test_an_unreadable_stream_state_is_refused_naming_a_stream_state(tmp_path):
    """_atac_stream_check_resume 28, 31, 32 (``read_json``'s ``what``)."""
    t = _stream_trainer(tmp_path)
    ckpt = _stream_checkpoint(t, tmp_path, 0, text="{not json")
    with pytest.raises(ValueError, match=r"^.*checkpoint-3/atac_stream\.json: not a readable stream state \(Expecting "
                                         r"property name .*\); resume from an intact checkpoint$"):
        t._atac_stream_check_resume(ckpt)


# ---------------------------------------------------------------------------- _global_step
def test_the_global_step_of_a_trainer_state_not_a_json_object_is_none(tmp_path):
    """_global_step 16 (``isinstance(state, dict) or True``), 21 (``isinstance(step, int) or True``)."""
    from atac_hf.integrations.stream_state import _global_step

    (tmp_path / "trainer_state.json").write_text("[4]")
    assert _global_step(str(tmp_path)) is None
    (tmp_path / "trainer_state.json").write_text('{"global_step": 4}')
    assert _global_step(str(tmp_path)) == 4
    (tmp_path / "trainer_state.json").write_text('{"global_step": "4"}')  # (not an int: not a step)
    assert _global_step(str(tmp_path)) is None


# ---------------------------------------------------------------------------- ATACAccelerator's resume layout
class _Accelerate:
    """Stand-in for the three ``Accelerator`` methods ``LayoutResumeMixin`` wraps (it records what it was passed)."""

    def save_state(self, output_dir=None, *args, **kwargs):
        self.calls.append(("save_state", output_dir, args, kwargs))
        return self.location

    def load_state(self, input_dir=None, *args, **kwargs):
        self.calls.append(("load_state", input_dir, args, kwargs))
        return "loaded"

    def skip_first_batches(self, dataloader, num_batches=0):
        return "skipped", dataloader, num_batches


def _acc(tmp_path, *, max_tokens=256, dp=1, ga=1, cp=1, tp=1, main=True, auto=False):
    from atac_hf.integrations.accelerate_resume import LayoutResumeMixin

    class Acc(LayoutResumeMixin, _Accelerate):
        pass

    a = Acc()
    a.atac_config = SimpleNamespace(max_tokens=max_tokens, cp_size=cp)
    a.dp_size, a.gradient_accumulation_steps, a.tp_size, a.is_main_process = dp, ga, tp, main
    a.project_configuration, a.project_dir = SimpleNamespace(automatic_checkpoint_naming=auto), str(tmp_path)
    a.calls, a.location = [], None
    return a


def _packed(wrapped: bool = False):
    """A loader of a WFAP sampler (``wrapped``: inside a ``BatchSamplerShard``-like ``batch_sampler``)."""
    from atac_hf.packing.data.sampler import WFAPBatchSampler

    sampler = WFAPBatchSampler.__new__(WFAPBatchSampler)
    return SimpleNamespace(batch_sampler=SimpleNamespace(batch_sampler=sampler) if wrapped else sampler)


def _layout_dir(tmp_path, layout, name="ck") -> str:
    ck = tmp_path / name
    ck.mkdir(parents=True)
    (ck / "atac_layout.json").write_text(layout if isinstance(layout, str) else json.dumps(layout))
    return str(ck)


_SAVED = {"max_tokens": 256, "dp_size": 2, "gradient_accumulation_steps": 4}


def test_a_skip_without_load_state_is_accelerates_with_its_arguments(tmp_path):
    """skip_first_batches 1 (``num_batches=1`` by default), 7 (``getattr`` without a default: no ``load_state``)."""
    a = _acc(tmp_path)
    loader = _packed()
    assert a.skip_first_batches(loader, 3) == ("skipped", loader, 3)
    assert a.skip_first_batches(loader) == ("skipped", loader, 0)  # Accelerate's default: nothing skipped
    a.load_state(_layout_dir(tmp_path, _SAVED))
    assert a.skip_first_batches(loader) == ("skipped", loader, 0)  # another layout, nothing skipped: not refused


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("here, key, fix", [
    (dict(max_tokens=512, dp=2, ga=4), "max_tokens", "256 (ATACConfig(max_tokens=256))"),
    (dict(dp=3, ga=4, cp=2, tp=3), "dp_size", "2 (launch world_size = dp_size x cp_size x tp_size = 2 x 2 x 3 "
                                              "processes)"),
    (dict(dp=2, ga=1), "gradient_accumulation_steps", "4 (ATACAccelerator(gradient_accumulation_steps=4))"),
])
def test_a_skip_in_another_layout_is_refused_in_full(tmp_path, wrapped, here, key, fix):
    """skip_first_batches 19, 25, 26 (the sampler inside a ``BatchSamplerShard``), 32, 38, 39 (the TP size), 44, 47-50
    (the fix of each setting); hand-planted: ``launch_hint(tp, cp)``."""
    a = _acc(tmp_path, **here)
    ck = _layout_dir(tmp_path, _SAVED)
    assert a.load_state(ck) == "loaded"
    v = {"max_tokens": 512, "dp_size": 3, "gradient_accumulation_steps": 1}[key]
    with pytest.raises(ValueError) as err:
        a.skip_first_batches(_packed(wrapped), 5)
    assert str(err.value) == (
        f"skip_first_batches(5): {ck}/atac_layout.json was saved with {key}={_SAVED[key]}, this run has {key}={v}: "
        "the epoch's packs are planned and dealt for the checkpoint's layout, so skipping 5 batches of this one would "
        f"train some samples twice and others never. Resume with {key}={fix}, or start the epoch over without "
        "skip_first_batches")


def test_a_skip_of_the_checkpoints_layout_or_of_none_or_of_a_plain_loader_passes(tmp_path):
    """skip_first_batches 60, 63, 64 (``missing_ok`` off: a setting the file lacks refused)."""
    a = _acc(tmp_path, dp=2, ga=4)
    a.load_state(_layout_dir(tmp_path, {"max_tokens": 256, "dp_size": 2}))
    loader = _packed()
    assert a.skip_first_batches(loader, 2) == ("skipped", loader, 2)
    a.dp_size = 3  # another layout from here on
    plain = SimpleNamespace(batch_sampler=None)
    assert a.skip_first_batches(plain, 2) == ("skipped", plain, 2)  # not packed: not checked
    assert a.skip_first_batches(loader, 0) == ("skipped", loader, 0)  # nothing skipped: nothing to refuse
    with pytest.raises(ValueError, match=r"saved with dp_size=2, this run has dp_size=3"):
        a.skip_first_batches(loader, 2)


def test_a_layout_file_not_a_json_object_checks_nothing(tmp_path):
    """load_state 28 (``isinstance(saved, dict) or True``)."""
    a = _acc(tmp_path, max_tokens=512)
    ck = _layout_dir(tmp_path, "[256, 2, 4]")
    a.load_state(ck)
    assert a._atac_loaded_layout == (f"{ck}/atac_layout.json", {})
    loader = _packed()
    assert a.skip_first_batches(loader, 2) == ("skipped", loader, 2)


def test_an_unreadable_layout_file_is_refused_naming_a_layout(tmp_path):
    """load_state 21, 24, 25 (``read_json``'s ``what``). Red-team 36: the refusal came after Accelerate had loaded
    the checkpoint's weights (and reset the layout an earlier load_state had kept); now before anything changes."""
    a = _acc(tmp_path)
    good = _layout_dir(tmp_path, _SAVED, name="good")
    a.load_state(good)
    kept, calls = a._atac_loaded_layout, list(a.calls)
    ck = _layout_dir(tmp_path, "{not json")
    with pytest.raises(ValueError, match=r"^.*/ck/atac_layout\.json: not a readable layout \(Expecting property name "
                                         r".*\); resume from an intact checkpoint$"):
        a.load_state(ck)
    assert a.calls == calls and a._atac_loaded_layout == kept


def test_load_state_passes_its_arguments_on_and_a_later_load_without_the_file_forgets_the_layout(tmp_path):
    """load_state 1, 4, 5 (what Accelerate is passed and returns); hand-planted: the layout of an earlier
    ``load_state`` kept where the later checkpoint has none."""
    a = _acc(tmp_path)
    ck = _layout_dir(tmp_path, _SAVED)
    assert a.load_state(ck, {"strict": False}, map_location="cpu") == "loaded"
    assert a.calls == [("load_state", ck, ({"strict": False},), {"map_location": "cpu"})]
    (tmp_path / "other").mkdir()
    a.load_state(str(tmp_path / "other"))
    assert a._atac_loaded_layout is None
    loader = _packed()
    assert a.skip_first_batches(loader, 2) == ("skipped", loader, 2)


@pytest.mark.parametrize("as_path", [False, True])
def test_save_state_writes_the_layout_where_accelerate_saved_and_passes_its_arguments_on(tmp_path, as_path):
    """save_state 4, 5 (the arguments passed on)."""
    import pathlib

    a = _acc(tmp_path, max_tokens=128, dp=2, ga=3)
    (tmp_path / "ck").mkdir()
    a.location = pathlib.Path(tmp_path / "ck") if as_path else str(tmp_path / "ck")
    assert a.save_state("ck-asked", 1, safe_serialization=False) == a.location
    assert a.calls == [("save_state", "ck-asked", (1,), {"safe_serialization": False})]
    with open(tmp_path / "ck" / "atac_layout.json", encoding="utf-8") as f:
        assert json.load(f) == {"max_tokens": 128, "dp_size": 2, "gradient_accumulation_steps": 3}


def test_save_state_writes_nothing_off_the_main_process_or_where_accelerate_saved_nothing(tmp_path):
    """save_state 6 (``... or isdir``), 7 (``main or ...``)."""
    (tmp_path / "ck").mkdir()
    other = _acc(tmp_path, main=False)
    other.location = str(tmp_path / "ck")
    assert other.save_state() == str(tmp_path / "ck")
    assert os.listdir(tmp_path / "ck") == []
    a = _acc(tmp_path)  # location None: Accelerate saved nothing (as a rank that saves nothing returns)
    assert a.save_state() is None
    a.location = str(tmp_path / "missing")
    assert a.save_state() == str(tmp_path / "missing") and not os.path.exists(tmp_path / "missing")


# ---------------------------------------------------------------------------- _checkpoint_dir
def test_automatic_naming_reads_the_checkpoint_of_the_highest_number(tmp_path, monkeypatch):
    """hand-planted: the latest checkpoint by name (``checkpoint_9``), not by number. Pass 45 found two more: the
    folder was picked by its name's last number (Accelerate's rule is the first: ``checkpoint_2_v10`` is older
    than ``checkpoint_10_v2``), and ``~`` was not expanded (Accelerate expands it): the layout of another folder,
    or none, was checked."""
    from atac_hf.integrations.accelerate_resume import _checkpoint_dir

    a = _acc(tmp_path, auto=True)
    for n in (2, 10, 9):
        _layout_dir(tmp_path / "checkpoints", {**_SAVED, "dp_size": n}, name=f"checkpoint_{n}")
    assert _checkpoint_dir(a, None) == str(tmp_path / "checkpoints" / "checkpoint_10")
    b = _acc(tmp_path / "b", auto=True)
    for name in ("checkpoint_10_v2", "checkpoint_2_v10"):
        _layout_dir(tmp_path / "b" / "checkpoints", _SAVED, name=name)
    assert _checkpoint_dir(b, None) == str(tmp_path / "b" / "checkpoints" / "checkpoint_10_v2")
    (tmp_path / "b" / "checkpoints" / "notes").mkdir()  # a name without a number: Accelerate's load fails
    assert _checkpoint_dir(b, None) is None
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _checkpoint_dir(a, "~/ck") == str(tmp_path / "ck")
    assert _checkpoint_dir(a, tmp_path / "x") == str(tmp_path / "x")
    a.load_state()
    assert a._atac_loaded_layout == (str(tmp_path / "checkpoints" / "checkpoint_10" / "atac_layout.json"),
                                     {**_SAVED, "dp_size": 10})
    plain = _acc(tmp_path)
    assert _checkpoint_dir(plain, None) is None


def test_automatic_naming_without_checkpoints_finds_none(tmp_path):
    """_checkpoint_dir 33, 42 (listing a missing folder, ``max`` of none)."""
    from atac_hf.integrations.accelerate_resume import _checkpoint_dir

    a = _acc(tmp_path, auto=True)
    assert _checkpoint_dir(a, None) is None
    (tmp_path / "checkpoints").mkdir()
    assert _checkpoint_dir(a, None) is None


# ---------------------------------------------------------------------------- ATACTrainer: the ignore_data_skip lineage
def test_the_epoch_start_offset_is_saved_only_off_an_epoch_start(tmp_path):
    """_atac_save_sampler_state 35 (``unskipped_at / steps_per_epoch``: an offset of 0 written at an epoch start);
    hand-planted: the offset saved without ``% steps_per_epoch``."""
    from test_mutants_pass44 import _save_at
    from test_resume_layout import _trainer

    t = _trainer(str(tmp_path / "a"), ga=2)
    t.get_train_dataloader()  # 32 packs an epoch: 16 steps
    t._atac_unskipped_at = 16  # a resume with ignore_data_skip at the start of the second epoch
    assert "epoch_start_offset" not in _save_at(t, 20)
    t._atac_unskipped_at = 20
    assert _save_at(t, 21)["epoch_start_offset"] == 4


def test_the_dp_size_refusal_of_atactrainer_in_full(tmp_path):
    """_atac_check_layout 24, 25 (the text before the launch hint); hand-planted: ``launch_hint(tp, cp)``."""
    from test_mutants_pass44 import _layout
    from test_resume_layout import _trainer

    t = _trainer(str(tmp_path / "a"))
    t.atac_tp_size = 2
    with pytest.raises(ValueError) as err:
        t._atac_check_layout(_layout(t, dp_size=4), "P", "W")
    assert str(err.value) == (
        "P: the W was saved with dp_size=4, this run has dp_size=1; it resumes only with dp_size=4: the packs were "
        "dealt to that many data-parallel replicas: launch world_size = dp_size x cp_size x tp_size = 4 x 1 x 2 "
        "processes to resume from this checkpoint, or pass TrainingArguments(ignore_data_skip=True) to skip no data "
        "(the data order starts over), or train without resume_from_checkpoint")


# ---------------------------------------------------------------------------- layout_mismatch, launch_hint
def test_layout_mismatch_names_the_first_setting_that_differs_and_missing_ok_passes_only_absent_ones():
    """layout_mismatch 1 (``missing_ok=True`` by default); hand-planted: ``(key, here, saved)`` swapped, a key saved as
    null taken as missing."""
    from atac_hf.integrations.stream_state import launch_hint, layout_mismatch

    here = {"max_tokens": 256, "dp_size": 2, "gradient_accumulation_steps": 4}
    assert layout_mismatch(dict(here), here) is None
    assert layout_mismatch({**here, "dp_size": 1, "gradient_accumulation_steps": 1}, here) == ("dp_size", 1, 2)
    assert layout_mismatch({"max_tokens": 256}, here, missing_ok=True) is None
    assert layout_mismatch({"max_tokens": 256}, here) == ("dp_size", None, 2)
    assert layout_mismatch({**here, "dp_size": None}, here, missing_ok=True) == ("dp_size", None, 2)
    assert launch_hint(2, 3).format(v=5) == "launch world_size = dp_size x cp_size x tp_size = 5 x 2 x 3 processes"


def test_train_forgets_where_an_ignore_data_skip_resume_began(tmp_path, monkeypatch):
    """_atac_stream_end_train 1 (``= ""``); hand-planted: ``_atac_unskipped_at`` not reset (a later ``train()`` without
    a resume would mark its checkpoints as off an epoch start)."""
    import transformers
    from test_mutants_pass44 import _save_at
    from test_resume_layout import _trainer

    seen = []
    monkeypatch.setattr(transformers.Trainer, "train", lambda self, *a, **k: seen.append(self._atac_unskipped_at))
    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text('{"global_step": 4}')
    t = _trainer(str(tmp_path / "a"), ignore_data_skip=True)
    t.train(resume_from_checkpoint=str(ckpt))
    assert seen == [4]
    t.get_train_dataloader()  # (a later train() without a resume)
    assert "epoch_start_offset" not in _save_at(t, 5)


def test_the_lineage_refusal_in_full(tmp_path):
    """_atac_sampler_check_resume 41-44, 47, 48 (the refusal's text); _atac_stream_init 11 (``_atac_sampler_restored
    = ""``: seen only as the loader a refusal leaves)."""
    from test_mutants_pass44 import _saved_state
    from test_resume_layout import _trainer

    ckpt, _ = _saved_state(tmp_path, seed=7, epoch=1)
    path = os.path.join(ckpt, "atac_sampler.json")
    with open(path) as f:
        state = json.load(f)
    with open(path, "w") as f:
        json.dump({**state, "epoch_start_offset": 3}, f)
    b = _trainer(str(tmp_path / "b"))
    with pytest.raises(ValueError) as err:
        b._atac_sampler_check_resume(ckpt)
    assert str(err.value) == (
        f"{path}: this checkpoint comes from a run resumed with ignore_data_skip=True at a step that is not an epoch "
        "start (its epochs begin 3 optimizer steps after where Trainer, counting global_step alone, places them): "
        "resuming it would skip other packs than those trained. Pass TrainingArguments(ignore_data_skip=True) (the "
        "checkpoint's epoch starts over), or resume from a checkpoint saved before that resume")
    assert b._atac_sampler_restored is None and b._atac_sampler_saved is None


def test_a_streaming_train_loader_after_a_train_call_is_a_fresh_stream(tmp_path, monkeypatch):
    """_atac_stream_end_train 2 (``_atac_stream_restored = ""`` after ``train()``)."""
    import transformers

    monkeypatch.setattr(transformers.Trainer, "train", lambda self, *a, **k: "trained")
    t = _stream_trainer(tmp_path)
    assert t.train() == "trained"
    t.get_train_dataloader()
    assert t._atac_stream_count == (0, 0) and t.atac_stream.num_rows == 0


# ---------------------------------------------------------------------------- the stream's RNG and skip flag
@pytest.fixture
def rng_loads(monkeypatch):
    """``Trainer._load_rng_state`` and ``get_batch_samples`` as stubs: the checkpoints whose RNG state was loaded."""
    import transformers

    loads = []
    monkeypatch.setattr(transformers.Trainer, "_load_rng_state", lambda self, checkpoint: loads.append(checkpoint))
    monkeypatch.setattr(transformers.Trainer, "get_batch_samples", lambda self, *a: ([], None))
    monkeypatch.setattr(transformers.Trainer, "train", lambda self, *a, **k: "trained")
    return loads


def test_without_a_restored_stream_the_rng_state_loads_where_trainer_loads_it(tmp_path, rng_loads):
    """_atac_stream_init 6, 8 (``_atac_stream_rng = ""``, ``_atac_stream_defer_rng = True``); _atac_stream_end_train 4,
    5 (the same after ``train()``)."""
    from test_resume_layout import _trainer

    t = _trainer(str(tmp_path / "a"))
    for _ in range(2):  # before the first train() and after one
        t.get_batch_samples(None, 1, None)  # the first batch: no RNG state waits for it
        t._load_rng_state("ck")  # Trainer's own load: now, not deferred
        assert rng_loads == ["ck"]
        rng_loads.clear()
        assert t.train() == "trained"


def test_the_skip_flag_is_put_back_once(tmp_path, rng_loads):
    """_atac_stream_end_train 8 (``_atac_skip_flag = ""`` once put back: a later ``train()`` resets the user's
    value)."""
    from test_resume_layout import _trainer

    t = _trainer(str(tmp_path / "a"))
    t._atac_skip_flag, t.args.ignore_data_skip = False, True  # as a restored stream's loader leaves them
    t._atac_stream_end_train()
    assert t.args.ignore_data_skip is False and t._atac_skip_flag is None
    t.args.ignore_data_skip = True  # the user's, for the next train()
    t._atac_stream_end_train()
    assert t.args.ignore_data_skip is True

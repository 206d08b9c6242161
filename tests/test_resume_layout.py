"""``ATACTrainer`` resuming a map-style run: the checkpoint's sampler state is read, checked and loaded before
Trainer loads anything, so a refusal changes nothing (red-team 33).

Trainer skips ``global_step x gradient_accumulation_steps`` micro-batches a replica on resume: right only with the
DP size and gradient accumulation of the checkpoint's run. With ``min_window_packs`` the sampler's fingerprint can be
the same at GA 1 and GA 2 (``packs_per_window`` 32 both), and such a resume silently skipped packs 4-7 of the epoch;
``atac_sampler.json`` now holds the layout (``max_tokens``, ``dp_size``, ``gradient_accumulation_steps``) and a
resume with another one is refused, naming the setting.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import VOCAB, dataset  # noqa: E402


def _trainer(out: str, *, ga: int = 1, data=None, **args):
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    class Recording(ATACTrainer):
        def _prepare_context_parallel_inputs(self, model, inputs):
            if getattr(self, "_atac_training_step", False):
                self.seen.append(tuple(inputs["input_ids"].flatten().tolist()))
            return super()._prepare_context_parallel_inputs(model, inputs)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=VOCAB,
                                                               max_position_embeddings=2048))
    targs = TrainingArguments(output_dir=out, num_train_epochs=1, gradient_accumulation_steps=ga,
                              save_strategy="steps", save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True,
                              log_level="error", learning_rate=1e-3, **args)
    t = Recording(model=model, args=targs, train_dataset=dataset(60, seed=1) if data is None else data,
                  atac_config=ATACConfig(cp_size=1, max_tokens=384, min_window_packs=32))
    t.remove_callback(PrinterCallback)
    t.seen = []
    return t


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("resume_layout") / "a")
    t = _trainer(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.train()
    return out, t.seen


def _checkpoint(first_run, tmp_path, edit=None) -> str:
    """A copy of the first run's checkpoint-4 (4 packs trained), its sampler state edited by ``edit``."""
    dst = str(tmp_path / "checkpoint-4")
    shutil.copytree(os.path.join(first_run[0], "checkpoint-4"), dst)
    if edit is not None:
        path = os.path.join(dst, "atac_sampler.json")
        with open(path) as f:
            state = json.load(f)
        new = edit(state)  # None: edited in place; a str: the file's new text
        with open(path, "w") as f:
            f.write(json.dumps(state) if new is None else new)
    return dst


def _params(t):
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


def _refused(t, checkpoint, match):
    before = _params(t)
    with pytest.raises(ValueError, match=match):
        t.train(resume_from_checkpoint=checkpoint)
    after = _params(t)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the checkpoint's weights were not loaded
    assert t.seen == []


def test_the_sampler_state_holds_the_runs_layout(first_run):
    with open(os.path.join(first_run[0], "checkpoint-4", "atac_sampler.json")) as f:
        state = json.load(f)
    assert (state["max_tokens"], state["dp_size"], state["gradient_accumulation_steps"]) == (384, 1, 1)


def test_a_resume_with_the_same_layout_trains_the_packs_left(first_run, tmp_path):
    t = _trainer(str(tmp_path / "b"))
    t.train(resume_from_checkpoint=_checkpoint(first_run, tmp_path))
    assert t.seen == first_run[1][4:]


def test_a_checkpoint_of_an_earlier_atac_hf_without_the_layout_still_resumes(first_run, tmp_path):
    def drop(state):
        for key in ("max_tokens", "dp_size", "gradient_accumulation_steps"):
            del state[key]

    t = _trainer(str(tmp_path / "b"))
    t.train(resume_from_checkpoint=_checkpoint(first_run, tmp_path, drop))
    assert t.seen == first_run[1][4:]


def test_another_gradient_accumulation_is_refused_before_anything_is_loaded(first_run, tmp_path):
    # the fingerprint alone let this one through: 4 packs trained, GA 2 skipped 8
    _refused(_trainer(str(tmp_path / "b"), ga=2), _checkpoint(first_run, tmp_path),
             r"atac_sampler.json: the sampler state was saved with gradient_accumulation_steps=1, this run has "
             r"gradient_accumulation_steps=2; it resumes only with gradient_accumulation_steps=1: .*set "
             r"TrainingArguments\(gradient_accumulation_steps=1\).*ignore_data_skip=True")


def test_another_dp_size_or_pack_size_is_refused_naming_the_setting(first_run, tmp_path):
    _refused(_trainer(str(tmp_path / "b")), _checkpoint(first_run, tmp_path, lambda s: s.update(dp_size=2)),
             r"saved with dp_size=2, this run has dp_size=1; .*launch world_size = dp_size x cp_size x tp_size = "
             r"2 x 1 x 1 processes")
    _refused(_trainer(str(tmp_path / "c")), _checkpoint(first_run, tmp_path / "c", lambda s: s.update(max_tokens=512)),
             r"saved with max_tokens=512, this run has max_tokens=384; .*ATACConfig\(max_tokens=512\)")


def test_a_state_of_other_data_is_refused_before_the_weights_are_loaded(first_run, tmp_path):
    _refused(_trainer(str(tmp_path / "b"), data=dataset(61, seed=1)), _checkpoint(first_run, tmp_path),
             r"atac_sampler.json: sampler state fingerprint .* Resume with the train_dataset, ATACConfig and model .*"
             r"ignore_data_skip=True")


def test_an_unreadable_sampler_state_is_refused(first_run, tmp_path):
    _refused(_trainer(str(tmp_path / "b")), _checkpoint(first_run, tmp_path, lambda s: "{not json"),
             r"atac_sampler.json: not a readable sampler state .*resume from an intact checkpoint")


def test_ignore_data_skip_starts_the_data_over_in_another_layout(first_run, tmp_path):
    t = _trainer(str(tmp_path / "b"), ga=2, ignore_data_skip=True)
    t.train(resume_from_checkpoint=_checkpoint(first_run, tmp_path))
    # the epoch's packs of this run's layout, from its first: Trainer skips none (steps 3.. of its epoch)
    fresh = _trainer(str(tmp_path / "c"), ga=2)
    fresh.train()
    assert t.seen and t.seen == fresh.seen[:len(t.seen)]


def test_a_checkpoint_of_a_run_resumed_with_ignore_data_skip_off_an_epoch_start_is_refused(first_run, tmp_path):
    # B starts the epoch over at global step 4: its epoch begins 4 steps after where Trainer's skip, by global_step
    # alone, places it, so a resume from B's checkpoint-6 would skip packs B never trained (red-team 34)
    b = _trainer(str(tmp_path / "b"), ignore_data_skip=True)
    b.train(resume_from_checkpoint=_checkpoint(first_run, tmp_path))
    with open(tmp_path / "b" / "checkpoint-6" / "atac_sampler.json") as f:
        assert json.load(f)["epoch_start_offset"] == 4
    _refused(_trainer(str(tmp_path / "c")), str(tmp_path / "b" / "checkpoint-6"),
             r"checkpoint-6/atac_sampler.json: this checkpoint comes from a run resumed with ignore_data_skip=True "
             r"at a step that is not an epoch start .*Pass TrainingArguments\(ignore_data_skip=True\)")
    d = _trainer(str(tmp_path / "d"), ignore_data_skip=True)  # starting over again is allowed
    d.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-6"))
    assert d.seen == first_run[1][:len(d.seen)] and d.seen


def test_a_checkpoint_without_its_sampler_state_resumes_with_a_warning_naming_what_is_unchecked(first_run, tmp_path):
    checkpoint = _checkpoint(first_run, tmp_path)
    os.remove(os.path.join(checkpoint, "atac_sampler.json"))
    t = _trainer(str(tmp_path / "b"))
    with pytest.warns(UserWarning, match=r"atac_sampler.json not found .*fresh WFAP sampler, whose packs match the "
                                         r"checkpoint's only with the same dataset, seed, max_tokens, DP size and "
                                         r"gradient accumulation, none of which can be checked"):
        t.train(resume_from_checkpoint=checkpoint)
    assert t.seen == first_run[1][4:]  # the same settings: the same packs

"""``ATACAccelerator`` resume by ``skip_first_batches`` (red-team 34): the skip is exact only with the checkpoint's
``max_tokens``, DP size and gradient accumulation, which plan and deal an epoch's packs. ``save_state`` writes them to
``atac_layout.json``, ``load_state`` reads them back, and a skip on a packed loader under another layout is refused,
naming the setting (it silently trained 18 documents twice at DP 1 x CP 2 from a DP 2 checkpoint). One process here
(GA and max_tokens; the DP size is checked by the same rule)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

DATA = [{"input_ids": np.random.default_rng(0).integers(0, 128, int(n)).tolist()}
        for n in np.random.default_rng(1).integers(5, 90, 40)]


def _run(tmp_path, *, ga: int, max_tokens: int = 256, save: str | None = None, load: str | None = None, skip=None,
         **project):
    from accelerate.utils import ProjectConfiguration
    from transformers import AutoModelForCausalLM, LlamaConfig

    from atac_hf import ATACAccelerator, ATACConfig

    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    acc = ATACAccelerator(ATACConfig(max_tokens=max_tokens, cost_preset="default"), gradient_accumulation_steps=ga,
                          project_config=ProjectConfiguration(project_dir=str(tmp_path), **project))
    try:
        model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
        loader, _ = acc.packed_dataloader(DATA, seed=0)
        if save is not None:  # "auto": automatic checkpoint naming picks the folder
            acc.save_state(None if save == "auto" else save)
        if load is not None:
            acc.load_state(None if load == "auto" else load)
        if skip is not None:
            return [b["input_ids"].tolist() for b in acc.skip_first_batches(loader, skip)]
        return [b["input_ids"].tolist() for b in loader]
    finally:
        acc.end_training()


def test_save_state_writes_the_layout(tmp_path):
    _run(tmp_path, ga=2, save=str(tmp_path / "ck"))
    with open(tmp_path / "ck" / "atac_layout.json") as f:
        assert json.load(f) == {"max_tokens": 256, "dp_size": 1, "gradient_accumulation_steps": 2}


def test_a_skip_in_the_checkpoints_layout_is_the_epochs_rest(tmp_path):
    full = _run(tmp_path, ga=2)
    _run(tmp_path, ga=2, save=str(tmp_path / "ck"))
    assert _run(tmp_path, ga=2, load=str(tmp_path / "ck"), skip=3) == full[3:]


@pytest.mark.parametrize("change, match", [
    (dict(ga=1), r"saved with gradient_accumulation_steps=2, this run has gradient_accumulation_steps=1: .*Resume "
                 r"with gradient_accumulation_steps=2 \(ATACAccelerator\(gradient_accumulation_steps=2\)\), or start "
                 r"the epoch over without skip_first_batches"),
    (dict(ga=2, max_tokens=512), r"saved with max_tokens=256, this run has max_tokens=512: .*ATACConfig\(max_tokens="
                                 r"256\)"),
])
def test_a_skip_in_another_layout_is_refused_naming_the_setting(tmp_path, change, match):
    _run(tmp_path, ga=2, save=str(tmp_path / "ck"))
    with pytest.raises(ValueError, match=r"skip_first_batches\(3\): .*ck/atac_layout.json was " + match):
        _run(tmp_path, load=str(tmp_path / "ck"), skip=3, **change)
    assert _run(tmp_path, load=str(tmp_path / "ck"), **change)  # no skip: the epoch starts over, as asked


def test_automatic_checkpoint_naming_reads_the_latest_checkpoints_layout(tmp_path):
    _run(tmp_path, ga=1, save="auto", automatic_checkpoint_naming=True)
    _run(tmp_path, ga=2, save="auto", automatic_checkpoint_naming=True, iteration=1)
    assert os.path.isfile(tmp_path / "checkpoints" / "checkpoint_1" / "atac_layout.json")
    with pytest.raises(ValueError, match=r"checkpoint_1/atac_layout.json was saved with gradient_accumulation_steps=2"):
        _run(tmp_path, ga=1, load="auto", automatic_checkpoint_naming=True, skip=2)


def test_a_checkpoint_without_the_layout_is_not_checked(tmp_path):
    full = _run(tmp_path, ga=1)
    _run(tmp_path, ga=2, save=str(tmp_path / "ck"))
    os.remove(tmp_path / "ck" / "atac_layout.json")
    assert _run(tmp_path, ga=1, load=str(tmp_path / "ck"), skip=2) == full[2:]


def test_only_a_skip_on_a_packed_loader_is_checked(tmp_path):
    from accelerate.utils import ProjectConfiguration

    from atac_hf import ATACAccelerator, ATACConfig

    _run(tmp_path, ga=2, save=str(tmp_path / "ck"))
    assert _run(tmp_path, ga=1, load=str(tmp_path / "ck"), skip=0)  # nothing skipped: nothing to refuse
    acc = ATACAccelerator(ATACConfig(max_tokens=256, cost_preset="default"), gradient_accumulation_steps=1,
                          project_config=ProjectConfiguration(project_dir=str(tmp_path)))
    try:
        acc.load_state(str(tmp_path / "ck"))
        plain = acc.prepare(torch.utils.data.DataLoader(list(range(6)), batch_size=2))  # not packed: the user's own
        assert [b.tolist() for b in acc.skip_first_batches(plain, 1)] == [[2, 3], [4, 5]]
    finally:
        acc.end_training()

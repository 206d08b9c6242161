"""WFAPBatchSampler's progress bar while an epoch is planned (large datasets plan for seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.packing import PackingConfig, WFAPBatchSampler
from atac_hf.packing.data import sampler as sampler_mod

LENGTHS = np.random.default_rng(0).integers(1, 300, 400)
CONFIG = PackingConfig(max_tokens=512, packs_per_window=4)
BAR = "Planning WFAP packs (epoch 0)"


def _batches(s: WFAPBatchSampler) -> list:
    return list(iter(s))


def test_progress_true_shows_a_bar_and_plans_the_same_packs(capsys):
    plain = _batches(WFAPBatchSampler(LENGTHS, CONFIG, progress=False))
    assert BAR not in capsys.readouterr().err
    shown = _batches(WFAPBatchSampler(LENGTHS, CONFIG, progress=True))
    err = capsys.readouterr().err
    assert BAR in err and f"{LENGTHS.size}/{LENGTHS.size}" in err
    assert shown == plain


def test_default_shows_a_bar_only_from_the_size_threshold(capsys, monkeypatch):
    _batches(WFAPBatchSampler(LENGTHS, CONFIG))
    assert BAR not in capsys.readouterr().err
    monkeypatch.setattr(sampler_mod, "PROGRESS_MIN_SAMPLES", LENGTHS.size)
    s = WFAPBatchSampler(LENGTHS, CONFIG)
    s.set_epoch(3)
    _batches(s)
    assert "Planning WFAP packs (epoch 3)" in capsys.readouterr().err


def test_a_non_boolean_progress_is_refused():
    with pytest.raises(TypeError, match=r"progress=.*'yes'.* must be True, False or None \(set progress\)"):
        WFAPBatchSampler(LENGTHS, CONFIG, progress="yes")


def test_build_packed_dataloader_passes_progress_on():
    datasets = pytest.importorskip("datasets")
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.data import build_packed_dataloader

    ds = datasets.Dataset.from_dict({"input_ids": [list(range(int(n))) for n in LENGTHS[:50]]})
    _, s = build_packed_dataloader(ds, ATACConfig(cp_size=1, max_tokens=512), progress=False)
    assert s.progress is False
    _, s = build_packed_dataloader(ds, ATACConfig(cp_size=1, max_tokens=512))
    assert s.progress is None

"""Every rank of a job plans the same packs from the same lengths and config, so the packers' warnings (a sample
split or cut) and progress bars are shown on global rank 0 only (at DP x CP x TP 8 a user saw each warning 8
times). Errors are raised on every rank."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch.distributed as dist

from atac_hf.packing import PackingConfig
from atac_hf.packing.data.iterable import PackedIterableDataset
from atac_hf.packing.data.ranks import first_rank_warnings, is_first_rank
from atac_hf.packing.data.sampler import WFAPBatchSampler


@pytest.fixture(params=[None, 0, 1, 3], ids=["no_group", "rank0", "rank1", "rank3"])
def rank(request, monkeypatch):
    if request.param is not None:  # a process group of this rank (no collective is run)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: request.param)
    return request.param


def _warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in got]


def test_packing_warnings_show_on_the_first_rank_only(rank):
    first = rank in (None, 0)
    assert is_first_rank() is first
    config = PackingConfig(max_tokens=16, packs_per_window=2)
    lengths = [5, 40, 3]  # 40 > max_tokens: split, with a warning
    sampler = lambda: list(WFAPBatchSampler(np.array(lengths), config, seed=0))  # noqa: E731
    stream = lambda: list(PackedIterableDataset([{"input_ids": list(range(n))} for n in lengths], config))  # noqa: E731
    for fn in (sampler, stream):
        got = _warnings(fn)
        assert (any("longer than max_tokens=16" in m for m in got)) is first, (fn, got)
    # the packs are the same on every rank, and a refusal is raised everywhere
    assert sum(e - s for p in sampler() for _, s, e in p) == sum(lengths)
    with pytest.raises(ValueError), first_rank_warnings():
        WFAPBatchSampler(np.array([5, 40]), PackingConfig(max_tokens=16, packs_per_window=2, overlength="error"))
    # warnings outside the block are untouched
    assert _warnings(lambda: warnings.warn("mine")) == ["mine"]


def test_an_error_filter_still_raises_on_every_rank(rank):
    """Only the display is dropped on the other ranks: ``filterwarnings("error")`` (or ``pytest -W error``) raises
    there too, so no rank plans on while another stops (found by review: ``simplefilter("ignore")`` overrode it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="longer than max_tokens=16"):
            list(WFAPBatchSampler(np.array([5, 40, 3]), PackingConfig(max_tokens=16, packs_per_window=2), seed=0))


def test_a_stream_remembers_the_rank_that_built_it(monkeypatch):
    """A DataLoader worker started by spawn has no process group: the stream's warnings follow the rank of the
    process that built it (rank 1 here), not "no group, so first"."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    config = PackingConfig(max_tokens=16, packs_per_window=2)
    stream = PackedIterableDataset([{"input_ids": list(range(n))} for n in (5, 40, 3)], config)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # (as in a spawned worker)
    assert is_first_rank() and is_first_rank(False) is False
    assert not any("longer than max_tokens" in m for m in _warnings(lambda: list(stream)))

"""``ATACConfig(min_window_packs=N)``: packing windows of whole optimizer steps, at least N packs, for
fuller packs at few packs per step (DP 1, GA 1 plans one pack's samples at a time otherwise). Off by
default (1: one step per window). Found by the pack-fill investigation after red-team 15."""

import warnings

import numpy as np
import pytest

from atac_hf import ATACConfig
from atac_hf.integrations import build_packed_dataloader
from atac_hf.workloads import load_workload


def test_steps_per_window_and_the_packing_config_it_gives():
    cfg = ATACConfig(max_tokens=4096, min_window_packs=16)
    assert [cfg.steps_per_window(n) for n in (1, 2, 3, 16, 64)] == [16, 8, 6, 1, 1]
    one = cfg.step_packing_config(1)
    assert one.packs_per_window == 16 and one.max_defer == 1  # a sample still waits about 16 steps at most
    assert cfg.step_packing_config(16) == cfg.packing_config(16)
    assert ATACConfig(max_tokens=4096).step_packing_config(3) == ATACConfig(max_tokens=4096).packing_config(3)
    kept = ATACConfig(max_tokens=4096, min_window_packs=16, packing_options={"max_defer": 4}).step_packing_config(2)
    assert kept.packs_per_window == 16 and kept.max_defer == 4
    for other in (ATACConfig(max_tokens=4096, min_window_packs=16, window_size=64),
                  ATACConfig(max_tokens=4096, min_window_packs=16, packing_strategy="bfd")):
        assert other.steps_per_window(1) == 1


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "16", None, 2**21])
def test_min_window_packs_refuses_what_is_not_a_count(bad):
    with pytest.raises(ValueError, match=r"min_window_packs=.* must be an int >= 1 and <= 2\*\*20 .*"
                                         r"ATAC_MIN_WINDOW_PACKS"):
        ATACConfig(min_window_packs=bad)


def test_min_window_packs_from_the_environment():
    assert ATACConfig.from_sources(environ={"ATAC_MIN_WINDOW_PACKS": "16"}).min_window_packs == 16
    with pytest.raises(ValueError, match="ATAC_MIN_WINDOW_PACKS"):
        ATACConfig.from_sources(environ={"ATAC_MIN_WINDOW_PACKS": "lots"})


def _epoch(cfg, lengths, **kw):
    rows = [{"input_ids": [1] * int(n)} for n in lengths]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overlength samples split into fragments
        _, sampler = build_packed_dataloader(rows, cfg, **kw)
        return list(sampler)


def _tokens(batches, lengths):
    seen = np.zeros(int(np.sum(lengths)), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for batch in batches:
        for key in batch:
            i, s, e = (key, 0, lengths[key]) if isinstance(key, (int, np.integer)) else key
            seen[offsets[i] + s: offsets[i] + e] += 1
    return seen


@pytest.mark.parametrize("num_replicas, grad_accum", [(1, 1), (2, 1), (1, 2)])
def test_windows_of_steps_fill_packs_better_and_train_every_token_once(num_replicas, grad_accum):
    lengths = load_workload("wlbllm")[:600] // 4 + 1  # (a shipped sample: every length it holds)
    base = _epoch(ATACConfig(max_tokens=2048), lengths, num_replicas=num_replicas, grad_accum=grad_accum)
    more = _epoch(ATACConfig(max_tokens=2048, min_window_packs=16), lengths, num_replicas=num_replicas,
                  grad_accum=grad_accum)
    assert (_tokens(base, lengths) == 1).all() and (_tokens(more, lengths) == 1).all()
    assert len(more) < len(base) and len(more) % num_replicas == 0


def test_a_window_size_far_over_its_packs_warns():
    lengths = [100] * 400
    rows = [{"input_ids": [1] * n} for n in lengths]
    with pytest.warns(UserWarning, match=r"window_size=64 samples hold about 6.4e\+03 tokens, over twice the 1024 "
                                         r"that a window of 1 pack holds.*min_window_packs=16"):
        build_packed_dataloader(rows, ATACConfig(max_tokens=1024, window_size=64))


@pytest.mark.parametrize("bad", [0, 2.5, "3", True, None])
def test_the_packs_per_step_must_be_a_count(bad):
    with pytest.raises(ValueError, match=r"packs_per_step=.* is invalid: it must be an int >= 1"):
        ATACConfig(max_tokens=64).step_packing_config(bad)


@pytest.mark.parametrize("kw", [{"num_replicas": 0}, {"grad_accum": 2.0}, {"grad_accum": True}])
def test_the_streaming_loader_refuses_sizes_that_are_not_counts(kw):
    from atac_hf.integrations.data import build_streaming_dataloader
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter([{"input_ids": [1, 2, 3]}])

    with pytest.raises(ValueError, match=r"(num_replicas|grad_accum)=.* is invalid: it must be an int >= 1"):
        build_streaming_dataloader(Stream(), ATACConfig(max_tokens=64), **kw)


def test_min_window_packs_where_it_does_not_apply_warns():
    rows = [{"input_ids": [1] * 10} for _ in range(30)]
    for cfg in (ATACConfig(max_tokens=64, min_window_packs=16, window_size=8),
                ATACConfig(max_tokens=64, min_window_packs=16, packing_strategy="bfd")):
        with pytest.warns(UserWarning, match=r"min_window_packs=16 is not used"):
            build_packed_dataloader(rows, cfg)

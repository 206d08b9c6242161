"""Tests that kill ``packing/data/sampler.py`` survivors of the twenty-fourth mutation pass
(issue 20): the fixed-length epochs' cache of epoch 0 (its seed, and planning each epoch once),
the seeded order of a reordered epoch's windows, the planning bar's total, loaders kept in step
that have no epoch counter, and ``SpanDataset``'s batched read of int keys.

Mutant names are ``atac_hf.packing.data.sampler.xǁWFAPBatchSamplerǁ<function>__mutmut_<N>``
(``xǁSpanDatasetǁ__getitems____mutmut_<N>`` for the last test). docs/TESTING.md lists the
verdicts.
"""

from __future__ import annotations

import numpy as np

from atac_hf.packing import PackingConfig
from atac_hf.packing.data import sampler as sampler_mod
from atac_hf.packing.data.sampler import SpanDataset, WFAPBatchSampler

CAP16 = PackingConfig(max_tokens=16, packs_per_window=1)


# _epoch_plan__mutmut_24 (`self._first[0] == seed`: epoch 0 of another seed kept as the model of
# the fixed-length epochs). A trainer resuming with another data seed builds its sampler with its
# own seed, asks for len() (which plans its own epoch 0), then loads the checkpoint's state: the
# checkpoint's later epoch must be sized and reordered from the checkpoint seed's epoch 0.

def test_a_fixed_length_epoch_of_another_seed_resumes_to_the_same_batches():
    """A state saved with seed 2 in epoch 1 resumes to seed 2's remaining batches in a sampler built
    with seed 0 that had already planned its own epoch 0 (the mutant sized the epoch by seed 0's
    epoch 0 and reordered seed 0's packs: other samples than the checkpoint's run, or a refusal)."""
    lengths = [13, 1, 13, 8, 9, 11, 5, 16, 1, 5, 7, 10, 7, 3, 1, 1, 1, 3, 16, 4, 11, 13]
    saved = WFAPBatchSampler(lengths, CAP16, seed=2, fixed_epoch_length=True)
    saved.set_epoch(1)
    full = list(saved)
    resumed = WFAPBatchSampler(lengths, CAP16, seed=0, fixed_epoch_length=True)
    assert len(resumed) > 0  # plans seed 0's epoch 0 first, as Trainer does before loading the state
    resumed.load_state_dict(saved.state_dict(position=1))
    assert list(resumed) == full[1:]


# _epoch_plan__mutmut_11 (the cache key compared as `[:3]`: every len/iter/state load re-plans),
# _19 (`epoch >= 0`: epoch 0 of a fixed-length sampler planned twice), _39 (epoch 0's packs not
# kept: planned again for the next epoch), _24 (epoch 0 of the same seed planned again for every
# later epoch). Planning is the slow step (about 2 s per 100,000 samples) and Trainer asks len()
# more than once: each epoch is planned once, and epoch 0 once for all the fixed-length
# epochs.

def test_each_epoch_is_planned_once(monkeypatch):
    """Planning passes: one per epoch however often len/iter/state_dict/load_state_dict ask, and
    none more for epoch 0's packs that fixed-length epochs reuse."""
    calls = []
    real = sampler_mod.plan_packs

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sampler_mod, "plan_packs", counting)
    lengths = np.random.default_rng(0).integers(1, 17, 30)
    for fixed in (False, True):
        calls.clear()
        s = WFAPBatchSampler(lengths, CAP16, seed=1, fixed_epoch_length=fixed)
        n = len(s)
        assert len(list(s)) == n and len(s) == n and s.state_dict()["num_batches"] == n
        s.load_state_dict(s.state_dict(position=2))
        assert len(calls) == 1, (fixed, len(calls))
        for epoch in (1, 2):
            s.set_epoch(epoch)
            assert len(list(s)) == len(s)
        assert len(calls) == 3, (fixed, len(calls))


# _epoch_plan__mutmut_37 (the reordering generator unseeded) and _38 (seeded `[seed, epoch, 2]`).
# A reordered epoch is not stored in a checkpoint: resuming re-plans it from (seed, epoch), so the
# order must be the same in every process and in every version that reads format v1 states.

def test_a_reordered_epoch_is_epoch_0s_windows_in_the_seeded_order():
    """With fixed_epoch_length, an epoch whose own packing has another batch count trains epoch 0's
    windows (packs_per_window batches each) in the order ``default_rng([seed, epoch, 1])`` draws,
    the partial last window last; the same in a second sampler (what a resume re-plans)."""
    lengths = [5, 2, 5, 7, 14, 8, 2, 6, 10, 14, 12, 16, 4, 15, 1, 9, 5, 4]
    cfg = PackingConfig(max_tokens=16, packs_per_window=3)
    s = WFAPBatchSampler(lengths, cfg, seed=2, fixed_epoch_length=True)
    first = list(s)
    assert len(first) == 10  # 3 full windows and a partial one
    w, full = 3, len(first) // 3
    reordered = 0
    for epoch in range(1, 9):
        fresh = WFAPBatchSampler(lengths, cfg, seed=2)
        fresh.set_epoch(epoch)
        s.set_epoch(epoch)
        got = list(s)
        if len(list(fresh)) == len(first):
            continue  # packed afresh: the count already matches
        reordered += 1
        perm = np.random.default_rng([2, epoch, 1]).permutation(full)
        want = [b for k in perm.tolist() for b in first[k * w:(k + 1) * w]] + first[full * w:]
        assert got == want, epoch
        again = WFAPBatchSampler(lengths, cfg, seed=2, fixed_epoch_length=True)
        again.set_epoch(epoch)
        assert list(again) == got, epoch
    assert reordered >= 3


# _pack__mutmut_17 (the bar's total counts empty samples, which the planner skips: the bar stopped
# short of its total, e.g. 8/10).

def test_the_planning_bar_counts_only_the_samples_it_plans(capsys):
    """Empty samples are skipped, not planned: the planning bar's total is the non-empty samples,
    so the bar ends full (8/8) rather than stopping short (8/10)."""
    lengths = [3, 0, 5, 7, 0, 2, 9, 4, 6, 1]
    s = WFAPBatchSampler(lengths, CAP16, progress=True)
    list(s)
    err = capsys.readouterr().err
    assert "Planning WFAP packs (epoch 0)" in err and "8/8" in err and "/10" not in err


# _step_loaders__mutmut_2 (`loader is not None or hasattr(...)`: the epoch set on every live
# loader, with or without an epoch counter).

def test_a_loader_without_an_epoch_counter_is_left_alone():
    """keep_in_step follows the epoch counter of loaders that have one (Accelerate's prepared
    loaders); another loader is not given an ``iteration`` attribute, and one that cannot take it
    does not make keep_in_step / set_epoch / load_state_dict fail."""
    import torch

    class Counted:
        iteration = 0

    class Slotted:
        __slots__ = ("__weakref__",)

    lengths = np.random.default_rng(0).integers(1, 17, 20)
    s = WFAPBatchSampler(lengths, CAP16, seed=1)
    plain = torch.utils.data.DataLoader(list(range(4)))
    counted, slotted = Counted(), Slotted()
    for loader in (plain, slotted, counted):
        s.keep_in_step(loader)
    s.set_epoch(2)
    other = WFAPBatchSampler(lengths, CAP16, seed=1)
    other.set_epoch(3)
    s.load_state_dict(other.state_dict())
    assert counted.iteration == 3
    assert not hasattr(plain, "iteration") and not hasattr(slotted, "iteration")


# xǁSpanDatasetǁ__getitems____mutmut_27 (`_is_int(k) and False`), _29 (`_is_int(None)`): over a
# source that reads a batch at once (no column_names), an int key's row was sliced as a span,
# keeping only the token columns.

class BatchSource:
    """A map-style source with a batched read (``__getitems__``), as ``datasets`` has."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def __getitems__(self, keys):
        return [self.rows[i] for i in keys]


def test_span_dataset_batched_int_keys_return_the_sample_unchanged():
    """``ds[i]`` is sample i unchanged, and so is an int key in a batched read (what a DataLoader
    with a plain sampler calls): the DataLoader's batch must not depend on which read it uses."""
    rows = [{"input_ids": [1, 2, 3], "labels": None, "id": 7},
            {"input_ids": [4, 5, 6, 7], "labels": [4, 5, 6, 7], "id": 8}]
    ds = SpanDataset(BatchSource(rows))
    got = ds.__getitems__([0, (1, 1, 3), 1])
    assert got == [rows[0], {"input_ids": [5, 6], "labels": [5, 6]}, rows[1]]
    assert got[0] == ds[0] and got[2] == ds[1]

"""The short last window (planners/wfap_end.py): at the end of a stream, WFAP's last window
gets the packs its samples need (about ``ceil(tokens / max_tokens)``, a multiple of the DP
replicas), not ``packs_per_window`` packs of about one sample each; full windows, and a
short window that would balance worse than whole windows, are planned as before."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from atac_hf.cost import CostModel, default_cost_model
from atac_hf.packing import PackingConfig, StreamPacker, pack_lengths
from atac_hf.packing.data.window_planner import plan_packs
from atac_hf.packing.metrics import pack_costs
from atac_hf.packing.planners import wfap_end


@pytest.fixture
def whole_windows():
    """Run a block with every end window ``packs_per_window`` packs (the switch restored after)."""
    saved = wfap_end.SHORT_LAST_WINDOW

    def run(fn, *args, **kw):
        wfap_end.SHORT_LAST_WINDOW = False
        try:
            return fn(*args, **kw)
        finally:
            wfap_end.SHORT_LAST_WINDOW = saved

    yield run
    wfap_end.SHORT_LAST_WINDOW = saved


def _short(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(10, 40, n)


def _whole_once(packs, lengths, cap):
    """Every sample in exactly one pack, whole (they all fit the cap), no pack over the cap."""
    spans = sorted((sid, s, e) for p in packs for sid, s, e in p)
    assert spans == [(i, 0, int(n)) for i, n in enumerate(lengths)]
    assert max(sum(e - s for _, s, e in p) for p in packs) <= cap


# ---------------------------------------------------------------- the last window of a multi-window stream
def test_last_partial_window_gets_the_packs_its_tokens_need(whole_windows):
    # RELIABILITY.md's case: 2,000 samples of 10-40 tokens at a 256 cap, 64 packs a window. The stream
    # ends in a window of 1,500-odd tokens over what three full windows take: it had 64 packs (256 in all for
    # 195 at the token minimum); now the packs its tokens need
    L, cap, P = _short(2000), 256, 64
    config = PackingConfig(max_tokens=cap, packs_per_window=P)
    res = pack_lengths(L, config)
    wins = res.windows()
    assert [len(w) for w in wins[:-1]] == [P] * (len(wins) - 1) and len(wins) >= 2  # a multi-window stream
    last_tokens = sum(e - s for p in wins[-1] for _, s, e in p)
    assert len(wins[-1]) <= math.ceil(last_tokens / cap) + 1 < P // 4
    assert len(res.packs) <= math.ceil(int(L.sum()) / cap) + 5  # was 256 for 195
    costs = pack_costs(wins[-1], default_cost_model())
    assert costs.max() / costs.mean() <= config.balance_tolerance  # the short window is balanced too
    _whole_once(res.packs, L, cap)
    old = whole_windows(pack_lengths, L, config)
    assert len(old.packs) == len(old.windows()) * P == 256  # what it was: every window 64 packs
    assert [len(w) for w in old.windows()[:-1]] == [len(w) for w in wins[:-1]]


def test_a_stream_shorter_than_one_window_is_the_packs_it_needs():
    L, cap = _short(200, seed=1), 256
    res = pack_lengths(L, PackingConfig(max_tokens=cap, packs_per_window=64))
    assert len(res.windows()) == 1 and len(res.packs) <= math.ceil(int(L.sum()) / cap) + 1
    _whole_once(res.packs, L, cap)


# ---------------------------------------------------------------- data-parallel replicas
@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_the_short_window_is_a_multiple_of_the_replicas(replicas):
    L, cap, P = _short(40 * replicas, seed=2), 256, 12 * replicas  # about 4 packs a replica of the window's 12
    config = PackingConfig(max_tokens=cap, packs_per_window=P)
    packer = StreamPacker(config, pack_multiple=replicas)
    packs = packer.add_window(list(range(L.size)), L.tolist(), last=True)
    assert packer.flush() == []
    need = math.ceil(int(L.sum()) / cap)
    assert len(packs) % replicas == 0 and need <= len(packs) <= need + 2 * replicas < P
    _whole_once(packs, L, cap)
    # the feeders pass their replicas: the pass needs no re-cut to deal evenly, and no sample is cut
    spans, offsets = plan_packs(L, config, num_replicas=replicas)
    assert (len(offsets) - 1) % replicas == 0 and len(offsets) - 1 <= need + 2 * replicas
    _whole_once([spans[a:b].tolist() for a, b in zip(offsets, offsets[1:])], L, cap)


def test_every_replica_gets_a_pack_of_a_tiny_end():
    # 3 samples of 5 tokens fit one pack; 4 replicas: 4 packs are planned, 3 hold a sample (the feeders' even-out
    # then cuts one in two, as before: a repeated batch would train it twice)
    packer = StreamPacker(PackingConfig(max_tokens=64, packs_per_window=8), pack_multiple=4)
    packs = packer.add_window([0, 1, 2], [5, 5, 5], last=True)
    assert sorted(map(sorted, packs)) == [[(0, 0, 5)], [(1, 0, 5)], [(2, 0, 5)]]
    spans, offsets = plan_packs([5, 5, 5], PackingConfig(max_tokens=64, packs_per_window=8), num_replicas=4)
    assert len(offsets) - 1 == 4 and sum(e - s for _, s, e in spans.tolist()) == 15


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", None, True])
def test_pack_multiple_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=r"pack_multiple=.* must be an int >= 1 \(the DP replicas; set pack_multiple\)"):
        StreamPacker(PackingConfig(max_tokens=64, packs_per_window=8), pack_multiple=bad)


# ---------------------------------------------------------------- unchanged where the window is full
def test_a_full_last_window_is_planned_as_before(whole_windows):
    # cap 100, 4 packs a window: 360 tokens need the window's 4 packs (ceil(360 / 100) = 4): the same plan
    L = [60, 60, 60, 60, 30, 30, 30, 30]
    config = PackingConfig(max_tokens=100, packs_per_window=4)
    res = pack_lengths(L, config)
    assert res.packs == whole_windows(pack_lengths, L, config).packs and len(res.packs) == 4
    _whole_once(res.packs, L, 100)


def test_windows_before_the_end_are_unchanged(whole_windows):
    rng = np.random.default_rng(3)
    L = np.concatenate([rng.integers(1, 16, 600), rng.integers(128, 257, 30)])[rng.permutation(630)]
    config = PackingConfig(max_tokens=256, packs_per_window=8)
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.01, tile=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new, old = pack_lengths(L, config, cm), whole_windows(pack_lengths, L, config, cm)
    first_end = max(new.arrival)  # the last feeding window is planned as the end (last=True)
    assert new.windows()[:first_end] == old.windows()[:first_end] and first_end >= 3
    assert len(new.packs) <= len(old.packs)
    _whole_once(new.packs, L, 256)


def test_a_short_window_that_balances_worse_keeps_whole_windows(whole_windows):
    # cost = L + L (L + 1) / 2 (a 5-token document 20 s, a 1-token one 2 s); cap 10, 4 packs a window.
    # 21 tokens fit 3 packs only with two 5s together: {5, 5} 40 s, {5, 1} 22 s, {5} 20 s: max/mean
    # 40 / 27.3 = 1.46; whole windows: {5, 1}, {5}, {5}, {5}: 22 / 20.5 = 1.07, and 1.46 > 1.05 (the
    # balance tolerance) x 1.07: the 4 packs are kept
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1)
    L = [5, 5, 5, 5, 1]
    config = PackingConfig(max_tokens=10, packs_per_window=4)
    res = pack_lengths(L, config, cm)
    assert len(res.packs) == 4 and res.packs == whole_windows(pack_lengths, L, config, cm).packs
    assert sorted(map(sorted, res.packs)) == [[(0, 0, 5), (4, 0, 1)], [(1, 0, 5)], [(2, 0, 5)], [(3, 0, 5)]]


def test_counts_grow_by_the_packs_the_left_items_fill():
    # whole windows: by a window; short: by what first fit decreasing makes of the items left, a multiple of mult
    c = wfap_end._Counts(np.array([6, 6, 6, 6, 6]), P=4, C=10, mult=None)
    assert c.first == 4 and c.next(4, [6]) == 8 and c.next(8, []) == 12 and c.next(12, []) is None
    c = wfap_end._Counts(np.array([6, 6, 6, 6, 6]), P=4, C=10, mult=1)
    assert c.first == 3 and c.next(3, [6, 6]) == 5  # two 6s never share a pack
    c = wfap_end._Counts(np.array([6, 6, 6, 6, 6]), P=4, C=10, mult=2)
    assert c.first == 4 and c.next(4, [3, 3, 3]) == 6  # 3 + 3 + 3 fill one pack: 5, rounded up to 6
    assert wfap_end._bins([7, 3, 5, 5, 4, 6], 10) == 3 and wfap_end._bins([], 10) == 0

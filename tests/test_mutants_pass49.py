"""Forty-ninth mutation pass (docs/TESTING.md): ``packing/data/window_planner.py``'s mutants that the
forty-eighth pass did not reach (its tests are the slow sampler and exactly-once ones).

What a user relies on and no fast test pinned before: the window planner called directly, on a few
samples, with a cost model that prices a pack at its token count (so loads are hand-checkable): the
reserve it holds back per window (tokens, documents over packs, at most ``RESERVE_PACKS`` per
replica, none without ``even_batches``), the loads and batch count after each release, the dealing
order's tie-breaks by earlier loads and by the reserve's packs, where the next window's slots start;
``window_count`` (fixed windows, the token budget, the one-window look-ahead, a carry that fills the
window, progress after an empty window); ``plan_packs``' argument checks at their limits with whole
messages, its progress calls, the empty pass's arrays, and ``split_fill`` dealt window by window.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_packing_split import _check_plan  # noqa: E402

from atac_hf.cost import CostModel  # noqa: E402
from atac_hf.packing import PackingConfig  # noqa: E402
from atac_hf.packing.config import MAX_LENGTH, MAX_PACKS_PER_WINDOW  # noqa: E402
from atac_hf.packing.data.window_planner import RESERVE_PACKS, WindowPlanner, plan_packs, replica_order  # noqa: E402

# a pack costs its token count: loads and tie-breaks can be checked by hand
TOKENS = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


def _planner(max_tokens, packs_per_window, num_replicas, even_batches=True, window_size=None, cost_model=TOKENS):
    cfg = PackingConfig(max_tokens=max_tokens, packs_per_window=packs_per_window)
    return WindowPlanner(cfg, cost_model, window_size=window_size, num_replicas=num_replicas,
                         even_batches=even_batches)


def _packs(spans, offsets):
    return [spans[offsets[b]:offsets[b + 1]].tolist() for b in range(len(offsets) - 1)]


class _Progress:
    def __init__(self):
        self.calls = []

    def update(self, n):
        self.calls.append(n)


# ------------------------------------------------------------------------------ replica_order
def test_replica_order_breaks_ties_by_prior_loads_and_keeps_a_single_pack():
    # equal costs: the first pack goes to the replica with less dealt before (replica 1 here)
    assert replica_order([1.0, 1.0], 2, prior_loads=[5.0, 0.0]) == [1, 0]
    assert replica_order([1.0, 1.0], 2, prior_loads=[0.0, 5.0]) == [0, 1]
    assert replica_order([1.0, 1.0], 2, prior_loads=[5, 0]) == [1, 0]  # ints taken as numbers
    assert replica_order([3.0], 2, first_slot=1) == [0]


# ------------------------------------------------------------------------------ the reserve
@pytest.mark.parametrize("R, lengths, max_tokens, released, reserved", [
    # one document a pack: no spare document, so RESERVE_PACKS per replica are held
    (2, [8] * 12, 8, 12 - RESERVE_PACKS * 2, RESERVE_PACKS * 2),
    (3, [8] * 16, 8, 4, 12),
    # two documents a pack: the last pack holds 8 >= 2R tokens and one spare document (R - 1 = 1)
    (2, [4] * 32, 8, 15, 1),
    # packs of 2 tokens: two are needed for 2R = 4 tokens
    (2, [1] * 32, 2, 14, 2),
    # three replicas want two spare documents: two packs of two
    (3, [4] * 32, 8, 14, 2),
    # a window too small for the reserve is held whole
    (2, [1], 8, 0, 1),
])
def test_the_reserve_holds_the_fewest_last_packs_with_2r_tokens_and_r_minus_1_spare_documents(
        R, lengths, max_tokens, released, reserved):
    wp = _planner(max_tokens, 16, R)
    out = wp.add(list(range(len(lengths))), lengths)
    assert (len(out), len(wp.reserve)) == (released, reserved)
    assert wp.num_batches == released
    # what is released and held is every token of the window once
    _check_plan(out + wp.reserve, lengths, max_tokens, 1)
    # the loads count the released packs only, dealt round-robin from slot 0
    want = [0.0] * R
    for k, p in enumerate(out):
        want[k % R] += sum(e - s for _, s, e in p)
    assert wp.loads == want


@pytest.mark.parametrize("R, even_batches", [(1, True), (1, False), (2, False)])
def test_without_even_batches_over_several_replicas_nothing_is_held_back(R, even_batches):
    wp = _planner(8, 16, R, even_batches=even_batches)
    out = wp.add(list(range(6)), [8] * 6)
    assert len(out) == 6 and wp.reserve == [] and wp.num_batches == 6
    out = wp.add([6], [1])  # a window of a single token is released too
    assert out == [[(6, 0, 1)]] and wp.reserve == [] and wp.num_batches == 7


def test_the_reserve_is_released_at_the_end_and_the_state_then_holds_none():
    wp = _planner(8, 16, 2)
    first = wp.add(list(range(12)), [8] * 12)
    assert len(wp.reserve) == 8
    last = wp.add([12, 13], [8, 8], last=True)
    assert len(first) + len(last) == 14 and wp.num_batches == 14
    assert wp.reserve == [] and wp.state_dict()["reserve"] == []
    assert wp.loads == [56.0, 56.0]
    _check_plan(first + last, [8] * 14, 8, 1)


def test_loads_follow_the_global_slot_over_windows_with_three_replicas():
    """Slot k of the pass goes to replica k % 3 (4 packs a window: windows start at slots 0, 4, 8)."""
    wp = _planner(8, 4, 3, even_batches=False)
    lengths = [8, 7, 6, 5, 4, 3, 2, 1, 8, 8, 8, 8]
    dealt = []
    for w in range(3):
        ids = list(range(4 * w, 4 * w + 4))
        dealt += wp.add(ids, [lengths[i] for i in ids], last=w == 2)
        assert wp.num_batches == len(dealt)
        want = [0.0] * 3
        for k, p in enumerate(dealt):
            want[k % 3] += sum(e - s for _, s, e in p)
        assert wp.loads == want
    _check_plan(dealt, lengths, 8, 1)


def test_the_planner_prices_packs_with_its_cost_model_and_saves_it_in_its_state():
    wp = _planner(8, 2, 2, even_batches=False)
    assert wp.cost_model is TOKENS
    assert wp.packer.state_dict()["cost_model"]["linear_s_per_token"] == 1.0
    assert wp.pack_costs([[(0, 0, 5)], [(1, 2, 8), (2, 0, 1)]]) == [5.0, 7.0]
    assert wp.pack_costs([]) == []
    out = wp.add([0, 1], [8, 3])
    assert wp.loads == [8.0, 3.0] and [p[0][0] for p in out] == [0, 1]


def _dealt(loads, reserve, num_batches=0):
    """Samples of the packs in dealing order (released + reserve) after a window of three equal
    packs, the planner (3 replicas) restored with these loads and reserve."""
    wp = _planner(8, 3, 3)
    state = wp.state_dict()
    state.update(loads=loads, reserve=reserve, num_batches=num_batches)
    wp.load_state_dict(state)
    out = wp.add([0, 1, 2], [8, 8, 8])
    return [p[0][0] for p in out + wp.reserve]


def test_the_dealing_order_breaks_ties_by_loads_and_the_reserves_packs_in_their_slots():
    """Three equal packs go, first pack first, to the replica with the least earlier load; the
    reserve's packs count for the slots they will be dealt in (``num_batches + k``); the window's
    packs are dealt from slot ``num_batches + len(reserve)``."""
    A, B = [[100, 0, 6]], [[101, 0, 3]]  # reserve packs of 6 and 3 tokens
    # reserve in slots 0 (r0: 6), 1 (r1: 3): r2, r1, r0 take packs 0, 1, 2; slots 2, 3, 4 = r2, r0, r1
    assert _dealt([0, 0, 0], [A, B]) == [100, 101, 0, 2, 1]
    # loads add to the reserve: r1 20 + 3: r2, r0, r1 take packs 0, 1, 2
    assert _dealt([0, 20, 0], [A, B]) == [100, 101, 0, 1, 2]
    # reserve in slots 1 (r1: 6), 2 (r2: 3): r0, r2, r1 take packs 0, 1, 2; slots 3, 4, 5 = r0, r1, r2
    assert _dealt([0, 0, 0], [A, B], num_batches=1) == [100, 101, 0, 2, 1]
    # no reserve: slots 1, 2, 3 = r1, r2, r0; equal loads: r0, r1, r2 take packs 0, 1, 2
    assert _dealt([0, 0, 0], [], num_batches=1) == [1, 2, 0]
    # loads alone: r2 (0), r1 (1), r0 (4) take packs 0, 1, 2
    assert _dealt([4, 1, 0], []) == [2, 1, 0]


# ------------------------------------------------------------------------------ window_count
def test_window_count_with_a_fixed_window_size():
    wp = _planner(8, 2, 1, window_size=3)
    lengths = np.array([1, 2, 3, 4, 5])
    assert [wp.window_count(lengths, p) for p in (0, 2, 3, 4, 5)] == [3, 3, 2, 1, 0]


def test_window_count_by_token_budget_takes_a_rest_that_fits_unless_more_is_coming():
    lengths = np.array([8, 8, 2])  # two packs of 8 fill the window; the 2-token rest fits
    assert _planner(8, 2, 1).window_count(lengths, 0) == 3
    assert _planner(8, 2, 1).window_count(lengths, 0, more_coming=False) == 3
    assert _planner(8, 2, 1).window_count(lengths, 0, more_coming=True) == 2


def test_a_carry_that_fills_the_window_takes_no_new_sample_and_an_empty_window_makes_progress():
    lengths = np.array([40, 5, 5, 5, 5, 5, 5, 5, 5])
    wp = _planner(8, 2, 1, even_batches=False)
    assert wp.window_count(lengths, 0) == 1
    assert wp.add([0], [40]) == [[(0, 0, 8)], [(0, 8, 16)]]
    # 24 tokens of sample 0 are carried: they fill the next window (two packs of 8)
    assert wp.window_count(lengths, 1) == 0
    assert wp.window_count(lengths, 1, more_coming=True) == 0
    assert wp.add([], []) == [[(0, 16, 24)], [(0, 24, 32)]]
    assert wp.window_count(lengths, 1) == 2  # 8 tokens carried: room for two more samples
    # a window that packs nothing (no new sample, an empty carry) is followed by one that takes a sample
    fresh = _planner(8, 2, 1, even_batches=False)
    assert fresh.add([], []) == []
    assert fresh.prev_empty is True
    # at the end of a buffered stream (more coming), nothing is left to take
    assert fresh.window_count(lengths, lengths.size, more_coming=True) == 0


def test_after_a_window_that_packed_nothing_the_next_takes_a_sample_even_where_the_carry_fills_it():
    """``prev_empty`` (restored from a state): a carry that fills the window would give 0 new samples;
    after a window that packed nothing the next takes one (progress), also with more coming, but not
    past the end of the buffer."""
    lengths = np.array([40, 5, 5, 5, 5, 5, 5, 5, 5])
    wp = _planner(8, 2, 1, even_batches=False)
    wp.add([0], [40])
    state = wp.state_dict()
    assert state["prev_empty"] is False and wp.window_count(lengths, 1) == 0
    state["prev_empty"] = True
    restored = _planner(8, 2, 1, even_batches=False)
    restored.load_state_dict(state)
    assert restored.window_count(lengths, 1) == 1
    assert restored.window_count(lengths, 1, more_coming=True) == 1
    assert restored.window_count(lengths[:1], 1, more_coming=True) == 0


def test_plan_packs_reports_each_windows_samples_and_feeds_carried_windows_without_new_samples():
    progress = _Progress()
    spans, offsets = plan_packs([40, 5, 5, 5, 5, 5, 5, 5, 5], PackingConfig(max_tokens=8, packs_per_window=2),
                                progress=progress, even_batches=False)
    assert progress.calls == [1, 0, 2, 3, 3]
    assert _packs(spans, offsets) == [
        [[0, 0, 8]], [[0, 8, 16]], [[0, 16, 24]], [[0, 24, 32]], [[0, 32, 40]], [[1, 0, 5]], [[2, 0, 5]],
        [[3, 0, 5]], [[4, 0, 5]], [[5, 0, 5]], [[6, 0, 5]], [[7, 0, 5]], [[8, 0, 5]]]  # two-window carry first


def test_add_without_last_carries_and_with_last_flushes():
    wp = _planner(8, 2, 1, even_batches=False)
    assert wp.add([0, 1, 2], [8, 8, 3]) == [[(0, 0, 8)], [(1, 0, 8)]]  # sample 2 carried
    assert wp.prev_empty is False
    assert wp.add([], [], last=True) == [[(2, 0, 3)]]
    assert wp.num_batches == 3


# ------------------------------------------------------------------------------ plan_packs
def test_plan_packs_with_a_fixed_window_size_reports_each_window():
    progress = _Progress()
    spans, offsets = plan_packs([5, 6, 0, 7, 2, 3], PackingConfig(max_tokens=8, packs_per_window=2), window_size=2,
                                num_replicas=2, progress=progress, cost_model=TOKENS)
    assert progress.calls == [2, 2, 1]  # the empty sample is skipped, not counted
    assert spans.dtype == np.int64 and offsets.dtype == np.int64 and spans.shape == (5, 3)
    assert len(offsets) % 2 == 1  # an even count of packs: every replica as many
    _check_plan(_packs(spans, offsets), [5, 6, 0, 7, 2, 3], 8, 1)


def test_the_last_window_gets_a_multiple_of_num_replicas_packs_also_without_even_batches():
    """Two samples that share a pack are dealt one to each replica (the packer's ``pack_multiple``)."""
    cfg = PackingConfig(max_tokens=8, packs_per_window=4)
    assert _packs(*plan_packs([3, 3], cfg, num_replicas=2, even_batches=False)) == [[[0, 0, 3]], [[1, 0, 3]]]
    assert _packs(*plan_packs([3, 3], cfg, even_batches=False)) == [[[0, 0, 3], [1, 0, 3]]]


def test_plan_packs_of_only_empty_samples_returns_empty_int64_arrays():
    spans, offsets = plan_packs([0, 0], PackingConfig(max_tokens=8, packs_per_window=2), even_batches=False)
    assert spans.shape == (0, 3) and spans.dtype == np.int64
    assert offsets.tolist() == [0] and offsets.dtype == np.int64


def test_plan_packs_with_one_span():
    spans, offsets = plan_packs([0, 5], PackingConfig(max_tokens=8, packs_per_window=2))
    assert spans.tolist() == [[1, 0, 5]] and offsets.tolist() == [0, 1]


def test_plan_packs_settings_at_their_limits_and_just_past_them():
    cfg = PackingConfig(max_tokens=8, packs_per_window=2)
    assert _packs(*plan_packs([3, 4, 5], cfg, window_size=1)) == [[[0, 0, 3]], [[1, 0, 4]], [[2, 0, 5]]]
    assert _packs(*plan_packs([3, 4, 5], cfg, window_size=MAX_LENGTH)) == [[[0, 0, 3], [1, 0, 4]], [[2, 0, 5]]]
    assert _packs(*plan_packs([3, 4, 5], cfg, num_replicas=MAX_PACKS_PER_WINDOW, even_batches=False)) == [
        [[0, 0, 3], [1, 0, 4]], [[2, 0, 5]]]
    ws = ("window_size={}: must be None (token budget) or an int >= 1 samples (at most 1099511627776)")
    for bad in (1.5, True, 2.0, 0, -1, MAX_LENGTH + 1):  # non-ints first: a window of 0 or -1 samples never ends
        with pytest.raises(ValueError) as e:
            plan_packs([3, 4, 5], cfg, window_size=bad)
        assert str(e.value) == ws.format(bad)
    nr = "num_replicas={}: must be an int >= 1 (the DP size, at most 65536)"
    for bad in (0, MAX_PACKS_PER_WINDOW + 1, True, 1.5, 2.0):
        with pytest.raises(ValueError) as e:
            plan_packs([3, 4, 5], cfg, num_replicas=bad)
        assert str(e.value) == nr.format(bad)
    with pytest.raises(TypeError) as e:
        plan_packs([3, 4, 5], {"max_tokens": 8})
    assert str(e.value) == "config must be a PackingConfig, got dict"


BFD = dict(strategy="bfd", min_fragment=1)


@pytest.mark.parametrize("lengths, cap, per_window, windowed, filled", [
    # 6 packs window by window, 4 filled (dealt in windows of 3 packs: 3 + 1)
    ([0, 5, 2, 1, 13, 6, 4], 8, 3,
     [[[2, 0, 2], [5, 0, 6]], [[4, 0, 8]], [[1, 0, 5]], [[6, 0, 4]], [[4, 8, 13]], [[3, 0, 1]]],
     [[[1, 0, 5], [3, 0, 1], [4, 4, 6]], [[5, 0, 6], [2, 0, 2]], [[4, 6, 13]], [[6, 0, 4], [4, 0, 4]]]),
    # 12 against 10 (dealt one pack a window)
    ([0, 17, 8, 16, 25, 9, 5, 7], 9, 1,
     [[[1, 0, 9]], [[4, 0, 9]], [[4, 9, 18]], [[5, 0, 9]], [[1, 9, 17]], [[3, 9, 16]], [[2, 0, 8]], [[4, 18, 25]],
      [[7, 0, 7]], [[6, 0, 5]], [[3, 4, 9]], [[3, 0, 4]]],
     [[[5, 0, 9]], [[2, 0, 8], [1, 6, 7]], [[7, 0, 7], [1, 4, 6]], [[6, 0, 5], [1, 0, 4]], [[1, 7, 16]],
      [[1, 16, 17], [3, 0, 8]], [[3, 8, 16], [4, 0, 1]], [[4, 1, 10]], [[4, 19, 25]], [[4, 10, 19]]]),
])
def test_split_fill_keeps_the_plan_with_fewer_packs_dealt_window_by_window(lengths, cap, per_window, windowed, filled):
    """Sample 0 is empty, so the filled plan's rows name samples, not positions among the non-empty."""
    cfg = PackingConfig(max_tokens=cap, packs_per_window=per_window, **BFD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overlength warning
        got_windowed = _packs(*plan_packs(lengths, cfg, num_replicas=2))
        got_filled = _packs(*plan_packs(lengths, cfg, num_replicas=2, split_fill=True))
    assert got_windowed == windowed
    assert got_filled == filled
    _check_plan(filled, lengths, cap, 1)


def test_split_fill_over_samples_that_all_fit_is_the_windowed_plan():
    """Only a sample over the cap makes ``split_fill`` plan the pass at once: here the whole pass
    best-fit decreasing would need 10 packs, the windows (one pack each) 11, and 11 it is; two
    samples are exactly at the cap."""
    cfg = PackingConfig(max_tokens=10, packs_per_window=1, **BFD)
    lengths = [9, 5, 6, 7, 3, 10, 1, 3, 4, 6, 5, 2, 1, 1, 1, 2, 10, 2, 7, 8, 3]
    windowed = _packs(*plan_packs(lengths, cfg))
    assert len(windowed) == 11
    assert _packs(*plan_packs(lengths, cfg, split_fill=True)) == windowed


def test_split_fill_with_as_many_packs_as_the_windows_keeps_the_windowed_plan():
    cfg = PackingConfig(max_tokens=9, packs_per_window=2, **BFD)
    lengths = [8, 9, 2, 2, 1, 5, 22, 17]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overlength warning
        windowed = _packs(*plan_packs(lengths, cfg, num_replicas=3))
        assert len(windowed) == 9  # the plan at once needs 9 too
        assert _packs(*plan_packs(lengths, cfg, num_replicas=3, split_fill=True)) == windowed


def test_split_fill_deals_its_packs_by_the_given_cost_model():
    """The filled plan is dealt (LPT per window of 3 packs) with the cost model given, here a pack's tokens;
    the default model, which prices attention pairs too, deals these packs in another order."""
    cfg = PackingConfig(max_tokens=9, packs_per_window=3, **BFD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overlength warning
        got = _packs(*plan_packs([1, 9, 26, 8, 14, 23, 17, 23, 5], cfg, num_replicas=2, split_fill=True,
                                 cost_model=TOKENS))
    assert got == [
        [[1, 0, 9]], [[3, 0, 8], [0, 0, 1]], [[8, 0, 5], [2, 0, 4]], [[2, 4, 13]], [[2, 13, 22]],
        [[2, 22, 26], [4, 0, 5]], [[4, 5, 14]], [[5, 0, 9]], [[5, 9, 18]], [[5, 18, 23], [6, 0, 4]], [[6, 4, 13]],
        [[6, 13, 17], [7, 0, 5]], [[7, 5, 14]], [[7, 14, 23]]]
    _check_plan(got, [1, 9, 26, 8, 14, 23, 17, 23, 5], 9, 1)


# ------------------------------------------------------------------------------ cpu_kernels
import torch  # noqa: E402

from atac_hf.attention import cpu_kernels as ck  # noqa: E402


@pytest.mark.skipif(ck._CPU_FLASH is None or ck._CPU_FLASH_BWD is None, reason="no CPU flash kernel")
def test_the_prefix_merge_is_available_on_the_cpu_only():
    assert ck.prefix_merge_available("cpu") is True
    assert ck.prefix_merge_available(torch.device("cpu")) is True
    for device in ("cuda", torch.device("cuda", 1), "meta"):
        assert ck.prefix_merge_available(device) is False

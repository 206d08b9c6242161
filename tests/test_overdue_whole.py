"""An overdue sample that fits the cap is placed whole: it displaces younger samples to the
next window before anything is cut (``place_overdue``; fidelity: no default cuts a sample
that fits the cap)."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.packing.planners.window import WindowContext, place_overdue

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


def _ctx(window: int, **kw) -> WindowContext:
    kw.setdefault("max_tokens", 10)
    kw.setdefault("packs_per_window", 2)
    kw.setdefault("max_defer", 1)
    return WindowContext(PackingConfig(**kw), LINEAR, window, False, 1.0)


def test_overdue_whole_sample_displaces_a_younger_one():
    # window 1: packs hold two fresh 8s (room 2 each); the 5 arrived in window 0 and is overdue
    packs = [[(1, 0, 8, 1, 1, 0)], [(2, 0, 8, 1, 2, 0)]]
    overdue = (0, 0, 5, 0, 0, 0)
    carry, newly = place_overdue(packs, [overdue], _ctx(1))
    assert newly == []  # nothing was cut
    assert packs == [[overdue], [(2, 0, 8, 1, 2, 0)]]  # the first pack (tie: same cost) gave way
    assert carry == [(1, 0, 8, 1, 1, 0)]  # the displaced 8 waits one window, whole


def test_displacement_takes_the_pack_where_fewest_tokens_leave():
    packs = [[(1, 0, 8, 1, 1, 0)], [(2, 0, 3, 1, 2, 0), (3, 0, 4, 1, 3, 0)]]  # rooms 2 and 3
    overdue = (0, 0, 6, 0, 0, 0)  # needs 4 more tokens of room in pack 0, 3 in pack 1
    carry, newly = place_overdue(packs, [overdue], _ctx(1))
    assert newly == []
    assert packs[1] == [(2, 0, 3, 1, 2, 0), overdue] and carry == [(3, 0, 4, 1, 3, 0)]
    assert packs[0] == [(1, 0, 8, 1, 1, 0)]


def test_overdue_samples_are_never_displaced():
    # every sample in the packs is overdue too: nothing may leave, so the 5 is split (as before)
    packs = [[(1, 0, 8, 0, 1, 0)], [(2, 0, 8, 0, 2, 0)]]
    overdue = (0, 0, 4, 0, 0, 0)
    carry, newly = place_overdue(packs, [overdue], _ctx(1, min_fragment=1))
    assert newly == [(0, 4)] and carry == []
    assert sorted(e - s for p in packs for sid, s, e, *_ in p if sid == 0) == [2, 2]


def test_split_overdue_false_still_keeps_it_whole_when_room_can_be_made():
    packs = [[(1, 0, 8, 1, 1, 0)], [(2, 0, 8, 1, 2, 0)]]
    overdue = (0, 0, 5, 0, 0, 0)
    carry, newly = place_overdue(packs, [overdue], _ctx(1, split_overdue=False))
    assert newly == [] and overdue in packs[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from(["bfd", "wfap", "sequential"]), st.integers(1, 4),
       st.integers(2, 6))
def test_no_sample_that_fits_is_cut_when_deferral_is_on(seed, strategy, max_defer, packs_per_window):
    # even at small max_defer (1-4; the default is 16). Not "wlb": the WLB-LLM baseline holds
    # samples in its queues until they are all overdue, so no younger sample can make room and
    # split_overdue cuts (as WLB-LLM does); with split_overdue=False it keeps them whole too.
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(16, 200))
    lengths = rng.integers(1, cap + 1, size=int(rng.integers(20, 200)))  # every sample fits
    cost = CostModel(linear_s_per_token=1.0, attn_s_per_pair=float(rng.choice([0.0, 0.01, 1.0])), tile=1)
    config = PackingConfig(max_tokens=cap, packs_per_window=packs_per_window, strategy=strategy,
                           max_defer=max_defer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pack_lengths(lengths, config, cost)
    pieces = {}
    for pack in res.packs:
        assert sum(e - s for _, s, e in pack) <= cap
        for sid, s, e in pack:
            pieces.setdefault(sid, []).append((s, e))
    assert sorted(pieces) == list(range(len(lengths)))
    for sid, spans in pieces.items():
        assert spans == [(0, int(lengths[sid]))], (sid, spans)  # whole, exactly once

"""Split mode (overlength samples cut to fit the cap): the whole-pass planner
``atac_hf.packing.split_fill`` and ``plan_packs(split_fill=True)`` on random inputs
(hypothesis): every token once, fragments >= min_fragment, packs within the cap, samples that
fit never cut, and the pack count against ceil(tokens / cap): exact with min_fragment=1
(proved in ``_exact_count``), within 1% + 1 with the default min_fragment on the benchmark's
class of inputs. Also the default min_fragment and the option's errors."""

from __future__ import annotations

import bisect
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atac_hf.packing import PackingConfig
from atac_hf.packing.data.window_planner import plan_packs
from atac_hf.packing.split_fill import plan_split_fill


def _check_plan(packs, lengths, cap, m, *, fits_whole=True):
    """Every token exactly once, contiguous fragments, each >= m (a sample shorter than m is
    whole), packs within the cap and non-empty, samples that fit whole. Returns the
    fragments' lengths (spans of cut samples)."""
    lengths = np.asarray(lengths)
    spans: dict[int, list[tuple[int, int]]] = {}
    for p in packs:
        assert p and sum(e - s for _, s, e in p) <= cap
        for sid, s, e in p:
            assert 0 <= s < e
            spans.setdefault(int(sid), []).append((int(s), int(e)))
    assert sorted(spans) == [i for i in range(lengths.size) if lengths[i] > 0]
    frags = []
    for sid, got in spans.items():
        got.sort()
        assert got[0][0] == 0 and got[-1][1] == lengths[sid]
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        if fits_whole and lengths[sid] <= cap:
            assert len(got) == 1, f"sample {sid} of {lengths[sid]} tokens fits the cap {cap} but was cut: {got}"
        if len(got) > 1:
            assert min(e - s for s, e in got) >= m
            frags += [e - s for s, e in got]
    return frags


def _bfd_count(items, cap):
    rooms: list[int] = []
    count = 0
    for n in sorted(items, reverse=True):
        k = bisect.bisect_left(rooms, n)
        if k < len(rooms):
            r = rooms.pop(k) - n
        else:
            count += 1
            r = cap - n
        if r:
            bisect.insort(rooms, r)
    return count


def _exact_count(lengths, cap):
    """The count with min_fragment=1, proved: step 1 packs the samples that fit into ``nF``
    packs (best-fit decreasing); with m = 1 every landing is clean, so the overlength tokens
    fill every room in order and then full packs: ``ceil(tokens / cap)`` packs when they
    outnumber the rooms, else ``nF`` (which is then >= that bound)."""
    lengths = np.asarray(lengths)
    nF = _bfd_count([int(n) for n in lengths if 0 < n <= cap], cap)
    return max(-(-int(lengths.sum()) // cap), nF)


@st.composite
def split_cases(draw):
    cap = draw(st.integers(1, 300))
    lengths = draw(st.lists(st.integers(0, 4 * cap), min_size=1, max_size=150))
    if draw(st.booleans()):  # many short samples besides
        lengths += draw(st.lists(st.integers(1, max(1, cap // 6)), max_size=100))
    m = draw(st.integers(1, max(1, cap // 2)))
    return np.array(lengths, dtype=np.int64), cap, m


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_cases())
def test_split_fill_invariants(case):
    lengths, cap, m = case
    packs = plan_split_fill(lengths, cap, m)
    _check_plan(packs, lengths, cap, m)
    assert len(packs) >= -(-int(lengths.sum()) // cap)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_cases())
def test_split_fill_exact_count_with_min_fragment_one(case):
    lengths, cap, _m = case
    packs = plan_split_fill(lengths, cap, 1)
    _check_plan(packs, lengths, cap, 1)
    assert len(packs) == _exact_count(lengths, cap)


@st.composite
def bench_cases(draw):
    """The benchmark's class (docs/BENCHMARKS.md "Split mode"): a cap, 100-399 samples of
    1 to 3x the cap."""
    cap = draw(st.one_of(st.integers(64, 511), st.integers(4096, 32767)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return rng.integers(1, 3 * cap, size=int(rng.integers(100, 400))), cap


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bench_cases(), st.sampled_from([1, 4]))
def test_plan_packs_split_fill_within_one_percent(case, num_replicas):
    lengths, cap = case
    config = PackingConfig(max_tokens=cap, packs_per_window=64, strategy="bfd")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overlength warning
        spans, offsets = plan_packs(lengths, config, num_replicas=num_replicas, split_fill=True)
        windowed = len(plan_packs(lengths, config, num_replicas=num_replicas)[1]) - 1
    packs = [spans[offsets[b]:offsets[b + 1]].tolist() for b in range(len(offsets) - 1)]
    frags = _check_plan(packs, lengths, cap, config.min_fragment)
    assert frags  # overlength samples were cut (the property is not vacuous)
    lb = -(-int(lengths.sum()) // cap)
    # within 1% (+1) of the bound, then rounded up to a whole round: every replica gets as many
    # packs (even_batches), so 4 replicas may need up to 3 packs more than one would
    bound = 1.01 * lb + 1
    assert len(packs) <= -(-int(bound) // num_replicas) * num_replicas and len(packs) <= windowed
    assert len(packs) % num_replicas == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_cases(), st.sampled_from(["bfd", "wfap", "sequential", "wlb"]), st.integers(1, 8), st.integers(1, 3),
       st.integers(0, 4))
def test_plan_packs_never_cuts_a_sample_that_fits(case, strategy, packs_per_window, num_replicas, max_defer):
    """In split mode only overlength samples are cut (whatever the strategy, with or without
    split_fill, however short the deferral) unless a setting asks for more: ``split_overdue``
    (an overdue sample that fits no pack whole is cut over pack ends; on by default, and with
    ``max_defer`` 0-3 it cuts a fitting sample in about a quarter of these random passes) and
    ``even_batches`` over several replicas (a document may be cut rather than a batch
    repeated: tests/test_feeders.py). Both are off here."""
    lengths, cap, m = case
    if int(lengths.sum()) < 1:
        return
    config = PackingConfig(max_tokens=cap, packs_per_window=packs_per_window, strategy=strategy, min_fragment=m,
                           max_defer=max_defer, split_overdue=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fill in ([False, True] if strategy == "bfd" else [False]):
            spans, offsets = plan_packs(lengths, config, num_replicas=num_replicas, even_batches=False,
                                        split_fill=fill)
            packs = [spans[offsets[b]:offsets[b + 1]].tolist() for b in range(len(offsets) - 1)]
            _check_plan(packs, lengths, cap, m)


def test_split_fill_small_hand_case():
    # cap 10, m 2: the whole samples 7 and 6 leave rooms 3 and 4; the 13-token sample pours
    # into the larger room (4), then the other (3), and its last 6 tokens open a pack
    packs = plan_split_fill([6, 13, 7], 10, 2)
    assert packs == [[(2, 0, 7), (1, 4, 7)], [(0, 0, 6), (1, 0, 4)], [(1, 7, 13)]]
    _check_plan(packs, [6, 13, 7], 10, 2)


def test_default_min_fragment_is_cap_relative():
    assert [PackingConfig(max_tokens=c, packs_per_window=1).min_fragment for c in (1, 7, 8, 64, 400, 1024, 4096)] \
        == [1, 1, 1, 8, 50, 128, 128]


def test_split_fill_errors():
    with pytest.raises(ValueError, match=r"split_fill=True needs strategy='bfd' and overlength='split', got "
                                         r"strategy='wfap', overlength='split' \(set those, or split_fill=False\)"):
        plan_packs([5, 30], PackingConfig(max_tokens=16, packs_per_window=2), split_fill=True)
    with pytest.raises(ValueError, match=r"got strategy='bfd', overlength='truncate'"):
        plan_packs([5, 30], PackingConfig(max_tokens=16, packs_per_window=2, strategy="bfd", overlength="truncate"),
                   split_fill=True)
    with pytest.raises(TypeError, match=r"split_fill='yes' must be True or False \(set split_fill\)"):
        plan_packs([5, 30], PackingConfig(max_tokens=16, packs_per_window=2, strategy="bfd"), split_fill="yes")

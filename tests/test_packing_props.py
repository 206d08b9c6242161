"""Property tests of the packing planners over random lengths (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, pack_lengths, recount_metrics

COST = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.05, tile=4, segment_overhead_s=0.5)


@st.composite
def cases(draw):
    cap = draw(st.integers(4, 200))
    lengths = draw(st.lists(st.integers(0, 3 * cap), min_size=1, max_size=120))
    if draw(st.booleans()):  # a few heavy samples among many short ones, as in real mixes
        lengths = lengths + draw(st.lists(st.integers(1, max(1, cap // 8)), min_size=0, max_size=200))
    config = PackingConfig(
        max_tokens=cap,
        packs_per_window=draw(st.integers(1, 6)),
        strategy=draw(st.sampled_from(["wfap", "sequential", "bfd", "wlb"])),
        overlength=draw(st.sampled_from(["split", "truncate"])),
        max_defer=draw(st.integers(0, 4)),
        min_fragment=draw(st.integers(1, max(1, cap // 2))),
        reference_doc_tokens=draw(st.sampled_from([1, 16, 2048])),
        balance_split=draw(st.booleans()),
    )
    window = draw(st.one_of(st.none(), st.integers(1, 30)))
    return lengths, config, window


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_packing_invariants(case):
    lengths, config, window = case
    cap = config.max_tokens
    res = pack_lengths(lengths, config, COST, window=window)

    # every pack non-empty and within the cap; at most packs_per_window per window
    assert all(res.packs) and all(sum(e - s for _, s, e in p) <= cap for p in res.packs)
    assert all(len(w) <= config.packs_per_window for w in res.windows())
    # each sample appears once, or its fragments cover it exactly (truncate: its head)
    spans: dict[int, list[tuple[int, int]]] = {}
    for p in res.packs:
        for sid, s, e in p:
            assert 0 <= s < e
            spans.setdefault(sid, []).append((s, e))
    for sid, length in enumerate(lengths):
        want = min(length, cap) if config.overlength == "truncate" else length
        if want == 0:
            assert sid not in spans
            continue
        got = sorted(spans[sid])
        assert got[0][0] == 0 and got[-1][1] == want
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))  # contiguous, no overlap
        if len(got) > 1:
            assert min(e - s for s, e in got) >= config.min_fragment
    # samples past their deadline are exactly the ones metrics report as overdue
    assert res.metrics["num_overdue"] == sum(1 for _, d in res.deferred if d > config.max_defer)
    # deferral is bounded when windows are sized by tokens and a window's overdue samples fit
    # in it: every sample fits in a pack and a window has several (with one pack per window,
    # or a sample split into more pieces than a window has packs, samples must span windows)
    if window is None and config.max_defer >= 1 and config.packs_per_window >= 2 and max(lengths) <= cap:
        assert res.metrics["num_overdue"] == 0
    # the running metrics agree with a recount from the packs
    again = recount_metrics(res.windows(), lengths, max_tokens=cap, cost_model=COST, arrival=res.arrival)
    for k, v in again.items():
        assert res.metrics[k] == pytest.approx(v, nan_ok=True), k
    assert sorted(d for _, d in res.deferred) == sorted(
        d for d in (max(w for p, w in zip(res.packs, res.pack_window) for s in p if s[0] == sid) - res.arrival[sid]
                    for sid in spans) if d > 0)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_packing_is_deterministic(case):
    lengths, config, window = case
    a = pack_lengths(lengths, config, COST, window=window)
    b = pack_lengths(list(np.asarray(lengths)), config, COST, window=window)
    assert a.packs == b.packs and a.deferred == b.deferred and a.metrics == b.metrics

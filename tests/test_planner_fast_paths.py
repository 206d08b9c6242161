"""The planner's small-array fast paths (issue 16: planner time) give bit-identical results to the
plain numpy formulations they replace: the cost model's shared pass (tile counts as shifts), the
scalar comm_cost, subgroups._level in Python floats, and per_doc_flat."""

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding.segments import per_doc_flat, per_doc_segments
from atac_hf.sharding.subgroups import _level
import atac_hf.sharding.segments as segments_mod


def _reference_pairs(cm: CostModel, s, e):
    """attention_pairs as written before the fast path (ceilings by floor division)."""
    s = np.asarray(s, dtype=np.int64)
    e = np.asarray(e, dtype=np.int64)
    n = np.maximum(e - s, 0)
    t = cm.tile
    if t == 1:
        pairs = n * s + n * (n + 1) // 2
    else:
        nq, c, last = -(-n // t), -(-s // t), -(-e // t)
        m = np.maximum(nq - 1, 0)
        pairs = (m * (c + 1) + ((m * (m - 1)) >> 1) + np.where(n > 0, last, 0)) * (t * t)
    pairs = pairs.astype(np.float64)
    if cm.sliding_window is not None:
        w = int(cm.sliding_window)

        def prefix(x):
            a = np.minimum(x, w)
            return a * (a + 1) // 2 + np.maximum(x - w, 0) * w

        pairs = np.minimum(pairs, (prefix(e) - prefix(s)).astype(np.float64) + (n * (t - 1) if t > 1 else 0))
    return pairs


@pytest.mark.parametrize("tile", [1, 2, 3, 64, 100, 128, 256])
@pytest.mark.parametrize("window", [None, 1, 500, 4096])
def test_attention_pairs_and_costs_match_reference(tile, window):
    rng = np.random.default_rng(tile * 7 + (window or 0))
    cm = CostModel(linear_s_per_token=2.6e-6, attn_s_per_pair=1.16e-10, segment_overhead_s=1.5e-5, tile=tile,
                   sliding_window=window)
    s = rng.integers(0, 200_000, 500)
    e = s + rng.integers(-3, 20_000, 500)  # empty and reversed segments too
    e[:20] = s[:20]
    ref = _reference_pairs(cm, s, e)
    got = cm.attention_pairs(s, e)
    assert got.dtype == np.float64 and np.array_equal(got, ref)
    calls = (e > s).astype(np.float64)
    attn = ref * cm.attn_s_per_pair + calls * cm.segment_overhead_s
    assert np.array_equal(cm.attention_cost(s, e), attn)
    seg = np.maximum(e - s, 0) * cm.linear_s_per_token + attn
    assert np.array_equal(cm.segment_cost(s, e), seg)
    both = cm.segment_and_attention_cost(s, e)
    assert np.array_equal(both[0], seg) and np.array_equal(both[1], attn)
    # scalars stay numpy scalars, as before
    one = cm.segment_cost(3, 900)
    assert isinstance(one, np.floating) and one == cm.segment_cost(np.array([3]), np.array([900]))[0]
    assert isinstance(cm.attention_pairs(3, 900), np.floating)


@pytest.mark.parametrize("kv", [0, 1, 7, 4096, 131072, 2**40, 2**70, 3.5, -5, 0.0, 1e300])
@pytest.mark.parametrize("C", [2, 3, 8, 16])
def test_comm_cost_of_one_number_matches_array_path(kv, C):
    cm = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-10, kv_bytes_per_token=4096.0,
                   link_bandwidth=4.5e11, link_latency_s=8e-6)
    got = cm.comm_cost(kv, C)
    ref = cm.comm_cost(np.array([kv], dtype=np.float64), C)[0]
    assert isinstance(got, np.float64) and got == ref
    assert cm.comm_cost(np.float64(kv), C) == ref  # the numpy path for numpy scalars


def test_level_matches_numpy_formulation():
    rng = np.random.default_rng(3)
    for _ in range(2000):
        k = int(rng.integers(1, 17))
        base = rng.random(k) * rng.choice([1e-6, 1.0, 1e3])
        if rng.random() < 0.3:
            base[rng.integers(0, k, 2)] = base[0]  # ties
        amount = float(rng.random() * base.sum() * rng.choice([0.0, 0.1, 1.0, 10.0]))
        srt = np.sort(base)
        levels = (amount + np.cumsum(srt)) / np.arange(1, k + 1)
        ref = np.maximum(levels[int((levels >= srt).nonzero()[0][-1])] - base, 0.0)
        assert np.array_equal(_level(base, amount), ref)


@pytest.mark.parametrize("flat_max", [0, 1 << 16])
def test_per_doc_flat_is_per_doc_segments(monkeypatch, flat_max):
    monkeypatch.setattr(segments_mod, "_PER_DOC_FLAT_MAX", flat_max)
    rng = np.random.default_rng(flat_max)
    for i in range(400):
        D, C = int(rng.integers(1, 40)), int(rng.integers(1, 17))
        L = rng.integers(1, [2, 10, 100, 5000][i % 4] + 1, D)
        seg, rank = per_doc_flat(L, C)
        ref = per_doc_segments(L, C)
        assert seg.dtype == np.int64 and np.array_equal(seg, np.concatenate(ref))
        assert np.array_equal(rank, np.repeat(np.arange(C), [len(x) for x in ref]))

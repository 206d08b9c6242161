"""Holes found by the fifteenth mutation pass (issue 20; docs/TESTING.md "Fifteenth pass").

mutmut over every mutant of ``sharding/segments.py``, ``sharding/baselines.py`` and
``sharding/plan.py``; the layouts' oracle is in ``tests/test_key_buffer_oracle.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from atac_hf.sharding import plan_shards
from atac_hf.sharding.plan import check_window
from atac_hf.sharding.segments import _merge_flat, merge_adjacent


def _merge_reference(seg) -> list[list[int]]:
    out: list[list[int]] = []
    for d, s, e in np.asarray(seg, dtype=np.int64).reshape(-1, 3).tolist():
        if out and out[-1][0] == d and out[-1][2] == s:
            out[-1][2] = e
        else:
            out.append([d, s, e])
    return out


def test_merge_adjacent_joins_touching_chunks_of_one_document_only():
    seg = [[0, 0, 5], [0, 5, 9], [0, 9, 12], [1, 12, 14], [1, 0, 3], [2, 3, 7], [2, 8, 9], [2, 9, 10]]
    got = merge_adjacent(seg)
    assert got.dtype == np.int64 and got.shape == (5, 3)
    # [1, 12, 14] then [1, 0, 3]: same document, not touching (the end is not the next start)
    # [2, 3, 7] after [1, 0, 3]: touching positions, another document
    assert got.tolist() == [[0, 0, 12], [1, 12, 14], [1, 0, 3], [2, 3, 7], [2, 8, 10]]


def test_merge_adjacent_small_and_unmergeable_inputs_unchanged():
    assert merge_adjacent([]).shape == (0, 3)
    one = merge_adjacent(np.array([[3, 1, 4]], dtype=np.int32))
    assert one.dtype == np.int64 and one.tolist() == [[3, 1, 4]]
    apart = np.array([[0, 0, 2], [0, 3, 4], [1, 0, 2]])
    assert merge_adjacent(apart).tolist() == apart.tolist()
    assert merge_adjacent([0, 0, 2, 0, 2, 4]).tolist() == [[0, 0, 4]]  # flat input, reshaped


def test_merge_adjacent_and_merge_flat_equal_a_loop_on_random_segments():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 12))
        docs = np.sort(rng.integers(0, 3, n))
        starts = rng.integers(0, 6, n)
        seg = np.stack([docs, starts, starts + rng.integers(1, 4, n)], 1)
        for i in range(1, n):  # often touching
            if rng.random() < 0.5:
                seg[i, 1] = seg[i - 1, 2]
                seg[i, 2] = seg[i, 1] + int(rng.integers(1, 4))
        assert merge_adjacent(seg).tolist() == _merge_reference(seg)
        rank_of = np.sort(rng.integers(0, 2, n))
        got, got_rank = _merge_flat(seg, rank_of)
        want, want_rank = [], []
        for r in np.unique(rank_of):
            m = _merge_reference(seg[rank_of == r])
            want += m
            want_rank += [int(r)] * len(m)
        assert got.tolist() == want and got_rank.tolist() == want_rank


# ------------------------------------------------------------------ plan.py: windows and empty ranks
@pytest.mark.parametrize("bad", [2.5, 0, -3, True, False, "4", np.float64(3.0)])
def test_a_window_that_is_not_an_int_of_at_least_1_is_refused_with_its_name(bad):
    plan = plan_shards([40, 9], 2, "per_doc", kv_exchange="all_to_all")
    with pytest.raises(ValueError, match=r"^window must be None or an int >= 1 \(the layer's sliding window in "
                                         rf"tokens\), got {re.escape(repr(bad))}$"):
        plan.local_layout(0, window=bad)
    with pytest.raises(ValueError, match=r"^sliding_window must be None or an int >= 1"):
        plan.local_layout(0).varlen_layout(sliding_window=bad)
    assert check_window(np.int64(3)) == 3 and type(check_window(np.int64(3))) is int and check_window(None) is None


@pytest.mark.parametrize("exchange", ["all_gather", "all_to_all"])
def test_layouts_of_ranks_without_tokens_are_empty_and_int64(exchange):
    """A pack of fewer tokens than ranks leaves ranks empty: their layouts have no segment at all
    (every per-segment array as long as seg_doc), and every index array is int64 (LocalLayout's
    contract; the runtime hands them to torch as indices)."""
    plan = plan_shards([2, 1], 6, "per_doc", kv_exchange=exchange)
    empty = [r for r in range(6) if plan.rank_num_tokens()[r] == 0]
    assert empty
    for r in range(6):
        for window in (None, 2):
            lay = plan.local_layout(r, window)
            n = len(lay.seg_doc)
            for f in ("seg_doc", "seg_local_start", "seg_local_end", "seg_doc_start", "seg_doc_end", "send_index",
                      "send_counts"):
                arr = getattr(lay, f)
                assert arr.dtype == np.int64, (r, f, arr.dtype)
                if f.startswith("seg_"):
                    assert len(arr) == n, (r, f)
            assert lay.seg_gathered.dtype == bool and len(lay.seg_gathered) == n
            for idx in lay.doc_key_index.values():
                assert idx.dtype == np.int64
            if r in empty:
                assert n == 0 and lay.n_local == 0
            vl = lay.varlen_layout(sliding_window=window)
            assert vl.k_index.dtype == vl.cu_seqlens_q.dtype == vl.cu_seqlens_k.dtype == np.int64

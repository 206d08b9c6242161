"""ATP's contiguous candidate: one run of the row per rank, gathering only the documents it
cuts. It makes the fewest kernel calls, so it wins where per-call overhead outweighs the
attention (packs of a few hundred tokens per rank); before it was a candidate, ATP's estimate
was up to 1.28x the contiguous layout's there (red-team 8). It is taken where it is faster by
more than TWO_WAY_TOLERANCE and no less level than ATP's plan."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atac_hf.cost import CostModel
from atac_hf.sharding import plan_shards
import atac_hf.sharding.atp as atp_mod
from atac_hf.sharding.atp import TWO_WAY_TOLERANCE
from atac_hf.sharding.baselines import contiguous_compute_floor, contiguous_segments
from atac_hf.sharding.segments import finish_plan

MODELS = {
    "7b@A800": CostModel.from_model("7b", "A800"),
    "8b@H100": CostModel.from_model("8b", "H100"),
    "overhead-heavy": CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.05, tile=4, segment_overhead_s=0.5),
    "windowed": dataclasses.replace(CostModel.from_model("7b", "A800"), sliding_window=256),
    "cross-node": dataclasses.replace(CostModel.from_model("8b", "H100"), node_size=2),
}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(MODELS)), st.sampled_from([2, 3, 4, 8]),
       st.lists(st.integers(1, 4096), min_size=1, max_size=12))
def test_atp_takes_the_contiguous_layout_where_faster_and_no_less_level(model, C, lengths):
    """By its own estimate, without the hierarchical candidates (which compete after it and are
    taken only where no slower: tests/test_subgroup_atp.py). ATP is never slower than per_doc, and
    slower than one contiguous run a rank by more than TWO_WAY_TOLERANCE only where that layout is
    less level than ATP's plan (its balance is what keeps a plan right when the price ratio of
    attention and token-wise work is off)."""
    cm = MODELS[model]
    L = np.asarray(lengths)
    with mock.patch.object(atp_mod, "ANCHOR_SHARES", ()):
        atp = plan_shards(L, C, "atp", cm)
    assert atp.block_time_s <= plan_shards(L, C, "per_doc", cm).block_time_s * (1 + 1e-9)
    run = finish_plan(L, C, "atp", contiguous_segments(L, C), None, cm, "auto")
    assert atp.block_time_s <= run.block_time_s * (1 + TWO_WAY_TOLERANCE) * (1 + 1e-9) or run.imbalance > atp.imbalance


def test_tiny_packs_take_the_contiguous_layout():
    """Three short documents over 4 ranks at 7b@A800 (15 us a kernel call): head-tail chunks
    cost two calls per split document on every rank; one run per rank is faster."""
    cm = MODELS["7b@A800"]
    L = np.array([40, 25, 60])
    atp = plan_shards(L, 4, "atp", cm)
    run = finish_plan(L, 4, "atp", contiguous_segments(L, 4), None, cm, "auto")
    assert atp.block_time_s == pytest.approx(run.block_time_s)
    assert [np.asarray(s).tolist() for s in atp.segments] == [np.asarray(s).tolist() for s in run.segments]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(MODELS)), st.integers(1, 16),
       st.lists(st.integers(0, 70_000), min_size=1, max_size=40).filter(lambda x: sum(x) > 0))
def test_contiguous_floor_is_the_layouts_slowest_compute(model, C, lengths):
    cm = MODELS[model]
    L = np.asarray(lengths)
    plan = finish_plan(L, C, "atp", contiguous_segments(L, C), None, cm, "auto")
    floor = contiguous_compute_floor(L, C, cm)
    assert floor == pytest.approx(float(plan.rank_compute_s.max()), rel=1e-12)
    assert floor <= plan.block_time_s * (1 + 1e-12)


def test_the_cap_is_kept():
    """A cap under what a contiguous run holds keeps ATP's head-tail plan (or reports the overflow)."""
    cm = MODELS["7b@A800"]
    L = np.array([40, 25, 60])
    plan = plan_shards(L, 4, "atp", cm, max_tokens_per_rank=32)
    assert plan.rank_num_tokens().max() <= 32

"""ATP skips building sub-group candidates only where none can win: the work lower bound it
uses never exceeds the slowest rank's compute of any plan, for every strategy and cost model."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from atac_hf.sharding import STRATEGIES, plan_shards
from atac_hf.sharding.atp import _doc_work_lower_bounds, _per_doc_lower_bound, _work_lower_bound
from atac_hf.sharding.baselines import per_doc_block_time
from atac_hf.sim.robustness import scale_attention

from test_sharding import COSTS


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(1, 64), st.integers(1, 20_000)), min_size=1, max_size=30),
       cp=st.integers(2, 8), cost=st.sampled_from(sorted(COSTS)), window=st.sampled_from([None, 7, 300]))
def test_work_lower_bound_is_below_every_plans_slowest_rank(lengths, cp, cost, window):
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.sum() < cp:
        return
    cm = COSTS[cost].replace(sliding_window=window)
    for cm_ in (cm, scale_attention(cm, 0.5)):
        bound = _work_lower_bound(lengths, cp, cm_)
        assert bound > 0
        for strategy in STRATEGIES:
            plan = plan_shards(lengths, cp, strategy, cm_)
            assert float(plan.rank_compute_s.max()) >= bound * (1 - 1e-12), (strategy, cost)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(1, 64), st.integers(1, 20_000)), min_size=1, max_size=30),
       cp=st.integers(2, 8), cost=st.sampled_from(sorted(COSTS)), window=st.sampled_from([None, 7, 300]))
def test_per_doc_lower_bound_is_below_its_block_time(lengths, cp, cost, window):
    """ATP skips costing the per_doc layout where this bound is already above its own plan."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cm = COSTS[cost].replace(sliding_window=window)
    for cm_ in (cm, scale_attention(cm, 0.5)):
        assert _per_doc_lower_bound(lengths, cp, cm_) <= per_doc_block_time(lengths, cp, cm_) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(1, 64), st.integers(1, 20_000)), min_size=1, max_size=30),
       cp=st.integers(2, 8), cost=st.sampled_from(sorted(COSTS)), window=st.sampled_from([None, 7, 300]))
def test_doc_work_lower_bounds_are_below_every_plans_cost_of_each_document(lengths, cp, cost, window):
    """ATP skips finishing the cost-level split where the two-way one is within TWO_WAY_TOLERANCE of a
    bound built from these: the segments any plan cuts a document into never cost less together."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.sum() < cp:
        return
    cm = COSTS[cost].replace(sliding_window=window)
    for cm_ in (cm, scale_attention(cm, 0.5)):
        bound = _doc_work_lower_bounds(lengths, cm_)
        assert np.all(bound > 0)
        assert np.all(bound <= cm_.doc_cost(lengths) * (1 + 1e-12))
        for strategy in STRATEGIES:
            plan = plan_shards(lengths, cp, strategy, cm_)
            seg = np.concatenate(plan.segments)
            per_doc = np.bincount(seg[:, 0], weights=cm_.segment_cost(seg[:, 1], seg[:, 2]), minlength=len(lengths))
            assert np.all(per_doc >= bound * (1 - 1e-12)), (strategy, cost)


@settings(max_examples=80, deadline=None)
@given(length=st.integers(1, 50_000), cuts=st.lists(st.floats(0, 1), max_size=16),
       cost=st.sampled_from(sorted(COSTS)), window=st.sampled_from([None, 7, 300]))
def test_doc_work_lower_bound_holds_for_any_cut_of_a_document(length, cuts, cost, window):
    cm = COSTS[cost].replace(sliding_window=window)
    edges = np.unique(np.concatenate([[0, length], (np.asarray(cuts) * length).astype(np.int64)]))
    for cm_ in (cm, scale_attention(cm, 4.0)):
        bound = float(_doc_work_lower_bounds(np.array([length], np.int64), cm_)[0])
        assert float(cm_.segment_cost(edges[:-1], edges[1:]).sum()) >= bound * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(1, 64), st.integers(1, 20_000)), min_size=2, max_size=30),
       cp=st.integers(3, 8), cost=st.sampled_from(sorted(COSTS)), share=st.sampled_from([0.25, 0.5]))
def test_sub_group_layouts_compute_no_less_than_their_floor(lengths, cp, cost, share):
    """The sub-group planner lays its cost-level re-split only where the two-way one is not within
    TWO_WAY_TOLERANCE of a floor: the mean of the whole documents' cost and the split ones' exact work.
    Every layout's slowest rank computes at least that."""
    from atac_hf.sharding.subgroups import _layouts

    lengths = np.asarray(lengths, dtype=np.int64)
    cm = COSTS[cost]
    got = _layouts(lengths, cp, cm, share, None, 1, True)
    if got is None:
        return
    whole, bound = cm.doc_cost(lengths), _doc_work_lower_bounds(lengths, cm)
    for mode, seg, rank, slowest in got[1]:
        pieces = np.bincount(seg[:, 0], minlength=len(lengths))
        split = pieces > 1
        floor = (whole[~split].sum() + bound[split].sum()) / cp
        assert slowest >= floor * (1 - 1e-12), mode
        assert slowest == float(np.bincount(rank, weights=cm.segment_cost(seg[:, 1], seg[:, 2]), minlength=cp).max())

"""Holes found by the fifteenth mutation pass (issue 20; docs/TESTING.md "Fifteenth pass").

mutmut over every mutant of ``sharding/segments.py``, ``sharding/baselines.py`` and
``sharding/plan.py``; the layouts' oracle is in ``tests/test_key_buffer_oracle.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from atac_hf.sharding import STRATEGIES, ShardPlan, plan_shards
from atac_hf.sharding.plan import check_window
from atac_hf.sharding.routing import routed_pair_counts
from atac_hf.sharding.segments import (_merge_flat, finish_plan, head_tail_bounds, merge_adjacent, per_doc_flat,
                                       per_doc_segments, row_ranges_to_segments)
from atac_hf.sim import ClusterConfig


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


# ------------------------------------------------------------------ segments.py: check_doc_lengths
def test_integral_float_lengths_plan_as_ints_and_others_are_refused():
    """Floats with integral values are lengths (a JSON or pandas column of floats); a value
    past 2**62, a fraction, NaN or inf is not."""
    for floats in ([200.0, 3.0], np.array([130.0, 1.0, 7.0]), np.array([1e6, 5.0], np.float32)):
        ints = [int(x) for x in floats]
        got = plan_shards(floats, 3, "per_doc")
        assert got.doc_lengths.dtype == np.int64 and got.doc_lengths.tolist() == ints
        assert [s.tolist() for s in got.segments] == [s.tolist() for s in plan_shards(ints, 3, "per_doc").segments]
    for bad in ([2.5, 3.0], [2.0**62], np.array([np.nan, 3.0]), np.array([np.inf])):
        with pytest.raises(ValueError, match=r"^doc_lengths must be integers \(ints >= 1\), got dtype float"):
            plan_shards(bad, 2)
    with pytest.raises(ValueError, match=r"^doc_lengths must be integers \(ints >= 1\), got ints beyond int64 or "
                                         r"other objects$"):
        plan_shards([2**70, 3], 2)


def test_a_masked_array_with_masked_entries_is_refused_and_one_without_is_planned():
    with pytest.raises(ValueError, match=r"^doc_lengths is a masked array with masked entries: pass the lengths of "
                                         r"the documents of the pack only \(doc_lengths\.compressed\(\)\)$"):
        plan_shards(np.ma.array([3, 4], mask=[False, True]), 2)
    assert plan_shards(np.ma.array([3, 4], mask=[False, False]), 2).doc_lengths.tolist() == [3, 4]


# ------------------------------------------------------------------ segments.py: finishing plans
def test_row_ranges_skip_an_empty_range_and_go_on():
    offsets = np.array([0, 3, 10, 12])
    assert row_ranges_to_segments(offsets, [(2, 2), (3, 11)]).tolist() == [[1, 0, 7], [2, 0, 1]]
    assert row_ranges_to_segments(offsets, [(0, 2), (5, 5), (11, 12)]).tolist() == [[0, 0, 2], [2, 1, 2]]
    assert row_ranges_to_segments(offsets, [(4, 4)]).shape == (0, 3)


def test_every_strategy_keeps_its_name_route_and_exposed_tail_across_nodes():
    """2 ranks per node, a slow inter-node link: every strategy's all-to-all is routed by node
    (each row crosses into a node once), and the plan says so: its route, the part of the exchange
    no local attention hides (``comm_tail_s``), and its own strategy's name (the ATP plan's
    exchange is decided after its candidates are compared: ``resolve_exchange``)."""
    cm = ClusterConfig(model="7b", hardware="H100", cp_size=8, max_tokens=4096, gpus_per_node=2).cost_model()
    lengths = [617, 2, 46, 44, 50, 11, 6]
    for strategy in sorted(STRATEGIES):
        plan = plan_shards(lengths, 4, strategy, cm, kv_exchange="auto")
        assert plan.strategy == strategy
        assert plan.kv_exchange == "all_to_all" and plan.kv_route_node == 2, strategy
        assert 0 < plan.comm_tail_s <= plan.comm_s, strategy
        # re-costing the same segments routes them the same way
        again = finish_plan(plan.doc_lengths, 4, strategy, plan.segments, plan.gathered_docs, cm, "auto")
        assert again.kv_route_node == 2 and again.block_time_s == plan.block_time_s
        assert finish_plan(plan.doc_lengths, 4, strategy, plan.segments, plan.gathered_docs, cm, "auto",
                           route=None).kv_route_node is None
        gather = plan_shards(lengths, 4, strategy, cm, kv_exchange="all_gather")
        assert gather.kv_exchange == "all_gather" and gather.kv_route_node is None and gather.comm_tail_s == 0.0


@pytest.mark.usefixtures("no_contiguous_candidate")
def test_routing_is_taken_only_where_strictly_faster_and_prices_both_phases():
    cm = ClusterConfig(model="7b", hardware="H100", cp_size=8, max_tokens=4096, gpus_per_node=2).cost_model()
    # a tie (the rows a rank needs come from its own node) and a loss: the direct exchange, one phase
    for lengths, C in (([5], 3), ([5], 4), ([7], 3)):
        plan = plan_shards(lengths, C, "atp", cm)
        routed = finish_plan(plan.doc_lengths, C, "atp", plan.segments, plan.gathered_docs, cm, "all_to_all", route=2)
        assert plan.kv_exchange == "all_to_all" and plan.kv_route_node is None and plan.comm_tail_s == 0.0
        assert (routed.block_time_s, routed.comm_s) >= (plan.block_time_s, plan.comm_s)
    # a win: both phases priced, the second one (which no attention hides) as the tail
    plan = plan_shards([617, 2, 46, 44, 50, 11, 6], 4, "atp", cm)
    first, second = routed_pair_counts(plan.segments, plan.gathered_mask(), cm.exchange_window, 2)
    t1, t2 = cm.a2a_pair_cost(first), cm.a2a_pair_cost(second)
    assert plan.kv_route_node == 2 and plan.comm_s == t1 + t2 and plan.comm_tail_s == t2 > 0
    # under a sliding window the routed exchange moves only the keys inside it, both phases
    win = cm.replace(sliding_window=256)
    plan = plan_shards([1080, 66], 8, "atp", win)
    first, second = routed_pair_counts(plan.segments, plan.gathered_mask(), 256, 2)
    assert plan.kv_route_node == 2 and plan.kv_window == 256
    assert plan.comm_s == win.a2a_pair_cost(first) + win.a2a_pair_cost(second)


def test_a_tie_between_the_exchanges_keeps_the_all_gather():
    """At CP 2 a head-tail split document's all-to-all moves what the all-gather does: the
    same estimate; ATP keeps the all-gather (one collective every rank joins alike)."""
    from atac_hf.cost import default_cost_model

    cm = default_cost_model()
    plan = plan_shards([218], 2, "atp", cm)
    a2a = finish_plan(plan.doc_lengths, 2, "atp", plan.segments, plan.gathered_docs, cm, "all_to_all")
    assert (a2a.block_time_s, a2a.comm_s) == (plan.block_time_s, plan.comm_s)
    assert plan.kv_exchange == "all_gather"


def test_layout_helpers_return_int64_rows_of_three():
    b = head_tail_bounds(np.array([5, 9, 1]), 3)
    assert b.dtype == np.int64 and b.tolist() == [[0, 1, 2, 3, 3, 4, 5], [0, 2, 4, 6, 7, 8, 9], [0, 1, 1, 1, 1, 1, 1]]
    for lengths, C in (([2], 4), ([5, 9], 3), ([1, 1, 7], 5)):
        segs = per_doc_segments(np.array(lengths), C)
        assert len(segs) == C and all(s.dtype == np.int64 and s.ndim == 2 and s.shape[1] == 3 for s in segs)
        flat, rank_of = per_doc_flat(np.array(lengths), C)
        assert flat.dtype == rank_of.dtype == np.int64 and flat.shape[1] == 3
        assert np.concatenate(segs).tolist() == flat.tolist()
    empty = row_ranges_to_segments(np.array([0, 4]), [(1, 1)])
    assert empty.dtype == np.int64 and empty.shape == (0, 3)


@pytest.mark.usefixtures("no_contiguous_candidate")
def test_the_exchange_decided_after_the_candidates_keeps_the_plan_s_fields():
    """ATP costs its candidates with the exchange deferred where the all-gather is hidden on every
    rank, then decides it (resolve_exchange): the all-to-all only where strictly faster, with the
    plan's strategy, its direct route and no exposed tail."""
    from atac_hf.cost import default_cost_model

    cm = default_cost_model()
    # the masked pack: masked pairs at 3x, priced per pair (mask_block 0). With mask_block 4 as well,
    # a non-prefix chunk of a document costs more than the whole document at these sizes
    # ([503, 29, ...]: 1.85 ms split, 1.37 ms whole), so ATP keeps every document whole since it
    # tries fewer anchors than the documents costlier than a share (tests/test_atp_fewer_anchors.py)
    # and there is no exchange left to decide
    for lengths, masked in (([281, 26, 47, 14, 79, 54], False), ([402, 37, 72, 46, 39, 40], True)):
        model = cm.replace(masked_attn_s_per_pair=cm.attn_s_per_pair * 3, mask_block=0) if masked else cm
        plan = plan_shards(lengths, 2, "atp", model)
        gather = finish_plan(plan.doc_lengths, 2, "atp", plan.segments, plan.gathered_docs, model, "all_gather")
        assert plan.kv_exchange == "all_to_all" and plan.strategy == "atp"
        assert plan.kv_route_node is None and plan.comm_tail_s == 0.0 and plan.comm_s < gather.comm_s
        assert plan.block_time_s == gather.block_time_s  # both hidden: the same block time
    # a tie (the all-to-all moves what the all-gather does) keeps the all-gather
    lengths = [396, 16, 32, 77, 39, 1, 54, 77]
    plan = plan_shards(lengths, 2, "atp", cm)
    a2a = finish_plan(plan.doc_lengths, 2, "atp", plan.segments, plan.gathered_docs, cm, "all_to_all", route=None)
    assert (a2a.block_time_s, a2a.comm_s) == (plan.block_time_s, plan.comm_s) and plan.kv_exchange == "all_gather"


@pytest.mark.parametrize("exchange, node", [("all_gather", 2), ("all_to_all", True), ("all_to_all", 2.0),
                                            ("all_to_all", "2"), ("all_to_all", 1), ("all_to_all", 4),
                                            ("all_to_all", 0)])
def test_a_route_the_plan_cannot_run_is_refused(exchange, node):
    plan = plan_shards([40, 9], 4, "per_doc", kv_exchange="all_to_all")
    fields = {f: getattr(plan, f) for f in ("doc_lengths", "cp_size", "strategy", "segments", "gathered_docs",
                                            "rank_compute_s", "comm_s", "block_time_s")}
    with pytest.raises(ValueError, match=rf"^ShardPlan\.kv_route_node={re.escape(repr(node))} needs "
                                         r"kv_exchange='all_to_all' and 2 <= kv_route_node < cp_size=4 \(or None: "
                                         r"a direct exchange\)$"):
        ShardPlan(**fields, kv_exchange=exchange, kv_route_node=node)
    assert ShardPlan(**fields, kv_exchange="all_to_all", kv_route_node=2).kv_route_node == 2

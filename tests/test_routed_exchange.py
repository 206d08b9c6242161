"""The node-routed all-to-all K/V exchange (atac_hf.sharding.routing; issues 15 and 16).

In-process checks: the interval counts the planner prices equal the explicit per-rank tables the
runtime runs; every rank's key buffer holds the rows it attends to and each row crosses into a
node once; emulated CP attention over routed plans equals full attention, forward and backward;
the planner routes where that lowers its block time, and only then. The multi-process (gloo)
equivalence and fault checks are in tests/test_kv_exchange_dist.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atac_hf.attention import emulate_cp_attention, varlen_attention_reference
from atac_hf.attention.kv_exchange import received_rows
from atac_hf.cost import default_cost_model
from atac_hf.sharding import ShardPlan, plan_shards
from atac_hf.sharding.exchange import a2a_pair_counts, a2a_rows
from atac_hf.sharding.routing import routed_pair_counts, routed_tables
from atac_hf.sharding.segments import finish_plan
from atac_hf.sim import ClusterConfig

FIELDS = ("doc_lengths", "cp_size", "strategy", "segments", "gathered_docs", "rank_compute_s", "comm_s",
          "block_time_s")


def routed(plan: ShardPlan, node: int) -> ShardPlan:
    return ShardPlan(**{f: getattr(plan, f) for f in FIELDS}, kv_exchange="all_to_all", kv_route_node=node)


def random_cases(n: int, seed: int):
    rng = np.random.default_rng(seed)
    strategies = ("atp", "per_doc", "zigzag", "contiguous")
    for it in range(n):
        C = int(rng.integers(3, 9))
        node = int(rng.integers(2, C))
        lengths = rng.integers(1, 60, int(rng.integers(1, 8)))
        lengths[0] = rng.integers(20, 200)
        plan = plan_shards(lengths, C, strategies[it % 4], kv_exchange="all_to_all")
        if len(plan.gathered_docs):
            yield plan, node


@pytest.mark.parametrize("window", [None, 1, 3, 17])
def test_priced_counts_equal_the_runtime_tables_and_no_row_enters_a_node_twice(window):
    checked = 0
    for plan, node in random_cases(40, seed=1 if window is None else window):
        C, g = plan.cp_size, plan.gathered_mask()
        first, second = routed_pair_counts(plan.segments, g, window, node)
        for r in range(C):
            t = routed_tables(plan.segments, g, window, node, r)
            assert np.array_equal(t["send1_counts"], first[r]) and np.array_equal(t["recv1_counts"], first[:, r])
            assert np.array_equal(t["send2_counts"], second[r]) and np.array_equal(t["recv2_counts"], second[:, r])
            assert len(t["send1"]) == first[r].sum() and len(t["send2"]) == second[r].sum()
            # the rows r receives over both phases cover exactly what the direct exchange sends it
            got = set(zip(t["recv_docs"].tolist(), t["recv_pos"].tolist()))
            want = set()
            for s in range(C):
                if s != r:
                    _, d, p = a2a_rows(plan.segments, g, s, r, window)
                    want |= set(zip(d.tolist(), p.tolist()))
            assert want <= got and len(got) == len(t["recv_docs"]), "a needed row is missing or came twice"
        # into a remote node, a source sends each row once: its union over the node's ranks
        for s in range(C):
            for lo in range(0, C, node):
                ranks = range(lo, min(C, lo + node))
                if s in ranks:
                    continue
                union = set()
                for r in ranks:
                    union |= set(a2a_rows(plan.segments, g, s, r, window)[0].tolist())
                assert first[s, lo:lo + node].sum() == len(union)
                assert (second[np.ix_(list(ranks), list(ranks))].diagonal() == 0).all()
        checked += 1
    assert checked >= 25


def with_empty_segments(plan: ShardPlan, rng) -> ShardPlan:
    """``plan`` with empty segments ``(d, x, x)`` of gathered documents added on ranks that hold
    other documents' queries or none of ``d`` (``validate`` allows an empty segment anywhere)."""
    segs = [np.asarray(s).copy() for s in plan.segments]
    for r in rng.choice(plan.cp_size, 2, replace=False).tolist():
        d = int(rng.choice(plan.gathered_docs))
        x = int(rng.integers(0, plan.doc_lengths[d] + 1))
        segs[r] = np.concatenate([segs[r], [[d, x, x]]]).astype(np.int64)
    out = ShardPlan(**{f: getattr(plan, f) for f in FIELDS if f != "segments"}, segments=tuple(segs),
                    kv_exchange=plan.kv_exchange, kv_route_node=plan.kv_route_node)
    out.validate()
    return out


@pytest.mark.parametrize("window", [None, 3])
def test_priced_counts_equal_the_runtime_tables_with_empty_segments(window):
    """An empty segment ``(d, x, x)`` of a gathered document makes its rank need the prefix
    ``[0, x)`` in the runtime's tables (``exchange._ranges``); the routed pricing dropped such
    segments, so a hand-built plan was priced below what the runtime moves (rank 3 of the plan
    below: 4 rows priced, 8 received). Found by the twenty-second mutation pass."""
    segs = (np.array([[0, 0, 4]]), np.array([[0, 4, 8]]), np.array([[0, 8, 12]]), np.array([[1, 0, 5], [0, 8, 8]]))
    hand = ShardPlan(doc_lengths=np.array([12, 5]), cp_size=4, strategy="x", segments=segs,
                     gathered_docs=np.array([0]), rank_compute_s=np.ones(4), kv_exchange="all_to_all",
                     kv_route_node=2)
    hand.validate()
    rng = np.random.default_rng(22)
    cases = [(hand, 2)] + [(with_empty_segments(p, rng), node) for p, node in random_cases(40, seed=22)]
    for plan, node in cases:
        C, g = plan.cp_size, plan.gathered_mask()
        first, second = routed_pair_counts(plan.segments, g, window, node)
        for r in range(C):
            t = routed_tables(plan.segments, g, window, node, r)
            assert t["send1_counts"].tolist() == first[r].tolist() and t["recv1_counts"].tolist() == first[:, r].tolist()
            assert t["send2_counts"].tolist() == second[r].tolist() and t["recv2_counts"].tolist() == second[:, r].tolist()
        # the routed phases deliver every row the direct exchange prices
        direct = a2a_pair_counts(plan.segments, g, window).sum(axis=0)
        assert (first.sum(axis=0) + second.sum(axis=0) >= direct).all()
    first, second = routed_pair_counts(hand.segments, hand.gathered_mask(), None, 2)
    assert (first.sum(axis=0) + second.sum(axis=0)).tolist() == [0, 4, 8, 8] == hand.kv_recv_tokens.tolist()


@pytest.mark.parametrize("window", [None, 5])
def test_emulated_routed_cp_attention_equals_full_attention_fwd_bwd(window):
    checked = 0
    for i, (plan, node) in enumerate(random_cases(10, seed=7)):
        plan = routed(plan, node)
        lengths = plan.doc_lengths
        g = torch.Generator().manual_seed(i)
        N = int(lengths.sum())
        q, k, v = (torch.randn(h, N, 8, generator=g, dtype=torch.float64).requires_grad_() for h in (4, 2, 2))
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]))
        ref = varlen_attention_reference(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), cu, cu,
                                         window=window, scaling=0.3)
        gout = torch.randn_like(ref)
        ref_grads = torch.autograd.grad(ref, (q, k, v), gout)
        for backend in ("sdpa", "varlen_reference"):
            out = emulate_cp_attention(q, k, v, plan, backend=backend, scaling=0.3, window=window)
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
            for a, b in zip(torch.autograd.grad(out, (q, k, v), gout), ref_grads):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        # the single-process key buffer (benchmarks, timing) is the one the layout indexes
        with torch.no_grad():
            for r in range(plan.cp_size):
                lay = plan.local_layout(r, window)
                buf = received_rows(plan, r, k, v, window)
                assert lay.route is not None and buf.shape[0] == lay.num_key_rows
                for d, idx in lay.doc_key_index.items():
                    rows = plan.doc_offsets[d] + np.flatnonzero(idx >= 0)
                    torch.testing.assert_close(buf[idx[idx >= 0], :, :8], k[:, rows].transpose(0, 1))
        checked += 1
    assert checked >= 6


def cluster_model():
    """13B-like, TP 4 x CP 4 on 8-GPU nodes: 2 CP ranks per node, 50 GB/s between nodes."""
    return ClusterConfig(model="13b", hardware="H100", cp_size=4, tp_size=4, max_tokens=65536,
                         gpus_per_node=8).cost_model()


def test_the_planner_routes_a_document_split_across_nodes_and_it_is_faster():
    cm = cluster_model()
    assert cm.node_size == 2
    for lengths in ([65536], [40000, 3000, 2000, 900], [20000, 9000, 4000, 4000, 3000, 2500, 2000, 1500, 1000]):
        plan = plan_shards(lengths, 4, "atp", cm)
        plan.validate()
        assert plan.kv_exchange == "all_to_all" and plan.kv_route_node == 2, lengths
        direct = cm.a2a_pair_cost(a2a_pair_counts(plan.segments, plan.gathered_mask()))
        assert plan.comm_s < direct and 0 < plan.comm_tail_s < plan.comm_s
        compute = plan.rank_compute_s
        assert plan.block_time_s <= float(compute.max()) + direct + 1e-12
        first, second = routed_pair_counts(plan.segments, plan.gathered_mask(), None, 2)
        assert np.array_equal(plan.kv_recv_tokens, first.sum(axis=0) + second.sum(axis=0))
        # what crosses into a rank's node: its share of its node's union, not all it needs
        cross = np.arange(4)[:, None] // 2 != np.arange(4)[None, :] // 2
        direct_rows = a2a_pair_counts(plan.segments, plan.gathered_mask())
        assert (first * cross).sum(axis=0).max() < (direct_rows * cross).sum(axis=0).max()
        assert (first * cross).sum() < (direct_rows * cross).sum()
        same = ShardPlan(**{f: getattr(plan, f) for f in FIELDS}, kv_exchange="all_to_all")
        assert same.digest != plan.digest  # ranks that route differently never agree on a plan
    # one node, or no node size: nothing to route
    for model in (cm.replace(node_size=None), cm.replace(node_size=4), default_cost_model()):
        assert plan_shards([65536], 4, "atp", model).kv_route_node is None


def test_no_routing_where_the_direct_exchange_is_hidden():
    cm = cluster_model()
    # many whole documents hide a small anchor's exchange on every rank
    lengths = [3000] + [1200] * 40
    plan = finish_plan(np.array(lengths), 4, "x", [np.array([[0, 0, 750]] + [[d, 0, 1200] for d in range(1, 11)]),
                                                    np.array([[0, 750, 1500]] + [[d, 0, 1200] for d in range(11, 21)]),
                                                    np.array([[0, 1500, 2250]] + [[d, 0, 1200] for d in range(21, 31)]),
                                                    np.array([[0, 2250, 3000]] + [[d, 0, 1200] for d in range(31, 41)])],
                       None, cm, "all_to_all")
    assert plan.kv_route_node is None and plan.comm_tail_s == 0.0


@pytest.mark.parametrize("bad", [1, 4, 7, 0, 2.0, True, "2"])
def test_a_route_needs_an_all_to_all_over_several_nodes(bad):
    plan = plan_shards([50, 30, 20], 4, "per_doc", kv_exchange="all_to_all")
    with pytest.raises(ValueError, match=rf"kv_route_node={bad!r}.*2 <= kv_route_node < cp_size=4"):
        routed(plan, bad)
    with pytest.raises(ValueError, match="needs kv_exchange='all_to_all'"):
        ShardPlan(**{f: getattr(plan, f) for f in FIELDS}, kv_exchange="all_gather", kv_route_node=2)


def test_recosting_a_plan_keeps_its_routing():
    """The simulator re-times a plan under another cost model with the exchange it runs
    (finish_plan's ``route``): routed stays routed, direct stays direct."""
    cm = cluster_model()
    plan = plan_shards([40000, 3000, 2000, 900], 4, "atp", cm)
    assert plan.kv_route_node == 2
    args = (plan.doc_lengths, 4, plan.strategy, list(plan.segments), plan.gathered_docs)
    same = finish_plan(*args, cm, "all_to_all", route=plan.kv_route_node)
    assert same.kv_route_node == 2 and same.block_time_s == plan.block_time_s and same.comm_s == plan.comm_s
    direct = finish_plan(*args, cm, "all_to_all", route=None)
    assert direct.kv_route_node is None and direct.block_time_s > plan.block_time_s
    cheap_link = cm.replace(link_bandwidth=cm.intra_node_bandwidth)  # routing no longer pays off
    assert finish_plan(*args, cheap_link, "all_to_all").kv_route_node is None
    assert finish_plan(*args, cheap_link, "all_to_all", route=2).kv_route_node == 2

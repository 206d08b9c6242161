"""Hierarchical ATP (anchors over sub-groups of ranks) and the only-needed K/V exchange
(issue 16), in one process: the exchange layout on hand-checked cases, every rank of
all-to-all plans emulated against full-row attention (forward and backward), property
tests of the sub-group planner, the cost of the exchange, and the refusals.
The multi-process (gloo) checks are in tests/test_kv_exchange_dist.py."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from atac_hf.attention import emulate_cp_attention
from atac_hf.attention.kv_exchange import KVAllToAll, received_rows
from atac_hf.attention.reference import reference_attention
from atac_hf.cost import CostModel, default_cost_model
from atac_hf.sharding import STRATEGIES, plan_shards
from atac_hf.sharding import atp as atp_mod
from atac_hf.sharding.exchange import a2a_token_counts
from atac_hf.sharding.plan import ShardPlan
from atac_hf.sharding.subgroups import plan_subgroups


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread


def _owners(plan, d):
    return sum(int(d in s[:, 0]) for s in plan.segments)


# ---------------------------------------------------------------------------- exchange layout
def test_needed_rows_hand_checked():
    # one document of 8 tokens, head-tail over 2 ranks: rank 0 holds [0, 2) + [6, 8), rank 1 [2, 6)
    plan = plan_shards([8], 2, "per_doc", kv_exchange="all_to_all")
    assert [s.tolist() for s in plan.segments] == [[[0, 0, 2], [0, 6, 8]], [[0, 2, 6]]]
    # rank 0 attends to keys [0, 8) and holds 4: receives 4; rank 1 attends to [0, 6): receives [0, 2)
    assert plan.kv_recv_tokens.tolist() == [4, 2]
    assert plan.a2a_token_counts[1].tolist() == [2, 4]  # sends: rank 0 [0, 2), rank 1 [2, 6)
    lay0, lay1 = plan.local_layout(0), plan.local_layout(1)
    assert lay0.send_counts.tolist() == [0, 2] and lay0.recv_counts.tolist() == [0, 4]
    assert lay1.send_counts.tolist() == [4, 0] and lay1.recv_counts.tolist() == [2, 0]
    assert lay1.send_index.tolist() == [0, 1, 2, 3] and lay0.send_index.tolist() == [0, 1]
    # rank 1's key buffer: its own rows (positions 2..5), then rank 0's rows (positions 0, 1)
    assert lay1.doc_key_index[0].tolist() == [4, 5, 0, 1, 2, 3, -1, -1]
    assert lay0.doc_key_index[0].tolist() == [0, 1, 4, 5, 6, 7, 2, 3]
    # the all-gather moves every other rank's rows of the document
    ag = plan_shards([8], 2, "per_doc", kv_exchange="all_gather")
    assert ag.kv_recv_tokens.tolist() == [4, 4] and ag.kv_exchange == "all_gather"
    assert plan.kv_bytes(10.0) == 40.0 and ag.kv_bytes(10.0) == 40.0


def test_plans_without_gathered_documents_exchange_nothing():
    plan = plan_shards([40, 60, 1, 1, 3, 90, 12], 2, "atp", kv_exchange="all_to_all")
    assert len(plan.gathered_docs) == 0 and plan.kv_recv_tokens.tolist() == [0, 0]


@pytest.mark.parametrize("C", [2, 3, 4, 5])
def test_a2a_counts_match_the_layouts(C):
    rng = np.random.default_rng(C)
    for _ in range(10):
        lens = rng.integers(1, 80, int(rng.integers(1, 9)))
        for s in STRATEGIES:
            plan = plan_shards(lens, C, s, kv_exchange="all_to_all")
            lays = [plan.local_layout(r) for r in range(C)]
            if plan.kv_exchange != "all_to_all":
                continue
            send = np.stack([lay.send_counts for lay in lays])  # send[s, r]: rows s -> r
            recv = np.stack([lay.recv_counts for lay in lays])  # recv[r, s]: rows r <- s
            assert np.array_equal(send, recv.T)
            assert np.array_equal(recv.sum(axis=1), plan.kv_recv_tokens)
            assert np.array_equal(send.sum(axis=1), plan.a2a_token_counts[1])
            # never more than the all-gather moves
            ag = plan.kv_tokens - plan._gathered_rows_per_rank()
            assert (plan.kv_recv_tokens <= ag).all()


# ---------------------------------------------------------------------------- emulated exactness
def _check_exact(plan, lens, window, backend, H=4, K=2, D=8, dtype=torch.float64, tol=1e-10):
    N = int(sum(lens))
    g = torch.Generator().manual_seed(len(lens) + N)
    q, k, v = (torch.randn(h, N, D, dtype=dtype, generator=g, requires_grad=True) for h in (H, K, K))
    go = torch.randn(N, H, D, dtype=dtype, generator=g)
    out = emulate_cp_attention(q, k, v, plan, backend=backend, window=window)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), go)
    ref, (rq, rk, rv) = reference_attention(q, k, v, lens, window=window, grad_out_NHD=go)
    for a, b in ((out, ref), (dq, rq), (dk, rk), (dv, rv)):
        assert (a.double() - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("C", [2, 3, 4, pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("window", [None, 7])
def test_all_to_all_plans_equal_full_row_attention(C, window):
    lens = [150, 30, 1, 2, 20, 1, 7, 60, 41]
    cm = default_cost_model()
    plans = [plan_shards(lens, C, s, kv_exchange="all_to_all") for s in ("atp", "per_doc", "zigzag")]
    sub = plan_subgroups(np.array(lens), C, cm, anchor_share=0.25)
    if sub is not None:
        plans.append(ShardPlan(**{**_fields(sub), "kv_exchange": "all_to_all"}))
    for plan in plans:
        plan.validate()
        for backend in ("sdpa", "varlen_reference"):
            _check_exact(plan, lens, window, backend)


def _fields(plan):
    return dict(doc_lengths=plan.doc_lengths, cp_size=plan.cp_size, strategy=plan.strategy, segments=plan.segments,
                gathered_docs=plan.gathered_docs, rank_compute_s=plan.rank_compute_s, comm_s=plan.comm_s,
                block_time_s=plan.block_time_s)


def test_received_rows_are_the_runtime_buffer():
    lens = [150, 30, 20, 60]
    plan = plan_shards(lens, 4, "per_doc", kv_exchange="all_to_all")
    k = torch.randn(2, sum(lens), 3, dtype=torch.float64)
    for r in range(4):
        buf = received_rows(plan, r, k, k)
        lay = plan.local_layout(r)
        assert buf.shape[0] == lay.num_key_rows
        tok_pos = {}
        for d, idx in lay.doc_key_index.items():
            off = int(plan.doc_offsets[d])
            ok = idx >= 0
            torch.testing.assert_close(buf[idx[ok], :, :3], k[:, off + np.flatnonzero(ok)].transpose(0, 1))
            tok_pos[d] = ok.sum()
        assert tok_pos


# ---------------------------------------------------------------------------- sub-group planner
def test_medium_documents_go_to_sub_groups():
    lens = [3000, 2500, 2200] + [100] * 60
    cm = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-9, tile=1)
    plan = plan_subgroups(np.array(lens), 8, cm, anchor_share=0.25)
    groups = [_owners(plan, d) for d in plan.sharded_docs]
    assert groups and all(2 <= g < 8 for g in groups), groups
    plan.validate()
    assert plan.imbalance < 1.1
    # only the sub-groups receive: far less than an all-gather of the same documents
    ag = 7 / 8 * plan.doc_lengths[plan.sharded_docs].sum()
    assert plan.a2a_token_counts[0].max() <= 0.5 * ag
    # the largest share takes the outer chunks: it holds the document's first and last tokens
    for d in plan.sharded_docs:
        held = {r: int((s[s[:, 0] == d, 2] - s[s[:, 0] == d, 1]).sum()) for r, s in enumerate(plan.segments)}
        first = [r for r, s in enumerate(plan.segments) if ((s[:, 0] == d) & (s[:, 1] == 0)).any()][0]
        assert held[first] == max(held.values())


cost_models = st.sampled_from([
    CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-9, tile=1),
    CostModel(linear_s_per_token=1e-6, attn_s_per_pair=0.0, tile=1),
    CostModel(linear_s_per_token=0.0, attn_s_per_pair=1e-9, tile=16, segment_overhead_s=1e-6),
    CostModel.from_model("8b", "H100", inter_node=True),
    CostModel.from_model("8b", "H100").replace(sliding_window=64),
])


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 3000), min_size=1, max_size=40), C=st.integers(2, 9), cm=cost_models,
       share=st.sampled_from([1.0, 0.5, 0.25]), slack=st.sampled_from([None, 1.0, 1.3]),
       min_chunk=st.sampled_from([1, 8]))
def test_subgroup_plans_hold_the_invariants(lens, C, cm, share, slack, min_chunk):
    L = np.array(lens)
    cap = None if slack is None else int(np.ceil(L.sum() / C * slack))
    plan = plan_subgroups(L, C, cm, anchor_share=share, max_tokens_per_rank=cap, min_chunk=min_chunk)
    again = plan_subgroups(L, C, cm, anchor_share=share, max_tokens_per_rank=cap, min_chunk=min_chunk)
    if plan is None:
        assert again is None
        return
    assert plan.digest == again.digest  # deterministic
    plan.validate()  # every token on exactly one rank
    if cap is not None:
        assert plan.rank_num_tokens().max() <= cap
    for d in plan.sharded_docs:  # no chunk under min_chunk on a sub-group... unless the document is short
        assert L[d] >= 4 * min_chunk
    # ATP with sub-groups is never estimated slower than without them
    full = plan_shards(L, C, "atp", cm, max_tokens_per_rank=cap, min_chunk=min_chunk)
    assert full.rank_num_tokens().sum() == L.sum()


@settings(max_examples=20, deadline=None)
@given(lens=st.lists(st.integers(1, 4000), min_size=1, max_size=40), C=st.integers(2, 8), cm=cost_models)
def test_atp_with_sub_groups_is_never_estimated_slower(lens, C, cm):
    L = np.array(lens)
    with_sub = plan_shards(L, C, "atp", cm)
    saved = atp_mod.ANCHOR_SHARES
    atp_mod.ANCHOR_SHARES = ()
    try:
        flat = plan_shards(L, C, "atp", cm)
    finally:
        atp_mod.ANCHOR_SHARES = saved
    assert with_sub.block_time_s <= flat.block_time_s * (1 + 1e-9)
    with_sub.validate()


def test_cross_node_link_makes_atp_choose_sub_groups_and_all_to_all():
    lens = [9000, 7000, 6000, 5000] + [300] * 200
    cm = CostModel.from_model("8b", "H100", inter_node=True).replace(link_bandwidth=5e9)
    plan = plan_shards(lens, 16, "atp", cm, min_chunk=128)
    assert plan.kv_exchange == "all_to_all"
    assert any(2 <= _owners(plan, d) < 16 for d in plan.sharded_docs)
    saved = atp_mod.ANCHOR_SHARES
    atp_mod.ANCHOR_SHARES = ()
    try:
        flat = plan_shards(lens, 16, "atp", cm, min_chunk=128, kv_exchange="all_gather")
    finally:
        atp_mod.ANCHOR_SHARES = saved
    assert plan.block_time_s * 1.05 <= flat.block_time_s


# ---------------------------------------------------------------------------- cost and refusals
def test_a2a_comm_cost_prices_the_busiest_rank():
    cm = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-9, kv_bytes_per_token=100.0, link_bandwidth=1e6,
                   link_latency_s=1e-3)
    assert cm.a2a_comm_cost(0, 4) == 0.0 and cm.a2a_comm_cost(50, 1) == 0.0
    assert cm.a2a_comm_cost(50, 4) == pytest.approx(2 * (3e-3 + 50 * 100 / 1e6))
    plan = plan_shards([8], 2, "per_doc", cm, kv_exchange="all_to_all")
    recv, send = plan.a2a_token_counts
    assert plan.comm_s == pytest.approx(float(cm.a2a_comm_cost(max(recv.max(), send.max()), 2)))
    auto = plan_shards([8], 2, "per_doc", cm, kv_exchange="auto")
    ag = plan_shards([8], 2, "per_doc", cm)
    assert auto.comm_s == min(plan.comm_s, ag.comm_s)


def test_kv_exchange_refusals():
    with pytest.raises(ValueError, match=r"kv_exchange must be None or one of \['auto', 'all_gather', "
                                         r"'all_to_all'\], got 'ring'"):
        plan_shards([8], 2, kv_exchange="ring")
    good = plan_shards([8], 2, "per_doc")
    with pytest.raises(ValueError, match=r"ShardPlan.kv_exchange must be one of \['all_gather', 'all_to_all'\]"):
        ShardPlan(**{**_fields(good), "kv_exchange": "ring"})


def test_kv_all_to_all_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        KVAllToAll(torch.zeros(2, 1, 1), [2], [2])


@pytest.fixture
def one_rank_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    fd, path = tempfile.mkstemp(prefix="atac_gloo1_")
    os.close(fd)
    os.unlink(path)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        if os.path.exists(path):
            os.unlink(path)


def test_kv_all_to_all_waits_once_checks_counts_and_is_differentiable(one_rank_group):
    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="2 send / 1 receive counts for a group of 1 ranks"):
        KVAllToAll(x, [3, 0], [3])
    with pytest.raises(ValueError, match="send counts sum to 2, the buffer has 3 rows"):
        KVAllToAll(x, [2], [2])
    a = KVAllToAll(x * 2, [3], [3])
    out = a.wait()
    torch.testing.assert_close(out, x.detach() * 2)
    with pytest.raises(RuntimeError, match=r"wait\(\) called twice"):
        a.wait()
    (out * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 6.0))


def test_pair_counts_and_topology_pricing():
    from atac_hf.sharding.exchange import a2a_pair_counts
    from atac_hf.sim import ClusterConfig

    lens = [150, 30, 20, 60, 7]
    plan = plan_shards(lens, 4, "per_doc", kv_exchange="all_to_all")
    m = a2a_pair_counts(plan.segments, plan.gathered_mask())
    assert np.array_equal(m, np.stack([plan.local_layout(r).send_counts for r in range(4)]))
    assert np.array_equal(m.sum(axis=0), plan.kv_recv_tokens) and np.array_equal(m.sum(axis=1),
                                                                                  plan.a2a_token_counts[1])
    # rows[s, r]; ranks {0, 1} and {2, 3} share nodes: intra rows at 10 B/s, inter at 1 B/s
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, kv_bytes_per_token=1.0, link_bandwidth=1.0,
                   link_latency_s=0.0, node_size=2, intra_node_bandwidth=10.0)
    rows = np.zeros((4, 4))
    rows[0, 1] = 50  # intra: 5 s
    rows[0, 2] = 3  # inter: 3 s; rank 0 sends both at once: 5 s
    assert cm.a2a_pair_cost(rows) == pytest.approx(2 * 5.0)
    rows[3, 2] = 40  # rank 2 receives 3 inter (3 s) and 40 intra (4 s)
    assert cm.a2a_pair_cost(rows) == pytest.approx(2 * 5.0)
    rows[1, 2] = 4  # rank 2: 7 inter rows: 7 s
    assert cm.a2a_pair_cost(rows) == pytest.approx(2 * 7.0)
    flat = cm.replace(node_size=None)
    assert flat.a2a_pair_cost(rows) == pytest.approx(float(flat.a2a_comm_cost(53, 4)))
    assert cm.a2a_pair_cost(np.zeros((4, 4))) == 0.0
    # a CP group over two nodes: rows inside a node priced at NVLink
    two = ClusterConfig(cp_size=16, max_tokens=65536, model="8b", gpus_per_node=8).cost_model()
    one = ClusterConfig(cp_size=8, max_tokens=65536, model="8b", gpus_per_node=8).cost_model()
    assert two.node_size == 8 and two.intra_node_bandwidth == one.link_bandwidth > two.link_bandwidth
    assert one.node_size is None


@pytest.mark.parametrize("field,value,match", [
    ("node_size", 0, r"CostModel.node_size must be None or an int >= 1 \(CP ranks per node\), got 0"),
    ("node_size", 2.5, r"CostModel.node_size must be None or an int >= 1"),
    ("intra_node_bandwidth", 0.0, r"CostModel.intra_node_bandwidth must be None or > 0 bytes/s"),
    ("intra_node_bandwidth", True, r"CostModel.intra_node_bandwidth must be None or > 0 bytes/s"),
])
def test_topology_fields_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, **{field: value})


def test_sliding_window_exchanges_only_the_keys_in_the_window():
    # [8] over 2 ranks: rank 0 holds [0, 2) + [6, 8), rank 1 [2, 6); window 2: rank 0's tail
    # chunk sees keys [5, 8) (receives 5), rank 1 sees [1, 6) (receives 1)
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, sliding_window=2)
    plan = plan_shards([8], 2, "per_doc", cm, kv_exchange="all_to_all")
    assert plan.kv_window == 2 and plan.kv_recv_tokens.tolist() == [1, 1]
    lay0, lay1 = plan.local_layout(0, 2), plan.local_layout(1, 2)
    assert lay0.recv_counts.tolist() == [0, 1] and lay1.recv_counts.tolist() == [1, 0]
    assert lay0.doc_key_index[0].tolist() == [0, 1, -1, -1, -1, 4, 2, 3]
    assert lay1.doc_key_index[0].tolist() == [-1, 4, 0, 1, 2, 3, -1, -1]
    # the windowless layout (a layer without a window) still moves the whole prefixes
    assert plan.local_layout(0).recv_counts.tolist() == [0, 4]
    assert plan.local_layout(0) is plan.local_layout(0, None) and plan.local_layout(0, 2) is lay0
    # an all-gather plan's layout does not depend on the window
    ag = plan_shards([8], 2, "per_doc", cm)
    assert ag.local_layout(0, 2) is ag.local_layout(0) and ag.kv_window is None
    # a long pack: the window cuts the traffic to about the window per chunk
    lens = [4000, 3000, 50, 70]
    w = cm.replace(sliding_window=64)
    full = plan_shards(lens, 4, "per_doc", cm.replace(sliding_window=None), kv_exchange="all_to_all")
    win = plan_shards(lens, 4, "per_doc", w, kv_exchange="all_to_all")
    assert win.kv_recv_tokens.max() <= 4 * 2 * 64 < full.kv_recv_tokens.max()
    small = [40, 30, 5, 7]
    p = plan_shards(small, 3, "per_doc", cm.replace(sliding_window=4), kv_exchange="all_to_all")
    for window in (4, None, 9):  # a layer's window other than the plan's: its own layout
        for backend in ("sdpa", "varlen_reference"):
            _check_exact(p, small, window, backend)


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.integers(1, 120), min_size=1, max_size=12), C=st.integers(2, 6),
       window=st.sampled_from([None, 1, 5, 30]), strategy=st.sampled_from(sorted(STRATEGIES)))
def test_each_rank_receives_exactly_the_keys_it_attends_to(lens, C, window, strategy):
    plan = plan_shards(lens, C, strategy, kv_exchange="all_to_all")
    if plan.kv_exchange != "all_to_all":
        return
    g = plan.gathered_mask()
    for r in range(C):
        lay = plan.local_layout(r, window)
        want = set()  # (doc, position) of every key a gathered chunk of rank r attends to
        own = set()
        for d, s, e in plan.segments[r].tolist():
            if g[d]:
                lo = 0 if window is None else max(0, s - window + 1)
                want |= {(d, p) for p in range(lo, e)}
                own |= {(d, p) for p in range(s, e)}
        got = {(d, int(p)) for d, idx in lay.doc_key_index.items() for p in np.flatnonzero(idx >= 0)}
        assert got == want
        assert int(lay.recv_counts.sum()) == len(want - own)  # nothing received twice or unneeded
        if window is None:
            assert int(plan.kv_recv_tokens[r]) == len(want - own)

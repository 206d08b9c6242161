"""The runtime's index bookkeeping against a token-id oracle (issue 20, fifteenth pass).

Each token's "key" is its position in the packed row. The exchange every layout describes (the
padded all-gather, the direct all-to-all, the node-routed two-phase all-to-all) is replayed in
numpy exactly as the runtime runs it (``atac_hf.attention.collectives`` / ``kv_exchange``), then
each query segment's keys are read through ``LocalLayout.varlen_layout``: they must be the keys of
its document up to its last query, in document order, cut at the sliding window, and nothing else.
The counts the planner prices (``kv_recv_tokens``, ``a2a_token_counts``) must be what travels, and
the direct all-to-all moves no row a rank does not attend to, none twice. Pure numpy, in process:
a mutant of ``plan.py``'s layouts that changes what a rank attends to fails here without torch.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.cost import default_cost_model
from atac_hf.sharding import STRATEGIES, ShardPlan, plan_shards
from atac_hf.sim import ClusterConfig

FIELDS = ("doc_lengths", "cp_size", "strategy", "segments", "gathered_docs", "rank_compute_s", "comm_s",
          "block_time_s")


def _with_exchange(plan: ShardPlan, exchange: str, node: int | None, window: int | None) -> ShardPlan:
    return ShardPlan(**{f: getattr(plan, f) for f in FIELDS}, kv_exchange=exchange, kv_route_node=node,
                     kv_window=window if exchange == "all_to_all" else None)


def _split(buf: np.ndarray, counts) -> list[np.ndarray]:
    return np.split(buf, np.cumsum(np.asarray(counts, dtype=np.int64))[:-1])


def key_buffers(plan: ShardPlan, window: int | None) -> tuple[list[np.ndarray], list[int]]:
    """Every rank's key buffer (row positions; -1 for padding) as the runtime builds it, and the
    rows each rank received from other ranks (padding not counted)."""
    C = plan.cp_size
    tok = [plan.rank_token_indices(r) for r in range(C)]
    lay = [plan.local_layout(r, window) for r in range(C)]
    if plan.kv_exchange != "all_to_all":
        m = lay[0].max_send
        for r in range(C):  # every rank agrees on the collective's shape
            assert np.array_equal(lay[r].send_counts, lay[0].send_counts)
            assert lay[r].send_counts[r] == len(lay[r].send_index)
        sends = [np.concatenate([tok[s][lay[s].send_index], np.full(m - len(lay[s].send_index), -1)])
                 for s in range(C)]
        buf = np.concatenate(sends) if C else np.zeros(0, np.int64)
        recv = [int(sum(len(lay[s].send_index) for s in range(C) if s != r)) for r in range(C)]
        return [buf] * C, recv
    for r in range(C):
        assert lay[r].send_counts[r] == 0 and lay[r].recv_counts[r] == 0
        assert lay[r].send_counts.sum() == len(lay[r].send_index)
        for s in range(C):  # what s sends r is what r expects from s
            assert lay[s].send_counts[r] == lay[r].recv_counts[s]
    parts = [_split(tok[s][lay[s].send_index], lay[s].send_counts) for s in range(C)]
    got = [np.concatenate([parts[s][r] for s in range(C) if s != r] or [np.zeros(0, np.int64)]) for r in range(C)]
    recv = [len(g) for g in got]
    if lay[0].route is not None:  # the proxies forward rows of their first-phase receive buffer
        for r in range(C):
            for s in range(C):
                assert lay[s].route["send2_counts"][r] == lay[r].route["recv2_counts"][s]
        parts2 = [_split(got[s][lay[s].route["send2"]], lay[s].route["send2_counts"]) for s in range(C)]
        second = [np.concatenate([parts2[s][r] for s in range(C) if s != r] or [np.zeros(0, np.int64)])
                  for r in range(C)]
        recv = [a + len(b) for a, b in zip(recv, second)]
        got = [np.concatenate([a, b]) for a, b in zip(got, second)]
    bufs = [np.concatenate([tok[r][lay[r].self_index], got[r]]) for r in range(C)]
    for r in range(C):
        assert len(bufs[r]) == lay[r].num_key_rows
    return bufs, recv


def check_plan(plan: ShardPlan, window: int | None) -> None:
    C, offsets = plan.cp_size, plan.doc_offsets
    bufs, recv = key_buffers(plan, window)
    if plan.kv_exchange == "all_to_all" or C > 1:
        assert np.array_equal(plan.kv_recv_tokens, recv), (plan.kv_recv_tokens, recv)
    for r in range(C):
        tok = plan.rank_token_indices(r)
        lay = plan.local_layout(r, window)
        vl = lay.varlen_layout(sliding_window=window)
        rows = np.concatenate([tok, bufs[r]])
        attended = []
        assert len(vl.cu_seqlens_q) == len(lay.seg_doc) + 1 and vl.cu_seqlens_q[0] == 0
        assert vl.max_seqlen_q == (int(np.diff(vl.cu_seqlens_q).max()) if len(lay.seg_doc) else 0)
        assert vl.max_seqlen_k == (int(np.diff(vl.cu_seqlens_k).max()) if len(lay.seg_doc) else 0)
        for i, (d, ds, de) in enumerate(zip(lay.seg_doc, lay.seg_doc_start, lay.seg_doc_end)):
            q = tok[vl.cu_seqlens_q[i]:vl.cu_seqlens_q[i + 1]]
            assert np.array_equal(q, offsets[d] + np.arange(ds, de)), f"rank {r} segment {i}: queries"
            assert lay.seg_local_start[i] == vl.cu_seqlens_q[i] and lay.seg_local_end[i] == vl.cu_seqlens_q[i + 1]
            lo = 0 if window is None else max(0, int(ds) - window + 1)
            k_idx = vl.k_index[vl.cu_seqlens_k[i]:vl.cu_seqlens_k[i + 1]]
            assert bool(lay.seg_gathered[i]) == bool(plan.gathered_mask()[d])
            if lay.seg_gathered[i]:
                assert (k_idx >= len(tok)).all(), f"rank {r} segment {i}: a gathered document's keys from local rows"
            else:
                assert ((k_idx >= 0) & (k_idx < len(tok))).all()
            keys = rows[k_idx]
            assert np.array_equal(keys, offsets[d] + np.arange(lo, de)), f"rank {r} segment {i}: keys"
            attended.append(keys)
        if plan.kv_exchange == "all_to_all" and plan.kv_route_node is None:
            # only-needed: every received row is one r attends to, none twice, none of its own
            got = bufs[r][len(lay.self_index):]
            assert len(np.unique(got)) == len(got), f"rank {r} receives a row twice"
            assert np.isin(got, np.concatenate(attended or [np.zeros(0, np.int64)])).all(), \
                f"rank {r} receives a row it does not attend to"
            assert not np.isin(got, tok).any()
        if plan.kv_exchange == "all_to_all":  # the own rows: this rank's rows of gathered documents, in order
            doc_of = np.searchsorted(offsets, tok, side="right") - 1
            assert np.array_equal(lay.self_index, np.flatnonzero(plan.gathered_mask()[doc_of]))


def random_plans(n: int, seed: int):
    rng = np.random.default_rng(seed)
    models = [default_cost_model(), ClusterConfig(model="7b", hardware="H100", cp_size=8, max_tokens=4096,
                                                  gpus_per_node=4).cost_model()]
    strategies = sorted(STRATEGIES)
    for it in range(n):
        C = int(rng.integers(1, 9))
        D = int(rng.integers(1, 9))
        lengths = rng.integers(1, 40, D)
        if rng.random() < 0.7:
            lengths[int(rng.integers(0, D))] = rng.integers(2 * C, 300)
        strategy = strategies[it % len(strategies)]
        cap = None if rng.random() < 0.6 else int(np.ceil(lengths.sum() / C * rng.choice([1.0, 1.2])))
        kw = dict(max_tokens_per_rank=cap, min_chunk=int(rng.choice([1, 2, 8])))
        try:
            plan = plan_shards(lengths, C, strategy, models[it % 2], **kw)
        except ValueError:  # a cap this strategy cannot meet
            plan = plan_shards(lengths, C, strategy, models[it % 2])
        yield plan, rng


@pytest.mark.parametrize("window", [None, 1, 2, 5, 33])
@pytest.mark.parametrize("exchange", ["all_gather", "all_to_all", "routed"])
def test_every_segment_reads_exactly_its_document_prefix(exchange, window):
    checked = 0
    for plan, rng in random_plans(60, seed=hash((exchange, window)) % 2**31):
        C = plan.cp_size
        if exchange == "routed":
            if C < 3:
                continue
            plan = _with_exchange(plan, "all_to_all", int(rng.integers(2, C)), window)
        else:
            plan = _with_exchange(plan, exchange, None, window)
        check_plan(plan, window)
        checked += 1
    assert checked >= 30


def test_the_planner_s_own_exchanges_read_exactly_their_prefixes():
    """Plans as ``plan_shards`` returns them (its exchange and route, priced for its window)."""
    base = ClusterConfig(model="8b", hardware="H100", cp_size=8, max_tokens=4096, gpus_per_node=2).cost_model()
    rng = np.random.default_rng(7)
    kinds = set()
    for it in range(80):
        C = int(rng.choice([2, 3, 4, 6, 8]))
        lengths = np.concatenate([rng.integers(1, 60, int(rng.integers(1, 12))), rng.integers(200, 900, 2)])
        cm = base.replace(sliding_window=[None, 3, 64][it % 3])
        plan = plan_shards(lengths, C, ["atp", "per_doc", "zigzag"][it % 3], cm, kv_exchange="auto")
        kinds.add((plan.kv_exchange, plan.kv_route_node is not None))
        check_plan(plan, plan.kv_window)
    assert ("all_to_all", False) in kinds or ("all_to_all", True) in kinds

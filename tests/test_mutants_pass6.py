"""Issue 20, sixth mutation-testing pass: ``sharding/exchange.py`` and ``sharding/plan.py``
against references that share no code with them (the baselines: test_mutants_pass6_baselines.py).

The exchange's functions are checked against a brute-force count over (document, position)
sets; the per-rank layouts are checked by running the exchange they describe in numpy (every
token's value is its row index, each rank sends what its layout says, and every query segment
must then see exactly its document's keys ``[lo, end)``), on seeded random hand-built plans
(several chunks of a document on one rank, touching chunks, extra gathered documents, empty
ranks, windows) and on the planners' own plans; and one survivor of ``WFAPBatchSampler._epoch_plan``
(``even_batches`` not passed on). docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.cost import default_cost_model
from atac_hf.sharding import ShardPlan, plan_shards
from atac_hf.sharding.exchange import a2a_pair_counts, a2a_rows, a2a_token_counts, needed_ranges

I64 = np.dtype(np.int64)
WINDOWS = (None, 1, 2, 3, 5, 100)


def _seg(rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _random_plan(rng: np.random.Generator, exchange: str, window: int | None = None) -> ShardPlan:
    """A valid plan: each document cut into 1-4 chunks, each chunk on a random rank (a rank may
    hold several chunks of one document, touching or not); every split document gathered, and
    some whole ones too. Ranks hold their segments in row order."""
    D, C = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    L = rng.integers(1, 13, D)
    per_rank = [[] for _ in range(C)]
    owners = [set() for _ in range(D)]
    for d in range(D):
        k = int(rng.integers(0, min(3, L[d] - 1) + 1))
        cuts = sorted(rng.choice(np.arange(1, L[d]), size=k, replace=False).tolist()) if k else []
        bounds = [0] + cuts + [int(L[d])]
        for s, e in zip(bounds[:-1], bounds[1:]):
            r = int(rng.integers(C))
            per_rank[r].append((d, s, e))
            owners[d].add(r)
    gathered = [d for d in range(D) if len(owners[d]) > 1 or rng.random() < 0.3]
    p = ShardPlan(doc_lengths=L.astype(np.int64), cp_size=C, strategy="hand",
                  segments=tuple(_seg(sorted(s)) for s in per_rank),
                  gathered_docs=np.array(gathered, dtype=np.int64), rank_compute_s=np.ones(C),
                  kv_exchange=exchange, kv_window=window)
    p.validate()
    return p


def _held(seg) -> list[tuple[int, int]]:
    """(doc, position) of each local row, in local order."""
    return [(int(d), p) for d, s, e in seg for p in range(int(s), int(e))]


def _need(seg, gathered, window) -> set[tuple[int, int]]:
    """Keys of gathered documents a rank's chunks attend to: chunk [s, e) sees [lo, e)."""
    out = set()
    for d, s, e in seg:
        if gathered[d]:
            lo = 0 if window is None else max(0, int(s) - window + 1)
            out.update((int(d), p) for p in range(lo, int(e)))
    return out


def _runs(positions) -> list[tuple[int, int]]:
    """Maximal runs ``[lo, hi)`` of a set of integers, ascending."""
    out: list[list[int]] = []
    for p in sorted(positions):
        if out and out[-1][1] == p:
            out[-1][1] += 1
        else:
            out.append([p, p + 1])
    return [tuple(r) for r in out]


def _cases(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield _random_plan(rng, ("all_gather", "all_to_all")[i % 2], WINDOWS[i % len(WINDOWS)])


def _check_exchange_counts(p: ShardPlan) -> None:
    C, g, w = p.cp_size, p.gathered_mask(), p.kv_window
    held = [_held(s) for s in p.segments]
    need = [_need(s, g, w) for s in p.segments]
    want = np.array([[0 if s == r else sum(x in need[r] for x in held[s]) for r in range(C)] for s in range(C)])
    got = a2a_pair_counts(p.segments, g, w)
    assert got.dtype == I64 and got.tolist() == want.tolist()
    recv, send = a2a_token_counts(p.segments, g, w)
    assert recv.dtype == send.dtype == I64
    assert recv.tolist() == want.sum(axis=0).tolist() and send.tolist() == want.sum(axis=1).tolist()
    assert p.a2a_token_counts[0].tolist() == recv.tolist()
    for r in range(C):
        docs = sorted({d for d, _ in need[r]})
        assert needed_ranges(p.segments[r], g, w) == {d: _runs(q for dd, q in need[r] if dd == d) for d in docs}
        for s in range(C):
            if s == r:
                continue
            rows, dd, pos = a2a_rows(p.segments, g, s, r, w)
            assert rows.dtype == dd.dtype == pos.dtype == I64
            sent = [(i, d, q) for i, (d, q) in enumerate(held[s]) if (d, q) in need[r]]
            assert list(zip(rows.tolist(), dd.tolist(), pos.tolist())) == sent


def test_a2a_counts_rows_and_ranges_equal_a_brute_force_count_over_document_positions():
    for p in _cases(240, 6):
        _check_exchange_counts(p)


def test_a2a_counts_of_planner_plans_equal_a_brute_force_count():
    rng = np.random.default_rng(7)
    for i in range(40):
        L = rng.integers(1, 40, int(rng.integers(1, 7))).tolist()
        C = int(rng.integers(2, 6))
        strategy = ("atp", "per_doc", "zigzag", "contiguous")[i % 4]
        cm = default_cost_model().replace(sliding_window=WINDOWS[1 + i % 5]) if i % 3 == 0 else None
        p = plan_shards(L, C, strategy, cm, kv_exchange="all_to_all")
        _check_exchange_counts(p)


def _run_exchange(p: ShardPlan, window: int | None):
    """Each rank's key buffer after the exchange its layout describes, as the runtime builds it
    (``runtime.emulate_cp_attention``): the all-gather pads every rank's send rows to ``max_send``
    and concatenates the C blocks; the all-to-all concatenates the rank's own rows of gathered
    documents and what every other rank sends it, in rank order. Values are row indices."""
    C = p.cp_size
    lays = [p.local_layout(r, window) for r in range(C)]
    local = [p.rank_token_indices(r) for r in range(C)]
    if p.kv_exchange == "all_to_all":
        sent = [np.split(local[s][lays[s].send_index], np.cumsum(lays[s].send_counts)[:-1]) for s in range(C)]
        for r in range(C):
            for s in range(C):
                assert lays[r].recv_counts[s] == len(sent[s][r])  # what r expects is what s sends
        bufs = [np.concatenate([local[r][lays[r].self_index]] + [sent[s][r] for s in range(C) if s != r])
                for r in range(C)]
    else:
        m = lays[0].max_send
        assert all(lay.max_send == m for lay in lays)
        blocks = []
        for s in range(C):
            b = np.full(m, -1, dtype=np.int64)
            b[:len(lays[s].send_index)] = local[s][lays[s].send_index]
            blocks.append(b)
        bufs = [np.concatenate(blocks) if blocks else np.zeros(0, np.int64)] * C
    for r in range(C):
        assert lays[r].num_key_rows == len(bufs[r])
    return lays, local, bufs


def _check_layouts(p: ShardPlan, window: int | None, varlen_window: int | None) -> None:
    C, g, off = p.cp_size, p.gathered_mask(), p.doc_offsets
    lays, local, bufs = _run_exchange(p, window)
    for r in range(C):
        lay, seg = lays[r], p.segments[r]
        ln = (seg[:, 2] - seg[:, 1]).tolist()
        starts = np.concatenate([[0], np.cumsum(ln)]).astype(np.int64)
        assert (lay.rank, lay.cp_size, lay.n_local, lay.exchange) == (r, C, sum(ln), p.kv_exchange)
        for name, want in (("seg_doc", seg[:, 0]), ("seg_doc_start", seg[:, 1]), ("seg_doc_end", seg[:, 2]),
                           ("seg_local_start", starts[:-1]), ("seg_local_end", starts[1:])):
            got = getattr(lay, name)
            assert got.dtype == I64 and got.tolist() == want.tolist(), name
        assert lay.seg_gathered.dtype == bool and lay.seg_gathered.tolist() == [bool(g[d]) for d in seg[:, 0]]
        assert sorted(lay.doc_key_index) == sorted({int(d) for d in seg[:, 0] if g[d]})
        if p.kv_exchange == "all_to_all":
            assert lay.window == window
            counts = a2a_pair_counts(p.segments, g, window)
            assert lay.send_counts.tolist() == counts[r].tolist()  # only the rows each rank attends to
            assert lay.recv_counts.tolist() == counts[:, r].tolist()
        # the keys every query segment sees, through the varlen layout, are its document's [lo, end)
        key_rows = np.concatenate([local[r], bufs[r]])
        v = lay.varlen_layout(varlen_window)
        assert v.k_index.dtype == v.cu_seqlens_q.dtype == v.cu_seqlens_k.dtype == I64
        assert v.cu_seqlens_q.tolist() == starts.tolist()
        lens = []
        for i, (d, s, e) in enumerate(seg.tolist()):
            lo = 0 if varlen_window is None else max(0, s - varlen_window + 1)
            keys = key_rows[v.k_index[v.cu_seqlens_k[i]:v.cu_seqlens_k[i + 1]]]
            assert keys.tolist() == list(range(off[d] + lo, off[d] + e)), (r, i)
            lens.append(e - lo)
        assert v.cu_seqlens_k.tolist() == np.concatenate([[0], np.cumsum(lens)]).astype(int).tolist()
        assert (v.max_seqlen_q, v.max_seqlen_k) == ((max(ln), max(lens)) if ln else (0, 0))
        assert type(v.max_seqlen_q) is int and type(v.max_seqlen_k) is int


def test_every_query_segment_sees_exactly_its_documents_keys_after_the_exchange_its_layout_describes():
    for i, p in enumerate(_cases(240, 8)):
        w = p.kv_window if p.kv_exchange == "all_to_all" else WINDOWS[(i // 2) % len(WINDOWS)]
        _check_layouts(p, w, w)
        if p.kv_exchange == "all_to_all" and w is not None:
            # a layer without a window needs the whole prefixes: a layout of its own
            _check_layouts(p, None, None)
        if p.kv_exchange == "all_gather":
            _check_layouts(p, 3, None)  # the all-gather layout does not depend on the window


@pytest.mark.parametrize("exchange", ["all_gather", "all_to_all"])
def test_planner_plans_run_their_exchange_correctly(exchange):
    rng = np.random.default_rng(9)
    for i in range(24):
        L = rng.integers(1, 30, int(rng.integers(1, 6))).tolist()
        C = int(rng.integers(1, 5))
        strategy = ("atp", "per_doc", "zigzag", "contiguous", "wlb_adaptive", "atp")[i % 6]
        p = plan_shards(L, C, strategy, kv_exchange=exchange)
        for w in (None, 2, 7):
            _check_layouts(p, w, w)


def test_a_rank_with_two_chunks_of_a_document_receives_the_gap_between_them_once():
    # doc 0 of 8 tokens: rank 0 holds [0, 2) and [5, 8), rank 1 holds [2, 5). Rank 0 attends
    # to [0, 8) and holds all but [2, 5): it receives those 3 rows once; rank 1 attends to
    # [0, 5) and receives rank 0's [0, 2). With a window of 2, rank 0's chunk [5, 8) needs
    # [4, 8), so only row 4 of rank 1 (its local row 2); rank 1's [2, 5) needs [1, 5): row 1.
    p = ShardPlan(doc_lengths=np.array([8], dtype=np.int64), cp_size=2, strategy="hand",
                  segments=(_seg([(0, 0, 2), (0, 5, 8)]), _seg([(0, 2, 5)])),
                  gathered_docs=np.array([0], dtype=np.int64), rank_compute_s=np.ones(2),
                  kv_exchange="all_to_all")
    g = p.gathered_mask()
    assert a2a_pair_counts(p.segments, g).tolist() == [[0, 2], [3, 0]]
    assert a2a_pair_counts(p.segments, g, 2).tolist() == [[0, 1], [1, 0]]
    assert needed_ranges(p.segments[0], g) == {0: [(0, 8)]}
    assert needed_ranges(p.segments[0], g, 2) == {0: [(0, 2), (4, 8)]}
    assert needed_ranges(p.segments[1], g, 2) == {0: [(1, 5)]}
    assert [a.tolist() for a in a2a_rows(p.segments, g, 1, 0, 2)] == [[2], [0], [4]]
    assert [a.tolist() for a in a2a_rows(p.segments, g, 0, 1, 2)] == [[1], [0], [1]]
    assert [a.tolist() for a in a2a_rows(p.segments, g, 0, 1)] == [[0, 1], [0, 0], [0, 1]]
    assert p.kv_recv_tokens.tolist() == [3, 2]
    _check_layouts(p, None, None)
    _check_layouts(p, 2, 2)


def test_a2a_rows_takes_segments_as_python_lists_an_empty_rank_included():
    # the per-rank segments may be lists of (doc, start, end) rows, [] for an empty rank: the rows
    # are the same as from arrays, and every returned array is int64 (also the empty ones)
    g = np.array([True, False])
    lists = ([[0, 0, 2], [1, 0, 1]], [[0, 2, 4]], [])
    arrays = tuple(_seg(s) for s in lists)
    for src, dst in ((0, 1), (1, 0), (2, 0), (0, 2), (2, 1)):
        got, want = a2a_rows(lists, g, src, dst), a2a_rows(arrays, g, src, dst)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype == I64 and a.tolist() == b.tolist()
    assert [a.tolist() for a in a2a_rows(lists, g, 0, 1)] == [[0, 1], [0, 0], [0, 1]]
    assert [a.tolist() for a in a2a_rows(lists, g, 2, 0)] == [[], [], []]



@pytest.mark.parametrize("exchange", ["all_gather", "all_to_all"])
def test_a_rank_outside_the_group_is_refused_naming_the_legal_ranks(exchange):
    # local_layout too: it used to index the segments with the rank unchecked (-1 gave the last
    # rank's layout labelled rank -1; 3 an IndexError)
    p = plan_shards([4, 4], 3, kv_exchange=exchange)
    for bad in (3, -1):
        for call in (p.rank_segments, p.rank_token_indices, p.local_layout):
            with pytest.raises(ValueError) as e:
                call(bad)
            assert str(e.value) == f"rank {bad} is outside the CP group of size 3 (legal: 0..2)"

def test_sampler_epoch_with_even_batches_over_replicas_is_planned_with_even_batches():
    # WFAPBatchSampler's epoch is plan_packs with the sampler's own even_batches (here True, over
    # 3 replicas: the batch count a multiple of 3), not plan_packs' without it
    from atac_hf.packing import PackingConfig
    from atac_hf.packing.data.sampler import WFAPBatchSampler, plan_packs

    cfg = PackingConfig(max_tokens=32, packs_per_window=3, strategy="wfap")
    L = np.random.default_rng(7).integers(1, 32, size=40)

    def batches(even):
        spans, offsets = plan_packs(L, cfg, order=np.arange(L.size), num_replicas=3, even_batches=even)
        return [[tuple(x) for x in spans[offsets[b]:offsets[b + 1]].tolist()] for b in range(len(offsets) - 1)]

    want = batches(True)
    assert want != batches(False) and len(want) % 3 == 0
    s = WFAPBatchSampler(L, cfg, shuffle=False, num_replicas=3, even_batches=True)
    assert list(s) == want and len(s) == len(want)


def test_sampler_progress_bar_counts_samples_in_samples(capsys):
    # the planning bar's total is the samples planned (here 60), and its unit names them
    from atac_hf.packing import PackingConfig
    from atac_hf.packing.data.sampler import WFAPBatchSampler

    L = np.random.default_rng(0).integers(1, 300, 60)
    list(WFAPBatchSampler(L, PackingConfig(max_tokens=512, packs_per_window=4), progress=True))
    err = capsys.readouterr().err
    assert "Planning WFAP packs (epoch 0)" in err and "60/60" in err and "samples/s" in err

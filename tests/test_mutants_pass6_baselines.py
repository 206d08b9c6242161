"""Issue 20, sixth mutation-testing pass: the baseline strategies of ``sharding/baselines.py``
by hand (which rows each rank holds, what is gathered, the names) and ``per_doc_block_time``
against the per_doc plan it prices. docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding import plan_shards
from atac_hf.sharding.baselines import per_doc_block_time
from atac_hf.sharding.segments import finish_plan, per_doc_segments


def _rows(plan) -> list[list[int]]:
    return [plan.rank_token_indices(r).tolist() for r in range(plan.cp_size)]


def test_contiguous_cuts_the_row_at_n_r_over_c_and_gathers_every_document():
    # 13 tokens on 3 ranks: cuts 0, 13 // 3 = 4, 26 // 3 = 8, 13; documents [4, 7, 2] are rows
    # [0, 4), [4, 11), [11, 13): doc 0 and doc 2 lie on one rank each, and are gathered all the same
    p = plan_shards([4, 7, 2], 3, "contiguous")
    assert _rows(p) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11, 12]]
    assert [s.tolist() for s in p.segments] == [[[0, 0, 4]], [[1, 0, 4]], [[1, 4, 7], [2, 0, 2]]]
    assert p.gathered_docs.tolist() == [0, 1, 2]
    assert (p.strategy, p.kv_exchange, p.cp_size) == ("contiguous", "all_gather", 3)


def test_zigzag_gives_rank_r_the_rth_chunk_from_each_end_of_the_row():
    # 11 tokens, 2 ranks: 11 = 4 * 2 + 3; rank 0 gets 2 extra tokens (one in each chunk), rank 1
    # one (in its head): chunk sizes 3, 3 | 2, 3, so rank 0 holds rows [0, 3) + [8, 11), rank 1 [3, 8)
    p = plan_shards([4, 7], 2, "zigzag")
    assert _rows(p) == [[0, 1, 2, 8, 9, 10], [3, 4, 5, 6, 7]]
    assert p.gathered_docs.tolist() == [0, 1]
    # 13 tokens, 3 ranks: 13 = 6 * 2 + 1, the extra token in rank 0's head: sizes 3, 2, 2 | 2, 2, 2
    p = plan_shards([13], 3, "zigzag")
    assert _rows(p) == [[0, 1, 2, 11, 12], [3, 4, 9, 10], [5, 6, 7, 8]]
    assert (p.strategy, p.kv_exchange) == ("zigzag", "all_gather")
    # the same 13 rows as documents [4, 7, 2]: doc 2 (rows 11, 12) lies on rank 0 only, and is
    # gathered all the same (ring attention over the whole row moves every document's K/V)
    p = plan_shards([4, 7, 2], 3, "zigzag")
    assert _rows(p) == [[0, 1, 2, 11, 12], [3, 4, 9, 10], [5, 6, 7, 8]]
    assert p.sharded_docs.tolist() == [0, 1] and p.gathered_docs.tolist() == [0, 1, 2]


def test_per_doc_splits_every_document_head_tail_and_gathers_even_the_unsplit_ones():
    # doc 0 (5 tokens, 2 ranks): 5 = 4 + 1: chunk sizes 2, 1 | 1, 1: rank 0 [0, 2) + [4, 5), rank 1
    # [2, 4); doc 1 (1 token): its one token on rank 0 (row 5)
    p = plan_shards([5, 1], 2, "per_doc")
    assert _rows(p) == [[0, 1, 4, 5], [2, 3]]
    assert p.gathered_docs.tolist() == [0, 1]
    assert (p.strategy, p.kv_exchange) == ("per_doc", "all_gather")


def test_wlb_adaptive_keeps_every_field_of_the_faster_plan():
    # zigzag is the faster on the short packs, per_doc on the long ones (attention dominates, and
    # zigzag's rank 1 holds the middle of the long document: the costliest rows)
    chosen = []
    for lengths, C in (([8, 8, 8, 8], 4), ([60, 2, 2], 4), ([2400, 800], 2), ([6000, 100, 100], 2)):
        z, d = plan_shards(lengths, C, "zigzag"), plan_shards(lengths, C, "per_doc")
        best = z if z.block_time_s <= d.block_time_s else d
        chosen.append(best.strategy)
        w = plan_shards(lengths, C, "wlb_adaptive")
        assert (w.strategy, w.cp_size, w.kv_exchange, w.kv_window) == ("wlb_adaptive", C, "all_gather", None)
        assert w.doc_lengths.tolist() == list(lengths)
        assert [s.tolist() for s in w.segments] == [s.tolist() for s in best.segments]
        assert w.gathered_docs.tolist() == best.gathered_docs.tolist()
        assert w.rank_compute_s.tolist() == best.rank_compute_s.tolist()
        assert (w.comm_s, w.block_time_s) == (best.comm_s, best.block_time_s)
        assert w.digest == best.digest
    assert chosen == ["zigzag", "zigzag", "per_doc", "per_doc"]  # both arms taken


def test_per_doc_block_time_of_a_pack_costed_in_several_batches_of_ranks():
    # 1100 documents on 1024 ranks: more than 2**20 (rank, document) entries, so the ranks are
    # costed in batches of 2**20 // 1100 = 953; a batch bound of 2**20 / 1100 (a float) would
    # cost 1025 ranks, the last a rank past the documents' ends (1102200 s, not 1101100 s)
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, link_bandwidth=1e18)
    L = np.array([1000] * 1100)
    plan = finish_plan(L, 1024, "per_doc", per_doc_segments(L, 1024), None, cm)
    # rank 999 holds position 999 of every document: 1 token and 1000 pairs each
    assert float(plan.rank_compute_s.max()) == 1100 * 1001
    assert per_doc_block_time(L, 1024, cm) == pytest.approx(plan.block_time_s, rel=1e-12)

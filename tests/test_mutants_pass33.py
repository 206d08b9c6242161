"""Kills two float-sliver survivors of ``subgroups._pieces`` (docs/TESTING.md, "Fourteenth pass";
mutmut names ``atac_hf.sharding.subgroups.x__pieces__mutmut_44`` and ``_50`` in the current numbering):
the edge margin ``end - 1e-9 * max(1.0, end)`` turned into ``1e-9 / max(1.0, end)`` (44: smaller for an
anchor ending past slot 1) or ``1e-9 * max(2.0, end)`` (50: larger for one ending below slot 2).

Each differs only for an anchor of the slot line ending within about ``1e-9 x end`` above a rank edge.
The tie is made on purpose: one continuous price (``linear_s_per_token``) is bisected in the test, on
``_slot_line``'s spans (which the mutated line does not compute), to the float where that anchor ends
a chosen sliver above the edge, and the documents are long enough (1e8 to 2e9 tokens, costed
analytically) that the sliver's share of the anchor is a few tokens, a piece that is not merged away.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding import subgroups
from test_mutants_pass32 import _bisect  # noqa: E402  (the least float where a monotone predicate holds)


def _model(lin: float) -> CostModel:
    return CostModel(linear_s_per_token=lin, attn_s_per_pair=1e-12, segment_overhead_s=0.0, tile=1,
                     kv_bytes_per_token=1.0, link_bandwidth=1.0, link_latency_s=0.0)


def _spans(L, C, lin):
    """The anchors' (start, end) on the slot line, as ``_layouts`` lays them (every document an anchor)."""
    whole = _model(lin).doc_cost(L)
    return subgroups._slot_line(whole * (C / float(whole.sum())), C, C)[0]


def _ranks_holding(plan, d: int) -> int:
    return sum(int((s[:, 0] == d).any()) for s in plan.segments)


def test_anchor_ending_a_sliver_past_a_far_rank_edge_stays_whole():
    # _pieces 44: anchor 1 sits in slot 62 but ends 4e-8 past edge 63 (under the margin 1e-9 * 63, over
    # the mutant's 1e-9 / 63): it covers one rank, so it is a tail and stays whole; the mutant gives
    # rank 63 four of its tokens, makes it a split anchor, and the chain's re-split splits it
    C, L = 64, np.array([10**9, 10**8, 10**8])
    lin = _bisect(lambda x: _spans(L, C, x)[1][1] <= 63 + 4e-8, 1e-6, 1e-4)
    start, end = _spans(L, C, lin)[1]
    assert 62 <= start and 63 + 1e-9 / end < end < 63 + 1e-9 * end
    plan = subgroups.plan_subgroups(L, C, _model(lin), anchor_share=0.5, two_way=False)
    assert _ranks_holding(plan, 1) == 1


def test_anchor_ending_a_sliver_past_rank_edge_one_is_split():
    # _pieces 50: anchor 0 ends 1.5e-9 past edge 1 (over the margin 1e-9 * end, under the mutant's
    # 2e-9): it covers ranks 0 and 1 (3 of its 2e9 tokens on rank 1) and is split; under the mutant
    # it covers rank 0 only, is a tail, and stays whole
    C, N = 3, 2 * 10**9
    L = np.array([N, N, N - 6])
    lin = _bisect(lambda x: _spans(L, C, x)[0][1] <= 1 + 1.5e-9, 1e-4, 1e-2)
    end = _spans(L, C, lin)[0][1]
    assert 1 + 1e-9 * end < end < 1 + 2e-9
    plan = subgroups.plan_subgroups(L, C, _model(lin), anchor_share=0.5, two_way=False)
    assert _ranks_holding(plan, 0) == 2

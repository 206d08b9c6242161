"""Tests that kill hand-planted mutants of ``plan_atp``, its helpers and ``subgroups.py`` (issue 20,
docs/TESTING.md, eighth pass), among them the seventh pass's leftovers: ties at a tolerance bound
(``<=`` against ``<``) and the ``1e-9`` of ``_split_by_share``'s floor. A tie at a tolerance is
made exact by setting the module's tolerance to the ratio of the two block times (a double whose
product with the smaller one is the larger exactly, asserted); the documented rule is "taken unless
more than the tolerance higher", so at the tie the plan is taken, and one double lower it is not.
Models whose seconds are exact (``tile=1``, whole-second prices).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding import atp, subgroups
from atac_hf.sharding.atp import _split_by_share, plan_atp
from atac_hf.sharding.baselines import plan_per_doc
from atac_hf.sharding.subgroups import plan_subgroups

# tokens and pairs at 1 s each, a link fast enough that any exchange hides behind the compute
UNIT = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, link_bandwidth=1e11, link_latency_s=1e-5)
# the same compute; one K/V byte a token over a 1 byte/s link: a gathered token costs 1 s
SLOW = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=1.0,
                 link_latency_s=0.0)


def _segs(plan):
    return [np.asarray(s).tolist() for s in plan.segments]


def _split_docs(plan):
    """Documents the plan cuts into more than one segment."""
    count = Counter(int(d) for s in plan.segments for d in np.asarray(s)[:, 0])
    return sorted(d for d, n in count.items() if n > 1)


def _tie(small: float, large: float) -> tuple[float, float]:
    """(tolerance at which ``small * (1 + tol) == large`` exactly, the next tolerance below)."""
    f = large / small
    assert small * f == large and 1 + (f - 1) == f
    below = float(np.nextafter(f, 0))
    assert small * below < large and 1 + (below - 1) == below
    return f - 1, below - 1


# ---------------------------------------------------------------------------------------------
# ties at TWO_WAY_TOLERANCE (the seventh pass's two leftovers)


def test_the_two_way_split_is_taken_when_exactly_the_tolerance_slower(monkeypatch):
    """``[32, 4]`` on 2 ranks under SLOW. The cost-level split of document 0 (rank 0: [0, 8) and
    [24, 32) and document 1 whole, 20 tokens, 36 + 228 + 10 pairs, 294 s; rank 1: [8, 24), 16 tokens,
    264 pairs, 280 s) waits 32 s for the gather of document 0's 32 tokens on rank 1 and 32 - 10 s more
    than its local attention on rank 0: 316 s. The two-way split (rank 0: [0, 5), [23, 32), 18 tokens;
    rank 1: [5, 23), 18 tokens) costs 295 s + 22 s = 317 s. Its level bound (287 s) is far below, so
    the rule is the second test: taken unless more than TWO_WAY_TOLERANCE above 316 s. At a tolerance
    of exactly 1/316 it is taken (317 s); one double lower, the cost-level plan (316 s). Kills
    ``robust <= plan * (1 + TWO_WAY_TOLERANCE)`` as ``<`` (the cost-level plan at the tie)."""
    L = np.array([32, 4])
    at, below = _tie(316.0, 317.0)
    monkeypatch.setattr(atp, "TWO_WAY_TOLERANCE", at)
    plan = plan_atp(L, 2, SLOW)
    assert plan.block_time_s == 317.0
    assert _segs(plan) == [[[0, 0, 5], [0, 23, 32], [1, 0, 4]], [[0, 5, 23]]]
    monkeypatch.setattr(atp, "TWO_WAY_TOLERANCE", below)
    plan = plan_atp(L, 2, SLOW)
    assert plan.block_time_s == 316.0
    assert _segs(plan) == [[[0, 0, 8], [0, 24, 32], [1, 0, 4]], [[0, 8, 24]]]


def test_the_sub_group_two_way_layout_is_taken_when_exactly_the_tolerance_slower(monkeypatch):
    """``[21, 25]`` on 3 ranks under UNIT: ``plan_subgroups`` lays the cost-level layout (slowest rank
    204 s) and the two-way one (205 s, tokens 15 / 16 / 15). The two-way one is taken unless its
    slowest rank computes more than TWO_WAY_TOLERANCE more: at exactly 1/204 it is (205 s), one
    double lower it is not (204 s). Kills the pick ``slowest <= best * (1 + TWO_WAY_TOLERANCE)`` as
    ``<``."""
    L = np.array([21, 25])
    at, below = _tie(204.0, 205.0)
    monkeypatch.setattr(subgroups, "TWO_WAY_TOLERANCE", at)
    plan = plan_subgroups(L, 3, UNIT)
    assert plan.rank_compute_s.tolist() == [205.0, 196.0, 201.0]
    assert plan.rank_num_tokens().tolist() == [15, 16, 15]
    monkeypatch.setattr(subgroups, "TWO_WAY_TOLERANCE", below)
    plan = plan_subgroups(L, 3, UNIT)
    assert plan.rank_compute_s.tolist() == [196.0, 204.0, 202.0]


# ---------------------------------------------------------------------------------------------
# _split_by_share: a whole share is a whole share


def test_a_document_whose_share_is_whole_gets_exactly_it_on_every_rank():
    """Three ranks at 1/3 each, documents of 22, 13 and 15 tokens, rank 0's room 17 tokens (its
    share of the 50 is 16 2/3: nothing is clipped). Every rank's tokens of every document are its
    exact share rounded down or up: 22 and 13 tokens give one remainder each; 15 / 3 = 5 is whole,
    so the third document is 5 / 5 / 5. In floating point ``15 * ((1/3 * 50) / 50)`` is
    4.999999999999999: without the ``1e-9`` in ``floor(want + 1e-9)`` rank 0's 5 is a 4 plus a
    remainder, the earlier documents' remainders take rank 0's last room first, and the third
    document comes out 4 / 6 / 5. Kills the floor without the ``1e-9``."""
    L = np.array([22, 13, 15])
    frac = np.full(3, 1 / 3)
    room = np.array([17.0, 50.0, 50.0])
    assert float(np.floor(15 * ((frac * 50) / 50))[0]) == 4.0  # the rounding the margin absorbs
    bounds, n, added = _split_by_share(UNIT, L, frac, room)
    assert n.sum(axis=1).tolist() == L.tolist() and (n.sum(axis=0) <= room).all()
    for d, length in enumerate(L.tolist()):
        for r in range(3):
            exact = Fraction(length, 3)
            assert int(exact) <= n[d, r] <= -(-exact.numerator // exact.denominator), (d, r, n.tolist())
    assert n[2].tolist() == [5, 5, 5]


# ---------------------------------------------------------------------------------------------
# plan_atp: max_anchors, the per_doc margin, the contiguous fallback's gathered documents


def test_max_anchors_zero_tries_no_anchor():
    """``max_anchors=0`` (api: "largest number of anchors tried"): ``[7]`` on 2 ranks can only stay
    whole (35 s) or be cut by the per_doc candidate (head-tail inside the document: rank 0 [0, 2) and
    [5, 7), rank 1 [2, 5), 20 s plus a hidden exchange): the per_doc plan. Kills ``int(max_anchors) + 1``
    (one anchor water-filled: 18 s, a plan ATP was told not to try)."""
    plan = plan_atp(np.array([7]), 2, UNIT, max_anchors=0)
    ref = plan_per_doc(np.array([7]), 2, UNIT)
    assert _segs(plan) == _segs(ref) == [[[0, 0, 2], [0, 5, 7]], [[0, 2, 5]]]
    assert plan.block_time_s == ref.block_time_s


def test_max_anchors_one_splits_at_most_one_document_unless_per_doc():
    """``[16, 5, 7]`` on 2 ranks, ``max_anchors=1``: the plan splits only document 0 (106 s: rank 0
    holds [0, 3), [12, 16) and document 2, 54 + 52 s; rank 1 [3, 12) and document 1). Two anchors
    give a 104 s plan, which ``max_anchors=1`` forbids (the unrestricted ATP takes the per_doc
    layout, 104.00002 s, every document split). Kills ``int(max_anchors) + 1`` (the 104 s plan of
    two anchors)."""
    L = np.array([16, 5, 7])
    plan = plan_atp(L, 2, UNIT, max_anchors=1)
    assert _split_docs(plan) == [0] and plan.block_time_s == 106.0
    assert _segs(plan) == [[[0, 0, 3], [0, 12, 16], [2, 0, 7]], [[0, 3, 12], [1, 0, 5]]]
    free = plan_atp(L, 2, UNIT)
    assert _split_docs(free) == [0, 1, 2] and free.block_time_s < 106.0


def test_atp_is_never_slower_than_per_doc_even_by_one_rounding():
    """``[27]`` on 4 ranks under a default-like model (tile 16): ATP's anchor plan and the per_doc
    layout differ in the last bit of their block time (2.0680000000000002e-05 s against 2.068e-05 s);
    "ATP is never worse than per_doc" holds exactly, which the ``1 + 1e-6`` margin on the threshold
    handed to ``_per_doc_may_win`` is for. Kills that margin as ``1 - 1e-6`` (the per_doc candidate
    skipped: ATP 1 ulp slower)."""
    cm = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-8, tile=16, link_bandwidth=1e9, link_latency_s=1e-6)
    L = np.array([27])
    assert plan_atp(L, 4, cm).block_time_s <= plan_per_doc(L, 4, cm).block_time_s


def test_the_contiguous_fallback_gathers_only_the_documents_it_cuts():
    """``[7, 1]`` on 4 ranks under a cap of 2 tokens with ``min_chunk=3``: neither anchor-tail nor
    per_doc fits, the contiguous fallback does (2 tokens a rank). It cuts document 0 over all four
    ranks; document 1 (one token, on rank 3 only) is not gathered ("It gathers only the documents
    it cuts"). Kills the fallback gathering every document (``np.arange(len(lengths))``)."""
    plan = plan_atp(np.array([7, 1]), 4, UNIT, max_tokens_per_rank=2, min_chunk=3)
    assert plan.strategy == "atp"
    assert _segs(plan) == [[[0, 0, 2]], [[0, 2, 4]], [[0, 4, 6]], [[0, 6, 7], [1, 0, 1]]]
    assert plan.gathered_docs.tolist() == [0]

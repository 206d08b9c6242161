"""Tests that kill hand-planted mutants the eighth pass left (issue 20, docs/TESTING.md, ninth
pass): ``sharding/plan.py``, ``sharding/baselines.py``, ``plan_atp`` and the packing planners
(``wfap.py``, ``wfap_place.py``, ``wfap_end.py``, ``window.py``). Each docstring names its mutant
and works the case by hand. Models whose seconds are exact (``tile=1``, whole-second prices).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig
from atac_hf.packing.planners.wfap import plan_wfap
from atac_hf.packing.planners.window import WindowContext, place_overdue, ref_cost_per_token
from atac_hf.sharding import plan_shards
from atac_hf.sharding.atp import plan_atp
from atac_hf.sharding.baselines import per_doc_block_time, plan_per_doc, plan_wlb_adaptive, plan_zigzag
from atac_hf.sharding.plan import ShardPlan, _expand
from atac_hf.sharding.segments import finish_plan, per_doc_segments

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
# tokens and pairs at 1 s each, a link fast enough that any exchange hides behind the compute
UNIT = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, link_bandwidth=1e11, link_latency_s=1e-5)
# every price 0 s: refused by plan_shards, not by the planner functions
ZERO = CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0, tile=1, link_latency_s=0.0)
# tokens and pairs at 1 s each; one K/V byte a token over a 1 byte/s link: a gathered token costs 1 s
SLOW = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=1.0,
                 link_latency_s=0.0)

# ---------------------------------------------------------------------------------------------
# sharding/plan.py


def _plan(lengths, segments, gathered, C=2):
    return ShardPlan(doc_lengths=np.asarray(lengths, np.int64), cp_size=C, strategy="hand",
                     segments=tuple(np.asarray(s, np.int64).reshape(-1, 3) for s in segments),
                     gathered_docs=np.asarray(gathered, np.int64), rank_compute_s=np.zeros(C))


def test_imbalance_of_a_plan_with_no_compute_is_one():
    """A model that prices all work at 0 s (``plan_shards`` refuses it, the planner functions do not)
    gives every rank 0 s: ``imbalance`` is then 1.0 (the property's ``mean > 0`` guard), not a
    division by zero. Kills ``imbalance`` with ``mean >= 0`` (ZeroDivisionError)."""
    plan = plan_per_doc(np.array([3, 2]), 2, ZERO)
    assert plan.rank_compute_s.tolist() == [0.0, 0.0]
    assert plan.imbalance == 1.0


def test_all_gather_digest_is_the_digest_before_kv_exchange_existed():
    """``digest``: plans digested before the ``kv_exchange`` field existed keep their digest, so an
    all-gather plan's digest is the SHA-1 of (cp size, document count), the lengths, every rank's
    segment count and segments, and the gathered documents, nothing else; an all-to-all plan adds
    the exchange's name. Kills the digest hashing ``kv_exchange`` always."""
    plan = _plan([4, 2], [[[0, 0, 1], [0, 3, 4], [1, 0, 2]], [[0, 1, 3]]], [0])
    h = hashlib.sha1()
    h.update(np.asarray([2, 2], np.int64).tobytes())
    h.update(np.asarray([4, 2], np.int64).tobytes())
    for s in plan.segments:
        h.update(np.asarray([len(s)], np.int64).tobytes())
        h.update(np.ascontiguousarray(s, np.int64).tobytes())
    h.update(np.asarray([0], np.int64).tobytes())
    assert plan.digest == h.hexdigest()[:16]
    a2a = dataclasses.replace(plan, kv_exchange="all_to_all", _cache={})
    h.update(b"all_to_all")
    assert a2a.digest == h.hexdigest()[:16] != plan.digest


def test_digest_tells_apart_plans_that_differ_only_in_which_rank_holds_a_segment():
    """Documents of 2 and 2 tokens on 2 ranks: rank 0 holds document 0 and rank 1 document 1, or rank 0
    holds nothing and rank 1 both. The concatenation of every rank's segments is the same 6 integers
    in both, so only the per-rank segment count tells the plans apart; the digest hashes "everything
    that decides what each rank computes", and the ranks compute different things. Kills the digest
    without the per-rank segment count (the two digests collide)."""
    a = _plan([2, 2], [[[0, 0, 2]], [[1, 0, 2]]], [])
    b = _plan([2, 2], [np.zeros((0, 3)), [[0, 0, 2], [1, 0, 2]]], [])
    a.validate()
    b.validate()
    assert a.digest != b.digest


def test_validate_refuses_a_token_held_by_two_ranks():
    """One 2-token document: rank 0 holds [0, 2), rank 1 [1, 2): token 1 twice, on two ranks (the
    document is gathered, so only the every-token-once check can refuse it). Kills ``validate``'s
    ``seen == 1`` as ``seen >= 1``."""
    plan = _plan([2], [[[0, 0, 2]], [[0, 1, 2]]], [0])
    with pytest.raises(AssertionError, match="several ranks"):
        plan.validate()


def test_validate_names_the_rank_that_holds_a_token_twice():
    """One 2-token document on rank 0 as [0, 2) and [1, 2): rank 0 holds token 1 twice. ``validate``
    refuses it as "rank 0: token indices not strictly increasing" (the rank at fault). With
    ``np.diff(idx) >= 0`` the plan is still refused, by the next check, but as "held by zero or
    several ranks" (one rank holds it twice), naming no rank: this test pins the message, which is
    all that mutant changes."""
    plan = _plan([2], [[[0, 0, 2], [0, 1, 2]], np.zeros((0, 3))], [])
    with pytest.raises(AssertionError, match="rank 0: token indices not strictly increasing"):
        plan.validate()


def test_expand_skips_empty_ranges():
    """``_expand`` concatenates ``arange(s, s + l)`` for each pair: an empty range adds nothing,
    wherever its start. ``[0, 7, 3]`` with lengths ``[2, 0, 3]`` is ``[0, 1, 3, 4, 5]``, and a
    trailing empty range changes nothing. Kills ``keep = lengths >= 0`` (the empty range's start
    overwrites the jump to the third range: ``[0, 1, 0, 1, 2]``; the trailing one indexes past
    the end)."""
    assert _expand(np.array([0, 7, 3]), np.array([2, 0, 3])).tolist() == [0, 1, 3, 4, 5]
    assert _expand(np.array([5, 9]), np.array([2, 0])).tolist() == [5, 6]
    # a plan holding an empty segment: its tokens are those of the others
    plan = _plan([2, 2, 2], [[[0, 0, 2], [1, 1, 1], [2, 0, 2]], [[1, 0, 2]]], [])
    assert plan.rank_token_indices(0).tolist() == [0, 1, 4, 5]


# ---------------------------------------------------------------------------------------------
# sharding/baselines.py


def test_per_doc_block_time_does_not_gather_one_token_documents():
    """``per_doc_block_time`` is the block time of ``finish_plan(per_doc_segments(...), None)``,
    which gathers only the documents it splits. ``[4, 1]`` on 2 ranks under SLOW: document 0 is
    cut into four 1-token chunks (rank 0: [0, 1), [3, 4); rank 1: [1, 3)), document 1 stays whole
    on rank 0. Rank 0: chunks 2 s + 5 s, document 1 one token and one pair (2 s, 1 s of it
    attention); rank 1: 2 tokens + 5 pairs, 7 s. The gather of document 0's 4 tokens: 2 x 4 x 1/2
    = 4 s, hiding rank 0's 1 s of local attention: rank 0 7 + 4 + 1 = 12 s, rank 1 7 + 4 = 11 s.
    Kills the exchange over every document's tokens (5: 13 s)."""
    L = np.array([4, 1])
    assert per_doc_block_time(L, 2, SLOW) == 12.0
    assert finish_plan(L, 2, "per_doc", per_doc_segments(L, 2), None, SLOW).block_time_s == 12.0


def test_wlb_adaptive_takes_zigzag_at_a_tie():
    """``wlb_adaptive`` is the faster of zigzag and per_doc by estimated block time, ties to zigzag
    (``atac_hf.sim.simulate``, which derives it from the two plans with that rule). ``[2, 4]`` on 2
    ranks under SLOW, both gathering all 6 tokens (2 x 6 x 1/2 = 6 s). zigzag: rank 0 holds document
    0 and [3, 4) of document 1 (2 + 3 and 1 + 4 s: 10 s), rank 1 [0, 3) of document 1 (3 + 6 = 9 s):
    16 s. per_doc: rank 0 [0, 1) of both and [3, 4) of document 1 (2 + 2 + 5 = 9 s), rank 1 [1, 2) of
    document 0 and [1, 3) of document 1 (3 + 7 = 10 s): 16 s. The tie goes to zigzag. Kills the
    tie ``<=`` as ``<`` (per_doc's rows)."""
    L = np.array([2, 4])
    z, d = plan_zigzag(L, 2, SLOW), plan_per_doc(L, 2, SLOW)
    assert z.block_time_s == d.block_time_s == 16.0
    w = plan_wlb_adaptive(L, 2, SLOW)
    assert [s.tolist() for s in w.segments] == [[[0, 0, 2], [1, 3, 4]], [[1, 0, 3]]]
    assert [s.tolist() for s in w.segments] == [s.tolist() for s in z.segments]


# ---------------------------------------------------------------------------------------------
# plan_atp


def test_atp_on_one_rank_gathers_nothing():
    """On one rank nothing is split, so ATP (which moves "only the K/V of documents it splits")
    gathers nothing: ``plan_shards([4], 1, "atp")`` is the document whole on rank 0, 4 tokens and
    10 pairs, 14 s, with no gathered document and no K/V tokens. Kills ``if C == 1`` as ``C == 0``:
    through the general path the one-anchor two-way plan (the same 14 s: an exchange over one rank
    costs nothing) is taken by the extra-anchor loop, and document 0 is gathered."""
    for cm in (UNIT, SLOW):
        plan = plan_shards(np.array([4]), 1, "atp", cm)
        assert [s.tolist() for s in plan.segments] == [[[0, 0, 4]]]
        assert plan.block_time_s == 14.0
        assert plan.gathered_docs.tolist() == [] and plan.kv_tokens == 0


# ---------------------------------------------------------------------------------------------
# packing/planners/window.py


def _item(sid, length, arrival, seq):
    return (sid, 0, length, arrival, seq, 0)


def _wctx(packs_per_window: int, max_defer: int, window: int, cap: int = 10) -> WindowContext:
    """A mid-stream window, cost = tokens."""
    cfg = PackingConfig(max_tokens=cap, packs_per_window=packs_per_window, max_defer=max_defer)
    return WindowContext(config=cfg, cost_model=LINEAR, window=window, final=False,
                         ref_cost_per_token=ref_cost_per_token(cfg, LINEAR))


def test_make_room_takes_the_pack_where_the_fewest_tokens_leave():
    """``place_overdue``: an overdue 8-token sample that fits no pack whole (cap 10; pack 0 holds 4 + 4
    tokens, room 2; pack 1 holds 7 + 2, room 1) displaces items that are not overdue, in the pack
    where the fewest tokens leave, then the cheapest (``_make_room``): pack 0 frees 4 + 4 = 8 tokens
    (needs 6), pack 1 frees 7 (needs 7): pack 1, although it is the costlier (9 s against 8 s).
    Kills ``_make_room``'s key ``(freed, cost, j)`` reordered as ``(cost, freed, j)``."""
    ctx = _wctx(2, 2, 2)
    late = _item(0, 8, arrival=0, seq=0)
    a, b, c, d = _item(1, 4, 2, 1), _item(2, 4, 2, 2), _item(3, 7, 2, 3), _item(4, 2, 2, 4)
    packs = [[a, b], [c, d]]
    out, newly = place_overdue(packs, [late], ctx)
    assert packs == [[a, b], [d, late]]
    assert out == [c] and newly == []


def test_atp_keeps_the_cost_level_split_when_the_two_way_one_is_over_the_tolerance():
    """``[3, 22]`` on 2 ranks under UNIT with one anchor allowed. Document 0 costs 3 + 6 = 9 s, document
    1 22 + 253 = 275 s: 142 s a rank, so document 1 is the anchor and document 0 a tail on rank 0. The
    cost-level split: rank 0 [0, 6) and [17, 22) (6 + 21 and 5 + 100 s, with the tail 141 s), rank 1
    [6, 17) (11 + 132 = 143 s, plus the 2e-5 s latency of an exchange it cannot hide). The two-way
    split levels tokens (25: 13 and 12) and pairs (259: 133 and 126): rank 0 [0, 4) and [16, 22)
    (with the tail 13 tokens, 6 + 10 + 117 pairs, 146 s), rank 1 [4, 16) (12 + 126 = 138 s): 146 s,
    over 143 x 1.02 = 145.86 and over the level bound (142 s) x 1.02, so the cost-level split stays
    (the docstring: replaced unless more than TWO_WAY_TOLERANCE higher). Kills ``level_bound``'s
    margin ``1 - 1e-9`` as ``1 + 1e-2`` (142 x 1.01 x 1.02 = 146.3 lets the 146 s plan through)."""
    plan = plan_atp(np.array([3, 22]), 2, UNIT, max_anchors=1)
    assert [s.tolist() for s in plan.segments] == [[[0, 0, 3], [1, 0, 6], [1, 17, 22]], [[1, 6, 17]]]
    assert plan.block_time_s == pytest.approx(143.0, abs=1e-3)


# ---------------------------------------------------------------------------------------------
# packing/planners/wfap.py (the fourth pass's setting: cost = causal pairs, cap 100, 2 packs a
# window, 10-token reference documents: a light pack costs 550)

PAIRS = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1)


def test_wfap_local_search_runs_with_two_packs():
    """Step 5 (local search) with 2 packs a window. Light samples of 4, 4, 3, 3, 3 tokens (10, 10, 6, 6
    and 6 pairs), all new: largest first to the cheapest pack (ties to the first), under a fill level
    far above (229): pack 0 takes samples 0, 2, 4 (22), pack 1 samples 1, 3 (16). Moving any one tail
    leaves the maximum at 22 or more; swapping sample 0 (10) for sample 3 (6) gives 18 and 20: the
    window's maximum drops from 22 to 20. Kills the local search only at ``P > 2``."""
    cfg = PackingConfig(max_tokens=100, packs_per_window=2, reference_doc_tokens=10)
    ctx = WindowContext(config=cfg, cost_model=PAIRS, window=0, final=False,
                        ref_cost_per_token=ref_cost_per_token(cfg, PAIRS))
    items = [(i, 0, n, 0, i, 0) for i, n in enumerate([4, 4, 3, 3, 3])]
    packs, carry, split = plan_wfap(items, ctx)
    assert sorted(sorted(it[0] for it in p) for p in packs) == [[0, 1], [2, 3, 4]]
    assert carry == [] and split == []

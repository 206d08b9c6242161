"""Tests that kill the mutmut survivors left in the packing planners (issue 20).

Each test names the mutant it kills (mutmut 3 names, ``atac_hf.packing.planners.baselines.<name>``)
and the hand-checked case on which the mutant gives another answer. docs/TESTING.md lists the
run and the verdicts. Expected values are written out by hand, never computed with the code
under test.
"""

from __future__ import annotations

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, StreamPacker
from atac_hf.packing.planners.baselines import plan_wlb
from atac_hf.packing.planners.window import WindowContext, ref_cost_per_token

# cost = tokens
LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
# cost = causal pairs only: L (L + 1) / 2 (a long document outweighs more tokens of short ones)
PAIRS = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1)
# every document costs 0 (legal: every price >= 0): only the token rule tells packs apart
ZERO = CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0, tile=1)


def _ctx(cfg: PackingConfig, cm: CostModel, window: int = 0, final: bool = False) -> WindowContext:
    return WindowContext(config=cfg, cost_model=cm, window=window, final=final,
                         ref_cost_per_token=ref_cost_per_token(cfg, cm))


def _wlb_cfg(max_tokens: int, packs: int, **kw) -> PackingConfig:
    # one threshold at the cap: no document below the cap is an outlier, all go to the greedy
    return PackingConfig(max_tokens=max_tokens, packs_per_window=packs, strategy="wlb",
                         wlb_thresholds=(max_tokens,), **kw)


def _item(sid: int, length: int, seq: int, start: int = 0, arrival: int = 0) -> tuple:
    # (sample_id, start, end, arrival, seq, frag)
    return (sid, start, start + length, arrival, seq, 1 if start else 0)


# ---------------------------------------------------------------------------- carry order
# Mutants x_plan_bfd__mutmut_66 and x_plan_wlb__mutmut_113: carry.sort(key=None) instead of
# data order. place_overdue places the carried overdue items in carry order; where the first
# one is split over the room left (all of it now: a sample that fits is cut only where every
# piece goes in this window), the order decides which sample is split. Sample ids are given
# out of data order, so sorting by the item tuple (id first) changes the order.

def test_bfd_splits_the_oldest_carried_overdue_sample_first():
    # cap 10, two packs, max_defer 0 (everything due at once), min_fragment 1. bfd: 7 (id 9) -> A
    # (room 3), 7 (id 8) -> B (room 3), 6 (id 5) -> C, 5 (id 1) -> D; A and B are emitted, carry
    # 6 (id 5, seq 1) and 5 (id 1, seq 2). place_overdue splits the oldest, id 5, 3 + 3 over A and
    # B (all of it); id 1 then fits nowhere and waits whole. In id order id 1 would be split 3 + 2.
    p = StreamPacker(PackingConfig(max_tokens=10, packs_per_window=2, strategy="bfd", max_defer=0,
                                   min_fragment=1), LINEAR)
    assert p.add_window([9, 5, 1, 8], [7, 6, 5, 7]) == [[(9, 0, 7), (5, 0, 3)], [(5, 3, 6), (8, 0, 7)]]
    assert [tuple(it) for it in p.state_dict()["pool"]] == [(1, 0, 5, 0, 2, 0)]


def test_wlb_splits_the_oldest_carried_overdue_sample_first():
    # the same window with wlb (default thresholds 2 and 5: all four queue, all overdue at
    # max_defer 0): its packs take the two 7s (ids 9 and 8) and leave id 5 (6 tokens, the older)
    # and id 1 (5 tokens) carried, overdue; place_overdue splits id 5 3 + 3 over the two packs'
    # room (all of it) and id 1 then waits whole. In id order id 1 would be split.
    p = StreamPacker(PackingConfig(max_tokens=10, packs_per_window=2, strategy="wlb", max_defer=0,
                                   min_fragment=1), LINEAR)
    assert p.add_window([9, 5, 1, 8], [7, 6, 5, 7]) == [[(9, 0, 7), (5, 0, 3)], [(5, 3, 6), (8, 0, 7)]]
    assert [tuple(it) for it in p.state_dict()["pool"]] == [(1, 0, 5, 0, 2, 0)]


# ---------------------------------------------------------------------------- plan_wlb, directly
# The planner's own answer, before fill_empty_packs and place_overdue (which would hide the
# difference in some of these cases).

def test_wlb_greedy_counts_a_fragment_by_its_own_tokens():
    # Mutant x_plan_wlb__mutmut_11: size = end + start. A fragment [6, 10) has 4 tokens (the
    # mutant counts 16, more than the cap). Cap 10, one pack: longest first 6 -> A, then the
    # fragment: 6 + 4 = 10 fits exactly. The mutant leaves the fragment out.
    cfg = _wlb_cfg(10, 1)
    frag, whole = _item(0, 4, 0, start=6), _item(1, 6, 1)
    packs, carry, split = plan_wlb([frag, whole], _ctx(cfg, LINEAR))
    assert packs == [[whole, frag]]
    assert carry == [] and split == []


def test_wlb_token_fallback_reaches_an_empty_pack():
    # Mutant x_plan_wlb__mutmut_35: the token heap starts at 1 token per pack. With every cost
    # 0, the least-workload pack is always A; a 6 that does not fit there (6 + 6 > 10) goes to
    # the pack with the fewest tokens, the empty B. The mutant's heap has lost B (its entry
    # (1, B) never matches B's 0 tokens) and carries the second 6.
    cfg = _wlb_cfg(10, 2)
    a, b = _item(0, 6, 0), _item(1, 6, 1)
    packs, carry, _ = plan_wlb([a, b], _ctx(cfg, ZERO))
    assert packs == [[a], [b]]
    assert carry == []


def test_wlb_workload_accumulates_over_a_packs_documents():
    # Mutant x_plan_wlb__mutmut_46: work[j] = cost (the last document's cost, not the sum).
    # cost = tokens, cap 10, 2 packs, 5, 3, 3, 2 longest first: 5 -> A (5); 3 -> B (3); 3 -> B
    # (3 < 5: B now 6); 2 -> A (5 < 6). The mutant thinks B weighs 3 and puts the 2 there.
    cfg = _wlb_cfg(10, 2)
    d5, d3, d3b, d2 = _item(0, 5, 0), _item(1, 3, 1), _item(2, 3, 2), _item(3, 2, 3)
    packs, carry, _ = plan_wlb([d5, d3, d3b, d2], _ctx(cfg, LINEAR))
    assert packs == [[d5, d2], [d3, d3b]]
    assert carry == []


def test_wlb_token_fallback_accepts_an_exact_fit():
    # Mutant x_plan_wlb__mutmut_78: `>= C` in the fewest-tokens fallback. cost = causal pairs,
    # cap 10, 2 packs: 8 -> A (36 pairs); five 2s -> B (3 pairs each, up to 15 < 36; B holds
    # 10 tokens); the sixth 2: the least loaded pack B is full, the fallback A has 8 tokens and
    # 8 + 2 = 10 fits exactly. The mutant refuses the exact fit and carries it.
    cfg = _wlb_cfg(10, 2)
    big = _item(0, 8, 0)
    twos = [_item(1 + i, 2, 1 + i) for i in range(6)]
    packs, carry, _ = plan_wlb([big, *twos], _ctx(cfg, PAIRS))
    assert packs == [[big, twos[5]], twos[:5]]
    assert carry == []

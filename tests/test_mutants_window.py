"""Tests that kill the mutmut survivors of the shared per-window pieces (issue 20, fourth pass).

``atac_hf.packing.planners.window``: each test names the mutants it kills (mutmut 3 names,
``atac_hf.packing.planners.window.<name>``) and the hand-checked case on which the mutant gives
another answer. docs/TESTING.md lists the run and the verdicts.
"""

from __future__ import annotations

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig
from atac_hf.packing.planners.window import (WindowContext, fill_empty_packs, overlength_pieces, place_overdue,
                                             ref_cost_per_token,
                                             scale_attention_price)

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


# x_scale_attention_price__mutmut_1 (`masked = None`): the masked pair price is scaled too, not
# dropped (a dropped one falls back to the causal price).

def test_scale_attention_price_scales_the_masked_pair_price_too():
    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=2.0, masked_attn_s_per_pair=0.5, tile=1)
    scaled = scale_attention_price(cm, 3.0)
    assert scaled.attn_s_per_pair == 6.0 and scaled.masked_attn_s_per_pair == 1.5
    assert scaled.linear_s_per_token == 1.0
    assert scale_attention_price(CostModel(linear_s_per_token=1.0, attn_s_per_pair=2.0, tile=1),
                                 3.0).masked_attn_s_per_pair is None


# x_overlength_pieces__mutmut_19 (`k >= 1`): a sample within the cap is one piece, even when it
# is shorter than min_fragment (split_fill cuts a sample with no clean place as
# overlength_pieces cuts it, whatever its length; the mutant fails on sizes[-2]).

def test_overlength_pieces_of_a_sample_within_the_cap_is_the_sample():
    assert overlength_pieces(3, 10, 5) == [3]
    assert overlength_pieces(10, 10, 5) == [10]
    assert overlength_pieces(21, 10, 3) == [10, 8, 3]


# x_fill_empty_packs__mutmut_1 (`empty = None`): every empty pack gets one carried item, the
# due ones first (here overdue: arrived in window 0, max_defer 2, window 2), then in data order.

def _item(sid, length, arrival, seq):
    return (sid, 0, length, arrival, seq, 0)


def _ctx(packs_per_window: int, max_defer: int, window: int) -> WindowContext:
    """A mid-stream window of a cap-10 packer, cost = tokens."""
    cfg = PackingConfig(max_tokens=10, packs_per_window=packs_per_window, max_defer=max_defer)
    return WindowContext(config=cfg, cost_model=LINEAR, window=window, final=False,
                         ref_cost_per_token=ref_cost_per_token(cfg, LINEAR))


def test_fill_empty_packs_gives_each_empty_pack_one_carried_item_due_first():
    ctx = _ctx(3, 2, 2)
    a, b, c = _item(0, 4, arrival=2, seq=5), _item(1, 4, arrival=0, seq=7), _item(2, 4, arrival=1, seq=3)
    packs = [[_item(9, 5, 2, 9)], [], []]
    rest = fill_empty_packs(packs, [a, b, c], ctx)
    assert packs[1:] == [[b], [c]] and rest == [a]
    full = [[a], [b]]
    assert fill_empty_packs(full, [c], ctx) == [c] and full == [[a], [b]]


# x_place_overdue__mutmut_40 (the pack's cost lowered when an overdue item joins it): each
# overdue item goes whole into the pack that is cheapest once the ones before are placed. Cap
# 10, cost = tokens, packs of 3 and 4 tokens, two overdue 3-token items: the first joins the
# 3 (then 6), the second the 4.

def test_place_overdue_puts_each_overdue_item_in_the_pack_cheapest_after_the_last():
    ctx = _ctx(2, 1, 1)
    x, y = _item(0, 3, 1, 0), _item(1, 4, 1, 1)
    o1, o2 = _item(2, 3, 0, 2), _item(3, 3, 0, 3)
    packs = [[x], [y]]
    rest, split = place_overdue(packs, [o1, o2], ctx)
    assert packs == [[x, o1], [y, o2]] and rest == [] and split == []


# x_place_overdue__mutmut_72 (a pack's cost reset to 0 after room is made in it): cap 10,
# cost = tokens, packs of 7 and 6 tokens (not overdue). An overdue 8 fits neither: the 6
# leaves (fewer tokens than the 7) and the 8 takes its pack (cost 8). An overdue 2 then fits
# both and joins the cheaper, the 7.

def test_place_overdue_costs_a_pack_after_making_room_in_it():
    ctx = _ctx(2, 1, 1)
    a, b = _item(0, 7, 1, 0), _item(1, 6, 1, 1)
    o1, o2 = _item(2, 8, 0, 2), _item(3, 2, 0, 3)
    packs = [[a], [b]]
    rest, split = place_overdue(packs, [o1, o2], ctx)
    assert packs == [[a, o2], [o1]] and rest == [b] and split == []

"""Forty-third mutation pass: the last two survivors of ``subgroups.py`` (fourteenth pass, "Left, not told apart").

``_layouts``' floor (the mean of the tails' cost and the anchors' exact work, a lower bound of every layout's slowest
rank) keeps a margin of ``1 - 1e-9`` below that mean, so that the rounding of its sums never lifts it above a layout
that reaches it; ``_resplit`` stops after the two-way re-split only where that layout is within
``TWO_WAY_TOLERANCE`` of the floor. Mutated to ``/ (1 - 1e-9)`` or ``x (1 + 1e-9)``, the floor lies above the mean, and
a two-way layout exactly at the mean stops the search at tolerance 0. The pack here reaches the mean exactly (token
costs only, every sum an integer): with the tolerance at 0 the cost-level re-split is still laid and compared.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding import subgroups

#: Token-wise cost only: a layout's slowest rank is its token count, every sum exact.
TOKENS = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=8.0)


@pytest.mark.parametrize("lengths", [[8, 4], [4, 8]])
def test_a_two_way_layout_exactly_at_the_work_floor_does_not_stop_the_search_at_tolerance_zero(lengths, monkeypatch):
    # 12 tokens at CP 3: the 8-token anchor over ranks of 4 tokens each, the 4-token tail whole on the third rank;
    # the floor's mean, (4 + 8) / 3 = 4, is every layout's slowest rank exactly
    monkeypatch.setattr(subgroups, "TWO_WAY_TOLERANCE", 0.0)
    L, found = subgroups._layouts(np.array(lengths), 3, TOKENS, 0.5, None, 1, True)
    assert [(mode, slowest) for mode, _, _, slowest in found] == [("cost", 4.0), ("two_way", 4.0)]
    # at the default tolerance the two-way layout is within it of the floor: the cost-level one is not laid
    monkeypatch.undo()
    L, found = subgroups._layouts(np.array(lengths), 3, TOKENS, 0.5, None, 1, True)
    assert [(mode, slowest) for mode, _, _, slowest in found] == [("two_way", 4.0)]

"""Causal pair counts of documents past 3,037,000,499 tokens, where n(n + 1) wraps int64.

``check_doc_lengths`` takes packs of up to 2**62 tokens and the cost model prices pairs past
int64 in float64, but ATP's two-way split and the sub-group planner counted a document's pairs
as ``n * (n + 1) // 2`` in int64: past about 3.04e9 tokens the count wrapped negative, the
two-way split gave up (or aimed at the wrong pair targets), and a ``[3.1e9, 5]`` pack at CP 2
came out 1,550,000,005 / 1,550,000,000 tokens where ``[3.0e9, 5]`` is level within a token
(the twenty-fourth mutation pass, docs/TESTING.md).
"""

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding import plan_shards
from atac_hf.sharding.segments import PAIRS_INT64_MAX, causal_pairs_float, causal_pairs_total
from atac_hf.sharding.two_way import _two_way_flat

UNIT = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0)  # tokens and pairs both priced


def _exact(n: int) -> int:
    return n * (n + 1) // 2


@pytest.mark.parametrize("lengths", [[1, 2, 3], [PAIRS_INT64_MAX], [PAIRS_INT64_MAX + 1], [4_000_000_000, 7],
                                     [2**40, 2**33 + 1, 1], [2**61, 5], [2**31] * 5])
def test_pair_counts_are_the_exact_counts_rounded_once(lengths):
    """Each count and the total equal the exact integer counts rounded once to float64: never
    wrapped, never summed from already-rounded parts while int64 holds the total."""
    L = np.array(lengths, dtype=np.int64)
    assert causal_pairs_float(L).dtype == np.float64
    assert causal_pairs_float(L).tolist() == [float(_exact(n)) for n in lengths]
    assert causal_pairs_total(L) == float(sum(_exact(n) for n in lengths))
    assert (causal_pairs_float(L) > 0).all()


def test_pairs_int64_max_is_the_last_length_whose_product_fits():
    assert PAIRS_INT64_MAX * (PAIRS_INT64_MAX + 1) < 2**63 <= (PAIRS_INT64_MAX + 1) * (PAIRS_INT64_MAX + 2)


def test_two_way_split_of_a_document_past_int64_pairs():
    """One 4e9-token anchor at CP 2: the zigzag halves (2e9 tokens and half the pairs each), as
    for shorter documents; with the wrapped count the split gave up (None)."""
    L = 4_000_000_000
    out = _two_way_flat(np.array([L]), 2, np.array([0]), np.array([-1]), np.inf, 1)
    assert out is not None
    seg, rank = out
    tokens = np.bincount(rank, weights=(seg[:, 2] - seg[:, 1]).astype(np.float64), minlength=2)
    assert tokens.tolist() == [L / 2, L / 2]
    pairs = [sum(_exact(int(e)) - _exact(int(s)) for (_, s, e), r in zip(seg.tolist(), rank.tolist()) if r == k)
             for k in range(2)]
    assert pairs[0] == pairs[1] == _exact(L) // 2


@pytest.mark.parametrize("C", [2, 3, 4])
def test_atp_levels_a_pack_past_int64_pairs_as_one_below_it(C):
    """``[n, 5]`` with tokens and pairs priced: every rank within a token of level, for n just
    below the int64 product limit and past it alike."""
    for n in (3_000_000_000, 3_100_000_000):
        plan = plan_shards([n, 5], C, "atp", UNIT)
        plan.validate()
        tokens = [sum(int(e) - int(s) for _, s, e in seg) for seg in plan.segments]
        assert sum(tokens) == n + 5
        assert max(tokens) - min(tokens) <= 1, (n, C, tokens)

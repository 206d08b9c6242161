"""Packs past 2**53 tokens, where float64 no longer holds every token count.

``check_doc_lengths`` takes packs of up to 2**62 - 1 tokens. Past 2**53, ATP's two splits lost
tokens to float rounding (found by the twenty-fourth mutation pass, docs/TESTING.md):

- the water fill (``_split_by_share``) raised OverflowError with no token cap (``int(inf)``), and
  where a float floor overshot a document it refused a split that fits (None);
- the two-way split's per-rank token totals, floored from floats, no longer summed to the anchors'
  tokens, so its rounding repair loop never ended: ``plan_shards([2**54 + 1, 2**54 + 3], 3)`` hung.

Every strategy must now plan such packs, cover every token once, and ATP level them within a token
or two when only tokens are priced.
"""

from __future__ import annotations

import contextlib
import signal

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding import STRATEGIES, plan_shards
from atac_hf.sharding.segments import check_doc_lengths
from atac_hf.sharding.two_way import _proportional_split, _two_way_flat
from atac_hf.sharding.water_fill import _split_by_share

TOKENS = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)  # only tokens priced
UNIT = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0)  # tokens and pairs

PACKS = [[2**53 + 1, 2**53 + 3], [2**54 + 1, 2**54 + 3], [2**61 - 8, 2**61 - 1, 7], [2**55 + 3] + [2**40] * 3,
         [2**62 - 6, 5], [2**53 + 1, 1, 2, 3]]


@contextlib.contextmanager
def _within(seconds: int):
    """Fail (not hang) where a planner loops: the two-way repair loop spun forever here."""
    def expired(*_):
        raise AssertionError(f"still planning after {seconds} s: an endless loop")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _tokens(plan) -> list[int]:
    return [sum(int(e) - int(s) for _, s, e in seg) for seg in plan.segments]


@pytest.mark.parametrize("lengths", PACKS)
@pytest.mark.parametrize("C", [2, 3, 8])
def test_every_strategy_plans_a_pack_past_2_53_tokens(lengths, C):
    for cm in (TOKENS, UNIT):
        for strategy in STRATEGIES:
            with _within(60):
                plan = plan_shards(lengths, C, strategy, cm)
            plan.validate()
            assert sum(_tokens(plan)) == sum(lengths), (strategy, cm.name)


@pytest.mark.parametrize("lengths", PACKS)
@pytest.mark.parametrize("C", [2, 3, 8])
def test_atp_levels_tokens_past_2_53(lengths, C):
    """Only tokens priced: ATP's ranks within two tokens of each other (as below 2**53), where the
    documents allow it (the largest fits a rank's share, or is split)."""
    with _within(60):
        plan = plan_shards(lengths, C, "atp", TOKENS)
    tokens = _tokens(plan)
    assert max(tokens) - min(tokens) <= 2, tokens


def test_the_two_packs_that_crashed_and_hung():
    with _within(60):
        crashed = plan_shards([2**53 + 1, 2**53 + 3], 3, "atp", TOKENS)  # was OverflowError
        hung = plan_shards([2**54 + 1, 2**54 + 3], 3, "atp", TOKENS)  # never returned
    for plan in (crashed, hung):
        plan.validate()
        assert max(_tokens(plan)) - min(_tokens(plan)) <= 1


@pytest.mark.parametrize("lengths", [[2**53 + 1, 2**53 + 3], [2**60 + 7, 3, 2**58 - 1], [10, 7, 3]])
def test_split_by_share_without_a_cap_covers_every_token(lengths):
    L = np.array(lengths, dtype=np.int64)
    for C in (2, 3, 8):
        bounds, n, _ = _split_by_share(TOKENS, L, np.full(C, 1.0 / C), np.full(C, np.inf))
        assert n.sum(axis=1).tolist() == lengths and (n >= 0).all()
        assert bounds[:, -1].tolist() == lengths
        per_rank = n.sum(axis=0).tolist()  # even to float precision: shares are floats
        assert max(per_rank) - min(per_rank) <= len(lengths) + sum(lengths) * 2.0**-50


def test_split_by_share_takes_rooms_that_fit_exactly_past_2_53():
    """Rooms summing to the tokens exactly: the float floors overshot a document and the split
    was refused (None) although it fits."""
    L = np.array([2**53 + 1, 2**53 + 3], dtype=np.int64)
    total = int(L.sum())
    room = [total // 3, total // 3, total - 2 * (total // 3)]
    out = _split_by_share(TOKENS, L, np.full(3, 1.0 / 3), np.array(room, dtype=np.float64))
    assert out is not None
    n = out[1]
    assert n.sum(axis=1).tolist() == L.tolist()
    assert all(int(x) <= r for x, r in zip(n.sum(axis=0).tolist(), room))


@pytest.mark.parametrize("A, goal", [([2**60 + 1, 2**55 + 3], [2**59 + 2**54 + 2, 2**59 + 2, 2**54 - 0]),
                                     ([7, 5], [4, 4, 4]), ([2**53 + 1], [2**52, 2**52 + 1])])
def test_proportional_split_is_exact(A, goal):
    """Rows sum to each anchor's tokens, every count within one token of the exact proportion."""
    A_, goal_ = np.array(A, dtype=np.int64), np.array(goal, dtype=np.int64)
    assert int(goal_.sum()) == int(A_.sum())
    n = _proportional_split(A_, goal_)
    assert n.sum(axis=1).tolist() == A
    G = sum(goal)
    for d, a in enumerate(A):
        for r, g in enumerate(goal):
            assert a * g // G <= int(n[d, r]) <= a * g // G + 1


def test_two_way_totals_sum_to_the_anchors_past_2_53():
    """Two anchors past 2**54 at CP 3, no tails: every rank's total is the exact level share."""
    L = np.array([2**54 + 1, 2**54 + 3], dtype=np.int64)
    with _within(60):
        out = _two_way_flat(L, 3, np.array([0, 1]), np.array([-1, -1]), np.inf, 1)
    assert out is not None
    seg, rank = out
    per_rank = [sum(int(e) - int(s) for (_, s, e), r in zip(seg.tolist(), rank.tolist()) if r == k) for k in range(3)]
    q, m = divmod(int(L.sum()), 3)
    assert sorted(per_rank) == sorted([q + (k < m) for k in range(3)])


def test_a_pack_is_refused_from_2_62_tokens_exactly():
    """The bound is exact: 2**62 - 1 tokens are taken (a float sum rounds them to 2**62), 2**62 refused."""
    assert check_doc_lengths([2**61, 2**61 - 1]).tolist() == [2**61, 2**61 - 1]
    assert check_doc_lengths([2**61 - 8, 2**61 - 1, 7]).sum() == 2**62 - 2
    for bad in ([2**61, 2**61], [2**62], [2**61, 2**61 - 1, 1]):
        with pytest.raises(ValueError, match=r"2\*\*62 or more: the document lengths are not token counts"):
            check_doc_lengths(bad)


@pytest.mark.parametrize("A, goal", [([2**58 + 5, 2**54 + 1], [2**58 - 3, 2**54 + 2, 3, 4]),
                                     ([2**61 + 11], [2**60 + 7, 2**59 + 1, 2**59 + 3])])
def test_proportional_split_gives_remainders_to_the_largest_fractions(A, goal):
    """Past 2**53 (the exact path) each anchor's floors are topped up where the exact fraction
    ``A[d] * goal[r] % G / G`` is largest (ties by rank), as the float path does below 2**53: not to
    the largest shares (the twenty-fifth pass's ``_proportional_split`` mutant 35)."""
    n = _proportional_split(np.array(A, dtype=np.int64), np.array(goal, dtype=np.int64))
    G = sum(goal)
    for d, a in enumerate(A):
        floors = [a * g // G for g in goal]
        short = a - sum(floors)
        order = sorted(range(len(goal)), key=lambda r: (-(a * goal[r] % G), r))[:short]
        assert n[d].tolist() == [f + (r in order) for r, f in enumerate(floors)]


@pytest.mark.parametrize("lengths, frac, want", [
    ([18014398509482220, 18014398509482785, 576460752303424070], [0.5712241113807355, 0.4287758886192647],
     [[10290258780637424, 7724139728844796], [10290258780637747, 7724139728845038],
      [329288280980393542, 247172471323030528]]),
    ([18014398509482455, 18014398509482757],
     [0.011242157922649028, 0.586398236808552, 0.3845305232238172, 0.017829082044982004],
     [[202520712925135, 10563611523127115, 6927086084413641, 321180189016564],
      [202520712925138, 10563611523127293, 6927086084413757, 321180189016569]]),
])
def test_split_by_share_gives_an_overshoot_back_from_the_smallest_fractions(lengths, frac, want):
    """Past 2**53 a float floor can exceed a document's tokens; the excess is given back from the
    ranks whose share's fraction is smallest (the twenty-fifth pass's ``_split_by_share`` mutants 56
    and 60 gave it back from rank 0, or from the largest share). Pinned outputs of 8bee53d's rule."""
    _, n, _ = _split_by_share(TOKENS, np.array(lengths, dtype=np.int64), np.array(frac), np.full(len(frac), np.inf))
    assert n.tolist() == want
    assert n.sum(axis=1).tolist() == lengths

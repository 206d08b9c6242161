"""Kills survivors of the twenty-fourth mutation pass over ``atac_hf/sharding/atp.py``'s helpers
(mutmut 3.8.1, every mutant of ``_price_error_imbalance``, ``_least_price_error``, ``_water_fill``,
``_robustly_no_worse`` and ``_block_at`` that the narrowed selection let through; names
``atac_hf.sharding.atp.x_<function>__mutmut_<N>``).

Every case is one the clean code reaches (the helpers' arguments recorded while ``plan_atp`` plans the
pack named in the docstring) or a hand-built plan of the same kind, on models whose seconds are exact
(``tile=1``, whole-second prices), and the expected values are worked by hand in the docstrings.
"""

from __future__ import annotations

import warnings

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding import atp, plan_shards
from atac_hf.sharding.atp import (_block_at, _least_price_error, _price_error_imbalance, _robustly_no_worse,
                                  _water_fill, plan_atp)
from atac_hf.sharding.segments import finish_plan
from atac_hf.sharding.subgroups import _scaled

from test_mutants_pass14 import NODES2, PAIRS  # noqa: E402  (pairs at 1 s over an 8 B/s link; nodes of 2 ranks)

# tokens and pairs at 1 s each; one K/V byte a token over a 1 byte/s link: a gathered token costs 1 s
SLOW = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=1.0,
                 link_latency_s=0.0)


def _segs(plan):
    return [np.asarray(s).tolist() for s in plan.segments]


# ---------------------------------------------------------------- _price_error_imbalance


# tokens at 1 s, causal pairs at 4 s, a 3-token sliding window, masked segments' pairs free; K/V one byte
# a token over a 1 byte/s link. A document longer than the window is masked: 6 tokens cost 6 s, 2 cost 2 + 3 x 4.
WINDOW3 = CostModel(linear_s_per_token=1.0, attn_s_per_pair=4.0, masked_attn_s_per_pair=0.0, tile=1, sliding_window=3,
                    kv_bytes_per_token=1.0, link_bandwidth=1.0, link_latency_s=0.0)


def test_price_error_imbalance_counts_a_rank_that_holds_nothing():
    """``_price_error_imbalance`` is ``ShardPlan.imbalance`` (max / mean over the cp_size ranks) with
    attention at 0.5x and 2x: a rank holding nothing counts in the mean with 0 s. ``[6, 2]`` at cp 3
    under WINDOW3: document 0 (6 tokens, longer than the window: masked, pairs free) costs 6 s, document
    1 (2 tokens, 3 causal pairs at 4 s) 14 s. Only document 0 is long enough to split (2 x 3 tokens) and
    it costs no more than a rank's share (20 / 3 s), so ATP's first plan keeps both whole: document 1 on
    rank 0, document 0 on rank 1, rank 2 empty. At 2x attention rank 0 costs 2 + 24 = 26 s, rank 1 6 s:
    26 / (32 / 3) = 2.4375 (at 0.5x: 8 / (14 / 3) = 1.714). Without ``minlength`` the empty rank drops out
    of the mean: 26 / 16 = 1.625.

    That number decides the plan: the extra anchor's cost-level plan (document 0 split over ranks 1 and 2,
    14 s as well, within TWO_WAY_TOLERANCE) is taken where it is more level at those prices, 1.95 at 2x
    ((2 + 24) / ((26 + 9 + 5) / 3)); it is, against 2.4375, and not against 1.625, where ATP kept the plan
    with an idle rank and ``plan_shards`` had to fill it (19 s). The clean plan: rank 1 holds token 0 of
    document 0 (5 s), rank 2 tokens 1-5 (masked, 5 s), rank 2 needs key 0 (window 3): the all-to-all
    moves 1 row, 2 x 1 s; rank 0 computes 14 s and hides it. Kills ``x__price_error_imbalance__mutmut_12``
    (``np.bincount`` without ``minlength=C``)."""
    whole = finish_plan(np.array([6, 2]), 3, "atp", [np.array([[1, 0, 2]]), np.array([[0, 0, 6]]),
                                                     np.zeros((0, 3), np.int64)], None, WINDOW3)
    assert whole.rank_compute_s.tolist() == [14.0, 6.0, 0.0]
    assert _price_error_imbalance(whole, WINDOW3) == 2.4375
    plan = plan_shards([6, 2], 3, "atp", WINDOW3)
    assert _segs(plan) == [[[1, 0, 2]], [[0, 0, 1]], [[0, 1, 6]]]
    assert plan.rank_compute_s.tolist() == [14.0, 5.0, 5.0]
    assert plan.kv_exchange == "all_to_all" and plan.comm_s == 2.0
    assert plan.block_time_s == 14.0


# only masked attention costs anything (a whole document, from its first token and inside no window, is free)
MASKED_ONLY = CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0, masked_attn_s_per_pair=1.0, tile=1,
                        kv_bytes_per_token=1.0, link_bandwidth=1.0, link_latency_s=0.0)


def test_price_error_imbalance_of_a_plan_that_costs_nothing_is_level():
    """A model that prices only masked attention prices compute (``plan_shards`` takes it), but a whole
    document costs 0 s under it. ``[8]`` at cp 2: the document costs no more than a rank's share (0 s),
    so ATP's first plan keeps it whole on rank 0: every rank computes 0 s at any attention price, and its
    price-error imbalance is 1.0, as ``ShardPlan.imbalance`` says for a zero mean (not a division by zero,
    and not "unlevel"). ATP then checks that plan against the price error (the extra anchor's two-way
    split costs more): ``plan_atp`` and ``plan_shards`` must plan it. Kills
    ``x__price_error_imbalance__mutmut_32`` and ``_36`` (``mean > 0`` as ``or True`` / ``>= 0``:
    ZeroDivisionError in both) and ``_38`` (2.0 for a zero mean). Its idle rank is then filled, and the
    per_doc head-tail split (26 s of masked attention) wins against that, as ``plan_shards`` returned
    before; ``plan_atp`` fills its plan itself since the fifty-sixth stop, so it returns that split too."""
    whole = finish_plan(np.array([8]), 2, "atp", [np.array([[0, 0, 8]]), np.zeros((0, 3), np.int64)], None,
                        MASKED_ONLY)
    assert whole.rank_compute_s.tolist() == [0.0, 0.0] and whole.imbalance == 1.0
    assert _price_error_imbalance(whole, MASKED_ONLY) == 1.0
    plan = plan_atp(np.array([8]), 2, MASKED_ONLY)
    assert _segs(plan) == [[[0, 0, 2], [0, 6, 8]], [[0, 2, 6]]] and plan.block_time_s == 26.0
    shards = plan_shards([8], 2, "atp", MASKED_ONLY)
    shards.validate()
    assert _segs(shards) == _segs(plan) and shards.block_time_s == plan.block_time_s


# ---------------------------------------------------------------- _least_price_error


def _lin(bandwidth):
    """Tokens at 1 s, attention free (the price-error band leaves every plan's cost as it is), one
    K/V byte a token over a link of ``bandwidth`` bytes/s: gathering G tokens over 2 ranks costs
    2 x G / 2 / bandwidth = G / bandwidth s, exposed (no local attention hides it)."""
    return CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1, kv_bytes_per_token=1.0,
                     link_bandwidth=bandwidth, link_latency_s=0.0)


def _two_docs(cm, rank0, rank1):
    return finish_plan(np.array([50, 40]), 2, "atp", [np.array(rank0), np.array(rank1)], None, cm, "all_gather")


def test_least_price_error_takes_a_plan_exactly_the_tolerance_slower():
    """``_least_price_error`` takes the first other plan "within TWO_WAY_TOLERANCE of its estimated block
    time" that is more level: within includes the bound (as for the extra anchors' plans, pass 13).
    Documents of 50 and 40 tokens whole on ranks 0 and 1: 50 s, max / mean 50 / 45. The other plan moves
    4 tokens of document 0 to rank 1 (46 and 44 tokens) and gathers document 0: 50 / 10 = 5 s exposed,
    51 s = 50 x 1.02 exactly, max / mean 46 / 45: taken. Over a 9 byte/s link the same plan costs
    51.56 s, over the bound: the first plan stays. Kills ``x__least_price_error__mutmut_6``
    (``other.block_time_s < limit``)."""
    cm = _lin(10.0)
    plan = _two_docs(cm, [[0, 0, 50]], [[1, 0, 40]])
    other = _two_docs(cm, [[0, 0, 46]], [[0, 46, 50], [1, 0, 40]])
    assert plan.block_time_s == 50.0 and other.block_time_s == 51.0 == 50.0 * (1 + atp.TWO_WAY_TOLERANCE)
    worst = _price_error_imbalance(plan, cm)
    assert worst == 50 / 45 and _price_error_imbalance(other, cm) == 46 / 45
    assert _least_price_error(plan, worst, [other], cm) is other
    cm = _lin(9.0)
    plan = _two_docs(cm, [[0, 0, 50]], [[1, 0, 40]])
    other = _two_docs(cm, [[0, 0, 46]], [[0, 46, 50], [1, 0, 40]])
    assert other.block_time_s > 51.0
    assert _least_price_error(plan, worst, [other], cm) is plan


def test_least_price_error_keeps_the_plan_against_one_only_as_level():
    """Another plan replaces the plan only where it is *more* level at the price-error band ("more
    level than all before it"). Documents of 50 and 40 tokens over 2 ranks, 100 byte/s link: the plan
    holds them whole (50 and 40 s, 50 s); the other holds document 1 and the first 10 tokens of
    document 0 on rank 0, the rest of document 0 on rank 1: the same 50 / 40 s split, max / mean 50 / 45
    as well, plus document 0's gather, 50 / 100 = 0.5 s: 50.5 s, within the tolerance but only as
    level. The plan stays (the other is slower and moves K/V for nothing). Kills
    ``x__least_price_error__mutmut_11`` (``got <= worst``)."""
    cm = _lin(100.0)
    plan = _two_docs(cm, [[0, 0, 50]], [[1, 0, 40]])
    other = _two_docs(cm, [[0, 0, 10], [1, 0, 40]], [[0, 10, 50]])
    assert other.rank_compute_s.tolist() == [50.0, 40.0] and other.block_time_s == 50.5
    worst = _price_error_imbalance(plan, cm)
    assert _price_error_imbalance(other, cm) == worst == 50 / 45
    assert _least_price_error(plan, worst, [other], cm) is plan


# ---------------------------------------------------------------- _water_fill


def test_water_fill_correction_rescales_by_each_ranks_cost_per_token():
    """``[2, 4]`` at cp 2 under PAIRS: the 4-token document (10 pairs, 10 s) is the anchor, the 2-token
    one (3 s) a tail on rank 0, so ``_water_fill`` gets loads [3, 0], tokens [2, 0]. Levelling to 6.5 s
    wants shares 3.5 and 6.5 s: 1.4 and 2.6 tokens, so 1 and 3 (the remainder to the larger fraction):
    bounds [0, 1, 3, 4, 4], rank 0 row 0 (1 s), rank 1 rows 1-3 (2 + 3 + 4 = 9 s): loads 4 and 9 s. The
    correction divides each share by the rank's measured cost per token, 1 / 1 and 9 / 3 s: 3.5 and
    2.17, fractions 0.62 and 0.38 of 4 tokens: 2.47 and 1.53, so 2 and 2 (the remainder to 0.53): rank 0
    rows 0 and 3 (1 + 4 s), rank 1 rows 1 and 2 (2 + 3 s), loads 8 and 5 s, under 9: taken. Kills
    ``x__water_fill__mutmut_57`` (``max(g, 2)``: rank 0's one token read as 0.5 s a token, 3 and 1
    tokens, loads 10 and 3 s, refused) and ``_59`` (``g > 1``: rank 0 read as free, all 4 tokens to rank
    1, 3 and 10 s, refused)."""
    bounds, added = _water_fill(PAIRS, np.array([4]), np.array([10.0]), np.array([3.0, 0.0]), np.array([2, 0]), np.inf)
    assert bounds.tolist() == [[0, 1, 2, 3, 4]]
    assert added.tolist() == [5.0, 5.0]


def test_water_fill_correction_gives_no_tokens_to_a_rank_the_first_split_left_empty():
    """``[9, 4, 10, 7]`` at cp 3 under PAIRS: the 10-token document (55 s) is the anchor, the tails (9, 7,
    4 tokens: 45, 28, 10 s) one on each rank. Levelling to 46 s wants shares 1, 18, 36 s: 0.18, 3.27,
    6.55 tokens, so 0, 3, 7: bounds [0, 0, 2, 6, 9, 10, 10], rank 1 rows 0, 1, 9 (1 + 2 + 10 = 13 s), rank
    2 rows 2-8 (42 s): loads 45, 41, 52 s. Rank 0 has no token, hence no measured cost per token: the
    correction gives it none (its share counts 0) and rescales the others, 18 / (13 / 3) and 36 / 6: 4.15
    and 6, fractions 0.41 and 0.59 of 10 tokens: 4 and 6 (the remainder to 0.91): bounds [0, 0, 2, 5, 8,
    10, 10], rank 1 rows 0, 1, 8, 9 (22 s), rank 2 rows 2-7 (33 s): loads 45, 50, 43 s, under 52: taken.
    Kills ``x__water_fill__mutmut_60`` (rank 0 read as 1 s a token) and ``_75`` (its share counted as 1
    token): 1, 4, 5 tokens, loads 46, 52, 40 s, refused; and ``_47`` (the guard over every rank, the empty
    one's 0 s included: no correction at all)."""
    bounds, added = _water_fill(PAIRS, np.array([10]), np.array([55.0]), np.array([45.0, 28.0, 10.0]),
                                np.array([9, 7, 4]), np.inf)
    assert bounds.tolist() == [[0, 0, 2, 5, 8, 10, 10]]
    assert added.tolist() == [0.0, 22.0, 33.0]


def test_water_fill_skips_the_correction_where_the_ranks_with_a_share_have_no_room():
    """``[7, 7]`` and 28 one-token documents at cp 3 under PAIRS, 14 tokens a rank at most (42 / 3): with
    document 0 the anchor, document 1 (28 s) goes to rank 0 and the one-token documents (1 s each) fill
    ranks 1 and 2 to the cap (14 s each). Levelling wants shares 0, 14, 14 s, but ranks 1 and 2 have no
    room: all 7 tokens go to rank 0 (bounds [0, 4, 4, 4, 4, 4, 7], 28 s). No rank with a share holds a
    token, so no correction can be measured (every rescaled share is 0): the split stands, and nothing
    is divided by zero (no RuntimeWarning from ``plan_atp`` either). Kills ``x__water_fill__mutmut_83``
    (``adj_sum >= 0``: 0 / 0, NaN fractions)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bounds, added = _water_fill(PAIRS, np.array([7]), np.array([28.0]), np.array([28.0, 14.0, 14.0]),
                                    np.array([7, 14, 14]), 14.0)
        plan = plan_atp(np.array([7, 7] + [1] * 28), 3, PAIRS, max_tokens_per_rank=14)
    assert bounds.tolist() == [[0, 4, 4, 4, 4, 4, 7]]
    assert added.tolist() == [28.0, 0.0, 0.0]
    plan.validate()
    assert plan.rank_num_tokens().max() <= 14


# ---------------------------------------------------------------- _robustly_no_worse


def _hand_plan(lengths, segments):
    return finish_plan(np.array(lengths), len(segments), "hand", [np.array(s).reshape(-1, 3) for s in segments],
                       None, CostModel(linear_s_per_token=8.0, attn_s_per_pair=1.0, tile=1))


def test_robustly_no_worse_allows_the_subgroup_margin(monkeypatch):
    """``SUBGROUP_MARGIN`` (a documented setting, 0 as shipped): plan a is robustly no worse than b where
    it "stays within SUBGROUP_MARGIN of b's block time" at 0.25x-4x the attention price. The hand plans
    of ``test_mutants_atp`` (8 s a token, 1 s a pair): a against b costs 79.5 / 82.5 s at 0.25x, 87 / 85
    at 0.5x, 132 / 136 at 2x, 192 / 208 at 4x; a is over b only at 0.5x, by 87 / 85 = 2.35%. With a
    margin of 3% (85 x 1.03 = 87.55 s) a is within it; with 2% (86.7 s) not. Kills
    ``x__robustly_no_worse__mutmut_26`` (``/ (1 + margin)``: 82.52 s) and ``_27`` (``* (1 - margin)``:
    82.45 s), the same as the clean code only at a margin of 0."""
    cm = CostModel(linear_s_per_token=8.0, attn_s_per_pair=1.0, tile=1)
    b = _hand_plan([1] * 10 + [8], [[(i, 0, 1) for i in range(10)], [(10, 0, 8)]])
    a = _hand_plan([7, 1, 1, 1], [[(0, 0, 7), (1, 0, 1), (2, 0, 1)], [(3, 0, 1)]])
    assert _block_at(a, _scaled(cm, 0.5)) == 87.0 and _block_at(b, _scaled(cm, 0.5)) == 85.0
    monkeypatch.setattr(atp, "SUBGROUP_MARGIN", 0.03)
    assert _robustly_no_worse(a, b, cm) is True
    monkeypatch.setattr(atp, "SUBGROUP_MARGIN", 0.02)
    assert _robustly_no_worse(a, b, cm) is False


# ---------------------------------------------------------------- _block_at


def test_block_at_a_plan_whose_last_rank_holds_nothing():
    """``[4]`` at cp 5 under SLOW: too short to split head-tail over 5 ranks (2 x 5 tokens), whole it
    costs 4 + 10 = 14 s; ATP takes the contiguous split, one token on each of ranks 0-3 (rank r: 1 + r + 1
    s), rank 4 empty. The all-to-all moves rank 0's key to ranks 1, 2, 3 (3 rows out of rank 0, 3 into
    rank 3): 2 x 3 s; nothing is local, so the block is rank 3's 5 + 6 = 11 s. Its sub-group competitor
    (11 s as well) is checked against it at 0.25x-4x the attention price by ``_block_at``, which must cost
    the empty rank too: at 0.5x the ranks compute 1.5, 2, 2.5, 3, 0 s, block 3 + 6 = 9 s, as
    ``finish_plan`` says. Kills ``x__block_at__mutmut_20`` (``np.bincount`` without ``minlength``: a (4,)
    compute against a (5,) local attention, ValueError inside ``plan_atp``)."""
    plan = plan_atp(np.array([4]), 5, SLOW)
    assert _segs(plan) == [[[0, 0, 1]], [[0, 1, 2]], [[0, 2, 3]], [[0, 3, 4]], []]
    assert plan.kv_exchange == "all_to_all" and plan.comm_s == 6.0 and plan.block_time_s == 11.0
    assert _block_at(plan, SLOW) == 11.0
    half = _scaled(SLOW, 0.5)
    assert _block_at(plan, half) == 9.0
    assert finish_plan(plan.doc_lengths, 5, "atp", list(plan.segments), plan.gathered_docs, half,
                       "all_to_all").block_time_s == 9.0


def test_block_at_keeps_the_routed_exchanges_exposed_second_phase():
    """A plan whose all-to-all is routed by node (NODES2, ranks {0, 1} and {2, 3}): ``[1, 2, 2, 4]`` at
    cp 4, rank 0 the first token of every document (4 tokens, 4 pairs: 8 s), rank 1 the second token of
    documents 1-3 (3 + 6: 9 s), ranks 2 and 3 tokens 2 and 3 of document 3 (1 + 3 and 1 + 4 s). Documents
    1-3 are gathered; rank 0's document 0 (1 s of attention) is its only local work. The routed exchange
    costs 2 s in its first phase (hidden behind local attention like a direct one) and 0.25 s in its
    second (``comm_tail_s``, hidden behind nothing): rank 1 waits 9 + 2 + 0.25 = 11.25 s, the block time.
    ``_block_at`` re-costs a plan's compute with its exchange kept: at the plan's own prices 11.25 s, at
    2x attention rank 1's 3 + 12 + 2.25 = 17.25 s, as ``finish_plan`` gives with the same route. Kills
    ``x__block_at__mutmut_34`` (the first phase as ``comm_s + comm_tail_s``: 11.75 s) and ``_37`` (the
    second phase subtracted: 10.75 s)."""
    segs = [[(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)], [(1, 1, 2), (2, 1, 2), (3, 1, 2)], [(3, 2, 3)],
            [(3, 3, 4)]]
    lengths = np.array([1, 2, 2, 4])
    plan = finish_plan(lengths, 4, "atp", [np.array(s) for s in segs], None, NODES2, "all_to_all", route=2)
    assert plan.kv_route_node == 2 and plan.gathered_docs.tolist() == [1, 2, 3]
    assert plan.rank_compute_s.tolist() == [8.0, 9.0, 4.0, 5.0]
    assert plan.comm_s == 2.25 and plan.comm_tail_s == 0.25 and plan.block_time_s == 11.25
    assert _block_at(plan, NODES2) == 11.25
    twice = _scaled(NODES2, 2.0)
    again = finish_plan(lengths, 4, "atp", list(plan.segments), plan.gathered_docs, twice, "all_to_all", route=2)
    assert _block_at(plan, twice) == again.block_time_s == 17.25

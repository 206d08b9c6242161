"""Tests that kill mutmut's mutants of ``atac_hf/sharding/subgroups.py`` the suite let through (issue 20,
docs/TESTING.md, fourteenth pass: the 18 the thirteenth pass told apart from the clean code without a
test). Each docstring names its mutants (mutmut 3.8.1's numbers in their function) and works the case by
hand. Models whose seconds are exact (``tile=1``, whole-second prices); the helpers' inputs are binary
fractions, so that no float rounding decides a tie.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding.subgroups import _nest, _pieces, _place_tails, plan_subgroups

# attention pairs at 1 s each, no token-wise price; one K/V byte a token over an 8 byte/s link
PAIRS = CostModel(linear_s_per_token=0.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=8.0,
                  link_latency_s=0.0)
# tokens and pairs at 1 s each, K/V 1 byte a token over a 64 byte/s link
FAST = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=64.0,
                 link_latency_s=0.0)
# tokens and pairs at 1 s each; nodes of 2 ranks, K/V 1 byte a token at 1 byte/s between nodes, 8 inside one
NODES2 = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=1.0,
                   link_latency_s=0.0, node_size=2, intra_node_bandwidth=8.0)


def _seg(plan):
    return [np.asarray(s).tolist() for s in plan.segments]


# ---------------------------------------------------------------------------- _layouts


def test_a_document_under_four_min_chunks_takes_no_room_on_the_slot_line():
    """``[9, 3]`` on 3 ranks under FAST with ``min_chunk=2``, ``anchor_share=0.25``: the documents cost
    9 + 45 = 54 s and 3 + 6 = 9 s, a rank's share 21 s; both cost over 0.25 x 21 s, but an anchor is
    also "long enough to cut (>= 4 * min_chunk tokens)": document 1 (3 tokens) is not one. Document 0
    alone is stretched over the 3 slots: 3 tokens a rank, each piece under 2 x min_chunk = 4, merged
    into one piece on one rank. No anchor lands on a proper sub-group: no plan (``plan_atp`` keeps its
    flat plans). Kills ``_layouts``' length test as ``L >= 4 / min_chunk`` (mutant 41: 2 tokens are
    enough): document 1 then takes 9 / 63 x 3 of the line, document 0 covers ranks 0-1 (4 + 5 tokens)
    and the mutant returns a plan (28.125 s) built around an anchor the rule excludes."""
    assert plan_subgroups(np.array([9, 3]), 3, FAST, anchor_share=0.25, min_chunk=2) is None


def test_without_two_way_tails_go_to_the_chain_rank_of_least_estimated_cost():
    """``[4, 2, 2]`` on 3 ranks under PAIRS, ``two_way=False``. Costs 10, 3, 3 pairs (16, 16/3 a rank):
    document 0 is the anchor, 2 + 2 tokens on ranks 0 and 2 (rank 1's single token merged into rank
    2); the chain is ranks 0-2. Without ``two_way`` the tails go, inside the chain, to the rank of
    least estimated cost (module docstring, step 3): document 1 to rank 1 (0 against 0.9375 rank
    shares), document 2 too (0.5625 against 0.9375). The cost re-split levels document 0 over the
    room left, 5 and 5 pairs: rows 0 and 3 on rank 0, rows 1-2 on rank 2. Compute 5, 6, 5 s; the
    all-to-all (2 keys, 0.5 s) is exposed on ranks 0 and 2 only: 6 s. Kills ``shape`` built whatever
    ``two_way`` (``_layouts`` mutant 137): tails then go by tokens and pairs, document 2 to rank 0
    (1.5 rank shares on ranks 0, 1 and 2 alike, the lower rank), and the cost re-split ends at 8 s
    (rank 1: rows 0 and 3 and document 1)."""
    plan = plan_subgroups(np.array([4, 2, 2]), 3, PAIRS, two_way=False)
    assert _seg(plan) == [[[0, 0, 1], [0, 3, 4]], [[1, 0, 2], [2, 0, 2]], [[0, 1, 3]]]
    assert plan.rank_compute_s.tolist() == [5.0, 6.0, 5.0]
    assert plan.block_time_s == 6.0


def test_without_two_way_tails_go_to_the_bin_of_least_estimated_load():
    """``[3, 7, 2, 2]`` on 3 ranks under NODES2 (nodes: ranks 0-1 and rank 2), ``two_way=False``. Costs
    9, 35, 5, 5 s (54, 18 a rank): document 1 is the anchor, laid in node 0 (4 + 3 tokens on ranks 0
    and 1, one chain); rank 2 is a bin alone. Tails go to the bin whose load per rank stays lowest "in
    the estimate only" without ``two_way`` (module docstring, step 3): document 0 to rank 2 (9 / 18
    against the chain's 44 / 36), then document 2 (14 / 18 against 40 / 36) and document 3 (19 / 18
    against 40 / 36) too. Rank 0 holds rows 0-1 and 5-6 (4 + 16 = 20 s), rank 1 rows 2-4 (3 + 12 =
    15 s), rank 2 the tails (19 s); the all-to-all in node 0 (3 keys at 8 bytes/s, 0.75 s) is exposed
    on rank 0: 20.75 s. Kills the costs at 0.5x and 2x attention built whatever ``two_way``
    (``_layouts`` mutant 113): by the worst of three models rank 2 with document 3 reads 13 x 3 / 34
    = 1.147 at 0.5x, over the chain's worst, 71 x 3 / 188 = 1.133 at 2x, so document 3 goes to rank 1
    (the same 20.75 s here, but not the placement the estimate asks for)."""
    plan = plan_subgroups(np.array([3, 7, 2, 2]), 3, NODES2, two_way=False)
    assert _seg(plan) == [[[1, 0, 2], [1, 5, 7]], [[1, 2, 5]], [[0, 0, 3], [2, 0, 2], [3, 0, 2]]]
    assert plan.rank_compute_s.tolist() == [20.0, 15.0, 19.0]
    assert plan.block_time_s == 20.75


def test_two_way_tails_are_placed_by_the_2x_attention_price():
    """``[2, 11, 7, 2]`` on 3 ranks under NODES2 (nodes: ranks 0-1 and rank 2), ``two_way`` on: tails go
    to the bin whose worst load per rank over three models, attention at 1x, 0.5x and 2x the
    estimate, stays lowest. Costs 5, 77, 35, 5 s at 1x (122 in all), 3.5, 44, 21, 3.5 at 0.5x (72),
    8, 143, 63, 8 at 2x (222), rank shares 3 x cost / total. Document 1 is the anchor of node 0
    (chain of ranks 0-1); document 2 goes to rank 2. Document 0: the chain would read (143 + 8) x 3
    / 444 = 1.0203 a rank at 2x, its worst; rank 2 (24.5 x 3 / 72 = 1.0208 at 0.5x) is worse: the
    chain, rank 1. Document 3 then goes to rank 2. Ranks compute 42, 40, 40 s, the all-to-all in node
    0 (5 keys, 1.25 s) is exposed on rank 0: 43.25 s. Kills the third model priced at 3x attention
    (``_layouts`` mutant 127, ``(0.5, 3.0)``): the chain reads 220 x 3 / 644 = 1.0248 for document 0,
    which goes to rank 2, and document 3 to rank 1 (the same 43.25 s, not the documented placement)."""
    plan = plan_subgroups(np.array([2, 11, 7, 2]), 3, NODES2)
    assert _seg(plan) == [[[1, 0, 3], [1, 8, 11]], [[0, 0, 2], [1, 3, 8]], [[2, 0, 7], [3, 0, 2]]]
    assert plan.rank_compute_s.tolist() == [42.0, 40.0, 40.0]
    assert plan.block_time_s == 43.25


# ---------------------------------------------------------------------------- _resplit


def test_without_two_way_only_the_cost_level_re_split_is_laid():
    """``[5, 1]`` on 3 ranks under FAST, ``two_way=False`` ("False: in estimated cost only"). Costs
    20 s and 2 s; document 0 is the anchor (2 + 3 tokens on ranks 0 and 1), document 1 goes whole to
    rank 2. The cost-level re-split: rank 1 (3 tokens) outermost, rows 0-1 and 4 (3 + 1 + 2 + 5 =
    11 s), rank 0 rows 2-3 (2 + 3 + 4 = 9 s); the all-to-all sends rank 1 keys 2-3 and rank 0 keys
    0-1: 2 x 2 / 64 = 0.0625 s, exposed on rank 1: 11.0625 s. The two-way re-split (2 and 3 tokens by
    the token line, rank 1's head set to bring its pairs nearest 16 / 3) gives rank 1 rows 0-2 (9 s)
    and rank 0 rows 3-4 (11 s), its slowest rank no slower, so it would be taken; its all-to-all
    moves 3 keys (0.09375 s): 11.09375 s. Kills ``_resplit``'s modes taken as ``("two_way", "cost")``
    whatever ``two_way`` (mutant 40) and the cost mode's name misspelt where ``two_way`` is False (45
    ``"XXcostXX"``, 46 ``"COST"``: any name but ``"cost"`` runs the two-way re-split in
    ``_split_chains``)."""
    plan = plan_subgroups(np.array([5, 1]), 3, FAST, two_way=False)
    assert _seg(plan) == [[[0, 2, 4]], [[0, 0, 2], [0, 4, 5]], [[1, 0, 1]]]
    assert plan.rank_compute_s.tolist() == [9.0, 11.0, 2.0]
    assert plan.comm_s == 0.0625
    assert plan.block_time_s == 11.0625


def test_a_two_way_re_split_over_the_cap_leaves_the_cost_level_one_to_try():
    """``[2, 6, 2]`` on 4 ranks under FAST, at most 3 tokens a rank (costs 5, 27, 5 s). Document 1 is
    the anchor, 2 + 2 + 2 tokens on ranks 0, 1 and 3 (one chain of all 4 ranks); under the cap the
    tails do not fit (rank 2 takes document 0, then every rank holds 2 tokens), so the uncapped
    placement is tried: document 0 to rank 2, document 2 to rank 0. Its two-way re-split levels
    tokens at 2.5 a rank: rooms 0.5, 2.5, 0.5, 2.5, 1 + 3 + 2 tokens, rank 0's 1 merged into rank 1:
    4 tokens, over the cap, refused. The cost-level re-split fits: rank 1 rows 0-1 and 5 of document
    1 (3 + 1 + 2 + 6 = 12 s), rank 3 rows 2-4 (3 + 3 + 4 + 5 = 15 s), the whole documents 5 s each;
    the all-to-all sends rank 1 keys 2-4 (2 x 3 / 64 = 0.09375 s), exposed on rank 3: 15.09375 s.
    Kills ``_resplit``'s ``continue`` past a refused layout turned into ``break`` (mutant 116: the
    cost-level re-split is never laid, no plan)."""
    plan = plan_subgroups(np.array([2, 6, 2]), 4, FAST, max_tokens_per_rank=3)
    assert _seg(plan) == [[[2, 0, 2]], [[1, 0, 2], [1, 5, 6]], [[0, 0, 2]], [[1, 2, 5]]]
    assert plan.rank_compute_s.tolist() == [5.0, 12.0, 5.0, 15.0]
    assert plan.block_time_s == 15.09375


# ---------------------------------------------------------------------------- _pieces


def test_pieces_under_two_min_chunks_are_merged():
    """An anchor's share on a rank is at least ``2 * min_chunk`` tokens (``plan_subgroups``' ``min_chunk``).
    5 tokens over 2 slots: 3 + 2 (the remainder to the lower rank); with ``min_chunk=2`` the 2 is
    under 4 and merges into its neighbour: one piece of 5. 10 tokens over 3 slots: 4 + 3 + 3; the
    first 3 (rank 1) merges into its smaller neighbour, rank 2 (6): 4 + 6, both at least 4. Kills
    ``_pieces``' test as ``sizes[i] >= 2 / min_chunk`` (mutant 128: pieces of 1 token and more kept;
    in a plan, ``[10, 1]`` at cp 3 under FAST with ``min_chunk=2`` then splits document 0 over all 3
    ranks, no proper sub-group, and ``plan_subgroups`` returns None where the shipped code splits it
    over ranks 0 and 2)."""
    assert _pieces((0.0, 2.0), [0.0, 1.0, 2.0], 5, 2) == [(0, 5)]
    assert _pieces((0.0, 3.0), [0.0, 1.0, 2.0, 3.0], 10, 2) == [(0, 4), (2, 6)]
    assert _pieces((0.0, 3.0), [0.0, 1.0, 2.0, 3.0], 10, 1) == [(0, 4), (1, 3), (2, 3)]
    assert plan_subgroups(np.array([10, 1]), 3, FAST, min_chunk=2) is not None


# ---------------------------------------------------------------------------- _split_chains


def test_the_corrected_rooms_are_rescaled_to_the_anchors_cost():
    """``[1, 2, 3, 4]`` on 4 ranks under PAIRS (1, 3, 6, 10 pairs; 5 a rank). Document 3 is the anchor
    (2 + 2 tokens on ranks 1 and 3 of one chain), the tails go whole: document 2 to rank 0, 1 to rank
    2, 0 to rank 1 (held: 6, 1, 3, 0). The cost re-split's first lay levels 10 over those: rooms 0,
    11/3, 5/3, 14/3, document 3 on ranks 2 and 3 (rows 0 and 3: 5, rows 1-2: 5), slowest 8. Its
    rooms corrected by how far each rank missed the mean (5) are 0 (clipped from -1), 23/3, 0
    (clipped), 14/3: 37/3 in all, rescaled to 10 (``rooms *= 10 / (37/3)``): 6.22 and 3.78, 2 + 2
    tokens on ranks 1 and 3: compute 6, 6, 3, 5, slowest 6, kept; the two-way re-split (7) is over
    2% slower. The all-to-all (2 keys, 0.5 s) hides under rank 1's local document 0 (1 s) and is
    exposed on rank 3 (5.5 s): 6 s. Kills the rescale as ``rooms /=``
    (``_split_chains`` mutant 108): rooms summing to 15.2 on a line the anchor covers to 10 put all 4
    tokens on rank 1 (11 s), the first lay's 8 s is kept, and the two-way plan (7 s, within 2%)
    wins: 7.5 s."""
    plan = plan_subgroups(np.array([1, 2, 3, 4]), 4, PAIRS)
    assert _seg(plan) == [[[2, 0, 3]], [[0, 0, 1], [3, 0, 1], [3, 3, 4]], [[1, 0, 2]], [[3, 1, 3]]]
    assert plan.rank_compute_s.tolist() == [6.0, 6.0, 3.0, 5.0]
    assert plan.block_time_s == 6.0


def test_the_cost_re_split_lays_every_chain():
    """``[4, 4]`` on 4 ranks under NODES2 (nodes of 2 ranks), ``two_way=False``. Each document costs
    4 + 10 = 14 s (7 a rank): both are anchors of 2 slots, one per node, so there are two chains,
    ranks 0-1 and 2-3. The cost re-split lays each: rows 0 and 3 on the first rank (2 + 1 + 4 = 7 s),
    rows 1-2 on the second (2 + 2 + 3 = 7 s); each all-to-all stays in its node (2 keys at 8 bytes/s,
    0.5 s, exposed): 7.5 s. Kills the chain loop's ``continue`` after a cost-level chain turned into
    ``break`` (``_split_chains`` mutant 116): ranks 2 and 3 get no token, the layout is refused and
    there is no plan."""
    plan = plan_subgroups(np.array([4, 4]), 4, NODES2, two_way=False)
    assert _seg(plan) == [[[0, 0, 1], [0, 3, 4]], [[0, 1, 3]], [[1, 0, 1], [1, 3, 4]], [[1, 1, 3]]]
    assert plan.rank_compute_s.tolist() == [7.0, 7.0, 7.0, 7.0]
    assert plan.block_time_s == 7.5


# ---------------------------------------------------------------------------- _nest


def test_nest_keeps_a_tail_of_min_chunk_tokens():
    """One 10-token document, 5 tokens to rank 0 (outermost) and 5 to rank 1, rank 0's target 20 pairs,
    ``min_chunk=2``. With a head of h tokens rank 0 holds rows [0, h) and [5 + h, 10): 40 - 5 h pairs;
    20 asks h = 4, a tail of 1 token, under ``min_chunk``: "heads and tails kept at min_chunk tokens
    or more where they exist", so h is clipped to 5 - 2 = 3: rows 0-2 and 8-9 (6 + 19 = 25 pairs),
    rank 1 rows 3-7 (30). Kills the sliver test's tail half as ``1 < k - h`` (mutant 103) or
    ``0 < k + h`` (105) and the clip's upper end as None (111) or ``k + min_chunk`` (115): each keeps
    h = 4, a 1-token tail [9, 10) (20 and 35 pairs). In a plan: ``[10, 3]`` at cp 3 under PAIRS with
    ``min_chunk=2`` computes 6, 25, 30 s (31.25 s with its all-to-all), the mutants 6, 20, 35 s
    (36.25 s)."""
    segs: list = [[], []]
    got = _nest(0, 10, [(0, 5), (1, 5)], segs, np.array([20.0, 35.0]), 2)
    assert segs == [[(0, 0, 3), (0, 8, 10)], [(0, 3, 8)]]
    assert got.tolist() == [25.0, 30.0]
    plan = plan_subgroups(np.array([10, 3]), 3, PAIRS, min_chunk=2)
    assert _seg(plan) == [[[1, 0, 3]], [[0, 0, 3], [0, 8, 10]], [[0, 3, 8]]]
    assert plan.block_time_s == 31.25


# ---------------------------------------------------------------------------- _place_tails


def _tails(tails, unit, L, planned, C=2, cap=np.inf):
    """``_place_tails`` with every rank in one chain (no ``shape``: tails inside go by estimated cost)."""
    got = _place_tails(np.array(tails), np.array(unit, dtype=np.float64), np.array(L), planned, [(0, C - 1, planned)],
                       C, cap)
    return None if got is None else got.tolist()


def test_place_tails_adds_up_the_anchors_cost_on_a_rank():
    """Two anchors share ranks 0 and 1: document 0 (1.0 rank share) split 3 + 1 tokens, document 1
    (0.25) split 1 + 3. Rank 0 holds 0.75 + 0.0625 = 0.8125, rank 1 0.25 + 0.1875 = 0.4375: the tail
    (document 2) goes to rank 1, the least estimated cost. Kills the anchors' cost on a rank
    assigned, not added (``cost[r] =``, ``_place_tails`` mutant 59): the last anchor's alone reads
    0.0625 against 0.1875, rank 0."""
    assert _tails([2], [[1.0, 0.25, 0.5]], [4, 4, 1], [(0, [(0, 3), (1, 1)]), (1, [(0, 1), (1, 3)])]) == [1]


def test_place_tails_adds_up_the_tails_cost_on_a_rank():
    """Document 0 (2.0 rank shares) split 2 + 2: ranks 0 and 1 hold 1.0 each. Tail 1 (0.5) goes to rank
    0 (a tie: the lower rank), which then holds 1.5; tail 2 (0.25) to rank 1 (1.0). Kills a placed
    tail's cost assigned, not added (``cost[r] = w[0]``, mutant 179): rank 0 reads 0.5 and takes tail
    2 as well."""
    assert _tails([1, 2], [[2.0, 0.5, 0.25]], [4, 1, 1], [(0, [(0, 2), (1, 2)])]) == [0, 1]


def test_place_tails_keeps_every_rank_within_the_cap():
    """Cap 4 tokens a rank. Document 0 (1.0 rank share) split 1 + 3 tokens: rank 0 holds 1 token and
    0.25, rank 1 3 tokens and 0.75. Tail 1 (3 tokens, 0.25) fits on rank 0 only (1 + 3 = 4; rank 1:
    6): rank 0, now at 4 tokens and 0.5. Tail 2 (1 token, 0.125): rank 0 is full, rank 1 has room
    (3 + 1): rank 1, though rank 0 costs less. Both ranks end at the cap. Kills the room test dropped
    (``_place_tails`` mutant 140), read as ``toks[q] - n <= cap`` (142), and a placed tail's tokens
    assigned (``toks[r] = n``, 182: rank 0 reads 3) or subtracted (``toks[r] -= n``, 183: rank 0
    reads -2): each puts tail 2 on rank 0, 5 tokens over the cap."""
    assert _tails([1, 2], [[1.0, 0.25, 0.125]], [4, 3, 1], [(0, [(0, 1), (1, 3)])], cap=4) == [0, 1]


def test_place_tails_ties_between_bins_go_to_the_lower_bin():
    """Ranks 0 and 1 form a chain holding document 0 (1.0 rank share, 2 + 2 tokens); rank 2 is a bin
    alone. The tail (1.0) would load the chain (1.0 + 1.0) / 2 = 1.0 a rank and rank 2 1.0: a tie,
    "ties to the lower bin": the chain, and in it rank 0 (0.5 against 0.5, the lower rank). Kills the
    one-model loop's bin test as ``v <= best`` (``_place_tails`` mutant 135: the last of equal bins,
    rank 2; in a plan, ``[1, 5, 3]`` at cp 3 under NODES2 with ``two_way=False`` puts document 0 on
    rank 2 instead of rank 1, the same 11.5 s)."""
    planned = [(0, [(0, 2), (1, 2)])]
    got = _place_tails(np.array([1]), np.array([[1.0, 1.0]]), np.array([4, 1]), planned, [(0, 1, planned)], 3, np.inf)
    assert got.tolist() == [0]


def test_a_forced_all_gather_holds_for_the_sub_group_candidate():
    """``plan_atp(..., kv_exchange="all_gather")`` costs every candidate with the all-gather ("so a
    plan for a given exchange is chosen for it"). ``[10, 20, 30]`` on 4 ranks under PAIRS: the 0.25
    share's sub-group plan wins again (document 2 over ranks 0-2, document 1 over ranks 2-3, compute
    186, 186, 177, 181 s), now with the all-gather of documents 1 and 2: 50 tokens, 2 x (50 x 3 / 4)
    / 8 = 9.375 s, exposed on rank 0: 195.375 s. Kills ``_plan_subgroups`` passing None for its
    ``exchange`` to ``finish_flat`` (mutant 44 of the current file: ``finish_flat`` reads None as
    "auto" and the plan comes back with the all-to-all, 191 s, the exchange the caller ruled out)."""
    from atac_hf.sharding.atp import plan_atp

    plan = plan_atp(np.array([10, 20, 30]), 4, PAIRS, kv_exchange="all_gather")
    assert _seg(plan) == [[[2, 0, 6], [2, 24, 30]], [[2, 6, 12], [2, 18, 24]], [[1, 6, 14], [2, 12, 18]],
                          [[0, 0, 10], [1, 0, 6], [1, 14, 20]]]
    assert plan.kv_exchange == "all_gather"
    assert plan.comm_s == 9.375
    assert plan.block_time_s == 195.375


def test_place_tails_worst_of_three_adds_each_models_own_work():
    """Three models (rank shares at 1x, 0.5x and 2x attention): ranks 0 and 1 form a chain holding
    document 0 (1.25, 1.625, 1.0: token-heavy, its share falls as attention costs more) split 2 + 2;
    rank 2 is a bin alone. The tail (1.0, 0.75, 1.25: attention-heavy) would load the chain, per
    model, (1.25 + 1.0, 1.625 + 0.75, 1.0 + 1.25) / 2 = 1.125, 1.1875, 1.125 a rank, worst 1.1875,
    and rank 2 1.0, 0.75, 1.25, worst 1.25: the chain, rank 0 (0.625 against 0.625, the lower rank).
    Kills the three-model loop's first load read from the second model (``lb[1] + w0``,
    ``_place_tails`` mutant 111): the chain reads (1.625 + 1.0) / 2 = 1.3125, over 1.25, and the tail
    goes to rank 2. (Not found in plans: the 1x load of a set lies between its 0.5x and 2x loads, and
    packs where 0.5x's bin load plus 1x's tail work decides a bin are rare.)"""
    planned = [(0, [(0, 2), (1, 2)])]
    unit = np.array([[1.25, 1.0], [1.625, 0.75], [1.0, 1.25]])
    got = _place_tails(np.array([1]), unit, np.array([4, 1]), planned, [(0, 1, planned)], 3, np.inf)
    assert got.tolist() == [0]

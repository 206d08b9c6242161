"""Seventeenth mutation pass: tests that kill the survivors of mutmut over packing/planners/wfap_place.py

Each test names the mutants it kills (mutmut 3 names, ``atac_hf.packing.planners.wfap_place.<name>``)
and the hand-checked case on which the mutant gives another answer. The functions are called
directly, with the arguments ``wfap._place`` passes: per item its token count ``L`` and ``K`` costs
``c``; per pack its ``K`` costs ``pc``, token count ``pt``, tails ``tail_of`` and anchors ``anchor_of``;
``C`` the cap in tokens.
"""

from __future__ import annotations

import math

import numpy as np

from atac_hf.packing.planners.wfap_place import fill_level, local_search, place_tails

# ---------------------------------------------------------------------------------------------
# fill_level


# x_fill_level__mutmut_12 (`ct < light / 8`) and x_fill_level__mutmut_14 (`light / 9`): a tail
# that costs exactly 1/8 of a light pack (or between 1/9 and 1/8) is still small. Tails of 1 token
# costing 1 s and 4 s, light pack 8 s (1/8 = 1 s): only the 1 s tail is small, so the level is
# 1 s a token x 10 tokens (tolerance 1: no margin) = 10 s. With `<` no tail is small, so all count:
# 5 s / 2 tokens x 10 = 25 s. Then light 72 s (1/8 = 9 s, 1/9 = 8 s) and an 8.5 s tail: small for
# 1/8 (85 s), not for 1/9 (all count again: 48.5 / 2 x 10 = 242.5 s).

def test_fill_level_small_tails_are_those_of_at_most_an_eighth_of_a_light_pack():
    lens = np.array([1, 1])
    assert fill_level([0, 1], lens, np.array([[1.0], [4.0]]), np.array([8.0]), 10, 1.0) == 10.0
    assert fill_level([0, 1], lens, np.array([[8.5], [40.0]]), np.array([72.0]), 10, 1.0) == 85.0


# x_fill_level__mutmut_26 (`if tok or True`: 0 s / 0 tokens, a ZeroDivisionError) and
# x_fill_level__mutmut_29 (`else 1.0`: a level of 1 s a token, 10.25 s here): small tails of no
# tokens at all give the level 0 (the function's own guard for ``tok == 0``; the planner skips
# zero-length samples, so only a direct call reaches it).

def test_fill_level_of_tails_without_tokens_is_zero():
    assert fill_level([0], np.array([0]), np.array([[0.0]]), np.array([8.0]), 10, 1.05) == 0.0


# ---------------------------------------------------------------------------------------------
# place_tails


# x_place_tails__mutmut_11 (`one = len(pc[0]) == 1 if P or True`) and x_place_tails__mutmut_17
# (the same for `two`): with no packs at all ``pc[0]`` is an IndexError. The function guards
# ``P == 0`` itself (`if P else ...`): every tail is left over and nothing else changes. (The
# planner always has packs_per_window >= 1, so only a direct call reaches it.)

def test_place_tails_without_packs_leaves_every_tail():
    pc, pt, tail_of = [], [], []
    assert place_tails([0, 1], [2, 1], [[1.0], [1.0]], [False, True], pc, pt, tail_of, 5, math.inf) == [0, 1]
    assert pc == [] and pt == [] and tail_of == []


# ---------------------------------------------------------------------------------------------
# local_search


# x_local_search__mutmut_7 (default budget `3 * P` steps instead of `2 * P`). 2 packs, cap 10,
# pack 1 ten 1-token tails of 1 s, pack 0 empty: each step moves one tail (the first of equal
# ones) from pack 1 to pack 0, 10/0 -> 9/1 -> ... The documented budget, 2 x 2 = 4 steps, ends at
# 6 s / 4 s; with 6 steps the mutant goes on to 5 s / 5 s. (The eighth pass's
# test_local_search_takes_up_to_two_steps_a_pack kills `P` steps; this one a larger budget.)

def test_local_search_stops_after_two_steps_a_pack():
    L, c = [1] * 10, [[1.0]] * 10
    tail_of, anchor_of = [[], list(range(10))], [[], []]
    pc, pt = [[0.0], [10.0]], [0, 10]
    local_search(pc, pt, tail_of, anchor_of, L, c, 10)
    assert tail_of == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert pc == [[4.0], [6.0]] and pt == [4, 6]


# x_local_search__mutmut_29 (`gap < 1e-12 * sc[p]` instead of `<=`): a gap of exactly 1e-12 of
# the top score counts as balanced and the search stops. Pack 0 an anchor of 1e12 - 1 s; pack 1
# an anchor of 1e12 - 0.5 s and a 0.5 s tail (1e12 s): the gap, 1 s, is exactly 1e-12 x 1e12 (the
# product is exactly 1.0 in floats), so nothing moves. The mutant moves the tail (both packs
# 1e12 - 0.5 s).

def test_local_search_stops_at_a_gap_of_1e_12_of_the_top_score():
    L, c = [1, 1, 1], [[1e12 - 1], [1e12 - 0.5], [0.5]]
    tail_of, anchor_of = [[], [2]], [[0], [1]]
    pc, pt = [[1e12 - 1], [1e12]], [1, 2]
    local_search(pc, pt, tail_of, anchor_of, L, c, 10)
    assert tail_of == [[], [2]] and pc == [[1e12 - 1], [1e12]] and pt == [1, 2]


# x_local_search__mutmut_36 (`1e-12 * max(sc[p], 1.0)`): the balance test is relative to the top
# score at any scale, not an absolute 1e-12 s once scores are under 1 s. Pack 1 two tails of
# 2e-13 s, pack 0 empty: the gap 4e-13 s is far above 1e-12 x 4e-13, so one tail moves (2e-13 s
# each); the mutant sees 4e-13 < 1e-12 and stops.

def test_local_search_balance_test_is_relative_for_tiny_scores():
    L, c = [1, 1], [[2e-13], [2e-13]]
    tail_of, anchor_of = [[], [0, 1]], [[], []]
    pc, pt = [[0.0], [4e-13]], [0, 2]
    local_search(pc, pt, tail_of, anchor_of, L, c, 10)
    assert tail_of == [[0], [1]] and pc == [[2e-13], [2e-13]] and pt == [1, 1]


# x_local_search__mutmut_56 (`ok[:] = True`: a pack's last item may move): a pack is never
# emptied. K = 2; pack 0 two tails of (0.7, 0.9) and (0.9, 0.7) s (1.6, 1.6), packs 1 and 2 empty.
# Step 1 moves the first tail to pack 1; pack 0 keeps (1.6 - 0.7, 1.6 - 0.9) = (0.9000000000000001,
# 0.7000000000000001) by float rounding, so it stays the busiest pack, a hair above its one tail
# (0.9, 0.7). Its one item may not move: the search stops. The mutant moves it to pack 2 (the
# residue, 1.1e-16 s, is below 0.9 s), leaving pack 0 empty.

def test_local_search_never_empties_a_pack():
    L, c = [1, 1], [[0.7, 0.9], [0.9, 0.7]]
    tail_of, anchor_of = [[0, 1], [], []], [[], [], []]
    pc, pt = [[0.7 + 0.9, 0.9 + 0.7], [0.0, 0.0], [0.0, 0.0]], [2, 0, 0]
    local_search(pc, pt, tail_of, anchor_of, L, c, 10)
    assert tail_of == [[1], [0], []] and pt == [1, 1, 0]
    assert pc[1] == [0.7, 0.9] and pc[2] == [0.0, 0.0]


# x_local_search__mutmut_62 (`(pcp - cp).max(axis=None)`: what pack p keeps is read as the most it
# keeps after any one move, not after this move). One step (max_steps=1), 2 packs, cost =
# tokens: pack 1 a 1 s anchor and tails of 1 s and 4 s (6 s), pack 0 empty. Moving the 4 s tail
# gives 2 / 4 (max 4 s), the 1 s tail 5 / 1 (max 5 s): the 4 s tail moves. The mutant reads both
# moves as max(5, .) = 5 s and takes the first, the 1 s tail.

def test_local_search_move_reads_what_the_pack_keeps_after_that_move():
    L, c = [1, 1, 4], [[1.0], [1.0], [4.0]]
    tail_of, anchor_of = [[], [1, 2]], [[], [0]]
    pc, pt = [[0.0], [6.0]], [0, 6]
    local_search(pc, pt, tail_of, anchor_of, L, c, 10, max_steps=1)
    assert tail_of == [[2], [1]] and pc == [[4.0], [2.0]] and pt == [4, 2]


# x_local_search__mutmut_103 (`pt[p] - dl < C`): a swap may fill pack p exactly to the cap. One
# step, cap 10; pack 0 a 6-token 5 s anchor and a 1-token 5 s tail (10 s, 7 tokens); pack 1 a
# 1-token 3 s anchor and a 4-token 1 s tail (4 s, 5 tokens). Moving the 5 s tail gives 5 / 9 s;
# swapping it with the 1 s tail gives 6 / 8 s with pack 0 at 7 - 1 + 4 = 10 tokens, the cap: the
# swap. The mutant refuses a full pack 0 and moves the tail (5 / 9 s).

def test_local_search_swap_may_fill_the_busiest_pack_to_the_cap():
    L, c = [6, 1, 1, 4], [[5.0], [5.0], [3.0], [1.0]]
    tail_of, anchor_of = [[1], [3]], [[0], [2]]
    pc, pt = [[10.0], [4.0]], [7, 5]
    local_search(pc, pt, tail_of, anchor_of, L, c, 10, max_steps=1)
    assert tail_of == [[3], [1]] and pc == [[6.0], [8.0]] and pt == [10, 2]

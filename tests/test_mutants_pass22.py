"""Mutation-testing pass 22: ``routed_pair_counts`` (atac_hf.sharding.routing).

The priced counts of the node-routed all-to-all were compared with the runtime tables
(tests/test_routed_exchange.py) with ``np.array_equal``, which ignores the dtype: a float64
result passed. The docstring promises (C, C) int64 arrays, on every return path.
"""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf.sharding import ShardPlan
from atac_hf.sharding.exchange import a2a_pair_counts
from atac_hf.sharding.routing import routed_pair_counts, routed_tables

# doc 0 (12 tokens) in four 3-token chunks on ranks 0..3; nodes {0, 1} and {2, 3}
QUARTERS = [np.array([[0, 0, 3]]), np.array([[0, 3, 6]]), np.array([[0, 6, 9]]), np.array([[0, 9, 12]])]


def test_a_hand_worked_routed_exchange_is_priced_exactly_in_int64():
    """Kills 4, 6 (``first`` allocated as float64: ``dtype=None`` / no dtype) and 9, 11 (the same
    for ``second``): the counts are priced row counts, and the docstring promises int64 (a float
    result compared equal to the runtime's int64 tables, so nothing caught it).

    Worked by hand (no window; rank r needs the prefix below its chunk's end): inside node {0, 1}
    rank 0 sends rank 1 its 3 rows directly, inside node {2, 3} rank 2 sends rank 3 its 3 rows.
    Into node {2, 3}, source 0's union is its 3 rows, cut 1 + 2: part 0 to rank (0 + 0) % 2 = 2,
    part 1 to rank 3; source 1's union is cut the same, part 0 to rank (0 + 1) % 2 = 3, part 1 to
    rank 2. In the second phase ranks 2 and 3 forward each other the 3 rows they proxied (each
    needs all of both sources' rows). Rank 2 then holds 6 rows, rank 3 holds 9: what they need.
    """
    g = np.ones(1, dtype=bool)
    first, second = routed_pair_counts(QUARTERS, g, None, 2)
    assert first.dtype == np.int64 and second.dtype == np.int64
    assert first.shape == second.shape == (4, 4)
    assert first.tolist() == [[0, 3, 1, 2], [0, 0, 2, 1], [0, 0, 0, 3], [0, 0, 0, 0]]
    assert second.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 3], [0, 0, 3, 0]]
    # the runtime's tables move exactly these rows
    for r in range(4):
        t = routed_tables(QUARTERS, g, None, 2, r)
        assert t["send1_counts"].tolist() == first[r].tolist() and t["recv1_counts"].tolist() == first[:, r].tolist()
        assert t["send2_counts"].tolist() == second[r].tolist() and t["recv2_counts"].tolist() == second[:, r].tolist()
    plan = ShardPlan(doc_lengths=np.array([12]), cp_size=4, strategy="x", segments=tuple(QUARTERS),
                     gathered_docs=np.array([0]), rank_compute_s=np.ones(4), kv_exchange="all_to_all",
                     kv_route_node=2)
    plan.validate()
    assert plan.kv_recv_tokens.tolist() == [0, 3, 6, 9]


@pytest.mark.parametrize("case", ["nothing gathered", "one rank", "no row to move", "one node's worth",
                                  "window"])
def test_routed_counts_are_int64_on_every_return_path(case):
    """Kills 4, 6, 9, 11 on each early return as well: the (C, C) int64 zeros where nothing is
    gathered or C = 1, where gathered documents need no other rank's rows, and where every row
    a rank needs comes from its own node (the second phase is then empty); and under a window."""
    g = np.ones(1, dtype=bool)
    if case == "nothing gathered":
        segs, g, node = QUARTERS, np.zeros(1, dtype=bool), 2
    elif case == "one rank":
        segs, node = [np.array([[0, 0, 12]])], 2
    elif case == "no row to move":  # a gathered document held whole by rank 0
        segs, node = [np.array([[0, 0, 12]]), np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64)], 2
    elif case == "one node's worth":  # doc 0 on ranks 0 and 1 only, node {0, 1}; rank 2 holds doc 1
        segs, node = [np.array([[0, 0, 6]]), np.array([[0, 6, 12]]), np.array([[1, 0, 4]])], 2
        g = np.array([True, False])
    else:
        segs, node = QUARTERS, 3
    C = len(segs)
    first, second = routed_pair_counts(segs, g, 2 if case == "window" else None, node)
    assert first.dtype == np.int64 and second.dtype == np.int64, case
    assert first.shape == second.shape == (C, C)
    if case == "one node's worth":
        assert first.tolist() == a2a_pair_counts(segs, g).tolist() == [[0, 6, 0], [0, 0, 0], [0, 0, 0]]
        assert not second.any()
    elif case == "window":
        # window 2, nodes {0, 1, 2} and {3}: rank r needs one row of rank r - 1 (its last), sent
        # directly inside the first node; into the one-rank node {3}, rank 3 is its own proxy
        assert first.tolist() == [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
        assert not second.any()
    else:
        assert not first.any() and not second.any()

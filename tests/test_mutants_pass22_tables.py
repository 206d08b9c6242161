"""Mutation-testing pass 22: ``routed_tables`` and ``_cuts`` (atac_hf.sharding.routing).

The runtime's tables of the node-routed all-to-all were checked against the priced counts with
``np.array_equal`` (which ignores the dtype) and replayed by an oracle that casts the counts to
int64 itself, so float64 count arrays passed; and ``_cuts`` was only seen through the parts it cuts,
so an extra trailing boundary passed. Both are pinned here on a hand-worked exchange.

Left alive, equivalent (outputs identical for every input): ``send1.sort(key=None)`` and
``send1_counts[r] = len(loc)`` -- each destination appears in ``send1`` at most once (its own node's
peers once each; a remote node's proxies are the keys of one dict, and nodes are disjoint), so
sorting the (destination, rows) pairs compares destinations only and ``=`` equals ``+=``.
"""

from __future__ import annotations

import numpy as np

from atac_hf.sharding import ShardPlan
from atac_hf.sharding.routing import _cuts, routed_tables

# doc 0 (12 tokens) in four 3-token chunks on ranks 0..3; nodes {0, 1} and {2, 3}
QUARTERS = [np.array([[0, 0, 3]]), np.array([[0, 3, 6]]), np.array([[0, 6, 9]]), np.array([[0, 9, 12]])]
G = np.ones(1, dtype=bool)
COUNTS = ("send1_counts", "recv1_counts", "send2_counts", "recv2_counts")

# Worked by hand (no window: rank r needs doc positions 0 .. 3r - 1).
# Rank 0 sends rank 1 (own node) its rows 0-2; into node {2, 3} its union is rows 0-2, cut 1 + 2:
# part 0 (row 0) to rank (0 + 0) % 2 -> 2, part 1 (rows 1, 2) to rank 3. Rank 1's union (its rows
# 0-2, doc positions 3-5) is cut the same, part 0 to rank (0 + 1) % 2 -> 3, part 1 to rank 2.
# Rank 2 sends rank 3 its rows 0-2 directly. In the second phase ranks 2 and 3 forward each other
# every row they proxied (each needs all of ranks 0 and 1), first source 0's rows, then source 1's.
EXPECTED = [
    dict(send1=[0, 1, 2, 0, 1, 2], send1_counts=[0, 3, 1, 2], recv1_counts=[0, 0, 0, 0], send2=[],
         send2_counts=[0, 0, 0, 0], recv2_counts=[0, 0, 0, 0], recv_docs=[], recv_pos=[]),
    dict(send1=[1, 2, 0], send1_counts=[0, 0, 2, 1], recv1_counts=[3, 0, 0, 0], send2=[],
         send2_counts=[0, 0, 0, 0], recv2_counts=[0, 0, 0, 0], recv_docs=[0] * 3, recv_pos=[0, 1, 2]),
    dict(send1=[0, 1, 2], send1_counts=[0, 0, 0, 3], recv1_counts=[1, 2, 0, 0], send2=[0, 1, 2],
         send2_counts=[0, 0, 0, 3], recv2_counts=[0, 0, 0, 3], recv_docs=[0] * 6, recv_pos=[0, 4, 5, 1, 2, 3]),
    dict(send1=[], send1_counts=[0, 0, 0, 0], recv1_counts=[2, 1, 3, 0], send2=[0, 1, 2],
         send2_counts=[0, 0, 3, 0], recv2_counts=[0, 0, 3, 0], recv_docs=[0] * 9,
         recv_pos=[1, 2, 3, 6, 7, 8, 0, 4, 5]),
]


def test_routed_tables_of_a_hand_worked_exchange_are_int64_row_counts():
    """Kills 99, 101 (``send1_counts`` allocated as float64: ``dtype=None`` / no dtype), 126, 128
    (the same for ``recv1_counts``), 156, 158 (``send2_counts``) and 180, 182 (``recv2_counts``).

    The values are unchanged by those mutants and the runtime ``int()``s every count, so the
    exchange still ran; but the tables are row counts, used as such (``np.repeat`` / ``np.split``
    by them reject float64), and the direct layout's counts are int64 (tests/test_mutants_sharding.py).
    """
    for r, want in enumerate(EXPECTED):
        t = routed_tables(QUARTERS, G, None, 2, r)
        assert sorted(t) == sorted(want)
        for k, v in want.items():
            assert t[k].dtype == np.int64, (r, k, t[k].dtype)
            assert t[k].tolist() == v, (r, k)
        # which rank each received row came from (first phase by source, second by proxy), and
        # each destination's slice of the send buffers
        src = np.concatenate([np.repeat(np.arange(4), t["recv1_counts"]), np.repeat(np.arange(4), t["recv2_counts"])])
        assert len(src) == len(t["recv_pos"])
        if r == 3:
            assert src.tolist() == [0, 0, 1, 2, 2, 2, 2, 2, 2]
        by_dest = np.split(t["send1"], np.cumsum(t["send1_counts"])[:-1])
        assert [len(x) for x in by_dest] == want["send1_counts"]
        if r == 0:
            assert [x.tolist() for x in by_dest] == [[], [0, 1, 2], [0], [1, 2]]


def test_routed_layouts_carry_int64_counts():
    """The same mutants, through the consumer: ``ShardPlan.local_layout`` hands the routed tables'
    counts to the runtime as ``send_counts`` / ``recv_counts`` / ``route[...]``; they are int64 like
    the direct exchange's, and ``num_key_rows`` is what the buffer holds."""
    plan = ShardPlan(doc_lengths=np.array([12]), cp_size=4, strategy="x", segments=tuple(QUARTERS),
                     gathered_docs=np.array([0]), rank_compute_s=np.ones(4), kv_exchange="all_to_all",
                     kv_route_node=2)
    plan.validate()
    for r in range(4):
        lay = plan.local_layout(r)
        assert lay.route is not None
        counts = dict(send1_counts=lay.send_counts, recv1_counts=lay.recv_counts,
                      send2_counts=lay.route["send2_counts"], recv2_counts=lay.route["recv2_counts"])
        for k, v in counts.items():
            assert v.dtype == np.int64, (r, k, v.dtype)
            assert v.tolist() == EXPECTED[r][k], (r, k)
        assert lay.num_key_rows == 3 * r + 3  # doc 0 up to its chunk's end: its own 3 rows, 3r received
        assert lay.num_key_rows == len(lay.self_index) + len(EXPECTED[r]["recv_pos"])


def test_cuts_are_the_k_plus_one_part_boundaries():
    """Kills ``_cuts`` 5 (``range(k + 2)``: a (k + 2)-th boundary past ``n``). ``routed_tables`` only
    reads the first k + 1, so the exchange is unchanged; the docstring promises ``(i * n) // k`` for
    i = 0..k: k consecutive parts covering ``[0, n)`` exactly, sizes within one of each other."""
    assert _cuts(3, 2) == [0, 1, 3]
    assert _cuts(7, 3) == [0, 2, 4, 7]
    assert _cuts(0, 3) == [0, 0, 0, 0]
    assert _cuts(5, 1) == [0, 5]
    for n in range(0, 20):
        for k in range(1, 7):
            c = _cuts(n, k)
            assert len(c) == k + 1 and c[0] == 0 and c[-1] == n
            sizes = np.diff(c)
            assert (sizes >= 0).all() and sizes.max() - sizes.min() <= 1

"""Red-team 19: WFAP's local search on packs of thousands of tiny samples.

It built an (m, n, K) array over every pair of tails of the costliest and the cheapest pack: 6 GiB and
22 s at a 128K cap with ~12.5K samples of 1-20 tokens per pack, a MemoryError at 256K; and each step
rescanned every pack's score in Python (O(P^2) per window). Now tails of equal (length, cost) are
tried once and scores are kept in an array. The oracle below is the search as it was (every tail, scores
rescanned): the moves must be the same.
"""

from __future__ import annotations

import copy
import tracemalloc

import numpy as np
import pytest

from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.packing.planners import wfap_place
from atac_hf.packing.planners.wfap_place import _move_tail, local_search


def _oracle(pc: list[list[float]], pt: list[int], tail_of: list[list[int]], anchor_of: list[list[int]],
            L: list[int], c: list[list[float]], C: int, max_steps: int | None = None) -> None:
    """local_search before red-team 19 (every tail tried, scores rescanned each step)."""
    P = len(pc)
    steps = max_steps if max_steps is not None else 2 * P
    for _ in range(steps):
        sc = [max(v) for v in pc]
        p = max(range(P), key=lambda j: (sc[j], -j))
        q = min(range(P), key=lambda j: (sc[j], j))
        gap = sc[p] - sc[q]
        if gap <= 1e-12 * max(sc[p], 1e-30) or not tail_of[p]:
            return
        pcp, pcq = np.asarray(pc[p]), np.asarray(pc[q])
        tp = np.asarray(tail_of[p])
        lp = np.asarray([L[i] for i in tail_of[p]])
        cp = np.asarray([c[i] for i in tail_of[p]])  # (m, K)
        best_val = sc[p]
        best = None
        # move a tail p -> q
        ok = pt[q] + lp <= C
        if len(tail_of[p]) + len(anchor_of[p]) < 2:
            ok[:] = False  # never empty a pack
        if ok.any():
            val = np.maximum((pcp[None, :] - cp).max(axis=1), (pcq[None, :] + cp).max(axis=1))
            val = np.where(ok & (val < sc[p]), val, np.inf)
            k = int(np.argmin(val))
            if val[k] < best_val:
                best_val, best = float(val[k]), ("move", int(tp[k]), -1)
        # swap a tail of p with a tail of q
        if tail_of[q]:
            tq = np.asarray(tail_of[q])
            lq = np.asarray([L[i] for i in tail_of[q]])
            cq = np.asarray([c[i] for i in tail_of[q]])
            d = cp[:, None, :] - cq[None, :, :]  # (m, n, K)
            dl = lp[:, None] - lq[None, :]
            ok2 = (pt[q] + dl <= C) & (pt[p] - dl <= C)
            if ok2.any():
                val = np.maximum((pcp - d).max(axis=2), (pcq + d).max(axis=2))
                val = np.where(ok2 & (val < sc[p]), val, np.inf)
                a, b = np.unravel_index(int(np.argmin(val)), val.shape)
                if val[a, b] < best_val:
                    best_val, best = float(val[a, b]), ("swap", int(tp[a]), int(tq[b]))
        if best is None:
            return
        kind, i, u = best
        _move_tail(i, p, q, tail_of, pc, pt, L, c)
        if kind == "swap":
            _move_tail(u, q, p, tail_of, pc, pt, L, c)


def _instance(seed: int, P: int, tails_per_pack: int, K: int, distinct: int, C: int):
    rng = np.random.default_rng(seed)
    n = P * tails_per_pack
    L = rng.integers(1, distinct + 1, n).tolist()
    base = [[float(x) * (1 + 0.25 * k) + 1e-3 * x * x for k in range(K)] for x in range(distinct + 2)]
    c = [list(base[x]) for x in L]
    order = rng.permutation(n).tolist()
    sizes = rng.multinomial(n, rng.dirichlet(np.ones(P) * 0.7)).tolist()
    tail_of, at = [], 0
    for s in sizes:
        tail_of.append(order[at:at + s])
        at += s
    anchor_of = [[] for _ in range(P)]
    pc = [[sum(c[i][k] for i in t) for k in range(K)] if t else [0.0] * K for t in tail_of]
    pt = [sum(L[i] for i in t) for t in tail_of]
    return pc, pt, tail_of, anchor_of, L, c, max(C, max(pt))


@pytest.mark.parametrize("seed", range(24))
def test_local_search_moves_as_the_full_search(seed):
    P = 2 + seed % 6
    per = (8, 40, 90, 150)[seed % 4]  # under and over the de-duplication threshold
    K = 1 + seed % 3
    args = _instance(seed, P, per, K, distinct=(3, 12, 40)[seed % 3], C=per * 30)
    mine, want = copy.deepcopy(args), copy.deepcopy(args)
    local_search(*mine)
    _oracle(*want)
    assert mine[2] == want[2] and mine[1] == want[1]
    assert np.array_equal(np.asarray(mine[0]), np.asarray(want[0]))


def test_many_tiny_samples_stay_small(monkeypatch):
    """~6K samples of 1-20 tokens per 64K pack: the swap arrays were (6K, 6K, K) floats (~1.5 GiB)."""
    rng = np.random.default_rng(0)
    L = rng.integers(1, 21, int(4 * 65536 / 10.5))
    calls = []
    real = wfap_place._distinct_tails
    monkeypatch.setattr(wfap_place, "_distinct_tails", lambda *a: calls.append(len(a[0])) or real(*a))
    tracemalloc.start()
    res = pack_lengths(L, PackingConfig(max_tokens=65536, packs_per_window=4))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert max(calls) > 1000  # the search ran on packs of thousands of tails
    assert peak < 200 * 2**20, peak
    got = sorted(s for p in res.packs for (s, a, b) in p)
    assert got == list(range(len(L)))  # every sample once, whole

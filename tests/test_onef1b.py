"""Closed-form 1F1B times (sim/onef1b.py) against the explicit event schedule."""

import numpy as np
import pytest

from atac_hf.sim.onef1b import onef1b_bounds, onef1b_formula
from atac_hf.sim.schedule import one_f_one_b


@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 2), (4, 8), (4, 4), (3, 7), (4, 2), (8, 8), (5, 1)])
def test_equal_micro_batches_give_the_textbook_formula(p, m):
    f, b = 0.7, 1.6
    fwd, bwd = np.full((p, m), f), np.full((p, m), b)
    textbook = (m + p - 1) * (f + b)
    assert one_f_one_b(fwd, bwd).makespan == pytest.approx(textbook)
    assert onef1b_formula(fwd, bwd) == pytest.approx(textbook)
    lo, hi = onef1b_bounds(fwd, bwd)
    assert lo == pytest.approx(textbook) and hi == pytest.approx(textbook)


def test_hand_checked_slow_micro_batch():
    # P=2, M=2, micro-batch 1 twice as slow: the schedule takes 14 (test_sim_schedule); the
    # formula: steady 3 + 6, ramp 1 x (2 + 4) = 15; lower bound: stage 1's path
    # F(0,0)=1 + its work 9 + B(0,1)=4 = 14 (tight here); upper: 3 x (2 + 4) = 18
    fwd = np.array([[1.0, 2.0], [1.0, 2.0]])
    bwd = np.array([[2.0, 4.0], [2.0, 4.0]])
    assert one_f_one_b(fwd, bwd).makespan == pytest.approx(14.0)
    assert onef1b_formula(fwd, bwd) == pytest.approx(15.0)
    assert onef1b_bounds(fwd, bwd) == pytest.approx((14.0, 18.0))


def test_one_stage_is_exact_for_any_micro_batches():
    rng = np.random.default_rng(3)
    fwd, bwd = rng.uniform(0.1, 2, (1, 9)), rng.uniform(0.1, 2, (1, 9))
    total = float((fwd + bwd).sum())
    assert one_f_one_b(fwd, bwd).makespan == pytest.approx(total)
    assert onef1b_formula(fwd, bwd) == pytest.approx(total)
    lo, hi = onef1b_bounds(fwd, bwd)
    assert lo == pytest.approx(total) and hi >= total


def test_hops_equal_micro_batches():
    # the formula and the lower bound charge one hop per stage boundary each way; the
    # schedule also stalls on hops in its steady state, so it is at least that
    p, m, f, b, h = 4, 8, 1.0, 2.0, 0.1
    fwd, bwd = np.full((p, m), f), np.full((p, m), b)
    t = one_f_one_b(fwd, bwd, h).makespan
    ramp = (m + p - 1) * (f + b) + 2 * (p - 1) * h
    assert onef1b_formula(fwd, bwd, h) == pytest.approx(ramp)
    lo, hi = onef1b_bounds(fwd, bwd, h)
    assert lo == pytest.approx(ramp) and lo <= t + 1e-12 <= hi + 1e-12
    assert hi == pytest.approx((m + p - 1) * (f + b + 2 * h))


@pytest.mark.parametrize("seed", range(4))
def test_bounds_hold_for_the_schedule_and_the_formula(seed):
    # random stages (uneven layers), micro-batches (long-tailed) and hops
    rng = np.random.default_rng(seed)
    for _ in range(150):
        p, m = int(rng.integers(1, 7)), int(rng.integers(1, 12))
        mb = rng.pareto(1.5, m) + 0.1
        layers = rng.uniform(0.5, 2.0, (p, 1))
        phi = rng.uniform(0.25, 0.4, m)
        fwd, bwd = layers * mb * phi, layers * mb * (1 - phi)
        hop = rng.uniform(0, 0.05, m) * (seed % 2)
        t = one_f_one_b(fwd, bwd, hop).makespan
        est = onef1b_formula(fwd, bwd, hop)
        lo, hi = onef1b_bounds(fwd, bwd, hop)
        assert lo <= t * (1 + 1e-12) and t <= hi * (1 + 1e-12)
        assert lo <= est * (1 + 1e-12) and est <= hi * (1 + 1e-12)


def test_refuses_bad_input():
    with pytest.raises(ValueError, match="differs from fwd_PM shape"):
        onef1b_formula(np.ones((2, 3)), np.ones((2, 2)))
    with pytest.raises(ValueError, match=">= 0 seconds"):
        onef1b_bounds(np.ones((2, 3)), -np.ones((2, 3)))

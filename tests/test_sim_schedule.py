"""Pipeline schedules: hand-checked makespans."""

import numpy as np
import pytest

from atac_hf.sim.schedule import forward_only, one_f_one_b, one_f_one_b_order


@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 3), (4, 8), (3, 1)])
def test_forward_only_equal_times(p, m):
    t = 0.7
    tl = forward_only(np.full((p, m), t))
    assert tl.makespan == pytest.approx((m + p - 1) * t)


def test_forward_only_one_slow_micro_batch_bubble():
    # proportionate flow shop: makespan = sum of times + (p - 1) x the slowest
    p, m, t, slow = 4, 6, 1.0, 3.0
    fwd = np.full((p, m), t)
    fwd[:, 2] = slow
    tl = forward_only(fwd)
    assert tl.makespan == pytest.approx((m - 1) * t + slow + (p - 1) * slow)
    # the bubble grows by (p - 1) x (slow - t) over the equal case
    assert tl.makespan - (m + p - 1) * t == pytest.approx((p - 1) * (slow - t) + (slow - t))


@pytest.mark.parametrize("p,m", [(1, 4), (2, 2), (4, 8), (4, 4), (3, 7), (4, 2)])
def test_1f1b_equal_times(p, m):
    f, b = 1.0, 2.0
    tl = one_f_one_b(np.full((p, m), f), np.full((p, m), b))
    assert tl.makespan == pytest.approx((m + p - 1) * (f + b))
    assert tl.busy_P == pytest.approx(np.full(p, m * (f + b)))
    assert tl.bubble_share == pytest.approx(1 - m / (m + p - 1))


def test_1f1b_hand_checked_slow_micro_batch():
    # P=2, M=2; micro-batch 1 is twice as slow (f=2, b=4), micro-batch 0 has f=1, b=2.
    # stage 0: F0 [0,1] F1 [1,3] B0 [4,6] B1 [10,14]; stage 1: F0 [1,2] B0 [2,4] F1 [4,6] B1 [6,10]
    fwd = np.array([[1.0, 2.0], [1.0, 2.0]])
    bwd = np.array([[2.0, 4.0], [2.0, 4.0]])
    tl = one_f_one_b(fwd, bwd)
    assert tl.makespan == pytest.approx(14.0)
    assert tl.fwd_start_PM.tolist() == [[0.0, 1.0], [1.0, 4.0]]
    assert tl.bwd_start_PM.tolist() == [[4.0, 10.0], [2.0, 6.0]]


def test_1f1b_hops_delay_both_directions():
    p, m, f, b, h = 3, 4, 1.0, 2.0, 0.25
    tl = one_f_one_b(np.full((p, m), f), np.full((p, m), b), h)
    # the ramp crosses p - 1 hops forward and p - 1 back; in the 1F1B steady state a
    # stage's next backward waits for a round trip, so hops recur on the critical path:
    # stage 0 runs B0 at 8 (= 3 forwards + 2 backwards + 4 hops), B3 ends at 20.
    assert tl.makespan >= (m + p - 1) * (f + b) + 2 * (p - 1) * h
    assert tl.makespan == pytest.approx(20.0)
    assert tl.bwd_start_PM[0, 0] == pytest.approx(3 * f + 2 * b + 4 * h)


def test_1f1b_order_is_warmup_then_alternating():
    order = one_f_one_b_order(4, 6, 1)  # stage 1 of 4: p - s - 1 = 2 warm-up forwards
    assert order[:2] == [("F", 0), ("F", 1)]
    assert order[2:6] == [("F", 2), ("B", 0), ("F", 3), ("B", 1)]
    assert sorted(i for k, i in order if k == "F") == list(range(6))
    assert sorted(i for k, i in order if k == "B") == list(range(6))
    last = one_f_one_b_order(4, 6, 3)
    assert last[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_schedule_rejects_bad_shapes():
    with pytest.raises(ValueError, match="bwd_PM shape"):
        one_f_one_b(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match=">= 0"):
        forward_only(-np.ones((2, 2)))

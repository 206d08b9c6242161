"""Explicit pipeline schedules with a different time for every micro-batch.

Shape legend: ``P`` pipeline stages, ``M`` micro-batches. ``fwd_PM[s, i]`` and
``bwd_PM[s, i]`` are the seconds stage ``s`` spends on the forward / backward of
micro-batch ``i``; ``p2p_M[i]`` the seconds to hand micro-batch ``i``'s activations
(or their gradients) from one stage to the next.

Each stage runs its operations in a fixed order (the schedule); an operation
starts when the stage is free and its inputs have arrived:

* ``F(s, i)`` needs ``F(s - 1, i)`` done plus one hop;
* ``B(s, i)`` needs ``B(s + 1, i)`` done plus one hop (the last stage: its own ``F(P-1, i)``).

Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PipelineTimeline", "one_f_one_b", "forward_only", "one_f_one_b_order"]


@dataclass(frozen=True)
class PipelineTimeline:
    """Start/end times of every operation of one pipeline run.

    Attributes:
        fwd_start_PM, fwd_end_PM, bwd_start_PM, bwd_end_PM: (P, M) seconds.
        makespan: seconds from the first operation's start to the last one's end.
        busy_P: (P,) seconds each stage computes.
    """

    fwd_start_PM: np.ndarray
    fwd_end_PM: np.ndarray
    bwd_start_PM: np.ndarray
    bwd_end_PM: np.ndarray
    makespan: float
    busy_P: np.ndarray

    @property
    def bubble_share(self) -> float:
        """Idle share of stage-time: ``1 - sum(busy) / (P * makespan)``."""
        if self.makespan <= 0:
            return 0.0
        return float(1.0 - self.busy_P.sum() / (len(self.busy_P) * self.makespan))


def one_f_one_b_order(num_stages: int, num_micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """Operation order of one stage under non-interleaved 1F1B (PipeDream-flush, Megatron).

    Stage ``s`` runs ``min(P - s - 1, M)`` warm-up forwards, then alternates one
    forward and one backward, then drains the remaining backwards.

    Returns:
        ``[("F", i) | ("B", i), ...]`` in execution order.
    """
    P, M, s = num_stages, num_micro_batches, stage
    warm = min(P - s - 1, M)
    ops: list[tuple[str, int]] = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < M:
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops.extend(("B", i) for i in range(b, M))
    return ops


def _check(fwd_PM: np.ndarray, bwd_PM: np.ndarray | None, p2p_M) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    fwd = np.asarray(fwd_PM, dtype=np.float64)
    if fwd.ndim != 2 or fwd.shape[0] < 1:
        raise ValueError(f"fwd_PM must be a (stages, micro_batches) array, got shape {fwd.shape}")
    bwd = np.zeros_like(fwd) if bwd_PM is None else np.asarray(bwd_PM, dtype=np.float64)
    if bwd.shape != fwd.shape:
        raise ValueError(f"bwd_PM shape {bwd.shape} differs from fwd_PM shape {fwd.shape}")
    p2p = np.broadcast_to(np.asarray(0.0 if p2p_M is None else p2p_M, dtype=np.float64), (fwd.shape[1],))
    for name, a in (("fwd_PM", fwd), ("bwd_PM", bwd), ("p2p_M", p2p)):
        bad = ~(np.isfinite(a) & (a >= 0))  # NaN and inf too: a schedule cannot order them
        if bad.any():
            raise ValueError(f"pipeline operation times must be finite and >= 0 seconds: {name} holds "
                             f"{a[bad].flat[0].item()!r}")
    return fwd, bwd, p2p


def one_f_one_b(fwd_PM, bwd_PM, p2p_M=None) -> PipelineTimeline:
    """Run a non-interleaved 1F1B schedule and time every operation.

    With equal times ``f``, ``b`` and no hops the makespan is ``(M + P - 1) (f + b)``.

    Args:
        fwd_PM, bwd_PM: (P, M) seconds per forward / backward.
        p2p_M: (M,) or scalar seconds per stage-to-stage hop (default 0).

    Returns:
        The :class:`PipelineTimeline`.
    """
    fwd, bwd, p2p = _check(fwd_PM, bwd_PM, p2p_M)
    P, M = fwd.shape
    fs, fe = np.full((P, M), np.nan), np.full((P, M), np.nan)
    bs, be = np.full((P, M), np.nan), np.full((P, M), np.nan)
    orders = [one_f_one_b_order(P, M, s) for s in range(P)]
    pos = [0] * P
    free = [0.0] * P
    remaining = sum(len(o) for o in orders)
    # Sweep: any stage whose next operation has its input ready runs it. Each pass over
    # the stages makes progress (1F1B is deadlock free), so this ends in O(P * M) passes.
    while remaining:
        progressed = False
        for s in range(P):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                if kind == "F":
                    if s > 0 and np.isnan(fe[s - 1, i]):
                        break
                    ready = 0.0 if s == 0 else fe[s - 1, i] + p2p[i]
                    fs[s, i] = max(free[s], ready)
                    fe[s, i] = fs[s, i] + fwd[s, i]
                    free[s] = fe[s, i]
                else:
                    dep = fe[s, i] if s == P - 1 else be[s + 1, i]
                    if np.isnan(dep):
                        break
                    ready = dep if s == P - 1 else dep + p2p[i]
                    bs[s, i] = max(free[s], ready)
                    be[s, i] = bs[s, i] + bwd[s, i]
                    free[s] = be[s, i]
                pos[s] += 1
                remaining -= 1
                progressed = True
        assert progressed, "1F1B schedule deadlocked (internal error)"
    makespan = float(max(np.max(fe), np.max(be)) - 0.0) if M else 0.0
    return PipelineTimeline(fs, fe, bs, be, makespan, fwd.sum(axis=1) + bwd.sum(axis=1))


def forward_only(fwd_PM, p2p_M=None) -> PipelineTimeline:
    """Forward-only pipeline (inference, or GPipe's forward phase): each stage runs
    ``F(s, 0), F(s, 1), ...`` in order. Equal times ``t`` give ``(M + P - 1) t``."""
    fwd, _, p2p = _check(fwd_PM, None, p2p_M)
    P, M = fwd.shape
    fs, fe = np.zeros((P, M)), np.zeros((P, M))
    for s in range(P):
        free = 0.0
        for i in range(M):
            ready = 0.0 if s == 0 else fe[s - 1, i] + p2p[i]
            fs[s, i] = max(free, ready)
            fe[s, i] = free = fs[s, i] + fwd[s, i]
    zeros = np.zeros((P, M))
    return PipelineTimeline(fs, fe, zeros, zeros, float(fe.max()) if M else 0.0, fwd.sum(axis=1))

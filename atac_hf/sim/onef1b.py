"""Closed-form 1F1B step times: a second timing of the same micro-batches, independent of
the event schedule in :mod:`.schedule`.

Shape legend as in :mod:`.schedule`: ``P`` stages, ``M`` micro-batches; ``fwd_PM[s, i]``,
``bwd_PM[s, i]`` seconds of stage ``s`` on micro-batch ``i``; ``p2p_M[i]`` seconds per hop.
``t_PM = fwd_PM + bwd_PM``.

With equal times ``f``, ``b`` and no hops, non-interleaved 1F1B (PipeDream-flush) takes the
textbook ``(M + P - 1) (f + b)``: ``P - 1`` warm-up forwards and cool-down backwards around
``M`` steady slots. For micro-batches of different cost:

* :func:`onef1b_formula`, the estimate the report uses: steady state = the sum over
  micro-batches of the bottleneck stage's time, ``sum_i max_s t[s, i]``; warm-up + cool-down
  = ``(P - 1)`` slots of the largest forward plus the largest backward,
  ``(P - 1) (max f + max b)``; plus one hop per stage boundary each way,
  ``2 (P - 1) max p2p``. Equal micro-batches give the textbook formula exactly.
* :func:`onef1b_bounds`, bounds that hold for every input: a lower bound (the longest of
  ``P`` paths of the schedule's dependency graph: micro-batch 0's forward down to stage
  ``s``, all of stage ``s``'s work in its 1F1B order, micro-batch ``M - 1``'s backward back
  up) and an upper bound (every operation padded to the largest forward / backward and
  every hop to the largest: the equal-time schedule, which no shorter operation can slow,
  with each hop charged to its sender). The formula lies between them too (its steady sum
  covers every stage's work, its ramp every path's; it never exceeds the padded count).

Numpy only.
"""

from __future__ import annotations

import numpy as np

from .schedule import _check

__all__ = ["onef1b_formula", "onef1b_bounds"]


def onef1b_formula(fwd_PM, bwd_PM, p2p_M=None) -> float:
    """Closed-form 1F1B makespan estimate (see the module doc).

    Args:
        fwd_PM, bwd_PM: (P, M) seconds per forward / backward (>= 0).
        p2p_M: (M,) or scalar seconds per stage-to-stage hop (default 0).

    Returns:
        seconds; ``(M + P - 1) (f + b)`` for equal times without hops.

    Raises:
        ValueError: shapes that differ, not 2-D, or negative times.
    """
    fwd, bwd, p2p = _check(fwd_PM, bwd_PM, p2p_M)
    P, M = fwd.shape
    if M == 0:
        return 0.0
    steady = float((fwd + bwd).max(axis=0).sum())
    ramp = (P - 1) * (float(fwd.max()) + float(bwd.max()) + 2.0 * float(p2p.max()))
    return steady + ramp


def onef1b_bounds(fwd_PM, bwd_PM, p2p_M=None) -> tuple[float, float]:
    """``(lower, upper)`` bounds on the 1F1B makespan that hold for every input (see the
    module doc); both equal ``(M + P - 1) (f + b)`` for equal times without hops.

    Raises:
        ValueError: as :func:`onef1b_formula`.
    """
    fwd, bwd, p2p = _check(fwd_PM, bwd_PM, p2p_M)
    P, M = fwd.shape
    if M == 0:
        return 0.0, 0.0
    # path through stage s: F(0..s-1, 0) with their hops, stage s's whole work, B(s-1..0, M-1) with hops
    ramp_S = np.concatenate([[0.0], np.cumsum(fwd[:-1, 0] + bwd[:-1, M - 1] + p2p[0] + p2p[M - 1])])
    lower = float((ramp_S + (fwd + bwd).sum(axis=1)).max())
    upper = (M + P - 1) * (float(fwd.max()) + float(bwd.max()) + 2.0 * float(p2p.max()))
    return lower, upper

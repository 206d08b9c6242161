"""How a feeder sizes the next window of a stream by tokens: the one rule of :func:`pack_lengths`,
the samplers' :class:`~atac_hf.packing.data.window_planner.WindowPlanner` and the pipeline
simulator (:mod:`atac_hf.sim.feed`), so every feeder and the simulator take the same windows.
Numpy only."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MIN_LOOK", "next_window"]

#: The smallest look-ahead (samples) a feeder starts a window's sizing with.
MIN_LOOK = 64


def next_window(packer: Any, lengths: np.ndarray, pos: int, look: int, *, prev_empty: bool,
                lookahead: bool = True) -> tuple[int, int]:
    """``(k, look)``: take the next ``k`` samples of ``lengths`` (checked int64, from ``pos``).

    :meth:`~atac_hf.packing.StreamPacker.window_size` over a look-ahead of ``look`` samples,
    doubled until the window fills (the returned ``look``, twice this window's samples and at least
    :data:`MIN_LOOK`, is for the next call: ``window_size`` is a function of each sample alone and of
    the running sum, so any look-ahead that fills the window gives the same ``k``, and one sized by
    the last window costs a small window far less than thousands of samples); at least
    one sample where the previous window packed nothing (``prev_empty``: always make progress);
    and, with ``lookahead``, the whole rest of the stream where it fits this window
    (:meth:`~atac_hf.packing.StreamPacker.rest_fits_window`; the window is then fed as the last).
    """
    n = int(lengths.size)
    while True:  # look ahead far enough to fill the window
        k = packer.window_size(lengths[pos:pos + look])
        if k < look or pos + look >= n:
            break
        look *= 2
    if k == 0 and prev_empty:
        k = 1
    if lookahead and 0 < k < n - pos and packer.rest_fits_window(lengths[pos + k:]):
        k = n - pos  # one-window lookahead: the rest of the stream joins this window
    k = max(0, min(k, n - pos))
    return k, max(MIN_LOOK, 2 * k)

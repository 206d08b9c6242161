"""Feeding the sample stream to the real packers, and packing-side metrics.

Numpy only.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ..cost import CostModel
from .cluster import ClusterConfig

__all__ = ["PackedStream", "cut_windows", "forced_piece_cost", "run_packer", "packing_metrics", "pack_cost"]

Span = tuple[int, int, int]


def cut_windows(stream: np.ndarray, window_tokens: float, num_windows: int) -> list[np.ndarray]:
    """Sample ids of each window: window ``w`` ends where the stream's cumulative tokens
    first reach ``(w + 1) x window_tokens`` (independent of any packer)."""
    csum = np.cumsum(stream)
    ends = np.searchsorted(csum, window_tokens * np.arange(1, num_windows + 1), side="left") + 1
    ends = np.minimum(ends, len(stream))
    starts = np.concatenate([[0], ends[:-1]])
    return [np.arange(a, b, dtype=np.int64) for a, b in zip(starts, ends)]


@dataclass
class PackedStream:
    """What one packing strategy made of the stream."""

    packs: list[list[list[Span]]]  # per window, the packs (already in deal order)
    pack_s: np.ndarray  # (W,) packing seconds per window
    arrival: np.ndarray  # (num samples,) window each sample entered
    windows: list[np.ndarray]  # sample ids fed in each window (flush windows feed none)
    min_fragment: int = 1  # the packer's shortest fragment (how it cuts overlength samples)


def run_packer(strategy: str, stream: np.ndarray, cluster: ClusterConfig, cm: CostModel,
               options: dict[str, Any], fixed: list[np.ndarray] | None, end_of_stream: str = "flush") -> PackedStream:
    """Feed the whole stream to a real StreamPacker window by window, then flush it.

    ``fixed``: the windows (sample ids) to feed, identical for every packer. ``None``:
    size each window as the packer's own feeder does (``pack_lengths``,
    :func:`~atac_hf.packing.feed.next_window`): new samples, in stream order, until their
    packable supply reaches the packer's ``tokens_wanted``, with its bound on held-back samples.
    ``end_of_stream``: ``"flush"``: the last window is fed like any other (the feeder does
    not know it is the last); ``"last"``: it is fed with ``add_window(last=True)``, and
    (``fixed=None``) a rest of the stream smaller than one window joins the window before
    it (:meth:`~atac_hf.packing.StreamPacker.rest_fits_window`).
    """
    from ..packing import PackingConfig, StreamPacker  # the numpy-only planners

    config = PackingConfig(max_tokens=cluster.max_tokens, packs_per_window=cluster.packs_per_step,
                           strategy=strategy, **options)
    packer = StreamPacker(config, cm, pack_multiple=cluster.dp_size)  # as the real feeder: a multiple of DP
    # the packers warn once that they split samples over the cap; splitting them is the
    # simulated policy here, and the metrics count it (fragmentation)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*longer than max_tokens.*", category=UserWarning)
        return _feed(packer, strategy, stream, cluster, cm, fixed, config.min_fragment, end_of_stream == "last")


def _feed(packer: Any, strategy: str, stream: np.ndarray, cluster: ClusterConfig, cm: CostModel,
          fixed: list[np.ndarray] | None, min_fragment: int, tell_last: bool = False) -> PackedStream:
    from ..packing.feed import MIN_LOOK, next_window

    stream = np.asarray(stream, dtype=np.int64)
    n = len(stream)
    arrival = np.full(n, -1, dtype=np.int64)
    out, secs, fed_windows, pos, look = [], [], [], 0, MIN_LOOK
    while (pos < n) if fixed is None else (len(out) < len(fixed)):
        if fixed is not None:
            ids = fixed[len(out)]
        else:  # the library's own rule (pack_lengths): the same windows as a real feeder
            k, look = next_window(packer, stream, pos, look, prev_empty=not out or not out[-1], lookahead=tell_last)
            ids = np.arange(pos, pos + k, dtype=np.int64)
            pos += k
        arrival[ids] = len(out)
        fed_windows.append(ids)
        last = tell_last and ((pos >= n) if fixed is None else (len(out) == len(fixed) - 1))
        t0 = time.perf_counter()
        packs = packer.add_window(ids.tolist(), stream[ids].tolist(), last=last)
        secs.append(time.perf_counter() - t0)
        out.append(_normalise(packs))
    t0 = time.perf_counter()
    rest = packer.flush_windows()
    per = (time.perf_counter() - t0) / max(1, len(rest))
    for win in rest:
        out.append(_normalise(win))
        secs.append(per)
    if strategy == "wfap":  # ATAC's feeder deals a window's packs to replicas balanced by cost
        out = _dp_deal(out, cm, cluster.dp_size)
    return PackedStream(out, np.asarray(secs), arrival, fed_windows, int(min_fragment))


def _dp_deal(windows: list[list[list[Span]]], cm: CostModel, dp: int) -> list[list[list[Span]]]:
    """Order each window like :class:`atac_hf.packing.data.window_planner.WindowPlanner` does
    (:func:`~atac_hf.packing.data.window_planner.replica_order` with the running slot and loads)."""
    from ..packing.data.window_planner import replica_order

    loads, slot, out = [0.0] * dp, 0, []
    for win in windows:
        costs = [pack_cost(cm, p) for p in win]
        perm = replica_order(costs, dp, first_slot=slot, prior_loads=loads)
        for k, i in enumerate(perm):
            loads[(slot + k) % dp] += costs[i]
        slot += len(win)
        out.append([win[i] for i in perm])
    return out


def _normalise(packs: Iterable[Iterable[Sequence[int]]]) -> list[list[Span]]:
    out = [[(int(s[0]), int(s[1]), int(s[2])) for s in p] for p in packs]
    return [p for p in out if p]


def pack_cost(cm: CostModel, pack: list[Span]) -> float:
    return float(cm.doc_cost([e - s for _, s, e in pack]).sum())


def forced_piece_cost(lengths: np.ndarray, cap: int, min_fragment: int, cm: CostModel) -> float:
    """Cost of the samples cut only where the cap forces it, the way the packers cut them
    (:func:`~atac_hf.packing.planners.window.overlength_pieces`, vectorised): ``k - 1``
    full-cap pieces and the remainder, which takes tokens from the piece before it when it
    is shorter than ``min_fragment``."""
    L = np.asarray(lengths, dtype=np.int64)
    k = -(-L // cap)
    last = L - (k - 1) * cap
    short = (k > 1) & (last < min_fragment)
    full = np.where(short, k - 2, k - 1)
    cost = full * cm.doc_cost(np.full_like(L, cap)) + cm.doc_cost(np.where(short, min_fragment, last))
    cost = cost + np.where(short, cm.doc_cost(np.maximum(cap - (min_fragment - last), 1)), 0.0)
    return float(cost.sum())


def packing_metrics(packed: PackedStream, stream: np.ndarray, cap: int, num_packs_per_step: int,
                    cm: CostModel) -> dict[str, Any]:
    """Packing-side metrics of one strategy over the whole stream.

    * ``padding_share``: unused pack capacity, ``1 - tokens / (steps x packs x cap)``;
    * ``fragmentation``: share of samples held in more than one span (samples over the
      cap must be split and count too);
    * ``delay_mean`` / ``delay_max``: windows between a sample's arrival and the window
      of its last span;
    * ``split_work_saving``: attention+linear work the strategy's splits remove,
      ``1 - work / work of the samples cut only where the cap forces it`` (a split
      document loses the attention across the cut; the simulator charges the work done).
    """
    spans = [(sid, s, e, w) for w, win in enumerate(packed.packs) for p in win for sid, s, e in p]
    if not spans:
        return dict(padding_share=1.0, fragmentation=0.0, delay_mean=0.0, delay_max=0, split_work_saving=0.0)
    arr = np.array(spans, dtype=np.int64)
    tokens = int((arr[:, 2] - arr[:, 1]).sum())
    slots = num_packs_per_step * len(packed.packs)
    partial = (arr[:, 2] - arr[:, 1]) < stream[arr[:, 0]]
    last = np.full(len(stream), -1, dtype=np.int64)
    np.maximum.at(last, arr[:, 0], arr[:, 3])
    seen = last >= 0
    delay = last[seen] - packed.arrival[seen]
    forced = float(forced_piece_cost(stream[seen], cap, packed.min_fragment, cm))
    work = float(cm.doc_cost(arr[:, 2] - arr[:, 1]).sum())
    return dict(
        padding_share=1.0 - tokens / (slots * cap),
        fragmentation=len(np.unique(arr[partial, 0])) / int(seen.sum()),
        delay_mean=float(delay.mean()),
        delay_max=int(delay.max()),
        split_work_saving=max(0.0, 1.0 - work / forced) if forced > 0 else 0.0,  # float noise below 0
    )

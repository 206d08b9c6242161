"""Packing metrics: pure functions that recount everything from the packs.

Pack cost = sum over its spans of ``cost_model.doc_cost(end - start)`` (a fragment is its
own document in the row). Per window: imbalance = max / mean pack cost and the
coefficient of variation (std / mean) of pack cost. Over the stream:

================== ===============================================================
key                meaning
================== ===============================================================
num_windows        windows that produced at least one pack
num_packs          packs
num_samples        samples placed (zero-length ones are skipped, not counted)
tokens             tokens placed
imbalance_mean     mean over windows of max / mean pack cost
imbalance_worst    worst window's max / mean pack cost
cost_cv            std / mean of pack cost over all packs
window_cost_cv     mean over windows of the per-window std / mean
total_cost_s       sum of all pack costs (seconds, one layer fwd+bwd)
est_time_s         sum over windows of the costliest pack (seconds, one layer fwd+bwd):
                   the time if each window's packs run side by side
balance_efficiency total pack cost / sum over windows of (packs x costliest pack)
padding            1 - tokens / (num_packs x max_tokens)
num_split          samples split into several spans
fragmentation      num_split / num_samples
truncated_tokens   tokens dropped by ``overlength="truncate"``
zero_length_skipped samples with no tokens (skipped)
num_deferred       samples emitted at least one window after they arrived
deferred_share     num_deferred / num_samples
delay_mean         mean over samples of windows waited (last span's window - arrival)
delay_mean_deferred mean of that over deferred samples only
delay_max          largest delay in windows
================== ===============================================================

Numpy only.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..cost import CostModel

__all__ = ["pack_costs", "window_imbalance", "MetricsAccumulator", "recount_metrics"]

Span = Sequence[int]  # (sample_id, start, end)


def pack_costs(packs: Sequence[Sequence[Span]], cost_model: CostModel) -> np.ndarray:
    """Cost (seconds) of each pack: its spans costed as separate documents."""
    if not packs:
        return np.zeros(0)
    sizes = [len(p) for p in packs]
    if min(sizes) == 0:
        raise ValueError("a pack is empty; packs must hold at least one span")
    lens = np.fromiter((int(s[2]) - int(s[1]) for p in packs for s in p), dtype=np.int64, count=sum(sizes))
    per_span = cost_model.doc_cost(lens)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return np.add.reduceat(per_span, starts)


def window_imbalance(costs: Sequence[float]) -> float:
    """max / mean of one window's pack costs (1.0 = perfectly balanced)."""
    c = np.asarray(costs, dtype=np.float64)
    return float(c.max() / c.mean())


class MetricsAccumulator:
    """Running sums behind the metrics table, updated window by window (JSON-serialisable
    state). :func:`recount_metrics` recomputes the same numbers from the packs."""

    _FIELDS = ("num_windows", "num_packs", "tokens", "sum_imbalance", "worst_imbalance", "sum_window_cv",
               "cost_sum", "cost_sumsq", "est_time_s", "weighted_max", "num_samples", "num_split",
               "truncated_tokens", "zero_length_skipped", "num_deferred", "delay_sum", "delay_max", "num_overdue")

    def __init__(self, max_tokens: int, max_defer: int | None = None) -> None:
        self.max_tokens = int(max_tokens)
        self.max_defer = max_defer
        for f in self._FIELDS:
            setattr(self, f, 0.0 if f in ("sum_imbalance", "worst_imbalance", "sum_window_cv", "cost_sum",
                                          "cost_sumsq", "est_time_s", "weighted_max") else 0)

    def add_window(self, costs: np.ndarray, tokens: int) -> None:
        if len(costs) == 0:
            return
        c = np.asarray(costs, dtype=np.float64)
        mx, mean = float(c.max()), float(c.mean())
        imb = mx / mean
        self.num_windows += 1
        self.num_packs += len(c)
        self.tokens += int(tokens)
        self.sum_imbalance += imb
        self.worst_imbalance = max(self.worst_imbalance, imb)
        self.sum_window_cv += float(c.std()) / mean
        self.cost_sum += float(c.sum())
        self.cost_sumsq += float((c * c).sum())
        self.est_time_s += mx
        self.weighted_max += mx * len(c)

    def add_sample(self, delay: int) -> None:
        self.num_samples += 1
        if delay > 0:
            self.num_deferred += 1
            self.delay_sum += int(delay)
            self.delay_max = max(self.delay_max, int(delay))
        if self.max_defer is not None and delay > self.max_defer:
            self.num_overdue += 1

    def summary(self) -> dict[str, Any]:
        nw, npk, ns = self.num_windows, self.num_packs, self.num_samples
        mean_cost = self.cost_sum / npk if npk else 0.0
        var = max(self.cost_sumsq / npk - mean_cost * mean_cost, 0.0) if npk else 0.0
        out = {
            "num_windows": nw,
            "num_packs": npk,
            "num_samples": ns,
            "tokens": self.tokens,
            "max_tokens": self.max_tokens,
            "imbalance_mean": self.sum_imbalance / nw if nw else math.nan,
            "imbalance_worst": self.worst_imbalance if nw else math.nan,
            "cost_cv": math.sqrt(var) / mean_cost if npk else math.nan,
            "window_cost_cv": self.sum_window_cv / nw if nw else math.nan,
            "total_cost_s": self.cost_sum,
            "est_time_s": self.est_time_s,
            "balance_efficiency": self.cost_sum / self.weighted_max if npk else math.nan,
            "padding": 1.0 - self.tokens / (npk * self.max_tokens) if npk else math.nan,
            "num_split": self.num_split,
            "fragmentation": self.num_split / ns if ns else 0.0,
            "truncated_tokens": self.truncated_tokens,
            "zero_length_skipped": self.zero_length_skipped,
            "num_deferred": self.num_deferred,
            "deferred_share": self.num_deferred / ns if ns else 0.0,
            "delay_mean": self.delay_sum / ns if ns else 0.0,
            "delay_mean_deferred": self.delay_sum / self.num_deferred if self.num_deferred else 0.0,
            "delay_max": self.delay_max,
        }
        if self.max_defer is not None:
            out["num_overdue"] = self.num_overdue
        return out

    def state_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self._FIELDS}

    _FLOATS = ("sum_imbalance", "worst_imbalance", "sum_window_cv", "cost_sum", "cost_sumsq", "est_time_s",
               "weighted_max")

    @classmethod
    def check_state(cls, state: Any) -> dict[str, Any]:
        """Validate a :meth:`state_dict` without changing anything: counts are ints >= 0,
        sums finite numbers >= 0. Returns the parsed fields.

        Raises:
            ValueError: a missing field, or one of the wrong type or sign (names it).
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"malformed metrics state: expected a mapping, got {type(state).__name__}")
        missing = [f for f in cls._FIELDS if f not in state]
        if missing:
            raise ValueError(f"metrics state is missing {missing}")
        out: dict[str, Any] = {}
        for f in cls._FIELDS:
            v = state[f]
            if f in cls._FLOATS:
                ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) \
                    and math.isfinite(float(v)) and v >= 0
                out[f] = float(v) if ok else None
            else:
                ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= 0
                out[f] = int(v) if ok else None
            if not ok:
                kind = "a finite number >= 0" if f in cls._FLOATS else "an int >= 0"
                raise ValueError(f"malformed metrics state: {f!r} = {str(v)[:40]!r} must be {kind} (a truncated or "
                                 "edited checkpoint?)")
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked first: a refused state changes nothing)."""
        for f, v in self.check_state(state).items():
            setattr(self, f, v)


def recount_metrics(windows: Sequence[Sequence[Sequence[Span]]], lengths: Mapping[int, int] | Sequence[int],
                    *, max_tokens: int, cost_model: CostModel, arrival: Mapping[int, int] | Sequence[int] | None = None,
                    zero_length_skipped: int | None = None) -> dict[str, Any]:
    """Recount the metrics table from the packs.

    Args:
        windows: the packs of each window in order (window ``w`` = ``windows[w]``, which may
            be empty); each pack a list of ``(sample_id, start, end)``.
        lengths: the full length of every sample (sample id -> tokens), for truncation.
        max_tokens: the pack cap (for padding).
        cost_model: costs the packs.
        arrival: window each sample arrived in (for delays); ``None`` reports no delay.
        zero_length_skipped: count of skipped empty samples; ``None`` counts the zeros in
            ``lengths``.

    Returns:
        the dict described in the module doc.
    """
    acc = MetricsAccumulator(max_tokens)
    last: dict[int, int] = {}
    covered: dict[int, int] = {}
    spans: dict[int, int] = {}
    for w, packs in enumerate(windows):
        packs = [p for p in packs if p]
        acc.add_window(pack_costs(packs, cost_model), sum(int(e) - int(s) for p in packs for _, s, e in p))
        for p in packs:
            for sid, s, e in p:
                sid = int(sid)
                last[sid] = w
                covered[sid] = covered.get(sid, 0) + int(e) - int(s)
                spans[sid] = spans.get(sid, 0) + 1
    for sid in sorted(last):
        acc.add_sample(last[sid] - int(arrival[sid]) if arrival is not None else 0)
        acc.truncated_tokens += int(lengths[sid]) - covered[sid]
    acc.num_split = sum(1 for n in spans.values() if n > 1)
    if zero_length_skipped is None:
        values = lengths.values() if isinstance(lengths, Mapping) else lengths
        zero_length_skipped = int(sum(1 for v in values if int(v) == 0))
    acc.zero_length_skipped = int(zero_length_skipped)
    return acc.summary()

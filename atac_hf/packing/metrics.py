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
from collections.abc import Set as AbstractSet, ValuesView
from itertools import chain
from typing import Any, Mapping, Sequence

import numpy as np

from ..cost import CostModel
from .config import MAX_LENGTH
from .validate import InputTypeError, _is_int, _short, check_lengths

__all__ = ["pack_costs", "window_imbalance", "MetricsAccumulator", "recount_metrics"]

Span = Sequence[int]  # (sample_id, start, end)
_SPAN = "a span is (sample, start, end) ints with 0 <= start < end <= 2**40 (tokens [start, end) of the sample)"


def _check_cost_model(cost_model: Any, caller: str) -> None:
    if not isinstance(cost_model, CostModel):
        raise TypeError(f"{caller}: cost_model={_short(cost_model)} is not a CostModel: pass one, e.g. "
                        "atac_hf.default_cost_model() (set cost_model)")


def _check_packs(packs: Any, name: str, allow_empty: bool = False) -> tuple[list[int], np.ndarray]:
    """The number of spans of each pack and all spans as an ``(n, 3)`` int64 array, every span
    checked (:data:`_SPAN`); ``InputTypeError`` / ``ValueError`` naming the first bad pack or span."""
    if isinstance(packs, (str, bytes, Mapping)) or not hasattr(packs, "__iter__"):
        raise InputTypeError(f"{name}={_short(packs)} is not a list of packs: pass a list of packs, each a list of "
                             "(sample, start, end) spans")
    packs = list(packs)
    if packs and all(isinstance(p, np.ndarray) and p.ndim == 2 and p.shape[1] == 3 and p.dtype.kind == "i"
                     for p in packs):  # (k, 3) int arrays (pack_dataset's spans)
        sizes = [len(p) for p in packs]
        arr = np.concatenate(packs).astype(np.int64, copy=False)
    else:
        if not all(issubclass(t, (tuple, list, np.ndarray)) for t in set(map(type, packs))):
            i = next(i for i, p in enumerate(packs) if not isinstance(p, (tuple, list, np.ndarray)))
            raise InputTypeError(f"{name}[{i}] = {_short(packs[i])} is not a pack: a pack is a list of spans; {_SPAN}")
        sizes = list(map(len, packs))
        flat = [s for p in packs for s in p]
        # every span a tuple / list / array of 3 ints (a bool is not one; a float is not truncated)
        types = None
        if all(issubclass(t, (tuple, list, np.ndarray)) for t in set(map(type, flat))) \
                and set(map(len, flat)) <= {3}:
            types = set(map(type, chain.from_iterable(flat)))
        if types is None or not all(t is int or issubclass(t, np.integer) for t in types):
            k = next(k for k, sp in enumerate(flat) if not isinstance(sp, (tuple, list, np.ndarray))
                     or len(sp) != 3 or not all(_is_int(x) for x in sp))
            raise InputTypeError(f"{name}{_where(sizes, k)} = {_short(flat[k])} is not a span: {_SPAN}")
        try:
            arr = np.fromiter(chain.from_iterable(flat), dtype=np.int64, count=3 * len(flat)).reshape(-1, 3)
        except OverflowError:
            k = next(k for k, sp in enumerate(flat) if not all(-2**63 <= x < 2**63 for x in sp))
            raise ValueError(f"{name}{_where(sizes, k)} = {_short(flat[k])} is out of range: {_SPAN}") from None
    if not allow_empty and 0 in sizes:
        raise ValueError(f"a pack is empty ({name}[{sizes.index(0)}]); packs must hold at least one span")
    bad = (arr[:, 1] < 0) | (arr[:, 2] <= arr[:, 1]) | (arr[:, 2] > MAX_LENGTH)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{name}{_where(sizes, k)} = {tuple(arr[k].tolist())} is not a span: {_SPAN}")
    return sizes, arr


def _where(sizes: list[int], k: int) -> str:
    """``[i][j]``: the pack and the place in it of the ``k``-th span of all packs."""
    ends = np.cumsum(sizes)
    i = int(np.searchsorted(ends, k, side="right"))
    return f"[{i}][{k - int(ends[i] - sizes[i])}]"


def _costs(sizes: list[int], arr: np.ndarray, cost_model: CostModel) -> np.ndarray:
    """Sum over each pack (``sizes[i]`` spans, all > 0) of its spans' document costs."""
    if not sizes:
        return np.zeros(0)
    per_span = cost_model.doc_cost(arr[:, 2] - arr[:, 1])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return np.add.reduceat(per_span, starts)


def pack_costs(packs: Sequence[Sequence[Span]], cost_model: CostModel) -> np.ndarray:
    """Cost (seconds) of each pack: its spans costed as separate documents.

    Args:
        packs: a list of packs, each a non-empty list of ``(sample, start, end)`` spans
            (ints, ``0 <= start < end``; or a ``(k, 3)`` int array).
        cost_model: prices each span as a document.

    Raises:
        InputTypeError / TypeError: ``packs`` not a list of packs, a span that is not 3 ints,
            ``cost_model`` not a :class:`~atac_hf.cost.CostModel`.
        ValueError: an empty pack, a span with ``start < 0``, ``end <= start`` or ``end > 2**40``.
    """
    _check_cost_model(cost_model, "pack_costs")
    sizes, arr = _check_packs(packs, "packs")
    return _costs(sizes, arr, cost_model)


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

    Raises:
        InputTypeError / TypeError: a malformed window, pack or span, lengths or arrival that
            are not ints, ``cost_model`` not a :class:`~atac_hf.cost.CostModel`.
        ValueError: ``max_tokens`` not in ``[1, 2**40]``; a span of a sample ``lengths`` does not
            list, past the sample's length, or over tokens another span of it holds; a sample
            emitted before its ``arrival``; a negative ``zero_length_skipped``.
    """
    if not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_LENGTH:
        raise ValueError(f"recount_metrics: max_tokens={_short(max_tokens)} is invalid: it must be an int > 0 and "
                         f"<= {MAX_LENGTH} (the pack cap the packs were made with; set max_tokens)")
    _check_cost_model(cost_model, "recount_metrics")
    if zero_length_skipped is not None and (not _is_int(zero_length_skipped) or zero_length_skipped < 0):
        raise ValueError(f"recount_metrics: zero_length_skipped={_short(zero_length_skipped)} must be None or an "
                         "int >= 0 (set zero_length_skipped)")
    length_of = _per_sample(lengths, "lengths")
    arrival_of = None if arrival is None else _per_sample(arrival, "arrival")
    if isinstance(windows, (str, bytes, Mapping)) or not hasattr(windows, "__iter__"):
        raise InputTypeError(f"recount_metrics: windows={_short(windows)} must be a list of windows, each a list of "
                             "packs")
    acc = MetricsAccumulator(max_tokens)
    last: dict[int, int] = {}
    spans: dict[int, list[tuple[int, int]]] = {}
    for w, packs in enumerate(windows):
        sizes, arr = _check_packs(packs, f"windows[{w}]", allow_empty=True)
        acc.add_window(_costs([n for n in sizes if n], arr, cost_model), int((arr[:, 2] - arr[:, 1]).sum()))
        for sid, s, e in arr.tolist():
            last[sid] = w
            spans.setdefault(sid, []).append((s, e))
    for sid in sorted(last):
        n = _lookup(length_of, sid, "lengths")
        sp = sorted(spans[sid])
        if sp[-1][1] > n or any(s1 < e0 for (_s0, e0), (s1, _e1) in zip(sp, sp[1:])):
            why = (f"a span ends at token {max(e for _s, e in sp)}, past its {n} tokens" if max(e for _s, e in sp) > n
                   else "two spans hold the same tokens (a sample is packed once)")
            raise ValueError(f"recount_metrics: sample {sid}: {why}; its spans: {_short(sp)}")
        delay = 0
        if arrival_of is not None:
            delay = last[sid] - _lookup(arrival_of, sid, "arrival")
            if delay < 0:
                raise ValueError(f"recount_metrics: sample {sid} is in window {last[sid]} but arrival[{sid}] = "
                                 f"{last[sid] - delay}: a sample is emitted in or after the window it arrives in")
        acc.add_sample(delay)
        acc.truncated_tokens += n - sum(e - s for s, e in sp)
    acc.num_split = sum(1 for sp in spans.values() if len(sp) > 1)
    if zero_length_skipped is None:
        values = length_of.values() if isinstance(length_of, dict) else length_of
        zero_length_skipped = sum(1 for v in values if v == 0)
    acc.zero_length_skipped = int(zero_length_skipped)
    return acc.summary()


def _per_sample(values: Any, name: str) -> dict[int, int] | list[int]:
    """``lengths`` / ``arrival``: a mapping sample id -> int >= 0, or a sequence of them (id = position)."""
    if not isinstance(values, Mapping):
        if name == "lengths":
            return check_lengths(values, name).tolist()
        if isinstance(values, (str, bytes, AbstractSet, ValuesView)) or not hasattr(values, "__iter__"):
            raise InputTypeError(f"recount_metrics: {name}={_short(values)} must be None, a list of window indices "
                                 "(ints >= 0, one per sample id) or a mapping sample id -> window index")
        values = {i: v for i, v in enumerate(values.tolist() if isinstance(values, np.ndarray) else values)}
    out = {}
    for k, v in values.items():
        if not _is_int(k) or not _is_int(v):
            raise InputTypeError(f"recount_metrics: {name}[{_short(k)}] = {_short(v)}: {name} must map sample ids "
                                 "(ints) to ints >= 0")
        if not 0 <= v <= MAX_LENGTH:
            raise ValueError(f"recount_metrics: {name}[{int(k)}] = {int(v)} is out of range [0, {MAX_LENGTH}]")
        out[int(k)] = int(v)
    return out


def _lookup(values: dict[int, int] | list[int], sid: int, name: str) -> int:
    if isinstance(values, dict) and sid in values or isinstance(values, list) and 0 <= sid < len(values):
        return values[sid]
    held = f"ids {min(values)}..{max(values)}" if isinstance(values, dict) and values else f"{len(values)} samples"
    raise ValueError(f"recount_metrics: the packs hold sample {sid} but {name} has no entry for it ({name} holds "
                     f"{held}): pass the {name} of every packed sample")


def dataset_metrics(lengths: np.ndarray, spans: np.ndarray, offsets: np.ndarray, config: Any,
                    cost_model: CostModel) -> dict[str, Any]:
    """The metrics :func:`~atac_hf.packing.data.dataset.pack_dataset` returns, of one planned pass."""
    C, P = int(config.max_tokens), int(config.packs_per_window)
    span_len = spans[:, 2] - spans[:, 1]
    tokens = int(span_len.sum())
    num_packs = len(offsets) - 1
    frag = np.bincount(spans[:, 0], minlength=lengths.size)[spans[:, 0]] > 1  # spans of a split sample
    frag_lens = span_len[frag]
    lb = -(-tokens // C)
    costs = pack_costs([spans[offsets[b]:offsets[b + 1]] for b in range(num_packs)], cost_model)
    ratios = [float(costs[i:i + P].max() / costs[i:i + P].mean()) for i in range(0, num_packs, P)]
    q = (np.percentile(frag_lens, [0, 10, 50, 90, 100]) if frag_lens.size else np.zeros(5)).tolist()
    return {
        "num_samples": int((lengths > 0).sum()),
        "num_packs": num_packs,
        "tokens": tokens,
        "lower_bound_packs": lb,
        "packs_vs_lower_bound": num_packs / lb if lb else 1.0,
        "padding": 1.0 - tokens / (num_packs * C) if num_packs else 0.0,
        "num_split": int(np.unique(spans[frag, 0]).size),
        "num_fragments": int(frag.sum()),
        "fragment_lengths": dict(zip(("min", "p10", "median", "p90", "max"), (float(x) for x in q))),
        "imbalance_mean": float(np.mean(ratios)) if ratios else 1.0,
        "imbalance_worst": float(np.max(ratios)) if ratios else 1.0,
    }

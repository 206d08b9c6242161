"""Validation of user input to the packers: every error names the bad value, the legal
values and the setting to change. Numpy only.

One validator per concept, used by every entry point:

* :func:`check_lengths` - sample lengths (token counts): :func:`~atac_hf.packing.stream.pack_lengths`,
  :meth:`StreamPacker.add_window`, ``WFAPBatchSampler``, ``plan_packs``;
* :func:`check_token_ids` - one sample's ``input_ids`` / ``labels`` / ``seq_lengths``:
  ``PackedIterableDataset``, ``PackedDataCollator`` (and ``pack_dataset``'s own checks);
* :func:`check_window` - one window of ``(sample_ids, lengths)`` for the packer;
* :func:`state_int`, :func:`state_list`, :func:`state_bool` - fields of a checkpoint state
  (``ValueError`` naming the field: a truncated or edited checkpoint).

Wrong types raise :class:`InputTypeError`, a ``TypeError`` that is also a ``ValueError``
(these checks raised ``ValueError`` for some of them before); bad values ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet, ValuesView
from typing import Any, Mapping, Sequence

import numpy as np

from .config import MAX_LENGTH, PackingConfig

__all__ = ["InputTypeError", "MAX_FRAGMENTS", "MAX_FRAGMENT_WINDOWS", "MAX_LENGTH", "MAX_TOKEN_ID", "check_dealable",
           "check_lengths", "check_overlength", "check_packer_pool", "check_planner_state", "check_seed",
           "check_token_ids", "check_window", "max_fragments", "state_bool", "state_field_diff", "state_int",
           "state_list", "state_spans"]

MAX_TOKEN_ID = 2**63 - 1  # token ids and labels are int64
# fragments one sample may split into (overlength="split"): 1024 windows of packs_per_window
# full-cap fragments, and 2**14 in all (the packer holds them as items)
MAX_FRAGMENT_WINDOWS, MAX_FRAGMENTS = 1024, 2**14


class InputTypeError(TypeError, ValueError):
    """A value of the wrong type (a ``TypeError``; also a ``ValueError``, so code that
    caught these checks' earlier ``ValueError`` still catches it)."""


def _short(v: Any, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters (a hostile value may be enormous)."""
    if isinstance(v, (list, tuple, dict, set)) and len(v) > 8:
        return f"<{type(v).__name__} of {len(v)} items>"
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 3] + "..."


_UNORDERED = (AbstractSet, ValuesView)  # set, frozenset, dict keys / items / values views


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


class _Msgs:
    """How one validator words its errors (the value's name, its elements', what is legal)."""

    def __init__(self, label: str, item: str, hint: str, flat: str, hint_first: bool = False) -> None:
        self.label, self.item, self.hint, self.flat, self.hint_first = label, item, hint, flat, hint_first
        self.row_ok = flat == "1-D"  # token fields take a (1, n) row, as a batch of one

    def _say(self, what: str) -> str:
        return f"{self.hint}; {what}" if self.hint_first else f"{what}: {self.hint}"

    def not_flat(self, what: str) -> str:
        return f"{self.label} must be a {self.flat} sequence of ints, {what} ({self.hint})"

    def not_int(self, i: int, v: Any, dtype: Any = None) -> str:
        got = f", got dtype {dtype}" if dtype is not None else ""
        return self._say(f"{self.item.format(i=i)} = {_short(v)} is not an int") + got

    def out_of_range(self, i: int, v: Any, lo: int, hi: int) -> str:
        return self._say(f"{self.item.format(i=i)} = {_short(v)} is out of range [{lo}, {hi}]")


class _LengthMsgs(_Msgs):
    def out_of_range(self, i: int, v: Any, lo: int, hi: int) -> str:
        return (f"{self.item.format(i=i)} = {_short(v)} is too long: sample lengths must be token counts "
                f"<= {MAX_LENGTH} (2**40); drop or cut that sample")


def one_row(value: Any) -> bool:
    """Whether a sample's per-token value is a ``(1, n)`` row (a 2-D array or tensor of one row, or a
    list of one list or 1-D array), which the token fields take as its n entries."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return len(shape) == 2 and shape[0] == 1
    return isinstance(value, (list, tuple)) and len(value) == 1 and (
        isinstance(value[0], (list, tuple)) or getattr(value[0], "ndim", 0) == 1)


def _int_array(value: Any, msgs: _Msgs) -> np.ndarray:
    """A flat sequence of ints (Python or numpy ints, numpy/torch int arrays; for token
    fields a (1, n) row is flattened) as a 1-D int64 array; every element checked to fit int64."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not hasattr(value, "__iter__"):
        raise InputTypeError(msgs.not_flat(f"got {type(value).__name__} {_short(value)}"))
    if isinstance(value, _UNORDERED):
        raise InputTypeError(msgs.not_flat(f"got the {type(value).__name__} {_short(value)}, which is not a sequence "
                                           "(a set's order is arbitrary); pass a list or array in data order"))
    lo, hi = -MAX_TOKEN_ID - 1, MAX_TOKEN_ID
    if isinstance(value, np.ndarray):
        arr = value[0] if msgs.row_ok and value.ndim == 2 and value.shape[0] == 1 else value
        if arr.ndim != 1:
            raise InputTypeError(msgs.not_flat(f"got shape {arr.shape}"))
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        if arr.dtype == object:
            return _int_array(arr.tolist(), msgs)
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            i = 0
            if np.issubdtype(arr.dtype, np.floating):
                frac = ~np.isfinite(arr) | (arr != np.floor(arr))
                i = int(np.argmax(frac)) if frac.any() else 0
            raise InputTypeError(msgs.not_int(i, arr[i].item(), arr.dtype))
        if arr.dtype.kind == "u" and arr.dtype.itemsize >= 8 and int(arr.max()) > hi:
            i = int(np.argmax(arr > hi))  # would wrap to a negative int64
            raise ValueError(msgs.out_of_range(i, int(arr[i]), lo, hi))
        return arr.astype(np.int64, copy=False)
    values = list(value)
    if not values:
        return np.zeros(0, dtype=np.int64)
    if msgs.row_ok and len(values) == 1 and isinstance(values[0], (list, tuple, np.ndarray)):
        return _int_array(values[0], msgs)  # a (1, n) row
    plain = not (set(map(type, values)) - {int})
    if not plain:  # find the first element that is not an int
        for i, v in enumerate(values):
            if _is_int(v):
                continue
            if isinstance(v, (list, tuple, np.ndarray)) or (hasattr(v, "__len__") and not isinstance(v, (str, bytes))):
                try:
                    what = f"got shape {np.asarray(values).shape}"
                except (ValueError, TypeError):
                    what = f"got a ragged nested sequence ({msgs.item.format(i=i)} = {_short(v)})"
                raise InputTypeError(msgs.not_flat(what))
            raise InputTypeError(msgs.not_int(i, v))
    if max(values) > hi or min(values) < lo:
        i = next(i for i, v in enumerate(values) if not lo <= v <= hi)
        raise ValueError(msgs.out_of_range(i, values[i], lo, hi))
    return np.array(values if plain else [int(v) for v in values], dtype=np.int64)


def check_lengths(lengths: Any, name: str = "lengths") -> np.ndarray:
    """Sample lengths: a flat sequence of ints in ``[0, MAX_LENGTH]`` (``2**40``).

    Args:
        lengths: list/tuple/numpy array (any integer dtype) of token counts.
        name: how messages name the value (``"lengths"``).

    Returns:
        a 1-D int64 array (empty for an empty input).

    Raises:
        InputTypeError: not a flat sequence, or an element that is not an int (floats,
            bools, strings, ``None``, nested sequences).
        ValueError: a negative length, or one over ``MAX_LENGTH``.
    """
    if isinstance(lengths, (str, bytes, bytearray, Mapping)) or not hasattr(lengths, "__iter__"):
        raise InputTypeError(f"{name} must be a sequence of ints, got {type(lengths).__name__} {_short(lengths)} "
                             "(sample token counts)")
    arr = _int_array(lengths, _LengthMsgs(name, name + "[{i}]", "sample lengths must be integer token counts >= 0",
                                          "flat"))
    if arr.size and arr.min() < 0:
        bad = int(np.argmin(arr))
        raise ValueError(f"{name}[{bad}] = {int(arr[bad])} is negative: sample lengths must be token counts >= 0 "
                         f"(all {name} must be >= 0)")
    if arr.size and arr.max() > MAX_LENGTH:
        bad = int(np.argmax(arr))
        raise ValueError(f"{name}[{bad}] = {int(arr[bad])} is too long: sample lengths must be token counts "
                         f"<= {MAX_LENGTH} (2**40); drop or cut that sample")
    return arr


def check_token_ids(value: Any, *, where: str, field: str) -> np.ndarray:
    """One sample's token field: ``input_ids`` (ints in ``[0, 2**63)``), ``labels``
    (int64; -100 and other negatives allowed) or ``seq_lengths`` (ints >= 0).

    Accepts lists/tuples of ints, numpy integer arrays and torch integer tensors (a
    ``(1, n)`` array is flattened).

    Args:
        value: the field's value.
        where: names the sample in messages (``"feature 0"``, ``"source sample 12"``).
        field: the field's name.

    Returns:
        a 1-D int64 array.

    Raises:
        InputTypeError: a string (text, not token ids), a scalar, ``None``, nested
            sequences, floats or bools.
        ValueError: a value out of range (negative ``input_ids``, beyond int64).
    """
    label = f"{where}: {field}"
    hint = f"{label} must hold ints ({'document lengths' if field == 'seq_lengths' else 'token ids'})"
    if isinstance(value, (str, bytes)):
        raise InputTypeError(f"{label} must be a 1-D sequence of ints, got the {type(value).__name__} "
                             f"{_short(value)}: tokenize the text first")
    arr = _int_array(value, _Msgs(label, f"{field}[{{i}}]", hint, "1-D", hint_first=True))
    if field != "labels" and arr.size and arr.min() < 0:
        i = int(np.argmin(arr))
        raise ValueError(f"{label} has negative entries ({field}[{i}] = {int(arr[i])}): {field} must hold ints >= 0")
    return arr


def max_fragments(config: PackingConfig) -> int:
    """Most fragments one sample may split into: ``min(2**14, 1024 x packs_per_window)``."""
    return min(MAX_FRAGMENTS, MAX_FRAGMENT_WINDOWS * int(config.packs_per_window))


def check_overlength(arr: np.ndarray, ids: Sequence[int], config: PackingConfig) -> None:
    """Refuse samples over ``max_tokens`` under ``overlength="error"``, and (``"split"``)
    samples that would split into more than ``MAX_FRAGMENTS`` fragments."""
    if arr.size == 0 or arr.max() <= config.max_tokens:
        return
    if config.overlength == "split":
        limit = max_fragments(config)
        most = limit * int(config.max_tokens)
        if arr.max() > most:
            k = int(np.argmax(arr > most))
            raise ValueError(
                f"sample {ids[k]} has {int(arr[k])} tokens: split at max_tokens={config.max_tokens} that is "
                f"{-(-int(arr[k]) // int(config.max_tokens))} fragments, more than the {limit} a sample may have "
                f"(min({MAX_FRAGMENTS}, {MAX_FRAGMENT_WINDOWS} x packs_per_window)); raise max_tokens, set "
                "overlength='truncate', or drop the sample"
            )
        return
    if config.overlength != "error":
        return
    k = int(np.argmax(arr > config.max_tokens))
    raise ValueError(
        f"sample {ids[k]} has {int(arr[k])} tokens, more than max_tokens={config.max_tokens}, and "
        f"overlength='error'; set overlength to 'split' or 'truncate', or raise max_tokens"
    )


def check_window(sample_ids: Sequence[int], lengths: Sequence[int], config: PackingConfig) -> tuple[list[int], list[int]]:
    lens = check_lengths(lengths, "lengths")
    if isinstance(sample_ids, (str, bytes, Mapping)) or not hasattr(sample_ids, "__iter__"):
        raise InputTypeError(f"sample_ids must be ints (a sequence of them), got {type(sample_ids).__name__}")
    ids_arr = _int_array(sample_ids, _Msgs("sample_ids", "sample_ids[{i}]", "sample_ids must be ints, unique",
                                           "flat", hint_first=True))
    if ids_arr.size != lens.size:
        raise ValueError(f"got {ids_arr.size} sample_ids but {lens.size} lengths: pass one length per sample id")
    ids = ids_arr.tolist()
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise ValueError(f"sample id {dup} appears twice in one window; sample ids must be unique")
    check_overlength(lens, ids, config)
    return ids, lens.tolist()


# ---------------------------------------------------------------------------- checkpoint states
def _where(what: str) -> str:
    return f"malformed {what} state"


def state_field_diff(saved: Any, have: Mapping[str, Any], limit: int = 300) -> str:
    """The fields of a saved state's object (``saved``) that differ from ``have``, for messages: each
    ``name=saved (this packer: have)``, ``-`` for a field only one of them has (a state of another version)."""
    got = saved if isinstance(saved, Mapping) else {}
    diff = ", ".join(f"{str(k)[:40]}={got.get(k, '-')!r:.40} (this packer: {have.get(k, '-')!r})"
                     for k in {**have, **got} if k not in have or k not in got or got[k] != have[k])
    return diff[:limit]


def state_int(state: Mapping[str, Any], key: str, what: str, lo: int | None = 0, hi: int | None = None) -> int:
    """``state[key]`` as an int in ``[lo, hi]`` (bounds ``None``: open); ``ValueError`` naming the field."""
    if key not in state:
        raise ValueError(f"{_where(what)}: field {key!r} is missing (a truncated or edited checkpoint? resume from "
                         "an intact one)")
    return state_value_int(state[key], f"{key!r}", what, lo, hi)


def state_value_int(v: Any, name: str, what: str, lo: int | None = 0, hi: int | None = None) -> int:
    if not _is_int(v):
        raise ValueError(f"{_where(what)}: {name} = {_short(v)} is not an int (a truncated or edited checkpoint?)")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise ValueError(f"{_where(what)}: {name} = {int(v)} is outside {rng} (a truncated or edited checkpoint?)")
    return int(v)


def state_bool(state: Mapping[str, Any], key: str, what: str) -> bool:
    if key not in state:
        raise ValueError(f"{_where(what)}: field {key!r} is missing (a truncated or edited checkpoint?)")
    v = state[key]
    if not isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{_where(what)}: {key!r} = {_short(v)} must be true or false (a truncated or edited "
                         "checkpoint?)")
    return bool(v)


def state_list(state: Mapping[str, Any], key: str, what: str) -> list[Any]:
    if key not in state:
        raise ValueError(f"{_where(what)}: field {key!r} is missing (a truncated or edited checkpoint?)")
    v = state[key]
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{_where(what)}: {key!r} = {_short(v)} must be a list (a truncated or edited checkpoint?)")
    return list(v)


def check_packer_pool(pool_state: Any, open_state: Any, *, window: int, seq: int,
                      max_tokens: int) -> tuple[list[tuple[int, ...]], dict[int, list[int]]]:
    """The carried pool and open split samples of a packer state, checked for internal
    consistency: every item ``(sample, start, end, arrival, seq, frag)`` is ints with
    ``0 <= start < end``, at most ``max_tokens`` long, ``arrival <= window``, ``seq`` below
    the state's ``seq`` and ``frag`` 0 or 1; one sample has one ``seq`` and vice versa; a
    whole (``frag=0``) sample is one item and not open; a split sample is open, its
    fragments do not overlap and hold exactly the tokens its open record has left.

    Returns:
        ``(pool, open)`` as the packer holds them.

    Raises:
        ValueError: the first inconsistency, naming the field and the item.
    """
    what = "StreamPacker"
    if not isinstance(pool_state, (list, tuple)):
        raise ValueError(f"{_where(what)}: 'pool' = {_short(pool_state)} must be a list of items")
    if not isinstance(open_state, (list, tuple)):
        raise ValueError(f"{_where(what)}: 'open' = {_short(open_state)} must be a list of [sample, left, delay]")
    pool: list[tuple[int, ...]] = []
    for k, it in enumerate(pool_state):
        if not isinstance(it, (list, tuple)) or len(it) != 6 or not all(_is_int(x) for x in it):
            raise ValueError(f"{_where(what)}: pool[{k}] = {_short(it)}: pool items must be (sample, start, end, "
                             "arrival, seq, frag) ints")
        sid, start, end, arrival, sq, frag = (int(x) for x in it)
        if not 0 <= start < end or end - start > max_tokens or not 0 <= arrival <= window \
                or not 0 <= sq < seq or frag not in (0, 1):
            raise ValueError(
                f"{_where(what)}: pool[{k}] = {_short(it)}: pool items must have 0 <= start < end, end - start <= "
                f"max_tokens={max_tokens}, 0 <= arrival <= window={window}, 0 <= seq < {seq} and frag 0 or 1")
        pool.append((sid, start, end, arrival, sq, frag))
    open_: dict[int, list[int]] = {}
    for k, rec in enumerate(open_state):
        if not isinstance(rec, (list, tuple)) or len(rec) != 3 or not all(_is_int(x) for x in rec) \
                or rec[1] < 1 or not 0 <= rec[2] <= window:
            raise ValueError(f"{_where(what)}: open[{k}] = {_short(rec)} must be [sample, tokens left >= 1, "
                             f"delay in [0, {window}]] ints")
        if int(rec[0]) in open_:
            raise ValueError(f"{_where(what)}: open[{k}]: sample {int(rec[0])} is open twice")
        open_[int(rec[0])] = [int(rec[1]), int(rec[2])]
    seq_of: dict[int, int] = {}
    sid_of: dict[int, int] = {}
    spans: dict[int, list[tuple[int, int, int]]] = {}
    for k, (sid, start, end, _arr, sq, frag) in enumerate(pool):
        if seq_of.setdefault(sid, sq) != sq or sid_of.setdefault(sq, sid) != sid:
            raise ValueError(f"{_where(what)}: pool[{k}]: sample {sid} and seq {sq} do not match the other items "
                             "(one sample, one seq)")
        if frag != (sid in open_):
            raise ValueError(f"{_where(what)}: pool[{k}]: sample {sid} has frag={frag} but is "
                             f"{'' if sid in open_ else 'not '}an open split sample")
        spans.setdefault(sid, []).append((start, end, k))
    for sid, sp in spans.items():
        sp.sort()
        if sid not in open_ and len(sp) > 1:
            raise ValueError(f"{_where(what)}: pool[{sp[1][2]}]: whole sample {sid} appears {len(sp)} times")
        for (s0, e0, _k0), (s1, _e1, k1) in zip(sp, sp[1:]):
            if s1 < e0:
                raise ValueError(f"{_where(what)}: pool[{k1}]: sample {sid}'s fragments overlap (the same tokens "
                                 "twice)")
    for sid, (left, _delay) in open_.items():
        held = sum(e - s for s, e, _k in spans.get(sid, []))
        if held != left:
            raise ValueError(f"{_where(what)}: open split sample {sid} has {left} tokens left but the pool holds "
                             f"{held} of them (a truncated or edited checkpoint?)")
    return pool, open_


def check_seed(value: Any, name: str) -> int:
    """A shuffle seed or epoch: an int in ``[0, 2**63)`` (numpy's generator refuses negatives)."""
    if not _is_int(value):
        raise InputTypeError(f"{name}={_short(value)} is not an int: {name} must be an int >= 0 (set {name})")
    if not 0 <= value < 2**63:
        raise ValueError(f"{name}={int(value)} is invalid: it must be an int in [0, 2**63) (set {name})")
    return int(value)


def check_dealable(lengths: np.ndarray, config: PackingConfig, num_replicas: int, even_batches: bool) -> None:
    """Refuse a pass that cannot be dealt to ``num_replicas`` replicas in equal batch counts
    without repeating a batch: fewer kept tokens than replicas, or (``max_tokens=1``, one
    token per pack) a token count that is not a multiple of them. Every other pass can
    (:meth:`WindowPlanner._even_out`)."""
    if not even_batches or num_replicas <= 1:
        return
    cap = int(config.max_tokens)
    kept = np.minimum(lengths, cap) if config.overlength == "truncate" else lengths
    total = int(kept.sum())
    if total < num_replicas or (cap == 1 and total % num_replicas):
        why = (f"fewer tokens ({total}) than replicas" if total < num_replicas else
               f"{total} tokens at max_tokens=1 (one token per batch) do not divide evenly")
        raise ValueError(
            f"even_batches: this pass cannot be dealt to num_replicas={num_replicas} in equal batch counts without "
            f"repeating a batch (which trains samples twice): {why}; use fewer replicas, more data or a larger "
            "max_tokens, or set even_batches=False to let Accelerate repeat batches (build_packed_dataloader / "
            "ATACAccelerator.packed_dataloader; ATACTrainer always deals evenly)"
        )


def state_spans(value: Any, name: str, what: str) -> list[tuple[int, int, int]]:
    """A pack from a state: a non-empty list of ``[sample, start, end]`` ints, ``0 <= start < end``."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"malformed {what} state: {name} = {_short(value)} must be a non-empty list of "
                         "[sample, start, end] spans")
    out = []
    for j, sp in enumerate(value):
        if not isinstance(sp, (list, tuple)) or len(sp) != 3 or not all(_is_int(x) for x in sp) \
                or not 0 <= sp[1] < sp[2] <= MAX_LENGTH:
            raise ValueError(f"malformed {what} state: {name}[{j}] = {_short(sp)} must be a span [sample, start, "
                             "end] of ints with 0 <= start < end")
        out.append((int(sp[0]), int(sp[1]), int(sp[2])))
    return out


def check_planner_state(state: Any, num_replicas: int,
                        max_tokens: int) -> tuple[bool, int, list[float], list[list[tuple[int, int, int]]]]:
    """Check a :meth:`WindowPlanner.state_dict` (all but the packer's own state, which
    :meth:`StreamPacker.load_state_dict` checks); ``ValueError`` naming the field."""
    what = "window planner"
    if not isinstance(state, Mapping):
        raise ValueError(f"malformed {what} state: expected a mapping, got {type(state).__name__}")
    prev_empty = state_bool(state, "prev_empty", what)
    num_batches = state_int(state, "num_batches", what, 0)
    loads = state_list(state, "loads", what)
    if len(loads) != num_replicas:
        raise ValueError(f"window planner state has {len(loads)} replica loads, expected {num_replicas}")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
               for x in loads):
        raise ValueError(f"malformed {what} state: 'loads' = {_short(loads)} must be finite numbers >= 0")
    reserve = [state_spans(p, f"'reserve'[{i}]", what) for i, p in enumerate(state_list(state, "reserve", what))]
    for i, p in enumerate(reserve):
        if sum(e - s for _, s, e in p) > max_tokens:
            raise ValueError(f"malformed {what} state: 'reserve'[{i}] holds {sum(e - s for _, s, e in p)} tokens, more than "
                             f"max_tokens={max_tokens}")
    seen: dict[int, list[tuple[int, int]]] = {}
    for p in reserve:
        for sid, a, b in p:
            seen.setdefault(sid, []).append((a, b))
    for sid, sp in seen.items():
        sp.sort()
        if any(s1 < e0 for (_s0, e0), (s1, _e1) in zip(sp, sp[1:])):
            raise ValueError(f"malformed {what} state: 'reserve' holds tokens of sample {sid} twice")
    if not isinstance(state.get("packer"), Mapping):
        raise ValueError(f"malformed {what} state: 'packer' must hold the packer state")
    return prev_empty, num_batches, [float(x) for x in loads], reserve

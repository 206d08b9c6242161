"""Validation of user input to the packers: every error names the bad value, the legal
values and the setting to change. Numpy only."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .config import PackingConfig

__all__ = ["check_lengths", "check_overlength", "check_window"]


def check_lengths(lengths: Any, name: str) -> np.ndarray:
    if isinstance(lengths, (str, bytes, Mapping)):
        raise TypeError(f"{name} must be a sequence of ints, got {type(lengths).__name__}")
    values = lengths if isinstance(lengths, np.ndarray) else list(lengths)
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged nesting
        raise ValueError(f"{name} must be a flat sequence of ints") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of ints, got shape {arr.shape}")
    bools = arr.dtype == bool or (not isinstance(values, np.ndarray)
                                  and any(isinstance(v, (bool, np.bool_)) for v in values))
    if bools or not np.issubdtype(arr.dtype, np.integer):
        items = values.tolist() if isinstance(values, np.ndarray) else values
        bad = next((i for i, v in enumerate(items)
                    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))), 0)
        raise TypeError(
            f"{name}[{bad}] = {items[bad]!r} is not an int: sample lengths must be integer token counts >= 0"
        )
    if arr.min() < 0:
        bad = int(np.argmin(arr))
        raise ValueError(f"{name}[{bad}] = {int(arr[bad])} is negative: sample lengths must be token counts >= 0")
    return arr.astype(np.int64)


def check_overlength(arr: np.ndarray, ids: Sequence[int], config: PackingConfig) -> None:
    if config.overlength != "error" or arr.size == 0 or arr.max() <= config.max_tokens:
        return
    k = int(np.argmax(arr > config.max_tokens))
    raise ValueError(
        f"sample {ids[k]} has {int(arr[k])} tokens, more than max_tokens={config.max_tokens}, and "
        f"overlength='error'; set overlength to 'split' or 'truncate', or raise max_tokens"
    )


def check_window(sample_ids: Sequence[int], lengths: Sequence[int], config: PackingConfig) -> tuple[list[int], list[int]]:
    lens = check_lengths(lengths, "lengths")
    ids_arr = np.asarray(list(sample_ids))
    if ids_arr.size != lens.size:
        raise ValueError(f"got {ids_arr.size} sample_ids but {lens.size} lengths: pass one length per sample id")
    if ids_arr.size and (ids_arr.dtype == bool or not np.issubdtype(ids_arr.dtype, np.integer)):
        raise TypeError(f"sample_ids must be ints, got {ids_arr.tolist()[:3]!r}...")
    ids = [int(i) for i in ids_arr.tolist()]
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise ValueError(f"sample id {dup} appears twice in one window; sample ids must be unique")
    check_overlength(lens, ids, config)
    return ids, lens.tolist()


"""Sample-length workloads for the simulator: built-in parametric mixes, a JSON array
of lengths, or a length column of a ``datasets.Dataset`` (imported lazily).

Built-in workloads (no files needed; lengths in tokens, deterministic for a seed):

``longtail``  pretraining-like: a lognormal bulk (median ~3.2K) plus a Pareto tail
              (0.9% of documents over 32K carrying ~14% of tokens and ~65% of the
              squared lengths, capped at 128K), shaped after the ``wlbllm`` sample in
              ``shared/workloads`` (median 3.2K, p99 26K).
``sft``       chat/SFT-like: lognormal, median ~700, capped at 16K.
``uniform``   uniform in [128, 8192]: a control with little cost skew.

A workload *spec* is a built-in name, a path to a ``.json`` file holding an array
of ints, or ``dataset:<path-or-hub-name>[:<column>]`` (column default ``length``;
a column of token lists is measured with ``len``).

Numpy only (``datasets`` only for ``dataset:`` specs).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import numpy as np

__all__ = ["BUILTIN_WORKLOADS", "load_workload", "lengths_from_json", "lengths_from_dataset", "sample_stream",
           "workload_name"]


def _longtail(n: int, rng: np.random.Generator) -> np.ndarray:
    bulk = rng.lognormal(mean=np.log(3200.0), sigma=0.7, size=n)
    tail = 16384.0 * (1.0 + rng.pareto(1.3, size=n))  # 2% of documents; 40% of those over 32K
    out = np.where(rng.random(n) < 0.02, tail, bulk)
    return np.clip(np.rint(out), 16, 131072).astype(np.int64)


def _sft(n: int, rng: np.random.Generator) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(mean=np.log(700.0), sigma=1.0, size=n)), 8, 16384).astype(np.int64)


def _uniform(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(128, 8193, size=n, dtype=np.int64)


BUILTIN_WORKLOADS: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "longtail": _longtail,
    "sft": _sft,
    "uniform": _uniform,
}


def lengths_from_json(path: str | os.PathLike) -> np.ndarray:
    """Read a JSON array of positive ints.

    Raises:
        ValueError: a missing file, invalid JSON, an empty array, or a non-positive /
            non-integer entry (naming the workload path setting).
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"workload file {path!r} does not exist (check the workload setting)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"workload file {path!r} is not valid JSON ({e}); it must hold an array of ints") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"workload file {path!r} must hold a non-empty JSON array of positive ints "
                         f"(got {type(data).__name__}{' of length 0' if isinstance(data, list) else ''})")
    bad = next((i for i, x in enumerate(data) if isinstance(x, bool) or not isinstance(x, int) or x < 1), None)
    if bad is not None:
        raise ValueError(f"workload file {path!r}: entry {bad} is {data[bad]!r}; every entry must be an int >= 1")
    return np.asarray(data, dtype=np.int64)


def lengths_from_dataset(dataset: Any, column: str = "length") -> np.ndarray:
    """Lengths from a column of a ``datasets.Dataset`` (ints, or token lists measured with ``len``).

    ``dataset`` may be a loaded dataset or a path / hub name (``load_from_disk`` is
    tried first, then ``load_dataset(..., split="train")``).

    Raises:
        ValueError: the column does not exist or yields no positive lengths.
    """
    if isinstance(dataset, (str, os.PathLike)):
        import datasets  # lazy: only dataset workloads need it

        path = os.fspath(dataset)
        dataset = datasets.load_from_disk(path) if os.path.isdir(path) else datasets.load_dataset(path, split="train")
    names = list(getattr(dataset, "column_names", []) or [])
    if column not in names:
        raise ValueError(f"dataset has no column {column!r}; available columns: {names} (set the workload column)")
    col = dataset[column]
    if len(col) and not isinstance(col[0], (int, np.integer)):
        col = [len(x) for x in col]
    arr = np.asarray(col, dtype=np.int64)
    arr = arr[arr > 0]
    if arr.size == 0:
        raise ValueError(f"dataset column {column!r} holds no positive lengths")
    return arr


def load_workload(spec: str, *, num_samples: int = 50_000, seed: int = 0) -> np.ndarray:
    """Lengths of a workload spec (see module doc).

    Built-ins draw ``num_samples`` lengths; files and datasets return every length they hold.

    Raises:
        ValueError: an unknown name, or a bad file / dataset.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"workload={spec!r}: give a built-in name {sorted(BUILTIN_WORKLOADS)}, a .json path "
                         "or dataset:<path>[:<column>]")
    if spec in BUILTIN_WORKLOADS:
        if num_samples < 1:
            raise ValueError(f"num_samples={num_samples!r} must be >= 1")
        return BUILTIN_WORKLOADS[spec](int(num_samples), np.random.default_rng([seed, 0x57A7]))
    if spec.startswith("dataset:"):
        rest = spec[len("dataset:"):]
        path, _, column = rest.rpartition(":") if rest.count(":") and not os.path.exists(rest) else (rest, "", "")
        return lengths_from_dataset(path, column or "length")
    if spec.endswith(".json") or os.path.exists(spec):
        return lengths_from_json(spec)
    raise ValueError(f"unknown workload {spec!r}; legal values: built-ins {sorted(BUILTIN_WORKLOADS)}, "
                     "a path to a .json array of lengths, or dataset:<path>[:<column>]")


def workload_name(spec: str) -> str:
    """A short label for reports (file stem for paths)."""
    if spec in BUILTIN_WORKLOADS:
        return spec
    base = os.path.basename(spec.split(":")[1] if spec.startswith("dataset:") else spec)
    return base[:-5] if base.endswith(".json") else base


def sample_stream(lengths: np.ndarray, num_tokens: int, seed: int = 0) -> np.ndarray:
    """A shuffled stream of sample lengths holding at least ``num_tokens`` tokens.

    Lengths are drawn without replacement (a seeded permutation), cycling through
    fresh permutations if the pool is too small. Every strategy is fed this stream.
    """
    pool = np.asarray(lengths, dtype=np.int64)
    if pool.size == 0:
        raise ValueError("the workload holds no lengths")
    rng = np.random.default_rng([seed, 0x5EED])
    parts, total = [], 0
    while total < num_tokens:
        perm = pool[rng.permutation(pool.size)]
        need = int(np.searchsorted(np.cumsum(perm), num_tokens - total)) + 1
        parts.append(perm[:need])
        total += int(perm[:need].sum())
    return np.concatenate(parts)

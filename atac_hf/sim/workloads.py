"""Workload sources for the simulator: the built-in parametric mixes of
:mod:`atac_hf.workloads` (``longtail``, ``sft``, ``uniform``), a JSON array of lengths,
or a length column of a ``datasets.Dataset`` (imported lazily).

A workload *spec* is a built-in name, a path to a ``.json`` file holding an array
of ints, or ``dataset:<path-or-hub-name>[:<column>]`` (column default ``length``;
a column of token lists is measured with ``len``). Zero-length samples are dropped
(packers skip them anyway).

Numpy only (``datasets`` only for ``dataset:`` specs).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..workloads import WORKLOADS, load_lengths, make_workload

__all__ = ["BUILTIN_WORKLOADS", "load_workload", "lengths_from_json", "lengths_from_dataset", "sample_stream",
           "workload_name"]

BUILTIN_WORKLOADS = WORKLOADS


def lengths_from_json(path: str | os.PathLike) -> np.ndarray:
    """Read a JSON array of sample lengths (:func:`atac_hf.workloads.load_lengths`), zeros dropped.

    Raises:
        ValueError: a missing file, invalid JSON, not an array, a negative / non-integer
            entry, or no positive length at all (naming the workload setting).
    """
    arr = load_lengths(path)
    arr = arr[arr > 0]
    if arr.size == 0:
        raise ValueError(f"workload file {os.fspath(path)!r} must hold a non-empty JSON array of positive ints "
                         "(check the workload setting)")
    return arr


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
        return make_workload(spec, num_samples, seed=seed)
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

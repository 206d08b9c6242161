"""Workloads: sample-length distributions for the packers, planners and simulator.

Sources, all deterministic:

* built-in parametric mixes (:data:`WORKLOADS`, drawn by :func:`make_workload`):

  * ``longtail``: a pretraining-like mix shaped after the ``wlbllm`` sample (median 3,227,
    p99 26,058, max 124,913; documents over 32K are ~0.9% of documents and ~17% of tokens):
    a lognormal bulk (median 3.2K), a log-uniform middle tail (6K-28K) and a uniform long
    tail (32K-125K). Measured with seed 0 and 100,000 samples: median 3,242, p99 26,836,
    max 124,887; documents over 32K are 0.95% of documents and 17.0% of tokens.
  * ``sft``: instruction-tuning-like: a lognormal (median ~700 tokens) with a few long
    conversations (log-uniform up to 32K).
  * ``uniform``: lengths uniform in ``[1, max_len]``.

* shipped samples (:data:`SAMPLES`): ``wlbllm``, 99,519 document lengths from the DistCA
  simulator (Apache-2.0; see ``atac_hf/workload_data/README.md``);
* a JSON array of lengths (``.json``, or gzip-compressed ``.json.gz``);
* a length column of a ``datasets.Dataset`` (``dataset:<path-or-hub-name>[:<column>]``,
  column default ``length``; a column of token lists is measured with ``len``).

A workload *spec* (:func:`load_workload`) names any of these. Zero-length samples are
dropped from files and datasets (packers skip them anyway).

Numpy only (``datasets`` only for ``dataset:`` specs).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from ._io import load_json

__all__ = ["BUILTIN_WORKLOADS", "SAMPLES", "WORKLOADS", "describe_lengths", "lengths_from_dataset",
           "lengths_from_json", "load_lengths", "load_workload", "longtail_lengths", "make_workload",
           "sample_path", "sample_stream", "sft_lengths", "uniform_lengths", "workload_name"]

#: Length samples shipped with the package: name -> file in ``atac_hf/workload_data``.
SAMPLES: dict[str, str] = {"wlbllm": "wlbllm_doc_lengths.json.gz"}


def sample_path(name: str) -> str:
    """Path of a shipped length sample (a key of :data:`SAMPLES`)."""
    if name not in SAMPLES:
        raise ValueError(f"unknown length sample {name!r}; legal values: {sorted(SAMPLES)}")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "workload_data", SAMPLES[name])


def longtail_lengths(num_samples: int, *, seed: int = 0, max_len: int = 125_000) -> np.ndarray:
    """Pretraining-like long-tail lengths (see the module doc)."""
    rng = np.random.default_rng([seed, 1])
    u = rng.random(num_samples)
    bulk = np.exp(rng.normal(np.log(3200.0), 0.45, num_samples))
    mid = 6144.0 * np.exp(rng.random(num_samples) * np.log(28672.0 / 6144.0))
    long = rng.uniform(32768.0, max(max_len, 32769), num_samples)
    p_long, p_mid = 0.0095, 0.011
    x = np.where(u < p_long, long, np.where(u < p_long + p_mid, mid, bulk))
    return np.clip(np.round(x), 1, max_len).astype(np.int64)


def sft_lengths(num_samples: int, *, seed: int = 0, max_len: int = 32_768) -> np.ndarray:
    """Instruction-tuning-like lengths: mostly short, a few long conversations."""
    rng = np.random.default_rng([seed, 2])
    u = rng.random(num_samples)
    short = np.exp(rng.normal(np.log(700.0), 0.9, num_samples))
    long = 4096.0 * np.exp(rng.random(num_samples) * np.log(max(max_len, 4097) / 4096.0))
    x = np.where(u < 0.02, long, short)
    return np.clip(np.round(x), 16, max_len).astype(np.int64)


def uniform_lengths(num_samples: int, *, seed: int = 0, max_len: int = 16_384) -> np.ndarray:
    """Lengths uniform in ``[1, max_len]``."""
    rng = np.random.default_rng([seed, 3])
    return rng.integers(1, max_len + 1, num_samples, dtype=np.int64)


WORKLOADS: dict[str, Callable[..., np.ndarray]] = {
    "longtail": longtail_lengths,
    "sft": sft_lengths,
    "uniform": uniform_lengths,
}


BUILTIN_WORKLOADS = WORKLOADS


def make_workload(name: str, num_samples: int = 100_000, *, seed: int = 0, max_len: int | None = None) -> np.ndarray:
    """Lengths of a built-in workload.

    Args:
        name: one of :data:`WORKLOADS`.
        num_samples: how many lengths (>= 1).
        seed: random seed (same seed, same lengths).
        max_len: longest sample (default: the workload's own).

    Raises:
        ValueError: unknown name, ``num_samples < 1`` or ``max_len < 1``.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; legal values: {sorted(WORKLOADS)} (set --workload)")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be an int >= 1 (set --num-samples)")
    kwargs: dict[str, Any] = {"seed": int(seed)}
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
            raise ValueError(f"max_len={max_len!r} must be an int >= 1")
        kwargs["max_len"] = int(max_len)
    return WORKLOADS[name](int(num_samples), **kwargs)


def load_lengths(path: str | os.PathLike) -> np.ndarray:
    """Read a JSON array of sample lengths (ints >= 0; ``.json`` or gzip-compressed ``.json.gz``).

    Raises:
        ValueError: missing file, invalid JSON, not a flat array, or a bad entry (named
            by index).
    """
    path = os.fspath(path)
    data = load_json(path, "lengths file", "--lengths")
    if not isinstance(data, list):
        raise ValueError(f"lengths file {path!r} must hold a JSON array of ints, got a {type(data).__name__}")
    for i, v in enumerate(data):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"lengths file {path!r}: entry {i} is {v!r}, not an int (sample lengths are token counts)")
        if v < 0:
            raise ValueError(f"lengths file {path!r}: entry {i} is {v}, a negative length")
    return np.asarray(data, dtype=np.int64)


def describe_lengths(lengths: Any, long_threshold: int = 32_768) -> dict[str, float]:
    """Shape of a length distribution: count, tokens, median, p99, max, and the share of
    samples and tokens above ``long_threshold``."""
    a = np.asarray(lengths, dtype=np.int64)
    if a.size == 0:
        raise ValueError("describe_lengths got no lengths")
    long = a > long_threshold
    total = int(a.sum())
    return {
        "num_samples": int(a.size),
        "tokens": total,
        "median": float(np.median(a)),
        "p99": float(np.percentile(a, 99)),
        "max": int(a.max()),
        "long_sample_share": float(long.mean()),
        "long_token_share": float(a[long].sum() / total) if total else 0.0,
    }


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


#: Local data files that ``datasets`` reads with a builder of their format.
_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}


def lengths_from_dataset(dataset: Any, column: str = "length") -> np.ndarray:
    """Lengths from a column of a ``datasets.Dataset`` (ints, or token lists measured with ``len``).

    ``dataset`` may be a loaded dataset or a path / hub name: a directory is read with
    ``load_from_disk``, a local ``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv`` / ``.arrow`` file
    with its format's builder, anything else with ``load_dataset(..., split="train")``.

    Raises:
        ValueError: the column does not exist or yields no positive lengths.
    """
    if isinstance(dataset, (str, os.PathLike)):
        import datasets  # lazy: only dataset workloads need it

        path = os.fspath(dataset)
        builder = _FILE_BUILDERS.get(os.path.splitext(path)[1].lower()) if os.path.isfile(path) else None
        if os.path.isdir(path):
            dataset = datasets.load_from_disk(path)
        elif builder is not None:  # a local data file: its format's builder, not a hub name
            dataset = datasets.load_dataset(builder, data_files=path, split="train")
        else:
            dataset = datasets.load_dataset(path, split="train")
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
    """Lengths of a workload spec (see the module doc).

    Built-in mixes draw ``num_samples`` lengths; shipped samples, files and datasets return
    every length they hold.

    Raises:
        ValueError: an unknown name, or a bad file / dataset.
    """
    legal = (f"legal values: built-ins {sorted(WORKLOADS)}, shipped samples {sorted(SAMPLES)}, a path to a "
             ".json array of lengths, or dataset:<path>[:<column>]")
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"workload={spec!r}: {legal}")
    if spec in WORKLOADS:
        return make_workload(spec, num_samples, seed=seed)
    if spec in SAMPLES:
        return lengths_from_json(sample_path(spec))
    if spec.startswith("dataset:"):
        rest = spec[len("dataset:"):]
        path, _, column = rest.rpartition(":") if rest.count(":") and not os.path.exists(rest) else (rest, "", "")
        return lengths_from_dataset(path, column or "length")
    if spec.endswith((".json", ".json.gz")) or os.path.exists(spec):
        return lengths_from_json(spec)
    raise ValueError(f"unknown workload {spec!r}; {legal}")


def workload_name(spec: str) -> str:
    """A short label for reports (file stem for paths)."""
    if spec in WORKLOADS or spec in SAMPLES:
        return spec
    base = os.path.basename(spec.split(":")[1] if spec.startswith("dataset:") else spec)
    for ext in (".json.gz", ".json"):
        if base.endswith(ext):
            return base[: -len(ext)]
    return base


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

"""Built-in parametric workloads (sample length distributions) and a loader for length files.

* ``longtail``: a pretraining-like mix shaped after the WLB-LLM length sample
  (``../shared/workloads/wlbllm_doc_lengths.json``: median 3,227, p99 26,058, max 124,913;
  documents over 32K are ~0.9% of documents and ~17% of tokens): a lognormal bulk
  (median 3.2K), a log-uniform middle tail (6K-28K) and a uniform long tail (32K-125K).
  Measured with seed 0 and 100,000 samples: median 3,242, p99 26,836, max 124,887;
  documents over 32K are 0.95% of documents and 17.0% of tokens.
* ``sft``: instruction-tuning-like: a lognormal (median ~700 tokens) with a few long
  conversations (log-uniform up to 32K).
* ``uniform``: lengths uniform in ``[1, max_len]``.

Everything is deterministic from ``seed``. Numpy only.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from ._io import load_json

__all__ = ["WORKLOADS", "make_workload", "longtail_lengths", "sft_lengths", "uniform_lengths", "load_lengths",
           "describe_lengths"]


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
    """Read a JSON array of sample lengths (ints >= 0).

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

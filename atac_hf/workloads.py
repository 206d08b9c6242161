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
dropped from files and datasets (packers skip them anyway); a file or a dataset column holds
at most :data:`MAX_NUM_SAMPLES` lengths, each an int from 0 to :data:`MAX_SAMPLE_LENGTH`.

Numpy only (``datasets`` only for ``dataset:`` specs).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import numpy as np

from ._io import load_json
from .packing.validate import InputTypeError, check_lengths, check_seed

__all__ = ["BUILTIN_WORKLOADS", "MAX_NUM_SAMPLES", "MAX_SAMPLE_LENGTH", "SAMPLES", "WORKLOADS", "describe_lengths", "lengths_from_dataset",
           "lengths_from_json", "load_lengths", "load_workload", "longtail_lengths", "make_workload",
           "sample_path", "sample_stream", "sft_lengths", "uniform_lengths", "workload_name"]

#: Most lengths a workload may hold (a built-in's ``--num-samples``, a lengths file, a dataset column).
MAX_NUM_SAMPLES = 10_000_000
#: Longest sample length accepted from a file or a dataset (``atac_hf.packing.config.MAX_LENGTH``, 2**40).
MAX_SAMPLE_LENGTH = 2**40

#: Length samples shipped with the package: name -> file in ``atac_hf/workload_data``.
SAMPLES: dict[str, str] = {"wlbllm": "wlbllm_doc_lengths.json.gz"}


def sample_path(name: str) -> str:
    """Path of a shipped length sample (a key of :data:`SAMPLES`)."""
    if name not in SAMPLES:
        raise ValueError(f"unknown length sample {name!r}; legal values: {sorted(SAMPLES)}")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "workload_data", SAMPLES[name])


def _check_draw(num_samples: Any, seed: Any, max_len: Any) -> None:
    """The arguments of a built-in generator: ``num_samples`` an int >= 0, ``seed`` as
    :func:`~atac_hf.packing.validate.check_seed`, ``max_len`` an int from 1 to :data:`MAX_SAMPLE_LENGTH`."""
    for name, v, low, high in (("num_samples", num_samples, 0, MAX_NUM_SAMPLES),
                               ("max_len", max_len, 1, MAX_SAMPLE_LENGTH)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise InputTypeError(f"{name}={_short(v)} is not an int: {name} must be an int from {low} to {high} "
                                 f"(set {name})")
        if not low <= v <= high:
            raise ValueError(f"{name}={_short(int(v))} is invalid: {name} must be an int from {low} to {high} "
                             f"(set {name})")
    check_seed(seed, "seed")


def longtail_lengths(num_samples: int, *, seed: int = 0, max_len: int = 125_000) -> np.ndarray:
    """Pretraining-like long-tail lengths (see the module doc)."""
    _check_draw(num_samples, seed, max_len)
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
    _check_draw(num_samples, seed, max_len)
    rng = np.random.default_rng([seed, 2])
    u = rng.random(num_samples)
    short = np.exp(rng.normal(np.log(700.0), 0.9, num_samples))
    long = 4096.0 * np.exp(rng.random(num_samples) * np.log(max(max_len, 4097) / 4096.0))
    x = np.where(u < 0.02, long, short)
    return np.clip(np.round(x), 16, max_len).astype(np.int64)


def uniform_lengths(num_samples: int, *, seed: int = 0, max_len: int = 16_384) -> np.ndarray:
    """Lengths uniform in ``[1, max_len]``."""
    _check_draw(num_samples, seed, max_len)
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
        ValueError: unknown name, ``num_samples < 1``, ``max_len < 1`` or a bad ``seed`` (as
            :func:`~atac_hf.packing.validate.check_seed`: an int in ``[0, 2**63)``).
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; legal values: {sorted(WORKLOADS)} (set --workload)")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be an int >= 1 (set --num-samples)")
    kwargs: dict[str, Any] = {"seed": check_seed(seed, "seed")}
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
            raise ValueError(f"max_len={max_len!r} must be an int >= 1")
        kwargs["max_len"] = int(max_len)
    return WORKLOADS[name](int(num_samples), **kwargs)


def load_lengths(path: str | os.PathLike, setting: str = "--lengths") -> np.ndarray:
    """Read a JSON array of sample lengths (ints >= 0; ``.json`` or gzip-compressed ``.json.gz``).

    Args:
        path: the file.
        setting: the option that named it (``--lengths``, ``--workload``, ``--doc-lengths``), named
            by every message.

    Raises:
        ValueError: missing file, invalid JSON, not a flat array, more than
            :data:`MAX_NUM_SAMPLES` entries, or a bad entry (named by index): not an int,
            negative, or over :data:`MAX_SAMPLE_LENGTH`.
    """
    path = os.fspath(path)
    data = load_json(path, "lengths file", setting, format_hint=_lengths_format_hint(setting))
    if not isinstance(data, list):
        raise ValueError(f"lengths file {path!r} must hold a JSON array of ints, got a {type(data).__name__} "
                         f"(check {setting})")
    if len(data) > MAX_NUM_SAMPLES:
        raise ValueError(f"lengths file {path!r} holds {len(data):,} lengths, more than the {MAX_NUM_SAMPLES:,} "
                         f"a workload may hold (atac_hf.workloads.MAX_NUM_SAMPLES); use a sample of it (check "
                         f"{setting})")
    for i, v in enumerate(data):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"lengths file {path!r}: entry {i} is {_short(v)}, not an int (sample lengths are token "
                             f"counts; check {setting})")
        if v < 0:
            raise ValueError(f"lengths file {path!r}: entry {i} is {_short(v)}, a negative length (check {setting})")
        if v > MAX_SAMPLE_LENGTH:
            raise ValueError(f"lengths file {path!r}: entry {i} is {_short(v)}, over the longest sample length "
                             f"{MAX_SAMPLE_LENGTH} (2**40; check {setting})")
    return np.asarray(data, dtype=np.int64)


def _lengths_format_hint(setting: str) -> str:
    """What a lengths file must be, for the message of one that is not JSON (a .npy, .csv or parquet file)."""
    what = f"; {setting} reads a JSON array of ints (a .json file, or gzip-compressed .json.gz), e.g. [512, 70000, 3]"
    if setting == "--workload":
        return what + ", or a length column of a parquet/csv/jsonl/arrow file as dataset:FILE:COLUMN"
    return (what + "; a length column of a parquet/csv/jsonl/arrow file is read by `atac-hf simulate --workload "
            "dataset:FILE:COLUMN` (or write it out as a JSON array)")


def _short(v: Any) -> str:
    """``repr(v)`` for messages, cut short (an int of 10^5 digits has no printable repr)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 200:
        return f"an int of {v.bit_length()} bits"
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001
        text = f"<{type(v).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def describe_lengths(lengths: Any, long_threshold: int = 32_768) -> dict[str, float]:
    """Shape of a length distribution: count, tokens, median, p99, max, and the share of
    samples and tokens above ``long_threshold``."""
    a = check_lengths(lengths, "lengths")
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


def lengths_from_json(path: str | os.PathLike, setting: str = "the workload setting") -> np.ndarray:
    """Read a JSON array of sample lengths (:func:`atac_hf.workloads.load_lengths`), zeros dropped.

    Raises:
        ValueError: a missing file, invalid JSON, not an array, a negative / non-integer
            entry, or no positive length at all (naming ``setting``).
    """
    arr = load_lengths(path, setting)
    arr = arr[arr > 0]
    if arr.size == 0:
        raise ValueError(f"workload file {os.fspath(path)!r} must hold a non-empty JSON array of positive ints "
                         f"(check {setting})")
    return arr


#: Local data files that ``datasets`` reads with a builder of their format.
_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}
_DATA_FILES = {ext for ext in _FILE_BUILDERS if ext != ".json"}  # never a lengths file


def lengths_from_dataset(dataset: Any, column: str = "length", setting: str = "the workload setting") -> np.ndarray:
    """Lengths from a column of a ``datasets.Dataset``: ints >= 0 (as in a lengths file), or token
    lists measured with ``len``; zeros are dropped.

    ``dataset`` may be a loaded dataset or a path / hub name: a directory is read with
    ``load_from_disk``, a local ``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv`` / ``.arrow`` file
    with its format's builder, anything else with ``load_dataset(..., split="train")``.

    Raises:
        ValueError: an empty path, a dataset that cannot be loaded (``datasets``' error in one
            line), a missing column, more than :data:`MAX_NUM_SAMPLES` rows, a row that is not a
            length (a string, a float, None, a bool, a negative int, a list of non-ints; named by
            row and column), or no positive length at all. Every message names ``setting``.
    """
    where = "dataset"
    if isinstance(dataset, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(dataset))  # (a ``dataset:~/x.parquet`` argument: no shell expansion)
        where = f"dataset {os.fspath(dataset)!r}"
        if not path.strip():
            raise ValueError(f"dataset workload has an empty path: give dataset:<path-or-hub-name>[:<column>] "
                             f"(check {setting})")
        if not os.path.exists(path) and (os.path.splitext(path)[1].lower() in _FILE_BUILDERS or os.path.isabs(path)
                                         or path.startswith(("./", "../", "~"))):
            # a local path (a data file's extension, or absolute / relative): not a hub name to look up
            raise ValueError(f"{where} does not exist: give an existing folder (save_to_disk) or a "
                             f"{'/'.join(sorted(_FILE_BUILDERS))} file, or a hub name (check {setting})")
        import datasets  # lazy: only dataset workloads need it

        builder = _FILE_BUILDERS.get(os.path.splitext(path)[1].lower()) if os.path.isfile(path) else None
        log = logging.getLogger("datasets")
        level = log.level
        log.setLevel(logging.CRITICAL)  # its "Failed to read ..." log lines: the error below says it in one line
        local = builder is not None or os.path.isdir(path)
        bars = local and datasets.is_progress_bar_enabled()
        if bars:  # a local file loads in moments: no "Generating train split" bar above an error line
            datasets.disable_progress_bars()
        try:
            if os.path.isdir(path):
                dataset = datasets.load_from_disk(path)
            elif builder is not None:  # a local data file: its format's builder, not a hub name
                dataset = datasets.load_dataset(builder, data_files=path, split="train")
            else:
                dataset = datasets.load_dataset(path, split="train")
        except Exception as e:  # noqa: BLE001 - datasets raises many types (StopIteration on an empty .jsonl)
            text = " ".join(str(e).split())
            cause = e.__cause__ or e.__context__
            if cause is not None and str(cause).strip() and str(cause) not in text:
                text += f" ({type(cause).__name__}: {' '.join(str(cause).split())})"
            text = (text[:300] + "...") if len(text) > 300 else text
            raise ValueError(f"{where} cannot be loaded: {type(e).__name__}" + (f": {text}" if text else "")
                             + f" (an empty or malformed file, or a name not found; check {setting})") from None
        finally:
            log.setLevel(level)
            if bars:
                datasets.enable_progress_bars()
    names = list(getattr(dataset, "column_names", []) or [])
    spec = f"dataset:<path>:<column> in {setting}"
    if column not in names:
        raise ValueError(f"{where} has no column {column!r}; available columns: {names} (set the column: {spec})")
    try:
        n_rows = len(dataset)
    except TypeError:
        n_rows = None
    if n_rows is not None and n_rows > MAX_NUM_SAMPLES:
        raise ValueError(f"{where} has {n_rows:,} rows, more than the {MAX_NUM_SAMPLES:,} a workload may hold "
                         f"(atac_hf.workloads.MAX_NUM_SAMPLES); use a sample of it (check {setting})")
    arr = _arrow_lengths(dataset, column, where, spec)
    if arr is None:
        arr = _row_lengths(dataset[column], column, where, spec)
    arr = arr[arr > 0]
    if arr.size == 0:
        raise ValueError(f"{where} column {column!r} holds no positive lengths (set the column: {spec})")
    return arr


def _bad_row(where: str, column: str, row: int, value: Any, spec: str) -> ValueError:
    why = ("a string: measure text by tokens, not characters (tokenize it, or give a column of lengths or "
           "token ids)" if isinstance(value, str) else "not a length")
    return ValueError(f"{where} column {column!r} row {row} is {_short(value)}, {why}; a length column holds ints "
                      f"from 0 to {MAX_SAMPLE_LENGTH} (2**40) or lists of token ids (set the column: {spec})")


def _row_lengths(values: Any, column: str, where: str, spec: str) -> np.ndarray:
    """Each row's length: an int as it is, a list (of token ids) by ``len``; anything else refused."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            raise _bad_row(where, column, i, v, spec)
        if isinstance(v, (int, np.integer)):
            n = int(v)
        elif isinstance(v, (list, tuple, np.ndarray)):
            if any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) for x in v):
                raise _bad_row(where, column, i, v, spec)
            n = len(v)
        else:
            raise _bad_row(where, column, i, v, spec)
        if not 0 <= n <= MAX_SAMPLE_LENGTH:
            raise _bad_row(where, column, i, v, spec)
        out[i] = n
    return out


def _arrow_lengths(dataset: Any, column: str, where: str, spec: str) -> np.ndarray | None:
    """The lengths of an int or an int-list column of a ``datasets.Dataset``, read through Arrow
    (token lists are not built as Python lists); None when it is another kind of column (or not a
    ``datasets.Dataset``): the per-row path then finds and names the bad row."""
    if not hasattr(dataset, "with_format") or not hasattr(dataset, "features"):
        return None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc

        col = dataset.with_format("arrow")[column]
    except Exception:  # noqa: BLE001 - not an Arrow-backed dataset: the per-row path
        return None
    if isinstance(col, pa.Table):
        col = col.column(0)
    if not isinstance(col, (pa.Array, pa.ChunkedArray)):
        return None
    t = col.type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if not (pa.types.is_integer(t) or (is_list and pa.types.is_integer(t.value_type))):
        # a string, float, bool, null or nested column: its first rows name the bad one without
        # building the whole column (a text column can be gigabytes) as Python objects
        _row_lengths(col.slice(0, 1000).to_pylist(), column, where, spec)
        return None
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise _bad_row(where, column, row, None, spec)
    values = pc.list_value_length(col) if is_list else col
    arr = np.asarray(values.to_numpy(zero_copy_only=False))
    if arr.size and (arr.min() < 0 or arr.max() > MAX_SAMPLE_LENGTH):
        row = int(np.flatnonzero((arr < 0) | (arr > MAX_SAMPLE_LENGTH))[0])
        raise _bad_row(where, column, row, arr[row].item(), spec)
    return arr.astype(np.int64)


def load_workload(spec: str, *, num_samples: int = 50_000, seed: int = 0, setting: str = "--workload") -> np.ndarray:
    """Lengths of a workload spec (see the module doc).

    Built-in mixes draw ``num_samples`` lengths; shipped samples, files and datasets return
    every length they hold (at most :data:`MAX_NUM_SAMPLES`).

    Args:
        setting: the option that named ``spec`` (``--workload``, ``--workload-file``), named by
            every message.

    Raises:
        ValueError: an unknown name, or a bad file / dataset.
    """
    legal = (f"legal values: built-ins {sorted(WORKLOADS)}, shipped samples {sorted(SAMPLES)}, a path to a "
             ".json array of lengths, or dataset:<path>[:<column>]")
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"workload={spec!r}: {legal} (check {setting})")
    check_seed(seed, "seed")
    if spec in WORKLOADS:
        return make_workload(spec, num_samples, seed=seed)
    if spec in SAMPLES:
        return lengths_from_json(sample_path(spec), setting)
    if spec.startswith("dataset:"):
        rest = spec[len("dataset:"):]
        path, _, column = rest.rpartition(":") if rest.count(":") and not os.path.exists(rest) else (rest, "", "")
        return lengths_from_dataset(path, column or "length", setting)
    if os.path.isdir(spec) or os.path.isfile(spec) and os.path.splitext(spec)[1].lower() in _DATA_FILES:
        raise ValueError(f"workload {_short(spec)} is a dataset, not a lengths file (a JSON array of ints): read a "
                         f"column of it with dataset:{spec}:<column> (ints, or token lists measured "
                         f"with len) (check {setting})")
    if spec.endswith((".json", ".json.gz")) or os.path.exists(spec):
        return lengths_from_json(spec, setting)
    raise ValueError(f"unknown workload {_short(spec)}; {legal} (check {setting})")


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

    Raises:
        ValueError: no lengths, only zeros, a length that is not an int from 0 to
            :data:`MAX_SAMPLE_LENGTH` (named by its index), ``num_tokens`` not an int >= 1, a bad ``seed``.
    """
    pool = check_lengths(lengths, "lengths")
    if pool.size == 0:
        raise ValueError("the workload holds no lengths")
    if not pool.any():  # zeros add no tokens: a pool of only zeros would never reach num_tokens
        raise ValueError(f"every one of the {pool.size} lengths is 0: sample_stream needs a sample of >= 1 token")
    if isinstance(num_tokens, (bool, np.bool_)) or not isinstance(num_tokens, (int, np.integer)):
        raise InputTypeError(f"num_tokens={_short(num_tokens)} is not an int: num_tokens must be an int >= 1 (the "
                             "stream's token count)")
    if num_tokens < 1:
        raise ValueError(f"num_tokens={_short(int(num_tokens))} is invalid: num_tokens must be an int >= 1 (the "
                         "stream's token count)")
    seed = check_seed(seed, "seed")
    rng = np.random.default_rng([seed, 0x5EED])
    parts, total = [], 0
    while total < num_tokens:
        perm = pool[rng.permutation(pool.size)]
        need = int(np.searchsorted(np.cumsum(perm), num_tokens - total)) + 1
        parts.append(perm[:need])
        total += int(perm[:need].sum())
    return np.concatenate(parts)

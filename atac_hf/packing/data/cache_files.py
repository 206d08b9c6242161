"""Cache files of :func:`~atac_hf.packing.data.dataset.pack_dataset`: where the packed rows of a
source backed by cache files are written (as ``Dataset.map`` does), how they are written (a
temporary file renamed when complete), and when an existing file is reused (written by a call
with the same source fingerprint, settings and packing code)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

__all__ = ["cache_path", "code_digest", "load_cache", "plan_from_rows", "split_cache_names", "write_cache"]

_CACHE_KEY = b"atac_hf.pack_dataset"  # schema metadata of a cache file: what wrote it


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of the code that decides the packed rows (packing and cost model sources and the
    package version): a cache file written by other code is never reused."""
    from ... import __version__

    root = Path(__file__).resolve().parents[2]  # the atac_hf package
    h = hashlib.sha256(__version__.encode())
    for sub in ("packing", "cost"):
        for f in sorted((root / sub).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def split_cache_names(dataset: Any, cache_file_name: Any) -> dict[str, Any]:
    """Per split of a DatasetDict, its cache file (None: the default rule)."""
    if cache_file_name is None:
        return {k: None for k in dataset}
    if not isinstance(cache_file_name, Mapping):
        raise ValueError(f"pack_dataset: cache_file_name={str(cache_file_name)!r} is one path, but a DatasetDict has "
                         f"splits {list(dataset)}: give a mapping {{split: path}}, or None")
    missing = [k for k in dataset if k not in cache_file_name]
    extra = [k for k in cache_file_name if k not in dataset]
    if extra:
        raise ValueError(f"pack_dataset: cache_file_name has splits {extra} the DatasetDict does not have "
                         f"(its splits: {list(dataset)})")
    if len({os.path.abspath(os.fspath(v)) for v in cache_file_name.values()}) < len(cache_file_name):
        raise ValueError("pack_dataset: cache_file_name gives two splits the same path; give each split its own file")
    return {k: cache_file_name.get(k) if k not in missing else None for k in dataset}


def cache_path(dataset: Any, cache_file_name: Any, keep_in_memory: bool, fingerprint: str) -> tuple[Path | None, bool]:
    """(the file to write the rows to, or None: in memory; whether the user named it)."""
    import datasets

    if keep_in_memory:
        return None, False
    if cache_file_name is not None:
        if not isinstance(cache_file_name, (str, os.PathLike)):
            raise TypeError(f"pack_dataset: cache_file_name must be a path (str or os.PathLike) or None, got "
                            f"{type(cache_file_name).__name__}")
        return Path(os.fspath(cache_file_name)).expanduser().resolve(), True
    files = getattr(dataset, "cache_files", None) or []
    if not files or not datasets.is_caching_enabled():
        return None, False
    return Path(files[0]["filename"]).resolve().parent / f"cache-atac-pack-{fingerprint}.arrow", False


def load_cache(datasets: Any, path: Path, fingerprint: str) -> Any | None:
    """The dataset of the cache file at ``path`` if this call's settings wrote it, else None."""
    import pyarrow as pa

    if not path.is_file():
        return None
    try:
        with pa.memory_map(str(path)) as src:
            meta = pa.ipc.open_stream(src).schema.metadata or {}
        written = json.loads(meta.get(_CACHE_KEY, b"{}")).get("fingerprint")
    except (OSError, pa.ArrowInvalid, ValueError):
        return None
    if written != fingerprint:
        return None
    return mapped_dataset(datasets, path, fingerprint)


def mapped_dataset(datasets: Any, path: Path, fingerprint: str) -> Any:
    from datasets.table import MemoryMappedTable

    table = MemoryMappedTable.from_file(str(path))
    features = datasets.Features.from_arrow_schema(table.schema)
    return datasets.Dataset(table, info=datasets.DatasetInfo(features=features), fingerprint=fingerprint)


def write_cache(datasets: Any, path: Path, schema: Any, batches: Iterator[Any], fingerprint: str) -> Any:
    """Stream ``batches`` to an Arrow file at ``path`` (written beside it, then renamed: a failed
    or interrupted write leaves no file), and return it memory-mapped."""
    import tempfile

    import pyarrow as pa

    meta = dict(schema.metadata or {})
    meta[_CACHE_KEY] = json.dumps({"fingerprint": fingerprint}).encode()
    schema = schema.with_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"tmp-{path.name}-", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f, pa.ipc.new_stream(f, schema) as writer:
            for batch in batches:
                writer.write_batch(batch.replace_schema_metadata(meta))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return mapped_dataset(datasets, path, fingerprint)


def plan_from_rows(packed: Any) -> tuple[np.ndarray, np.ndarray]:
    """(spans, offsets) of packed rows, read back from their ``spans`` column."""
    import pyarrow.compute as pc

    col = packed.data.table.column("spans")
    counts = np.concatenate([c.to_numpy(zero_copy_only=False) for c in pc.list_value_length(col).chunks])
    flat = pc.list_flatten(pc.list_flatten(col))
    values = np.concatenate([c.to_numpy(zero_copy_only=False) for c in flat.chunks]) if flat.num_chunks else \
        np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return values.astype(np.int64).reshape(-1, 3), offsets

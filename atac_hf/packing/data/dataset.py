"""Offline packing of a ``datasets.Dataset`` into packed rows (WFAP or a baseline).

:func:`pack_dataset` plans every pack up front (one pass over the sample lengths, with a
progress bar), then builds the rows straight from the Arrow table: each pack's spans are
offset ranges into the flat token buffer of every list column, copied with
``pyarrow.concat_arrays`` (no Python lists, any datasets format, dtypes kept). Each output
row is one pack::

    input_ids    flat token ids of the pack's documents (the source's dtype)
    <per-token>  every other list column with one entry per token (``labels``,
                 ``attention_mask``, ...), cut and concatenated like ``input_ids``
    labels       where the source has TRL's ``completion_mask`` / ``assistant_masks`` and no
                 ``labels``: the token where every mask is 1, -100 elsewhere (the collator's
                 rule; a trainer that drops columns ``model.forward`` does not take, such as
                 TRL's SFTTrainer, would otherwise drop the masks and train on the prompts)
    seq_lengths  document lengths (sum = len(input_ids))
    spans        [[sample, start, end], ...] source rows and token ranges, for audit

Other columns (text, ids, lists of another length such as ``messages``) are dropped (a log
line names them): a pack holds several samples, so a per-sample value has no single place
in it. A null ``labels`` entry is filled with the sample's ``input_ids``, a null mask entry
(``attention_mask``, ``completion_mask``, ``assistant_masks``) with ones. The rows keep the
source's format (``with_format``).

Where the rows live follows ``Dataset.map``: a source backed by cache files (``load_dataset``,
``load_from_disk``) gets its packed rows written, record batch by record batch, to an Arrow
cache file beside them and memory-mapped (memory stays at one batch of rows, whatever the
dataset's size), and a later call with the same source, settings and packing code loads that
file instead of packing again; an in-memory source (``Dataset.from_dict``), or
``keep_in_memory=True``, gets an in-memory table (about the size of the source's token columns).

Feed the rows to :class:`~atac_hf.packing.data.collator.PackedDataCollator` with
``batch_size=1`` (one pack per step and replica), in order and unshuffled if the packs
were ordered for data parallelism (``num_replicas``).

Pitfall: ``transformers.Trainer`` drops dataset columns that are not arguments of
``model.forward`` (``remove_unused_columns=True``, the default). Without ``seq_lengths`` a
packed row looks like one long document to the collator and its documents would attend to
each other: set ``remove_unused_columns=False``, or use ``ATACTrainer`` (it keeps the
columns its collator needs), or keep ``seq_lengths`` among the signature columns (TRL's
SFTTrainer does).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ...cost import CostModel, default_cost_model
from ..config import PackingConfig
from ..metrics import dataset_metrics
from ..validate import one_row
from .arrow_source import (_arrow_source, _check_token_values, _first_bad_row, _is_hf_dataset, _is_list,
                           _list_lengths, _refuse_packed_source, _token_columns, _token_lengths, refuse_transform)
from .collator import LOSS_MASK_COLUMNS
from .cache_files import cache_path, code_digest, load_cache, plan_from_rows, split_cache_names, write_cache
from .window_planner import plan_packs

__all__ = ["dataset_lengths", "pack_dataset"]

logger = logging.getLogger(__name__)

_BUILD_TOKENS = 1 << 24  # tokens per built record batch (bounds the temporary memory)
_BUILD_SPANS = 1 << 16  # spans per built record batch (each holds an Arrow slice of about 0.5 KB)


def dataset_lengths(dataset: Any, *, column: str = "input_ids", batch_size: int = 10_000,
                    progress: bool = False) -> np.ndarray:
    """Token count of every row of ``dataset`` (int64 array, in row order), as the collator counts
    them: a sample stored as a ``(1, n)`` row (``tokenizer(..., return_tensors="pt")`` per sample)
    holds n tokens.

    Reads the Arrow list lengths of a ``datasets.Dataset`` (any format) without decoding
    the tokens; any other indexable of mappings is read row by row. ``batch_size`` and
    ``progress`` are unused (kept for compatibility: the Arrow read is one kernel call).

    Raises:
        ValueError: the column is missing (the message lists the columns found).
        InputTypeError: (a ``TypeError`` and ``ValueError``) an Arrow column that is not a list of
            int token ids (text, say), or a sample of several rows.
    """
    refuse_transform(dataset)
    names = getattr(dataset, "column_names", None)
    if names is not None and column not in names:
        raise ValueError(_missing_column(column, names))
    if _is_hf_dataset(dataset):
        table, rows = _arrow_source(dataset)
        return _token_lengths(table.column(column), rows, column)
    lengths = np.zeros(len(dataset), dtype=np.int64)
    for i in range(len(dataset)):
        row = dataset[i]
        if column not in row:
            raise ValueError(_missing_column(column, list(row), where=f"row {i}"))
        lengths[i] = _sample_tokens(row[column])
    return lengths


def _sample_tokens(value: Any) -> int:
    """Tokens of one sample's ids as the collator counts them: a ``(1, n)`` row holds n (the collator
    flattens it); anything else its ``len``."""
    return len(value[0]) if one_row(value) else len(value)


def pack_dataset(dataset: Any, *, max_tokens: int, packs_per_window: int = 64, strategy: str = "wfap",
                 overlength: str = "split", window_size: int | None = None, num_replicas: int = 1,
                 shuffle: bool = False, seed: int = 0, cost_model: CostModel | None = None,
                 num_proc: int | None = None, desc: str = "Packing", progress: bool = True,
                 return_metrics: bool = False, split_fill: bool = False, keep_in_memory: bool = False,
                 cache_file_name: str | os.PathLike | Mapping[str, str | os.PathLike] | None = None,
                 load_from_cache_file: bool | None = None, **packing_options: Any) -> Any:
    """Pack a tokenized ``datasets.Dataset`` (or each split of a ``DatasetDict``) into packed rows.

    Args:
        dataset: a ``datasets.Dataset`` (any format: python, numpy, pandas, arrow, torch...)
            with an ``input_ids`` list column, or a ``datasets.DatasetDict`` (packed split
            by split, same settings; every split is checked and planned before any is written,
            and a refusal leaves no file of the call).
        max_tokens: token cap of one pack.
        packs_per_window: packs planned together (one window); the packer balances cost
            within a window. The last window (``wfap``; the only one of a dataset of few
            tokens) gets the packs its samples need, about ``ceil(tokens / max_tokens)``
            rounded up to a multiple of ``num_replicas``, not ``packs_per_window`` packs of
            about one sample each (planners/wfap_end.py).
        strategy: ``wfap`` | ``sequential`` | ``bfd`` | ``wlb``.
        overlength: policy for samples longer than ``max_tokens``: ``split`` (full-cap
            fragments, then the rest) | ``truncate`` | ``error``.
        window_size: new samples per window (``None``: by token budget).
        num_replicas: order packs for a round-robin deal to this many DP replicas. The pass's
            pack count is a multiple of it: its last packs are split at document boundaries,
            merged or repacked, and only where their documents fill no such count whole (one
            sample and 4 replicas, say) is a sample that fits cut (a ``SampleCutWarning``
            names it), rather than a replica repeat a sample (:mod:`.even_out`).
        shuffle, seed: shuffle the sample order before packing.
        cost_model: the cost model (default: the package default).
        num_proc: unused (kept for compatibility): rows are built by Arrow kernels in this
            process, faster than worker processes could.
        desc: progress bar label.
        progress: show progress bars.
        return_metrics: also return the packing metrics (see below).
        split_fill: with ``strategy="bfd"`` and ``overlength="split"``: also plan the whole
            pass at once, pouring the overlength samples into the room the whole samples
            leave (:mod:`atac_hf.packing.split_fill`), and keep that plan when it needs fewer
            packs: within about 1% of ``ceil(tokens / max_tokens)`` where the windowed bfd
            leaves 1-5% (docs/BENCHMARKS.md, "Split mode"). It cuts overlength samples into
            more, shorter fragments (each >= ``min_fragment``); samples that fit stay whole.
        keep_in_memory: build the rows in memory even where the source has cache files.
        cache_file_name: the Arrow file to write the rows to (and memory-map); for a
            ``DatasetDict`` a mapping ``{split: path}``. Default (None): as ``Dataset.map``, a
            ``cache-atac-pack-<fingerprint>.arrow`` file in the directory of the source's first
            cache file when it has one and caching is on (``datasets.is_caching_enabled()``),
            else in memory. ``Dataset.cleanup_cache_files()`` removes the default files.
        load_from_cache_file: reuse an existing cache file written by a call with the same
            source (fingerprint), settings and packing code, instead of packing again (a file
            written otherwise is replaced). Default: ``datasets.is_caching_enabled()``.
        **packing_options: further :class:`~atac_hf.packing.config.PackingConfig` fields
            (``min_fragment``, ``max_defer``, ``balance_split``, strategy options).

    Returns:
        a ``datasets.Dataset`` (a ``DatasetDict`` for a ``DatasetDict``) with columns
        ``input_ids``, every per-token list column of the source (``labels`` built from
        TRL's loss masks where it has them and no ``labels``), ``seq_lengths`` and
        ``spans``, in the source's format. Zero-length samples are skipped (a warning gives
        their count). With ``return_metrics``: ``(dataset, metrics)``, metrics a dict
        (per split for a ``DatasetDict``): ``num_samples``, ``num_packs``, ``tokens``,
        ``lower_bound_packs`` (``ceil(tokens / max_tokens)``), ``packs_vs_lower_bound``,
        ``padding``, ``num_split`` (samples cut), ``num_fragments`` and
        ``fragment_lengths`` (min / p10 / median / p90 / max of the fragments' lengths),
        ``imbalance_mean`` / ``imbalance_worst`` (max / mean pack cost over each window of
        ``packs_per_window`` consecutive packs, the last run possibly shorter). They are
        logged at INFO level too.

    Raises:
        TypeError: ``dataset`` is not a ``datasets.Dataset``/``DatasetDict``, or
            ``input_ids`` is not a list column.
        ValueError: an empty dataset, no ``input_ids`` column (lists the columns found),
            only empty samples, pre-packed rows (a ``seq_lengths`` column, or ``position_ids``
            restarting at 0 inside a row: they would become one document each), a ``labels`` (or other per-token column) whose length differs
            from ``input_ids`` (names the sample), invalid packing settings, or a
            ``cache_file_name`` that does not fit the dataset (a path for a ``DatasetDict``,
            a mapping missing a split, both it and ``keep_in_memory``).
        OSError: the given ``cache_file_name`` cannot be written (nothing is left behind;
            the default location falls back to memory with a warning instead).
    """
    import datasets

    from ..validate import InputTypeError, check_seed

    for flag_name, flag in (("shuffle", shuffle), ("return_metrics", return_metrics), ("progress", progress),
                            ("keep_in_memory", keep_in_memory)):
        if not isinstance(flag, (bool, np.bool_)):
            raise InputTypeError(f"pack_dataset: {flag_name}={flag!r:.60} must be True or False (set {flag_name})")
    seed = check_seed(seed, "seed")  # numpy's generator would refuse a negative one with a bare message
    unknown = sorted(set(packing_options) - {f.name for f in dataclasses.fields(PackingConfig)})
    if unknown:  # before any work; was Python's bare "unexpected keyword argument" from PackingConfig
        raise TypeError(f"pack_dataset: unknown setting(s) {unknown}; legal: its own arguments and the PackingConfig "
                        f"fields {sorted(f.name for f in dataclasses.fields(PackingConfig))}")
    if keep_in_memory and cache_file_name is not None:
        raise ValueError(f"pack_dataset: keep_in_memory=True and cache_file_name={cache_file_name!r} contradict each "
                         "other; pass one of them")
    from datasets.fingerprint import Hasher

    if num_proc not in (None, 0, 1):
        logger.info("pack_dataset: num_proc=%s is not used (rows are built by Arrow kernels)", num_proc)

    def plan_one(ds: Any, name: Any, label: str) -> dict[str, Any]:  # every refusal of a source: nothing written yet
        table, rows, lengths, token_cols, num_empty = _checked_source(ds)
        fingerprint = Hasher.hash([ds._fingerprint, config.to_dict(), token_cols, window_size, num_replicas,
                                   shuffle, seed, None if cost_model is None else repr(cost_model), split_fill,
                                   code_digest()])
        path, explicit = cache_path(ds, name, keep_in_memory, fingerprint)
        reuse = datasets.is_caching_enabled() if load_from_cache_file is None else bool(load_from_cache_file)
        result = load_cache(datasets, path, fingerprint) if path is not None and reuse else None
        if result is not None:
            logger.info("pack_dataset: loaded the packed rows from %s", path)
            spans, offsets = plan_from_rows(result)
        else:
            from tqdm.auto import tqdm

            order = np.random.default_rng([seed, 0]).permutation(lengths.size) if shuffle else None
            with tqdm(total=lengths.size, desc=f"{label}: planning", disable=not progress, unit="samples") as bar:
                plan = dict(order=order, cost_model=cost_model, window_size=window_size, num_replicas=num_replicas,
                            split_fill=split_fill)
                spans, offsets = plan_packs(lengths, config, progress=bar, **plan)
        return dict(table=table, rows=rows, lengths=lengths, token_cols=token_cols, num_empty=num_empty,
                    fingerprint=fingerprint, path=path, explicit=explicit, result=result, spans=spans, offsets=offsets)

    def build_one(ds: Any, p: dict[str, Any], label: str, written: list) -> Any:
        result, path, spans, offsets = p["result"], p["path"], p["spans"], p["offsets"]
        if result is None:
            table, rows, token_cols = p["table"], p["rows"], p["token_cols"]
            features = _features(datasets, ds, token_cols, _widened(table, token_cols))
            schema = features.arrow_schema

            def batches():  # a fresh generator each time: a failed write leaves the one it consumed half-read
                return _build_batches(table, rows, token_cols, spans, offsets, schema, progress=progress, desc=label)

            if path is not None:
                existed = path.exists()
                try:
                    result = write_cache(datasets, path, schema, batches(), p["fingerprint"])
                    if not existed:
                        written.append(path)
                except OSError as e:
                    if p["explicit"]:
                        raise OSError(f"pack_dataset: cannot write cache_file_name={str(path)!r} ({e}); pass a "
                                      "writable path, or keep_in_memory=True") from e
                    warnings.warn(f"pack_dataset: cannot write the packed rows beside the source's cache files ({e}); "
                                  "building them in memory (pass cache_file_name= a writable path, or "
                                  "keep_in_memory=True)", stacklevel=3)
            if result is None:
                import pyarrow as pa
                from datasets.table import InMemoryTable

                # the fingerprint given: hashing the rows would copy them all
                result = datasets.Dataset(InMemoryTable(pa.Table.from_batches(list(batches()), schema=schema)),
                                          info=datasets.DatasetInfo(features=features), fingerprint=p["fingerprint"])
        result = _with_source_format(result, ds)
        metrics = dataset_metrics(p["lengths"], spans, offsets, config, cost_model or default_cost_model())
        logger.info("pack_dataset: %d samples -> %d packs (%.4fx the lower bound ceil(tokens / max_tokens)), "
                    "%d samples split into %d fragments (lengths %s), %d empty samples skipped",
                    metrics["num_samples"], metrics["num_packs"], metrics["packs_vs_lower_bound"],
                    metrics["num_split"], metrics["num_fragments"], metrics["fragment_lengths"], p["num_empty"])
        return (result, metrics) if return_metrics else result

    if isinstance(dataset, datasets.DatasetDict):
        names = split_cache_names(dataset, cache_file_name)
        config = PackingConfig(max_tokens=max_tokens, packs_per_window=packs_per_window, strategy=strategy,
                               overlength=overlength, **packing_options)  # bad settings before any split is read
        empty = [k for k, v in dataset.items() if len(v) == 0]
        if empty:
            raise ValueError(f"pack_dataset: split(s) {empty} of the DatasetDict have 0 rows: nothing to pack; "
                             "pack the others (DatasetDict({k: v for k, v in dd.items() if len(v)}))")
        # every split checked and planned before any is written: a refused split leaves no file
        plans = {k: plan_one(v, names[k], f"{desc} {k}") for k, v in dataset.items()}
        written: list = []
        try:
            packed = {k: build_one(v, plans[k], f"{desc} {k}", written) for k, v in dataset.items()}
        except BaseException:  # a split that cannot be written: the files this call created go too
            for path in written:
                path.unlink(missing_ok=True)
            raise
        if return_metrics:
            return datasets.DatasetDict({k: v[0] for k, v in packed.items()}), {k: v[1] for k, v in packed.items()}
        return datasets.DatasetDict(packed)
    if isinstance(dataset, (datasets.IterableDataset, datasets.IterableDatasetDict)):
        raise TypeError("pack_dataset needs a datasets.Dataset; for an IterableDataset use "
                        "atac_hf.packing.data.iterable.PackedIterableDataset (streaming packing)")
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"pack_dataset needs a datasets.Dataset, got {type(dataset).__name__}")
    if isinstance(cache_file_name, Mapping):
        raise ValueError("pack_dataset: cache_file_name is a mapping (one path per split, for a DatasetDict); give "
                         "a datasets.Dataset one path, or None")
    config = PackingConfig(max_tokens=max_tokens, packs_per_window=packs_per_window, strategy=strategy,
                           overlength=overlength, **packing_options)
    return build_one(dataset, plan_one(dataset, cache_file_name, desc), desc, [])


def _checked_source(dataset: Any) -> tuple[Any, Any, np.ndarray, list[str], int]:
    """A split's refusals and warnings: (table, rows, lengths, token columns, empty samples)."""
    refuse_transform(dataset)
    if "input_ids" not in dataset.column_names:
        raise ValueError(_missing_column("input_ids", dataset.column_names))
    if len(dataset) == 0:
        raise ValueError("pack_dataset got an empty dataset (0 rows): nothing to pack")
    table, rows = _arrow_source(dataset)
    ids_col = table.column("input_ids")
    if not _is_list(ids_col.type):
        raise TypeError(f"input_ids must be a list column of token ids, got Arrow type {ids_col.type}")
    _check_token_values(table, rows, "input_ids", negative_ok=False)
    lengths = _list_lengths(ids_col, rows)
    num_empty = int((lengths == 0).sum())
    if num_empty == lengths.size:
        raise ValueError(f"every one of the {lengths.size} samples of the dataset is empty (0 input_ids)")
    if num_empty:
        warnings.warn(f"pack_dataset: skipped {num_empty} zero-length samples", stacklevel=4)
    _refuse_packed_source(dataset, table, rows)
    token_cols, dropped = _token_columns(table, rows, lengths)
    if dropped:
        logger.info("pack_dataset: dropped columns %s (not one entry per input_ids token)", dropped)
    if "attention_mask" in token_cols:  # padding is packed as document tokens (TRL's pack_dataset does the same)
        bad = _first_bad_row(table, rows, "attention_mask", lambda v: v != 1)
        if bad is not None:
            row, count, seg, _rows = bad
            warnings.warn(f"pack_dataset: sample {row} (and maybe others): attention_mask has {count} of {len(seg)} "
                          "entries not 1 (padding): the pad tokens are packed as tokens of their document. "
                          "PackedDataCollator / ATACTrainer refuse such rows; a collator that ignores attention_mask "
                          "would train on them. Tokenize without padding (padding=False), or strip the padding "
                          "(keep the tokens where attention_mask is 1) before packing", stacklevel=4)
    if _derives_labels(token_cols):  # the labels are built from the masks here: their values are checked here
        for col in (c for c in LOSS_MASK_COLUMNS if c in token_cols):
            bad = _first_bad_row(table, rows, col, lambda v: ~np.isin(v, (0, 1)))
            if bad is not None:
                row, _count, seg, _rows = bad
                raise ValueError(f"pack_dataset: sample {row}: {col} has values "
                                 f"{np.unique(seg[~np.isin(seg, (0, 1))])[:5].tolist()}; legal values: 0 (no loss on "
                                 "the token) and 1 (train on it), never null: the labels are built from it (-100 "
                                 "where 0). Fix the mask, or give the dataset its own 'labels' column")
    return table, rows, lengths, token_cols, num_empty


# ---------------------------------------------------------------------------- building rows
#: per-token 0/1 masks: a sample whose entry is null gets ones (every token counts), not its token ids
_MASK_COLUMNS = ("attention_mask", *LOSS_MASK_COLUMNS)


def _derives_labels(token_cols: Sequence[str]) -> bool:
    """Whether the rows get a ``labels`` column built from TRL's loss masks (no ``labels`` of their own): a
    trainer that keeps only ``model.forward``'s arguments (``remove_unused_columns``, TRL's SFTTrainer) would
    drop the masks, and train on the prompts."""
    return "labels" not in token_cols and any(m in token_cols for m in LOSS_MASK_COLUMNS)


def _chunk_index(column: Any) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """Per chunk its flat values; per table row its chunk and its first value's offset."""
    values, starts, chunk_of = [], [], []
    for k, chunk in enumerate(column.chunks):
        values.append(chunk.values)
        off = chunk.offsets.to_numpy()
        starts.append(off[:-1].astype(np.int64, copy=False))
        chunk_of.append(np.full(len(chunk), k, dtype=np.int64))
    if not starts:
        return values, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return values, np.concatenate(starts), np.concatenate(chunk_of)


def _build_batches(table: Any, rows: np.ndarray | None, token_cols: Sequence[str], spans: np.ndarray,
                   offsets: np.ndarray, schema: Any, *, progress: bool, desc: str) -> Iterator[Any]:
    """The packed rows as record batches of whole packs (about ``_BUILD_TOKENS`` tokens and at most
    ``_BUILD_SPANS`` spans each, or one pack), cast to ``schema``: only one batch is built at a time."""
    import pyarrow as pa
    from tqdm.auto import tqdm

    num_packs = len(offsets) - 1
    sid = spans[:, 0]
    trow = sid if rows is None else rows[sid]
    span_len = spans[:, 2] - spans[:, 1]
    pack_len = np.add.reduceat(span_len, offsets[:-1]) if num_packs else np.zeros(0, dtype=np.int64)
    sources = {}
    for name in token_cols:
        values, starts, chunk_of = _chunk_index(table.column(name))
        col_type = schema.field(name).type  # the source's, or int64 where _widened
        if values and values[0].type != col_type.value_type:
            values = [v.cast(col_type.value_type) for v in values]
        null = None
        if name != "input_ids":
            null_arr = table.column(name).is_null()
            null = np.concatenate([c.to_numpy(zero_copy_only=False) for c in null_arr.chunks])[trow]
            if not null.any():
                null = None
        sources[name] = (values, starts[trow] + spans[:, 1], chunk_of[trow], col_type, null)
    seq_type = pa.list_(pa.int64())
    # batches of whole packs, about _BUILD_TOKENS tokens and at most _BUILD_SPANS spans each (or one pack)
    cum = np.cumsum(pack_len)
    cuts = [0]
    while cuts[-1] < num_packs:
        base = cum[cuts[-1] - 1] if cuts[-1] else 0
        nxt = int(np.searchsorted(cum, base + _BUILD_TOKENS, side="right"))
        by_spans = int(np.searchsorted(offsets, offsets[cuts[-1]] + _BUILD_SPANS, side="right")) - 1
        cuts.append(min(num_packs, max(min(nxt, by_spans), cuts[-1] + 1)))
    with tqdm(total=num_packs, desc=f"{desc}: building rows", disable=not progress, unit="packs") as bar:
        for b0, b1 in zip(cuts, cuts[1:]):
            s0, s1 = int(offsets[b0]), int(offsets[b1])
            row_off = np.concatenate([[0], np.cumsum(pack_len[b0:b1])])
            lens = span_len[s0:s1].tolist()  # per batch: Python lists only of this batch's spans
            ids_values, ids_starts, ids_chunk = sources["input_ids"][:3]
            arrays, flats = [], {}
            for name in token_cols:
                values, starts, chunk_of, col_type, null = sources[name]
                st, ch = starts[s0:s1].tolist(), chunk_of[s0:s1].tolist()
                if null is None:
                    pieces = [values[c].slice(a, n) for c, a, n in zip(ch, st, lens)]
                elif name in _MASK_COLUMNS:  # a null mask: every token counts (as a sample without the mask)
                    nl = null[s0:s1].tolist()
                    pieces = [pa.array(np.ones(lens[j], dtype=np.int8)).cast(col_type.value_type) if nl[j]
                              else values[ch[j]].slice(st[j], lens[j]) for j in range(s1 - s0)]
                else:  # null labels (and other columns): the sample's input_ids
                    ist, ich, nl = ids_starts[s0:s1].tolist(), ids_chunk[s0:s1].tolist(), null[s0:s1].tolist()
                    pieces = [(ids_values[ich[j]].slice(ist[j], lens[j]).cast(col_type.value_type)
                               if nl[j] else values[ch[j]].slice(st[j], lens[j]))
                              for j in range(s1 - s0)]
                flat = pa.concat_arrays(pieces) if pieces else pa.array([], type=col_type.value_type)
                flats[name] = flat
                off_type = pa.int64() if pa.types.is_large_list(col_type) else pa.int32()
                arrays.append((pa.LargeListArray if off_type == pa.int64() else pa.ListArray).from_arrays(
                    pa.array(row_off, type=off_type), flat, type=col_type))
            if _derives_labels(token_cols):  # TRL's rule, as the collator applies it: ids where every mask is 1
                keep = np.ones(len(flats["input_ids"]), dtype=bool)
                for name in LOSS_MASK_COLUMNS:
                    if name in flats:
                        keep &= flats[name].to_numpy(zero_copy_only=False).astype(bool)
                ids = flats["input_ids"].to_numpy(zero_copy_only=False).astype(np.int64)
                arrays.append(pa.ListArray.from_arrays(pa.array(row_off, type=pa.int32()),
                                                       pa.array(np.where(keep, ids, -100), type=pa.int64())))
            seq = pa.ListArray.from_arrays(pa.array(offsets[b0:b1 + 1] - s0, type=pa.int32()),
                                           pa.array(span_len[s0:s1], type=pa.int64()), type=seq_type)
            span_vals = pa.ListArray.from_arrays(pa.array(np.arange(0, 3 * (s1 - s0) + 1, 3), type=pa.int32()),
                                                 pa.array(spans[s0:s1].reshape(-1), type=pa.int64()))
            span_rows = pa.ListArray.from_arrays(pa.array(offsets[b0:b1 + 1] - s0, type=pa.int32()), span_vals)
            batch = pa.RecordBatch.from_arrays(arrays + [seq, span_rows], names=list(token_cols) + (
                ["labels"] if _derives_labels(token_cols) else []) + ["seq_lengths", "spans"])
            if not batch.schema.equals(schema, check_metadata=False):  # e.g. a feature type Arrow infers otherwise
                yield from pa.Table.from_batches([batch]).cast(schema).to_batches()  # (RecordBatch.cast: pyarrow 16)
            else:
                yield batch
            bar.update(b1 - b0)


def _widened(table: Any, token_cols: Sequence[str]) -> list[str]:
    """The per-token columns (not masks) with null rows and another value type than ``input_ids``: a null row
    is filled with the sample's ``input_ids``, which that type may not hold (uint16 ids over 32767 in int16
    labels), so they are packed as int64."""
    ids_type = table.column("input_ids").type.value_type
    return [name for name in token_cols if name != "input_ids" and name not in _MASK_COLUMNS
            and table.column(name).null_count and table.column(name).type.value_type != ids_type]


def _features(datasets: Any, source: Any, token_cols: Sequence[str], widened: Sequence[str] = ()) -> Any:
    feats = {name: source.features[name] for name in token_cols}
    for name in widened:
        feats[name] = datasets.List(datasets.Value("int64"))
    for name, f in feats.items():  # a fixed-length column (Sequence(..., length=n)) packs into rows of any length
        if getattr(f, "length", -1) not in (-1, None):
            feats[name] = type(f)(f.feature)
    if _derives_labels(token_cols):
        feats["labels"] = datasets.List(datasets.Value("int64"))
    feats["seq_lengths"] = datasets.List(datasets.Value("int64"))
    feats["spans"] = datasets.List(datasets.List(datasets.Value("int64")))
    return datasets.Features(feats)


def _with_source_format(result: Any, source: Any) -> Any:
    fmt = dict(source.format)
    if fmt.get("type") is None and fmt.get("columns") is None and not fmt.get("format_kwargs"):
        return result
    columns = fmt.get("columns")
    if columns is not None:
        columns = [c for c in columns if c in result.column_names]
        columns += [c for c in ("labels", "seq_lengths", "spans") if c not in columns and c in result.column_names]
    return result.with_format(fmt.get("type"), columns=columns, output_all_columns=fmt.get("output_all_columns", False),
                              **fmt.get("format_kwargs", {}))


def _missing_column(column: str, found: Sequence[str], *, where: str = "the dataset") -> str:
    return (f"{where} has no {column!r} column; columns found: {list(found)}. Tokenize the text into "
            f"{column!r} first, or rename the column holding the token ids "
            f"(dataset.rename_column('<name>', {column!r}))")

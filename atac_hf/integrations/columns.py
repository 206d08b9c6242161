"""Per-token column checks of the datasets the integration packs: the Arrow scans that refuse a
padded ``attention_mask`` (and mismatched or non-binary per-token columns) before the first
batch, and the per-sample preparation of a stream (padding refused, ``labels`` built from TRL's
loss masks, pre-packed samples refused). Used by :mod:`atac_hf.integrations.data`."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

def _list_chunks(dataset: Any, column: str, *, take: bool = True):
    """:func:`~atac_hf.packing.data.arrow_source._list_chunks` of a ``datasets.Dataset``'s column."""
    from ..packing.data.arrow_source import _arrow_source
    from ..packing.data.arrow_source import _list_chunks as list_chunks

    return list_chunks(*_arrow_source(dataset), column, take=take)


def _first_bad_row(dataset: Any, column: str, is_bad: Callable[[np.ndarray], np.ndarray]):
    """:func:`~atac_hf.packing.data.arrow_source._first_bad_row` of a ``datasets.Dataset``'s column."""
    from ..packing.data.arrow_source import _arrow_source
    from ..packing.data.arrow_source import _first_bad_row as first_bad_row

    return first_bad_row(*_arrow_source(dataset), column, is_bad)


_PADDING_FIX = ("tokenize without padding (padding=False), or strip the padding (keep the tokens where "
                "attention_mask is 1 in input_ids/labels), then drop the column "
                "(dataset.remove_columns('attention_mask'))")


def _check_token_columns(dataset: Any, name: str, *, targets: bool = False) -> None:
    """Arrow checks of the per-token columns of a ``datasets.Dataset`` (see
    :func:`check_dataset_columns`); other datasets are left to the collator."""
    from ..packing.data.collator import LOSS_MASK_COLUMNS
    from ..packing.data.arrow_source import _arrow_source, _is_hf_dataset, _is_list, _list_lengths

    if not _is_hf_dataset(dataset) or len(dataset) == 0:
        return
    names = dataset.column_names
    table, rows = _arrow_source(dataset)
    if "input_ids" not in names or not _is_list(table.column("input_ids").type):
        return
    lengths = _list_lengths(table.column("input_ids"), rows)
    for col in ("labels", "attention_mask") + LOSS_MASK_COLUMNS + ("position_ids",):
        if col not in names or not _is_list(table.column(col).type):
            continue
        lens = _list_lengths(table.column(col), rows)
        null = table.column(col).is_null()
        null = np.concatenate([c.to_numpy(zero_copy_only=False) for c in null.chunks])
        if rows is not None:
            null = null[rows]
        bad = np.flatnonzero((lens != lengths) & ~null)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{name} row {i}: {col} has {int(lens[i])} entries but input_ids has {int(lengths[i])} "
                             f"({bad.size} such rows); {col} must have one entry per token. Fix the tokenization, or "
                             f"drop the column ({name}.remove_columns({col!r}))")
    if "attention_mask" in names and _is_list(table.column("attention_mask").type):
        bad = _first_bad_row(dataset, "attention_mask", lambda v: v != 1)
        if bad is not None:
            row, count, seg, rows_bad = bad
            raise ValueError(
                f"{name} row {row}: attention_mask has {count} of {len(seg)} entries not 1 (padding; {rows_bad} "
                "such rows in its Arrow chunk): packing concatenates the rows without padding, so the pad tokens "
                f"would be trained on as tokens of the document. Legal attention_mask values here: all 1. To fix: "
                f"{_PADDING_FIX}")
    if targets:
        _refuse_no_target(table, names, name, len(dataset))
    if "labels" in names:
        return
    for col in LOSS_MASK_COLUMNS:
        if col not in names or not _is_list(table.column(col).type):
            continue
        bad = _first_bad_row(dataset, col, lambda v: ~np.isin(v, (0, 1)))
        if bad is not None:
            row, _count, seg, _rows = bad
            raise ValueError(
                f"{name} row {row}: {col} has values {np.unique(seg[~np.isin(seg, (0, 1))])[:5].tolist()}; legal "
                "values: 0 (no loss on the token) and 1 (train on it): the labels are built from it (-100 where 0). "
                "Fix the mask, or give the dataset its own 'labels' column (-100 where no loss)")


def prepare_stream_sample(sample: Any, sid: int | None = None) -> Any:
    """One sample of a stream, ready for the streaming packer (which reads only ``input_ids`` and
    ``labels``): a padded ``attention_mask`` is refused, ``completion_mask`` / ``assistant_masks``
    build the ``labels`` where there are none (TRL's rule, see
    :func:`~atac_hf.packing.data.collator.labels_from_masks`), and ``position_ids`` restarting at 0
    (several documents in the sample) are refused, since the packer keeps a sample one document.

    Raises:
        ValueError: as above, naming the sample, the column and the fix.
    """
    from ..packing.data.collator import LOSS_MASK_COLUMNS, _as_mask, doc_lengths_from_position_ids, labels_from_masks
    from ..packing.validate import check_token_ids

    if not hasattr(sample, "keys") or sample.get("input_ids") is None:
        return sample  # the packer names what is missing
    where = "source sample" if sid is None else f"source sample {sid}"
    ids = None
    mask = sample.get("attention_mask")
    if mask is not None:
        ids = check_token_ids(sample["input_ids"], where=where, field="input_ids")
        mask = _as_mask(mask, where, "attention_mask")
        if mask.shape[0] != ids.shape[0] or not (mask == 1).all():
            what = (f"{mask.shape[0]} entries for {ids.shape[0]} input_ids" if mask.shape[0] != ids.shape[0]
                    else f"{int((mask != 1).sum())} of {ids.shape[0]} entries not 1 (padding)")
            raise ValueError(f"{where}: attention_mask has {what}: packing concatenates the samples without padding, "
                             f"so the pad tokens would be trained on. To fix: {_PADDING_FIX}")
    if sample.get("position_ids") is not None and sample.get("seq_lengths") is None:
        ids = check_token_ids(sample["input_ids"], where=where, field="input_ids") if ids is None else ids
        pos = check_token_ids(sample["position_ids"], where=where, field="position_ids")
        docs = doc_lengths_from_position_ids(pos, ids.shape[0], where=where)
        if docs.size > 1:
            raise ValueError(f"{where}: position_ids restart at 0 {docs.size - 1} time(s) (a pre-packed row of "
                             f"{docs.size} documents of {docs.tolist()} tokens): the streaming packer keeps a sample "
                             "one document, so they would attend to each other. Stream the unpacked samples, or pass "
                             "the rows as a map-style dataset (their documents are then packed again, each kept "
                             "whole)")
    if sample.get("labels") is None and any(sample.get(k) is not None for k in LOSS_MASK_COLUMNS):
        ids = check_token_ids(sample["input_ids"], where=where, field="input_ids") if ids is None else ids
        sample = dict(sample)
        sample["labels"] = labels_from_masks(sample, ids, where=where).tolist()
    return sample


class _CheckedStream:
    """A re-iterable source whose samples go through :func:`prepare_stream_sample`."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __iter__(self):
        for sid, sample in enumerate(self.source):
            yield prepare_stream_sample(sample, sid)


def checked_stream(dataset: Any) -> Any:
    """``dataset`` with every sample through :func:`prepare_stream_sample`: a lazy ``map`` of a
    ``datasets.IterableDataset`` (so that resuming can still ``skip``), a re-iterable wrapper of
    any other iterable. Sample order and count are unchanged."""
    try:
        import datasets

        if isinstance(dataset, datasets.IterableDataset):
            return dataset.map(prepare_stream_sample)
    except ImportError:  # pragma: no cover - datasets is a dependency
        pass
    from ..packing.data.iterable import check_reiterable

    check_reiterable(dataset, "the streamed dataset")
    return _CheckedStream(dataset)


def _refuse_no_target(table: Any, names: Sequence[str], name: str, num_rows: int) -> None:
    """Refuse a dataset none of whose tokens is a target: ``labels`` all -100, or (without ``labels``) a loss mask
    all 0, e.g. ``assistant_masks`` from a chat template without ``{% generation %}`` blocks. Every loss would be
    0 and nothing trained, with no error. Read chunk by chunk over the whole Arrow column (a selection's rows
    among them), stopping at the first target: sound for a selection, which has none where the column has none."""
    import pyarrow.compute as pc

    from ..packing.data.arrow_source import _is_list
    from ..packing.data.collator import LOSS_MASK_COLUMNS

    cols = [("labels", -100)] if "labels" in names else [(c, 0) for c in LOSS_MASK_COLUMNS if c in names]
    for col, none in cols:
        column = table.column(col)
        if not _is_list(column.type) or column.null_count:  # a null row's labels are its tokens
            continue
        if any(pc.any(pc.not_equal(chunk.flatten(), none)).as_py() for chunk in column.chunks if len(chunk)):
            continue
        if sum(len(chunk.flatten()) for chunk in column.chunks) == 0:
            continue  # no tokens at all: the sampler's "every sample is empty" says so
        raise _no_target_error(name, col, none, num_rows)


def _refuse_no_target_rows(dataset: Any, names: Sequence[str], name: str) -> None:
    """:func:`_refuse_no_target` of an indexable of dicts (a list of samples): rows read in turn until one
    has a target (a row without the column, or with a value other than -100 / 0 in it: its tokens are)."""
    from ..packing.data.collator import LOSS_MASK_COLUMNS

    cols = [("labels", -100)] if "labels" in names else [(c, 0) for c in LOSS_MASK_COLUMNS if c in names]
    if not cols:
        return
    seen = 0
    for i in range(len(dataset)):
        row = dataset[i]
        for col, none in cols:
            value = row.get(col) if hasattr(row, "get") else None
            if value is None:
                return
            try:
                entries = np.asarray(value)
            except Exception:  # noqa: BLE001 - not numbers: the collator names what is wrong with it
                return
            if entries.size and (entries.dtype == object or (entries != none).any()):
                return
            seen += entries.size
    if seen:  # no tokens at all: the sampler's "every sample is empty" says so
        raise _no_target_error(name, cols[0][0], cols[0][1], len(dataset))


def _no_target_error(name: str, col: str, none: int, num_rows: int) -> ValueError:
    fix = ("put the token ids to train in labels (-100 only where no loss), or drop the column (every token is "
           "then a target)" if col == "labels" else
           "a chat template's assistant mask is all 0 where the template has no {% generation %} ... "
           "{% endgeneration %} around the assistant's turns (transformers warns: 'chat template does not "
           "contain `{% generation %}` keyword'): add them, or build labels yourself (-100 on the prompt)")
    return ValueError(f"{name} has no token to train: every {col!r} entry of its {num_rows} row(s) is {none}, so "
                      f"every loss would be 0 and the weights would not learn. To fix: {fix}")

"""The Arrow table behind a ``datasets.Dataset`` as ``pack_dataset`` and the trainer's column
checks read it: the table and its row selection, list lengths, which columns hold one entry per
token, and refusals of values that are not token ids and of rows that are packed already.
Pure pyarrow/numpy (pyarrow imported where used)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__: list[str] = []


def _is_hf_dataset(dataset: Any) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        return False
    return isinstance(dataset, datasets.Dataset)


def refuse_transform(dataset: Any, where: str = "the dataset") -> None:
    """Refuse a ``datasets.Dataset`` with a transform (``with_transform`` / ``set_transform``): it runs only
    when a row is read, but packing plans from the stored Arrow columns (their lengths; ``pack_dataset``'s
    rows too), so the packs would not hold what the transform makes (a transform adding a BOS token made
    packs of other lengths than planned; one tokenizing text found no ``input_ids``).

    Raises:
        ValueError: naming the transform and what to do instead.
    """
    if not _is_hf_dataset(dataset) or (dataset.format or {}).get("type") != "custom":
        return
    fn = (dataset.format.get("format_kwargs") or {}).get("transform")
    raise ValueError(
        f"{where} has a transform set with with_transform() / set_transform() "
        f"({getattr(fn, '__name__', type(fn).__name__)}): it runs only when a row is read, but packing plans from "
        "the stored columns (their token counts), so the packs would not hold what it makes; apply it once with "
        "dataset.map(fn, batched=True) (a transform of token ids) or tokenize with map, or drop it with "
        "dataset.reset_format()")


def _arrow_source(dataset: Any) -> tuple[Any, np.ndarray | None]:
    """The dataset's underlying ``pyarrow.Table`` (whatever its format) and the table row of
    each dataset row (``None``: row i is table row i; set after ``select``/``shuffle``)."""
    table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    table = _variable_lists(table)
    indices = getattr(dataset, "_indices", None)
    rows = None
    if indices is not None:
        col = indices.column(0)
        rows = col.to_numpy() if col.num_chunks == 1 else np.concatenate(
            [c.to_numpy() for c in col.chunks] or [np.zeros(0, dtype=np.int64)])  # no chunk: 0 rows (a filter kept none)
        rows = rows.astype(np.int64, copy=False)
    return table, rows


def _variable_lists(table: Any) -> Any:
    """``table`` with its fixed-size list columns (``datasets.Sequence(..., length=n)``, the type of pre-chunked
    corpora) cast to variable-size lists, which every reader here takes (offsets; the values are not copied)."""
    import pyarrow as pa

    for i, field in enumerate(table.schema):
        if pa.types.is_fixed_size_list(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.list_(field.type.value_field)))
    return table


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _list_lengths(column: Any, rows: np.ndarray | None) -> np.ndarray:
    import pyarrow.compute as pc

    lens = pc.fill_null(pc.list_value_length(column), 0)
    arr = np.concatenate([c.to_numpy(zero_copy_only=False) for c in lens.chunks]) if lens.num_chunks else \
        np.zeros(0, dtype=np.int64)
    arr = arr.astype(np.int64, copy=False)
    return arr if rows is None else arr[rows]


def _token_lengths(column: Any, rows: np.ndarray | None, name: str) -> np.ndarray:
    """Tokens of each sample of a token-id list ``column`` as the collator counts them: a sample stored
    as a ``(1, n)`` row (a list holding one list of ids, what ``tokenizer(..., return_tensors="pt")``
    gives per sample) holds n tokens, not 1; a null sample none. Raises InputTypeError for a column
    that is not a list of ints (text, say) or a sample of several rows (the collator refuses both)."""
    import pyarrow as pa

    from ..validate import InputTypeError

    t = column.type
    if pa.types.is_null(t):  # no value in any row (an empty dataset built from a dict, or every entry None)
        return np.zeros(len(column) if rows is None else len(rows), dtype=np.int64)
    hint = ("one sample per row, as a 1-D list of int token ids (or a (1, n) row); tokenize the text first, "
            f"or cast: dataset.cast_column({name!r}, datasets.Sequence(datasets.Value('int64')))")
    if not _is_list(t):
        raise InputTypeError(f"{name} must be a list column of int token ids, got Arrow type {t}: {hint}")
    if not _is_list(t.value_type):
        return _list_lengths(column, rows)
    if not (pa.types.is_integer(t.value_type.value_type) or pa.types.is_null(t.value_type.value_type)):
        raise InputTypeError(f"{name} must be a list column of int token ids, got Arrow type {t}: {hint}")
    outer = _list_lengths(column, rows)
    if (outer > 1).any():
        i = int(np.argmax(outer > 1))
        raise InputTypeError(f"sample {i}: {name} holds {int(outer[i])} rows of ids (Arrow type {t}): {hint}")
    import pyarrow.compute as pc

    parts = []  # per chunk: each row's first inner list length (0 where the row has none)
    for chunk in column.chunks:
        starts = chunk.offsets.to_numpy()[:-1]  # absolute offsets into chunk.values (slices too)
        inner = pc.fill_null(pc.list_value_length(chunk.values), 0).to_numpy(zero_copy_only=False)
        got = np.zeros(len(chunk), dtype=np.int64)
        has = (pc.fill_null(pc.list_value_length(chunk), 0).to_numpy(zero_copy_only=False) == 1)
        got[has] = inner[starts[has]]
        parts.append(got)
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return arr if rows is None else arr[rows]


def _token_columns(table: Any, rows: np.ndarray | None, lengths: np.ndarray) -> tuple[list[str], list[str]]:
    """The list columns with one entry per ``input_ids`` token (``input_ids`` first), and the
    columns dropped. ``labels`` (and the usual per-token names) must match: ValueError."""
    import pyarrow.compute as pc

    keep, dropped = ["input_ids"], []
    for name in table.column_names:
        if name == "input_ids":
            continue
        col = table.column(name)
        if not _is_list(col.type):
            if name in _PER_TOKEN_NAMES:  # e.g. a class label named "labels": dropping it would train on input_ids
                raise ValueError(f"the {name!r} column is not a list with one entry per token (Arrow type "
                                 f"{col.type}); {name} must be a list column with one entry per input_ids token. "
                                 f"Rename or drop the column (dataset.remove_columns({name!r}))")
            dropped.append(name)
            continue
        if name == "labels":
            _check_token_values(table, rows, "labels", negative_ok=True)
        null = pc.is_null(col)
        is_null = np.concatenate([c.to_numpy(zero_copy_only=False) for c in null.chunks]) if null.num_chunks else \
            np.zeros(0, dtype=bool)
        if rows is not None:
            is_null = is_null[rows]
        lens = _list_lengths(col, rows)
        bad = np.flatnonzero((lens != lengths) & ~is_null)
        if bad.size == 0:
            keep.append(name)
        elif name in _PER_TOKEN_NAMES:
            i = int(bad[0])
            raise ValueError(
                f"sample {i}: {name} has {int(lens[i])} entries but input_ids has {int(lengths[i])} "
                f"({bad.size} such samples); {name} must have one entry per token. Fix the tokenization, or "
                f"drop the column (dataset.remove_columns({name!r}))")
        else:
            dropped.append(name)
    return keep, dropped


def _check_token_values(table: Any, rows: np.ndarray | None, name: str, *, negative_ok: bool) -> None:
    """Refuse a list column ``name`` whose entries are not int token ids: another value type (bool,
    float, string, nested lists; TypeError), or a null entry or a negative one (``negative_ok``: one
    other than -100, the loss's only ignore index) inside a sample (ValueError naming the sample). A
    null sample is fine (empty for ``input_ids``; for ``labels``, the sample's ``input_ids``)."""
    import pyarrow as pa

    from ..validate import MAX_TOKEN_ID, InputTypeError

    col = table.column(name)
    vtype = col.type.value_type
    if pa.types.is_null(vtype):  # Arrow's type of lists that are all empty: no value to check
        return
    if _is_list(vtype):  # (1, n) rows: what the collator flattens; pack_dataset cuts flat token buffers
        raise InputTypeError(f"{name} must be a list column of int token ids, got Arrow type {col.type} (a list "
                             f"of rows per sample); flatten each sample first: dataset.map(lambda s: {{{name!r}: "
                             f"s[{name!r}][0]}}) for (1, n) rows (ATACTrainer and the collator take them as they are)")
    if not pa.types.is_integer(vtype):
        raise InputTypeError(f"{name} must be a list column of int token ids, got Arrow type {col.type} (values "
                             f"{vtype}); tokenize into int ids (or cast: dataset.cast_column({name!r}, "
                             "datasets.Sequence(datasets.Value('int64'))))")

    def bad(v: np.ndarray) -> np.ndarray:  # ints with nulls come out as floats with NaN
        v = np.asarray(v)
        out = np.isnan(v) if v.dtype.kind == "f" else np.zeros(v.shape, dtype=bool)
        out |= (v < 0) & (v != -100) if negative_ok else v < 0  # the loss ignores -100 only
        if v.dtype.kind == "u":
            out |= v > MAX_TOKEN_ID
        return out

    found = _first_bad_row(table, rows, name, bad)
    if found is not None:
        row, _, seg, hits = found
        j = int(np.flatnonzero(bad(seg))[0])
        value = "null" if np.asarray(seg).dtype.kind == "f" and np.isnan(seg[j]) else int(seg[j])
        legal = "ints (-100 where no loss), never null, no other negative" if negative_ok else f"ints in [0, {MAX_TOKEN_ID}], never null"
        raise ValueError(f"pack_dataset: sample {row}: {name}[{j}] is {value}; {name} must hold {legal} "
                         f"({hits} such samples in its Arrow chunk). Fix or filter these samples"
                         + (" (the loss ignores -100 only)" if negative_ok else ""))


def _list_chunks(table: Any, rows: np.ndarray | None, column: str, *, take: bool = True):
    """Per Arrow chunk of a list ``column``: the flat values (numpy), the row offsets into them and
    the null rows; in dataset row order (``take``: with a row selection ``rows``, a copy of the
    column) or in table order."""
    col = table.column(column)
    if rows is not None and take:
        col = col.take(rows)
    for chunk in col.chunks:
        null = chunk.is_null().to_numpy(zero_copy_only=False)
        yield (chunk.values.to_numpy(zero_copy_only=False), chunk.offsets.to_numpy().astype(np.int64), null)


def _first_bad_row(table: Any, rows: np.ndarray | None, column: str, is_bad: Any):
    """``(row, bad entries in it, its entries, rows with bad entries in its chunk)`` of the first
    dataset row of ``column`` with an entry ``is_bad`` (values -> bool mask; null rows never
    count), else None. A first pass over the table (no copy) settles the common case, all entries
    fine; only then are the rows taken in order."""
    if not any(is_bad(vals[off[0]:off[-1]]).any() for vals, off, _ in _list_chunks(table, rows, column, take=False)
               if len(off) > 1):
        return None
    base = 0
    for vals, off, null in _list_chunks(table, rows, column):
        flag = np.concatenate([[0], np.cumsum(is_bad(vals))])
        count = flag[off[1:]] - flag[off[:-1]]
        count[null] = 0
        hit = np.flatnonzero(count)
        if hit.size:
            k = int(hit[0])
            return base + k, int(count[k]), vals[off[k]:off[k + 1]], int(hit.size)
        base += len(count)
    return None


def _refuse_packed_source(dataset: Any, table: Any, rows: np.ndarray | None) -> None:
    """Refuse rows that are already packed (a ``seq_lengths`` column, or ``position_ids`` restarting
    at 0 inside a row): packing them again would make each row one document."""
    names = dataset.column_names
    fix = ("pack the unpacked samples instead, or feed these rows as they are (PackedDataCollator with "
           "batch_size=1, or ATACTrainer, which takes their documents out and packs them again)")
    if "seq_lengths" in names:
        raise ValueError("pack_dataset got pre-packed rows (a 'seq_lengths' column): each row would become one "
                         f"document of the new packs, its documents attending to each other; {fix}")
    if "position_ids" not in names or not _is_list(table.column("position_ids").type):
        return
    base = 0
    for vals, off, _ in _list_chunks(table, rows, "position_ids"):
        zero = np.concatenate([[0], np.cumsum(vals == 0)])
        inner = zero[off[1:]] - zero[np.minimum(off[:-1] + 1, off[1:])]  # zeros after each row's first token
        hit = np.flatnonzero(inner > 0)
        if hit.size:
            raise ValueError(f"pack_dataset: sample {base + int(hit[0])} has position_ids restarting at 0 inside it "
                             "(a pre-packed row of several documents): each row would become one document of the "
                             f"new packs; {fix}, or drop the column (dataset.remove_columns('position_ids')) if the "
                             "restarts are not document starts")
        base += len(off) - 1


_PER_TOKEN_NAMES = ("labels", "attention_mask", "token_type_ids", "completion_mask", "assistant_masks",
                    "position_ids", "loss_mask")

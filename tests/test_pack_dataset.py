"""pack_dataset at dataset scale: Arrow-native rows, every datasets format, DatasetDict,
per-token columns kept aligned, dtypes kept, split mode against the lower bound (and TRL's
bfd_split), the metrics it reports, and its errors."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest

from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.packing.data.dataset import dataset_lengths, pack_dataset
from atac_hf.packing.data.window_planner import plan_packs
from atac_hf.packing.planners.window import overlength_pieces
datasets = pytest.importorskip("datasets")  # not on every machine (the GPU image has none)

datasets.disable_progress_bars()

CAP = 16


def _source(lengths, seed=0, dtype="int32"):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, 1000, size=n).tolist() for n in lengths]
    ds = datasets.Dataset.from_dict({
        "input_ids": ids,
        "attention_mask": [[1] * n for n in lengths],
        "labels": [[t + 1 for t in r] for r in ids],
        "text": [f"s{i}" for i in range(len(lengths))],
        "id": list(range(len(lengths))),
        "messages": [[{"role": "user", "content": "x"}] for _ in lengths],
    })
    ds = ds.cast_column("input_ids", datasets.List(datasets.Value(dtype)))
    return ds, ids


def _check_rows(out, ids, lengths):
    rows = out.with_format(None)[:]
    seen = np.zeros(len(lengths), dtype=np.int64)
    assert len(rows["input_ids"]) > 0
    for r in range(len(rows["input_ids"])):
        pack = rows["spans"][r]
        expect = [t for i, s, e in pack for t in ids[i][s:e]]
        assert rows["input_ids"][r] == expect
        assert rows["labels"][r] == [t + 1 for t in expect]
        assert rows["attention_mask"][r] == [1] * len(expect)
        assert rows["seq_lengths"][r] == [e - s for _, s, e in pack]
        assert sum(rows["seq_lengths"][r]) <= CAP
        for i, s, e in pack:
            seen[i] += e - s
    assert seen.tolist() == list(lengths)  # every token exactly once


@pytest.mark.parametrize("fmt", [None, "numpy", ("numpy", {"dtype": np.float32}), "pandas", "arrow", "torch"])
def test_every_format_packs_and_keeps_format(fmt):
    lengths = [5, 3, 20, 1, 9, 16, 7, 2]
    ds, ids = _source(lengths)
    if isinstance(fmt, tuple):
        view = ds.with_format(fmt[0], **fmt[1])
    else:
        view = ds.with_format(fmt)
    out = pack_dataset(view, max_tokens=CAP, packs_per_window=2, progress=False)
    assert out.format["type"] == view.format["type"]
    assert out.format["format_kwargs"] == view.format["format_kwargs"]
    assert out.column_names == ["input_ids", "attention_mask", "labels", "seq_lengths", "spans"]
    assert out.features["input_ids"] == datasets.List(datasets.Value("int32"))  # dtype kept
    assert out.with_format(None).data.schema.field("input_ids").type == pa.list_(pa.int32())
    _check_rows(out, ids, lengths)


def test_indices_mapping_chunked_table_and_large_list():
    lengths = [4, 12, 7, 3, 30, 1, 8, 8, 15]
    ds, ids = _source(lengths)
    # several Arrow chunks, then a select through an indices mapping
    chunked = datasets.concatenate_datasets([ds.select(range(0, 4)), ds.select(range(4, 9))])
    assert chunked.data.column("input_ids").num_chunks >= 2
    order = [8, 2, 0, 5, 4, 1]
    sub = chunked.select(order)
    out = pack_dataset(sub, max_tokens=CAP, packs_per_window=2, strategy="bfd", progress=False)
    _check_rows(out, [ids[i] for i in order], [lengths[i] for i in order])
    assert dataset_lengths(sub).tolist() == [lengths[i] for i in order]
    # large_list offsets stay large_list
    big = ds.cast_column("input_ids", datasets.LargeList(datasets.Value("int64")))
    out = pack_dataset(big, max_tokens=CAP, packs_per_window=2, progress=False)
    assert pa.types.is_large_list(out.data.schema.field("input_ids").type)
    _check_rows(out, ids, lengths)


def test_dataset_dict_is_packed_split_by_split():
    ds, ids = _source([5, 3, 20, 1, 9])
    dd = datasets.DatasetDict(train=ds, test=ds.select([1, 3]))
    out, metrics = pack_dataset(dd, max_tokens=CAP, packs_per_window=2, progress=False, return_metrics=True)
    assert isinstance(out, datasets.DatasetDict) and set(out) == {"train", "test"}
    _check_rows(out["train"], ids, [5, 3, 20, 1, 9])
    _check_rows(out["test"], [ids[1], ids[3]], [3, 1])
    assert metrics["test"]["tokens"] == 4 and metrics["train"]["tokens"] == 38


def test_null_labels_take_input_ids_and_other_columns_are_dropped(caplog):
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "labels": [None, [7, 8, 9]],
                                     "score": [0.5, 0.1], "other": [[1], [2, 3, 4]]})
    with caplog.at_level("INFO", logger="atac_hf.packing.data.dataset"):
        out = pack_dataset(ds, max_tokens=8, packs_per_window=1, strategy="sequential", progress=False)
    assert out.column_names == ["input_ids", "labels", "seq_lengths", "spans"]
    assert out[0]["input_ids"] == [1, 2, 3, 4, 5] and out[0]["labels"] == [1, 2, 7, 8, 9]
    assert "dropped columns ['score', 'other']" in caplog.text


def test_per_token_column_length_mismatch_names_the_sample():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5], [6]], "labels": [[1, 2], [3, 4], [6]]})
    with pytest.raises(ValueError, match=r"sample 1: labels has 2 entries but input_ids has 3 .*remove_columns"):
        pack_dataset(ds, max_tokens=8, progress=False)
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]], "attention_mask": [[1, 1], [1, 1]]})
    with pytest.raises(ValueError, match=r"sample 1: attention_mask has 2 entries but input_ids has 1"):
        pack_dataset(ds, max_tokens=8, progress=False)
    with pytest.raises(TypeError, match=r"input_ids must be a list column"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [1, 2]}), max_tokens=8, progress=False)
    with pytest.raises(TypeError, match="use .*PackedIterableDataset"):
        dd = datasets.DatasetDict(train=datasets.Dataset.from_dict({"input_ids": [[1]]})).to_iterable_dataset() \
            if hasattr(datasets.DatasetDict, "to_iterable_dataset") else \
            datasets.IterableDatasetDict(train=datasets.Dataset.from_dict({"input_ids": [[1]]}).to_iterable_dataset())
        pack_dataset(dd, max_tokens=8, progress=False)


def test_metrics_report_fragments_and_the_lower_bound():
    lengths = [40, 3, 5, 17]
    ds, _ids = _source(lengths)
    out, m = pack_dataset(ds, max_tokens=CAP, packs_per_window=2, strategy="bfd", min_fragment=4,
                          progress=False, return_metrics=True)
    # 40 -> 16 + 16 + 8; 17 -> 16 + 1, but min_fragment 4: 13 + 4
    assert overlength_pieces(40, CAP, 4) == [16, 16, 8] and overlength_pieces(17, CAP, 4) == [13, 4]
    assert m["num_split"] == 2 and m["num_fragments"] == 5
    assert m["fragment_lengths"]["min"] == 4 and m["fragment_lengths"]["max"] == 16
    assert m["tokens"] == 65 and m["lower_bound_packs"] == 5 and m["num_packs"] == len(out)
    assert m["packs_vs_lower_bound"] == len(out) / 5
    assert min(len(s) for s in out["spans"]) >= 1
    assert all(e - s >= 4 for sp in out["spans"] for _, s, e in sp if (e - s) < lengths[_])


def test_fidelity_default_keeps_every_fitting_sample_whole():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 4096, size=400).tolist()
    ds = datasets.Dataset.from_dict({"input_ids": [[0] * n for n in lengths]})
    out = pack_dataset(ds, max_tokens=4096, packs_per_window=4, progress=False)
    assert all(e - s == lengths[i] for sp in out["spans"] for i, s, e in sp)


@pytest.mark.parametrize("seed", range(20))
def test_split_mode_fills_packs_near_the_lower_bound(seed):
    """bfd split mode against ceil(tokens / cap) on random lengths up to 3x the cap, with
    min_fragment respected; TRL's bfd_split on the same lengths, when installed, for scale."""
    rng = np.random.default_rng(seed)
    C = int(rng.integers(64, 512))
    L = rng.integers(1, 3 * C, size=int(rng.integers(100, 400)))
    lb = -(-int(L.sum()) // C)
    res = pack_lengths(L, PackingConfig(max_tokens=C, packs_per_window=64, strategy="bfd", min_fragment=1))
    assert len(res.packs) <= 1.05 * lb + 1
    res = pack_lengths(L, PackingConfig(max_tokens=C, packs_per_window=64, strategy="bfd"))
    m = PackingConfig(max_tokens=C, packs_per_window=1).min_fragment
    assert all(e - s >= m for p in res.packs for i, s, e in p if e - s < L[i])
    assert len(res.packs) <= 1.15 * lb + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overlength warning
        spans, offsets = plan_packs(L, PackingConfig(max_tokens=C, packs_per_window=64, strategy="bfd"),
                                    split_fill=True)
    assert len(offsets) - 1 <= 1.01 * lb + 1  # the whole-pass split-mode planner (tests/test_packing_split.py)
    assert all(e - s >= m for i, s, e in spans.tolist() if e - s < L[i])


def test_split_fill_rows_metrics_and_dataset_dict():
    lengths = [29, 13, 10, 39, 7, 13, 26, 31, 25, 34, 2, 16, 23, 18, 16]  # windowed bfd: 21 packs
    ds, ids = _source(lengths)
    kw = dict(max_tokens=CAP, packs_per_window=4, strategy="bfd", progress=False, return_metrics=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, met = pack_dataset(ds, split_fill=True, **kw)
        _windowed, met0 = pack_dataset(ds, **kw)
        dd, dmet = pack_dataset(datasets.DatasetDict({"train": ds}), split_fill=True, **kw)
    _check_rows(out, ids, lengths)
    assert met["num_packs"] == met["lower_bound_packs"] == 19 < met0["num_packs"] == 21
    assert dd["train"]["spans"] == out["spans"] and dmet["train"]["num_packs"] == met["num_packs"]
    assert out._fingerprint != _windowed._fingerprint
    with pytest.raises(ValueError, match=r"split_fill=True needs strategy='bfd' and overlength='split'"):
        pack_dataset(ds, max_tokens=CAP, split_fill=True, progress=False)

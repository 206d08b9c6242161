"""Per-token mask columns on the way into packed batches are never dropped silently:

* a padded ``attention_mask`` is refused (dataset check, SpanDataset + collator, stream);
* ``completion_mask`` / ``assistant_masks`` without ``labels`` build the labels (TRL's rule);
* ``position_ids`` restarting at 0 (pre-packed rows without ``seq_lengths``) give the documents.

Red-team repros: /tmp/redteam3b/span_pad*.py, /tmp/redteam3a/completion_mask.py, posids_prepacked.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader

from atac_hf.integrations import ATACConfig
from atac_hf.integrations.data import (PackedRowDocuments, build_packed_dataloader, build_streaming_dataloader,
                                       check_dataset_columns, prepare_stream_sample)
from atac_hf.packing import PackedDataCollator, PackingConfig, SpanDataset, WFAPBatchSampler

datasets = pytest.importorskip("datasets")  # not on every machine (the GPU image has none)

datasets.disable_progress_bars()

PADDED = {"input_ids": [[11, 12, 0, 0], [21, 22, 23, 0]], "attention_mask": [[1, 1, 0, 0], [1, 1, 1, 0]]}
CFG = ATACConfig(cp_size=1, max_tokens=16)


def _batches(ds, **kw):
    loader, _ = build_packed_dataloader(ds, CFG, shuffle=False, **kw)
    return list(loader)


def _docs(batch):
    ids, lab = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    cuts = np.cumsum([0] + batch["seq_lengths"].tolist())
    return [(tuple(ids[a:b]), tuple(lab[a:b])) for a, b in zip(cuts[:-1], cuts[1:])]


# ---------------------------------------------------------------- 1. padding
def test_padded_attention_mask_refused_before_the_first_batch():
    ds = datasets.Dataset.from_dict(PADDED)
    with pytest.raises(ValueError, match=r"train_dataset row 0: attention_mask has 2 of 4 entries not 1 \(padding; "
                                         r"2 such rows.*padding=False.*remove_columns\('attention_mask'\)"):
        check_dataset_columns(ds, name="train_dataset")
    with pytest.raises(ValueError, match=r"dataset row 0: attention_mask has 2 of 4 entries not 1"):
        build_packed_dataloader(ds, CFG)
    # the row reported follows the dataset's order (select / shuffle indices)
    sel = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4], [5, 6]],
                                      "attention_mask": [[1, 1], [1, 1], [1, 0]]}).select([1, 2, 0])
    with pytest.raises(ValueError, match=r"dataset row 1: attention_mask has 1 of 2 entries not 1"):
        check_dataset_columns(sel)
    assert ds.to_dict() == PADDED  # a refused dataset is unchanged


def test_attention_mask_of_ones_keeps_working():
    ds = datasets.Dataset.from_dict({"input_ids": [[11, 12], [21, 22, 23]], "attention_mask": [[1, 1], [1, 1, 1]]})
    check_dataset_columns(ds)
    (batch,) = _batches(ds)
    assert batch["input_ids"].tolist() == [[11, 12, 21, 22, 23]]
    assert batch["labels"].tolist() == [[-100, 12, -100, 22, 23]]


def test_padded_attention_mask_through_span_dataset_refused_on_first_batch():
    ds = datasets.Dataset.from_dict(PADDED)
    sampler = WFAPBatchSampler.from_dataset(ds, PackingConfig(max_tokens=16, packs_per_window=1), shuffle=False)
    loader = DataLoader(SpanDataset(ds), batch_sampler=sampler, collate_fn=PackedDataCollator())
    with pytest.raises(ValueError, match=r"feature 0: attention_mask has 2 of 4 entries not 1 \(padding\).*padding=False"):
        next(iter(loader))
    # a list-of-dicts dataset (no Arrow check) is refused by the collator on the first batch
    rows = [dict(input_ids=a, attention_mask=m) for a, m in zip(PADDED["input_ids"], PADDED["attention_mask"])]
    loader, _ = build_packed_dataloader(rows, CFG, shuffle=False)
    with pytest.raises(ValueError, match=r"attention_mask has 2 of 4 entries not 1 \(padding\)"):
        next(iter(loader))


def test_span_dataset_keeps_and_slices_the_mask_columns():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4]], "attention_mask": [[1, 1, 1, 1]],
                                     "completion_mask": [[0, 1, 1, 0]], "position_ids": [[0, 1, 0, 1]],
                                     "text": ["x"]})
    assert SpanDataset(ds)[(0, 1, 3)] == {"input_ids": [2, 3], "attention_mask": [1, 1],
                                          "completion_mask": [1, 1], "position_ids": [1, 0]}
    assert SpanDataset(ds, columns=("input_ids",))[(0, 1, 3)] == {"input_ids": [2, 3]}


def test_wrong_length_mask_column_refused():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "completion_mask": [[0, 1], [1, 1]]})
    with pytest.raises(ValueError, match=r"dataset row 1: completion_mask has 2 entries but input_ids has 3 "
                                         r"\(1 such rows\).*remove_columns\('completion_mask'\)"):
        check_dataset_columns(ds)


# ---------------------------------------------------------------- 2. completion / assistant masks
@pytest.mark.parametrize("col", ["completion_mask", "assistant_masks"])
def test_loss_mask_without_labels_builds_labels(col):
    ds = datasets.Dataset.from_dict({"input_ids": [[11, 12, 13, 14], [21, 22, 23]],
                                     col: [[0, 0, 1, 1], [1, 0, 1]]})
    (batch,) = _batches(ds)
    assert sorted(_docs(batch)) == [((11, 12, 13, 14), (-100, -100, 13, 14)), ((21, 22, 23), (-100, -100, 23))]


def test_both_loss_masks_and_labels_precedence():
    feats = [{"input_ids": [1, 2, 3, 4], "completion_mask": [0, 1, 1, 1], "assistant_masks": [1, 1, 0, 1]}]
    assert PackedDataCollator()(feats)["labels"].tolist() == [[-100, 2, -100, 4]]  # every mask must be 1
    own = [{"input_ids": [1, 2, 3, 4], "labels": [5, 6, 7, 8], "completion_mask": [0, 0, 0, 0]}]
    assert PackedDataCollator()(own)["labels"].tolist() == [[-100, 6, 7, 8]]  # the user's labels are kept
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "labels": [[7, 8, 9]], "completion_mask": [[0, 0, 5]]})
    check_dataset_columns(ds)  # masks are not read where labels exist


def test_bad_loss_mask_values_refused():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4]], "completion_mask": [[0, 1], [2, 1]]})
    with pytest.raises(ValueError, match=r"dataset row 1: completion_mask has values \[2\]; legal values: 0 .* and 1"):
        check_dataset_columns(ds)
    with pytest.raises(ValueError, match=r"feature 0: assistant_masks has values \[3\]; legal values: 0"):
        PackedDataCollator()([{"input_ids": [1, 2], "assistant_masks": [3, 1]}])
    with pytest.raises(ValueError, match=r"feature 0: completion_mask has 1 entries but input_ids has 2"):
        PackedDataCollator()([{"input_ids": [1, 2], "completion_mask": [1]}])


def test_loss_mask_in_packed_rows_and_fragments():
    # pack_dataset keeps completion_mask; the feeder slices it with each document
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5]], "seq_lengths": [[2, 3]],
                                       "completion_mask": [[0, 1, 0, 1, 1]]})
    docs = PackedRowDocuments(rows)
    assert [docs[i] for i in range(2)] == [{"input_ids": [1, 2], "completion_mask": [0, 1]},
                                           {"input_ids": [3, 4, 5], "completion_mask": [0, 1, 1]}]
    (batch,) = _batches(rows)
    assert sorted(_docs(batch)) == [((1, 2), (-100, 2)), ((3, 4, 5), (-100, 4, 5))]
    # a fragment of a sample: its mask is sliced with it
    frag = SpanDataset(datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4]], "completion_mask": [[0, 0, 1, 1]]}))
    assert PackedDataCollator()([frag[(0, 1, 4)]])["labels"].tolist() == [[-100, 3, 4]]


# ---------------------------------------------------------------- 3. position_ids
POS = {"input_ids": [[1, 2, 3, 4, 5, 6], [7, 8, 9]], "position_ids": [[0, 1, 2, 0, 1, 0], [0, 1, 2]],
       "labels": [[-100, 2, 3, -100, 5, -100], [-100, 8, 9]]}


def test_position_ids_restarts_give_the_documents():
    ds = datasets.Dataset.from_dict(POS)
    docs = PackedRowDocuments(ds)
    assert docs.lengths.tolist() == [3, 2, 1, 3] and docs.row.tolist() == [0, 0, 0, 1]
    assert docs[1] == {"input_ids": [4, 5], "labels": [-100, 5]}
    listed = PackedRowDocuments([{k: v[r] for k, v in POS.items()} for r in range(2)])  # list-of-dicts path
    assert listed.lengths.tolist() == [3, 2, 1, 3] and listed.offset.tolist() == docs.offset.tolist()
    batches = _batches(ds)
    got = sorted(d for b in batches for d in _docs(b))
    assert got == sorted([((1, 2, 3), (-100, 2, 3)), ((4, 5), (-100, 5)), ((6,), (-100,)), ((7, 8, 9), (-100, 8, 9))])
    for b in batches:  # positions restart per document
        cuts = np.cumsum([0] + b["seq_lengths"].tolist())
        assert b["position_ids"][0].tolist() == [p for n in np.diff(cuts) for p in range(n)]
    # seq_lengths wins where a row has both
    both = datasets.Dataset.from_dict({**POS, "seq_lengths": [[6], [3]]})
    assert PackedRowDocuments(both).lengths.tolist() == [6, 3]


def test_position_ids_in_the_collator():
    out = PackedDataCollator()([{"input_ids": [1, 2, 3, 4, 5], "position_ids": [0, 1, 0, 1, 2]}])
    assert out["seq_lengths"].tolist() == [2, 3] and out["labels"].tolist() == [[-100, 2, -100, 4, 5]]
    frag = PackedDataCollator()([{"input_ids": [2, 3, 4], "position_ids": [1, 0, 1]}])  # a fragment: starts mid-document
    assert frag["seq_lengths"].tolist() == [1, 2]


def test_bad_position_ids_refused():
    bad = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6]], "position_ids": [[0, 1, 2], [0, 2, 3]]})
    with pytest.raises(ValueError, match=r"row 1: position_ids\[1\] = 2 after 0; legal: 0 .* or 1 .*"
                                         r"remove_columns\('position_ids'\)"):
        PackedRowDocuments(bad)
    with pytest.raises(ValueError, match=r"row 1: position_ids\[1\] = 2 after 0"):
        build_packed_dataloader(bad, CFG)
    with pytest.raises(ValueError, match=r"feature 0: position_ids\[2\] = 5 after 1; legal: 0"):
        PackedDataCollator()([{"input_ids": [1, 2, 3], "position_ids": [0, 1, 5]}])
    with pytest.raises(ValueError, match=r"feature 0: position_ids has 2 entries but input_ids has 3"):
        PackedDataCollator()([{"input_ids": [1, 2, 3], "position_ids": [0, 1]}])
    short = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "position_ids": [[0, 1]]})
    with pytest.raises(ValueError, match=r"dataset row 0: position_ids has 2 entries but input_ids has 3"):
        check_dataset_columns(short)
    with pytest.raises(ValueError, match=r"row 0: position_ids has 2 entries but input_ids has 3"):
        PackedRowDocuments(short)


# ---------------------------------------------------------------- streaming
def test_stream_samples_checked():
    with pytest.raises(ValueError, match=r"source sample 3: attention_mask has 1 of 2 entries not 1 \(padding\)"):
        prepare_stream_sample({"input_ids": [1, 2], "attention_mask": [1, 0]}, 3)
    with pytest.raises(ValueError, match=r"source sample 0: position_ids restart at 0 1 time\(s\).*map-style"):
        prepare_stream_sample({"input_ids": [1, 2, 3], "position_ids": [0, 0, 1]}, 0)
    assert prepare_stream_sample({"input_ids": [1, 2], "completion_mask": [0, 1]})["labels"] == [-100, 2]
    plain = {"input_ids": [1, 2], "attention_mask": [1, 1], "position_ids": [0, 1]}
    assert prepare_stream_sample(plain) is plain


@pytest.mark.parametrize("hf", [False, True])
def test_streaming_loader_builds_labels_and_refuses_padding(hf):
    samples = [{"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1]}, {"input_ids": [4, 5], "completion_mask": [1, 0]}]
    src = datasets.IterableDataset.from_generator(lambda: iter(samples)) if hf else samples
    loader, _ = build_streaming_dataloader(src, CFG)
    got = sorted(d for b in loader for d in _docs(b))
    assert got == [((1, 2, 3), (-100, 2, 3)), ((4, 5), (-100, -100))]
    padded = [{"input_ids": [1, 2], "attention_mask": [1, 1]}, {"input_ids": [3, 0], "attention_mask": [1, 0]}]
    src = datasets.IterableDataset.from_generator(lambda: iter(padded)) if hf else padded
    loader, _ = build_streaming_dataloader(src, CFG)
    with pytest.raises(ValueError, match=r"attention_mask has 1 of 2 entries not 1 \(padding\)"):
        list(loader)


def test_pack_dataset_refuses_pre_packed_rows():
    from atac_hf.packing.data.dataset import pack_dataset

    restarts = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "position_ids": [[0, 1], [0, 1, 0]]})
    with pytest.raises(ValueError, match=r"pack_dataset: sample 1 has position_ids restarting at 0 inside it.*"
                                         r"remove_columns\('position_ids'\)"):
        pack_dataset(restarts, max_tokens=8, progress=False)
    with pytest.raises(ValueError, match=r"sample 0 has position_ids restarting"):
        pack_dataset(restarts.select([1, 0]), max_tokens=8, progress=False)
    with pytest.raises(ValueError, match=r"pre-packed rows \(a 'seq_lengths' column\)"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2]], "seq_lengths": [[1, 1]]}), max_tokens=8,
                     progress=False)
    plain = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "position_ids": [[0, 1], [0, 1, 2]]})
    out = pack_dataset(plain, max_tokens=8, progress=False)
    assert sorted(map(len, (PackedRowDocuments(out)[i]["input_ids"] for i in range(2)))) == [2, 3]


def test_custom_collator_ignoring_loss_masks_refused():
    from transformers import DataCollatorWithFlattening

    from atac_hf.integrations.data import check_collator

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4], [5, 6, 7]], "completion_mask": [[0, 0, 1, 1], [0, 1, 1]]})
    with pytest.raises(ValueError, match=r"DataCollatorWithFlattening trains on 1 token\(s\) that the samples' "
                                         r"completion_mask/assistant_masks exclude.*leave data_collator unset"):
        check_collator(DataCollatorWithFlattening(return_position_ids=True), ds, max_tokens=64)
    check_collator(PackedDataCollator(), ds, max_tokens=64)  # builds the labels from the masks
    with_labels = ds.add_column("labels", [[1, 2, 3, 4], [5, 6, 7]])
    check_collator(DataCollatorWithFlattening(return_position_ids=True), with_labels, max_tokens=64)

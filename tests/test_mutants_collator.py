"""Tests that kill mutants of ``PackedDataCollator`` (issue 20): every output key with its
dtype and exact value on a hand case, a separator other than -100, the per-instance
counters, and the refusals with their whole messages. docs/TESTING.md lists the verdicts.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from atac_hf.packing.data.collator import PackedDataCollator

# a plain sample, a packed row of 2 documents (with its own labels) and a sample whose only
# document is empty: documents of 3, 1, 2 tokens
FEATS = [{"input_ids": [5, 6, 7]}, {"input_ids": [], "labels": []},
         {"input_ids": [8, 9, 10], "labels": [1, 2, 3], "seq_lengths": [1, 0, 2]}]


def test_every_output_key_dtype_and_value_numpy():
    c = PackedDataCollator(return_tensors="np", return_shift_labels=True)
    out = c(FEATS)
    want = {
        "input_ids": ([[5, 6, 7, 8, 9, 10]], np.int64),
        "labels": ([[-100, 6, 7, -100, -100, 3]], np.int64),
        "position_ids": ([[0, 1, 2, 0, 0, 1]], np.int64),
        "shift_labels": ([[6, 7, -100, -100, 3, -100]], np.int64),
        "seq_lengths": ([3, 1, 2], np.int64),
        "cu_seqlens": ([0, 3, 4, 6], np.int32),
    }
    assert set(out) == set(want) | {"max_seqlen"}
    for k, (v, dt) in want.items():
        assert isinstance(out[k], np.ndarray) and out[k].dtype == dt and out[k].tolist() == v, k
    assert out["max_seqlen"] == 3 and type(out["max_seqlen"]) is int
    assert (c.stats.num_rows, c.stats.num_documents, c.stats.num_tokens, c.stats.num_empty_skipped) == (1, 3, 6, 2)
    c(FEATS[:1])  # the counters add up over calls
    assert (c.stats.num_rows, c.stats.num_documents, c.stats.num_tokens, c.stats.num_empty_skipped) == (2, 4, 9, 2)


def test_torch_outputs_and_a_custom_separator():
    out = PackedDataCollator(separator_id=9, return_shift_labels=True)(FEATS)
    for k in ("input_ids", "labels", "position_ids", "shift_labels", "seq_lengths"):
        assert isinstance(out[k], torch.Tensor) and out[k].dtype == torch.int64, k
    assert out["cu_seqlens"].dtype == torch.int32 and out["cu_seqlens"].tolist() == [0, 3, 4, 6]
    assert out["labels"].tolist() == [[9, 6, 7, 9, 9, 3]]
    # shift_labels shifts the labels (separator included) and ends with -100
    assert out["shift_labels"].tolist() == [[6, 7, 9, 9, 3, -100]]
    assert out["max_seqlen"] == 3
    # the input features are not modified (labels are copied before the separator is written)
    assert FEATS[2]["labels"] == [1, 2, 3]
    arr = np.array([1, 2, 3])
    PackedDataCollator()([{"input_ids": [4, 5, 6], "labels": arr}])
    assert arr.tolist() == [1, 2, 3]


def test_refusals_with_their_whole_messages():
    def refused(exc, features, message, **kw):
        with pytest.raises(exc, match="^" + re.escape(message) + "$"):
            PackedDataCollator()(features, **kw)

    refused(TypeError, (f for f in FEATS), "PackedDataCollator expects a list of features (dicts), got generator")
    refused(TypeError, {"input_ids": [1]}, "PackedDataCollator expects a list of features (dicts), got dict")
    refused(TypeError, [{"input_ids": [1]}, [2]], "feature 1 is a list, expected a dict with 'input_ids'")
    refused(ValueError, [{"input_ids": [1]}, {"text": "a", "ids": [1]}],
            "feature 1 has no 'input_ids'; keys found: ['ids', 'text'] (tokenize the text, or rename the token "
            "column to 'input_ids')")
    refused(ValueError, [{"input_ids": [1, 2], "labels": [1, 2, 3]}], "feature 0: labels has 3 entries but input_ids has 2; labels must have one entry per token (-100 where no loss). "
            "Fix the tokenization, or drop the column (the labels are then built from input_ids)")
    refused(ValueError, [{"input_ids": [1, 2, 3], "seq_lengths": [5, -1, -1]}],
            "feature 0: seq_lengths has negative entries (seq_lengths[1] = -1): seq_lengths must hold ints >= 0")
    refused(ValueError, [{"input_ids": [1]}, {"input_ids": [1, 2, 3], "seq_lengths": [1, 1]}],
            "feature 1: seq_lengths sum to 2 but input_ids has 3 tokens (the row's document lengths must add up "
            "to its length)")
    refused(ValueError, [{"input_ids": []}, {"input_ids": [], "seq_lengths": [0, 0]}],
            "every document in the batch is empty (2 features, 3 empty documents): nothing to train on; drop the empty "
            "samples from the dataset (dataset.filter(lambda s: len(s['input_ids']) > 0))")
    refused(ValueError, [{"input_ids": [1]}], "return_tensors='tf'; legal values: ['pt', 'np']", return_tensors="tf")
    with pytest.raises(ValueError, match="^" + re.escape("PackedDataCollator.return_tensors='jax'; legal values: "
                                                         "['pt', 'np']") + "$"):
        PackedDataCollator(return_tensors="jax")
    # a refused batch counts nothing
    c = PackedDataCollator()
    with pytest.raises(ValueError, match="^every document in the batch is empty"):
        c([{"input_ids": []}])
    assert (c.stats.num_rows, c.stats.num_documents, c.stats.num_tokens) == (0, 0, 0)

"""PackedDataCollator: agreement with transformers' DataCollatorWithFlattening, exact
logits of a tiny Llama on a packed row, validation errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

from atac_hf.packing.data.collator import PackedDataCollator

VOCAB = 128
_TF_VERSION = tuple(int(x) for x in transformers.__version__.split(".")[:2])


def _docs(lengths, seed=0, with_labels=False):
    rng = np.random.default_rng(seed)
    feats = []
    for n in lengths:
        f = {"input_ids": rng.integers(0, VOCAB, size=n).tolist()}
        if with_labels:
            lab = rng.integers(-100, VOCAB, size=n)  # legal labels: token ids >= 0, or -100 (no loss)
            f["labels"] = np.where(lab < 0, -100, lab).tolist()
        feats.append(f)
    return feats


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=8).filter(any), with_labels=st.booleans(),
       seed=st.integers(0, 2**16))
def test_matches_data_collator_with_flattening(lengths, with_labels, seed):
    feats = _docs(lengths, seed, with_labels)
    ours = PackedDataCollator()(feats)
    # transformers < 5.24's DataCollatorWithFlattening gives an empty document a label (2 labels for 1 token
    # at lengths [0, 1]): there, the reference gets the non-empty documents only (ours skips empty ones)
    ref_feats = feats if _TF_VERSION >= (5, 24) else [f for f in feats if f["input_ids"]]
    ref = DataCollatorWithFlattening(return_position_ids=True)(copy.deepcopy(ref_feats), return_tensors="pt")
    for key in ("input_ids", "labels", "position_ids"):
        assert torch.equal(ours[key], ref[key]), key
        assert ours[key].dtype == torch.int64 and ours[key].shape[0] == 1
    nonempty = [n for n in lengths if n]
    assert ours["seq_lengths"].tolist() == nonempty
    assert ours["cu_seqlens"].dtype == torch.int32
    assert ours["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(nonempty)]).tolist()
    assert ours["max_seqlen"] == max(nonempty)


def test_packed_rows_and_plain_samples_mix():
    a, b, c, d = _docs([4, 3, 5, 2], seed=1)
    packed = {"input_ids": a["input_ids"] + b["input_ids"] + c["input_ids"], "seq_lengths": [4, 3, 5]}
    out = PackedDataCollator()([packed, d])
    ref = PackedDataCollator()([a, b, c, d])
    for key in ("input_ids", "labels", "position_ids", "seq_lengths", "cu_seqlens"):
        assert torch.equal(out[key], ref[key]), key
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]
    assert out["labels"][0, [0, 4, 7, 12]].tolist() == [-100] * 4


def test_packed_row_labels_and_shift_labels_numpy():
    row = {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, 16, 17, 18, 19], "seq_lengths": [2, 3]}
    out = PackedDataCollator(return_tensors="np", return_shift_labels=True)([row])
    assert isinstance(out["input_ids"], np.ndarray) and out["input_ids"].shape == (1, 5)
    assert out["labels"].tolist() == [[-100, 16, -100, 18, 19]]
    assert out["shift_labels"].tolist() == [[16, -100, 18, 19, -100]]
    assert out["position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    # per-call override, like transformers collators
    assert isinstance(PackedDataCollator(return_tensors="np")([row], return_tensors="pt")["input_ids"],
                      torch.Tensor)
    assert set(PackedDataCollator(return_seq_lengths=False)([row])) == {"input_ids", "labels", "position_ids"}


def test_tensor_inputs_and_empty_documents_counted():
    coll = PackedDataCollator()
    feats = [{"input_ids": torch.tensor([[1, 2, 3]])}, {"input_ids": []},
             {"input_ids": np.array([4, 5, 6]), "seq_lengths": [0, 3, 0]}]
    out = coll(feats)
    assert out["seq_lengths"].tolist() == [3, 3]
    assert 0 not in out["seq_lengths"].tolist()
    assert coll.stats.num_empty_skipped == 3
    assert (coll.stats.num_rows, coll.stats.num_documents, coll.stats.num_tokens) == (1, 2, 6)


@pytest.mark.parametrize(
    ("features", "match"),
    [
        ([{"input_ids": [1, 2]}, {"text": "hi", "attention_mask": [1]}],
         r"feature 1 has no 'input_ids'; keys found: \['attention_mask', 'text'\]"),
        ([{"input_ids": [1, 2]}, {"input_ids": [1, 2, 3], "seq_lengths": [1, 1]}],
         r"feature 1: seq_lengths sum to 2 but input_ids has 3 tokens"),
        ([{"input_ids": [1, 2, 3], "seq_lengths": [4, -1]}], r"feature 0: seq_lengths has negative entries"),
        ([{"input_ids": [1, 2, 3], "labels": [1, 2]}], r"feature 0: labels has 2 entries but input_ids has 3"),
        ([{"input_ids": []}, {"input_ids": [], "seq_lengths": [0]}], r"every document in the batch is empty"),
        ([{"input_ids": [[1, 2], [3, 4]]}], r"feature 0: input_ids must be a 1-D sequence"),
        ([{"input_ids": [1.5, 2.0]}], r"feature 0: input_ids must hold ints"),
    ],
)
def test_value_errors(features, match):
    with pytest.raises(ValueError, match=match):
        PackedDataCollator()(features)


def test_type_and_setting_errors():
    with pytest.raises(TypeError, match="expects a list of features"):
        PackedDataCollator()({"input_ids": [1, 2]})
    with pytest.raises(TypeError, match="feature 0 is a list"):
        PackedDataCollator()([[1, 2]])
    with pytest.raises(ValueError, match=r"return_tensors='tf'; legal values: \['pt', 'np'\]"):
        PackedDataCollator(return_tensors="tf")
    with pytest.raises(ValueError, match=r"return_tensors='jax'"):
        PackedDataCollator()([{"input_ids": [1]}], return_tensors="jax")


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256)
    model = LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa", dtype=torch.float64)
    return model.eval()


def test_tiny_llama_packed_logits_equal_per_document():
    model = _tiny_llama()
    feats = _docs([7, 1, 12, 5], seed=3)
    batch = PackedDataCollator()(feats)
    assert batch["seq_lengths"].numel() >= 3  # the row really holds several documents
    with torch.no_grad():
        # the whole collator output goes into the model: the extra keys must be accepted
        packed = model(**batch, use_cache=False)
        starts = batch["cu_seqlens"].tolist()
        for i, f in enumerate(feats):
            ids = torch.tensor([f["input_ids"]])
            alone = model(input_ids=ids, use_cache=False).logits
            torch.testing.assert_close(packed.logits[:, starts[i]:starts[i + 1]], alone, rtol=0, atol=1e-10)
        # packed loss = token-weighted mean of per-document losses (document starts are -100)
        total, count = 0.0, 0
        for f in feats:
            ids = torch.tensor([f["input_ids"]])
            n = ids.shape[1] - 1
            if n:
                total += model(input_ids=ids, labels=ids, use_cache=False).loss.item() * n
                count += n
    assert packed.loss.item() == pytest.approx(total / count, abs=1e-6)  # HF upcasts logits to fp32 in the loss
    # guard: without position_ids the documents would attend to each other and differ
    with torch.no_grad():
        leaky = model(input_ids=batch["input_ids"], use_cache=False).logits
    assert not torch.allclose(leaky, packed.logits, atol=1e-6)

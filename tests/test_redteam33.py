"""Red-team 33 (data as real tokenized datasets and users' own batches store it):

* ids and labels of a narrow integer dtype in a user's own batch: ``shard_batch`` wrote the ``-100`` of each
  document's last target in the labels' dtype (156 in uint8: trained as a real target), refused uint16 with a
  bare ``index_select`` error, and the sharder compared label ranges in uint8 (a false refusal); both widen to
  int64 first now;
* fixed-length token columns (``Sequence(..., length=n)``, Arrow ``fixed_size_list``, pre-chunked corpora) were
  refused by ``dataset_lengths`` / ``pack_dataset`` / ``ATACTrainer``, though the collator takes them;
* a dataset in ``"arrow"`` format failed at the first batch of the WFAP sampler's loader (a ``pyarrow.Table``
  iterates columns, not names);
* ``pack_dataset`` filled a null ``labels`` row with the sample's ``input_ids`` cast into the labels' type, which
  failed inside pyarrow for uint16 ids over 32767 beside int16 labels; such a column is packed as int64 now.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from datasets import Features, Sequence, Value

from atac_hf import PackedDataCollator, pack_dataset, plan_shards, shard_batch
from atac_hf.attention.shard import doc_lengths_from_batch
from atac_hf.packing.data.dataset import dataset_lengths

LENS = [7, 3, 5]


def _batch(dtype=torch.int64, labels_dtype=None):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 250, (1, sum(LENS)), generator=g)
    pos = torch.cat([torch.arange(n) for n in LENS])[None]
    return {"input_ids": ids.to(dtype), "labels": ids.to(labels_dtype or dtype), "position_ids": pos.to(dtype)}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint16, torch.uint8])
def test_shard_batch_takes_ids_and_labels_of_any_integer_dtype_as_int64(dtype):
    # (widened before the plan is read or a collective runs: one rank shows it)
    want = _batch()
    plan = plan_shards(doc_lengths_from_batch(want), 1)
    a, b = shard_batch(want, plan, rank=0, group=None), shard_batch(_batch(dtype), plan, rank=0, group=None)
    for key in ("input_ids", "shift_labels", "position_ids"):
        assert b[key].dtype == torch.int64 and torch.equal(a[key], b[key]), key
    assert a["num_items_in_batch"] == b["num_items_in_batch"]


def test_uint8_labels_keep_minus_100_at_each_documents_last_target():
    out = shard_batch(_batch(labels_dtype=torch.uint8), plan_shards(LENS, 1), rank=0, group=None)
    ends = np.cumsum(LENS) - 1
    assert out["shift_labels"][0, ends].tolist() == [-100] * len(LENS)  # not 156
    assert out["num_items_in_batch"] == sum(LENS) - len(LENS)


def test_the_sharder_checks_uint8_labels_against_the_vocabulary_in_int64():
    from transformers import AutoModelForCausalLM

    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.demo import tiny_llama_config
    from atac_hf.integrations.sharder import BatchSharder

    model = AutoModelForCausalLM.from_config(tiny_llama_config(num_layers=1, hidden_size=32), dtype=torch.float32)
    sharder = BatchSharder(ATACConfig(cp_size=1, max_tokens=64))
    sharder.bind_model(model, None)
    losses = [model(**sharder(_batch(labels_dtype=dt))).loss for dt in (torch.int64, torch.uint8)]
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)  # 259 vs 3 in uint8: no false refusal


def _ids(n=12, width=16, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 259, width).tolist() for _ in range(n)]


def test_fixed_length_token_columns_pack_as_list_columns():
    ids = _ids()
    plain = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    fixed = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids}, features=Features(
        {"input_ids": Sequence(Value("int64"), length=16), "labels": Sequence(Value("int64"), length=16)}))
    assert dataset_lengths(fixed).tolist() == [16] * 12
    a, b = (pack_dataset(d, max_tokens=40, progress=False) for d in (plain, fixed))
    for col in ("input_ids", "labels", "seq_lengths", "spans"):
        assert a[col] == b[col], col
    assert b.features["input_ids"] == Sequence(Value("int64"))  # rows of any length: no fixed length kept


def test_a_dataset_in_arrow_format_feeds_the_wfap_loader():
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.data import build_packed_dataloader

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4], [5, 6], [7, 8, 9]] * 4})
    batches = []
    for d in (ds, ds.with_format("arrow")):
        loader, _ = build_packed_dataloader(d, ATACConfig(cp_size=1, max_tokens=8), num_replicas=1, grad_accum=1,
                                            seed=0, collate_fn=PackedDataCollator())
        batches.append([b["input_ids"].tolist() for b in loader])
    assert batches[0] == batches[1] and len(batches[0]) >= 3


def test_null_labels_beside_ids_the_labels_type_cannot_hold_pack_as_int64():
    ids, labels = [[40000, 5, 6, 7], [1, 2, 3], [33000, 9]], [[-100, 5, 6, 7], None, None]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "labels": labels}, features=Features(
        {"input_ids": Sequence(Value("uint16")), "labels": Sequence(Value("int16"))}))
    packed = pack_dataset(ds, max_tokens=16, progress=False)
    assert packed.features["labels"].feature.dtype == "int64"
    row = packed[0]
    by_doc = {tuple(ids[s][a:b]): row["labels"][o:o + b - a]
              for o, (s, a, b) in zip(np.cumsum([0] + row["seq_lengths"][:-1]), row["spans"])}
    assert by_doc == {(40000, 5, 6, 7): [-100, 5, 6, 7], (1, 2, 3): [1, 2, 3], (33000, 9): [33000, 9]}

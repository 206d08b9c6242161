"""Red-team 31 (datasets with a transform set by ``with_transform`` / ``set_transform``).

Packing plans from a ``datasets.Dataset``'s stored Arrow columns (token counts, and ``pack_dataset``'s rows),
while a transform runs only when a row is read: a transform that adds a BOS token gave packs of other lengths
than WFAP planned (``build_packed_dataloader``), ``pack_dataset`` packed the stored ids without it (silently),
and a transform that tokenizes text on the fly was refused as "no 'input_ids' column". Each now refuses the
transform by name, with the fix (``dataset.map``); a plain format (``with_format("torch")``) is read as before.
"""

from __future__ import annotations

import datasets
import pytest

from atac_hf import ATACConfig, pack_dataset
from atac_hf.integrations.data import build_packed_dataloader
from atac_hf.packing.data.dataset import dataset_lengths

IDS = {"input_ids": [[5] * n for n in (3, 2, 5, 1, 4, 6)]}
FIX = r"apply it once with dataset\.map\(fn, batched=True\).*dataset\.reset_format\(\)"


def add_bos(batch):
    return {"input_ids": [[1] + x for x in batch["input_ids"]]}


def _tokenize(batch):
    return {"input_ids": [[len(w) for w in t.split()] for t in batch["text"]]}


@pytest.mark.parametrize("setter", ["with_transform", "set_transform"])
def test_every_packing_entry_refuses_a_transform_by_name(setter):
    ds = datasets.Dataset.from_dict(IDS)
    if setter == "with_transform":
        ds = ds.with_transform(add_bos)
    else:
        ds.set_transform(add_bos)
    assert ds[0]["input_ids"] == [1, 5, 5, 5]  # what a row read gives, unlike the stored lengths
    calls = {"the dataset": lambda: pack_dataset(ds, max_tokens=8, progress=False),
             "dataset": lambda: build_packed_dataloader(ds, ATACConfig(cp_size=1, max_tokens=8), num_replicas=1,
                                                        grad_accum=1, seed=0)}
    for where, call in calls.items():
        with pytest.raises(ValueError, match=rf"^{where} has a transform set with with_transform\(\) / "
                                             rf"set_transform\(\) \(add_bos\): it runs only when a row is read.*{FIX}"):
            call()
    with pytest.raises(ValueError, match=r"has a transform .*\(add_bos\)"):
        dataset_lengths(ds)


def test_on_the_fly_tokenization_is_named_rather_than_a_missing_column():
    ds = datasets.Dataset.from_dict({"text": ["a bb ccc", "dddd"]}).with_transform(_tokenize)
    with pytest.raises(ValueError, match=r"^the dataset has a transform .*\(_tokenize\).*or tokenize with map"):
        pack_dataset(ds, max_tokens=8, progress=False)


def test_the_trainer_refuses_a_transformed_train_dataset_at_construction(tmp_path):
    from transformers import TrainingArguments

    import _dist
    from atac_hf import ATACTrainer

    model = _dist.tiny_model("llama", __import__("torch").float32)
    ds = datasets.Dataset.from_dict(IDS).with_transform(add_bos)
    args = TrainingArguments(str(tmp_path), max_steps=1, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match=r"^train_dataset has a transform set with with_transform"):
        ATACTrainer(model=model, args=args, train_dataset=ds, atac_config=ATACConfig(cp_size=1, max_tokens=16))
    assert model.config._attn_implementation != "atac_cp"


def test_plain_formats_and_a_reset_transform_are_read_as_before():
    ds = datasets.Dataset.from_dict(IDS)
    for view in (ds.with_format("torch"), ds.with_format("numpy"), ds.with_transform(add_bos).with_format(None)):
        assert dataset_lengths(view).tolist() == [3, 2, 5, 1, 4, 6]
        assert len(pack_dataset(view, max_tokens=8, progress=False)) > 0

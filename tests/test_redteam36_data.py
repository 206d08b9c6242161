"""Red-team 36 (data side): a refused ``pack_dataset(DatasetDict)`` writes no cache file, the
collator refuses negative labels other than -100, ``load_state_dict(roll_over=...)`` takes a
bool only, and the messages of the collator, sampler and ``count_targets`` name the remedy."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

from atac_hf import PackedDataCollator, PackedIterableDataset, PackingConfig, WFAPBatchSampler, pack_dataset
from atac_hf.integrations.sharder import count_targets

datasets = pytest.importorskip("datasets")

MASK_MSG = ("pack_dataset: sample 0: completion_mask has values [2]; legal values: 0 (no loss on the token) and 1 "
            "(train on it), never null: the labels are built from it (-100 where 0). Fix the mask, or give the "
            "dataset its own 'labels' column")


def _good(n: int = 16) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"input_ids": [list(range(1, 3 + i % 7)) for i in range(n)]})


def _bad_mask() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]], "completion_mask": [[0, 1, 2], [1, 1]]})


def _tree(root) -> dict[str, bytes]:
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def _exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


def test_dd_refused_later_split_writes_no_explicit_cache_file(tmp_path):
    dd = datasets.DatasetDict({"train": _good(), "test": _bad_mask()})
    names = {"train": str(tmp_path / "out" / "train.arrow"), "test": str(tmp_path / "out" / "test.arrow")}
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match=_exact(MASK_MSG)):
        pack_dataset(dd, max_tokens=64, cache_file_name=names, progress=False)
    assert _tree(tmp_path) == before and not os.path.exists(names["train"])
    # the same call with the split fixed writes both
    fixed = datasets.DatasetDict({"train": _good(), "test": _good(4)})
    pack_dataset(fixed, max_tokens=64, cache_file_name=names, progress=False)
    assert os.path.isfile(names["train"]) and os.path.isfile(names["test"])


def test_dd_refused_later_split_writes_no_default_cache_file_and_keeps_an_existing_one(tmp_path):
    _good().save_to_disk(str(tmp_path / "src_train"))
    _bad_mask().save_to_disk(str(tmp_path / "src_test"))
    train = datasets.load_from_disk(str(tmp_path / "src_train"))
    test = datasets.load_from_disk(str(tmp_path / "src_test"))
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match=_exact(MASK_MSG)):
        pack_dataset(datasets.DatasetDict({"train": train, "test": test}), max_tokens=64, progress=False)
    assert _tree(tmp_path) == before
    # a cache file of the train split that existed before the call (loaded, not written) is left as it was
    packed = pack_dataset(train, max_tokens=64, progress=False)
    cached = packed.cache_files[0]["filename"]
    assert os.path.basename(cached).startswith("cache-atac-pack-")
    before = _tree(tmp_path)
    stat = os.stat(cached)
    with pytest.raises(ValueError, match=_exact(MASK_MSG)):
        pack_dataset(datasets.DatasetDict({"train": train, "test": test}), max_tokens=64, progress=False)
    assert _tree(tmp_path) == before and os.stat(cached).st_mtime_ns == stat.st_mtime_ns


def test_dd_split_that_cannot_be_written_removes_the_files_this_call_wrote(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"")  # a file where a directory is needed: unwritable, even for root
    existed = tmp_path / "old.arrow"
    existed.write_bytes(b"not an arrow file")
    dd = datasets.DatasetDict({"a": _good(), "b": _good(5), "c": _good(6)})
    names = {"a": str(tmp_path / "a.arrow"), "b": str(existed), "c": str(blocker / "sub" / "c.arrow")}
    with pytest.raises(OSError, match="^pack_dataset: cannot write cache_file_name="):
        pack_dataset(dd, max_tokens=64, cache_file_name=names, progress=False)
    assert not (tmp_path / "a.arrow").exists() and existed.exists()  # a file that existed before stays


def test_collator_labels_length_and_empty_batch_name_the_remedy():
    with pytest.raises(ValueError, match=_exact(
            "feature 0: labels has 2 entries but input_ids has 3; labels must have one entry per token (-100 where "
            "no loss). Fix the tokenization, or drop the column (the labels are then built from input_ids)")):
        PackedDataCollator()([{"input_ids": [1, 2, 3], "labels": [1, 2]}])
    with pytest.raises(ValueError, match=_exact(
            "every document in the batch is empty (1 features, 1 empty documents): nothing to train on; drop the "
            "empty samples from the dataset (dataset.filter(lambda s: len(s['input_ids']) > 0))")):
        PackedDataCollator()([{"input_ids": []}])


@pytest.mark.parametrize("labels", [[1, 2, -5], torch.tensor([1, 2, -5]), np.array([1, 2, -5], np.int32)])
def test_collator_refuses_negative_labels_other_than_minus_100(labels):
    c = PackedDataCollator()
    with pytest.raises(ValueError, match=_exact(
            "feature 1: labels holds -5: labels must be token ids >= 0, or -100 where a token gets no loss (the only "
            "index the loss ignores); replace the other negative labels with -100 in the dataset")):
        c([{"input_ids": [7, 8]}, {"input_ids": torch.tensor([1, 2, 3]), "labels": labels}])
    assert c.stats.num_rows == 0
    # -100 (and 0) stay legal, in lists and tensors
    out = c([{"input_ids": [1, 2, 3], "labels": [-100, 0, 3]},
             {"input_ids": torch.tensor([4, 5]), "labels": torch.tensor([-100, -100])}])
    assert out["labels"].tolist() == [[-100, 0, 3, -100, -100]]


def test_sampler_state_of_another_format_names_the_format_found():
    s = WFAPBatchSampler([5, 9, 30, 12] * 10, PackingConfig(max_tokens=64, packs_per_window=4))
    good = s.state_dict()
    fmt = good["format"]
    with pytest.raises(ValueError, match=_exact(
            f"not a WFAPBatchSampler state (expected format {fmt!r}, got format 'x'); pass the dict "
            "WFAPBatchSampler.state_dict() returned")):
        s.load_state_dict({**good, "format": "x"})
    with pytest.raises(ValueError, match=_exact(
            f"not a WFAPBatchSampler state (expected format {fmt!r}, got format None); pass the dict "
            "WFAPBatchSampler.state_dict() returned")):
        s.load_state_dict({k: v for k, v in good.items() if k != "format"})
    assert s.state_dict() == good


@pytest.mark.parametrize("roll_over", ["yes", 1, None])
def test_iterable_load_state_dict_refuses_a_non_bool_roll_over(roll_over):
    src = [{"input_ids": list(range(1, 4 + i % 30))} for i in range(100)]
    p = PackedIterableDataset(src, PackingConfig(max_tokens=64, packs_per_window=4))
    it = iter(p)
    for _ in range(3):
        next(it)
    good = p.state_dict()
    before = (json.dumps(p.state_dict(), sort_keys=True, default=str), vars(p).get("_roll_over"),
              vars(p).get("_resumed"))
    with pytest.raises(TypeError, match=_exact(
            f"load_state_dict: roll_over={roll_over!r} must be True or False (set roll_over)")):
        p.load_state_dict(good, roll_over=roll_over)
    assert (json.dumps(p.state_dict(), sort_keys=True, default=str), vars(p).get("_roll_over"),
            vars(p).get("_resumed")) == before
    p.load_state_dict(good, roll_over=np.bool_(True))  # numpy's bool is a bool


def test_count_targets_without_labels_names_the_remedy():
    with pytest.raises(ValueError, match=_exact(
            "a batch has no 'labels' or 'shift_labels' to count targets in; keys: ['input_ids', 'position_ids']; "
            "collate it with PackedDataCollator (it builds labels, from input_ids where a sample has none), or add "
            "'labels' (-100 where no loss) to the batch")):
        count_targets({"input_ids": torch.ones(1, 4, dtype=torch.long), "position_ids": torch.arange(4)[None]})

"""pack_dataset's cache files: rows of an on-disk source are written beside it and memory-mapped
(as ``Dataset.map`` does), reused only by a call with the same source, settings and code."""

from __future__ import annotations

import os
import tempfile
from unittest import mock

import numpy as np
import pytest

from atac_hf import pack_dataset
from atac_hf.packing.data import dataset as pd_mod
datasets = pytest.importorskip("datasets")  # not on every machine (the GPU image has none)

CAP = 1024


def _source(n: int = 120, seed: int = 0) -> datasets.Dataset:
    L = np.random.default_rng(seed).integers(1, 700, n)
    return datasets.Dataset.from_dict({"input_ids": [list(range(k)) for k in L],
                                       "labels": [[-100] + list(range(1, k)) for k in L],
                                       "text": ["x"] * n})


@pytest.fixture
def disk(tmp_path):
    """(in-memory source, the same rows saved and loaded back from disk: backed by a cache file)."""
    ds = _source()
    ds.save_to_disk(str(tmp_path / "src"))
    return ds, datasets.load_from_disk(str(tmp_path / "src"))


def _packed_files(directory) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.startswith("cache-atac-pack-"))


def _rows(ds) -> dict:
    return ds.with_format(None).to_dict()


def test_on_disk_source_gets_its_rows_written_beside_it_and_memory_mapped(disk, tmp_path):
    mem_src, disk_src = disk
    packed = pack_dataset(disk_src, max_tokens=CAP, progress=False)
    files = _packed_files(tmp_path / "src")
    assert len(files) == 1
    assert [os.path.basename(f["filename"]) for f in packed.cache_files] == files
    assert _rows(packed) == _rows(pack_dataset(mem_src, max_tokens=CAP, progress=False))
    assert packed.features == pack_dataset(mem_src, max_tokens=CAP, progress=False).features
    assert disk_src.cleanup_cache_files() == 1  # datasets' own cleanup finds the default file
    assert _packed_files(tmp_path / "src") == []


def test_a_second_call_loads_the_file_without_planning(disk):
    _, src = disk
    first, m1 = pack_dataset(src, max_tokens=CAP, progress=False, return_metrics=True)
    with mock.patch.object(pd_mod, "plan_packs", side_effect=AssertionError("planned again")):
        again, m2 = pack_dataset(src, max_tokens=CAP, progress=False, return_metrics=True)
    assert _rows(again) == _rows(first)
    assert m2 == m1
    assert again.cache_files == first.cache_files


def test_other_settings_or_no_reuse_pack_again(disk, tmp_path):
    _, src = disk
    pack_dataset(src, max_tokens=CAP, progress=False)
    other = pack_dataset(src, max_tokens=CAP // 2, progress=False)
    assert max(sum(s) for s in other["seq_lengths"]) <= CAP // 2
    assert len(_packed_files(tmp_path / "src")) == 2
    with mock.patch.object(pd_mod, "plan_packs", wraps=pd_mod.plan_packs) as planner:
        pack_dataset(src, max_tokens=CAP, progress=False, load_from_cache_file=False)
    assert planner.call_count == 1
    assert len(_packed_files(tmp_path / "src")) == 2  # the same file, rewritten


def test_a_file_written_by_other_settings_is_replaced_not_reused(tmp_path):
    src, path = _source(), tmp_path / "packed.arrow"
    pack_dataset(src, max_tokens=CAP, progress=False, cache_file_name=path)
    small = pack_dataset(src, max_tokens=CAP // 2, progress=False, cache_file_name=path)
    assert max(sum(s) for s in small["seq_lengths"]) <= CAP // 2
    assert _rows(small) == _rows(pack_dataset(src, max_tokens=CAP // 2, progress=False))
    path.write_bytes(b"not an arrow file")
    again = pack_dataset(src, max_tokens=CAP, progress=False, cache_file_name=path)
    assert _rows(again) == _rows(pack_dataset(src, max_tokens=CAP, progress=False))


def test_in_memory_sources_keep_in_memory_and_disabled_caching_build_in_memory(disk, tmp_path):
    mem_src, disk_src = disk
    assert pack_dataset(mem_src, max_tokens=CAP, progress=False).cache_files == []
    assert pack_dataset(disk_src, max_tokens=CAP, progress=False, keep_in_memory=True).cache_files == []
    datasets.disable_caching()
    try:
        assert pack_dataset(disk_src, max_tokens=CAP, progress=False).cache_files == []
    finally:
        datasets.enable_caching()
    assert _packed_files(tmp_path / "src") == []


def test_a_given_cache_file_name_is_written_for_an_in_memory_source_too(tmp_path):
    src, path = _source(), tmp_path / "sub" / "packed.arrow"
    packed = pack_dataset(src.with_format("numpy"), max_tokens=CAP, progress=False, cache_file_name=str(path))
    assert path.is_file() and [f["filename"] for f in packed.cache_files] == [str(path)]
    assert packed.format["type"] == "numpy"
    assert _rows(packed) == _rows(pack_dataset(src, max_tokens=CAP, progress=False))
    assert [p.name for p in path.parent.iterdir()] == ["packed.arrow"]  # no temporary file left


def test_dataset_dict_takes_a_path_per_split(tmp_path):
    dd = datasets.DatasetDict({"train": _source(80, 1), "test": _source(30, 2)})
    paths = {"train": tmp_path / "train.arrow", "test": tmp_path / "test.arrow"}
    packed = pack_dataset(dd, max_tokens=CAP, progress=False, cache_file_name=paths)
    for k in dd:
        assert [f["filename"] for f in packed[k].cache_files] == [str(paths[k])]
        assert _rows(packed[k]) == _rows(pack_dataset(dd[k], max_tokens=CAP, progress=False))
    only_train = pack_dataset(dd, max_tokens=CAP, progress=False, cache_file_name={"train": paths["train"]})
    assert only_train["test"].cache_files == []  # a split the mapping leaves out: the default rule


@pytest.mark.parametrize("kwargs, dataset_kind, match", [
    (dict(keep_in_memory=True, cache_file_name="x.arrow"), "dataset", "keep_in_memory=True and cache_file_name"),
    (dict(cache_file_name="x.arrow"), "dict", r"is one path, but a DatasetDict has splits \['train', 'test'\]"),
    (dict(cache_file_name={"train": "a.arrow", "valid": "b.arrow"}), "dict",
     r"splits \['valid'\] the DatasetDict does not have"),
    (dict(cache_file_name={"train": "a.arrow", "test": "./a.arrow"}), "dict", "two splits the same path"),
    (dict(cache_file_name={"train": "a.arrow"}), "dataset", "is a mapping"),
])
def test_contradictory_cache_settings_are_refused_before_anything_is_written(tmp_path, monkeypatch, kwargs,
                                                                            dataset_kind, match):
    monkeypatch.chdir(tmp_path)
    ds = _source(40)
    target = ds if dataset_kind == "dataset" else datasets.DatasetDict({"train": ds, "test": _source(20, 3)})
    with pytest.raises(ValueError, match=match):
        pack_dataset(target, max_tokens=CAP, progress=False, **kwargs)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad, match", [(dict(max_defer=-1), "max_defer"), (dict(window_size=0), "window_size=0"),
                                        (dict(num_replicas=0), "num_replicas=0")])
def test_bad_packing_settings_of_a_dataset_dict_are_refused_before_any_split_is_written(tmp_path, bad, match):
    dd = datasets.DatasetDict({"train": _source(40), "test": _source(20, 3)})
    paths = {k: tmp_path / f"{k}.arrow" for k in dd}
    with pytest.raises(ValueError, match=match):
        pack_dataset(dd, max_tokens=CAP, progress=False, cache_file_name=paths, **bad)
    assert os.listdir(tmp_path) == []


def test_an_unwritable_given_path_raises_and_leaves_nothing(tmp_path):
    src = _source(40)
    with mock.patch.object(tempfile, "mkstemp", side_effect=PermissionError(13, "Permission denied")):
        with pytest.raises(OSError, match=r"cannot write cache_file_name=.*packed\.arrow.*keep_in_memory=True"):
            pack_dataset(src, max_tokens=CAP, progress=False, cache_file_name=tmp_path / "packed.arrow")
    assert not (tmp_path / "packed.arrow").exists()


def test_an_unwritable_default_location_falls_back_to_memory_with_a_warning(disk, tmp_path):
    mem_src, disk_src = disk
    with mock.patch.object(tempfile, "mkstemp", side_effect=PermissionError(13, "Permission denied")):
        with pytest.warns(UserWarning, match="building them in memory"):
            packed = pack_dataset(disk_src, max_tokens=CAP, progress=False)
    assert packed.cache_files == []
    assert _rows(packed) == _rows(pack_dataset(mem_src, max_tokens=CAP, progress=False))


def test_an_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    src, path = _source(200), tmp_path / "packed.arrow"
    monkeypatch.setattr(pd_mod, "_BUILD_TOKENS", 2048)  # several batches

    real = pd_mod._build_batches

    def failing(*args, **kwargs):
        for i, batch in enumerate(real(*args, **kwargs)):
            if i == 2:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(pd_mod, "_build_batches", failing)
    with pytest.raises(KeyboardInterrupt):
        pack_dataset(src, max_tokens=CAP, progress=False, cache_file_name=path)
    assert os.listdir(tmp_path) == []


def test_rows_are_built_in_batches_with_the_same_result(monkeypatch):
    src = _source(200)
    whole = _rows(pack_dataset(src, max_tokens=CAP, progress=False))
    monkeypatch.setattr(pd_mod, "_BUILD_TOKENS", 1500)
    assert _rows(pack_dataset(src, max_tokens=CAP, progress=False)) == whole


def test_a_cache_file_name_that_is_not_a_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="cache_file_name must be a path .* got int"):
        pack_dataset(_source(20), max_tokens=CAP, progress=False, cache_file_name=5)
    assert os.listdir(tmp_path) == []


def test_a_selected_and_shuffled_on_disk_source_gets_its_own_file(disk, tmp_path):
    mem_src, disk_src = disk
    view = disk_src.shuffle(seed=1).select(range(50))
    packed = pack_dataset(view, max_tokens=CAP, progress=False)
    whole = pack_dataset(disk_src, max_tokens=CAP, progress=False)
    assert len(_packed_files(tmp_path / "src")) == 2 and packed.cache_files != whole.cache_files
    assert _rows(packed) == _rows(pack_dataset(mem_src.shuffle(seed=1).select(range(50)), max_tokens=CAP,
                                               progress=False))

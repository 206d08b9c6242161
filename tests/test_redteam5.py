"""Red-team 5: hostile inputs and a new user's first hour (docs/RELIABILITY.md, "Red-team 5").

Each test is the minimal repro of one bug found by that pass, fixed in the package."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest

datasets = pytest.importorskip("datasets")

from atac_hf import ATACConfig, pack_dataset  # noqa: E402


def _pack(ds, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pack_dataset(ds, max_tokens=8, progress=False, **kw)


# ---------------------------------------------------------------------------- pack_dataset
@pytest.mark.parametrize("ids, arrow, hint", [
    ([[1.5, 2.0]], "double", "cast_column"),
    ([["a", "b"]], "string", "cast_column"),
    ([[True, False]], "bool", "cast_column"),
    # rows of ids per sample: a cast cannot flatten them (red-team 11: the hint said cast_column)
    ([[[1, 2], [3]]], "list<item: int", r"flatten each sample first: dataset\.map"),
])
def test_pack_dataset_refuses_input_ids_that_are_not_int_token_ids(ids, arrow, hint):
    # was: packed as they were (float, string, bool or nested "token ids" in the rows)
    with pytest.raises(TypeError, match=rf"input_ids must be a list column of int token ids, got Arrow type "
                                        rf"list<item: {arrow}.*{hint}"):
        _pack(datasets.Dataset.from_dict({"input_ids": ids}))


def test_pack_dataset_refuses_negative_null_and_over_int64_ids_naming_the_sample():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, -4], [5, None, 7]]})
    with pytest.raises(ValueError, match=r"sample 1: input_ids\[1\] is -4; input_ids must hold ints in \[0, "):
        _pack(ds)
    with pytest.raises(ValueError, match=r"sample 0: input_ids\[1\] is null"):
        _pack(ds.select([2, 0]))
    assert _pack(ds.select([0]))["input_ids"] == [[1, 2]]  # a bad sample outside the selection is no matter
    big = datasets.Dataset(datasets.table.InMemoryTable(pa.table(
        {"input_ids": pa.array([[1, 2**64 - 1]], type=pa.list_(pa.uint64()))})))
    with pytest.raises(ValueError, match=r"sample 0: input_ids\[1\] is 18446744073709551615"):
        _pack(big)
    # a null sample stays an empty one (skipped with the zero-length warning), -100 labels stay legal
    out = _pack(datasets.Dataset.from_dict({"input_ids": [[1, 2], None], "labels": [[-100, 2], None]}))
    assert out["input_ids"] == [[1, 2]] and out["labels"] == [[-100, 2]]


@pytest.mark.parametrize("labels", [[5, 6], ["abc", "d"]])
def test_pack_dataset_refuses_a_labels_column_that_is_not_per_token(labels):
    # was: dropped with an INFO log line, so the packs trained on input_ids instead of the user's labels
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]], "labels": labels})
    with pytest.raises(ValueError, match=r"the 'labels' column is not a list with one entry per token .*"
                                         r"remove_columns\('labels'\)"):
        _pack(ds)


def test_pack_dataset_refuses_float_or_null_labels():
    with pytest.raises(TypeError, match=r"labels must be a list column of int token ids, got Arrow type list<item: double>"):
        _pack(datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1.5, 2.0]]}))
    with pytest.raises(ValueError, match=r"sample 0: labels\[1\] is null; labels must hold ints \(-100 where no loss\)"):
        _pack(datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "labels": [[1, None, 3]]}))


def test_pack_dataset_checks_seed_and_flags():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]]})
    with pytest.raises(ValueError, match=r"seed=-1 is invalid: it must be an int in \[0, 2\*\*63\) \(set seed\)"):
        _pack(ds, shuffle=True, seed=-1)  # was numpy's bare "expected non-negative integer"
    for flag in ("shuffle", "return_metrics", "progress", "keep_in_memory"):
        with pytest.raises(TypeError, match=rf"{flag}='yes' must be True or False \(set {flag}\)"):
            pack_dataset(ds, max_tokens=8, **{"progress": False, flag: "yes"})  # was: truthy, taken as True


# ---------------------------------------------------------------------------- ATACConfig
def test_from_sources_refuses_non_mapping_overrides_and_environ():
    with pytest.raises(TypeError, match=r"overrides must be a mapping of ATAC config fields .* got list"):
        ATACConfig.from_sources(environ={}, overrides=[("cp_size", 2)])  # was AttributeError: 'list' ... 'items'
    with pytest.raises(TypeError, match=r"environ must be a mapping of environment variables or None, got list"):
        ATACConfig.from_sources(environ=[("ATAC_CP_SIZE", "2")])


# ---------------------------------------------------------------------------- ATACTrainer
def test_trainer_honours_sequential_sampling_and_warns_for_the_ignored_strategies(tmp_path):
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf import ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    ds = datasets.Dataset.from_dict({"input_ids": [[i + 1] * (3 + i % 5) for i in range(30)]})
    seen = {}
    for strategy in ("random", "sequential", "group_by_length"):
        model = AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1))
        args = TrainingArguments(output_dir=str(tmp_path / strategy), report_to=[], use_cpu=True, max_steps=1,
                                 train_sampling_strategy=strategy)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = ATACTrainer(model=model, args=args, train_dataset=ds, atac_config=ATACConfig(max_tokens=16))
        trainer.get_train_dataloader()
        seen[strategy] = (trainer.atac_sampler.shuffle,
                          [str(w.message) for w in caught if "train_sampling_strategy" in str(w.message)])
    # was: "sequential" silently shuffled (the WFAP sampler read ATACConfig.shuffle only)
    assert seen["random"] == (True, []) and seen["sequential"] == (False, [])
    shuffle, msgs = seen["group_by_length"]
    assert shuffle and len(msgs) == 1 and "train_sampling_strategy='group_by_length' is ignored" in msgs[0]


# ---------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("spec", ["5,3,,2", "5,3,", ",", ""])
def test_plan_refuses_empty_doc_length_entries(capsys, spec):
    from atac_hf.cli import main

    # was: empty entries dropped, so '5,3,,2' (a lost digit) planned the pack 5,3,2
    assert main(["plan", "--doc-lengths", spec, "--cp-size", "2", "--strategy", "atp"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("atac-hf plan: error: --doc-lengths ") and "must be comma-separated ints >= 1" in err
    assert main(["plan", "--doc-lengths", " 5, 3", "--cp-size", "2", "--strategy", "atp"]) == 0  # spaces are fine


def test_count_targets_refuses_what_is_not_a_batch():
    pytest.importorskip("torch")
    import torch

    from atac_hf.integrations.sharder import count_targets

    batch = {"input_ids": torch.ones(1, 4, dtype=torch.long), "labels": torch.tensor([[-100, 1, 2, 3]])}
    assert count_targets(batch) == 3 and count_targets([batch, batch]) == 6 and count_targets(iter([batch])) == 3
    # was AttributeError: 'int' object has no attribute 'get' (ATACAccelerator.shard / count_items)
    with pytest.raises(TypeError, match=r"take a packed batch .* got int"):
        count_targets([1, 2])
    with pytest.raises(TypeError, match=r"take a packed batch .* got int"):
        count_targets(5)


# ---------------------------------------------------------------------------- the pass's leftovers
def test_plan_shards_refuses_a_masked_array_with_masked_entries():
    # was: np.asarray planned the masked entries' raw data as documents
    from atac_hf import plan_shards

    lengths = np.ma.masked_array([5, 900, 3], mask=[False, True, False])
    with pytest.raises(ValueError, match=r"masked array with masked entries.*doc_lengths.compressed\(\)"):
        plan_shards(lengths, 2)
    assert plan_shards(lengths.compressed(), 2).num_tokens == 8
    assert plan_shards(np.ma.masked_array([5, 3]), 2).num_tokens == 8  # nothing masked: planned as is


@pytest.mark.parametrize("raw", ["1_0", "\u0664", " 4x", "+", "9" * 5000])
def test_integer_environment_variables_take_ascii_digits_only(raw):
    # was: int() read "1_0" as 10 and Arabic-Indic "٤" as 4
    with pytest.raises(ValueError, match=r"ATAC_CP_SIZE=.* is not an integer \(ASCII digits"):
        ATACConfig.from_env({"ATAC_CP_SIZE": raw})
    assert ATACConfig.from_env({"ATAC_CP_SIZE": " 4 "}).cp_size == 4


def test_reduce_loss_refuses_a_number_naming_what_it_takes():
    # was: AttributeError: 'float' object has no attribute 'detach'
    from atac_hf import ATACAccelerator

    acc = ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True)
    with pytest.raises(TypeError, match=r"reduce_loss takes the loss tensor .* got float 1.0; pass the tensor"):
        acc.reduce_loss(1.0)
    import torch

    assert acc.reduce_loss(torch.tensor(2.0)).item() == 2.0
    acc.end_training()


def test_simulate_names_the_flags_when_max_tokens_is_below_cp(capsys):
    # was: "ClusterConfig.max_tokens=1 is smaller than cp_size=2" (names no flag)
    from atac_hf.cli import main

    assert main(["simulate", "--max-tokens", "1", "--cp", "2"]) == 2
    assert "--max-tokens=1 is smaller than --cp=2" in capsys.readouterr().err

"""Red-team 17's repros (a sweep of the public API with hostile arguments): the training path and
the integration helpers. Each bad value is refused at the call, naming the value and what is legal;
before, each was coerced (a loss normaliser of ``-3`` or ``"4"``, a ``grad_accum`` of 2.5 taken as 2,
a YAML key given twice taken at its last value) or failed later with a raw error."""

import warnings

import numpy as np
import pytest
import torch

from atac_hf import ATACAccelerator, ATACConfig, PackedDataCollator, pack_dataset, plan_shards
from atac_hf.attention import shard_batch
from atac_hf.attention.shard import doc_lengths_from_batch
from atac_hf.integrations import (BatchSharder, build_packed_dataloader, build_parallelism_config,
                                  check_dataset_columns, mesh_groups, placement_warnings)

CFG = ATACConfig(cp_size=2, max_tokens=64)
DATA = [{"input_ids": list(range(1, 2 + i % 7))} for i in range(40)]


def _batch():
    return PackedDataCollator()([{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6, 7]}])


# ---------------------------------------------------------------------------- the loss normaliser
@pytest.fixture(scope="module")
def accelerator():
    from transformers import AutoModelForCausalLM

    from atac_hf.integrations.demo import tiny_llama_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True)
        torch.manual_seed(0)
        acc.prepare(AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1)))
    yield acc
    acc.end_training()


@pytest.mark.parametrize("bad", [-3, True, "4", float("nan"), float("inf"), None.__class__, torch.tensor(True),
                                 torch.ones(2)])
def test_accelerator_shard_refuses_a_target_count_that_is_not_a_count(accelerator, bad):
    accelerator._atac_counted = False
    with pytest.raises(ValueError, match=r"num_items_in_batch=.* is invalid: it must be the step's target count, "
                                         r"a finite number >= 0 \(accelerator.count_items"):
        accelerator.shard(_batch(), num_items_in_batch=bad)
    assert accelerator._atac_counted is False  # refused: nothing changed


def test_accelerator_shard_takes_a_count_as_a_number_tensor_or_array(accelerator):
    for n in (5, np.int64(5), 5.0, np.float64(5.0), torch.tensor(5), torch.tensor(5.0), np.array(5)):
        assert accelerator.shard(_batch(), num_items_in_batch=n)["num_items_in_batch"] == 5.0
    assert accelerator.shard(_batch(), num_items_in_batch=0)["num_items_in_batch"] == 1.0  # no target: as before


# ---------------------------------------------------------------------------- shard_batch
def _plan(batch):
    return plan_shards(doc_lengths_from_batch(batch), 1)


@pytest.mark.parametrize("bad", [-3, "4", True, float("nan"), float("inf"), torch.ones(2), torch.tensor(True)])
def test_shard_batch_refuses_a_bad_num_items_in_batch(bad):
    batch = {**_batch(), "num_items_in_batch": bad}
    with pytest.raises(ValueError, match=r"num_items_in_batch.* (is invalid|tensor): it must be the count of target "
                                         r"tokens the loss divides by"):
        shard_batch(batch, _plan(batch), 0)


@pytest.mark.parametrize("good", [5, 2.5, np.int64(3), torch.tensor(5), torch.tensor(2.5), np.array(5)])
def test_shard_batch_keeps_a_legal_num_items_in_batch(good):
    batch = {**_batch(), "num_items_in_batch": good}
    assert shard_batch(batch, _plan(batch), 0)["num_items_in_batch"] is good  # kept as given


def test_shard_batch_refuses_bool_labels_float_ids_and_a_non_bool_debug():
    batch = _batch()
    with pytest.raises(ValueError, match=r"'labels' has dtype torch.bool: labels must be an integer tensor"):
        shard_batch({**batch, "labels": batch["labels"] > 0}, _plan(batch), 0)
    with pytest.raises(ValueError, match=r"'input_ids' has dtype torch.float32: token ids must be an integer tensor"):
        shard_batch({**batch, "input_ids": batch["input_ids"].float()}, _plan(batch), 0)
    with pytest.raises(ValueError, match=r"debug='no' is not a bool"):
        shard_batch(batch, _plan(batch), 0, debug="no")


# ---------------------------------------------------------------------------- data
@pytest.mark.parametrize("kw, msg", [
    ({"return_shift_labels": "no"}, r"return_shift_labels='no' is not a bool"),
    ({"return_seq_lengths": "False"}, r"return_seq_lengths='False' is not a bool"),
    ({"separator_id": True}, r"separator_id=True is invalid: it must be an int64 label, -100 .* or a token id"),
    ({"separator_id": -100.7}, r"separator_id=-100.7 is invalid"),
    ({"separator_id": None}, r"separator_id=None is invalid"),
    ({"separator_id": 2**70}, r"separator_id=1180591620717411303424 is invalid"),
    ({"stats": None}, r"stats=None is not a CollatorStats"),
])
def test_collator_refuses_bad_settings_at_construction(kw, msg):
    with pytest.raises(TypeError, match=msg):
        PackedDataCollator(**kw)
    assert PackedDataCollator(separator_id=0, return_shift_labels=np.bool_(True)).separator_id == 0


def test_pack_dataset_warns_of_padded_samples_naming_the_sample():
    """Padded samples are packed as TRL's pack_dataset packs them (its own example has padded masks), with a
    warning up front naming the sample: before, nothing was said until the collator refused the packed row."""
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [[4, 5], [0, 0, 1, 2, 3]],
                                     "attention_mask": [[1, 1], [0, 0, 1, 1, 1]]})
    with pytest.warns(UserWarning, match=r"pack_dataset: sample 1 \(and maybe others\): attention_mask has 2 of 5 "
                                         r"entries not 1 \(padding\): the pad tokens are packed"):
        out = pack_dataset(ds, max_tokens=8, progress=False)
    with pytest.raises(ValueError, match=r"attention_mask has .* not 1 \(padding\)"):
        PackedDataCollator()([out[0]])
    ones = datasets.Dataset.from_dict({"input_ids": [[4, 5], [1, 2, 3]], "attention_mask": [[1, 1], [1, 1, 1]]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(sum(pack_dataset(ones, max_tokens=8, progress=False)["seq_lengths"], [])) == [2, 3]


@pytest.mark.parametrize("kw, msg", [
    ({"grad_accum": 2.5}, r"grad_accum=2.5 is invalid: it must be an int >= 1 \(micro-batches per optimizer step\)"),
    ({"grad_accum": True}, r"grad_accum=True is invalid"),
    ({"grad_accum": 0}, r"grad_accum=0 is invalid"),
    ({"num_replicas": 0}, r"num_replicas=0 is invalid: it must be an int >= 1 \(DP replicas"),
    ({"collate_fn": 5}, r"collate_fn=5 is not callable"),
])
def test_build_packed_dataloader_refuses_bad_sizes(kw, msg):
    with pytest.raises(ValueError, match=msg):
        build_packed_dataloader(DATA, CFG, **kw)
    with pytest.raises(ValueError, match=r"config must be an ATACConfig"):
        build_packed_dataloader(DATA, None)


@pytest.mark.parametrize("bad, msg", [(None, "NoneType"), ({"input_ids": [[1]]}, "dict")])
def test_check_dataset_columns_refuses_what_is_not_a_dataset(bad, msg):
    with pytest.raises(ValueError, match=rf"dataset is a {msg}, not a map-style dataset: pass a datasets.Dataset"):
        check_dataset_columns(bad)


# ---------------------------------------------------------------------------- config and mesh
@pytest.mark.parametrize("bad", [2.5, True, "4", None, 0])
def test_packing_config_refuses_a_window_that_is_not_a_count(bad):
    with pytest.raises(ValueError, match=r"packs_per_window=.* is invalid: it must be an int >= 1"):
        CFG.packing_config(bad)


def test_device_types_are_read_from_device_strings_and_devices():
    assert CFG.resolved_min_chunk("cuda:0") == CFG.resolved_min_chunk("cuda") == 128
    assert CFG.resolved_min_chunk(torch.device("cpu")) == 1
    assert CFG.resolved_attention_backend("cuda:1") == CFG.resolved_attention_backend("cuda")
    for bad in ("CUDA", None, 5):
        with pytest.raises(ValueError, match=r"device_type=.* is not a device: pass a device type such as 'cpu'"):
            CFG.check_runtime(bad)


@pytest.mark.parametrize("text, suffix, key", [
    ("cp_size: 2\nmax_tokens: 4096\ncp_size: 8\n", ".yaml", "cp_size"),
    ("cp_size: 2\nmax_tokens: 4096\npacking_options:\n  overlength: split\n  overlength: error\n", ".yaml",
     "overlength"),
    ('{"cp_size": 2, "max_tokens": 4096, "cp_size": 4}', ".json", "cp_size"),
])
def test_a_config_key_given_twice_is_refused(tmp_path, text, suffix, key):
    path = tmp_path / f"atac{suffix}"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"the key '{key}' appears twice in one (mapping|object)"):
        ATACConfig.from_yaml(str(path))
    same_key_apart = tmp_path / "apart.yaml"  # one key in sibling mappings or list items is not a duplicate
    same_key_apart.write_text("cp_size: 2\nmax_tokens: 4096\npacking_options: {price_band: [0.5, 2.0]}\n"
                              "atac_extra: [{a: 1}, {a: 2}]\n")
    with pytest.raises(ValueError, match=r"unknown|atac_extra"):  # refused for the unknown field, not as a duplicate
        ATACConfig.from_yaml(str(same_key_apart))
    ok = tmp_path / "ok.yaml"
    ok.write_text("cp_size: 2\nmax_tokens: 4096\npacking_options:\n  price_band: [0.5, 2.0]\nshuffle: false\n")
    assert ATACConfig.from_yaml(str(ok)).packing_options == {"price_band": [0.5, 2.0]}


def test_parallelism_helpers_refuse_values_that_are_not_counts():
    for kw, msg in (({"world_size": "4"}, r"world_size='4' is invalid: it must be an int"),
                    ({"world_size": 2.0}, r"world_size=2.0 is invalid"),
                    ({"world_size": None}, r"world_size=None is invalid"),
                    ({"world_size": 8, "tp_size": True}, r"tp_size=True is invalid"),
                    ({"world_size": 4, "environ": [("A", "B")]}, r"environ must be a mapping")):
        with pytest.raises(ValueError, match=msg):
            build_parallelism_config(CFG, **kw)
    with pytest.raises(ValueError, match=r"ATACConfig is not a mesh: pass an accelerate ParallelismConfig"):
        mesh_groups(CFG)
    pc = build_parallelism_config(CFG, 8, environ={})
    for bad in (2.5, None):
        with pytest.raises(ValueError, match=r"procs_per_node=.* is invalid: it must be an int"):
            placement_warnings(pc, bad)
    with pytest.raises(ValueError, match=r"mesh size cp='2' is invalid"):
        mesh_groups({"cp": "2"})


@pytest.mark.parametrize("kw, msg", [
    ({"cp_rank": 1.0}, r"cp_rank=1.0 is invalid: it must be an int >= 0"),
    ({"cp_rank": "0"}, r"cp_rank='0' is invalid"),
    ({"cp_rank": 2}, r"cp_rank=2 is outside the CP group of size 2"),
    ({"strategy": "nope"}, r"strategy='nope' is not a sharding strategy; legal values: \['atp'"),
    ({"kv_bytes_per_token": "x"}, r"kv_bytes_per_token='x' is invalid: a finite number >= 0"),
    ({"kv_bytes_per_token": float("nan")}, r"kv_bytes_per_token=nan is invalid"),
])
def test_batch_sharder_refuses_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        BatchSharder(CFG, **kw)


# ---------------------------------------------------------------------------- ShardPlan
def test_shard_plan_methods_refuse_ranks_that_are_not_ints_and_bad_byte_counts():
    plan = plan_shards([5, 3, 8], 2)
    for bad in (1.0, True, "1", None):
        for method in (plan.rank_segments, plan.rank_token_indices, plan.local_layout):
            with pytest.raises(ValueError, match=r"rank .* is not an int: legal ranks of the CP group of size 2: 0..1"):
                method(bad)
    assert plan.rank_token_indices(np.int64(1)).tolist() == plan.rank_token_indices(1).tolist()
    for bad in (-1, float("nan"), "8", True):
        with pytest.raises(ValueError, match=r"kv_bytes_per_token=.* is invalid: a finite number >= 0"):
            plan.kv_bytes(bad)
    assert plan.kv_bytes(np.float32(2.0)) == plan.kv_bytes(2)


def test_plan_shards_takes_python_ints_held_as_objects_like_the_list():
    """Red-team 17: an object array of small ints (a pandas object column) was refused as "ints beyond int64 or
    other objects" while the same list planned; bools, strings and ints past int64 among them still are."""
    assert plan_shards(np.array([5, 3, 8], dtype=object), 2).doc_lengths.tolist() == [5, 3, 8]
    for bad in ([3, True], [3, 2**70], [3, "a"]):
        with pytest.raises(ValueError, match=r"doc_lengths must be integers \(ints >= 1\), got ints beyond int64"):
            plan_shards(np.array(bad, dtype=object), 2)


def test_shard_helpers_refuse_inputs_that_do_not_match_the_pack():
    """Red-team 17: doc_lengths_from_batch(None) raised AttributeError; build_shift_labels with lengths that do not
    cover the labels raised IndexError (or built wrong labels); unshard returned 6 rows for a 5-token plan."""
    from atac_hf.attention.shard import build_shift_labels, unshard

    with pytest.raises(TypeError, match=r"batch must be a mapping of tensors"):
        doc_lengths_from_batch(None)
    labels = torch.arange(5).view(1, 5)
    for bad in ([3, 3], [2.0, 3.0], [-1, 6], [[3, 3]]):
        with pytest.raises(ValueError, match=r"doc_lengths .* must be ints >= 0 summing to the 5 tokens of labels"):
            build_shift_labels(labels, bad)
    for good in (np.array([2, 3]), [[2, 3]], np.array([[2, 3, 0]]), torch.tensor([2, 3], dtype=torch.int32)):
        assert build_shift_labels(labels, good).tolist() == [[1, -100, 3, 4, -100]]  # (B, k) rows, padding zeros
    with pytest.raises(TypeError, match=r"labels must be a tensor"):
        build_shift_labels([0, 1], [2])
    plan = plan_shards([5], 1)
    for bad in (torch.zeros(1, 6, 4), torch.zeros(5, 4), torch.zeros(5)):
        with pytest.raises(ValueError, match=r"local has shape .*: it must be \(1, 5, \.\.\.\)"):
            unshard(bad, plan, 0)
    with pytest.raises(ValueError, match=r"rank 'x' is not an int: legal ranks"):
        unshard(torch.zeros(1, 5), plan, "x")
    with pytest.raises(TypeError, match=r"unshard takes a tensor and a ShardPlan, got ndarray"):
        unshard(np.zeros((1, 5)), plan, 0)
    assert torch.equal(unshard(torch.arange(5.0).view(1, 5), plan, 0), torch.arange(5.0).view(1, 5))


@pytest.mark.parametrize("argv, flag", [(["plan", "--doc-lengths", "5,3", "--cp-size", "\u0662"], "--cp-size"),
                                        (["check-model", "--world-size", "\u0662"], "--world-size"),
                                        (["check-model", "--timeout", "\u0661\u0662"], "--timeout")])
def test_number_flags_take_ascii_digits_only(argv, flag, capsys):
    """Red-team 17: argparse's int and float take other scripts' digits ('\u0662' is 2), which --doc-lengths and the
    ATAC_* variables refuse."""
    from atac_hf.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    assert f"argument {flag}: " in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--num-samples", "--seed", "--packs-per-window", "--window", "--max-defer"])
def test_pack_int_flags_take_ascii_digits_only(flag, capsys):
    """Red-team 17: `atac-hf pack`'s int flags took other scripts' digits (argparse's int)."""
    from atac_hf.cli import main

    with pytest.raises(SystemExit):
        main(["pack", "--workload", "sft", "--max-tokens", "4K", flag, "\u0662"])
    assert f"argument {flag}: '\u0662' is not an int (ASCII digits" in capsys.readouterr().err


def test_a_packing_options_variable_with_a_key_twice_is_refused():
    with pytest.raises(ValueError, match=r"the key 'max_defer' appears twice in one object"):
        ATACConfig.from_sources(environ={"ATAC_PACKING_OPTIONS": '{"max_defer": 2, "max_defer": 3}'})
    got = ATACConfig.from_sources(environ={"ATAC_PACKING_OPTIONS": '{"max_defer": 2, "price_band": [0.5, 2]}'})
    assert got.packing_options["max_defer"] == 2

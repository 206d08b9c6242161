"""Forty-seventh mutation pass (docs/TESTING.md): tests that kill the survivors in red-team 38's and review 42's
code (the profile's model and tp_size, ``--model`` of a composite config, the fragment limit of ``simulate``, the
dataset path checks, ``state_field_diff``, the ``pack`` summary, the separator refusal, the TP per-head gradients).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch

from atac_hf._argtypes import model_arg
from atac_hf.cli import main
from atac_hf.cost import CostModel
from atac_hf.integrations import tensor_parallel as tpm
from atac_hf.packing.data.collator import PackedDataCollator
from atac_hf.packing.validate import MAX_FRAGMENTS, state_field_diff
from atac_hf.sim.bench import _profile_dims, default_grid
from atac_hf.sim.cluster import ClusterConfig
from atac_hf.sim.simulate import _check_fragments
from atac_hf.workloads import _lengths_format_hint, load_workload

sys.path.insert(0, os.path.dirname(__file__))
from test_tp_grad_sync import _Norm, two_tp_ranks  # noqa: E402,F401  (the per-head parameter, 2 simulated TP ranks)

_DIMS = {"hidden_size": 4096, "num_layers": 32, "num_heads": 32, "num_kv_heads": 32, "head_dim": 128,
         "intermediate_size": 11008, "vocab_size": 32000}


# ------------------------------------------------------------------------------------------ state_field_diff
def test_state_field_diff_names_each_differing_field_and_cuts_long_text():
    assert state_field_diff({"a": 1, "b": 2, "d": 5}, {"a": 1, "b": 3, "c": 4}) == (
        "b=2 (this packer: 3), c='-' (this packer: 4), d=5 (this packer: '-')")
    assert state_field_diff(None, {"a": 1}) == "a='-' (this packer: 1)"  # a saved object that is not a mapping
    assert state_field_diff([("a", 1)], {"a": 1}) == "a='-' (this packer: 1)"
    long = "k" * 41
    assert state_field_diff({long: 1}, {long: 2}) == f"{'k' * 40}=1 (this packer: 2)"
    many = state_field_diff({f"f{i}": i for i in range(40)}, {})
    assert len(many) == 300 and many.startswith("f0=0 (this packer: '-'), f1=1")


# ------------------------------------------------------------------------------------------ --model
def test_model_arg_names_the_flag_for_an_unreadable_config_and_reads_plain_configs_whole(tmp_path):
    folder = tmp_path / "ckpt"  # a folder without config.json: read as the file it names
    folder.mkdir()
    with pytest.raises(ValueError) as e:
        model_arg(str(folder))
    assert str(e.value) == f"--model config {str(folder)!r} is a directory, not a JSON file (check --model)"
    both = {"hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 2,
            "text_config": {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 4}}
    path = tmp_path / "both.json"
    path.write_text(json.dumps(both))
    dims = model_arg(str(path))  # (read to its ModelDims since red-team 53)
    assert (dims.hidden_size, dims.num_heads, dims.num_layers) == (1024, 8, 2)  # top-level: not its text_config
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"model_type": "x"}))
    with pytest.raises(ValueError, match=r"^--model '.*plain.json': cannot read model dimensions: the config has no "
                                         r"hidden_size.*give --model a preset"):
        model_arg(str(plain))  # no text_config: its own fields, refused by name


# ------------------------------------------------------------------------------------------ bench --profile
def test_profile_dims_names_unknown_and_missing_fields_together_and_cuts_them():
    fields = {k: v for k, v in _DIMS.items() if k != "num_layers"}
    fields["rope_theta"] = 1
    with pytest.raises(ValueError, match=r"metadata\.model with unknown fields \['rope_theta'\] and no "
                                         r"\['num_layers'\]; legal fields"):
        _profile_dims("p.json", fields)
    key = "x" * 90
    with pytest.raises(ValueError) as e:
        _profile_dims("p.json", {**_DIMS, key: 1})
    assert f"unknown fields ['{'x' * 80}']" in str(e.value)
    extra = {f"u{i:02d}": 0 for i in range(12)}
    with pytest.raises(ValueError) as e:
        _profile_dims("p.json", {**_DIMS, **extra})
    assert f"unknown fields {sorted(extra)[:10]};" in str(e.value)


def test_bench_profile_without_tp_size_is_taken_as_measured_at_tp_1(tmp_path):
    path = tmp_path / "p.json"
    CostModel(linear_s_per_token=2e-6, attn_s_per_pair=2e-10, kv_bytes_per_token=16384.0).save(
        str(path), model=dict(_DIMS))  # metadata without tp_size
    scenario = next(s for s in default_grid(None) if s.name == "7b-32K-cp2-pp1-wlbllm")
    cfg = scenario.config(str(path))
    assert cfg.tp_size == 1 and cfg.dims.hidden_size == 4096


# ------------------------------------------------------------------------------------------ simulate's fragment limit
def _cluster(**kw) -> ClusterConfig:
    return ClusterConfig(**{"model": "7b", "hardware": "H100", "max_tokens": 1024, "cp_size": 2, "pp_size": 1,
                            "dp_size": 1, "num_micro_batches": 1, **kw})


def test_check_fragments_limit_is_inclusive_names_the_long_sample_and_skips_other_overlength():
    cluster = _cluster()
    limit = min(MAX_FRAGMENTS, 1024 * cluster.packs_per_step)
    most = limit * cluster.max_tokens
    ok = np.array([5, most])
    _check_fragments(ok, ok, cluster, {})  # exactly the limit's fragments: allowed
    bad = np.array([most, most + 1, 7])  # the first at the limit: the one over it is named
    with pytest.raises(ValueError, match=rf"^lengths\[1\] = {most + 1} tokens"):
        _check_fragments(bad, bad, cluster, {})
    for overlength in ("truncate", "error"):  # cut, or refused by the packer's own message
        _check_fragments(bad, bad, cluster, {"overlength": overlength})


_TAIL = "or drop or shorten that sample in the workload (--workload)"


def test_check_fragments_message_counts_fragments_and_offers_only_the_fixes_that_help():
    cluster = _cluster(max_tokens=2048)  # 1 pack per step: at most 1024 fragments
    v = 1024 * 2048 + 1
    with pytest.raises(ValueError) as e:
        _check_fragments(np.array([3, v]), np.array([v, 3]), cluster, {})
    assert str(e.value) == (
        f"lengths[1] = {v} tokens: split at max_tokens=2048 that is 1025 fragments, more than the 1024 a sample may "
        "have (min(16384, 1024 x dp_size 1 x num_micro_batches 1)); raise max_tokens (--max-tokens) to at least "
        f"2049, raise dp_size x num_micro_batches (--dp, --micro-batches), {_TAIL}")
    wide = _cluster(dp_size=16)  # 16 packs per step: the 16384 cap, more packs would not help
    head = "split at max_tokens=1024 that is {} fragments, more than the 16384 a sample may have (min(16384, 1024 " \
           "x dp_size 16 x num_micro_batches 1)); "
    v = 2**26 * 2**14  # needs max_tokens 2**26 = MAX_SIM_TOKENS: still offered
    with pytest.raises(ValueError) as e:
        _check_fragments(np.array([v]), np.array([v]), wide, {})
    assert str(e.value) == (f"lengths[0] = {v} tokens: " + head.format(2**30)
                            + f"raise max_tokens (--max-tokens) to at least {2**26}, {_TAIL}")
    with pytest.raises(ValueError) as e:  # one token more needs max_tokens over MAX_SIM_TOKENS: not offered
        _check_fragments(np.array([v + 1]), np.array([v + 1]), wide, {})
    assert str(e.value) == f"lengths[0] = {v + 1} tokens: " + head.format(2**30 + 1) + _TAIL


def test_lengths_format_hint_of_workload_names_the_dataset_spec():
    assert _lengths_format_hint("--workload") == (
        "; --workload reads a JSON array of ints (a .json file, or gzip-compressed .json.gz), e.g. [512, 70000, 3], "
        "or a length column of a parquet/csv/jsonl/arrow file as dataset:FILE:COLUMN")


# ------------------------------------------------------------------------------------------ dataset paths
@pytest.mark.parametrize("name", ["../nope_dir", "~no_such_user_mm47/data"])
def test_dataset_missing_relative_or_unexpanded_home_path_is_refused_at_once(tmp_path, monkeypatch, name):
    import datasets

    def hub(*a, **k):
        raise AssertionError("looked up on the Hub")

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(datasets, "load_dataset", hub)
    with pytest.raises(ValueError) as e:
        load_workload(f"dataset:{name}")
    assert str(e.value) == (f"dataset {name!r} does not exist: give an existing folder (save_to_disk) or a "
                            ".arrow/.csv/.json/.jsonl/.parquet file, or a hub name (check --workload)")


# ------------------------------------------------------------------------------------------ pack
def test_pack_prices_the_hardware_given_and_says_why_there_is_nothing_to_report(tmp_path, capsys):
    assert main(["pack", "--workload", "sft", "--num-samples", "50", "--max-tokens", "32K", "--hardware",
                 "A800"]) == 0
    assert "cost model 8b@A800" in capsys.readouterr().out
    path = tmp_path / "zeros.json"
    path.write_text("[0, 0]")
    assert main(["pack", "--lengths", str(path), "--max-tokens", "64K"]) == 0
    assert ("  no packs: every sample is empty (zero-length skipped 2), so there is no balance, padding or time "
            "to report\n") in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ collator
def test_negative_separator_message_names_the_legal_values():
    with pytest.raises(ValueError) as e:
        PackedDataCollator(separator_id=-1)
    assert str(e.value) == ("PackedDataCollator.separator_id=-1 is invalid: it must be -100 (the loss ignores "
                            "document starts, the default) or a token id >= 0 (set separator_id)")


# ------------------------------------------------------------------------------------------ tie_word_embeddings
def test_tied_read_from_the_composite_object_and_top_level_dimensions_win():
    from types import SimpleNamespace

    from atac_hf.cost import ModelDims

    text = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_hidden_layers=2)  # no tie_word_embeddings

    class Composite:  # a composite config object (a transformers PretrainedConfig's interface)
        tie_word_embeddings = True

        def get_text_config(self):
            return text

    assert ModelDims.from_hf_config(Composite()).tie_word_embeddings is True
    Composite.tie_word_embeddings = False
    assert ModelDims.from_hf_config(Composite()).tie_word_embeddings is False
    both = {"hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
            "text_config": {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3}}
    dims = ModelDims.from_hf_config(both)  # top-level dimensions: the config itself, not its text_config
    assert (dims.hidden_size, dims.num_layers) == (128, 2)
    with pytest.raises(ValueError) as e:
        ModelDims.from_hf_config({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                                  "tie_word_embeddings": "yes"})
    assert str(e.value) == ("cannot read model dimensions: the config's tie_word_embeddings='yes' is not a bool "
                            "(check that field of the model config, or pass ModelDims(...) explicitly)")


# ------------------------------------------------------------------------------------------ TP per-head gradients
def test_local_of_a_dtensor_is_its_plain_local_shard(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        local = torch.tensor([1.0, 0.0])
        g = DTensor.from_local(local, init_device_mesh("cpu", (1,)), [Shard(0)])
        assert type(tpm._local(g)) is torch.Tensor and tpm._local(g).tolist() == [1.0, 0.0]
        assert tpm._local(local) is local
    finally:
        dist.destroy_process_group()


def test_a_grad_replaced_by_fresh_zeros_between_backwards_drops_what_was_held(two_tp_ranks):
    m = _Norm()
    (m.w * 4.0).sum().backward()  # held [4, 4]; .grad a tensor at in-place version 0
    m.w.grad = torch.zeros_like(m.w)  # another tensor, also at version 0: a new accumulation
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]


def test_a_grad_that_backwards_summed_to_zero_keeps_what_was_held(two_tp_ranks):
    m = _Norm()
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]
    (m.w * -2.0).sum().backward()  # .grad [0, 0] by accumulation, not zeroed by the loop: held [-2, -2] stays
    assert m.w.grad.tolist() == [0.0, 0.0]
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [0.0, 0.0]  # 2 + 2 x (-2 + 1); dropping the held -2 gave [2, 2]


# ------------------------------------------------------------------------------------------ ATACAccelerator.prepare
def test_prepare_under_tp_points_each_optimizer_at_its_models_new_parameters(monkeypatch):
    """Hand mutants H4 (the names taken after ``_setup_model``) and H5 (no remap at tp_size 2): an optimizer
    passed with the model must step the parameters TP sharding put in place, not the replaced ones."""
    from test_mutants_pass30 import TinyLM, Wrapper, make_bare_accelerator

    def shard(model):  # stands in for apply_tensor_parallel: new parameter objects under the same names
        model.head = torch.nn.Parameter(model.head.detach().clone())

    acc = make_bare_accelerator(monkeypatch, 1, wrap=Wrapper, backward=lambda self, loss, **kw: None, setup=shard,
                                kind_check=False)
    acc.tp_size, acc.sharder = 2, None
    monkeypatch.setattr("atac_hf.integrations.accelerate.check_tp_prepare", lambda *a, **k: None)
    a, b = TinyLM(), TinyLM()
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    old = b.head
    acc.prepare(a, opt_a, b, opt_b)
    for model, opt in ((a, opt_a), (b, opt_b)):
        assert [id(p) for p in opt.param_groups[0]["params"]] == [id(model.emb), id(model.head)]
    assert b.head is not old

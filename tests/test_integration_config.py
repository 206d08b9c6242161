"""ATACConfig sources and precedence, the CP mesh on CPU, and the clear errors of the integration.

All in-process and fast (no process group): the distributed paths are in
test_integration_trainer.py and test_integration_examples.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys

import pytest
import torch

from atac_hf.integrations import ATACConfig
from atac_hf.integrations.accelerate import (
    ATACAccelerator,
    ATACParallelismConfig,
    build_parallelism_config,
    bypass_torch_cp_hooks,
)
from atac_hf.integrations.data import check_dataset_columns
from atac_hf.integrations.sharder import BatchSharder, check_model_shardable, count_targets, prepare_model


# ---------------------------------------------------------------------------- config
def test_defaults_and_derived_objects():
    cfg = ATACConfig(cp_size=2, max_tokens=1024, packing_options={"overlength": "truncate", "max_defer": 2})
    pc = cfg.packing_config(packs_per_window=4)
    assert (pc.max_tokens, pc.packs_per_window, pc.strategy, pc.overlength, pc.max_defer) == (1024, 4, "wfap",
                                                                                             "truncate", 2)
    assert cfg.resolved_min_chunk("cuda") == 128 and cfg.resolved_min_chunk("cpu") == 1
    assert ATACConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'cp_size'"):
        cfg.cp_size = 4  # frozen
    assert cfg.cp_size == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"cp_size": 0}, r"cp_size=0 must be an int >= 1"),
    ({"max_tokens": -5}, r"max_tokens=-5"),
    ({"packing_strategy": "greedy"}, r"unknown packing_strategy 'greedy'; legal values: \['wfap'"),
    ({"sharding_strategy": "ring"}, r"unknown sharding_strategy 'ring'; legal values: .*'atp'"),
    ({"attention_backend": "xformers"}, r"unknown attention_backend 'xformers'; legal values: \['sdpa'"),
    ({"cost_preset": "TPU"}, r"unknown cost_preset 'TPU'; legal values: \['default', 'A800'"),
    ({"cost_profile": "/nonexistent/profile.json"}, r"cost_profile '/nonexistent/profile.json' does not exist"),
    ({"packing_options": {"max_tokens": 5}}, r"packing_options may not set \['max_tokens'\]"),
    ({"packing_options": {"overlength": "drop"}}, r"unknown overlength policy 'drop'"),
    ({"packing_options": {"bogus": 1}}, r"unknown packing config keys \['bogus'\]"),
    ({"max_tokens_per_rank": 0}, r"max_tokens_per_rank=0 must be None or an int >= 1"),
])
def test_config_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ATACConfig(**kwargs)


def test_from_yaml_top_level_nested_and_json(tmp_path):
    (tmp_path / "a.yaml").write_text("cp_size: 2\nmax_tokens: 4096\npacking_options:\n  overlength: split\n")
    (tmp_path / "b.yaml").write_text("atac:\n  sharding_strategy: zigzag\n  debug: true\n")
    (tmp_path / "c.json").write_text(json.dumps({"cp_size": 4, "min_chunk": 64}))
    assert ATACConfig.from_yaml(tmp_path / "a.yaml").max_tokens == 4096
    b = ATACConfig.from_yaml(tmp_path / "b.yaml")
    assert (b.sharding_strategy, b.debug) == ("zigzag", True)
    assert ATACConfig.from_yaml(tmp_path / "c.json").min_chunk == 64
    (tmp_path / "bad.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match=r"must hold a mapping of settings"):
        ATACConfig.from_yaml(tmp_path / "bad.yaml")
    (tmp_path / "typo.yaml").write_text("cp_sise: 2\n")
    with pytest.raises(ValueError, match=r"unknown ATAC config keys \['cp_sise'\].*legal keys: \['cp_size'"):
        ATACConfig.from_yaml(tmp_path / "typo.yaml")
    with pytest.raises(ValueError, match=r"does not exist or is not a file"):
        ATACConfig.from_yaml(tmp_path / "missing.yaml")
    # never executes code: a python object tag is refused by safe_load
    (tmp_path / "evil.yaml").write_text("cp_size: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ValueError, match=r"not valid YAML"):
        ATACConfig.from_yaml(tmp_path / "evil.yaml")


def test_from_env_parses_types():
    env = {"ATAC_CP_SIZE": "4", "ATAC_DEBUG": "yes", "ATAC_SHUFFLE": "0", "ATAC_MAX_TOKENS_PER_RANK": "none",
           "ATAC_MIN_CHUNK": "32", "ATAC_PACKING_OPTIONS": '{"max_defer": 3}', "HOME": "/root"}
    cfg = ATACConfig.from_env(env)
    assert (cfg.cp_size, cfg.debug, cfg.shuffle, cfg.max_tokens_per_rank, cfg.min_chunk) == (4, True, False, None, 32)
    assert cfg.packing_options == {"max_defer": 3}
    with pytest.raises(ValueError, match=r"unknown environment variable ATAC_CP; legal ATAC_\* variables: "
                                         r"\['ATAC_CP_SIZE'"):
        ATACConfig.from_env({"ATAC_CP": "2"})
    with pytest.raises(ValueError, match=r"ATAC_DEBUG='maybe' is not a boolean"):
        ATACConfig.from_env({"ATAC_DEBUG": "maybe"})
    with pytest.raises(ValueError, match=r"ATAC_CP_SIZE='two' is not an integer"):
        ATACConfig.from_env({"ATAC_CP_SIZE": "two"})


def test_token_counts_take_k_as_the_command_line_tools_do(tmp_path):
    """max_tokens, max_tokens_per_rank and min_chunk take "16K" (x 1024) wherever they are written:
    Python, a YAML file and ATAC_* variables. Anything else is refused, naming the setting."""
    assert ATACConfig(max_tokens="16K", cp_size=2, max_tokens_per_rank="8k", min_chunk=" 128 ") == \
        ATACConfig(max_tokens=16384, cp_size=2, max_tokens_per_rank=8192, min_chunk=128)
    (tmp_path / "a.yaml").write_text("max_tokens: 32K\nmin_chunk: 1k\n")
    assert (ATACConfig.from_yaml(tmp_path / "a.yaml").max_tokens, ATACConfig.from_yaml(tmp_path / "a.yaml").min_chunk) \
        == (32768, 1024)
    cfg = ATACConfig.from_env({"ATAC_MAX_TOKENS": "64K", "ATAC_MAX_TOKENS_PER_RANK": "none", "ATAC_MIN_CHUNK": "2K"})
    assert (cfg.max_tokens, cfg.max_tokens_per_rank, cfg.min_chunk) == (65536, None, 2048)
    for bad in ("16KB", "1.5K", "-4", "", "16 K", "\uff11\uff16K", "16M"):
        with pytest.raises(ValueError, match=r"max_tokens=.* is not a token count: write ASCII digits, or digits and "
                                             r"K \(x 1024\), e\.g\. 16384 or 16K \(set max_tokens / ATAC_MAX_TOKENS\)"):
            ATACConfig(max_tokens=bad)
    with pytest.raises(ValueError, match=r"ATAC_MAX_TOKENS='16M' is not a token count.*\(set ATAC_MAX_TOKENS\)"):
        ATACConfig.from_env({"ATAC_MAX_TOKENS": "16M"})
    with pytest.raises(ValueError, match=r"ATAC_MAX_TOKENS='none' is not a token count"):  # a cap, never None
        ATACConfig.from_env({"ATAC_MAX_TOKENS": "none"})
    with pytest.raises(ValueError, match=r"max_tokens=0 must be an int >= 1"):
        ATACConfig(max_tokens="0K")
    with pytest.raises(ValueError, match=r"window_size='4K' must be None or an int"):  # samples, not tokens
        ATACConfig(window_size="4K")


def test_from_sources_precedence(tmp_path):
    f = tmp_path / "atac.yaml"
    f.write_text("max_tokens: 1000\nsharding_strategy: zigzag\ndebug: true\nwindow_size: 7\n")
    env = {"ATAC_CONFIG": str(f), "ATAC_SHARDING_STRATEGY": "per_doc", "ATAC_DEBUG": "false"}
    cfg = ATACConfig.from_sources(environ=env, overrides={"debug": True, "window_size": None})
    # file < env < overrides (None overrides are skipped)
    assert (cfg.max_tokens, cfg.sharding_strategy, cfg.debug, cfg.window_size) == (1000, "per_doc", True, 7)
    # an explicit path wins over ATAC_CONFIG
    g = tmp_path / "other.yaml"
    g.write_text("max_tokens: 2000\n")
    assert ATACConfig.from_sources(g, environ=env).max_tokens == 2000
    # cp_size falls back to the accelerate launch config's value ...
    assert ATACConfig.from_sources(environ={"PARALLELISM_CONFIG_CP_SIZE": "2"}).cp_size == 2
    # ... and must agree with it when set
    with pytest.raises(ValueError, match=r"cp_size=4 \(ATAC config\) disagrees with PARALLELISM_CONFIG_CP_SIZE=2"):
        ATACConfig.from_sources(environ={"PARALLELISM_CONFIG_CP_SIZE": "2", "ATAC_CP_SIZE": "4"})


# ---------------------------------------------------------------------------- mesh
def test_cp_size_must_divide_world_size_naming_both():
    with pytest.raises(ValueError, match=r"cp_size=4 does not divide the world size 6 .*one of \[1, 2, 3, 6\]"):
        build_parallelism_config(ATACConfig(cp_size=4), 6, environ={})


def test_parallelism_config_sizes():
    pc = build_parallelism_config(ATACConfig(cp_size=2), 8, environ={})
    assert isinstance(pc, ATACParallelismConfig)
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.cp_size, pc.total_size) == (1, 4, 2, 8)
    pc = build_parallelism_config(ATACConfig(cp_size=1), 4, environ={})
    assert (pc.dp_replicate_size, pc.dp_shard_size) == (4, 1)
    pc = build_parallelism_config(ATACConfig(cp_size=1), 4, fsdp=True, environ={})
    assert (pc.dp_replicate_size, pc.dp_shard_size) == (1, 4)
    launch = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_CP_SIZE": "4",
              "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1"}
    pc = build_parallelism_config(ATACConfig(cp_size=4), 8, environ=launch)
    assert (pc.dp_shard_size, pc.cp_size) == (2, 4)
    with pytest.raises(ValueError, match=r"dp_replicate=1 x dp_shard=2 x cp=4 = 8\) does not match the world size 16"):
        build_parallelism_config(ATACConfig(cp_size=4), 16, environ=launch)
    with pytest.raises(ValueError, match=r"cp_size=2 \(ATAC config\) disagrees with parallelism_config_cp_size=4"):
        build_parallelism_config(ATACConfig(cp_size=2), 8, environ=launch)


def test_cpu_validation_and_hook_bypass():
    class FakeAccelerator:
        from accelerate.utils import DistributedType

        distributed_type = DistributedType.MULTI_CPU
        num_processes = 4

    pc = ATACParallelismConfig(dp_shard_size=2, cp_size=2)
    pc._validate_accelerator(FakeAccelerator())  # Accelerate itself refuses MULTI_CPU
    FakeAccelerator.num_processes = 6
    with pytest.raises(ValueError, match=r"covers 4 processes .* but 6 were launched"):
        pc._validate_accelerator(FakeAccelerator())

    class Acc:
        def _prepare_cp(self, *args):
            raise AssertionError("Accelerate's torch-CP hooks must not run")

    acc = Acc()
    model = torch.nn.Linear(2, 2)
    bypass_torch_cp_hooks(acc)
    bypass_torch_cp_hooks(acc)  # idempotent
    assert acc._prepare_cp(model) == (model,)
    assert not model._forward_pre_hooks and not model._forward_hooks
    del acc._prepare_cp  # reversible
    with pytest.raises(AssertionError):
        acc._prepare_cp(model)
    assert ATACAccelerator._prepare_cp(None, model) == (model,)


# ---------------------------------------------------------------------------- bad input
def test_backend_not_installed_says_how():
    pytest.importorskip("torch")
    if "flash_attn" in sys.modules or _installed("flash_attn"):
        pytest.skip("flash-attn is installed here")
    with pytest.raises(ValueError, match=r"flash-attn, which is not installed: `pip install atac-hf\[flash\]` "
                                         r"\(CUDA only\), or set attention_backend='sdpa'"):
        ATACConfig(attention_backend="flash").check_runtime("cpu")
    with pytest.raises(ValueError, match=r"'flex' has no backward on 'cpu'.*set attention_backend='sdpa'"):
        ATACConfig(attention_backend="flex").check_runtime("cpu")
    ATACConfig(attention_backend="sdpa").check_runtime("cpu")


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_dataset_without_needed_columns_lists_what_was_found():
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})
    with pytest.raises(ValueError, match=r"train_dataset has no \['input_ids'\] column; columns found: "
                                         r"\['text', 'label'\]\. Tokenize it first"):
        check_dataset_columns(ds, name="train_dataset")
    with pytest.raises(ValueError, match=r"columns found: \['tokens'\]"):
        check_dataset_columns([{"tokens": [1, 2]}])
    with pytest.raises(ValueError, match=r"iterable dataset: the WFAP sampler needs a map-style dataset"):
        check_dataset_columns(datasets.Dataset.from_dict({"input_ids": [[1, 2]]}).to_iterable_dataset())
    check_dataset_columns(datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1, 2]]}))


def _tiny(config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(copy.deepcopy(config))


def test_model_the_runtime_cannot_shard_says_why():
    from transformers import BloomConfig, LlamaConfig, T5Config, T5ForConditionalGeneration

    bloom = _tiny(BloomConfig(hidden_size=32, n_layer=1, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match=r"BloomForCausalLM \(model_type 'bloom'\) computes attention in its own "
                                         r"code, not through transformers' AttentionInterface"):
        check_model_shardable(bloom)
    t5 = T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=64))
    with pytest.raises(ValueError, match=r"T5ForConditionalGeneration \(model_type 't5'\) is an encoder-decoder model"):
        check_model_shardable(t5)
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    dyn = _tiny(LlamaConfig(**common, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}))
    with pytest.raises(ValueError, match=r"rope type 'dynamic' .* depends on the largest position a rank sees"):
        check_model_shardable(dyn)
    drop = _tiny(LlamaConfig(**common, attention_dropout=0.1))
    with pytest.raises(ValueError, match=r"attention_dropout=0.1 is not implemented by the 'atac_cp' attention"):
        check_model_shardable(drop)
    ok = _tiny(LlamaConfig(**common))
    prepare_model(ok)
    prepare_model(ok)  # idempotent
    assert ok.config._attn_implementation == "atac_cp"


def test_trainer_refuses_bad_model_and_dataset_before_starting():
    import datasets
    from transformers import BloomConfig, LlamaConfig

    from atac_hf.integrations import ATACTrainer

    bloom = _tiny(BloomConfig(hidden_size=32, n_layer=1, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match=r"BloomForCausalLM .* AttentionInterface"):
        ATACTrainer(model=bloom, atac_config=ATACConfig())
    llama = _tiny(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              vocab_size=64))
    text_only = datasets.Dataset.from_dict({"text": ["hello"]})
    with pytest.raises(ValueError, match=r"train_dataset has no \['input_ids'\] column; columns found: \['text'\]"):
        ATACTrainer(model=llama, train_dataset=text_only, atac_config=ATACConfig())
    with pytest.raises(ValueError, match=r"needs model="):
        ATACTrainer(model=None, atac_config=ATACConfig())


# ---------------------------------------------------------------------------- sharder (one process, cp 1)
def test_sharder_cp1_matches_stock_attention_and_records_stats():
    from transformers import LlamaConfig

    from atac_hf.packing import PackedDataCollator

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64)
    ref, model = _tiny(cfg), _tiny(cfg)
    g = torch.Generator().manual_seed(0)
    batch = PackedDataCollator()([{"input_ids": torch.randint(0, 64, (n,), generator=g).tolist()}
                                  for n in (40, 3, 17, 1, 25)])
    assert count_targets(batch) == 86 - 5  # a document of n tokens has n - 1 next-token targets
    prepare_model(model)
    sharder = BatchSharder(ATACConfig(), kv_bytes_per_token=1.0)
    local = sharder(batch)
    loss = model(**local).loss
    ref_loss = ref(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"],
                   use_cache=False).loss
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert local["num_items_in_batch"] == 81
    summary = sharder.pop_summary()
    assert summary["imbalance"] == 1.0 and summary["kv_mb"] == 0.0 and summary["planner_ms"] > 0
    assert sharder.pop_summary() == {}
    with pytest.raises(ValueError, match=r"needs 'input_ids'.*keys found: \['labels'\]"):
        sharder({"labels": batch["labels"]})
    with pytest.raises(ValueError, match=r"no 'labels' or 'shift_labels'.*keys: \['input_ids'\]"):
        count_targets({"input_ids": batch["input_ids"]})


# ---------------------------------------------------------------------------- shipped configs
LAUNCH_CONFIGS = ["cpu_cp2.yaml", "gpu_fsdp2_cp4.yaml", "gpu_dp2_cp4.yaml"]


@pytest.mark.parametrize("name", LAUNCH_CONFIGS)
def test_launch_configs_load_and_give_a_valid_mesh(name):
    from pathlib import Path

    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    path = Path(__file__).resolve().parents[1] / "configs" / name
    cfg = load_config_from_file(str(path))  # accelerate's own schema check
    raw = yaml.safe_load(path.read_text())
    pc = raw["parallelism_config"]
    # what `accelerate launch` exports for these keys (accelerate/utils/launch.py)
    env = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true"}
    env.update({k.upper(): str(v) for k, v in pc.items()})
    atac = ATACConfig.from_sources(environ=env)
    assert atac.cp_size == pc["parallelism_config_cp_size"] > 1
    mesh = build_parallelism_config(atac, cfg.num_processes, fsdp=raw["distributed_type"] == "FSDP", environ=env)
    assert mesh.total_size == cfg.num_processes and mesh.cp_size == atac.cp_size
    if raw["distributed_type"] == "FSDP":
        assert raw["fsdp_config"]["fsdp_version"] == 2
    if name.startswith("cpu"):
        assert raw["use_cpu"] is True and raw["distributed_type"] == "MULTI_GPU"  # torchrun launcher on CPU


@pytest.mark.parametrize("name", ["atac_cpu.yaml", "atac_gpu.yaml"])
def test_addon_configs_load(name):
    from pathlib import Path

    cfg = ATACConfig.from_yaml(Path(__file__).resolve().parents[1] / "configs" / name)
    if cfg.cost_profile is not None:  # relative to the YAML file, and a valid profile
        assert os.path.isabs(cfg.cost_profile)
        assert cfg.cost_model().tile == 1
    cfg.packing_config(packs_per_window=8)


def test_relative_cost_profile_is_relative_to_the_config_file(tmp_path, monkeypatch):
    from atac_hf.cost import default_cost_model

    sub = tmp_path / "sub"
    sub.mkdir()
    default_cost_model().save(str(sub / "p.json"))
    (sub / "atac.yaml").write_text("cost_profile: p.json\n")
    monkeypatch.chdir(tmp_path)
    assert ATACConfig.from_yaml(sub / "atac.yaml").cost_profile == str(sub / "p.json")


def test_sharder_never_leaves_a_rank_without_tokens():
    from atac_hf.packing import PackedDataCollator

    sharder = BatchSharder(ATACConfig(cp_size=2, min_chunk=8))
    one_doc = PackedDataCollator()([{"input_ids": list(range(16))}])  # too short for 4 chunks of >= 8: kept whole
    assert sharder.plan(PackedDataCollator()([{"input_ids": list(range(40))}]))[0].strategy == "atp"
    plan, stats = sharder.plan(one_doc)
    assert plan.strategy == "atp" and plan.rank_num_tokens().tolist() == [8, 8]  # the planner fills rank 1
    assert stats.num_tokens == 16 and stats.num_docs == 1
    with pytest.raises(ValueError, match=r"a pack of 1 tokens cannot be shared by cp_size=2 ranks"):
        sharder.plan(PackedDataCollator()([{"input_ids": [5]}]))


def test_more_user_errors_are_clear(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from accelerate.parallelism_config import ParallelismConfig

    from atac_hf.integrations.accelerate import as_atac_parallelism_config
    from atac_hf.integrations.trainer import _check_args

    with pytest.raises(TypeError, match=r"packing_options must be a mapping of PackingConfig fields, got list"):
        ATACConfig(packing_options=[("overlength", "split")])
    with pytest.raises(TypeError, match=r"shuffle=1 must be True or False"):
        ATACConfig(shuffle=1)
    with pytest.raises(ValueError, match=r"ATAC_PACKING_OPTIONS must be a JSON object of PackingConfig fields"):
        ATACConfig.from_env({"ATAC_PACKING_OPTIONS": "{overlength: split}"})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"is not valid JSON"):
        ATACConfig.from_yaml(tmp_path / "bad.json")
    # tensor parallelism composes with CP now (issue 19): accepted from the launch config and from code
    env = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_CP_SIZE": "2",
           "PARALLELISM_CONFIG_TP_SIZE": "2"}
    pc = build_parallelism_config(ATACConfig(cp_size=2), 4, environ=env)
    assert (pc.tp_size, pc.cp_size, pc.dp_shard_size, pc.dp_replicate_size) == (2, 2, 1, 1)
    pc = as_atac_parallelism_config(ParallelismConfig(tp_size=2, cp_size=1, dp_shard_size=1, dp_replicate_size=1))
    assert pc.tp_size == 2
    # sequence parallelism (DeepSpeed Ulysses) still does not compose
    with pytest.raises(ValueError, match=r"parallelism_config_sp_size=2: ATP-CP does not compose with sequence"):
        build_parallelism_config(ATACConfig(cp_size=1), 2,
                                 environ={"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_SP_SIZE": "2"})
    with pytest.raises(ValueError, match=r"sp_size=2: ATP-CP does not compose with sequence parallelism"):
        as_atac_parallelism_config(ParallelismConfig(sp_size=2, cp_size=1, dp_shard_size=1, dp_replicate_size=1))
    args = SimpleNamespace(world_size=2, label_smoothing_factor=0.0, average_tokens_across_devices=True,
                           per_device_train_batch_size=1, per_device_eval_batch_size=1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    _check_args(args, ATACConfig())
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=4 but TrainingArguments sees 2 .*use_cpu=True"):
        _check_args(args, ATACConfig())
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"label_smoothing_factor=0.1: .*set it to 0"):
        _check_args(SimpleNamespace(**{**vars(args), "label_smoothing_factor": 0.1}), ATACConfig())
    with pytest.raises(ValueError, match=r"average_tokens_across_devices=False"):
        _check_args(SimpleNamespace(**{**vars(args), "average_tokens_across_devices": False}), ATACConfig())
    with pytest.warns(UserWarning, match=r"per_device_train_batch_size=4 is ignored"):  # 8 is the default: silent
        _check_args(SimpleNamespace(**{**vars(args), "per_device_train_batch_size": 4, "process_index": 0}),
                    ATACConfig())
    with pytest.raises(ValueError, match=r"dataset is empty"):
        check_dataset_columns([])


def test_model_checks_no_kwargs():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)

    class NoKwargs(type(_tiny(cfg))):
        def forward(self, input_ids=None, labels=None):
            return super().forward(input_ids=input_ids, labels=labels)

    with pytest.raises(ValueError, match=r"NoKwargs.forward takes no \*\*kwargs: the per-batch shard context"):
        check_model_shardable(NoKwargs(copy.deepcopy(cfg)))


def test_accelerator_shard_before_prepare_is_an_error():
    acc = ATACAccelerator.__new__(ATACAccelerator)  # no process group needed for this check
    acc.sharder = None
    with pytest.raises(RuntimeError, match=r"call accelerator.prepare\(model, ...\) before shard\(\)"):
        acc.shard({"input_ids": torch.zeros(1, 4, dtype=torch.long)})


def test_the_sharder_keeps_running_means_not_a_record_per_step():
    # red-team 27: every recorded pack's stats were appended to a list that only ATACTrainer.log emptied, so an
    # Accelerate loop that never calls pop_summary grew by one entry a step (245 bytes; 245 MB at 10^6 steps)
    from atac_hf.integrations.sharder import BatchSharder
    from atac_hf.packing import PackedDataCollator

    sharder = BatchSharder(ATACConfig(), kv_bytes_per_token=1.0)
    batches = [PackedDataCollator()([{"input_ids": list(range(3, 3 + n))} for n in lengths])
               for lengths in ((9, 4), (30, 2, 7), (1,))]

    def sizes():
        return {k: len(v) for k, v in vars(sharder).items() if isinstance(v, (list, dict, set, tuple))}

    for _ in range(100):
        sharder(batches[0])
    assert sharder.pop_summary()["imbalance"] == 1.0 and sharder.pop_summary() == {}
    before = sizes()
    ms = []
    for _ in range(100):
        for b in batches:
            sharder(b)
            ms.append(sharder.last_stats.planner_ms)
    assert sizes() == before
    sharder(batches[1], record=False)  # (evaluation batches are not counted)
    summary = sharder.pop_summary()
    assert summary["imbalance"] == 1.0 and summary["kv_mb"] == 0.0
    assert summary["planner_ms"] == pytest.approx(sum(ms) / len(ms), rel=1e-9)

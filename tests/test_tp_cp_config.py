"""Fast checks (no process group) of the TP x CP configuration (issue 19): mesh sizes from code and
launch configs, every new refusal, the optimizer remap, tied-weight handling, and the
``kv_exchange`` setting. The multi-process equivalence runs are in ``test_tp_cp.py`` (slow)."""

from __future__ import annotations

import copy

import pytest
import torch

from atac_hf.integrations import ATACConfig
from atac_hf.integrations.accelerate import as_atac_parallelism_config, build_parallelism_config, check_tp_layout
from atac_hf.integrations.tensor_parallel import (_tied_aliases, check_tp_model, remap_optimizer_params,
                                                  sync_tp_gradients)

LAUNCH = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true"}

# transformers' tensor-parallel API (PreTrainedModel._resolve_parallel_plans) arrived in 5.23: below, TP is refused
# naming the version (tests/test_compat_versions.py), so these checks of TP's own refusals do not apply
NEEDS_TP_API = pytest.mark.skipif(not hasattr(__import__("transformers").PreTrainedModel, "_resolve_parallel_plans"),
                                  reason="transformers < 5.23: no tensor-parallel API")


def _llama(**overrides):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=64, max_position_embeddings=256)
    cfg.update(overrides)
    torch.manual_seed(0)
    config = LlamaConfig(**cfg)
    if "base_model_tp_plan" in overrides:
        config.base_model_tp_plan = overrides["base_model_tp_plan"]
    return AutoModelForCausalLM.from_config(config)


# ---------------------------------------------------------------------------- mesh sizes
@pytest.mark.parametrize("world, cp, tp, fsdp, expect", [
    (4, 2, 2, False, (1, 1, 2, 2)),   # tp 2 x cp 2
    (8, 2, 2, False, (1, 2, 2, 2)),   # dp 2 declared as dp_shard (Accelerate refuses dp_replicate with tp/cp)
    (4, 1, 2, False, (1, 2, 1, 2)),   # tp 2 x dp 2
    (2, 1, 2, False, (1, 1, 1, 2)),   # tp only
])
def test_build_parallelism_config_with_tp(world, cp, tp, fsdp, expect):
    pc = build_parallelism_config(ATACConfig(cp_size=cp), world, fsdp=fsdp, tp_size=tp, environ={})
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.cp_size, pc.tp_size) == expect
    assert pc.total_size == world
    # the same sizes from an accelerate launch config (parallelism_config_tp_size)
    env = {**LAUNCH, "PARALLELISM_CONFIG_CP_SIZE": str(cp), "PARALLELISM_CONFIG_TP_SIZE": str(tp)}
    pc = build_parallelism_config(ATACConfig(cp_size=cp), world, fsdp=fsdp, environ=env)
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.cp_size, pc.tp_size) == expect


def test_tp_mesh_size_errors_name_the_sizes():
    with pytest.raises(ValueError, match=r"cp_size=2 x tp_size=2 = 4 does not divide the world size 6 .*"
                                         r"one of \[1, 2, 3, 6\]"):
        build_parallelism_config(ATACConfig(cp_size=2), 6, tp_size=2, environ={})
    env = {**LAUNCH, "PARALLELISM_CONFIG_CP_SIZE": "2", "PARALLELISM_CONFIG_TP_SIZE": "2"}
    with pytest.raises(ValueError, match=r"tp_size=4 disagrees with parallelism_config_tp_size=2"):
        build_parallelism_config(ATACConfig(cp_size=2), 8, tp_size=4, environ=env)
    with pytest.raises(ValueError, match=r"dp_replicate=1 x dp_shard=3 x cp=2 x tp=2 = 12\) does not match "
                                         r"the world size 8"):
        build_parallelism_config(ATACConfig(cp_size=2), 8, environ={**env, "PARALLELISM_CONFIG_DP_SHARD_SIZE": "3"})
    with pytest.raises(ValueError, match=r"tp_size=0 must be >= 1"):
        build_parallelism_config(ATACConfig(cp_size=1), 2, tp_size=0, environ={})


def test_tp_with_fsdp_is_refused_and_plain_tp_accepted():
    from accelerate.parallelism_config import ParallelismConfig

    pc = as_atac_parallelism_config(ParallelismConfig(tp_size=2, cp_size=2, dp_shard_size=1, dp_replicate_size=1))
    check_tp_layout(pc, fsdp=False)
    with pytest.raises(ValueError, match=r"tp_size=2 with FSDP: .*drop the FSDP plugin"):
        check_tp_layout(pc, fsdp=True)
    check_tp_layout(as_atac_parallelism_config(ParallelismConfig(cp_size=2, dp_shard_size=1)), fsdp=True)


# ---------------------------------------------------------------------------- model checks
@NEEDS_TP_API
def test_model_without_tp_plan_is_refused_clearly():
    model = _llama(base_model_tp_plan=None)  # only the causal-LM class's own lm_head rule is left
    with pytest.raises(ValueError, match=r"tp_size=2: LlamaForCausalLM \(model_type 'llama'\) has no tensor parallel "
                                         r"plan .*set tp_size=1"):
        check_tp_model(model, 2)


@NEEDS_TP_API
def test_tp_size_must_divide_heads_and_kv_heads():
    model = _llama()
    plan = check_tp_model(model, 2)
    assert plan["model.layers.0.self_attn.k_proj.weight"] == "colwise"
    assert plan["lm_head.weight"] == "colwise_gather_output"
    with pytest.raises(ValueError, match=r"tp_size=4 does not divide LlamaForCausalLM's num_key_value_heads=2 "
                                         r"\(each TP rank holds whole heads\); set tp_size to one of \[1, 2\]"):
        check_tp_model(model, 4)
    with pytest.raises(ValueError, match=r"tp_size=4 does not divide LlamaForCausalLM's num_attention_heads=6 .*"
                                         r"one of \[1, 3\]"):
        check_tp_model(_llama(num_attention_heads=6, num_key_value_heads=3, hidden_size=48), 4)


def test_peft_and_non_transformers_models_are_refused():
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(_llama(), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with pytest.raises(ValueError, match=r"tp_size=2 with a PEFT-wrapped LlamaForCausalLM"):
        check_tp_model(peft_model, 2)
    with pytest.raises(ValueError, match=r"needs a transformers PreTrainedModel with a tp_plan; Linear is not one"):
        check_tp_model(torch.nn.Linear(2, 2), 2)


@NEEDS_TP_API
def test_tied_weights_are_one_shard_or_refused():
    model = _llama(tie_word_embeddings=True)
    plan = check_tp_model(model, 2)
    assert _tied_aliases(model, plan) == {"lm_head.weight": "model.embed_tokens.weight"}
    bad = {**plan, "model.embed_tokens.weight": "embedding_colwise"}  # vocab dim vs hidden dim
    with pytest.raises(ValueError, match=r"tied weights 'model.embed_tokens.weight' \(embedding_colwise\) and "
                                         r"'lm_head.weight' \(colwise_gather_output\) are split differently"):
        _tied_aliases(model, bad)
    assert _tied_aliases(_llama(), check_tp_model(_llama(), 2)) == {}


def test_optimizer_is_pointed_at_the_new_parameters():
    model = _llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = dict(model.named_parameters())
    new_q = torch.nn.Parameter(old["model.layers.0.self_attn.q_proj.weight"].detach().clone())
    model.model.layers[0].self_attn.q_proj.weight = new_q
    remap_optimizer_params([opt], old, dict(model.named_parameters()))
    params = opt.param_groups[0]["params"]
    assert any(p is new_q for p in params) and len(params) == len(old)
    # an optimizer that has stepped is refused, unchanged
    model2 = _llama()
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    model2(input_ids=torch.arange(8)[None], labels=torch.arange(8)[None]).loss.backward()
    opt2.step()
    old2 = dict(model2.named_parameters())
    before = list(opt2.param_groups[0]["params"])
    model2.model.layers[0].self_attn.q_proj.weight = torch.nn.Parameter(torch.zeros(32, 32))
    with pytest.raises(ValueError, match=r"the optimizer has already stepped"):
        remap_optimizer_params([opt2], old2, dict(model2.named_parameters()))
    assert opt2.param_groups[0]["params"] == before


def test_sync_without_groups_changes_nothing():
    model = _llama()
    model(input_ids=torch.arange(8)[None], labels=torch.arange(8)[None]).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    sync_tp_gradients(model, None)
    assert all(torch.equal(grads[n], p.grad) for n, p in model.named_parameters())


# ---------------------------------------------------------------------------- kv_exchange
def test_kv_exchange_setting_is_validated_and_reaches_the_planner():
    from atac_hf.integrations.config import KV_EXCHANGES
    from atac_hf.integrations.sharder import BatchSharder
    from atac_hf.sharding.exchange import EXCHANGES

    assert KV_EXCHANGES == ("auto", *EXCHANGES)
    assert ATACConfig().kv_exchange is None
    assert ATACConfig.from_env({"ATAC_KV_EXCHANGE": "all_to_all"}).kv_exchange == "all_to_all"
    assert ATACConfig.from_env({"ATAC_KV_EXCHANGE": "none"}).kv_exchange is None
    assert ATACConfig.from_dict({"kv_exchange": "auto"}).to_dict()["kv_exchange"] == "auto"
    for bad in ("ring", 1, "ALL_GATHER"):
        with pytest.raises(ValueError, match=r"unknown kv_exchange .*; legal values: None, \['auto', 'all_gather', "
                                             r"'all_to_all'\] \(set kv_exchange / ATAC_KV_EXCHANGE\)"):
            ATACConfig(kv_exchange=bad)
    lengths = [300, 20, 7, 1]
    ids = torch.arange(sum(lengths))[None] % 50
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    batch = {"input_ids": ids, "position_ids": pos, "labels": ids.clone()}
    for kind in EXCHANGES:
        cfg = ATACConfig(cp_size=2, sharding_strategy="zigzag", kv_exchange=kind)
        plan, _ = BatchSharder(cfg, cp_rank=0).plan(copy.deepcopy(batch))
        assert len(plan.gathered_docs) and plan.kv_exchange == kind


def test_trainer_refuses_resumable_checkpoints_under_tp(tmp_path):
    import datasets
    from accelerate.parallelism_config import ParallelismConfig
    from transformers import TrainingArguments

    from atac_hf.integrations import ATACTrainer

    ds = datasets.Dataset.from_dict({"input_ids": [list(range(1, 9))] * 4})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="steps",
                             parallelism_config=ParallelismConfig(tp_size=2, cp_size=1))
    model = _llama()
    attn, pc = model.config._attn_implementation, args.parallelism_config
    with pytest.raises(ValueError, match=r"tp_size=2 with save_strategy='steps': .*save_only_model=True"):
        ATACTrainer(model=model, args=args, train_dataset=ds, atac_config=ATACConfig(max_tokens=16))
    # a refused operation changes nothing: the model keeps its attention, args their config
    assert model.config._attn_implementation == attn != "atac_cp"
    assert args.parallelism_config is pc


def test_model_sharded_at_load_time_by_transformers_is_refused_unchanged():
    from atac_hf.integrations.sharder import prepare_model

    model = _llama()
    model._is_distributed_loading_by_transformers = True  # what from_pretrained(tp_plan=...) leaves
    model._tp_size = 2
    before = model.config._attn_implementation
    with pytest.raises(ValueError, match=r"LlamaForCausalLM was tensor-parallelised at load time by transformers "
                                         r"\(tp_size=2, .*load it without tp_plan"):
        prepare_model(model, ATACConfig())
    assert model.config._attn_implementation == before


def test_model_already_sharded_on_other_ranks_is_refused_unchanged(tmp_path):
    """apply_tensor_parallel on a model whose DTensor parameters live on another TP group's ranks
    (a one-process world here; the mesh it is asked to use claims rank 1)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from atac_hf.integrations.tensor_parallel import apply_tensor_parallel

    class _OtherRanks:  # the part of a DeviceMesh apply_tensor_parallel reads
        mesh = torch.tensor([1])

        def size(self):
            return 1

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        model = _llama()
        mesh = DeviceMesh("cpu", [0])
        q = model.model.layers[0].self_attn.q_proj
        q.weight = torch.nn.Parameter(distribute_tensor(q.weight.detach(), mesh, [Replicate()]))
        before = {n: p for n, p in model.named_parameters()}
        with pytest.raises(ValueError, match=r"LlamaForCausalLM is already sharded \(DTensor parameters on ranks "
                                             r"\(0,\)\), not on this rank's TP group \[1\] \(tp_size=1\): build or "
                                             r"load the model without tp_plan"):
            apply_tensor_parallel(model, _OtherRanks())
        assert all(p is before[n] for n, p in model.named_parameters())
        assert apply_tensor_parallel(model, mesh) is model  # the same ranks: left alone (idempotent)
        assert all(p is before[n] for n, p in model.named_parameters())
    finally:
        dist.destroy_process_group()


def test_tp_backward_before_prepare_is_refused_before_any_gradient():
    """ATACAccelerator.backward with tp_size > 1 and no prepared model refuses before the backward pass."""
    from atac_hf.integrations.accelerate import ATACAccelerator

    acc = object.__new__(ATACAccelerator)  # the refusal needs only these two attributes
    acc.tp_size, acc._models = 2, []
    w = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(RuntimeError, match=r"accelerator.backward with tp_size > 1 needs the model prepared first: "
                                           r"call accelerator.prepare\(model, optimizer\)"):
        acc.backward((w * 2).sum())
    assert w.grad is None

"""Red-team 35 (TP x CP): per-head parameters the tp_plan leaves whole, legal tp sizes in the refusals,
the heads a TP rank really runs (gathered q/k/v plans), and the mesh placement rules.

In-process: :func:`check_tp_model` / :func:`tp_head_split` on tiny configs need no process group,
and the layout helpers are pure. The ``slow`` test runs tp 2 x cp 2 on 4 gloo processes: Olmo2 and
Phi3 (q/k/v ``colwise_gather_output``) with 3 heads are exact against one process, and ``atac_cp``
sees all their heads on every TP rank.
"""

from __future__ import annotations

import copy
import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

from atac_hf.integrations.layout import mesh_groups, placement_warnings  # noqa: E402
from atac_hf.integrations.tensor_parallel import apply_tensor_parallel, check_tp_model, tp_head_split  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128, max_position_embeddings=256)


def _model(model_type: str, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**SMALL, **kw}))


# ---------------------------------------------------------------------------- A: per-head parameters
@pytest.mark.parametrize("kv", [2, 4])
def test_cohere_qk_norm_is_refused_before_the_model_changes(kv):
    model = _model("cohere", use_qk_norm=True, num_key_value_heads=kv)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    attn = model.config._attn_implementation
    msg = (r"tp_size=2: CohereForCausalLM's parameter 'model.layers.0.self_attn.q_norm.weight' has a per-head shape "
           r"\(4, 16\) .*no entry in its tp_plan.*Set tp_size=1 \(parallelism_config tp_size / "
           r"parallelism_config_tp_size\) and use cp_size / DP instead")
    with pytest.raises(ValueError, match=msg):
        check_tp_model(model, 2)
    with pytest.raises(ValueError, match=msg):  # refused before any broadcast, sharding or hook
        apply_tensor_parallel(model, types.SimpleNamespace(size=lambda: 2))
    assert all(type(p) is torch.nn.Parameter and torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert model.config._attn_implementation == attn and not model._forward_hooks
    assert check_tp_model(_model("cohere", use_qk_norm=False), 2)  # the plain Cohere still runs


def test_per_head_rule_is_class_wide_and_spares_working_families():
    model = _model("llama")  # an uncovered (kv_heads, head_dim) parameter on any family is refused
    model.model.layers[1].self_attn.register_parameter("k_scale", torch.nn.Parameter(torch.ones(2, 16)))
    with pytest.raises(ValueError, match=r"LlamaForCausalLM's parameter 'model.layers.1.self_attn.k_scale' has a "
                                         r"per-head shape \(2, 16\)"):
        check_tp_model(model, 2)
    # Qwen3's (head_dim,) q/k norms are replicated_with_grad_allreduce; Mixtral's experts (4 = heads) are 3-D
    # (experts, 2 x intermediate, hidden); Olmo2 gathers q/k/v (an uncovered per-head weight is then whole there)
    for mt, kw in (("qwen3", {"head_dim": 16}), ("mixtral", {"num_local_experts": 4}), ("deepseek_v3", {}),
                   ("gemma2", {"head_dim": 16}), ("phi3", {"pad_token_id": 0}), ("olmo2", {})):
        assert check_tp_model(_model(mt, **kw), 2), mt
    olmo = _model("olmo2")
    olmo.model.layers[0].self_attn.register_parameter("k_scale", torch.nn.Parameter(torch.ones(2, 16)))
    assert check_tp_model(olmo, 2)


# ---------------------------------------------------------------------------- B: legal sizes, setting named
def test_head_refusals_name_runnable_sizes_and_the_setting():
    model = _model("llama", num_attention_heads=3, num_key_value_heads=3, hidden_size=48)
    setting = r"\(parallelism_config tp_size / parallelism_config_tp_size\), or use cp_size / DP instead"
    with pytest.raises(ValueError, match=r"tp_size=2 does not divide LlamaForCausalLM's num_attention_heads=3 .*"
                                         r"set tp_size to one of \[1\] " + setting):
        check_tp_model(model, 2, world_size=2)  # 3 heads: tp 3 cannot run on 2 processes
    with pytest.raises(ValueError, match=r"one of \[1, 3\] "):
        check_tp_model(model, 2, world_size=12, cp_size=4)  # 3 ranks per CP rank
    with pytest.raises(ValueError, match=r"one of \[1\] "):
        check_tp_model(model, 2, world_size=8, cp_size=4)
    with pytest.raises(ValueError, match=r"one of \[1, 3\] "):  # no process group, no world size: head divisors
        check_tp_model(model, 2)
    with pytest.raises(ValueError, match=r"tp_size=4 does not divide LlamaForCausalLM's num_key_value_heads=2 .*"
                                         r"one of \[1, 2\] " + setting):
        check_tp_model(_model("llama"), 4, world_size=8)


# ---------------------------------------------------------------------------- C: heads split per TP rank
@pytest.mark.parametrize("model_type, kw, split", [
    ("llama", {}, 2), ("qwen3", {"head_dim": 16}, 2), ("deepseek_v3", {}, 2), ("gemma2", {"head_dim": 16}, 2),
    ("olmo2", {}, 1), ("olmo3", {}, 1), ("phi3", {"pad_token_id": 0}, 1)])
def test_tp_head_split_follows_the_plan(model_type, kw, split):
    model = _model(model_type, **kw)
    assert tp_head_split(model, 2) == split
    assert tp_head_split(model, 1) == 1
    styles = {v for k, v in check_tp_model(model, 2).items() if "layers.0.self_attn" in k and k.endswith("proj")
              and "o_proj" not in k}
    assert styles <= ({"colwise", "mla_kv_a_proj"} if split == 2 else {"colwise_gather_output"}), styles


def test_gathered_plans_skip_the_head_divisibility_refusal():
    assert tp_head_split(_model("llama", base_model_tp_plan=None), 2) == 1  # no plan: nothing split
    olmo = _model("olmo2", num_attention_heads=3, num_key_value_heads=3, hidden_size=48)
    assert check_tp_model(olmo, 2)  # every TP rank runs all 3 heads (exact: the slow test below)
    with pytest.raises(ValueError, match=r"num_attention_heads=3"):
        check_tp_model(_model("llama", num_attention_heads=3, num_key_value_heads=3, hidden_size=48), 2)


# ---------------------------------------------------------------------------- D: placement rules, keys
def test_fsdp_shard_group_rule_holds_with_dp_replicate():
    (msg,) = placement_warnings({"dp_replicate": 2, "dp_shard": 4, "cp": 4}, 8, fsdp=True)  # 4 nodes x 8
    assert "FSDP shards parameters over dp_shard x cp x tp = 16 ranks, more than one node (8 processes; " \
           "dp_replicate=2)" in msg and "parallelism_config_dp_replicate_size" in msg
    (msg,) = placement_warnings({"dp_replicate": 2, "dp_shard": 3, "cp": 4}, 8, fsdp=True)  # 3 nodes x 8
    assert "= 12 ranks, more than one node" in msg
    (msg,) = placement_warnings({"dp_replicate": 4, "dp_shard": 3}, 4, fsdp=True)  # groups of 3 on nodes of 4
    assert "= 3 ranks, not a divisor of one node (4 processes" in msg
    assert placement_warnings({"dp_replicate": 2, "dp_shard": 2, "cp": 4}, 8, fsdp=True) == []  # HSDP as advised
    assert placement_warnings({"dp_replicate": 2, "dp_shard": 4, "cp": 4}, 8) == []  # no FSDP: DP across nodes


@pytest.mark.parametrize("sizes, bad", [({"cp_size": 2, "tp": 2}, "cp_size"), ({"sp": 2}, "sp")])
def test_unknown_mesh_keys_are_refused(sizes, bad):
    msg = rf"unknown mesh axis key\(s\) \['{bad}'\] .*the legal keys are \['dp_replicate', 'dp_shard', 'cp', 'tp'\]"
    with pytest.raises(ValueError, match=msg):
        mesh_groups(sizes)
    with pytest.raises(ValueError, match=msg):
        placement_warnings(sizes, 8)
    assert mesh_groups({"cp": 2, "tp": 2})["cp"] == [[0, 2], [1, 3]]


# ---------------------------------------------------------------------------- C, 4 processes
HEADS3 = dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3, head_dim=16)
from test_tp_cp_models import LENGTHS, shard_tp_cp  # noqa: E402  (the same row, sharded the same way)


def _gathered_entry(rank: int, world: int, out_path: str) -> None:
    import json

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from atac_hf.attention import register_attention
    from atac_hf.cost import CostModel
    from atac_hf.integrations.tensor_parallel import sync_tp_gradients

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    register_attention()
    cost = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-7, tile=1, kv_bytes_per_token=64.0)
    out = {}
    for mt, kw in (("olmo2", {}), ("phi3", {"pad_token_id": 0})):
        model = _model(mt, **HEADS3, **kw).double().train()
        ref = copy.deepcopy(model)
        ids, labels, n, local, plan = shard_tp_cp(model, mesh, cost)
        seen, orig = [], ALL_ATTENTION_FUNCTIONS["atac_cp"]

        def probe(module, q, k, v, mask, **kwargs):
            seen.append((q.shape[1], k.shape[1]))
            return orig(module, q, k, v, mask, **kwargs)

        AttentionInterface.register("atac_cp", probe)
        try:
            loss = model(**local).loss
        finally:
            AttentionInterface.register("atac_cp", orig)
        loss.backward()
        sync_tp_gradients(model, mesh["cp"].get_group())
        total = loss.detach().clone()
        dist.all_reduce(total, group=mesh["cp"].get_group())
        ref.set_attn_implementation("sdpa")
        ref_loss, offset = 0.0, 0
        for length in LENGTHS:
            if length >= 2:
                logits = ref(input_ids=ids[:, offset:offset + length], use_cache=False).logits[0, :-1].double()
                part = torch.nn.functional.cross_entropy(logits, labels[0, offset + 1:offset + length],
                                                         reduction="sum") / n
                part.backward()
                ref_loss += float(part.detach())
            offset += length
        worst = 0.0
        for name, p in model.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            worst = max(worst, _dist.rel_err(g * 2, ref.get_parameter(name).grad))  # CP mean -> sum
        out[mt] = {"loss_rel": abs(float(total) - ref_loss) / abs(ref_loss), "grad_rel": worst,
                   "heads_seen": sorted(set(seen)), "split": tp_head_split(model, 2),
                   "sharded": any(isinstance(p, DTensor) for p in model.parameters()),
                   "cp_split_docs": len(plan.sharded_docs)}
    llama = _model("llama")
    apply_tensor_parallel(llama, mesh["tp"])  # on the sharded model too (accelerate.py / trainer.py call it then)
    out["llama_sharded_split"] = tp_head_split(llama, 2)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)


@pytest.mark.slow
def test_gathered_plans_run_all_heads_and_are_exact_with_indivisible_heads(tmp_path):
    import json

    path = str(tmp_path / "out.json")
    _dist.spawn(_gathered_entry, 4, path, timeout_s=600)
    out = json.loads(open(path).read())
    assert out.pop("llama_sharded_split") == 2
    for mt, v in out.items():
        assert v["sharded"] and v["split"] == 1, (mt, v)
        assert v["heads_seen"] == [[3, 3]], (mt, v)  # all 3 query and K/V heads on each TP rank
        assert v["cp_split_docs"] > 0, (mt, v)  # the long document is split: the K/V exchange ran
        assert v["loss_rel"] < 1e-6 and v["grad_rel"] < 1e-6, (mt, v)
        print(f"{mt}: loss rel {v['loss_rel']:.1e}, grad rel {v['grad_rel']:.1e}, heads {v['heads_seen']}")

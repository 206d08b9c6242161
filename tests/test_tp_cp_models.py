"""TP 2 x CP 2 across model families (issue 19; ``models`` marker, like the check_model sweep).

4 gloo processes. For each family: a tiny copy of its default config (``shrink_config``: the
model class and every attention feature of its config, small widths; sliding windows kept), in
fp64 (fp32 for mixture-of-experts, whose grouped matmul refuses fp64), sharded with its own
``tp_plan`` by :func:`apply_tensor_parallel`, one packed row planned by ATP over the CP group
(its long document split, so the K/V exchange runs), forward + backward through ``atac_cp``,
:func:`sync_tp_gradients` over the CP group. Compared with the stock model (sdpa) run document
by document on one process: the loss and every parameter's full gradient.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
from _launch import free_port  # noqa: E402

pytestmark = pytest.mark.models

FAMILIES = ("qwen2", "mistral", "phi3", "olmo2", "gemma", "granite", "starcoder2", "glm", "cohere",
            "gemma3_text", "olmo3", "phi", "gpt_neox", "smollm3", "exaone4", "seed_oss", "qwen3_moe", "olmoe")
LENGTHS = (60, 1, 9, 13, 30)
RTOL = {torch.float64: 1e-6, torch.float32: 5e-6}  # fp64: stock models compute the loss in fp32


def _build(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    from atac_hf.attention.model_probe import shrink_config

    cfg = shrink_config(AutoConfig.for_model(model_type))
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for k in ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout"):
        if hasattr(text, k):
            setattr(text, k, 0.0)
    dtype = torch.float32 if "moe" in model_type else torch.float64
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).train(), dtype


def shard_tp_cp(model, mesh, cost, vocab: int = 100):
    """The test row (documents of ``LENGTHS``, random ids below ``vocab``, no target at a document's first token),
    ``model`` sharded over ``mesh["tp"]`` with its own plan on ``atac_cp``, and this rank's shard of the row over
    ``mesh["cp"]``: ``(ids, labels, n, local, plan)``, ``n`` the row's target count."""
    from atac_hf.attention import doc_lengths_from_batch, shard_batch
    from atac_hf.integrations.tensor_parallel import apply_tensor_parallel
    from atac_hf.sharding import plan_shards

    ids = torch.randint(0, min(vocab, 100), (1, sum(LENGTHS)), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    labels = ids.clone()
    labels[pos == 0] = -100
    batch = {"input_ids": ids, "position_ids": pos, "labels": labels}
    n = int((labels[:, 1:] != -100).sum())
    apply_tensor_parallel(model, mesh["tp"])
    model.set_attn_implementation("atac_cp")
    plan = plan_shards(doc_lengths_from_batch(batch), 2, "atp", cost)
    local = shard_batch({**batch, "num_items_in_batch": n}, plan, mesh["cp"].get_local_rank(), mesh["cp"].get_group())
    return ids, labels, n, local, plan


def _entry(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from atac_hf.attention import register_attention
    from atac_hf.cost import CostModel
    from atac_hf.integrations.tensor_parallel import sync_tp_gradients

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    register_attention()
    cost = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-7, tile=1, kv_bytes_per_token=64.0)
    out: dict = {}
    for mt in FAMILIES:
        try:
            model, dtype = _build(mt)
            ref = copy.deepcopy(model)
            ids, labels, n, local, plan = shard_tp_cp(model, mesh, cost, model.config.get_text_config().vocab_size)
            loss = model(**local).loss
            loss.backward()
            sync_tp_gradients(model, mesh["cp"].get_group())  # mean over the CP group
            total = loss.detach().clone()
            dist.all_reduce(total, group=mesh["cp"].get_group())
            ref.set_attn_implementation("sdpa")
            ref_loss, offset = 0.0, 0
            for length in LENGTHS:
                if length >= 2:
                    logits = ref(input_ids=ids[:, offset:offset + length], position_ids=torch.arange(length)[None],
                                 use_cache=False).logits[0, :-1].double()
                    part = torch.nn.functional.cross_entropy(logits, labels[0, offset + 1:offset + length],
                                                             reduction="sum") / n
                    part.backward()
                    ref_loss += float(part.detach())
                offset += length
            worst, bad = 0.0, []
            for name, p in model.named_parameters():
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                e = _dist.rel_err(g * 2, ref.get_parameter(name).grad)  # mean over 2 CP ranks -> sum
                worst = max(worst, e)
                if e > RTOL[dtype]:
                    bad.append([name, e])
            out[mt] = {"loss_rel": abs(float(total) - ref_loss) / abs(ref_loss), "grad_rel": worst, "bad": bad[:4],
                       "split": len(plan.sharded_docs), "rtol": RTOL[dtype]}
        except Exception as e:  # noqa: BLE001 - reported per family
            out[mt] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    if rank == 0:
        with open(os.path.join(out_dir, "out.json"), "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def test_tp2_x_cp2_is_exact_across_families():
    import torch.multiprocessing as mp

    out_dir = tempfile.mkdtemp(prefix="atac_tp_models_")
    ctx = mp.spawn(_entry, args=(4, free_port(), out_dir), nprocs=4, join=False)
    assert not _dist.join_or_kill(ctx, 900), "a rank hung"
    out = json.loads(open(os.path.join(out_dir, "out.json")).read())
    failed = {k: v for k, v in out.items() if "error" in v or v["bad"] or v["loss_rel"] > v["rtol"]}
    assert not failed, failed
    assert all(v["split"] > 0 for v in out.values()), "every family's long document is split over the CP ranks"
    for k, v in out.items():
        print(f"{k}: loss rel {v['loss_rel']:.1e}, grad rel {v['grad_rel']:.1e}")

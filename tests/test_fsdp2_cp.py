"""FSDP2 x CP on CPU (issue 13): 4 gloo processes, dp_shard 2 x cp 2, through ``ATACAccelerator``
(mesh, CP group, plan + shard + loss normaliser, ``count_items``, ``reduce_loss``) with the
model sharded by torch's ``fully_shard`` over the joint ``dp_shard_cp`` mesh axis, as
Accelerate's FSDP2 path does on GPU. Accelerate itself enables FSDP only on GPUs
(``AcceleratorState`` keeps ``MULTI_CPU`` whatever the plugin), so the test applies
``fully_shard`` the same way: every decoder layer, then the root.

Compared step by step with one process training on the same two packs per step (one per DP
replica): the loss, every parameter's full gradient (``DTensor.full_tensor()``) before each
optimizer step, and the parameters after it (SGD with momentum), with an fp64 model; the
reference runs every document on its own, so its document masking holds by construction.
FSDP2 averages gradients over the 4 ranks; ``ATACAccelerator.shard`` scales each rank's loss
by ``num_processes`` so that mean is the single-device gradient.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
import _reliability  # noqa: E402
from _launch import free_port  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 3
#: Tolerance: the model runs in fp64, but transformers' causal-LM loss casts the logits to fp32,
#: so the loss and its gradient carry fp32 rounding (measured: about 1e-7 relative).
RTOL = 1e-5
LR = 0.5  # SGD with momentum: parameter differences are lr x gradient differences (AdamW's first
# step, about lr x sign(grad), would magnify rounding in near-zero gradients)
# one pack per DP replica and step; 1-token documents, a document longer than each rank's share
PACKS = [[[150, 30, 1, 2, 20, 1, 7], [180, 20, 11]],
         [[200, 10, 1], [5, 5, 201]],
         [[1, 1, 1, 160, 48], [120, 50, 41]]]


def _batch(step: int, replica: int) -> dict:
    return _dist.make_batch([PACKS[step][replica]], seed=100 * step + replica)


def _reference() -> dict:
    """One process, the same model and optimizer, both replicas' packs per step, every document
    run on its own (unpacked: document masking holds by construction, independent of any mask)."""
    torch.set_num_threads(1)
    model = _dist.tiny_model("llama", torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    out: dict = {"loss": [], "grads": [], "params": []}
    for step in range(STEPS):
        batches = [_batch(step, r) for r in range(2)]
        n = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)  # targets of the step
        total = 0.0
        for b in batches:
            offset = 0
            for length in b["seq_lengths"][0]:
                ids = b["input_ids"][:, offset:offset + length]
                targets = b["labels"][0, offset + 1:offset + length]
                offset += length
                if length < 2:
                    continue  # a 1-token document has no target
                logits = model(input_ids=ids, position_ids=torch.arange(length)[None]).logits[0, :-1]
                loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum") / n
                loss.backward()
                total += float(loss.detach())
        out["loss"].append(total)
        out["grads"].append({k: p.grad.detach().clone().numpy().tolist() for k, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        out["params"].append({k: p.detach().clone().numpy().tolist() for k, p in model.named_parameters()})
    return out


def _entry(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key in [k for k in os.environ if k.startswith(("ATAC_", "PARALLELISM_CONFIG_", "ACCELERATE_"))]:
        del os.environ[key]
    torch.set_num_threads(1)
    res: dict = {"loss": [], "grads": [], "params": [], "kv": []}
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor

        from atac_hf.cost import CostModel
        from atac_hf.integrations import ATACAccelerator, ATACConfig
        from atac_hf.integrations.sharder import BatchSharder, prepare_model

        config = ATACConfig(cp_size=2, min_chunk=4, sharding_strategy="atp", debug=True)
        acc = ATACAccelerator(config, cpu=True)
        mesh = acc.torch_device_mesh
        res["mesh"] = list(mesh.mesh_dim_names)
        res["cp_rank"], res["dp_size"] = acc.cp_rank, acc.dp_size
        model = _dist.tiny_model("llama", torch.float64)
        prepare_model(model, config)  # checks the model, selects the atac_cp attention
        shard_mesh = mesh["dp_shard_cp"]  # FSDP2 shards over dp_shard x cp (Accelerate's fsdp2 path)
        res["shard_mesh_size"] = shard_mesh.size()
        for layer in model.model.layers:
            fully_shard(layer, mesh=shard_mesh)
        fully_shard(model, mesh=shard_mesh)
        res["sharded"] = all(isinstance(p, DTensor) for p in model.parameters())
        # what ATACAccelerator.prepare(model) sets up besides wrapping (it would wrap in DDP on CPU)
        # a cost model where attention dominates, so that atp splits each pack's long document (a GPU
        # preset prices the tiny model's attention below the K/V exchange and keeps documents whole)
        cost = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-7, tile=1, kv_bytes_per_token=64.0)
        acc.sharder = BatchSharder(config, cp_rank=acc.cp_rank, cp_group=acc.cp_group, device_type="cpu",
                                   cost_model=cost)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        replica = rank // 2  # CP innermost: ranks {0, 1} are replica 0, {2, 3} replica 1
        for step in range(STEPS):
            batch = _batch(step, replica)
            local = acc.shard(batch)  # counts the step's targets over both replicas (collective)
            loss = model(**local).loss
            loss.backward()
            res["loss"].append(float(acc.reduce_loss(loss)))
            res["kv"].append(int(acc.sharder.last_stats.num_sharded))  # documents split over the CP ranks
            full = {k: p.grad.full_tensor().detach().numpy().tolist() for k, p in model.named_parameters()}
            if rank == 0:
                res["grads"].append(full)
            opt.step()
            opt.zero_grad()
            params = {k: p.full_tensor().detach().numpy().tolist() for k, p in model.named_parameters()}
            if rank == 0:
                res["params"].append(params)
        acc.wait_for_everyone()
        import torch.distributed as dist

        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["setup_error"] = _dist.error_text(e)
    _dist.report_and_exit(os.path.join(out_dir, f"{rank}.json"), res)


def _names(key: str) -> str:
    # fully_shard keeps parameter names; strip any wrapper prefix all the same
    return key.replace("_fsdp_wrapped_module.", "").replace("_orig_mod.", "")


def test_fsdp2_dp_shard2_x_cp2_equals_one_process_step_by_step():
    import torch.multiprocessing as mp

    out_dir = tempfile.mkdtemp(prefix="atac_fsdp2_")
    ctx = mp.spawn(_entry, args=(4, free_port(), out_dir), nprocs=4, join=False)
    assert not _dist.join_or_kill(ctx, 400), "a rank hung"
    res = [json.loads(open(os.path.join(out_dir, f"{r}.json")).read()) for r in range(4)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    assert [r["cp_rank"] for r in res] == [0, 1, 0, 1] and res[0]["dp_size"] == 2
    assert res[0]["mesh"] == ["dp_shard", "cp"] and res[0]["shard_mesh_size"] == 4, res[0]["mesh"]
    assert all(r["sharded"] for r in res), "parameters must be FSDP2 DTensors"
    ref = _reference()
    # not vacuous: the anchors' K/V cross the CP group, training moves, the packs differ
    assert all(n > 0 for r in res for n in r["kv"]), "every step's packs have a document split over the CP ranks"
    assert len(set(np.round(ref["loss"], 8))) == STEPS
    for r in res:  # every rank reports the same step loss (transformers' loss runs in fp32)
        np.testing.assert_allclose(r["loss"], ref["loss"], rtol=RTOL, atol=0)
    got = res[0]
    worst_grad = worst_param = 0.0
    for step in range(STEPS):
        g_ref, g = ref["grads"][step], {_names(k): v for k, v in got["grads"][step].items()}
        assert set(g) == set(g_ref), sorted(set(g) ^ set(g_ref))
        for k in g_ref:
            a, b = np.asarray(g[k]), np.asarray(g_ref[k])
            scale = max(float(np.abs(b).max()), 1e-30)
            worst_grad = max(worst_grad, float(np.abs(a - b).max()) / scale)
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale, err_msg=f"step {step} grad {k}")
        p_ref, p = ref["params"][step], {_names(k): v for k, v in got["params"][step].items()}
        for k in p_ref:
            a, b = np.asarray(p[k]), np.asarray(p_ref[k])
            worst_param = max(worst_param, float(np.abs(a - b).max()))
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL, err_msg=f"step {step} param {k}")
    assert any(np.abs(np.asarray(v)).max() > 0 for v in ref["grads"][0].values())
    print(f"\nFSDP2 dp_shard 2 x cp 2 vs one process, {STEPS} SGD steps (fp64 model, fp32 loss): loss rel "
          f"{max(abs(a - b) / abs(b) for a, b in zip(got['loss'], ref['loss'])):.1e}, grad rel {worst_grad:.1e}, "
          f"param abs {worst_param:.1e}")
    _reliability.count("fsdp2.steps_compared", STEPS)
    _reliability.count("fsdp2.grads_compared", STEPS * len(ref["grads"][0]))
    _reliability.flush(__name__)

"""FSDP2 x CP at odd CP sizes (red-team 44): ``ATACAccelerator`` with torch's ``fully_shard`` over the
``dp_shard_cp`` axis (every GPT-2 block, then the root, as Accelerate's FSDP2 path does on GPU), fp64 GPT-2 with
an fp64 loss, SGD with momentum; rank 0 records the loss, every full gradient and every parameter per step.
Spawned by tests/test_redteam44_trainer_exactness.py; :func:`reference` is the one-device run (each document
alone)."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
from _redteam44_worker import VOCAB, _pack_loss_sum, build_model  # noqa: E402

LR = 0.5
# per step, one batch per DP replica: 1-token documents, a document longer than a rank's share, a pack of 2 tokens,
# batches of two rows (one of 2 x 2 tokens). Every step must split a document: since the fifty-sixth stop ATP keeps
# [25, 1, 3], [10, 10, 9] whole at CP 2 and 3 (23% faster by the estimate than its former split), so the
# two-row batch is now [30, 1, 3], [10, 10, 14].
PACKS = [[[50, 10, 1, 2, 20, 1, 7], [60, 20, 11]],
         [[70, 10, 1], [5, 5, 71]],
         [[1, 1, 1, 40, 48], [2]],
         [[[30, 1, 3], [10, 10, 14]], [[1, 1], [2]]]]


def batch(step: int, replica: int) -> dict:
    rows = PACKS[step][replica]
    b = _dist.make_batch(rows if isinstance(rows[0], list) else [rows], seed=100 * step + replica)
    b["input_ids"] = b["input_ids"] % VOCAB
    b["labels"] = torch.where(b["labels"] == -100, b["labels"], b["labels"] % VOCAB)
    return b


def entry(rank: int, world: int, cp: int, port: int, out_dir: str) -> None:
    _dist.launch_env(rank, world, port)
    res: dict = {"loss": [], "grads": [], "params": [], "split": []}
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor

        from atac_hf.cost import CostModel
        from atac_hf.integrations import ATACAccelerator, ATACConfig
        from atac_hf.integrations.sharder import BatchSharder, prepare_model

        config = ATACConfig(cp_size=cp, min_chunk=1, sharding_strategy="atp", debug=True, max_tokens=128)
        acc = ATACAccelerator(config, cpu=True)
        shard_mesh = acc.torch_device_mesh["dp_shard_cp"]
        res["cp_rank"], res["dp_size"], res["shard_mesh_size"] = acc.cp_rank, acc.dp_size, shard_mesh.size()
        model = build_model(layers=2)
        prepare_model(model, config)
        for block in _blocks(model):
            fully_shard(block, mesh=shard_mesh)
        fully_shard(model, mesh=shard_mesh)
        res["sharded"] = all(isinstance(p, DTensor) for p in model.parameters())
        cost = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-7, tile=1, kv_bytes_per_token=64.0)
        acc.sharder = BatchSharder(config, cp_rank=acc.cp_rank, cp_group=acc.cp_group, device_type="cpu",
                                   cost_model=cost)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        replica = rank // cp  # CP innermost
        for step in range(len(PACKS)):
            local = acc.shard(batch(step, replica))  # counts the step's targets over the replicas
            loss = model(**local).loss
            loss.backward()
            res["loss"].append(float(acc.reduce_loss(loss)))
            res["split"].append(int(acc.sharder.last_stats.num_sharded))
            full = {k: p.grad.full_tensor().detach().clone() for k, p in model.named_parameters()}
            opt.step()
            opt.zero_grad()
            params = {k: p.full_tensor().detach().clone() for k, p in model.named_parameters()}
            if rank == 0:
                res["grads"].append(full)
                res["params"].append(params)
        acc.wait_for_everyone()
        import torch.distributed as dist

        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["setup_error"] = _dist.error_text(e)
    torch.save(res, os.path.join(out_dir, f"{rank}.pt"))
    os._exit(0)


def _blocks(model):
    """The decoder blocks (GPT-2's ``transformer.h``; ``model.layers`` of the Llama-like families, red-team 52)."""
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def reference(dp: int) -> dict:
    """One process, every replica's pack per step, each document alone; the step's loss over all its targets."""
    torch.set_num_threads(1)
    model = build_model(layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    out: dict = {"loss": [], "grads": [], "params": []}
    for step in range(len(PACKS)):
        sums, n = zip(*(_pack_loss_sum(model, batch(step, r)) for r in range(dp)))
        loss = sum(sums) / sum(n)
        loss.backward()
        out["loss"].append(float(loss.detach()))
        out["grads"].append({k: p.grad.detach().clone() for k, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        out["params"].append({k: p.detach().clone() for k, p in model.named_parameters()})
    return out


def run(world: int, cp: int, out_dir: str, timeout_s: float = 600) -> tuple[list[dict], dict]:
    import torch.multiprocessing as mp
    from _launch import free_port

    ctx = mp.spawn(entry, args=(world, cp, free_port(), out_dir), nprocs=world, join=False)
    hung = _dist.join_or_kill(ctx, timeout_s)
    assert not hung, f"ranks hung: {hung}"
    res = [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world)]
    return res, reference(world // cp)


def errors(res: list[dict], ref: dict) -> dict:
    from _redteam44_worker import rel

    got = res[0]
    def names(d: dict) -> dict:
        return {k.replace("_fsdp_wrapped_module.", "").replace("_orig_mod.", ""): v for k, v in d.items()}

    out = {"loss": max(abs(a - b) / abs(b) for r in res for a, b in zip(r["loss"], ref["loss"])), "grads": 0.0,
           "params": 0.0}
    for step in range(len(PACKS)):
        g, p = names(got["grads"][step]), names(got["params"][step])
        assert set(g) == set(ref["grads"][step]), sorted(set(g) ^ set(ref["grads"][step]))
        out["grads"] = max(out["grads"], max(rel(g[k], v) for k, v in ref["grads"][step].items()))
        out["params"] = max(out["params"], max(rel(p[k], v) for k, v in ref["params"][step].items()))
    return out


def _main() -> None:
    import tempfile

    if sys.argv[1] == "accel":
        w, c, counted = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "counted"
        print(json.dumps(run_accel(w, c, counted, tempfile.mkdtemp(prefix="rt44_acc_"))))
        return
    w, c = int(sys.argv[1]), int(sys.argv[2])
    d = tempfile.mkdtemp(prefix="rt44_fsdp_")
    res, ref = run(w, c, d)
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    print(json.dumps({"world": w, "cp": c, "split": res[0]["split"], "mesh": res[0]["shard_mesh_size"],
                      "sharded": all(r["sharded"] for r in res), **errors(res, ref)}))


# ---------------------------------------------------------------------------- ATACAccelerator loop, GA 3
ACC_GA = 3


def accel_entry(rank: int, world: int, cp: int, port: int, out_dir: str, counted: bool) -> None:
    """One epoch of ``packed_dataloader`` with GA 3 (DDP): ``counted`` reads each step's packs first and shards
    them with the step's count (INTEGRATION's loop, ``no_sync`` but on the last); else one pack at a time inside
    ``accumulate(model)`` with ``shard(batch)``. Every rank records its packs and the final parameters."""
    import contextlib

    _dist.launch_env(rank, world, port)
    res: dict = {"packs": [], "losses": []}  # losses: reduce_loss per micro-batch (its share of the step's)
    try:
        from atac_hf.integrations import ATACAccelerator, ATACConfig

        config = ATACConfig(cp_size=cp, min_chunk=1, debug=True, max_tokens=96)
        acc = ATACAccelerator(config, cpu=True, gradient_accumulation_steps=ACC_GA)
        model = build_model(layers=1)
        res["init"] = {k: p.detach().clone() for k, p in model.named_parameters()}
        model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
        loader, sampler = acc.packed_dataloader(_accel_data(), seed=0)
        sampler.set_epoch(0)
        step = 0
        if counted:
            it = iter(loader)
            while batches := [b for _, b in zip(range(ACC_GA), it)]:
                n_items = acc.count_items(batches)
                for i, b in enumerate(batches):
                    res["packs"].append((step, _keep(b)))
                    with contextlib.nullcontext() if i == len(batches) - 1 else acc.no_sync(model):
                        loss = model(**acc.shard(b, num_items_in_batch=n_items)).loss
                        acc.backward(loss)
                    res["losses"].append(float(acc.reduce_loss(loss)))
                opt.step()
                opt.zero_grad()
                step += 1
        else:
            for b in loader:
                res["packs"].append((step, _keep(b)))
                with acc.accumulate(model):
                    loss = model(**acc.shard(b)).loss
                    acc.backward(loss)
                    opt.step()
                    opt.zero_grad()
                res["losses"].append(float(acc.reduce_loss(loss)))
                step += acc.sync_gradients
        res["cp_rank"] = acc.cp_rank
        res["final"] = {k.removeprefix("module."): p.detach().clone() for k, p in model.named_parameters()}
        acc.wait_for_everyone()
        acc.end_training()
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["setup_error"] = _dist.error_text(e)
    torch.save(res, os.path.join(out_dir, f"{rank}.pt"))
    os._exit(0)


def _accel_data() -> list[dict]:
    from _redteam44_worker import dataset

    return dataset(47, 5)


def _keep(b: dict) -> dict:
    return {k: b[k].clone() for k in ("input_ids", "position_ids", "labels") if k in b}


def accel_reference(res: list[dict], counted: bool) -> dict:
    """One device: per step, the replicas' packs (first CP rank of each); ``counted``: every target of the step
    weighs the same; else each micro-batch's token mean (over the replicas' packs) / GA, as stock Accelerate."""
    model = build_model(layers=1)
    model.load_state_dict(res[0]["init"], strict=False)  # (tied lm_head: named once)
    assert model.config.tie_word_embeddings == (model.lm_head.weight is model.get_input_embeddings().weight)
    replicas = [r for r in res if r["cp_rank"] == 0]
    steps = sorted({s for s, _ in replicas[0]["packs"]})
    losses: list[float] = []  # each micro-batch's share of its step's loss
    for step in steps:
        per_rep = [[b for s, b in r["packs"] if s == step] for r in replicas]
        assert len({len(p) for p in per_rep}) == 1, "the replicas' micro-batch counts differ"
        total = 0.0
        if counted:
            per_micro = [list(zip(*(_pack_loss_sum(model, p[i]) for p in per_rep))) for i in range(len(per_rep[0]))]
            n_step = max(sum(sum(ns) for _, ns in per_micro), 1)
            shares = [sum(sums) / n_step for sums, _ in per_micro]
        else:
            shares = []
            for i in range(len(per_rep[0])):
                sums, ns = zip(*(_pack_loss_sum(model, p[i]) for p in per_rep))
                shares.append(sum(sums) / max(sum(ns), 1) / ACC_GA)
        losses.extend(float(x) for x in shares)
        total = sum(shares)
        model.zero_grad(set_to_none=True)
        total.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return {"final": {k: p.detach().clone() for k, p in model.named_parameters()}, "steps": len(steps),
            "losses": losses,
            "micro": [len([1 for s, _ in replicas[0]["packs"] if s == st]) for st in steps]}


def run_accel(world: int, cp: int, counted: bool, out_dir: str, timeout_s: float = 600):
    import torch.multiprocessing as mp
    from _launch import free_port
    from _redteam44_worker import rel

    ctx = mp.spawn(accel_entry, args=(world, cp, free_port(), out_dir, counted), nprocs=world, join=False)
    hung = _dist.join_or_kill(ctx, timeout_s)
    assert not hung, f"ranks hung: {hung}"
    res = [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    ref = accel_reference(res, counted)
    return {"params": max(rel(res[0]["final"][k], v) for k, v in ref["final"].items()),
            "rank_spread": max(rel(r["final"][k], res[0]["final"][k]) for r in res for k in r["final"]),
            "moved": max(rel(res[0]["final"][k], res[0]["init"][k]) for k in res[0]["init"]),
            "loss": loss_error(res, ref), "steps": ref["steps"], "micro": ref["micro"]}


def loss_error(res: list[dict], ref: dict) -> float:
    """Largest relative difference of ``reduce_loss`` (every rank) from the replay's micro-batch shares."""
    assert all(len(r["losses"]) == len(ref["losses"]) for r in res), "one loss per micro-batch"
    return max(abs(a - b) / abs(b) for r in res for a, b in zip(r["losses"], ref["losses"]))


if __name__ == "__main__":
    _main()

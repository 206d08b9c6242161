"""Workers for the TP tests (tests/test_tp_cp.py, tests/test_tp_dp.py).

Trainer: ``python tests/_tp_cp_worker.py OUT.json CP TP [GA [DP]]`` (one process with ``1 1``) or
under ``torchrun --nproc_per_node CP*TP*DP`` (e.g. ``2 2``: tp 2 x cp 2; ``1 2 2 2``: tp 2 x dp 2
with ``dp_shard`` 2 (no FSDP), through ``TrainingArguments.parallelism_config``). Trains 3 steps with
gradient accumulation GA (default 2) on the
integration tests' tiny Llama (tied embeddings) and data, then evaluates; rank 0 writes the logged
losses, grad norms, balance figures, token and FLOP counters, eval loss and a digest of every
training batch (every rank writes its own digests to ``OUT.json.RANK.digests``); the trained
weights are saved to ``OUT.json.model`` (a checkpoint at step 2 too, ``save_only_model``).

ATACAccelerator: :func:`accelerate_entry` (spawned by :func:`spawn_accelerate`) trains given packs
on a given mesh, :func:`reference` the same packs in one process.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
import _integration_worker as iw  # noqa: E402

torch.set_num_threads(1)


def main(out_path: str, cp_size: int, tp_size: int, grad_accum: int = 2, dp: int = 1) -> None:
    from accelerate.parallelism_config import ParallelismConfig
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    class RecordingTrainer(ATACTrainer):
        digests: list

        def _prepare_context_parallel_inputs(self, model, inputs):
            if model.training:
                ids = inputs["input_ids"]
                self.digests.append([int(ids.shape[1]), int(ids.sum()), int((ids * inputs["position_ids"]).sum())])
            return super()._prepare_context_parallel_inputs(model, inputs)

    pc = (ParallelismConfig(tp_size=tp_size, cp_size=cp_size, dp_shard_size=dp)
          if tp_size * cp_size > 1 else None)
    args = TrainingArguments(
        output_dir=out_path + ".run", max_steps=3, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=1,
        weight_decay=0.0, max_grad_norm=1.0, gradient_accumulation_steps=grad_accum, logging_steps=1,
        per_device_train_batch_size=1, per_device_eval_batch_size=1, use_cpu=True, report_to=[], seed=0,
        save_strategy="steps", save_steps=2, save_only_model=True, disable_tqdm=True, log_level="error", ddp_find_unused_parameters=False,
        include_num_input_tokens_seen="all", parallelism_config=pc,
    )
    cfg = ATACConfig(cp_size=cp_size, max_tokens=384, cost_preset="H100", min_chunk=8, sharding_strategy="zigzag")
    trainer = RecordingTrainer(model=iw.model(), args=args, train_dataset=iw.dataset(160, seed=1),
                               eval_dataset=iw.dataset(40, seed=2), atac_config=cfg)
    trainer.remove_callback(PrinterCallback)
    trainer.digests = []
    trainer.train()
    res = iw.history(trainer)
    res["eval_loss"] = trainer.evaluate()["eval_loss"]
    trainer.save_model(out_path + ".model")  # every rank: the TP shards are gathered, rank 0 writes
    res.update(world_size=trainer.args.world_size, tp_size=trainer.atac_tp_size, dp_size=trainer.dp_size,
               kv_bytes_per_token=trainer.atac_sharder.kv_bytes_per_token)  # this rank's heads' K/V per token
    with open(f"{out_path}.{os.environ.get('RANK', '0')}.digests", "w") as f:
        json.dump(trainer.digests, f)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


# ---------------------------------------------------------------------------- the ATACAccelerator path
# Spawned by tests/test_tp_cp.py and tests/test_tp_dp.py (``torch.multiprocessing.spawn``):
# :func:`accelerate_entry` trains the given packs through ATACAccelerator on one layout,
# :func:`reference` trains the same packs in one process, every document on its own.

MODELS = ("qwen3", "llama_tied")
LR = 0.5


def tiny_model(name: str) -> torch.nn.Module:
    """A GQA Qwen3 (4 / 2 heads, head_dim 16, untied) or a Llama with tied embeddings, fp32, seed 0."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    if name == "qwen3":
        cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=_dist.VOCAB, max_position_embeddings=1024,
                          attention_dropout=0.0, tie_word_embeddings=False)
    else:
        cfg = tiny_llama_config(hidden_size=64, num_layers=2, vocab_size=_dist.VOCAB, max_position_embeddings=1024)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).train()


def pack_batch(packs: list, step: int, index: int) -> dict:
    """Pack ``index`` of step ``step`` (``packs[step][index]``: its document lengths) as a packed batch."""

    return _dist.make_batch([packs[step][index]], seed=100 * step + index)


def reference(name: str, packs: list) -> dict:
    """One process: every pack of each step, every document on its own, loss = target sum / step count.

    Returns ``{"loss": [per step], "grads": [per step {name: list}]}`` (SGD with momentum, lr ``LR``)."""
    torch.set_num_threads(1)
    model = tiny_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    out: dict = {"loss": [], "grads": []}
    for step in range(len(packs)):
        batches = [pack_batch(packs, step, i) for i in range(len(packs[step]))]
        n = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
        total = 0.0
        for b in batches:
            offset = 0
            for length in b["seq_lengths"][0]:
                ids = b["input_ids"][:, offset:offset + length]
                targets = b["labels"][0, offset + 1:offset + length]
                offset += length
                if length < 2:
                    continue
                logits = model(input_ids=ids, position_ids=torch.arange(length)[None]).logits[0, :-1]
                loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum") / n
                loss.backward()
                total += float(loss.detach())
        out["loss"].append(total)
        out["grads"].append({k: p.grad.detach().clone().numpy().tolist() for k, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return out


class _RecordingDataset:
    """A list of samples that records which indices this process fetched (after ``recording = True``)."""

    def __init__(self, samples: list) -> None:
        self.samples, self.fetched, self.recording = samples, [], False

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        if self.recording:
            self.fetched.append(int(i))
        return self.samples[i]


def accelerate_entry(rank: int, world: int, port: int, out_dir: str, spec: dict) -> None:
    """One rank of an ATACAccelerator run; writes ``out_dir/RANK.json``.

    ``spec``: ``tp``, ``cp``, ``dp_shard``, ``dp_replicate`` (mesh sizes), ``ga`` (gradient
    accumulation), ``packs`` (per step ``dp x ga`` packs: replica ``d`` trains packs
    ``d x ga ... d x ga + ga - 1``), ``models``, and optional ``epoch_docs`` (a number of samples:
    then one epoch of ``packed_dataloader`` is iterated and the fetched sample indices recorded).
    """
    _dist.launch_env(rank, world, port)
    res: dict = {}
    try:
        from accelerate.parallelism_config import ParallelismConfig
        from torch.distributed.tensor import DTensor

        from atac_hf.cost import CostModel
        from atac_hf.integrations import ATACAccelerator, ATACConfig
        from atac_hf.integrations.sharder import BatchSharder, model_kv_bytes_per_token

        tp, cp, ga, packs = spec["tp"], spec["cp"], spec["ga"], spec["packs"]
        extra = {"max_tokens": 512} if spec.get("epoch_docs") else {}
        config = ATACConfig(cp_size=cp, min_chunk=4, sharding_strategy="atp", debug=True, **extra)
        pc = ParallelismConfig(tp_size=tp, cp_size=cp, dp_shard_size=spec.get("dp_shard", 1),
                               dp_replicate_size=spec.get("dp_replicate", 1))
        acc = ATACAccelerator(config, cpu=True, gradient_accumulation_steps=ga, parallelism_config=pc)
        mesh = acc.torch_device_mesh
        res["mesh"] = list(mesh.mesh_dim_names)
        res["cp_rank"], res["tp_rank"], res["dp_size"] = acc.cp_rank, int(mesh["tp"].get_local_rank()), acc.dp_size
        # the DP replica as Accelerate's prepared DataLoaders see it (process index // (tp x cp))
        replica = rank // (tp * cp)
        res["replica"] = replica
        assert len(packs[0]) == acc.dp_size * ga, (len(packs[0]), acc.dp_size, ga)
        for name in spec["models"]:
            model = tiny_model(name)
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
            full_kv = model_kv_bytes_per_token(model)
            model, opt = acc.prepare(model, opt)  # TP from the model's tp_plan, atac_cp attention
            res[name + "_kv_share"] = acc.sharder.kv_bytes_per_token / full_kv  # this rank's heads: 1 / tp
            if cp > 1:  # attention dominates, so atp splits each pack's long document over the CP ranks
                cost = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-7, tile=1, kv_bytes_per_token=64.0)
                assert acc.sharder.tp_group is not None  # debug: plans compared over the TP group too
                acc.sharder = BatchSharder(config, cp_rank=acc.cp_rank, cp_group=acc.cp_group, device_type="cpu",
                                           cost_model=cost, tp_group=acc.sharder.tp_group)
            q = model.model.layers[0].self_attn.q_proj.weight
            k = model.model.layers[0].self_attn.k_proj.weight
            r = {"loss": [], "grads": [], "split": [], "tokens": [], "digests": [],
                 "local_q_k_rows": [int(q.to_local().shape[0]), int(k.to_local().shape[0])],
                 "sharded": isinstance(q, DTensor),
                 "tied": model.lm_head.weight is model.model.embed_tokens.weight}
            for step in range(len(packs)):
                batches = [pack_batch(packs, step, replica * ga + m) for m in range(ga)]
                n = acc.count_items(batches)  # the step's targets over the replicas (collective)
                total = 0.0
                for b in batches:
                    with acc.accumulate(model):
                        local = acc.shard(b, num_items_in_batch=n)
                        r["tokens"].append(local["input_ids"].tolist())
                        r["digests"].append(acc.sharder.last_plan.digest)
                        r["split"].append(int(acc.sharder.last_stats.num_sharded))
                        loss = model(**local).loss
                        acc.backward(loss)
                        total += float(acc.reduce_loss(loss))
                r["loss"].append(total)
                r["sync"] = bool(acc.sync_gradients)
                full = {kk: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().numpy().tolist()
                        for kk, p in model.named_parameters()}
                if rank == 0:
                    r["grads"].append(full)
                opt.step()
                opt.zero_grad()
            res[name] = r
        if spec.get("epoch_docs"):
            import numpy as np

            rng = np.random.default_rng(3)
            lengths = rng.integers(1, 200, spec["epoch_docs"])
            data = _RecordingDataset([{"input_ids": rng.integers(0, 100, int(n)).tolist()} for n in lengths])
            loader, sampler = acc.packed_dataloader(data, seed=0)
            sampler.set_epoch(0)
            data.recording = True
            res["epoch_batches"] = [b["input_ids"].tolist() for b in loader]
            res["epoch_fetched"] = data.fetched
            res["epoch_len"] = len(sampler)
        acc.wait_for_everyone()
        import torch.distributed as dist

        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["setup_error"] = _dist.error_text(e)
    _dist.report_and_exit(os.path.join(out_dir, f"{rank}.json"), res)


def spawn_accelerate(world: int, spec: dict, *, timeout_s: float = 400) -> list[dict]:
    """Run :func:`accelerate_entry` on ``world`` gloo processes; every rank's results (failures re-raised)."""
    import tempfile

    import torch.multiprocessing as mp
    from _launch import free_port

    out_dir = tempfile.mkdtemp(prefix="atac_tp_")
    ctx = mp.spawn(accelerate_entry, args=(world, free_port(), out_dir, spec), nprocs=world, join=False)
    assert not _dist.join_or_kill(ctx, timeout_s), "a rank hung"
    res = [json.loads(open(os.path.join(out_dir, f"{r}.json")).read()) for r in range(world)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    return res


def compare_to_reference(res: list[dict], ref: dict, rtol: float, name: str) -> tuple[float, float]:
    """Assert every rank's losses and rank 0's full gradients equal the reference's, step by step (fp32
    ``rtol``; a gradient's error relative to its largest entry). Returns (loss rel, grad rel), the worst."""
    import numpy as np

    steps = len(ref["loss"])
    assert len(set(np.round(ref["loss"], 8))) == steps  # not vacuous
    for r in res:
        np.testing.assert_allclose(r["loss"], ref["loss"], rtol=rtol, atol=0)
    worst = 0.0
    for step in range(steps):
        g_ref, g = ref["grads"][step], res[0]["grads"][step]
        assert set(g) == set(g_ref), sorted(set(g) ^ set(g_ref))
        for k in g_ref:
            a, b = np.asarray(g[k]), np.asarray(g_ref[k])
            scale = max(float(np.abs(b).max()), 1e-30)
            worst = max(worst, float(np.abs(a - b).max()) / scale)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale, err_msg=f"{name} step {step} grad {k}")
    assert any(np.abs(np.asarray(v)).max() > 0 for v in ref["grads"][0].values())
    loss_rel = max(abs(a - b) / abs(b) for r in res for a, b in zip(r["loss"], ref["loss"]))
    return loss_rel, worst

if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:6]))
    iw.end_processes()

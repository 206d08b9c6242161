"""Tensor parallel x context parallel on CPU (issue 19): 4 gloo processes, tp 2 x cp 2, against one process.

Through ``ATACAccelerator`` with ``parallelism_config=ParallelismConfig(tp_size=2, cp_size=2)``:
``prepare`` shards the model with its own ``tp_plan`` on the mesh's "tp" axis (q/k/v column-split:
the ``atac_cp`` attention sees the local heads), ``shard`` plans and shards each pack over the
CP group, ``backward`` averages gradients over dp x cp, with gradient accumulation 2 (two packs
per step). Compared step by step with one process training on the same packs: the loss and
every parameter's full gradient (``DTensor.full_tensor()``) before each optimizer step, for a
GQA Qwen3 (untied embeddings) and a Llama with tied embeddings (``lm_head`` = ``embed_tokens``,
one shard), in fp32. The reference runs every document on its own (its document masking holds
by construction). Tolerance: fp32 rounding, as for CP alone (the TP all-reduces and the CP
shares sum partial results in another order).

The Trainer path (``ATACTrainer``, tp 2 x cp 2 through ``TrainingArguments.parallelism_config``)
is compared with one process on logged losses, grad norms and token counts.
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
from _launch import ROOT, free_port, run, torchrun  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 2
GA = 2
RTOL = 1e-5  # fp32 (CP alone: the same bound in test_integration_trainer.py)
LR = 0.5
# two packs per step (gradient accumulation 2); 1-token documents; a long document split over CP
PACKS = [[[150, 30, 1, 2, 20, 1, 7], [180, 20, 11]],
         [[200, 10, 1], [5, 5, 201]]]
MODELS = ("qwen3", "llama_tied")


def _model(name: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    if name == "qwen3":  # GQA 4 / 2, head_dim 16, untied
        cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=_dist.VOCAB, max_position_embeddings=1024,
                          attention_dropout=0.0, tie_word_embeddings=False)
    else:  # 4 heads / 2 K/V heads, tied embeddings
        cfg = tiny_llama_config(hidden_size=64, num_layers=2, vocab_size=_dist.VOCAB, max_position_embeddings=1024)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).train()


def _batch(step: int, micro: int) -> dict:
    return _dist.make_batch([PACKS[step][micro]], seed=100 * step + micro)


def _reference(name: str) -> dict:
    """One process: both packs of each step, every document on its own, loss = target sum / step count."""
    torch.set_num_threads(1)
    model = _model(name)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    out: dict = {"loss": [], "grads": []}
    for step in range(STEPS):
        batches = [_batch(step, m) for m in range(GA)]
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


def _entry(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key in [k for k in os.environ if k.startswith(("ATAC_", "PARALLELISM_CONFIG_", "ACCELERATE_"))]:
        del os.environ[key]
    torch.set_num_threads(1)
    res: dict = {}
    try:
        from accelerate.parallelism_config import ParallelismConfig
        from torch.distributed.tensor import DTensor

        from atac_hf.cost import CostModel
        from atac_hf.integrations import ATACAccelerator, ATACConfig
        from atac_hf.integrations.sharder import BatchSharder

        config = ATACConfig(cp_size=2, min_chunk=4, sharding_strategy="atp", debug=True)
        acc = ATACAccelerator(config, cpu=True, gradient_accumulation_steps=GA,
                              parallelism_config=ParallelismConfig(tp_size=2, cp_size=2))
        mesh = acc.torch_device_mesh
        res["mesh"] = list(mesh.mesh_dim_names)
        res["cp_rank"], res["tp_rank"], res["dp_size"] = acc.cp_rank, int(mesh["tp"].get_local_rank()), acc.dp_size
        for name in MODELS:
            model = _model(name)
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
            model, opt = acc.prepare(model, opt)  # TP from the model's tp_plan, atac_cp attention
            # attention dominates, so atp splits each pack's long document over the CP ranks
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
            for step in range(STEPS):
                batches = [_batch(step, m) for m in range(GA)]
                n = acc.count_items(batches)  # the step's targets (collective)
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
                full = {kk: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().numpy().tolist()
                        for kk, p in model.named_parameters()}
                if rank == 0:
                    r["grads"].append(full)
                opt.step()
                opt.zero_grad()
            res[name] = r
        acc.wait_for_everyone()
        import torch.distributed as dist

        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        import traceback

        res["setup_error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(0)


@pytest.fixture(scope="module")
def accelerate_runs():
    import torch.multiprocessing as mp

    out_dir = tempfile.mkdtemp(prefix="atac_tp_cp_")
    ctx = mp.spawn(_entry, args=(4, free_port(), out_dir), nprocs=4, join=False)
    assert not _dist.join_or_kill(ctx, 400), "a rank hung"
    res = [json.loads(open(os.path.join(out_dir, f"{r}.json")).read()) for r in range(4)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    return res


def test_tp2_x_cp2_mesh_and_coordinates(accelerate_runs):
    res = accelerate_runs
    assert res[0]["mesh"] == ["cp", "tp"], res[0]["mesh"]
    # TP innermost: ranks {0, 1} are one TP group (CP rank 0), {2, 3} the other (CP rank 1)
    assert [(r["cp_rank"], r["tp_rank"]) for r in res] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["dp_size"] == 1 for r in res)


@pytest.mark.parametrize("name", MODELS)
def test_tp2_x_cp2_equals_one_process_step_by_step(accelerate_runs, name):
    res = [r[name] for r in accelerate_runs]
    ref = _reference(name)
    # local heads: q_proj holds 2 of 4 heads, k_proj 1 of 2 K/V heads (head_dim 16)
    assert all(r["sharded"] and r["local_q_k_rows"] == [32, 16] for r in res)
    assert all(r["tied"] == (name == "llama_tied") for r in res)
    # planning is identical on every rank; TP peers hold the same tokens, CP ranks different ones
    assert all(r["digests"] == res[0]["digests"] for r in res)
    assert res[0]["tokens"] == res[1]["tokens"] and res[2]["tokens"] == res[3]["tokens"]
    assert all(a != b for a, b in zip(res[0]["tokens"], res[2]["tokens"]))
    assert all(n > 0 for r in res for n in r["split"]), "every pack has a document split over the CP ranks"
    assert len(set(np.round(ref["loss"], 8))) == STEPS  # not vacuous
    for r in res:
        np.testing.assert_allclose(r["loss"], ref["loss"], rtol=RTOL, atol=0)
    worst = 0.0
    for step in range(STEPS):
        g_ref, g = ref["grads"][step], res[0]["grads"][step]
        assert set(g) == set(g_ref), sorted(set(g) ^ set(g_ref))
        for k in g_ref:
            a, b = np.asarray(g[k]), np.asarray(g_ref[k])
            scale = max(float(np.abs(b).max()), 1e-30)
            worst = max(worst, float(np.abs(a - b).max()) / scale)
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale, err_msg=f"{name} step {step} grad {k}")
    assert any(np.abs(np.asarray(v)).max() > 0 for v in ref["grads"][0].values())
    print(f"\n{name}: tp 2 x cp 2 vs one process, {STEPS} steps x {GA} packs (fp32): loss rel "
          f"{max(abs(a - b) / abs(b) for a, b in zip(res[0]['loss'], ref['loss'])):.1e}, grad rel {worst:.1e}")


WORKER = ROOT / "tests" / "_tp_cp_worker.py"


def test_trainer_tp2_x_cp2_matches_one_process(tmp_path):
    run([sys.executable, WORKER, tmp_path / "one.json", 1, 1])
    torchrun(4, WORKER, tmp_path / "tp_cp.json", 2, 2)
    one = json.loads((tmp_path / "one.json").read_text())
    got = json.loads((tmp_path / "tp_cp.json").read_text())
    assert got["world_size"] == 4 and got["tp_size"] == 2 and got["dp_size"] == 1
    assert got["step"] == one["step"] and len(one["step"]) >= 3
    assert got["digests"] == one["digests"], "both runs must see the same packs"
    np.testing.assert_allclose(got["loss"], one["loss"], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(got["grad_norm"], one["grad_norm"], rtol=RTOL, atol=1e-7)
    assert got["tokens_seen"] == one["tokens_seen"] == sum(d[0] for d in one["digests"])
    np.testing.assert_allclose(got["total_flos"], one["total_flos"], rtol=1e-6)
    np.testing.assert_allclose(got["eval_loss"], one["eval_loss"], rtol=RTOL)
    assert any(x > 0 for x in got["kv_mb"]), "some pack must be split over the CP ranks"
    assert len(set(np.round(one["loss"], 6))) > 1 and min(one["grad_norm"]) > 0
    # the saved weights: gathered from the TP shards, equal to the one-process run's
    from safetensors.torch import load_file

    w1 = load_file(str(tmp_path / "one.json.model" / "model.safetensors"))
    w4 = load_file(str(tmp_path / "tp_cp.json.model" / "model.safetensors"))
    assert set(w1) == set(w4) and len(w1) > 5
    for k in w1:
        assert w4[k].shape == w1[k].shape, k
        np.testing.assert_allclose(w4[k].numpy(), w1[k].numpy(), rtol=0, atol=1e-5, err_msg=k)
    assert (tmp_path / "tp_cp.json.run" / "checkpoint-2" / "model.safetensors").is_file()

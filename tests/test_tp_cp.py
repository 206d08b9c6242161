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

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _tp_cp_worker as w  # noqa: E402
from _launch import ROOT, run, torchrun  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 2
GA = 2
RTOL = 1e-5  # fp32 (CP alone: the same bound in test_integration_trainer.py)
# two packs per step (gradient accumulation 2); 1-token documents; a long document split over CP
PACKS = [[[150, 30, 1, 2, 20, 1, 7], [180, 20, 11]],
         [[200, 10, 1], [5, 5, 201]]]
MODELS = w.MODELS


@pytest.fixture(scope="module")
def accelerate_runs():
    return w.spawn_accelerate(4, {"tp": 2, "cp": 2, "ga": GA, "packs": PACKS, "models": list(MODELS)})


def test_tp2_x_cp2_mesh_and_coordinates(accelerate_runs):
    res = accelerate_runs
    assert res[0]["mesh"] == ["cp", "tp"], res[0]["mesh"]
    # TP innermost: ranks {0, 1} are one TP group (CP rank 0), {2, 3} the other (CP rank 1)
    assert [(r["cp_rank"], r["tp_rank"]) for r in res] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["dp_size"] == 1 for r in res)
    # the K/V each rank exchanges is that of its own heads: half the model's at TP 2
    assert all(r[name + "_kv_share"] == 0.5 for r in res for name in MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_tp2_x_cp2_equals_one_process_step_by_step(accelerate_runs, name):
    res = [r[name] for r in accelerate_runs]
    ref = w.reference(name, PACKS)
    # local heads: q_proj holds 2 of 4 heads, k_proj 1 of 2 K/V heads (head_dim 16)
    assert all(r["sharded"] and r["local_q_k_rows"] == [32, 16] for r in res)
    assert all(r["tied"] == (name == "llama_tied") for r in res)
    # planning is identical on every rank; TP peers hold the same tokens, CP ranks different ones
    assert all(r["digests"] == res[0]["digests"] for r in res)
    assert res[0]["tokens"] == res[1]["tokens"] and res[2]["tokens"] == res[3]["tokens"]
    assert all(a != b for a, b in zip(res[0]["tokens"], res[2]["tokens"]))
    assert all(n > 0 for r in res for n in r["split"]), "every pack has a document split over the CP ranks"
    loss_rel, worst = w.compare_to_reference(res, ref, RTOL, name)
    print(f"\n{name}: tp 2 x cp 2 vs one process, {STEPS} steps x {GA} packs (fp32): loss rel "
          f"{loss_rel:.1e}, grad rel {worst:.1e}")


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
    assert got["kv_bytes_per_token"] == one["kv_bytes_per_token"] / 2 > 0, "each TP rank moves its own heads' K/V"
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

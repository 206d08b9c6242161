"""Tensor parallel x data parallel (cp_size 1) and TP alone with gradient accumulation, on CPU, against one process.

Through ``ATACAccelerator`` (the worker of tests/test_tp_cp.py, :mod:`_tp_cp_worker`):

* tp 2 x dp 2 on 4 gloo processes (``ParallelismConfig(dp_shard_size=2, tp_size=2)``, mesh
  ``dp_shard, tp``), gradient accumulation 2: each step the two replicas train two packs each;
  ``backward`` averages the gradients over ``mesh["dp_cp"]`` (here: the DP replicas) with each
  rank's loss scaled by ``world / tp x grad_accum``. Compared with one process training all four
  packs of the step: the loss and every full gradient (``DTensor.full_tensor()``), step by step.
* tp 2 alone on 2 processes, gradient accumulation 3: no dp x cp group; Qwen3's per-head
  ``q_norm``/``k_norm`` gradients are summed over TP once per optimizer step, on the accumulated
  gradient.
* the packed sampler over an epoch under tp 2 x dp 2: TP peers get the same packs, the two
  replicas different ones, every sample fetched exactly once.

Through ``ATACTrainer``: tp 2 x dp 2 (``dp_shard_size=2``, no FSDP; Accelerate refuses TP with
``dp_replicate_size`` alone), gradient accumulation 2, against
one process with gradient accumulation 4 (the same four packs per step): logged losses, grad
norms, token and FLOP counters, the saved weights (eval loss only roughly: its packs differ).

fp32 tolerance, as for tp 2 x cp 2.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _tp_cp_worker as w  # noqa: E402
from _launch import ROOT, run, torchrun  # noqa: E402

pytestmark = pytest.mark.slow

RTOL = 1e-5  # fp32
# tp 2 x dp 2, gradient accumulation 2: four packs per step (replica d trains packs 2d, 2d + 1)
DP_PACKS = [[[150, 30, 1, 2, 20, 1, 7], [180, 20, 11], [60, 1, 90], [3, 120, 40]],
            [[200, 10, 1], [5, 5, 201], [100, 100], [1, 1, 70, 2]]]
# tp 2 alone, gradient accumulation 3
GA_PACKS = [[[150, 30, 1, 2, 20], [180, 20, 11], [1, 64, 9]],
            [[200, 10, 1], [5, 5, 201], [90, 1, 30]]]
EPOCH_DOCS = 60


@pytest.fixture(scope="module")
def tp_dp_runs():
    return w.spawn_accelerate(4, {"tp": 2, "cp": 1, "dp_shard": 2, "ga": 2, "packs": DP_PACKS,
                                  "models": list(w.MODELS), "epoch_docs": EPOCH_DOCS})


@pytest.fixture(scope="module")
def tp_ga_runs():
    return w.spawn_accelerate(2, {"tp": 2, "cp": 1, "ga": 3, "packs": GA_PACKS, "models": list(w.MODELS)})


def test_tp2_x_dp2_mesh_and_coordinates(tp_dp_runs):
    res = tp_dp_runs
    assert res[0]["mesh"] == ["dp_shard", "tp"], res[0]["mesh"]
    # TP innermost: ranks {0, 1} are replica 0, {2, 3} replica 1
    assert [(r["replica"], r["tp_rank"], r["cp_rank"]) for r in res] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert all(r["dp_size"] == 2 for r in res)


@pytest.mark.parametrize("name", w.MODELS)
def test_tp2_x_dp2_equals_one_process_step_by_step(tp_dp_runs, name):
    res = [r[name] for r in tp_dp_runs]
    ref = w.reference(name, DP_PACKS)
    assert all(r["sharded"] and r["local_q_k_rows"] == [32, 16] for r in res)
    assert all(r["tied"] == (name == "llama_tied") for r in res)
    # TP peers hold the same (whole: cp 1) packs, the replicas different ones
    assert res[0]["tokens"] == res[1]["tokens"] and res[2]["tokens"] == res[3]["tokens"]
    assert all(a != b for a, b in zip(res[0]["tokens"], res[2]["tokens"]))
    lengths = [[len(t[0]) for t in r["tokens"]] for r in (res[0], res[2])]
    assert lengths == [[sum(DP_PACKS[s][2 * d + m]) for s in (0, 1) for m in (0, 1)] for d in (0, 1)], lengths
    loss_rel, worst = w.compare_to_reference(res, ref, RTOL, name)
    print(f"\n{name}: tp 2 x dp 2 vs one process, 2 steps x 4 packs (fp32): loss rel {loss_rel:.1e}, "
          f"grad rel {worst:.1e}")


@pytest.mark.parametrize("name", w.MODELS)
def test_tp2_grad_accum3_equals_one_process_step_by_step(tp_ga_runs, name):
    res = [r[name] for r in tp_ga_runs]
    ref = w.reference(name, GA_PACKS)
    assert [r["dp_size"] for r in tp_ga_runs] == [1, 1] and [r["tp_rank"] for r in tp_ga_runs] == [0, 1]
    assert all(r["sharded"] and r["local_q_k_rows"] == [32, 16] for r in res)
    assert res[0]["tokens"] == res[1]["tokens"] and len(res[0]["tokens"]) == 6
    assert all(r["sync"] for r in res)  # the last micro-batch of each step synchronised
    loss_rel, worst = w.compare_to_reference(res, ref, RTOL, name)
    print(f"\n{name}: tp 2, grad accum 3 vs one process, 2 steps (fp32): loss rel {loss_rel:.1e}, "
          f"grad rel {worst:.1e}")


def test_tp2_x_dp2_sampler_deals_packs_to_replicas_exactly_once(tp_dp_runs):
    res = tp_dp_runs
    # TP peers: the same packs, in the same order
    assert res[0]["epoch_batches"] == res[1]["epoch_batches"] and res[0]["epoch_fetched"] == res[1]["epoch_fetched"]
    assert res[2]["epoch_batches"] == res[3]["epoch_batches"] and res[2]["epoch_fetched"] == res[3]["epoch_fetched"]
    # the replicas: different packs, together every sample exactly once
    n = res[0]["epoch_len"]
    assert n >= 4 and n % 2 == 0, n  # even_batches: as many packs per replica
    assert len(res[0]["epoch_batches"]) == len(res[2]["epoch_batches"]) == n // 2
    got = Counter(res[0]["epoch_fetched"] + res[2]["epoch_fetched"])
    assert set(got) == set(range(EPOCH_DOCS)) and set(got.values()) == {1}, got
    assert not set(res[0]["epoch_fetched"]) & set(res[2]["epoch_fetched"])
    tokens = [sum(len(row) for row in b) for r in (res[0], res[2]) for b in r["epoch_batches"]]
    assert max(tokens) <= 512


WORKER = ROOT / "tests" / "_tp_cp_worker.py"


def test_trainer_tp2_x_dp2_matches_one_process(tmp_path):
    run([sys.executable, WORKER, tmp_path / "one.json", 1, 1, 4])  # gradient accumulation 4: the same 4 packs
    torchrun(4, WORKER, tmp_path / "tp_dp.json", 1, 2, 2, 2)  # cp 1, tp 2, accumulation 2, dp_shard 2
    one = json.loads((tmp_path / "one.json").read_text())
    got = json.loads((tmp_path / "tp_dp.json").read_text())
    assert got["world_size"] == 4 and got["tp_size"] == 2 and got["dp_size"] == 2
    assert got["step"] == one["step"] and len(one["step"]) >= 3
    digests = [json.loads((tmp_path / f"tp_dp.json.{r}.digests").read_text()) for r in range(4)]
    assert digests[0] == digests[1] and digests[2] == digests[3], "TP peers must see the same packs"
    assert len(digests[0]) == len(digests[2]) == 2 * len(one["step"])
    for step in range(len(one["step"])):  # each step: the replicas' packs together are the one process's
        mine = digests[0][2 * step:2 * step + 2] + digests[2][2 * step:2 * step + 2]
        assert sorted(mine) == sorted(one["digests"][4 * step:4 * step + 4]), step
        first, second = (set(map(tuple, d[2 * step:2 * step + 2])) for d in (digests[0], digests[2]))
        assert not first & second, step
    np.testing.assert_allclose(got["loss"], one["loss"], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(got["grad_norm"], one["grad_norm"], rtol=RTOL, atol=1e-7)
    assert got["tokens_seen"] == one["tokens_seen"] == sum(d[0] for d in one["digests"])
    np.testing.assert_allclose(got["total_flos"], one["total_flos"], rtol=1e-6)
    # eval is not the same quantity under DP: the eval set is packed for 2 replicas (even_batches:
    # 8 packs, not 9) and Trainer averages the per-step losses of pack pairs; only a sanity bound
    np.testing.assert_allclose(got["eval_loss"], one["eval_loss"], rtol=1e-2)
    assert len(set(np.round(one["loss"], 6))) > 1 and min(one["grad_norm"]) > 0
    from safetensors.torch import load_file

    w1 = load_file(str(tmp_path / "one.json.model" / "model.safetensors"))
    w4 = load_file(str(tmp_path / "tp_dp.json.model" / "model.safetensors"))
    assert set(w1) == set(w4) and len(w1) > 5
    for k in w1:
        np.testing.assert_allclose(w4[k].numpy(), w1[k].numpy(), rtol=0, atol=1e-5, err_msg=k)

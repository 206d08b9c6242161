"""Multi-process (gloo, CPU) equivalence of the only-needed K/V exchange (all-to-all) with
single-device training, and its failure when a peer dies (issue 16).

Every case compares logits, loss and every parameter gradient (summed over ranks) of CP
training on an ``all_to_all`` plan with the single-process model on the full packed batch,
for the backends that run on CPU (``sdpa``, ``varlen_reference``), with GQA (the tiny models
have 4 query and 2 K/V heads), sliding windows (``qwen3_sw``, ``mistral_sw``), and anchors
split head-tail over all ranks and over sub-groups of ranks.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
from test_attention_dist import _compare, _cp_run  # noqa: E402

pytestmark = pytest.mark.slow

DTYPES = (torch.float64, torch.float32)


def _plans(lengths, world):
    """(name, plan) cases: every plan exchanges K/V all-to-all; at least one has a document
    split over a sub-group of ranks (2..world-1) when world > 2."""
    from atac_hf.cost import default_cost_model
    from atac_hf.sharding import ShardPlan, plan_shards
    from atac_hf.sharding.subgroups import plan_subgroups

    out = [(s, plan_shards(lengths, world, s, kv_exchange="all_to_all")) for s in ("atp", "per_doc", "zigzag")]
    if world > 2:
        sub = plan_subgroups(np.asarray(lengths), world, default_cost_model(), anchor_share=0.25)
        fields = {f: getattr(sub, f) for f in ("doc_lengths", "cp_size", "strategy", "segments", "gathered_docs",
                                               "rank_compute_s", "comm_s", "block_time_s")}
        out.append(("subgroup", ShardPlan(**fields, kv_exchange="all_to_all")))
        # node-routed (two phases through node proxies; atac_hf.sharding.routing): nodes of 2 ranks,
        # and at 8 ranks nodes of 3 (the last node smaller)
        for s in ("per_doc", "atp"):
            plan = plan_shards(lengths, world, s, kv_exchange="all_to_all")
            if len(plan.gathered_docs):
                fields = {f: getattr(plan, f) for f in ("doc_lengths", "cp_size", "strategy", "segments",
                                                        "gathered_docs", "rank_compute_s", "comm_s", "block_time_s")}
                out.append((f"routed_{s}", ShardPlan(**fields, kv_exchange="all_to_all",
                                                     kv_route_node=2 if world == 4 or s == "atp" else 3)))
    return out


def _packs(world: int):
    rng = np.random.default_rng(2000 + world)
    return [("dominant", [[150, 30, 1, 2, 20, 1, 7, 60, 41]]),
            ("two_rows", [[70, 1, 3, 2, 34, 40], [5, 1, 1, 60, 43, 40]]),
            ("random", _dist.uneven_rows(rng, 230))]


def equivalence_worker(rank: int, world: int, out_path: str, models: tuple, num_packs: int) -> None:
    from atac_hf.attention import doc_lengths_from_batch

    stats: dict = defaultdict(float)
    for model_name in models:
        for dtype in DTYPES:
            model = _dist.tiny_model(model_name, dtype)
            for pi, (pack_name, rows) in enumerate(_packs(world)[:num_packs]):
                batch = _dist.make_batch(rows, seed=pi)
                ref = _dist.reference_run(model, batch) if rank == 0 else None
                lengths = doc_lengths_from_batch(batch)
                for plan_name, plan in _plans(lengths, world):
                    if not len(plan.gathered_docs):  # nothing to exchange (atp kept every document whole)
                        continue
                    assert plan.kv_exchange == "all_to_all", plan_name
                    stats["plans"] += 1
                    stats["routed_plans"] += plan.kv_route_node is not None
                    owners = [sum(int(d in s[:, 0]) for s in plan.segments) for d in plan.sharded_docs]
                    stats["subgroup_docs"] += sum(1 for n in owners if 2 <= n < world)
                    backends = ["sdpa"] + (["varlen_reference"] if dtype == torch.float64 else [])
                    for backend in backends:
                        got = _cp_run(model, batch, plan, rank, backend)
                        if rank == 0:
                            _compare(ref, got, batch, dtype,
                                     f"world={world} {model_name} {dtype} {pack_name} {plan_name} {backend}", stats)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(stats, f)


@pytest.mark.parametrize("world,models,num_packs", [(2, ("llama", "qwen3_sw", "mistral_sw"), 3),
                                                    (4, ("llama", "qwen3_sw", "mistral_sw"), 3),
                                                    (8, ("qwen3_sw",), 2)])
def test_all_to_all_cp_training_equals_single_device(world, models, num_packs, tmp_path):
    out = tmp_path / "stats.json"
    _dist.spawn(equivalence_worker, world, str(out), models, num_packs, timeout_s=900)
    stats = json.loads(out.read_text())
    print(f"\nworld={world}: " + json.dumps(stats, sort_keys=True))
    # fp64: 2 backends, fp32: 1; at least per_doc, zigzag (and the sub-group plan) exchange K/V
    assert stats["cases"] == stats["plans"] * 3 // 2 >= len(models) * num_packs * (2 + (world > 2)) * 3
    if world > 2:
        assert stats["subgroup_docs"] > 0, "no document was split over a sub-group of ranks"
        assert stats["routed_plans"] >= num_packs * len(models) * 2, "too few node-routed plans"


# ============================================================================ faults
FAULT_TIMEOUT_S = 2.0
SCENARIOS = ("raise_before_exchange", "raise_mid_backward", "die_before_exchange")


def _fault_entry(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Rank 1 fails in each scenario on a fresh subgroup with a short timeout; rank 0 must fail
    with the add-on's clear error within it (see tests/test_reliability_dist.py)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from atac_hf.attention import doc_lengths_from_batch, shard_batch
    from atac_hf.sharding import plan_shards

    model = _dist.tiny_model("llama", torch.float32, attn="atac_cp")
    batch = _dist.make_batch([[150, 30, 1, 2, 20, 1, 7]], seed=0)
    plan = plan_shards(doc_lengths_from_batch(batch), world, "per_doc", kv_exchange="all_to_all")
    if world > 2:  # node-routed over nodes of 2 ranks: two all-to-alls a layer
        from atac_hf.sharding import ShardPlan
        plan = ShardPlan(**{f: getattr(plan, f) for f in ("doc_lengths", "cp_size", "strategy", "segments",
                                                          "gathered_docs", "rank_compute_s")},
                         kv_exchange="all_to_all", kv_route_node=2)
    assert plan.kv_exchange == "all_to_all" and plan.kv_recv_tokens.min() > 0
    for scenario in SCENARIOS:
        group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=FAULT_TIMEOUT_S))
        res: dict = {"scenario": scenario}
        t0 = time.monotonic()
        try:
            if rank == 1 and scenario == "die_before_exchange":
                os._exit(17)
            if rank == 1 and scenario == "raise_before_exchange":
                raise RuntimeError("injected fault")
            out = model(**shard_batch(batch, plan, rank, group))
            if rank == 1 and scenario == "raise_mid_backward":
                raise RuntimeError("injected fault")
            out.loss.backward()
            res["completed"] = True
        except RuntimeError as e:
            res.update(error=str(e), cause=str(e.__cause__) if e.__cause__ else None)
        res["elapsed_s"] = time.monotonic() - t0
        if rank == 1:
            time.sleep(FAULT_TIMEOUT_S + 1.5)  # outlive the survivor's timeout
        with open(os.path.join(out_dir, f"{scenario}.{rank}.json"), "w") as f:
            json.dump(res, f)
    os._exit(0)


@pytest.mark.parametrize("world", [2, 4])  # 4: the node-routed exchange
def test_all_to_all_fails_clearly_within_the_timeout_when_a_peer_fails(world):
    import torch.multiprocessing as mp

    out_dir = tempfile.mkdtemp(prefix="atac_a2a_faults_")
    fd, init_file = tempfile.mkstemp(prefix="atac_gloo_")
    os.close(fd)
    os.unlink(init_file)
    ctx = mp.spawn(_fault_entry, args=(world, init_file, out_dir), nprocs=world, join=False)
    hung = _dist.join_or_kill(ctx, 120)
    assert not hung, f"workers {hung} still running after 120 s: a CP rank hung"
    for scenario in SCENARIOS:
        with open(os.path.join(out_dir, f"{scenario}.0.json")) as f:
            res = json.load(f)
        assert "completed" not in res, f"{scenario}: the survivor completed a step its peer never joined"
        what = "backward K/V all-to-all" if scenario == "raise_mid_backward" else "forward K/V all-to-all"
        assert f"atac_cp: the {what} over the CP group failed on rank 0 of {world}" in res["error"], res["error"]
        assert "another CP rank crashed, raised or is stuck" in res["error"]
        if scenario == "die_before_exchange":  # the connection closes: no need to wait for the timeout
            assert res["elapsed_s"] < FAULT_TIMEOUT_S + 5, res
        else:
            assert "timed out" in res["cause"].lower(), res["cause"]
            assert 0.8 * FAULT_TIMEOUT_S <= res["elapsed_s"] <= FAULT_TIMEOUT_S + 5, res

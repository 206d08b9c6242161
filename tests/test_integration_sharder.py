"""A loop without DDP: BatchSharder + sync_cp_gradients on 2 gloo processes equals one device,
loss (fp32: Transformers' loss upcasts to fp32) and every gradient (fp64), for ATP and a baseline strategy; debug digests agree."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

pytestmark = pytest.mark.slow


def _worker(rank: int, world: int) -> None:
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.sharder import BatchSharder, count_targets, prepare_model, sync_cp_gradients

    batch = _dist.make_batch([[80, 3, 20, 1, 30], [60, 40, 34]], seed=3)
    ref = _dist.tiny_model("llama", torch.float64)
    ref_out = _dist.reference_run(ref, batch)
    for strategy in ("atp", "zigzag"):
        model = _dist.tiny_model("llama", torch.float64)
        prepare_model(model)
        sharder = BatchSharder(ATACConfig(cp_size=world, sharding_strategy=strategy, debug=True, min_chunk=4),
                               cp_rank=rank, kv_bytes_per_token=1.0)
        local = sharder(batch, num_items_in_batch=count_targets(batch))
        loss = model(**local).loss  # this rank's share: local target sum / global count
        loss.backward()
        sync_cp_gradients(model)
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        # Transformers computes the loss from logits.float(): fp32 precision even for an fp64 model
        assert abs(total.item() / ref_out["loss"].item() - 1) < 1e-6, (strategy, total.item(), ref_out["loss"].item())
        for name, p in model.named_parameters():
            err = _dist.rel_err(p.grad, ref_out["grads"][name])
            assert err < 1e-10, (strategy, name, err)
        stats = sharder.last_stats
        plan = local["atac_shard"].plan  # the stats describe the plan the batch was sharded with
        compute = np.asarray(plan.rank_compute_s, dtype=float)
        assert plan.strategy == strategy and len(compute) == world and compute.min() > 0
        assert stats.num_docs == 8 and stats.imbalance == pytest.approx(compute.max() / compute.mean(), rel=1e-12)
        if strategy == "zigzag":
            assert stats.kv_mb > 0 and stats.num_sharded > 0


def test_batch_sharder_and_sync_cp_gradients_match_one_device():
    _dist.spawn(_worker, 2)

"""Worker for ``tests/test_redteam14.py``: ``ATACAccelerator`` custom loops at CP 2 (under ``torchrun
--nproc_per_node 2``; OUT.json from rank 0): a prepared scheduler's learning rates, an evaluation's
``reduce_loss`` with gradient accumulation, and the refusals of a registered sampler and of
Accelerate's dispatching loader options."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model  # noqa: E402

torch.set_num_threads(1)


def main(out_path: str) -> None:
    from accelerate import DataLoaderConfiguration

    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.accelerate import ATACAccelerator

    res: dict = {}
    cfg = ATACConfig(cp_size=2, max_tokens=384, min_chunk=8)
    acc = ATACAccelerator(cfg, gradient_accumulation_steps=2)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 8))
    m, opt, sched = acc.prepare(m, opt, sched)
    loader, sampler = acc.packed_dataloader(dataset(40, seed=1))
    lrs = []
    for _ in range(4):  # one optimizer step each (no accumulate(): sync_gradients stays True)
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    res["lrs"] = lrs
    # an evaluation's loss: the same batch under no_grad with GA 2 and with GA 1
    batch = next(iter(loader))
    m.eval()
    with torch.no_grad():
        res["eval_ga2"] = float(acc.reduce_loss(m(**acc.shard(batch)).loss))
        res["eval_ga2_count"] = float(acc.reduce_loss(m(**acc.shard(batch, num_items_in_batch=acc.count_items(batch))).loss))
    inputs = acc.shard(batch)  # sharded with grad on, the forward under no_grad: still the batch's own mean
    with torch.no_grad():
        res["eval_ga2_late"] = float(acc.reduce_loss(m(**inputs).loss))
    acc.gradient_accumulation_steps = 1
    with torch.no_grad():
        res["eval_ga1"] = float(acc.reduce_loss(m(**acc.shard(batch)).loss))
    try:
        acc.register_for_checkpointing(sampler)
        res["register"] = None
    except ValueError as e:
        res["register"] = str(e)
    res["registered_objects"] = len(acc._custom_objects)
    acc2 = ATACAccelerator(cfg, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    acc2.prepare(model())
    try:
        acc2.packed_dataloader(dataset(10, seed=1))
        res["dispatch"] = None
    except ValueError as e:
        res["dispatch"] = str(e)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    acc.end_training()


if __name__ == "__main__":
    main(sys.argv[1])

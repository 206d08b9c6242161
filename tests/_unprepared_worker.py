"""Worker for ``tests/test_unprepared_module.py``: an ``ATACAccelerator`` loop at CP 2 (under ``torchrun
--nproc_per_node 2``; OUT.json from rank 0) that trains the module ``prepare`` did not return (refused
before any change), then the same loop on the prepared model, with gradient accumulation, an evaluation
of the unprepared module under ``no_grad`` and a next batch sharded ahead of the backward."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model  # noqa: E402

torch.set_num_threads(1)


def _weights(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()


def _spread(acc, w: torch.Tensor) -> float:
    """Largest difference of ``w`` between the ranks."""
    ws = acc.gather(w.reshape(1, -1))
    return float((ws - ws[0]).abs().max())


def _self_shift(config) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    class SelfShiftLlama(LlamaForCausalLM):  # its own loss: labels shifted on whatever rows it gets (a shard's)
        def forward(self, input_ids=None, labels=None, num_items_in_batch=None, shift_labels=None, **kw):
            out = super().forward(input_ids=input_ids, **kw)
            lg = out.logits[:, :-1].float()
            out.loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels[:, 1:].reshape(-1),
                                                         ignore_index=-100, reduction="sum") / num_items_in_batch
            return out

    return SelfShiftLlama(config)


def main(out_path: str) -> None:
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.accelerate import ATACAccelerator

    res: dict = {}
    acc = ATACAccelerator(ATACConfig(cp_size=2, max_tokens=384, min_chunk=8), gradient_accumulation_steps=2)
    base = model()
    opt = torch.optim.SGD(base.parameters(), lr=0.1)
    shifting = _self_shift(base.config)
    try:  # a loss that shifts labels itself (wrong on a shard): refused before anything is prepared
        acc.prepare(shifting, torch.optim.SGD(shifting.parameters(), lr=0.1))
        res["self_shift"] = None
    except ValueError as e:
        res["self_shift"] = str(e)
    res["self_shift_attn"] = shifting.config._attn_implementation
    res["models_after_refusal"] = len(acc._models)
    prepared, opt = acc.prepare(base, opt)
    res["wrapper"] = type(prepared).__name__
    loader, _ = acc.packed_dataloader(dataset(120, seed=1), shuffle=False)
    batches = iter(loader)
    before = _weights(base)
    batch = next(batches)
    loss = base(**acc.shard(batch)).loss  # the mistake: the module prepare did not return
    try:
        acc.backward(loss)
        res["refused"] = None
    except ValueError as e:
        res["refused"] = str(e)
    refused = torch.tensor(float(res["refused"] is not None))
    dist.all_reduce(refused)
    res["ranks_refused"] = int(refused.item())
    res["grads_after_refusal"] = sum(p.grad is not None for p in base.parameters())
    res["changed_after_refusal"] = float((_weights(base) - before).abs().max())
    base.eval()
    with torch.no_grad():  # an evaluation of the unprepared module: no backward, nothing refused
        res["eval_loss"] = float(acc.reduce_loss(base(**acc.shard(batch)).loss))
    base.train()
    losses = []
    for _ in range(2):  # two optimizer steps of two micro-batches (accumulate: no_sync on the first)
        for _ in range(2):
            with acc.accumulate(prepared):
                loss = prepared(**acc.shard(next(batches))).loss
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            losses.append(float(acc.reduce_loss(loss)))
    inputs = acc.shard(next(batches))  # a next batch sharded before the backward: still allowed
    loss = prepared(**inputs).loss
    ahead = acc.shard(next(batches))
    with acc.accumulate(prepared):
        acc.backward(loss)
    with acc.accumulate(prepared):
        acc.backward(prepared(**ahead).loss)
        opt.step()
        opt.zero_grad()
    res["losses"] = losses
    after = _weights(base)
    res["trained_change"] = float((after - before).abs().max())
    res["trained_spread"] = _spread(acc, after)
    res["before_spread"] = _spread(acc, before)
    dist.barrier()
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    acc.end_training()


if __name__ == "__main__":
    main(sys.argv[1])

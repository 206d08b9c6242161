"""Worker for ``tests/test_redteam23.py``: ``ATACAccelerator`` loops with more than one module, at CP = world
(under ``torchrun --nproc_per_node 1`` or ``2``; OUT.json from rank 0), in float64 with SGD:

- a teacher left on ``sdpa`` run on the shard (refused at CP 2), then distillation from a teacher given
  ``atac_cp`` by ``prepare_model`` (compared with CP 1 by the test);
- a value head passed to ``prepare`` beside the model (compared with CP 1);
- the prepared model's own module trained after ``unwrap_model`` dropped its wrapper (refused at CP 2).
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model  # noqa: E402

torch.set_num_threads(1)


def _refused_everywhere(acc, error: str | None) -> int:
    n = torch.tensor(float(error is not None), dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(n)
    return int(n.item())


def _grad_norm(*modules) -> float:
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for m in modules for p in m.parameters()
                                if p.grad is not None)))


def main(out_path: str) -> None:
    from atac_hf.integrations import ATACConfig, prepare_model
    from atac_hf.integrations.accelerate import ATACAccelerator

    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = ATACConfig(cp_size=world, max_tokens=384, min_chunk=8, sharding_strategy="zigzag")
    acc = ATACAccelerator(config)
    res: dict = {}
    student = model().double()
    teacher = model().double()  # sdpa, not prepared
    torch.manual_seed(5)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    teacher.config._attn_implementation_internal = None
    teacher.set_attn_implementation("sdpa")
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    student, opt = acc.prepare(student, opt)
    loader, _ = acc.packed_dataloader(dataset(60, seed=3), shuffle=False)
    batches = list(loader)[:3]

    inputs = acc.shard(batches[0])
    try:
        with torch.no_grad():
            teacher(**inputs)
        res["teacher_sdpa"] = None
    except ValueError as e:
        res["teacher_sdpa"] = str(e)
    res["teacher_sdpa_ranks"] = _refused_everywhere(acc, res["teacher_sdpa"])

    prepare_model(teacher, config)  # the route the refusal names
    res["kd_grad_norms"], res["kd_losses"] = [], []
    for batch in batches:
        inputs = acc.shard(batch)
        out = student(**inputs)
        with torch.no_grad():
            t_logits = teacher(**inputs).logits
        mask = inputs["shift_labels"] != -100
        kl = torch.nn.functional.kl_div(out.logits.log_softmax(-1), t_logits.log_softmax(-1), log_target=True,
                                        reduction="none").sum(-1)
        loss = out.loss + (kl * mask).sum() / inputs["num_items_in_batch"]
        acc.backward(loss)
        res["kd_grad_norms"].append(_grad_norm(student))
        res["kd_losses"].append(float(acc.reduce_loss(loss)))
        opt.step()
        opt.zero_grad()
    res["kd_param_sum"] = float(sum(p.detach().sum() for p in student.parameters()))

    lm = model().double()
    head = torch.nn.Linear(lm.config.hidden_size, 1).double()
    opt2 = torch.optim.SGD(list(lm.parameters()) + list(head.parameters()), lr=0.1)
    lm, head, opt2 = acc.prepare(lm, head, opt2)
    res["head_grad_norms"] = []
    for batch in batches:
        inputs = acc.shard(batch)
        out = lm(**inputs, output_hidden_states=True)
        mask = inputs["shift_labels"] != -100
        value = head(out.hidden_states[-1]).squeeze(-1)
        loss = out.loss + ((value ** 2) * mask).sum() / inputs["num_items_in_batch"]
        acc.backward(loss)
        res["head_grad_norms"].append(_grad_norm(lm, head))
        opt2.step()
        opt2.zero_grad()

    inner = acc.unwrap_model(lm)
    del lm
    gc.collect()  # Accelerate keeps the module, not its wrapper: the wrapper is freed here
    before = float(sum(p.detach().sum() for p in inner.parameters()))
    try:
        acc.backward(inner(**acc.shard(batches[0])).loss)
        res["unwrapped"] = None
    except ValueError as e:
        res["unwrapped"] = str(e)
    res["unwrapped_ranks"] = _refused_everywhere(acc, res["unwrapped"])
    res["unwrapped_grads"] = sum(p.grad is not None for p in inner.parameters())
    res["unwrapped_changed"] = float(sum(p.detach().sum() for p in inner.parameters())) - before
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    acc.end_training()


if __name__ == "__main__":
    main(sys.argv[1])

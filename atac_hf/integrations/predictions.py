"""Full-row predictions under context parallelism: ``ATACTrainer.predict()`` and ``compute_metrics``.

Each CP rank runs the model on its shard of the pack (chunks of several documents, in the plan's
order), so its logits are its own tokens'. Where Trainer asks for predictions (``predict()``, or
``evaluate()`` with a ``compute_metrics``), every per-token output is gathered back into the pack's
row order on every CP rank, the labels are the pack's own (as Trainer took them before sharding),
and the loss is the pack's (the mean of the ranks' shares). Every CP (and TP) rank of a replica then
returns the same row, so the evaluation loop keeps one copy per replica (:func:`replica_gather`):
``compute_metrics`` and ``predict()`` get exactly what they get at ``cp_size=1``, one packed row per
pack. Loss-only evaluation (``prediction_loss_only``, no ``compute_metrics``) moves no logits.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from transformers import Trainer
from transformers.trainer_pt_utils import nested_detach

__all__ = ["full_row_predictions", "replica_gather", "wants_predictions"]

_LOOP_SIGNATURE = inspect.signature(Trainer.evaluation_loop)


def wants_predictions(trainer: Any, args: tuple, kwargs: dict) -> bool:
    """Whether Trainer's ``evaluation_loop(*args, **kwargs)`` asks ``prediction_step`` for logits (its own rule:
    ``prediction_loss_only`` as passed, else ``TrainingArguments.prediction_loss_only``)."""
    try:
        bound = _LOOP_SIGNATURE.bind(trainer, *args, **kwargs)
    except TypeError:  # a call Trainer's loop would refuse too: let it say so
        return False
    given = bound.arguments.get("prediction_loss_only")
    return not (trainer.args.prediction_loss_only if given is None else given)


def replica_gather(trainer: Any):
    """The evaluation loop's ``gather_function`` where every CP and TP rank of a replica returns the same pack's
    loss, logits and labels (:func:`full_row_predictions`): gathered over the world like ``accelerator.gather``,
    then only each replica's first CP and TP rank's rows kept. One collective here (which ranks those are)."""
    acc = trainer.accelerator
    first = int(trainer.cp_rank == 0 and getattr(trainer, "atac_tp_rank", 0) == 0)
    flags = acc.gather(torch.tensor([first], device=acc.device)).reshape(-1)
    keep = torch.nonzero(flags).reshape(-1)
    world = int(flags.numel())

    def select(x: Any) -> Any:
        if isinstance(x, Mapping):
            return type(x)({k: select(v) for k, v in x.items()})
        if isinstance(x, (tuple, list)):
            return type(x)(select(v) for v in x)
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] % world:
            return x
        rows = x.reshape(world, x.shape[0] // world, *x.shape[1:])
        return rows.index_select(0, keep.to(x.device)).reshape(-1, *x.shape[1:])

    return lambda x: select(acc.gather(x))


def full_row_predictions(trainer: Any, inputs: Mapping[str, Any], result: tuple) -> tuple:
    """``(loss, logits, labels)`` of one pack, as at ``cp_size=1``, from this CP rank's ``prediction_step`` result.

    The loss is the pack's (the CP ranks' shares averaged over the group); every tensor of ``logits`` shaped
    ``(1, this rank's tokens, ...)`` is gathered into ``(B, S, ...)`` row order; the labels are the pack's
    (``inputs``, before sharding). Other outputs cannot be put back in row order and are refused.
    """
    loss, logits, _ = result
    sharder = trainer.atac_sharder
    plan, rank, group = sharder.last_plan, sharder.cp_rank, sharder.cp_group
    cp = plan.cp_size
    counts = [int(n) for n in plan.rank_num_tokens()]
    ids = inputs.get(getattr(trainer.model, "main_input_name", "input_ids")) if isinstance(inputs, Mapping) else None
    B, S = (int(ids.shape[0]), int(ids.shape[1])) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else (1, -1)
    S = sum(counts) if S < 0 else S
    tensors = _tensors(logits)
    bad = next(((i, x) for i, x in enumerate(tensors) if x.dim() < 2 or x.shape[0] != 1 or x.shape[1] != counts[rank]),
               None)
    # every process of the evaluation refuses alike (an output can be per-token on one rank or replica by chance),
    # before any row is moved: none is left waiting in a collective the others skipped
    device = loss.device if isinstance(loss, torch.Tensor) else tensors[0].device if tensors else trainer.args.device
    flag = torch.tensor([0.0 if bad is None else 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(flag)
    if float(flag[0]) > 0:
        i, x = bad if bad is not None else (None, None)
        where = (f"prediction output {i} (the model's outputs other than the loss and ignore_keys, in order) has shape "
                 f"{tuple(x.shape)}" if bad is not None else "a prediction output of another rank is not per-token")
        raise ValueError(
            f"{where}: under context parallelism (cp_size={cp}) only per-token outputs of shape (1, this rank's "
            "tokens, ...) can be gathered back into the pack's rows for predict() and compute_metrics; leave it out "
            "with ignore_keys=[...] (evaluate/predict, or the model config's keys_to_ignore_at_inference), or set "
            "TrainingArguments(prediction_loss_only=True)")
    if isinstance(loss, torch.Tensor):  # the pack's loss: the mean of the CP ranks' shares
        total = loss.detach().reshape(1).to(torch.float64)
        dist.all_reduce(total, group=group)
        loss = (total[0] / cp).to(loss.dtype).reshape(loss.shape)

    def gather(x: Any) -> Any:
        if isinstance(x, Mapping):
            return type(x)({k: gather(v) for k, v in x.items()})
        if isinstance(x, (tuple, list)):
            return type(x)(gather(v) for v in x)
        if not isinstance(x, torch.Tensor):
            return x
        return _row_order(x, plan, rank, group, counts)[: B * S].reshape(B, S, *x.shape[2:])

    logits = gather(logits)
    labels = None
    if trainer.label_names and isinstance(inputs, Mapping) and all(inputs.get(k) is not None
                                                                    for k in trainer.label_names):
        labels = nested_detach(tuple(trainer._prepare_input(inputs[k]) for k in trainer.label_names))
        labels = labels[0] if len(labels) == 1 else labels
    return loss, logits, labels


def _tensors(x: Any) -> list:
    """The tensors of a nest of tuples, lists and mappings, in order."""
    if isinstance(x, Mapping):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def _row_order(local: torch.Tensor, plan: Any, rank: int, group: Any, counts: list[int]) -> torch.Tensor:
    """Every CP rank's ``(1, n_r, ...)`` tensor in the pack's row order, ``(N, ...)``, on every rank: one broadcast
    per rank into the result (peak memory: the row and one rank's share, not the padded all-gather of
    :func:`~atac_hf.attention.unshard`)."""
    x = local.detach()[0].contiguous()
    out = torch.empty((plan.num_tokens, *x.shape[1:]), dtype=x.dtype, device=x.device)
    for r, n in enumerate(counts):
        buf = x if r == rank else torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=x.device)
        src = r if group is None else dist.get_global_rank(group, r)
        dist.broadcast(buf, src=src, group=group)
        out[torch.as_tensor(plan.rank_token_indices(r), device=x.device)] = buf
    return out

"""Full-row predictions under context parallelism: ``ATACTrainer.predict()`` and ``compute_metrics``.

Each CP rank runs the model on its shard of the pack (chunks of several documents, in the plan's
order), so its logits are its own tokens'. Where Trainer asks for predictions (``predict()``, or
``evaluate()`` with a ``compute_metrics``), every per-token output is gathered back into the pack's
row order on every CP rank, the labels are the pack's own (as Trainer took them before sharding),
and the loss is the pack's (the mean of the ranks' shares). Every CP (and TP) rank of a replica then
returns the same row, so the evaluation loop gathers over the DP group only (:func:`replica_gather`):
``compute_metrics`` and ``predict()`` get exactly what they get at ``cp_size=1``, one packed row per
pack, and :func:`predictions_by_sample` splits such rows back into samples. Loss-only evaluation
(``prediction_loss_only``, no ``compute_metrics``) moves no logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from transformers.trainer_pt_utils import nested_detach

__all__ = ["full_row_predictions", "predictions_by_sample", "replica_gather"]


def replica_gather(trainer: Any):
    """The evaluation loop's ``gather_function`` under CP or TP, where every CP and TP rank of a replica returns the
    same pack's loss, logits and labels (:func:`full_row_predictions`): each tensor all-gathered over this rank's DP
    group (the ranks of its CP and TP coordinates, one per replica, in replica order), so every rank gets each
    replica's rows once, as ``accelerator.gather`` gives them at ``cp_size=1`` (never ``world`` copies of a row)."""
    group = _dp_group(trainer.accelerator.torch_device_mesh)

    def gather(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(1) if x.dim() == 0 else x.contiguous()  # (a scalar as one row, as accelerate gathers it)
        if group is None:
            return x
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts)

    return lambda x: _map_tensors(gather, x)


def _dp_group(mesh: Any) -> Any:
    """The DP process group of this rank (``mesh["dp"]``), or None with one replica (no "dp" axis)."""
    try:
        sub = mesh["dp"] if mesh is not None else None
    except (KeyError, RuntimeError, ValueError):
        return None
    return None if sub is None or sub.size() == 1 else sub.get_group()


def full_row_predictions(trainer: Any, inputs: Mapping[str, Any], result: tuple, rows: bool = True) -> tuple:
    """``(loss, logits, labels)`` of one pack, as at ``cp_size=1``, from this CP rank's ``prediction_step`` result.

    The loss is the pack's (the CP ranks' shares averaged over the group). With ``rows`` (Trainer asked for
    predictions), every tensor of ``logits`` shaped ``(1, this rank's tokens, ...)`` is gathered into ``(B, S, ...)``
    row order and the labels are the pack's (``inputs``, before sharding); other outputs cannot be put back in row
    order and are refused, on every process alike. Without, ``logits`` and ``labels`` are returned as given.
    """
    loss, logits, labels = result
    sharder = trainer.atac_sharder
    plan, rank, group = sharder.last_plan, sharder.cp_rank, sharder.cp_group
    cp = plan.cp_size
    if isinstance(loss, torch.Tensor):  # the pack's loss: the mean of the CP ranks' shares
        total = loss.detach().reshape(1).to(torch.float64)
        dist.all_reduce(total, group=group)
        loss = (total[0] / cp).to(loss.dtype).reshape(loss.shape)
    if not rows:
        return loss, logits, labels
    counts = [int(n) for n in plan.rank_num_tokens()]
    ids = inputs.get(getattr(trainer.model, "main_input_name", "input_ids")) if isinstance(inputs, Mapping) else None
    B, S = (int(ids.shape[0]), int(ids.shape[1])) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else (1, -1)
    S = sum(counts) if S < 0 else S
    tensors = _tensors(logits)
    bad = next(((i, x) for i, x in enumerate(tensors) if x.dim() < 2 or x.shape[0] != 1 or x.shape[1] != counts[rank]),
               None)
    # every process of the evaluation refuses alike (an output can be per-token on one rank or replica by chance),
    # before any row is moved: none is left waiting in a collective the others skipped. (The highest refusing rank.)
    device = loss.device if isinstance(loss, torch.Tensor) else tensors[0].device if tensors else trainer.args.device
    flag = torch.tensor([0.0 if bad is None else dist.get_rank() + 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if float(flag[0]) > 0:
        where = (f"prediction output {bad[0]} (the model's outputs other than the loss and ignore_keys, in order) has "
                 f"shape {tuple(bad[1].shape)}" if bad is not None else
                 f"a prediction output of rank {int(flag[0]) - 1} is not per-token (its error names it)")
        raise ValueError(
            f"{where}: under context parallelism (cp_size={cp}) only per-token outputs of shape (1, this rank's "
            "tokens, ...) can be gathered back into the pack's rows for predict() and compute_metrics; leave it out "
            "with ignore_keys=[...] (evaluate/predict, or the model config's keys_to_ignore_at_inference), or set "
            "TrainingArguments(prediction_loss_only=True)")

    where = [plan.rank_token_indices(r) for r in range(cp)]  # (once per pack, for every output)
    logits = _map_tensors(lambda x: _row_order(x, where, rank, group)[: B * S].reshape(B, S, *x.shape[2:]), logits)
    labels = None
    if trainer.label_names and isinstance(inputs, Mapping) and all(inputs.get(k) is not None
                                                                    for k in trainer.label_names):
        labels = nested_detach(tuple(trainer._prepare_input(inputs[k]) for k in trainer.label_names))
        labels = labels[0] if len(labels) == 1 else labels
    return loss, logits, labels


def _map_tensors(fn: Any, x: Any) -> Any:
    """``x`` with ``fn`` applied to every tensor of its nest of mappings, tuples and lists (other values kept)."""
    if isinstance(x, Mapping):
        return type(x)({k: _map_tensors(fn, v) for k, v in x.items()})
    if isinstance(x, (tuple, list)):
        return type(x)(_map_tensors(fn, v) for v in x)
    return fn(x) if isinstance(x, torch.Tensor) else x


def _tensors(x: Any) -> list:
    """The tensors of a nest of tuples, lists and mappings, in order."""
    if isinstance(x, Mapping):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def _row_order(local: torch.Tensor, where: list[np.ndarray], rank: int, group: Any) -> torch.Tensor:
    """Every CP rank's ``(1, n_r, ...)`` tensor in the pack's row order, ``(N, ...)``, on every rank (``where[r]``:
    rank r's token positions in the row): one broadcast per rank into the result (peak memory: the row and one
    rank's share, not the padded all-gather of :func:`~atac_hf.attention.unshard`)."""
    x = local.detach()[0].contiguous()
    out = torch.empty((sum(len(w) for w in where), *x.shape[1:]), dtype=x.dtype, device=x.device)
    for r, idx in enumerate(where):
        buf = x if r == rank else torch.empty((len(idx), *x.shape[1:]), dtype=x.dtype, device=x.device)
        src = r if group is None else dist.get_global_rank(group, r)
        dist.broadcast(buf, src=src, group=group)
        out[torch.as_tensor(idx, device=x.device)] = buf
    return out


def predictions_by_sample(trainer: Any, values: Any, dataset: Any = None) -> list[np.ndarray]:
    """``predict()``'s (or an evaluation's) packed rows split into one array per sample, in the dataset's order.

    ``ATACTrainer`` evaluates packed rows: ``PredictionOutput.predictions`` and ``label_ids`` (and what
    ``compute_metrics`` gets) hold one row per pack, a pack's samples concatenated and rows padded with -100 to
    the longest. This puts each sample's tokens back together, from the packs the trainer's loader planned::

        out = trainer.predict(test_set)
        logits = predictions_by_sample(trainer, out.predictions, test_set)  # logits[i]: (len(test_set[i]), vocab)

    Args:
        trainer: the :class:`~atac_hf.integrations.ATACTrainer` that ran ``predict()`` / ``evaluate()``.
        values: an array of rows ``(packs, tokens, ...)`` from it (``predictions``, ``label_ids``, what
            ``preprocess_logits_for_metrics`` returned, ``include_for_metrics`` inputs; numpy or torch; one output
            of a tuple of several), or the list of per-batch arrays ``eval_do_concat_batches=False`` gives.
        dataset: the dataset given to ``predict()`` or evaluated by ``evaluate()`` (the same object); default: the
            one of the trainer's last ``predict()`` or ``evaluate()`` (inside ``compute_metrics``: the one running).

    Returns:
        one numpy array per sample: its tokens' values ``(n_i, ...)``, in order; a sample split over packs (longer
        than ``max_tokens``) joined from its fragments (each computed without the others' context); a truncated
        sample's kept tokens; an empty sample ``(0, ...)``.

    Raises:
        ValueError: no ``predict()`` / ``evaluate()`` of ``dataset`` by this trainer, a streaming dataset (its packs
            are not planned up front), or ``values`` whose rows are not that loader's packs (counts, lengths).
        TypeError: ``values`` is not an array or a list of arrays.
    """
    held = trainer.__dict__.get("_atac_eval_loaders", {})  # kind -> (dataset, loader, sampler), the last used last
    if dataset is None:
        entry = list(held.values())[-1] if held else None
        what = "the last predict() or evaluate()"
    else:
        entry = next((e for e in held.values() if e[0] is dataset), None)
        what = f"this {type(dataset).__name__}"
    if entry is None:
        have = ", ".join(f"{kind} ({type(e[0]).__name__})" for kind, e in held.items()) or "none"
        raise ValueError(f"predictions_by_sample: this trainer has no predict() or evaluate() loader of {what} (it "
                         f"holds: {have}); call trainer.predict(dataset) (or evaluate) first and pass the same "
                         "dataset object")
    if entry[2] is None:
        raise ValueError("predictions_by_sample: a streaming dataset is packed window by window, so its packs are not "
                         "kept; predict on a map-style dataset (datasets.Dataset, a list of samples)")
    spans, offsets = entry[2]._epoch_plan()
    rows = _rows(values)
    packs = len(offsets) - 1
    if len(rows) != packs:
        raise ValueError(f"predictions_by_sample: values have {len(rows)} rows but the loader of {what} had {packs} "
                         "packs: pass an array from this trainer's predict()/evaluate() of that dataset, one row per pack")
    n = int(entry[2].lengths.size)
    pieces: list[list] = [[] for _ in range(n)]
    tokens = np.add.reduceat(spans[:, 2] - spans[:, 1], offsets[:-1]) if packs else []  # each pack's
    for b, row in enumerate(rows):
        if row.ndim < 1 or row.shape[0] < tokens[b]:
            raise ValueError(f"predictions_by_sample: row {b} has shape {tuple(row.shape)}, shorter than its pack's "
                             f"{int(tokens[b])} tokens: pass (packs, tokens, ...) rows from predict()/evaluate()")
        at = 0
        for sample, start, end in spans[offsets[b]:offsets[b + 1]].tolist():
            pieces[sample].append((start, row[at:at + end - start]))
            at += end - start
    tail = rows[0].shape[1:] if len(rows) else ()
    dtype = rows[0].dtype if len(rows) else np.float64
    return [np.concatenate([x for _, x in sorted(p, key=lambda t: t[0])]) if p else np.zeros((0, *tail), dtype)
            for p in pieces]


def _rows(values: Any) -> list[np.ndarray]:
    """The rows of an array (or of a list of per-batch arrays), as numpy arrays."""
    def as_np(x: Any) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            return x.detach().cpu().numpy()
        if isinstance(x, np.ndarray):
            return x
        raise TypeError(f"predictions_by_sample: values must be an array of rows (packs, tokens, ...) or a list of "
                        f"such arrays, got {type(x).__name__}")
    if isinstance(values, tuple):  # Trainer's predictions of several outputs (logits, hidden states, ...)
        raise TypeError(f"predictions_by_sample: values is a tuple of {len(values)} outputs; pass one of them, e.g. "
                        "out.predictions[0] (the logits)")
    if isinstance(values, list):  # eval_do_concat_batches=False: one array per batch
        return [r for v in values for r in as_np(v)]
    return list(as_np(values))

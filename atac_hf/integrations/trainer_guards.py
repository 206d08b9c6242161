"""Guards of ``ATACTrainer`` against Trainer features that would train wrong under context parallelism.

Each CP rank holds a shard of the pack (chunks of several documents), and the loss is exact only as
Trainer's ``compute_loss`` builds it: the model's loss is this rank's target sum over the pack's
``num_items_in_batch``, scaled by the world size, and DDP's gradient mean then sums the ranks'
shares. What would break that silently is refused, in words, before it changes anything:

* a ``compute_loss`` override that does not reach ``Trainer.compute_loss`` (``super()``): its loss
  is a wrong share (half the loss at ``cp_size=2`` for ``model(**inputs).loss``), and labels it
  shifts itself are a shard's, not a row's; refused at its first call, before any backward;
* a model whose loss ignores ``num_items_in_batch`` (a per-rank mean; ``cp_size`` times the loss
  and gradients): refused at construction (a 4-token check under ``no_grad``);
* ``metric_for_best_model`` naming a ``compute_metrics`` metric: evaluation under CP returns the
  loss only, so the metric would never be reported (Trainer fails at the first evaluation);
* ``label_names`` the packed batch does not hold.

And one repair: ``Trainer.evaluate()`` / ``predict()`` before ``train()`` prepares the model in
Accelerate's evaluation mode, which marks it prepared, so ``train()``'s prepare then returns it
without its DDP wrapper and no rank's gradients are summed (the CP ranks' weights drift apart;
plain DDP has the same flaw). ``train()`` clears that mark first (:func:`release_eval_preparation`).
"""

from __future__ import annotations

from typing import Any

from ._hf_compat import loss_num_items_refusal


class LossGuardMixin:
    """Records that Trainer's loss was reached (see :func:`install_loss_override_check`): through
    ``super().compute_loss``, or ``Trainer.compute_loss(self, ...)`` called directly (it reads
    ``compute_loss_func`` first)."""

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any):
        self._atac_loss_reached = True
        return super().compute_loss(model, inputs, *args, **kwargs)

    @property
    def compute_loss_func(self) -> Any:
        self._atac_loss_reached = True
        return self.__dict__.get("_atac_compute_loss_func")

    @compute_loss_func.setter
    def compute_loss_func(self, value: Any) -> None:
        self.__dict__["_atac_compute_loss_func"] = value


def install_loss_override_check(trainer: Any, shards: int) -> None:
    """Where ``type(trainer)`` overrides ``compute_loss`` and a pack is sharded over ``shards`` > 1 CP ranks,
    wrap the instance's ``compute_loss`` so that a call that returns without reaching Trainer's (as
    :class:`LossGuardMixin` records) raises, before Trainer runs the backward."""
    if shards <= 1 or type(trainer).compute_loss is LossGuardMixin.compute_loss:
        return
    user = trainer.compute_loss
    owner = next(c for c in type(trainer).__mro__ if "compute_loss" in vars(c))

    def checked(model: Any, inputs: Any, *args: Any, **kwargs: Any):
        trainer._atac_loss_reached = False
        out = user(model, inputs, *args, **kwargs)
        if not trainer._atac_loss_reached:
            raise ValueError(
                f"{owner.__name__}.compute_loss returned a loss without calling super().compute_loss(...): with "
                f"{shards} ranks sharing each pack, every rank holds chunks of several documents, and only "
                "Trainer's compute_loss scales the model's loss share to give the exact loss and gradients (the "
                f"model's own loss is 1/{shards} of it here; labels shifted in the override would be a shard's). "
                "Call super().compute_loss(model, inputs, return_outputs=..., num_items_in_batch=...) and add "
                "terms to its result, or train with cp_size=1")
        return out

    trainer.compute_loss = checked


def loss_scale_refusal(model: Any, stale: bool, cp_size: int) -> str | None:
    """Why the model's loss cannot be sharded, or None. ``stale`` (``accepts_loss_kwargs=False``): the
    loss must be shown to honour ``num_items_in_batch``; otherwise, under CP, a loss shown to ignore it
    is refused (a check that cannot run is not: the model may need inputs the check does not give)."""
    if stale:
        return loss_num_items_refusal(model)
    from ..attention.model_check import router_loss_refusal
    from .sharder import unwrap_base_model

    config = getattr(unwrap_base_model(model), "config", None)
    if cp_size <= 1 or config is not None and router_loss_refusal(config) is not None:
        return None  # an MoE router loss is refused, in its own words, where the model is prepared
    why = loss_num_items_refusal(model, rtol=1e-2)  # only a verdict refuses (not a failed or non-finite check)
    return why if why is not None and why.startswith("its loss ignores") else None


def check_best_metric(args: Any, cp_size: int) -> None:
    name = args.metric_for_best_model
    if cp_size > 1 and name and not str(name).endswith("loss"):
        raise ValueError(
            f"metric_for_best_model={name!r} with cp_size={cp_size}: under context parallelism each rank holds the "
            "logits of its own tokens only, so evaluation returns the loss and compute_metrics is not run; the "
            "metric would never be reported. Set metric_for_best_model='loss' (or 'eval_<name>_loss' for one of "
            "several eval datasets), or evaluate with cp_size=1")


def check_label_names(trainer: Any, inputs: Any) -> None:
    missing = [k for k in (trainer.label_names or []) if k != "labels" and inputs.get(k) is None]
    if missing:
        raise ValueError(
            f"label_names={list(trainer.label_names)!r}: the packed batch has no {missing[0]!r} (a packed row holds "
            "input_ids, labels, position_ids and the per-token columns it was given); set "
            "TrainingArguments(label_names=['labels']) or leave it unset")


def release_eval_preparation(trainer: Any) -> None:
    """Clear the "prepared" mark an evaluation left on the unwrapped model (see the module docstring),
    (or on its compiled copy, with ``torch_compile``), so that ``train()`` wraps it in DDP. Only where
    Accelerate would wrap it: several processes, no DeepSpeed, no FSDP but with ``torch_compile`` (their
    evaluation prepare wraps or shards the model itself), no tensor parallelism (no DDP wrapper; its
    gradients are averaged by ``training_step``)."""
    model = getattr(trainer, "model", None)
    wrapped = getattr(trainer, "model_wrapped", None)
    compiled = wrapped is not model and getattr(wrapped, "_orig_mod", None) is model  # torch_compile=True
    held = [m for m in (model, wrapped if compiled else None) if getattr(m, "_is_accelerate_prepared", False)]
    if (not held or not (wrapped is model or compiled) or trainer.args.world_size <= 1
            or trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled and not trainer.args.torch_compile
            or trainer.atac_tp_size > 1):
        return
    for m in held:
        del m._is_accelerate_prepared
    trainer.accelerator._models[:] = [m for m in trainer.accelerator._models if m is not model and m is not wrapped]
    trainer.model_wrapped = model  # train() prepares (compiles and wraps) it again

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
* ``label_names`` the packed batch does not hold.

And one repair: ``Trainer.evaluate()`` / ``predict()`` before ``train()`` prepares the model in
Accelerate's evaluation mode, which marks it prepared, so ``train()``'s prepare then returns it
without its DDP wrapper and no rank's gradients are summed (the CP ranks' weights drift apart;
plain DDP has the same flaw). ``train()`` clears that mark first (:func:`release_eval_preparation`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from ..attention.kind_rules import peft_configs
from ..attention.shard import IGNORE_INDEX as IGNORE
from ._hf_compat import loss_num_items_refusal


class LossGuardMixin:
    """Records that Trainer's loss was reached (see :func:`install_loss_override_check`): through
    ``super().compute_loss``, or ``Trainer.compute_loss(self, ...)`` called directly (it reads
    ``compute_loss_func`` first; a read from any other code, e.g. a copy of an older Trainer's
    ``compute_loss`` that does not scale the loss, counts for nothing)."""

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any):
        self._atac_loss_reached = True
        check_target_edits(getattr(self, "_atac_targets", None), inputs)
        pre = getattr(self, "_atac_presharded", None)
        if pre is not None and pre[0] is not None:  # (sharded_prediction_step: Trainer's count of the pack)
            args, kwargs = args[:1], {**kwargs, "num_items_in_batch": pre[0]}
        return super().compute_loss(model, inputs, *args, **kwargs)

    @property
    def compute_loss_func(self) -> Any:
        if sys._getframe(1).f_code is _TRAINER_LOSS_CODE:
            self._atac_loss_reached = True
        return self.__dict__.get("_atac_compute_loss_func")

    @compute_loss_func.setter
    def compute_loss_func(self, value: Any) -> None:
        self.__dict__["_atac_compute_loss_func"] = value


_TRAINER_LOSS_CODE = inspect.unwrap(Trainer.compute_loss).__code__
_UNSET = object()


def sharded_prediction_step(trainer: Any, owner: type, step: Any, model: Any, inputs: Any, *args: Any, **kwargs: Any):
    """``step`` (``super().prediction_step`` of ``owner``, ATACTrainer) with the pack sharded. Trainer's own counts
    the pack's targets and shards it (``_prepare_context_parallel_inputs``); another trainer's after ATACTrainer in
    the MRO (TRL's ``SFTTrainer``: ``compute_loss`` only) skipped both, so evaluation failed ("needs the per-batch
    shard context"), at cp_size 1 too (red-team 49). Then the count and sharding are done here, as Trainer does
    them, the count reaches ``compute_loss`` (:class:`LossGuardMixin`), and a later call of the hook passes; the step
    runs with ``current_gradient_accumulation_steps`` 1 (put back after), by which TRL divides its MoE router loss
    wherever a count is given."""
    mro = type(trainer).__mro__
    nxt = next((c for c in mro[mro.index(owner) + 1:] if "prediction_step" in vars(c)), Trainer)
    if nxt is Trainer or getattr(trainer, "_atac_presharded", None) is not None:
        return step(model, inputs, *args, **kwargs)
    inputs = trainer._prepare_inputs(inputs)
    count = trainer._get_num_items_in_batch([inputs], trainer.args.device)
    _, local = trainer._prepare_context_parallel_inputs(model, inputs)
    # TRL's loss divides its MoE router loss by current_gradient_accumulation_steps where a count is given (a training
    # rule; the training loop sets it): an evaluation batch is its own (red-team 51: AttributeError before train())
    held = trainer.__dict__.get("current_gradient_accumulation_steps", _UNSET)
    trainer._atac_presharded, trainer.current_gradient_accumulation_steps = (count,), 1
    try:
        return step(model, local, *args, **kwargs)
    finally:
        trainer._atac_presharded = None
        if held is _UNSET:
            trainer.__dict__.pop("current_gradient_accumulation_steps", None)
        else:
            trainer.current_gradient_accumulation_steps = held


def check_target_edits(sharded: Any, inputs: Any) -> None:
    """Refuse ``inputs["labels"]`` changed before ``super().compute_loss`` (e.g. masked in an override) while
    ``inputs["shift_labels"]`` is not: the loss trains ``shift_labels``, which the sharder built from the labels
    before ``compute_loss`` ran, so the change would be ignored. ``sharded``: clones of the shard's own."""
    def same(key: str) -> bool:
        x = inputs.get(key) if isinstance(inputs, Mapping) else None  # (BatchEncoding, UserDict too)
        return isinstance(x, torch.Tensor) and x.shape == sharded[key].shape and bool(torch.equal(x, sharded[key]))

    if not sharded or "labels" not in sharded or "shift_labels" not in sharded or "labels" not in inputs:
        return
    if not same("labels") and same("shift_labels"):
        raise ValueError(
            "inputs['labels'] was changed before super().compute_loss, but under ATACTrainer the loss trains "
            "inputs['shift_labels'] (each position's next-token target, built from the labels when the pack was "
            "sharded, before compute_loss ran), so the change would be ignored: apply it to inputs['shift_labels'] "
            "too (e.g. inputs['shift_labels'][inputs['shift_labels'] < 128] = -100), or make it in the data")


def install_loss_override_check(trainer: Any, shards: int) -> None:
    """Where ``trainer``'s ``compute_loss`` is not Trainer's (a subclass's override, or a function set on the
    instance, checked again at every step) and a pack is sharded over ``shards`` > 1 CP ranks, wrap the
    instance's ``compute_loss`` so that a call that returns without reaching Trainer's (as
    :class:`LossGuardMixin` records) raises, before Trainer runs the backward."""
    own = vars(trainer).get("compute_loss")
    if shards <= 1 or getattr(own, "_atac_checked", False) or (
            own is None and type(trainer).compute_loss is LossGuardMixin.compute_loss):
        return
    user = trainer.compute_loss
    owner = (f"{type(trainer).__name__} (set on the instance)" if own is not None else
             next(c for c in type(trainer).__mro__ if "compute_loss" in vars(c)).__name__)

    def checked(model: Any, inputs: Any, *args: Any, **kwargs: Any):
        trainer._atac_loss_reached = False
        out = user(model, inputs, *args, **kwargs)
        if not trainer._atac_loss_reached:
            raise ValueError(
                f"{owner}.compute_loss returned a loss without calling super().compute_loss(...): with "
                f"{shards} ranks sharing each pack, every rank holds chunks of several documents, and only "
                "Trainer's compute_loss scales the model's loss share to give the exact loss and gradients (the "
                f"model's own loss is 1/{shards} of it here; labels shifted in the override would be a shard's). "
                "Call super().compute_loss(model, inputs, return_outputs=..., num_items_in_batch=...) and add "
                "terms to its result, or train with cp_size=1")
        return out

    checked._atac_checked = True
    trainer.compute_loss = checked


def check_late_loss_settings(trainer: Any, shards: int) -> None:
    """Loss settings assigned to ``trainer`` (or its model) after construction, refused under CP as at
    construction, before the step runs: ``compute_loss_func`` and ``label_smoother`` (Trainer hands them the
    shard's labels, which they shift per shard), ``neftune_noise_alpha`` (its noise scale assumes whole rows), and
    a ``model.loss_function`` replaced since construction that does not train ``shift_labels``' targets
    (:func:`loss_shift_refusal`; not probed under tensor parallelism)."""
    if shards <= 1:
        return
    func = trainer.__dict__.get("_atac_compute_loss_func")
    if func is not None or trainer.label_smoother is not None:
        what = (f"compute_loss_func={getattr(func, '__name__', '<callable>')!r}" if func is not None else
                f"label_smoother={type(trainer.label_smoother).__name__}")
        raise ValueError(f"{what} was set on the trainer with cp_size={shards}: Trainer hands it the logits and labels "
                         "of each rank's shard (chunks of several documents, not a contiguous row), and it shifts the "
                         "labels per shard, which is wrong under ATP-CP; set it back to None (the model's own loss is "
                         "exact under CP) or train with cp_size=1")
    alpha = getattr(trainer, "neftune_noise_alpha", None)
    if alpha:  # (refused in TrainingArguments at construction; train() reads the trainer's attribute)
        raise ValueError(f"neftune_noise_alpha={alpha} was set on the trainer with cp_size={shards}: NEFTune scales "
                         "its embedding noise by the sequence length each rank sees (its shard), so the noise would be "
                         f"about sqrt({shards}) times one device's; set it back to None or train with cp_size=1")
    from .sharder import unwrap_base_model

    base = unwrap_base_model(trainer.model)
    fn = getattr(base, "loss_function", None)  # (transformers' property: the set function, else the mapping's)
    # (==, not `is`: a loss_function defined as a method of the model's class is a new bound method at every read)
    if fn != trainer.__dict__.get("_atac_loss_function", fn):
        if getattr(trainer, "atac_tp_size", 1) <= 1 and (why := loss_scale_refusal(base, False, shards)):
            raise ValueError(f"model.loss_function was replaced after ATACTrainer was built: {why}")
    trainer.__dict__["_atac_loss_function"] = fn


def check_step_model(trainer: Any, model: Any, training: bool) -> None:
    """Refuse a step whose model is not the one ``ATACTrainer`` was built with and Accelerate prepared.

    ``trainer.model`` assigned after construction (another model, or the same one wrapped by ``get_peft_model``)
    leaves Trainer in a state it does not check: a replaced model was never switched to ``atac_cp`` nor checked
    (shardable family, loss, position limit), and ``train()`` then runs the old model without its DDP wrapper
    (Trainer prepares ``trainer.model`` only while it is the model it wraps), so with several processes the
    ranks' gradients are never summed and each rank trains on its own shard's gradient."""
    from .sharder import unwrap_base_model

    built = trainer._atac_base
    for m in (model, trainer.model):
        base = unwrap_base_model(m)
        if base is not built:
            impl = getattr(getattr(base, "config", None), "_attn_implementation", None)
            raise ValueError(f"this step runs a {type(base).__name__} (attn_implementation={impl!r}) that is not the "
                             f"{type(built).__name__} ATACTrainer was built with (was trainer.model replaced after "
                             "construction?): its packed rows would not be document-masked or sharded exactly; build "
                             "a new ATACTrainer with model=<the new model> instead of assigning trainer.model")
    prepared = getattr(getattr(trainer, "accelerator", None), "_models", None)
    reused = getattr(model, "module", None) is trainer.model  # a second train() runs the DDP of the first (red-team 25)
    if (training and prepared is not None and trainer.args.world_size > 1 and trainer.atac_tp_size <= 1 and not reused
            and not any(model is m or getattr(model, "module", None) is m for m in prepared)):  # (DDP: its module)
        raise RuntimeError(f"train() runs a {type(model).__name__} that Accelerate did not prepare (was "
                           "trainer.model replaced or wrapped, e.g. by get_peft_model, after ATACTrainer was built?): "
                           f"no DDP wrapper sums the gradients of the {trainer.args.world_size} processes, so each "
                           "rank would train on its own shard's gradient; pass the final model (PEFT-wrapped or "
                           "not) to ATACTrainer(model=...) instead of assigning trainer.model")


TRAINER_BYPASS_FIX = ("in a compute_loss override, pass the model argument on (super().compute_loss(model, inputs, "
                      "...)), not self.model, and run other forwards of self.model under torch.no_grad() or beside "
                      "one through model")


def watch_step_forwards(trainer: Any, model: Any) -> None:
    """Under CP over several processes, refuse a backward whose loss came only from ``trainer.model`` called
    outside the DDP wrapper the step got (``super().compute_loss(self.model, inputs)`` in an override): no
    gradient sum would follow, and each rank would train on its own shard's gradient. The step's wrapper and
    its module are watched (:class:`~.forward_check.PreparedForwardCheck`) and Accelerate's ``backward`` on this
    trainer's accelerator checks first (installed once)."""
    from .forward_check import PreparedForwardCheck, is_wrapper

    if not is_wrapper(model) or trainer.atac_config.cp_size <= 1 or trainer.args.world_size <= 1:
        return
    check = getattr(trainer, "_atac_forward_check", None)
    if check is None:
        check = trainer._atac_forward_check = PreparedForwardCheck(fix=TRAINER_BYPASS_FIX)
        backward = trainer.accelerator.backward

        def checked_backward(loss: Any, **kwargs: Any) -> Any:
            check.before_backward()
            return backward(loss, **kwargs)

        trainer.accelerator.backward = checked_backward
    check.watch([model])
    trainable = _trainable_names(model)
    wrapped, first = getattr(trainer, "_atac_ddp_trainable", (None, None))
    if wrapped is not model:  # not recorded at the wrap (record_wrap_trainable): from this first step on
        trainer._atac_ddp_trainable = (model, trainable)
    elif trainable - first:
        raise ValueError(
            f"parameters {sorted(trainable - first)[:3]} were unfrozen ({len(trainable - first)} in all) after DDP "
            "wrapped the model (at the start of the first train(); a later train() runs the same wrapper, and "
            "on_train_begin and the first on_step_begin run after the wrap): DDP sums only the gradients of the "
            "parameters that required them then, so each rank would train these on its own shard's gradient; set "
            "requires_grad before the first train(), or build a new ATACTrainer for a stage that trains others")


def _trainable_names(module: Any) -> set[str]:
    """The names of ``module``'s parameters that require a gradient (those DDP sums, taken at its wrap)."""
    return {name for name, p in module.named_parameters() if p.requires_grad}


def record_wrap_trainable(trainer: Any) -> None:
    """Record, when Accelerate wraps the model in DDP (``accelerator.prepare_model`` in ``train()``), which of its
    parameters require a gradient: DDP sums only theirs. Callbacks (``on_train_begin``, the first
    ``on_step_begin``) run between the wrap and the first step, so a parameter they unfreeze was missed when the
    first step recorded the set (a mutation pass: the ranks' weights drifted apart). Installed once per trainer."""
    from .forward_check import is_wrapper

    acc = getattr(trainer, "accelerator", None)
    if acc is None or getattr(acc, "_atac_wrap_recorder", None) is trainer:
        return
    prepare_model = acc.prepare_model

    def recording_prepare_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        out = prepare_model(model, *args, **kwargs)
        if is_wrapper(out):
            trainer._atac_ddp_trainable = (out, _trainable_names(out))
        return out

    acc.prepare_model = recording_prepare_model
    acc._atac_wrap_recorder = trainer


def loss_scale_refusal(model: Any, stale: bool, cp_size: int, parameter_terms: bool = False) -> str | None:
    """Why the model's loss cannot be sharded, or None. ``stale`` (``accepts_loss_kwargs=False``): the
    loss must be shown to honour ``num_items_in_batch``; otherwise, under CP, a loss shown to ignore it
    is refused (a check that cannot run is not: the model may need inputs the check does not give).
    Under CP, a loss shown not to train the targets of ``shift_labels`` is refused too
    (:func:`loss_shift_refusal`). ``parameter_terms``: the loop keeps a loss term of
    :data:`PARAMETER_ONLY_LOSS_WEIGHTS` exact (``ATACAccelerator``: each rank adds it once and the ranks'
    gradient mean keeps it), so the checks run with it at 0; Trainer scales each rank's whole loss by the
    number of processes, that term too, so it is refused there, by name."""
    from ..attention.model_check import router_loss_refusal
    from .sharder import unwrap_base_model

    config = getattr(unwrap_base_model(model), "config", None)
    routed = cp_size > 1 and config is not None and router_loss_refusal(config) is not None
    if not stale and (cp_size <= 1 or routed):
        return None  # (an MoE router loss is refused, in its own words, where the model is prepared)
    with stock_attention(model), parameter_terms_off(model if parameter_terms else None):  # (atac_cp: a shard only)
        if stale:
            why = loss_num_items_refusal(model)
        else:  # only a verdict refuses (not a failed or non-finite check)
            why = loss_num_items_refusal(model, rtol=1e-2)
            why = why if why is not None and why.startswith("its loss ignores") else None
        if why is not None:
            extra = "".join(f"; its PEFT adapter {a!r} adds a loss term of its own ({k}={v}: set it to 0)"
                            for a, k, v in _peft_loss_weights(model))
            return (f"{why}; ATP-CP needs the loss as the target sum over num_items_in_batch (a per-rank mean is "
                    f"cp_size={cp_size} times the loss and gradients){extra}")
        return loss_shift_refusal(model) if cp_size > 1 and not routed else None


#: PEFT config fields of loss terms computed from the adapter's parameters alone (AdaLoRA's orthogonal
#: regulariser): every rank adds the same term and the ranks' gradient mean keeps it, so it is exact under
#: CP, but it is no target sum; the loss checks run with it at 0 (red-team 29: refused though exact).
PARAMETER_ONLY_LOSS_WEIGHTS = ("orth_reg_weight",)


def _peft_loss_weights(model: Any) -> list[tuple[str, str, Any]]:
    """``(adapter, field, value)`` of the non-zero loss-term weights (fields whose name holds ``loss_weight``,
    and :data:`PARAMETER_ONLY_LOSS_WEIGHTS`) of the model's PEFT configs."""
    return [(name, k, v) for name, cfg in peft_configs(model) for k, v in sorted(vars(cfg).items())
            if ("loss_weight" in k or k in PARAMETER_ONLY_LOSS_WEIGHTS) and isinstance(v, (int, float))
            and not isinstance(v, bool) and v != 0]


@contextlib.contextmanager
def parameter_terms_off(model: Any):
    """``model`` with the loss terms of :data:`PARAMETER_ONLY_LOSS_WEIGHTS` at 0 in its PEFT configs, put back
    after."""
    saved = [(cfg, k, getattr(cfg, k)) for _, cfg in peft_configs(model) for k in PARAMETER_ONLY_LOSS_WEIGHTS
             if isinstance(getattr(cfg, k, None), (int, float))]
    try:
        for cfg, k, _ in saved:
            setattr(cfg, k, 0.0)
        yield
    finally:
        for cfg, k, v in saved:
            setattr(cfg, k, v)


@contextlib.contextmanager
def stock_attention(model: Any):
    """``model`` with its attention switched from ``atac_cp`` (it runs only with a shard context) to sdpa, or
    eager where the model has no sdpa, for a check outside a shard, and back to ``atac_cp`` after it."""
    from ..attention import ATTN_IMPLEMENTATION
    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    if getattr(getattr(base, "config", None), "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        yield
        return
    for impl in ("sdpa", "eager"):
        try:
            base.set_attn_implementation(impl)
            break
        except (ValueError, ImportError, NotImplementedError):  # no such kernel for this model: the next
            continue
    else:
        yield  # (no stock attention to switch to: the checks find no verdict)
        return
    try:
        yield
    finally:
        base.set_attn_implementation(ATTN_IMPLEMENTATION)


def loss_shift_refusal(model: Any) -> str | None:
    """None where the model's loss trains the targets it is given as ``shift_labels`` (a 4-token row whose
    targets are not ``labels`` shifted: a loss that shifts ``labels`` itself gets them wrong), or where the
    check cannot run or gives no loss and logits; else why not. Under CP a rank's ``labels`` are its shard's
    tokens, not a row's: shifted on the shard they cross every chunk boundary (a red-team's model whose loss
    did that trained gradients 30-48% off at CP 2). A loss that is not their plain cross-entropy (label
    smoothing, a z-loss, token weights) passes where it changes with ``shift_labels`` and not with ``labels``
    (two more forwards; red-team 25: such losses were refused though exact). Runs under ``no_grad`` in eval
    mode (the mode is restored)."""
    training = model.training
    try:
        device = next(model.parameters()).device
        ids = torch.arange(1, 5, device=device).unsqueeze(0)
        targets = torch.tensor([[4, IGNORE, 1, IGNORE]], device=device)  # not ids[1:]: positions 0 and 2
        model.eval()

        def loss_of(labels: Any, shift_labels: Any) -> Any:
            with torch.no_grad():
                return model(input_ids=ids, labels=labels, shift_labels=shift_labels, num_items_in_batch=2,
                             use_cache=False)

        out = loss_of(ids, targets)
        loss, logits = getattr(out, "loss", None), getattr(out, "logits", None)
        if loss is None or logits is None or tuple(logits.shape[:2]) != (1, 4) or not bool(torch.isfinite(loss)):
            return None
        logp = torch.log_softmax(logits[0].double(), dim=-1)
        want, got = float(-(logp[0, 4] + logp[2, 1]) / 2), float(loss)
        if abs(got - want) <= 1e-2 * abs(want):
            return None
        other_targets = float(loss_of(ids, torch.tensor([[2, IGNORE, 3, IGNORE]], device=device)).loss)
        other_labels = float(loss_of(ids.flip(-1), targets).loss)
    except Exception:  # noqa: BLE001 - a model that cannot run the check is not shown to ignore shift_labels
        return None
    finally:
        model.train(training)
    reads_targets = abs(other_targets - got) > 1e-6 * max(1.0, abs(got))
    reads_labels = abs(other_labels - got) > 1e-7 * max(1.0, abs(got))
    if reads_targets and not reads_labels:
        return None
    found = "; it changes with labels" if reads_labels else "; it does not change with shift_labels"
    return (f"its loss does not train the targets given as shift_labels (a 4-token row with 2 targets: loss {got:.4g}, "
            f"their cross-entropy {want:.4g}{found}); it likely shifts labels itself, but under CP each rank's labels "
            "are its shard's tokens and only shift_labels hold the row's targets. Compute the loss with the model's "
            "loss_function(logits, labels, vocab_size, num_items_in_batch=..., shift_labels=...), or a loss of your "
            "own that reads its targets from shift_labels where given, or train with cp_size=1")


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


def check_training_args(args: Any, config: Any) -> None:
    """``TrainingArguments`` settings that would train wrong (or be ignored) under ATACTrainer: refused (or warned)."""
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched != args.world_size:
        raise ValueError(f"launched with WORLD_SIZE={launched} but TrainingArguments sees {args.world_size} "
                         "process(es): on a machine without CUDA pass TrainingArguments(use_cpu=True)")
    if args.label_smoothing_factor:
        raise ValueError(f"label_smoothing_factor={args.label_smoothing_factor}: Trainer's label smoother shifts "
                         "labels on each rank's shard, which is wrong under ATP-CP; set it to 0")
    if getattr(args, "neftune_noise_alpha", None) and config.cp_size > 1:
        raise ValueError(f"neftune_noise_alpha={args.neftune_noise_alpha} with cp_size={config.cp_size}: NEFTune scales "
                         "its embedding noise by 1/sqrt(sequence length x hidden size) and each rank sees only its "
                         f"shard of the pack, so the noise would be about sqrt({config.cp_size}) times one device's; "
                         "unset neftune_noise_alpha or train with cp_size=1")
    if args.world_size > 1 and not args.average_tokens_across_devices:
        raise ValueError("average_tokens_across_devices=False: each rank would normalise its loss by its own "
                         "token count; ATP-CP needs the global count (set it to True, the default)")
    # warn (rank 0) only about a batch size the user set: TrainingArguments' own default (8) is no choice
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    ignored = {k: getattr(args, k) for k in ("per_device_train_batch_size", "per_device_eval_batch_size")
               if getattr(args, k) not in (1, defaults.get(k))}
    if ignored and args.process_index == 0:
        warnings.warn(f"{', '.join(f'{k}={v}' for k, v in ignored.items())} is ignored by ATACTrainer: each "
                      "micro-batch is one WFAP pack of at most max_tokens tokens (raise max_tokens for bigger "
                      "micro-batches)", stacklevel=3)
    cut = getattr(args, "max_length", None)  # TRL's SFTConfig (default 1024): SFTTrainer cuts each sample to it
    if (type(cut) is int and cut < int(config.max_tokens) and args.process_index == 0
            and not (getattr(args, "dataset_kwargs", None) or {}).get("skip_prepare_dataset")):
        warnings.warn(f"max_length={cut} (SFTConfig) is below max_tokens={config.max_tokens}: SFTTrainer cuts each "
                      f"sample to {cut} tokens before ATACTrainer packs it, and drops the rest; set SFTConfig("
                      "max_length=None) to keep whole samples (one longer than max_tokens is split: ATACConfig "
                      "packing_options 'overlength')", stacklevel=3)
    strategy = sampling_strategy(args)
    if strategy not in ("random", "sequential") and args.process_index == 0:
        warnings.warn(f"train_sampling_strategy={strategy!r} is ignored by ATACTrainer: its WFAP sampler already "
                      "balances the packs by cost; the sample order is shuffled per epoch (ATACConfig.shuffle) or "
                      "kept (train_sampling_strategy='sequential' or ATACConfig(shuffle=False))", stacklevel=3)


def sampling_strategy(args: Any) -> str:
    """``args.train_sampling_strategy`` (transformers 5), or its 4.x spelling ``group_by_length=True``."""
    strategy = getattr(args, "train_sampling_strategy", None) or "random"
    if getattr(args, "group_by_length", False):
        strategy = "group_by_length"
    return str(strategy)

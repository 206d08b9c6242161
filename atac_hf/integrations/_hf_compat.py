"""Workarounds for Accelerate / Transformers behaviour the integration must change, in one place.

Each says why and when it can go. Checked against accelerate 1.15 and transformers 5.24.

1. :func:`validate_parallelism_on_cpu` - ``ParallelismConfig._validate_accelerator`` refuses any
   config when the distributed type is ``MULTI_CPU``, although mesh, DDP and DataLoader
   sharding work there with gloo. Can go when Accelerate accepts ``MULTI_CPU``.
2. :func:`bypass_torch_cp_hooks` - ``Accelerator.prepare`` with ``cp_size > 1`` calls
   ``_prepare_cp``, which attaches torch-CP hooks to the model that force ``is_causal=True``
   (packed documents would attend to each other) and refuse sliding windows. Per instance,
   idempotent, reversible (``del accelerator._prepare_cp``). Can go when Accelerate lets a CP
   backend other than ``"torch"`` opt out of its hooks.
3. Trainer's private hooks that :class:`~atac_hf.integrations.trainer.ATACTrainer` overrides
   (no public alternative): ``_prepare_context_parallel_inputs`` (called after token counting,
   in training and evaluation), ``_save_checkpoint`` / ``_get_output_dir`` (the checkpoint
   folder, for the sampler state), ``_track_num_input_tokens``. Re-check them when raising the
   transformers pin. ``gather_function`` is set to ``accelerator.gather``:
   ``gather_for_metrics`` drops "duplicate" entries at the end of a loader, but under CP the
   ranks' eval losses are shares of one batch, not duplicates.
4. Multi-process CPU launch: ``distributed_type: MULTI_CPU`` makes ``accelerate launch`` use the
   simple launcher (one process without mpirun); the CPU config says ``MULTI_GPU`` with
   ``use_cpu: true`` (torchrun), and the code passes ``cpu=True`` / ``use_cpu=True`` when CUDA is
   absent (the launcher does not export ``use_cpu`` for that launcher). Can go when
   ``accelerate launch`` starts several CPU processes without mpirun.
5. Tensor parallelism (:mod:`.tensor_parallel`). transformers 5.24 builds its own TP mesh over
   the whole world (``from_pretrained(tp_plan=..., device_mesh=...)`` ignores the given mesh and
   needs ``world == tp x fsdp``), so it cannot share a world with CP: the add-on applies the
   model's own plan with ``apply_tensor_parallelism`` on Accelerate's "tp" axis instead, and
   sets ``config.distributed_config`` so Accelerate's ``get_model_tp_size`` check passes (can go
   when ``from_pretrained`` honours a sub-mesh). Around that call: tied weights are re-pointed at
   one shard (``apply_tensor_parallelism`` indexes de-duplicated parameters and raises
   ``KeyError: 'lm_head.weight'``); ``replicated_with_grad_allreduce`` (Qwen3's q/k norms)
   all-reduces ``.grad`` after every micro-batch, counting earlier micro-batches again under
   gradient accumulation, so each backward's contribution is held apart and summed over TP once,
   in ``sync_tp_gradients`` (both can go when transformers fixes them). Accelerate wraps a TP model in no DDP, so the add-on averages
   its gradients over dp x cp (``ATACAccelerator.backward``, ``ATACTrainer.training_step``).
   Trainer's ``_save`` returns early on non-writer ranks unless
   ``is_distributed_loading_by_transformers``; ``ATACTrainer._save`` sets it for the call so
   every rank joins the gather of the shards.
6. :func:`release_groups_after_shutdown` - ``destroy_process_group`` (``end_training()``) does not
   stop a gloo backend's worker threads while something still references its group, and
   Accelerate's shared state keeps the device mesh (so the groups) until interpreter
   finalization, as do the trainer's and sharder's ``cp_group``. Tearing the threads down there
   can abort a process whose work is done (``terminate called without an active exception``,
   SIGABRT, seen on 2-core CI). Registered with ``atexit`` by :func:`track_group_holder`; once the
   process group is destroyed it sets the state's ``device_mesh`` and ``parallelism_config`` and
   the add-on's group attributes to None. Can go when Accelerate drops the mesh in
   ``destroy_process_group`` and gloo's shutdown joins its threads.
7. :func:`loss_num_items_refusal` - several composite models of transformers 5.25 (Gemma 4,
   Qwen2.5-VL, Qwen3-VL, GLM-4V, ...) declare ``accepts_loss_kwargs = False`` (once they filtered
   labels themselves, transformers #37208), so Trainer would not pass ``num_items_in_batch``,
   although their forward now hands ``**kwargs`` to ``self.loss_function``, which honours it.
   ``ATACTrainer`` checks the model's loss on a 4-token row (no grad, eval mode) before it changes
   anything and, when the loss is the target sum over ``num_items_in_batch``, lets Trainer pass it.
   Can go when transformers drops the stale attribute.
8. :func:`drain_gloo_workers` - a gloo worker thread frees a finished collective's tensors while it
   holds its group's work mutex, and freeing a tensor whose Python object the collective held last
   takes the GIL. A group destroyed from Python meanwhile (``del trainer`` drops the DDP reducer's
   group, end of ``main()``, ``gc``) waits for that mutex while it holds the GIL: both wait forever
   (gdb: ``~ProcessGroupGloo`` in the main thread, ``~AsyncAllgatherWork`` -> ``take_gil`` in
   ``pt_gloo_runloop``; about 1 run in 9 of the README's Trainer snippet under load). A script
   that ends with the process group alive meets the same worker at interpreter finalization:
   ``take_gil`` ends the thread, and unwinding its C++ frames aborts the process (``terminate
   called without an active exception``; gdb: ``~AsyncAllreduceWork`` -> ``take_gil`` ->
   ``PyThread_exit_thread``; about 1 run in 14 of a 2-rank ``ATACTrainer`` built and not
   trained, under load). Releasing the GIL for a moment after the last collective lets the
   workers finish: at the end of ``ATACTrainer.train``, around ``ATACAccelerator.end_training``
   and in :func:`release_groups_after_shutdown` (at exit, with or without the process group).
   Can go when gloo frees work outside its mutex.
9. :func:`release_loader` - ``Accelerator.prepare`` keeps every prepared DataLoader in
   ``_dataloaders`` for good, and Trainer reuses an eval loader only with persistent workers. A
   WFAP eval loader holds its packing plan (about 0.8 MB per 100K samples), and one with persistent
   workers its worker processes, so a loader made per ``evaluate()`` kept one more of each per
   evaluation (red-team 27: +1 process and +6 file descriptors an evaluation). ``ATACTrainer``
   keeps one eval loader per dataset and releases the one it replaces. Can go when Accelerate
   holds its loaders weakly.
10. :class:`ConvertedCheckpointMixin` - ``save_pretrained`` writes a checkpoint in the Hub's layout
   (per-expert ``block_sparse_moe.experts.0.w1.weight``, ...), but Trainer's resume and
   ``load_best_model_at_end`` read it with ``load_state_dict(strict=False)`` and no conversion, so the
   fused MoE experts (and Mixtral's router) kept the weights they had before the load, with a warning only
   (red-team 52: Mixtral and Qwen2-MoE resumed 28-38% off the uninterrupted run, stock Trainer too;
   transformers #48805). Where the file's keys do not cover the model's, the checkpoint is read through
   ``from_pretrained`` (its conversion; a second copy of the weights on CPU for the call, in the widest
   of the parameters' dtypes). That also loads checkpoints whose names the Hub layout renames (Llava's
   ``language_model.model.*``, Gemma3, Qwen2-VL), which Trainer's load skipped too. Can go when
   Trainer converts on load.
"""

from __future__ import annotations

import atexit
import gc
import time
import types
import warnings
import weakref
from typing import Any

__all__ = ["ConvertedCheckpointMixin", "bypass_torch_cp_hooks", "drain_gloo_workers", "load_converted_checkpoint", "loss_num_items_refusal", "release_groups_after_shutdown", "release_loader", "track_group_holder", "validate_parallelism_on_cpu"]


def validate_parallelism_on_cpu(config: Any, accelerator: Any) -> None:
    """The size check of ``ParallelismConfig._validate_accelerator``, without its device-type check.

    Raises:
        ValueError: the config's sizes do not multiply to the number of processes launched.
    """
    if config.total_size != accelerator.num_processes:
        raise ValueError(
            f"the parallelism config covers {config.total_size} processes (dp_replicate={config.dp_replicate_size} "
            f"x dp_shard={config.dp_shard_size} x cp={config.cp_size} x tp={config.tp_size}) but "
            f"{accelerator.num_processes} were launched; make them equal"
        )


def _prepare_cp_passthrough(self: Any, *args: Any) -> tuple:
    # ATP-CP shards and masks the batch itself: Accelerate's torch-CP hooks must not touch the model.
    return args


def bypass_torch_cp_hooks(accelerator: Any) -> None:
    """Keep ``accelerator.prepare`` from attaching Accelerate's torch context-parallel hooks.

    Per instance and idempotent; undo with ``del accelerator._prepare_cp``.
    """
    if not isinstance(accelerator.__dict__.get("_prepare_cp"), types.MethodType):
        accelerator._prepare_cp = types.MethodType(_prepare_cp_passthrough, accelerator)


def release_groups_after_shutdown() -> bool:
    """Drop the references that keep destroyed process groups alive (item 6).

    Accelerate's shared state (its ``device_mesh`` and ``parallelism_config``; the process
    index, device etc. stay) and the group attributes of the add-on's objects that
    :func:`track_group_holder` registered. The groups' backends are then freed now, while the
    interpreter is fully alive. It drains gloo's workers first (item 8); while the default process
    group is still initialized it drops nothing after the drain (tearing the group down here could
    hang a rank whose partners failed). Safe to call more than once.

    Returns:
        True when a reference was dropped.
    """
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, PartialState

    drain_gloo_workers()  # the last collectives freed before finalization, and before any group here: item 8
    if dist.is_available() and dist.is_initialized():
        return False
    released = False
    for state in (AcceleratorState, PartialState):
        for key in ("device_mesh", "parallelism_config"):
            if state._shared_state.get(key) is not None:
                state._shared_state[key] = None
                released = True
    for holder in list(_GROUP_HOLDERS.values()):
        for attr in _GROUP_ATTRS:
            if getattr(holder, attr, None) is not None:
                setattr(holder, attr, None)
                released = True
    if released:
        gc.collect()
    return released


#: seconds :func:`drain_gloo_workers` releases the GIL for, in 10 ms sleeps
DRAIN_S = 0.2


def drain_gloo_workers(seconds: float | None = None) -> None:
    """Release the GIL for ``seconds`` (default :data:`DRAIN_S`) so that gloo's worker threads
    finish freeing the collectives they ran, before a process group can be destroyed (item 8)."""
    end = time.monotonic() + (DRAIN_S if seconds is None else seconds)
    while time.monotonic() < end:
        time.sleep(0.01)


_GROUP_ATTRS = ("cp_group", "tp_group", "_atac_tp_group", "device_mesh")
_GROUP_HOLDERS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()  # by id: dataclasses do not hash
_REGISTERED = False


def track_group_holder(holder: Any, accelerator: Any = None) -> None:
    """Let :func:`release_groups_after_shutdown` (run at exit) drop ``holder``'s process-group
    attributes (``cp_group``, ``tp_group``, ``_atac_tp_group``, ``device_mesh``) once the process
    group is destroyed. ``accelerator``: an Accelerator whose ``end_training`` (not ours) is to
    drain gloo's workers before and after it (item 8)."""
    global _REGISTERED
    _GROUP_HOLDERS[id(holder)] = holder
    if not _REGISTERED:
        atexit.register(release_groups_after_shutdown)
        _REGISTERED = True
    end = getattr(accelerator, "end_training", None)
    if end is not None and not getattr(end, "_atac_drains", False):
        def end_training() -> None:
            drain_gloo_workers()
            end()
            drain_gloo_workers()

        end_training._atac_drains = True
        accelerator.end_training = end_training


def loss_num_items_refusal(model: Any, rtol: float = 1e-5) -> str | None:
    """None when ``model(input_ids, labels=..., num_items_in_batch=n).loss`` is the target sum over ``n``
    (workaround 7: the 3 targets of a 4-token row with ``n`` = 1 and 3, against the plain mean, within
    ``rtol``), else why not. Runs under ``no_grad`` in eval mode (the mode is restored)."""
    import torch

    training = model.training
    try:
        param = next(model.parameters())
        ids = torch.arange(1, 5, device=param.device).unsqueeze(0)
        model.eval()
        with torch.no_grad():
            mean, one, three = (model(input_ids=ids, labels=ids, use_cache=False, **kw).loss.double()
                                for kw in ({}, {"num_items_in_batch": 1}, {"num_items_in_batch": 3}))
    except Exception as e:  # noqa: BLE001 - reported: a model that cannot run the check is not shown to honour it
        return f"the check of its loss on a 4-token row failed ({type(e).__name__}: {str(e)[:200]})"
    finally:
        model.train(training)
    if not bool(torch.isfinite(mean)):
        return f"the check of its loss on a 4-token row gave {float(mean)}"
    if torch.allclose(one, 3 * mean, rtol=rtol) and torch.allclose(three, mean, rtol=rtol):
        return None
    return (f"its loss ignores num_items_in_batch (a 4-token row: {float(one):.4g} with 1 item, {float(three):.4g} "
            f"with 3, mean {float(mean):.4g})")


def release_loader(accelerator: Any, loader: Any) -> None:
    """Drop a prepared DataLoader from ``accelerator._dataloaders`` and stop its persistent workers (item 9)."""
    held = getattr(accelerator, "_dataloaders", None)
    if isinstance(held, list):
        held[:] = [d for d in held if d is not loader]
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None


def _checkpoint_keys(folder: str) -> set[str] | None:
    """The tensor names of a checkpoint's ``model.safetensors`` (or its index); None without one."""
    import json
    import os

    from safetensors import safe_open
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    single, index = os.path.join(folder, SAFE_WEIGHTS_NAME), os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(single):
        with safe_open(single, "pt") as f:
            return set(f.keys())
    if os.path.isfile(index):
        with open(index) as f:
            return set(json.load(f)["weight_map"])
    return None


def load_converted_checkpoint(trainer: Any, model: Any, folder: str) -> bool:
    """Load ``folder``'s weights into ``model`` through ``from_pretrained``'s weight conversion when the file's
    tensor names do not cover the model's (item 10); False where Trainer's own load is right (or not this
    case: FSDP, DeepSpeed, PEFT adapters, a model that is not a ``PreTrainedModel``)."""
    import copy

    import torch
    from transformers import PreTrainedModel

    base = getattr(model, "module", model)
    while hasattr(base, "_orig_mod"):  # a model handed in torch.compile'd
        base = base._orig_mod
    if (trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled or getattr(trainer, "atac_tp_size", 1) > 1
            or not isinstance(base, PreTrainedModel)):  # (TP: DTensor parameters, Trainer's load and its refusals)
        return False
    keys = _checkpoint_keys(folder)
    own = {name for name, _ in base.named_parameters()}  # (a tied weight once, under the name saved)
    if keys is None or own <= keys:
        return False
    # read in the parameters' dtype; where they mix (a bf16 MoE with fp32 routers), in the widest, so no weight
    # is rounded on the way (load_state_dict casts each back to its parameter's)
    floats = {p.dtype for p in base.parameters() if p.is_floating_point()}
    dtype = floats.pop() if len(floats) == 1 else max(floats | {torch.float32}, key=lambda d: torch.finfo(d).bits)
    try:
        loaded, info = type(base).from_pretrained(folder, config=copy.deepcopy(base.config), dtype=dtype,
                                                  output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - a class from_pretrained cannot build: Trainer's load, as without atac-hf
        warnings.warn(f"could not read the checkpoint {folder!r} through {type(base).__name__}.from_pretrained "
                      f"({type(e).__name__}: {str(e)[:200]}); Trainer's own load follows, which leaves weights whose "
                      "names differ on disk (fused MoE experts) at their pre-load values (transformers #48805)",
                      UserWarning, stacklevel=2)
        return False
    state = loaded.state_dict()
    if info.get("missing_keys") or not own <= set(state):  # not a conversion: Trainer's load (and its warning)
        return False
    base.load_state_dict(state, strict=False)
    del loaded, state
    return True


class ConvertedCheckpointMixin:
    """Trainer's resume and best-model loads through the checkpoint's weight conversion (item 10)."""

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        if not load_converted_checkpoint(self, self.model if model is None else model, resume_from_checkpoint):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        if not load_converted_checkpoint(self, self.model, self.state.best_model_checkpoint):
            super()._load_best_model()

"""Accelerate side: the CP mesh through ``ParallelismConfig`` (CPU included), no torch-CP hooks,
and :class:`ATACAccelerator` for plain training loops.

Why each piece exists (details and removal conditions in :mod:`._hf_compat`):

* ``ParallelismConfig._validate_accelerator`` rejects every config on CPU (``MULTI_CPU``);
  :class:`ATACParallelismConfig` runs the same size check there and skips only that one.
* ``Accelerator.prepare`` with ``cp_size > 1`` attaches torch-CP hooks that force
  ``is_causal=True`` (packed documents would attend to each other) and refuse sliding
  windows. The add-on shards and masks exactly itself, so the hooks stay off:
  :class:`ATACAccelerator` overrides ``_prepare_cp``; for an accelerator created elsewhere
  (Trainer's) :func:`bypass_torch_cp_hooks` does the same per instance, reversibly.
* The mesh puts CP innermost (``dp_replicate, dp_shard, cp``), or next to TP
  (``..., cp, tp``): the ranks of one CP group are consecutive (TP ranks apart), Accelerate's
  prepared DataLoaders give every CP and TP rank of a replica the same batches, and DDP/FSDP
  average gradients over dp x cp. Tensor parallelism (``tp_size > 1``): see
  :mod:`.tensor_parallel` (Accelerate wraps no DDP then; :meth:`ATACAccelerator.backward`
  averages the gradients over dp x cp itself).

Plain loop::

    accelerator = ATACAccelerator(ATACConfig(cp_size=2, max_tokens=4096))
    model, optimizer = accelerator.prepare(model, optimizer)        # selects attn "atac_cp"
    loader, sampler = accelerator.packed_dataloader(train_dataset, seed=0)
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)             # new packs each epoch (the loader follows it)
        for batch in loader:
            loss = model(**accelerator.shard(batch)).loss
            accelerator.backward(loss)       # DDP/FSDP mean over dp x cp == sum of the CP shares
            optimizer.step(); optimizer.zero_grad()
            print(accelerator.reduce_loss(loss))                # the pack's loss
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.parallelism_config import ParallelismConfig
from accelerate.scheduler import AcceleratedScheduler
from accelerate.utils import DistributedType, InitProcessGroupKwargs

from ._hf_compat import bypass_torch_cp_hooks, drain_gloo_workers, track_group_holder, validate_parallelism_on_cpu
from ..attention.model_check import check_static
from ..packing.validate import InputTypeError, _short
from .config import ATACConfig
from .accelerate_resume import LayoutResumeMixin
from .config_files import check_count
from .forward_check import PreparedForwardCheck, UnusedParameterCheck
from .launch_env import one_process_launch, warn_one_process_launch
from .layout import check_tp_layout, warn_placement
from .kv_bytes import HALF_AUTOCAST, kv_element_bytes, model_kv_bytes_per_token
from .plain_modules import runs_no_attention
from .sharded_check import check_model_sharded
from .sharder import BatchSharder, count_targets, learned_position_limit, prepare_model, unwrap_base_model
from .rollback import refused_changes_nothing
from .tensor_parallel import (apply_tensor_parallel, check_tp_prepare, dp_cp_group, remap_optimizer_params,
                              sync_tp_gradients, tp_head_split)

__all__ = ["ATACAccelerator", "ATACParallelismConfig", "build_parallelism_config", "bypass_torch_cp_hooks",
           "check_tp_layout", "cp_coordinates"]


class ATACParallelismConfig(ParallelismConfig):
    """``ParallelismConfig`` that also validates on CPU (gloo), for ATP-CP runs.

    Accelerate refuses any parallelism config when the distributed type is ``MULTI_CPU``
    although mesh, DDP and DataLoader sharding work there. On CPU this runs the size check
    (``total_size == num_processes``) and skips the device-type check; elsewhere it defers
    to Accelerate unchanged.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        track_group_holder(self)  # its device_mesh outlives end_training: _hf_compat (6)

    def _validate_accelerator(self, accelerator: Accelerator) -> None:
        if accelerator.distributed_type != DistributedType.MULTI_CPU:
            return super()._validate_accelerator(accelerator)
        validate_parallelism_on_cpu(self, accelerator)  # see _hf_compat (1)


def _env_int(environ: Mapping[str, str], key: str, default: int = 1) -> int:
    raw = environ.get(key)
    return default if raw in (None, "") else int(raw)


def build_parallelism_config(config: ATACConfig, world_size: int, *, fsdp: bool = False,
                             environ: Mapping[str, str] | None = None, tp_size: int | None = None
                             ) -> ATACParallelismConfig:
    """The mesh for ``config.cp_size`` (and ``tp_size``) over ``world_size`` processes.

    Axes in Accelerate's order ``dp_replicate, dp_shard, cp, tp``: TP innermost, then CP, DP
    outside, so a TP group and then a CP group are consecutive ranks (one node; see
    ``docs/INTEGRATION.md``, multi-node layouts). Sizes from an ``accelerate launch`` config
    (``PARALLELISM_CONFIG_*``, ``parallelism_config_tp_size`` included) are honoured; when its DP
    sizes are left at 1 they are derived (``world_size // (cp_size x tp_size)``). Without one:
    with ``cp_size > 1``, ``tp_size > 1`` or FSDP, ``dp_shard = world // (cp x tp)`` (Accelerate
    requires a ``dp_shard`` axis next to CP/TP; without FSDP the model is still wrapped in DDP,
    or, with TP, its gradients averaged by the add-on); else ``dp_replicate``.

    Args:
        tp_size: TP ranks; ``None``: the launch config's ``parallelism_config_tp_size`` or 1.

    Raises:
        ValueError: ``cp_size x tp_size`` not dividing ``world_size`` (names them), a launch config
            whose sizes do not multiply to the world size or whose tp size disagrees with
            ``tp_size``, or ``sp_size > 1`` (not supported).
    """
    if not isinstance(config, ATACConfig):
        raise InputTypeError(f"config must be an ATACConfig, got {type(config).__name__}")
    if environ is not None and not isinstance(environ, Mapping):
        raise InputTypeError(f"environ must be a mapping of environment variables (e.g. os.environ) or None, got "
                         f"{type(environ).__name__}")
    env = os.environ if environ is None else environ
    cp = int(config.cp_size)
    world = check_count(world_size, "world_size", "processes launched", low=None)
    if world < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    if tp_size is not None:
        check_count(tp_size, "tp_size", "tensor-parallel ranks; None: the launch config's", low=None)
    launch = env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "").lower() == "true"
    launch_tp = _env_int(env, "PARALLELISM_CONFIG_TP_SIZE") if launch else 1
    if tp_size is not None and launch and int(tp_size) != launch_tp:
        raise ValueError(f"tp_size={tp_size} disagrees with parallelism_config_tp_size={launch_tp} (accelerate "
                         "launch config): set them to the same value")
    tp = int(tp_size) if tp_size is not None else launch_tp
    if tp < 1:
        raise ValueError(f"tp_size={tp} must be >= 1 (parallelism_config_tp_size)")
    one_process = one_process_launch(env, world)  # accelerate launch started one of several processes
    hint = f"; {one_process}" if one_process else ""
    if world % (cp * tp):
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        how = ("accelerate launch --num_processes N; on a machine without GPUs add --multi_gpu, as "
               "configs/cpu_cp2.yaml does, or Accelerate starts one process")
        if tp == 1:
            raise ValueError(
                f"cp_size={cp} does not divide the world size {world} (processes launched): set cp_size to one of "
                f"{divisors}, or launch a multiple of {cp} processes ({how})" + hint)
        raise ValueError(
            f"cp_size={cp} x tp_size={tp} = {cp * tp} does not divide the world size {world} (processes launched): "
            f"choose sizes whose product is one of {divisors}, or launch a multiple of {cp * tp} processes "
            f"({how})" + hint)
    warn_one_process_launch(one_process)  # asked for several processes, started one: say so
    dp = world // (cp * tp)
    nested = cp > 1 or tp > 1 or fsdp
    if launch:
        sp = _env_int(env, "PARALLELISM_CONFIG_SP_SIZE")
        if sp > 1:
            raise ValueError(f"parallelism_config_sp_size={sp}: ATP-CP does not compose with sequence parallelism "
                             "(DeepSpeed Ulysses); set it to 1 in the launch config and use cp_size")
        launch_cp = _env_int(env, "PARALLELISM_CONFIG_CP_SIZE")
        if launch_cp != cp:
            raise ValueError(f"cp_size={cp} (ATAC config) disagrees with parallelism_config_cp_size={launch_cp} "
                             f"(accelerate launch config): set them to the same value, e.g. ATACConfig(cp_size="
                             f"{launch_cp}, ...) (an ATACConfig built in code without cp_size has cp_size=1; "
                             "ATACConfig.from_sources(overrides={...}) takes the launch config's)")
        rep = _env_int(env, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE")
        shard = _env_int(env, "PARALLELISM_CONFIG_DP_SHARD_SIZE")
        if rep * shard == 1 and dp > 1:
            rep, shard = (1, dp) if nested else (dp, 1)
        if rep * shard * cp * tp != world:
            sizes = f"dp_replicate={rep} x dp_shard={shard} x cp={cp}" + (f" x tp={tp}" if tp > 1 else "")
            raise ValueError(
                f"the launch config's parallelism_config ({sizes} = {rep * shard * cp * tp}) does not match the "
                f"world size {world}; fix the sizes or --num_processes")
    else:
        rep, shard = (1, dp) if nested else (dp, 1)
    return ATACParallelismConfig(dp_replicate_size=rep, dp_shard_size=shard, tp_size=tp, cp_size=cp, sp_size=1,
                                 cp_backend="torch")


def as_atac_parallelism_config(pc: ParallelismConfig) -> ATACParallelismConfig:
    """The same sizes as an :class:`ATACParallelismConfig` (a user-built ``ParallelismConfig``).

    Raises:
        ValueError: ``sp_size > 1`` (sequence parallelism does not compose with ATP-CP).
    """
    if isinstance(pc, ATACParallelismConfig):
        return pc
    if pc.sp_size > 1:
        raise ValueError(f"parallelism_config sp_size={pc.sp_size}: ATP-CP does not compose with sequence "
                         "parallelism (DeepSpeed Ulysses); set sp_size=1 and use cp_size")
    return ATACParallelismConfig(dp_replicate_size=pc.dp_replicate_size, dp_shard_size=pc.dp_shard_size,
                                 tp_size=pc.tp_size, cp_size=pc.cp_size, sp_size=1, cp_backend=pc.cp_backend)


def cp_coordinates(accelerator: Accelerator, cp_size: int, *, timeout_s: float | None = None) -> tuple[int, Any]:
    """``(cp_rank, cp_group)`` of this process (``(0, None)`` when ``cp_size`` is 1).

    ``timeout_s`` (``ATACConfig.collective_timeout_s``) becomes the CP group's timeout: a CP rank
    that crashed, raised or hangs then fails its partners' K/V gather after that long.
    """
    if cp_size == 1:
        return 0, None
    mesh = accelerator.torch_device_mesh
    if mesh is None or "cp" not in (mesh.mesh_dim_names or ()):
        raise ValueError(f"cp_size={cp_size} but the accelerator has no 'cp' mesh axis: build it with "
                         "parallelism_config=build_parallelism_config(config, world_size)")
    sub = mesh["cp"]
    if sub.size() != cp_size:
        raise ValueError(f"the accelerator's cp axis has {sub.size()} ranks, the ATAC config says cp_size={cp_size}")
    group = sub.get_group()
    if timeout_s is not None:
        group.set_timeout(datetime.timedelta(seconds=float(timeout_s)))
    return int(sub.get_local_rank()), group


class ReplicaStepScheduler(AcceleratedScheduler):
    """Accelerate's scheduler wrapper, stepped once per DP replica at each optimizer step. Accelerate's
    steps once per process (each brings its own batch), but the CP and TP ranks of a replica train on
    one batch: a schedule sized for one device would otherwise run ``cp_size x tp_size`` times too fast."""

    def __init__(self, prepared: AcceleratedScheduler, replicas: int) -> None:
        super().__init__(prepared.scheduler, prepared.optimizers, step_with_optimizer=prepared.step_with_optimizer,
                         split_batches=prepared.split_batches)
        self.replicas = replicas

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.split_batches or not self.step_with_optimizer or not self.gradient_state.sync_gradients:
            return super().step(*args, **kwargs)
        if any(opt.step_was_skipped for opt in self.optimizers):
            return None
        for _ in range(self.replicas):
            total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR: never past its last step
            if total is None or self.scheduler._step_count <= total:
                self.scheduler.step(*args, **kwargs)
        return None


class ATACAccelerator(LayoutResumeMixin, Accelerator):
    """An ``Accelerator`` with an ATP-CP mesh, for plain training loops.

    Args:
        atac_config: the run's :class:`ATACConfig` (default: :meth:`ATACConfig.from_sources`).
        cpu: run on CPU (default: when CUDA is not available).
        parallelism_config: override the mesh (default :func:`build_parallelism_config`).
        **kwargs: passed to ``Accelerator`` (mixed_precision, gradient_accumulation_steps, ...).

    Per batch: :meth:`shard` (plan + shard + loss normaliser), then the usual
    ``accelerator.backward(loss)``. Each rank's loss is its share of the pack's loss scaled by
    ``num_processes / tp_size x gradient_accumulation_steps`` (given the step's count; without it
    by ``num_processes / tp_size`` over this pack's count), so DDP/FSDP's gradient mean over
    dp x cp (with TP: :meth:`backward`'s own mean over dp x cp) and the division in
    ``backward`` leave exactly the single-device gradient; :meth:`reduce_loss` gives the pack's
    loss. With ``tp_size > 1`` (``parallelism_config=ParallelismConfig(tp_size=T, cp_size=C)``
    or ``parallelism_config_tp_size``) :meth:`prepare` shards the model with its own
    ``tp_plan``; call ``accelerator.backward`` (not ``loss.backward()``).

    Raises:
        ValueError: ``cp_size x tp_size`` not dividing the number of processes, an attention
            backend that cannot run here, ``tp_size > 1`` with FSDP, and at :meth:`prepare` a
            model without a ``tp_plan`` or whose heads ``tp_size`` does not divide.
    """

    def __init__(self, atac_config: ATACConfig | None = None, *, cpu: bool | None = None,
                 parallelism_config: ParallelismConfig | None = None, **kwargs: Any) -> None:
        config = atac_config if atac_config is not None else ATACConfig.from_sources()
        cpu = (not torch.cuda.is_available()) if cpu is None else bool(cpu)
        # the process group is created here: hand it InitProcessGroupKwargs (timeout, backend...),
        # which Accelerator.__init__ would read too late (PartialState is created only once)
        init = next((h for h in kwargs.get("kwargs_handlers") or () if isinstance(h, InitProcessGroupKwargs)), None)
        state = PartialState(cpu=cpu, **(init.to_kwargs() if init is not None else {}))
        fsdp = kwargs.get("fsdp_plugin") is not None or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
        if parallelism_config is None:
            parallelism_config = build_parallelism_config(config, state.num_processes, fsdp=fsdp)
        else:
            parallelism_config = as_atac_parallelism_config(parallelism_config)
            if parallelism_config.cp_size != config.cp_size:
                raise ValueError(f"parallelism_config.cp_size={parallelism_config.cp_size} disagrees with "
                                 f"atac_config.cp_size={config.cp_size}: set both to the CP size you want")
        check_tp_layout(parallelism_config, fsdp=fsdp)
        config.check_runtime(state.device.type)  # before Accelerate's state is set: a refused retry changes nothing
        warn_placement(parallelism_config, fsdp=fsdp)
        super().__init__(cpu=cpu, parallelism_config=parallelism_config, **kwargs)
        self.atac_config = config
        self.cp_rank, self.cp_group = cp_coordinates(self, config.cp_size, timeout_s=config.collective_timeout_s)
        track_group_holder(self)  # Accelerate's state and cp_group outlive end_training: _hf_compat (6)
        self.tp_size = int(parallelism_config.tp_size)
        self.dp_size = self.num_processes // (config.cp_size * self.tp_size)
        self.sharder: BatchSharder | None = None
        self._atac_counted = True  # the last shard() was given the step's count (how reduce_loss undoes the scale)
        self._forward_check = PreparedForwardCheck()  # CP > 1: a loss from the unprepared module is refused
        self._unused_check = UnusedParameterCheck()  # CP > 1, at gradient-sync steps

    def end_training(self) -> None:
        """Accelerate's ``end_training`` (trackers finished, the process group destroyed), with gloo's
        worker threads given the GIL before and after (``_hf_compat`` item 8)."""
        drain_gloo_workers()
        super().end_training()
        drain_gloo_workers()

    def _prepare_cp(self, *args: Any) -> tuple:  # Accelerate's torch-CP hooks (forced is_causal, no sliding
        return args  # windows) stay off: _hf_compat (2)

    def prepare(self, *args: Any, **kwargs: Any):
        """``Accelerator.prepare``; models are checked and switched to ``attn_implementation="atac_cp"`` first.

        With ``tp_size > 1`` each model is sharded with its own ``tp_plan`` on the mesh's "tp"
        axis first (:func:`~.tensor_parallel.apply_tensor_parallel`), and the optimizers passed
        in the same call are pointed at the sharded parameters. With ``cp_size > 1`` each returned wrapper
        (DDP) counts its forwards: :meth:`backward` refuses a loss from the module it wraps (no gradient sum);
        and a model whose loss ignores ``num_items_in_batch`` or shifts ``labels`` itself is refused (ValueError;
        :func:`~.trainer_guards.loss_scale_refusal`): its loss on a shard would be wrong.
        """
        optimizers = [o for o in args if isinstance(o, torch.optim.Optimizer)]
        models = [a for a in args if isinstance(a, torch.nn.Module) and not runs_no_attention(a)]  # (heads: as they are)
        for obj in models:  # every model checked before any is changed, its kind first
            check_static(obj)
        if self.tp_size > 1:
            check_tp_prepare(args, models, self.tp_size, cp_size=self.atac_config.cp_size)  # (world: the group's)
        if self.atac_config.cp_size > 1:
            from .trainer_guards import loss_scale_refusal  # (imports Trainer)

            for obj in models:
                if why := loss_scale_refusal(obj, False, self.atac_config.cp_size, parameter_terms=True):
                    raise ValueError(f"{type(unwrap_base_model(obj)).__name__}: {why}")
        with refused_changes_nothing(models, owner=self, attrs=("sharder",)):  # (a refusal below, or Accelerate's)
            for obj in models:  # every model's sharded probe before any is TP-sharded (that cannot be put back)
                self._switch_model(obj)
            for obj in models:
                old = dict(obj.named_parameters())
                self._setup_model(obj)
                if self.tp_size > 1:
                    remap_optimizer_params(optimizers, old, dict(obj.named_parameters()))
            prepared = super().prepare(*args, **kwargs)
        if self.atac_config.cp_size > 1:
            self._forward_check.watch(prepared if isinstance(prepared, tuple) else (prepared,))
        return prepared

    def prepare_scheduler(self, scheduler: Any):
        """``Accelerator.prepare_scheduler``, stepped once per DP replica (:class:`ReplicaStepScheduler`):
        size the schedule in optimizer steps, as on one device."""
        prepared = super().prepare_scheduler(scheduler)
        if type(prepared) is AcceleratedScheduler and self.dp_size != self.num_processes:
            wrapped = ReplicaStepScheduler(prepared, self.dp_size)
            self._schedulers[self._schedulers.index(prepared)] = wrapped
            return wrapped
        return prepared

    def register_for_checkpointing(self, *objects: Any) -> None:
        """``Accelerator.register_for_checkpointing``; a packed loader's sampler is refused (see the error)."""
        from ..packing.data.sampler import WFAPBatchSampler

        if any(isinstance(o, WFAPBatchSampler) for o in objects):
            raise ValueError(
                "register_for_checkpointing(sampler): save_state would store the batches the sampler has drawn, "
                "and Accelerate's loader draws one batch per process ahead of the loop, so a resume would skip "
                "them. Save sampler.state_dict(position=optimizer_steps_done x gradient_accumulation_steps x "
                f"{self.dp_size} (DP replicas)) with your checkpoint and pass it to sampler.load_state_dict on "
                "resume, or resume with accelerator.skip_first_batches(loader, batches_done)")
        super().register_for_checkpointing(*objects)

    def _switch_model(self, model: torch.nn.Module) -> None:
        """``model`` switched to ``atac_cp`` (:func:`~.sharder.prepare_model`) and probed sharded over the CP ranks."""
        attention = unwrap_base_model(model).config._attn_implementation  # put back if the sharded probe refuses
        prepare_model(model, self.atac_config)
        check_model_sharded(model, self.cp_rank, self.cp_group, self.atac_config.cp_size,
                            timeout_s=self.atac_config.collective_timeout_s, restore=attention)

    def _setup_model(self, model: torch.nn.Module) -> None:
        """A switched model TP-sharded (``tp_size > 1``) and given its :class:`BatchSharder`."""
        if self.tp_size > 1:
            apply_tensor_parallel(model, self.torch_device_mesh["tp"])
        base_config, previous = unwrap_base_model(model).config, self.sharder
        half = str(self.mixed_precision) in HALF_AUTOCAST  # K/V are computed (and exchanged) in the autocast dtype
        self.sharder = BatchSharder(
            self.atac_config, cp_rank=self.cp_rank, cp_group=self.cp_group,
            cost_model=self.atac_config.cost_model(base_config, dtype_bytes=kv_element_bytes(model, half)),
            kv_bytes_per_token=model_kv_bytes_per_token(model, half) / tp_head_split(model, self.tp_size),
            device_type=self.device.type,
            tp_group=self.torch_device_mesh["tp"].get_group() if self.tp_size > 1 else None,
        )
        self.sharder.bind_model(model, learned_position_limit(model), also=previous)  # (ids fit every model prepared)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``Accelerator.backward``; with ``tp_size > 1``, at a gradient-sync step the gradients are then
        averaged over dp x cp (Accelerate does not wrap a TP model in DDP).

        Raises:
            ValueError: (``cp_size > 1``) no model returned by :meth:`prepare` ran a forward with autograd on
                since the last backward (the loss came from the unprepared module, or is a second backward of one
                forward), or a wrapped module ran one only outside its wrapper: DDP would not sum these gradients;
                after a syncing backward, a trainable parameter got no gradient (:class:`.UnusedParameterCheck`).
        """
        if self.tp_size > 1 and not self._models:  # refused before any gradient is accumulated
            raise RuntimeError("accelerator.backward with tp_size > 1 needs the model prepared first: call "
                               "accelerator.prepare(model, optimizer)")
        if self.atac_config.cp_size > 1:
            self._unused_check.before(self._forward_check.forwarded() if self.sync_gradients else ())
            self._forward_check.before_backward()  # (after forwarded(): it resets the counts)
        super().backward(loss, **kwargs)
        self._unused_check.after()  # (nothing noted: nothing checked)
        if self.tp_size > 1 and self.sync_gradients:
            for model in self._models:
                sync_tp_gradients(model, dp_cp_group(self.torch_device_mesh))

    def packed_dataloader(self, dataset: Any, *, seed: int = 0, shuffle: bool | None = None, **loader_kwargs: Any):
        """A prepared DataLoader of WFAP packs for ``dataset`` and its sampler (call ``sampler.set_epoch``).

        One window = DP replicas x ``gradient_accumulation_steps`` packs. Build it after
        ``prepare(model)`` so the packer uses the model's cost model.
        """
        from .data import build_packed_dataloader

        dl = getattr(self, "dataloader_config", None)
        for flag in ("dispatch_batches", "split_batches"):
            if getattr(dl, flag, None):
                raise ValueError(f"DataLoaderConfiguration({flag}=True): a packed batch is one row of up to max_tokens "
                                 "tokens, dealt whole to each DP replica by the WFAP sampler; it cannot be dispatched "
                                 f"from one process or split; leave {flag} unset (False)")
        cost = self.sharder.cost_model if self.sharder is not None else None
        loader, sampler = build_packed_dataloader(dataset, self.atac_config, num_replicas=self.dp_size,
                                                  grad_accum=self.gradient_accumulation_steps, seed=seed,
                                                  shuffle=shuffle, cost_model=cost, **loader_kwargs)
        prepared = self.prepare(loader)
        sampler.keep_in_step(prepared)  # a resumed epoch is not reset by the loader's own epoch counter
        return prepared, sampler

    def count_items(self, batches: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> int:
        """Global target count of the step: ``batches`` counted here, summed over DP replicas.

        Collective: every rank calls it with its own batches (the CP and TP ranks of a replica
        hold the same, so the world sum is divided by ``cp_size x tp_size``).
        """
        n = torch.tensor(float(count_targets(batches)), dtype=torch.float64, device=self.device)  # (any default dtype)
        if self.num_processes > 1:
            dist.all_reduce(n)
        return int(round(n.item() / (self.atac_config.cp_size * self.tp_size)))

    def shard(self, batch: Mapping[str, Any], *, num_items_in_batch: int | None = None) -> dict:
        """This rank's inputs for ``model(**inputs)``: plan the pack, shard it, set the loss normaliser.

        Args:
            batch: the full packed batch (the same on every CP rank of the replica).
            num_items_in_batch: the step's global target count (:meth:`count_items` over the
                accumulated micro-batches: every target of the step weighs the same, as Trainer
                does); ``None`` counts this batch alone (collective), and the step then averages
                its micro-batches' means, as stock Accelerate's ``loss`` and ``accumulate`` do.

        Returns:
            ``shard_batch``'s dict; its ``num_items_in_batch`` is the global count divided by
            ``num_processes / tp_size x gradient_accumulation_steps`` (see the class docstring),
            or with ``None`` this batch's count divided by ``num_processes / tp_size``
            (``backward`` divides by ``gradient_accumulation_steps``).
        """
        if self.sharder is None:
            raise RuntimeError("call accelerator.prepare(model, ...) before shard(): it selects the atac_cp "
                               "attention and builds the planner's cost model")
        if num_items_in_batch is not None:
            num_items_in_batch = _target_count(num_items_in_batch)
        self._atac_counted = num_items_in_batch is not None
        self._forward_check.on_shard()
        if num_items_in_batch is None:  # this micro-batch's mean: the step averages the micro-batches' means
            norm = max(float(self.count_items(batch)), 1.0) / (self.num_processes // self.tp_size)
        else:
            norm = max(float(num_items_in_batch), 1.0) / (self.num_processes // self.tp_size
                                                          * self.gradient_accumulation_steps)
        return self.sharder(batch, num_items_in_batch=norm)

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The micro-batch's loss (its share of the step's mean) from the per-rank loss of :meth:`shard`.

        Collective: every rank calls it (not under ``if accelerator.is_main_process``). Without gradient
        accumulation, and for a loss computed without a graph (evaluation under ``torch.no_grad()``)
        from ``shard(batch)``, this is the batch's loss. (With TP every TP rank
        holds the same loss, scaled by ``num_processes / tp_size``: the world sum over
        ``num_processes`` is the same figure.)
        """
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"reduce_loss takes the loss tensor model(**accelerator.shard(batch)).loss, got "
                            f"{type(loss).__name__} {loss!r:.40}; pass the tensor, not loss.item()")
        total = loss.detach().clone()
        if self.num_processes > 1:
            dist.all_reduce(total)
        # a micro-batch's mean (no count) is a share of the step's only in training: an evaluation loss
        # (no graph: computed under no_grad / inference_mode) is the batch's own mean
        ga = self.gradient_accumulation_steps if self._atac_counted or loss.requires_grad else 1
        return total / (self.num_processes * ga)


def _target_count(n: Any) -> float:
    """``shard``'s ``num_items_in_batch``: the step's target count, a finite number >= 0 (an int, a float
    such as an all-reduced count's ``.item()``, a one-element tensor or array); anything else (a bool, a
    string, NaN) would scale the loss silently."""
    if isinstance(n, torch.Tensor) and n.numel() == 1 or isinstance(n, np.ndarray) and n.size == 1:
        n = n.item()  # (a bool tensor gives a bool: refused below)
    ok = isinstance(n, (int, float, np.integer, np.floating)) and not isinstance(n, (bool, np.bool_))
    if not ok or not 0 <= float(n) < float("inf"):
        raise ValueError(f"num_items_in_batch={_short(n)} is invalid: it must be the step's target count, a "
                         "finite number >= 0 (accelerator.count_items(batches) over the step's micro-batches), or "
                         "None to count this batch alone")
    return float(n)

"""`ATACTrainer`: ``transformers.Trainer`` with WFAP packing and ATP-CP sharding.

What it changes, and where:

* ``__init__``: builds the CP mesh (:func:`~.accelerate.build_parallelism_config`, CPU too),
  selects ``attn_implementation="atac_cp"`` on the model, keeps Accelerate's torch-CP hooks off;
  sets ``use_cpu=True`` when several processes run without CUDA and
  ``ddp_find_unused_parameters=False`` when unset (dense models); dry-runs a custom
  ``data_collator`` on two samples and refuses one that does not emit packed rows.
* ``get_train_dataloader`` / ``get_eval_dataloader``: one batch = one WFAP pack, dealt to DP
  replicas the way Accelerate shards batches (every CP rank of a replica gets the same pack).
  ``per_device_*_batch_size`` is not used: a pack's size is ``max_tokens``. A streaming
  dataset goes through the resumable ``PackedIterableDataset`` instead (rows dealt round-robin,
  ``dispatch_batches=False``; :mod:`.stream_state` saves and restores its position); pre-packed
  rows are read document by document.
* ``_prepare_context_parallel_inputs`` (called by Trainer after it counted
  ``num_items_in_batch`` on the full rows, summed over the world and divided by cp; in training
  and evaluation): plans the pack and shards it. Trainer's loss scaling by world size and
  DDP/FSDP's gradient mean then sum the CP ranks' gradients: training equals single-device
  training on the same packs.
* ``log``: adds ``atac/imbalance``, ``atac/kv_mb``, ``atac/planner_ms`` (means over the
  micro-batches since the last log, over all ranks); ``train_samples_per_second`` counts the
  documents really trained (Trainer's would count ``per_device_train_batch_size`` per batch).
* tensor parallelism (``parallelism_config.tp_size > 1``, from ``args.parallelism_config`` or the
  launch config): after ``Trainer.__init__`` the model is sharded with its own ``tp_plan`` on the
  mesh's "tp" axis (:mod:`.tensor_parallel`); ``training_step`` then averages gradients over
  dp x cp (Accelerate wraps no DDP around a TP model); counters divide by ``cp x tp``;
  ``_save`` gathers the shards on every rank. Resumable checkpoints are refused under TP
  (``save_only_model=True`` or ``save_strategy="no"``).
* checkpoints: ``atac_sampler.json`` holds the sampler state and the run's layout; on resume,
  before Trainer loads anything, it is checked against this run (the layout, the dataset and
  settings) and restores the sampler's epoch and seed, and Trainer skips the batches already
  seen. A streaming run's ``atac_stream.json`` holds the packed stream's pass and position; on
  resume it is checked and restored and Trainer skips nothing (:mod:`.stream_state`).
* guards (:mod:`.trainer_guards`): a ``compute_loss`` override that bypasses Trainer's, a loss that ignores
  ``num_items_in_batch``, an ``evaluate()`` before ``train()`` that would keep DDP off; another trainer's
  ``prediction_step`` (TRL's) gets the pack sharded too.
* evaluation (:mod:`.predictions`): under CP the pack's loss, and where Trainer asks for predictions its
  logits in row order with its labels, on every CP rank; gathered over the DP group, one copy per replica.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.distributed as dist
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, get_last_checkpoint
from transformers.utils import logging as hf_logging

from .accelerate import (as_atac_parallelism_config, build_parallelism_config, bypass_torch_cp_hooks, check_tp_layout,
                         cp_coordinates)
from ._hf_compat import ConvertedCheckpointMixin, drain_gloo_workers, release_loader, track_group_holder
from .config import ATACConfig
from .forward_check import UnusedParameterCheck
from .data import build_packed_dataloader, check_collator, check_dataset_columns, is_streaming_dataset
from .layout import warn_placement
from .kv_bytes import HALF_AUTOCAST, kv_element_bytes, model_kv_bytes_per_token
from ..attention.model_check import check_static
from .sharded_check import check_model_sharded
from .sharder import BatchSharder, check_position_limit, prepare_model, unwrap_base_model
from .stream_state import SAMPLER_STATE_NAME, STREAM_STATE_NAME, StreamResumeMixin, stream_dispatch
from .rollback import refused_changes_nothing
from .predictions import full_row_predictions, replica_gather
from .tensor_parallel import (apply_tensor_parallel, check_optimizers_unstepped, check_tp_refusals, dp_cp_group,
                              full_state_dict, remap_optimizer_params, sync_tp_gradients, tp_head_split)
from .trainer_guards import (LossGuardMixin, check_label_names, check_late_loss_settings,
                             check_step_model, install_loss_override_check, loss_scale_refusal, record_wrap_trainable,
                             release_eval_preparation, sharded_prediction_step, watch_step_forwards)
from .trainer_guards import check_training_args as _check_args, sampling_strategy as _sampling_strategy  # noqa: F401

__all__ = ["ATACTrainer", "SAMPLER_STATE_NAME", "STREAM_STATE_NAME"]

logger = hf_logging.get_logger(__name__)
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _default_device_args(args: TrainingArguments, model: torch.nn.Module) -> None:
    """Settings a plain ``TrainingArguments()`` gets wrong for ATACTrainer, fixed when the user left them unset.

    * no CUDA but several processes (``accelerate launch`` on CPU): ``use_cpu=True`` (devices set
      up again), else TrainingArguments sees one process;
    * ``ddp_find_unused_parameters=False`` (Trainer's default True for a model without gradient
      checkpointing makes DDP warn on every run; every parameter of a dense causal LM gets a
      gradient). Left unset for mixture-of-experts models, whose unrouted experts may get none, and
      composite models (a text config inside, e.g. Gemma3ForConditionalGeneration: the vision tower
      gets none from text rows; DDP failed on the second step there).
    """
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if not args.use_cpu and launched > 1 and not torch.cuda.is_available():
        args.use_cpu = True
        # TrainingArguments.__post_init__ already set up a one-process state (a cached property):
        # set it up again, now as a CPU process group (gloo) of every launched process
        vars(args).pop("_setup_devices", None)
        args.device  # noqa: B018 - runs the set-up
        if int(os.environ.get("RANK", "0") or 0) == 0:
            logger.warning("ATACTrainer: no CUDA device, so TrainingArguments.use_cpu=True (gloo, %d processes)",
                           launched)
    if args.ddp_find_unused_parameters is None:
        cfg = getattr(unwrap_base_model(model), "config", None)
        texts = [cfg] + ([cfg.get_text_config()] if hasattr(cfg, "get_text_config") else [])
        # e.g. a vision or audio tower that text rows never use (a text config inside, or sub-configs: Phi-4-mm)
        composite = (len(texts) > 1 and texts[1] is not cfg) or bool(getattr(cfg, "sub_configs", None))
        if not composite and not any(getattr(c, f, None) for c in texts if c is not None for f in _MOE_FIELDS):
            args.ddp_find_unused_parameters = False


class ATACTrainer(StreamResumeMixin, LossGuardMixin, ConvertedCheckpointMixin, Trainer):
    """``Trainer`` that packs with WFAP and shards every pack over a CP group with ATP-CP.

    Args:
        model: a transformers causal LM (PEFT-wrapped too); switched to ``atac_cp`` attention.
        args: ``TrainingArguments``; ``parallelism_config`` is built from ``atac_config`` when unset.
            Without CUDA, ``use_cpu=True`` is set for multi-process runs (a log line says so).
        data_collator: default :class:`~atac_hf.packing.PackedDataCollator`; another must emit one
            padding-free packed row per batch (checked on two samples, see
            :func:`~.data.check_collator`), e.g. transformers' ``DataCollatorWithFlattening``.
        train_dataset, eval_dataset: datasets with ``input_ids`` (``labels`` optional): map-style
            (WFAP sampler over known lengths) or streaming (``IterableDataset`` /
            ``datasets.IterableDataset``: the resumable ``PackedIterableDataset``; set ``max_steps``,
            the stream's length being unknown; ``dispatch_batches`` is set to False; checkpoints hold
            the stream's pass and position, and a resume continues exactly there, in any pass - with
            ``dataloader_num_workers=0``: with one worker Trainer replays the stream instead, exact in
            its first pass only, with a warning). Pre-packed map-style rows (a ``seq_lengths``
            column, from TRL's or atac-hf's ``pack_dataset``) are read document by document
            (:class:`~.data.PackedRowDocuments`) whatever ``remove_unused_columns`` says.
        atac_config: default :meth:`ATACConfig.from_sources` (``ATAC_CONFIG`` file, ``ATAC_*``
            variables, ``PARALLELISM_CONFIG_CP_SIZE``).
        **kwargs: passed to ``Trainer``.

    Raises:
        ValueError: ``cp_size`` not dividing the world size; a model the runtime cannot shard; a
            dataset without ``input_ids``; a collator that does not emit packed rows; an
            attention backend that cannot run here; Trainer settings that break exactness under
            CP (label smoothing, ``average_tokens_across_devices=False``, ``compute_loss_func``
            with ``cp_size > 1``); with ``tp_size > 1``: FSDP, a model without a ``tp_plan`` or
            whose heads ``tp_size`` does not divide, PEFT, resumable checkpoints.
    """

    def __init__(self, model: torch.nn.Module | None = None, args: TrainingArguments | None = None,
                 data_collator: Any = None, train_dataset: Any = None, eval_dataset: Any = None, *,
                 atac_config: ATACConfig | None = None, **kwargs: Any) -> None:
        # a refusal (atac-hf's, or Trainer's own after the model was switched) puts back the model and args
        with refused_changes_nothing((model,), args):
            self._atac_init(model, args, data_collator, train_dataset, eval_dataset, atac_config, kwargs)

    def _atac_init(self, model, args, data_collator, train_dataset, eval_dataset, atac_config, kwargs) -> None:
        from ..packing.data.collator import PackedDataCollator

        config = atac_config if atac_config is not None else ATACConfig.from_sources()
        if model is None:
            raise ValueError("ATACTrainer needs model= (model_init is not supported: the model is switched to the "
                             "atac_cp attention before training)")
        if isinstance(model, torch.nn.Module):  # its kind first: a check below would refuse it for another reason
            check_static(model)
        if train_dataset is not None:
            check_dataset_columns(train_dataset, name="train_dataset", streaming=True, targets=True)
        evals = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
        for key, ds in evals.items():
            if ds is not None:
                check_dataset_columns(ds, name=f"eval_dataset[{key!r}]" if key else "eval_dataset", streaming=True)
        if kwargs.get("compute_loss_func") is not None and config.cp_size > 1:
            raise ValueError(
                f"compute_loss_func={getattr(kwargs['compute_loss_func'], '__name__', '<callable>')!r} with "
                f"cp_size={config.cp_size}: Trainer would hand it the logits and labels of each rank's shard (chunks "
                "of several documents, not a contiguous row), so a loss that shifts labels or averages per sequence "
                "is wrong under ATP-CP; drop compute_loss_func (the model's own loss is exact under CP) or train "
                "with cp_size=1")
        if args is None:
            args = TrainingArguments(output_dir="trainer_output")
        streaming = any(is_streaming_dataset(d) for d in [train_dataset, *evals.values()] if d is not None)
        if streaming and args.dataloader_num_workers > 1:
            raise ValueError(f"dataloader_num_workers={args.dataloader_num_workers} with a streaming dataset: the "
                             "stream is packed by one sequential, resumable packer, which cannot be split over "
                             "DataLoader workers; set dataloader_num_workers to 0 or 1")
        stream_dispatch(args, streaming)
        _default_device_args(args, model)
        _check_args(args, config)
        config.check_runtime(args.device.type)
        fsdp = bool(args.fsdp) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
        # every refusal comes before the model and args change (a refused operation changes nothing)
        if args.parallelism_config is None:
            pc = build_parallelism_config(config, args.world_size, fsdp=fsdp)
        else:
            pc = as_atac_parallelism_config(args.parallelism_config)
            if pc.cp_size != config.cp_size:
                raise ValueError(f"args.parallelism_config.cp_size={pc.cp_size} disagrees with "
                                 f"atac_config.cp_size={config.cp_size}: set both to the CP size you want")
        check_tp_layout(pc, fsdp=fsdp)
        tp = int(pc.tp_size)
        if tp > 1 and args.save_strategy != SaveStrategy.NO and not args.save_only_model:
            raise ValueError(f"tp_size={tp} with save_strategy={args.save_strategy.value!r}: Trainer writes the "
                             "optimizer state of rank 0's TP shards only, so such a checkpoint cannot be resumed; "
                             "pass save_only_model=True (the weights, gathered from the shards) or save_strategy='no'")
        if tp > 1 and args.load_best_model_at_end:
            raise ValueError(f"tp_size={tp} with load_best_model_at_end=True: Trainer loads the best checkpoint's full "
                             "weights into the sharded (DTensor) model, which fails at the end of training; set "
                             "load_best_model_at_end=False (the checkpoints keep the weights) or tp_size=1")
        if tp > 1 and isinstance(model, torch.nn.Module):
            check_tp_refusals(model, tp, world_size=args.world_size, cp_size=config.cp_size)  # before any change
            check_optimizers_unstepped((kwargs.get("optimizers") or (None,))[:1], [model])
        if data_collator is not None and type(data_collator) is not PackedDataCollator:
            probe = next((d for d in [train_dataset, *evals.values()] if d is not None), None)
            if probe is not None and hasattr(probe, "__getitem__") and hasattr(probe, "__len__"):
                check_collator(data_collator, probe, max_tokens=config.max_tokens)
        position_limit = check_position_limit(model, train_dataset, config)  # a learned position table too short
        for key, ds in evals.items():
            check_position_limit(model, ds, config, f"eval_dataset[{key!r}]" if key else "eval_dataset")
        stale = getattr(unwrap_base_model(model), "accepts_loss_kwargs", None) is False  # _hf_compat 7
        if why := loss_scale_refusal(model, stale, config.cp_size):  # checked before any change
            declared = " declares accepts_loss_kwargs=False and" if stale else ":"
            raise ValueError(f"{type(unwrap_base_model(model)).__name__}{declared} {why}")
        args.parallelism_config = pc
        warn_placement(pc, fsdp=fsdp)
        attention = unwrap_base_model(model).config._attn_implementation  # put back if the sharded probe refuses
        prepare_model(model, config)
        super().__init__(model=model, args=args, data_collator=data_collator or PackedDataCollator(),
                         train_dataset=train_dataset, eval_dataset=eval_dataset, **kwargs)
        bypass_torch_cp_hooks(self.accelerator)
        # gather, not gather_for_metrics (it would drop "duplicates" at the end of the loader; each
        # evaluation_loop sets its own)
        self.gather_function = self.accelerator.gather
        self.model_accepts_loss_kwargs = self.model_accepts_loss_kwargs or stale
        if not self.model_accepts_loss_kwargs:
            raise ValueError(f"{type(unwrap_base_model(self.model)).__name__} does not accept loss kwargs, so Trainer "
                             "cannot pass num_items_in_batch and the loss would be a per-rank mean; ATP-CP needs it")
        self.atac_config = config
        self.cp_rank, self.cp_group = cp_coordinates(self.accelerator, config.cp_size,
                                                     timeout_s=config.collective_timeout_s)
        track_group_holder(self, self.accelerator)  # state and cp_group outlive end_training: _hf_compat (6, 8)
        check_model_sharded(model, self.cp_rank, self.cp_group, config.cp_size, timeout_s=config.collective_timeout_s,
                            restore=attention)  # the probe over the CP ranks (check_model's ran in one process)
        self.atac_tp_size = int(args.parallelism_config.tp_size)
        install_loss_override_check(self, config.cp_size)
        check_late_loss_settings(self, config.cp_size)  # (records the model's loss_function, checked above)
        self.atac_tp_rank = 0
        if self.atac_tp_size > 1:  # the model's own tp_plan on the mesh's "tp" axis (after the checks above)
            mesh = self.accelerator.torch_device_mesh
            old = dict(self.model.named_parameters())
            apply_tensor_parallel(self.model, mesh["tp"])
            remap_optimizer_params([o for o in (self.optimizer,) if o is not None], old,
                                   dict(self.model.named_parameters()))
            self.atac_tp_rank = int(mesh["tp"].get_local_rank())
        self.dp_size = self.args.world_size // (config.cp_size * self.atac_tp_size)
        base = unwrap_base_model(self.model)
        half = bool(self.args.bf16 or self.args.fp16) or str(self.accelerator.mixed_precision) in HALF_AUTOCAST  # (K/V:
        # computed and exchanged in the autocast dtype; fp8 from the launch config autocasts to bf16)
        kv_per_token = model_kv_bytes_per_token(base, half) / tp_head_split(base, self.atac_tp_size)  # its heads' K/V
        self.atac_sharder = BatchSharder(
            config, cp_rank=self.cp_rank, cp_group=self.cp_group, kv_bytes_per_token=kv_per_token,
            cost_model=config.cost_model(base.config, dtype_bytes=kv_element_bytes(base, half)),
            device_type=self.args.device.type,
            tp_group=self.accelerator.torch_device_mesh["tp"].get_group() if self.atac_tp_size > 1 else None,
        )
        self.atac_sharder.bind_model(model, position_limit)
        self._atac_base = base  # the model every check above ran on: each step must run it (check_step_model)
        self.atac_sampler = None
        self._atac_resume_dir: str | None = None
        self._atac_docs_trained = 0  # documents in the training packs of this rank (train_samples_per_second)
        self._atac_stream_init()

    # ------------------------------------------------------------------ data
    def _atac_seed(self) -> int:
        return int(self.args.data_seed if self.args.data_seed is not None else self.args.seed)

    def _atac_loader_kwargs(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"num_workers": self.args.dataloader_num_workers,
                                 "pin_memory": self.args.dataloader_pin_memory}
        if self.args.dataloader_num_workers > 0:
            extra["persistent_workers"] = self.args.dataloader_persistent_workers
            extra["prefetch_factor"] = self.args.dataloader_prefetch_factor
        return extra

    def _atac_loader(self, dataset: Any, *, grad_accum: int, shuffle: bool | None, prepare: bool = True):
        if is_streaming_dataset(dataset):  # resumable streaming packer (training: _atac_stream_train_loader)
            loader, _packed = self._atac_stream_build(dataset, grad_accum)
            return self.accelerator.prepare(loader), None
        extra = self._atac_loader_kwargs()
        # Trainer sizes every epoch (and a resume's skip) by the first epoch's len: every epoch gets as many packs
        loader, sampler = build_packed_dataloader(
            dataset, self.atac_config, num_replicas=self.dp_size, grad_accum=grad_accum, seed=self._atac_seed(),
            shuffle=shuffle, cost_model=self.atac_sharder.cost_model, collate_fn=self.data_collator,
            progress=False if self.args.disable_tqdm else None, fixed_epoch_length=True, **extra)
        return (self.accelerator.prepare(loader) if prepare else loader), sampler

    def get_train_dataloader(self):
        """Prepared DataLoader of WFAP packs; one window = DP replicas x gradient-accumulation packs."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if is_streaming_dataset(self.train_dataset):  # restored from the checkpoint on a resume (stream_state)
            return self._atac_stream_train_loader()
        restored, self._atac_sampler_restored = self._atac_sampler_restored, None
        loader, sampler = restored or self._atac_train_loader(prepare=False)  # restored: by train(), on a resume
        self.atac_sampler = sampler
        if restored is None and self._atac_sampler_saved is not None:  # a second loader of the same train() call
            sampler.load_state_dict(self._atac_sampler_saved)
        return self.accelerator.prepare(loader)

    def _atac_train_loader(self, prepare: bool = True):
        # train_sampling_strategy="sequential" keeps the data order, as Trainer's SequentialSampler does
        sequential = _sampling_strategy(self.args) == "sequential"
        return self._atac_loader(self.train_dataset, grad_accum=self.args.gradient_accumulation_steps,
                                 shuffle=False if sequential else None, prepare=prepare)

    def get_eval_dataloader(self, eval_dataset: Any = None):
        """Prepared DataLoader of WFAP packs of the eval set, not shuffled (samples keep their order within a
        pack; the packs follow the packer's plan, not the data order)."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        kind = f"eval:{eval_dataset}" if isinstance(eval_dataset, str) else "eval"
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = self.eval_dataset
        check_dataset_columns(eval_dataset, name="eval_dataset", streaming=True)
        return self._atac_eval_loader(eval_dataset, kind)

    def _atac_eval_loader(self, dataset: Any, kind: str):
        """One prepared loader per kind (eval, test): reused for the same dataset with persistent workers, as Trainer
        does; else made again and the one it replaces released (its plan, its workers: _hf_compat 9)."""
        held = self.__dict__.setdefault("_atac_eval_loaders", {})
        if kind in held:
            dataset_then, loader, sampler = held.pop(kind)
            if dataset_then is dataset and self.args.dataloader_persistent_workers and self.args.dataloader_num_workers:
                held[kind] = (dataset, loader, sampler)
                return loader
            release_loader(self.accelerator, loader)
        loader, sampler = self._atac_loader(dataset, grad_accum=1, shuffle=False)  # (its packs: predictions_by_sample)
        held[kind] = (dataset, loader, sampler)
        return loader

    def get_test_dataloader(self, test_dataset: Any):
        """Prepared DataLoader of WFAP packs of the test set (``predict``), not shuffled (one row per pack, in the
        packer's order), packed and capped at ``max_tokens`` like the eval set."""
        check_dataset_columns(test_dataset, name="test_dataset", streaming=True)
        return self._atac_eval_loader(test_dataset, "test")

    def evaluation_loop(self, *args: Any, **kwargs: Any):
        """Trainer's loop (``evaluate`` and ``predict``) with ``accelerator.gather``, not ``gather_for_metrics``
        (Trainer's reset after every loop), which would drop the last packs as "duplicates" at the end of the loader.
        Under CP or TP every rank of a replica returns the same pack's loss and rows: gathered over the DP group
        only (:func:`~atac_hf.integrations.predictions.replica_gather`)."""
        shared = self.atac_config.cp_size > 1 or self.atac_tp_size > 1
        self.gather_function = replica_gather(self) if shared else self.accelerator.gather
        try:
            return super().evaluation_loop(*args, **kwargs)
        finally:
            self.gather_function = self.accelerator.gather

    # ------------------------------------------------------------------ the CP hook
    def _prepare_context_parallel_inputs(self, model: torch.nn.Module, inputs: dict[str, Any]):
        """Plan and shard the full packed batch (Trainer already counted ``num_items_in_batch`` on it). The caller,
        not model.training: Trainer shards before model.train(); a model no wrapper holds stays in eval mode."""
        if getattr(self, "_atac_presharded", None) is not None:  # sharded by sharded_prediction_step already
            return contextlib.nullcontext, inputs
        training = bool(getattr(self, "_atac_training_step", False))
        local = self.atac_sharder(inputs, record=training)
        self._atac_targets = {k: local[k].clone() for k in ("labels", "shift_labels")  # (check_target_edits)
                              if isinstance(local.get(k), torch.Tensor)}
        if training:
            self._atac_docs_trained += self.atac_sharder.last_stats.num_docs
        if self.atac_config.cp_size > 1 and "num_items_in_batch" in local:  # used where an override drops Trainer's
            local["num_items_in_batch"] = local["num_items_in_batch"] / self.atac_config.cp_size  # count: each pack's
            # mean, as on one device (a new value: the batch's own count, a tensor maybe, stays as it was)
        return contextlib.nullcontext, local

    def _track_num_input_tokens(self, inputs):
        # Trainer sums the count over the world: count each replica's full pack once, on its first CP and
        # TP rank (not the tokens each rank holds: a pack shorter than cp_size is padded to one per rank)
        main = getattr(self.model, "main_input_name", "input_ids")
        ids = inputs.get(main)
        if (self.atac_config.cp_size > 1 or self.atac_tp_size > 1) and isinstance(ids, torch.Tensor):
            inputs = {k: v for k, v in inputs.items() if k != main and k != "attention_mask"}
            inputs[main] = ids if self.cp_rank == 0 and self.atac_tp_rank == 0 else ids[:, :0]
        return super()._track_num_input_tokens(inputs)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """Trainer's estimate for the full pack, divided by ``cp_size x tp_size`` (each rank computes its share)."""
        return super().floating_point_ops(inputs) // (self.atac_config.cp_size * self.atac_tp_size)

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], *args: Any, **kwargs: Any):
        """Trainer's step; with ``tp_size > 1`` the gradients are averaged over dp x cp at each
        gradient-sync step (Accelerate wraps a TP model in no DDP; Trainer has scaled the loss by
        ``world / tp_size``, so the mean is the sum of the CP and DP shares)."""
        check_step_model(self, model, training=True)
        watch_step_forwards(self, model)  # a loss from self.model outside the step's DDP wrapper: refused
        install_loss_override_check(self, self.atac_config.cp_size)  # also one set on the instance after __init__
        check_late_loss_settings(self, self.atac_config.cp_size)
        self._atac_training_step = True
        unused = UnusedParameterCheck("TrainingArguments(ddp_find_unused_parameters=True)")
        unused.before((model,) if self.atac_config.cp_size > 1 and self.accelerator.sync_gradients else ())
        try:
            loss = super().training_step(model, inputs, *args, **kwargs)
        finally:
            self._atac_training_step = False
        unused.after()
        if self.atac_tp_size > 1 and self.accelerator.sync_gradients:
            sync_tp_gradients(model, dp_cp_group(self.accelerator.torch_device_mesh))
        return loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Trainer's step on this rank's shard; under CP the pack's loss (and, with predictions, its logits in row
        order and labels) on every CP rank (:func:`~atac_hf.integrations.predictions.full_row_predictions`)."""
        check_step_model(self, model, training=False)
        check_label_names(self, inputs)
        install_loss_override_check(self, self.atac_config.cp_size)
        check_late_loss_settings(self, self.atac_config.cp_size)
        out = sharded_prediction_step(self, ATACTrainer, super().prediction_step, model, inputs, prediction_loss_only,
                                      ignore_keys)  # (TRL's SFTTrainer's step too, after this one in the MRO)
        shared = self.atac_config.cp_size > 1 and isinstance(out, tuple) and len(out) == 3  # (Trainer's contract)
        return full_row_predictions(self, inputs, out, not prediction_loss_only) if shared else out

    # ------------------------------------------------------------------ logging
    def _finalize_training(self, trial: Any, num_train_samples: Any, start_time: float, *args: Any, **kwargs: Any):
        # Trainer counts samples as steps x per_device_train_batch_size x ...: a batch is one pack here.
        # Report the documents (samples, fragments counted apart) really trained, over the DP replicas.
        docs = torch.tensor(float(self._atac_docs_trained), dtype=torch.float64, device=self.args.device)
        if self.args.world_size > 1 and dist.is_initialized():
            dist.all_reduce(docs)
        # every CP and TP rank of a replica saw the same packs
        real = float(docs.item()) / (self.atac_config.cp_size * self.atac_tp_size)
        initial = getattr(self, "_initial_global_step", None)  # transformers < 5.19: reported as given
        # Trainer reports num_train_samples x steps run / max_steps: hand it the figure that gives `real`
        steps = None if initial is None else max(self.state.global_step - initial, 1)
        num_train_samples = real if steps is None else real * max(self.state.max_steps, 1) / steps
        self._atac_docs_trained = 0
        if torch.is_tensor(getattr(self, "_tr_loss", None)) and self.args.world_size > 1 and dist.is_initialized():
            dist.all_reduce(self._tr_loss)  # the steps since the last log: each rank's share under CP, so the mean
            self._tr_loss /= self.args.world_size  # over the world, as the logs take it (train_loss was rank-local)
        return super()._finalize_training(trial, num_train_samples, start_time, *args, **kwargs)

    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> None:
        # every rank runs this together: the only place where log() may average over the world
        self._atac_collective_log = True
        try:
            return super()._maybe_log_save_evaluate(*args, **kwargs)
        finally:
            self._atac_collective_log = False

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's ``log`` plus ``atac/imbalance``, ``atac/kv_mb``, ``atac/planner_ms`` on training logs.

        The figures are means over the micro-batches since the last training log, over all ranks
        (every DP replica's packs) when called from the training loop, else over this rank's.
        """
        if "loss" in logs and not any(k.startswith("eval_") for k in logs):
            summary = self.atac_sharder.pop_summary()
            vals = torch.tensor([summary.get("imbalance", 0.0), summary.get("kv_mb", 0.0),
                                 summary.get("planner_ms", 0.0), 1.0 if summary else 0.0],
                                dtype=torch.float64, device=self.args.device)
            if getattr(self, "_atac_collective_log", False) and self.args.world_size > 1 and dist.is_initialized():
                dist.all_reduce(vals)
            if vals[3] > 0:
                logs["atac/imbalance"] = float(vals[0] / vals[3])
                logs["atac/kv_mb"] = float(vals[1] / vals[3])
                logs["atac/planner_ms"] = float(vals[2] / vals[3])
        super().log(logs, start_time)

    # ------------------------------------------------------------------ checkpoints
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        self._atac_resume_dir = resume_from_checkpoint or None
        try:
            if self._atac_resume_dir is not None and is_streaming_dataset(self.train_dataset):
                self._atac_stream_check_resume(self._atac_resume_dir)  # before Trainer loads anything
            elif self._atac_resume_dir is not None and self.train_dataset is not None:
                self._atac_sampler_check_resume(self._atac_resume_dir)  # the same for the WFAP sampler
            release_eval_preparation(self)  # an evaluate() before train() must not keep DDP off
            record_wrap_trainable(self)  # which parameters DDP sums, taken when it wraps the model
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self._atac_resume_dir = None
            self._atac_stream_end_train()
            drain_gloo_workers()  # before a group can be freed: _hf_compat (8)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # with TP every rank takes part in save_pretrained's gather of the shards (DTensor.full_tensor
        # and a barrier), as Trainer does for models sharded at load time; rank 0 writes
        if getattr(self, "atac_tp_size", 1) <= 1:
            return super()._save(output_dir, state_dict)
        if state_dict is None:  # gathered here, tied weights as one tensor (save_pretrained drops the alias)
            state_dict = full_state_dict(self.model)
        flag = self.is_distributed_loading_by_transformers
        self.is_distributed_loading_by_transformers = True
        try:
            return super()._save(output_dir, state_dict)
        finally:
            self.is_distributed_loading_by_transformers = flag

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        output_dir = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self._atac_save_stream_state(output_dir)
        self._atac_save_sampler_state(output_dir)

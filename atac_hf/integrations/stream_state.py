"""Exact resume of a streaming run in ``ATACTrainer``, from a checkpoint in any pass of the stream;
and the WFAP sampler's state of a map-style run (``atac_sampler.json``), checked and loaded the same
way, before Trainer loads anything.

A streaming train set is packed by a :class:`~atac_hf.packing.data.iterable.PackedIterableDataset`
on every process (Accelerate deals its rows round-robin to the DP replicas). Trainer numbers
the passes of a stream of unknown length as epochs, but on resume it computes the epoch and the
batches to skip from ``global_step`` alone, as if the first pass never ended: its replay is
right inside the first pass only. So, like the WFAP sampler's state for a map-style dataset,
every checkpoint holds the packed stream's position (``atac_stream.json``: its pass, the rows
the training loop consumed in it - all replicas together -, the packer state, and the
settings it was packed with), and a resume restores it and lets Trainer skip nothing:

* save: each process counts the micro-batches the loop drew from the current pass (the loader
  prefetches: the dataset's own row count runs ahead); the global position is that count x
  the DP size (every replica gets as many rows, the pass ending on a multiple of them);
* resume (``train``, before Trainer loads anything, so a refused state changes nothing): the
  file's settings are checked against this run (``max_tokens``, DP size, gradient
  accumulation, then every packing setting), the state is loaded into a fresh packed stream
  (positioned in its pass, ``set_epoch`` on the source), and ``args.ignore_data_skip`` is
  set for that ``train`` call (put back after it); the checkpoint's RNG state is loaded after
  the first batch is drawn, where Trainer's own skip would load it.

Not exact, with a warning naming the case: ``dataloader_num_workers=1`` (the stream is packed
in the worker process, whose position the main process cannot read: nothing is saved, and a
resume falls back to Trainer's replay, exact in the first pass only), and a checkpoint without
``atac_stream.json`` (the same replay). ``ignore_data_skip=True`` restarts the stream, as
Trainer does with any dataset.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

__all__ = ["SAMPLER_STATE_NAME", "STREAM_STATE_NAME", "StreamResumeMixin"]

SAMPLER_STATE_NAME = "atac_sampler.json"
STREAM_STATE_NAME = "atac_stream.json"
_FORMAT = "atac-hf/trainer-stream/v1"


def stream_dispatch(args: Any, streaming: bool = True) -> None:
    """Streaming datasets: every process packs the stream itself and Accelerate deals the rows
    (``dispatch_batches=False``); rows differ in length, so a dispatcher could not concatenate them.
    Map-style datasets (``streaming=False``): the WFAP sampler gives every CP rank of a replica the
    same packs; a dispatcher would deal them over the CP ranks (each would shard another pack)."""
    acc = args.accelerator_config
    if not streaming:
        for flag in ("dispatch_batches", "split_batches"):
            if getattr(acc, flag, None):
                raise ValueError(f"accelerator_config.{flag}=True: ATACTrainer's WFAP sampler deals each DP replica "
                                 "its own packs, every CP rank of it the same ones (a batch is one packed row); a "
                                 "dispatcher would deal them over the CP ranks and a split would cut the row. Set "
                                 f"{flag} to None or False")
        return
    if getattr(acc, "dispatch_batches", None):
        raise ValueError("accelerator_config.dispatch_batches=True with a streaming dataset: ATACTrainer packs the "
                         "stream on every process and deals rows round-robin; set dispatch_batches to None or False")
    if getattr(acc, "split_batches", False):
        raise ValueError("accelerator_config.split_batches=True with a streaming dataset: a batch is one packed row "
                         "and cannot be split; set split_batches=False")
    acc.dispatch_batches = False


class StreamResumeMixin:
    """The streaming-resume part of ``ATACTrainer`` (placed before ``Trainer`` in its bases)."""

    def _atac_stream_init(self) -> None:
        self.atac_stream = None  # the PackedIterableDataset behind the train loader, when its state can be saved
        self._atac_stream_count = (0, 0)  # (pass, micro-batches this process drew from it)
        self._atac_stream_restored: tuple[Any, Any] | None = None  # (loader, packed) loaded from a checkpoint
        self._atac_stream_rng: str | None = None  # checkpoint whose RNG state waits for the first batch
        self._atac_stream_defer_rng = False
        self._atac_skip_flag: bool | None = None  # args.ignore_data_skip to put back after train()
        self._atac_unskipped_at: int | None = None  # the global_step a map-style resume with ignore_data_skip began at
        self._atac_sampler_restored: tuple[Any, Any] | None = None  # (loader, sampler) a resume's train() built
        self._atac_sampler_saved: dict | None = None  # the checkpoint's sampler state it loaded

    # ------------------------------------------------------------------ building
    def _atac_stream_build(self, dataset: Any, grad_accum: int | None = None):
        """(DataLoader, its PackedIterableDataset) of a streaming dataset, not yet prepared
        (``grad_accum``: default the training's)."""
        from .data import build_streaming_dataloader

        ga = self.args.gradient_accumulation_steps if grad_accum is None else grad_accum
        return build_streaming_dataloader(
            dataset, self.atac_config, num_replicas=self.dp_size, grad_accum=ga,
            cost_model=self.atac_sharder.cost_model, collate_fn=self.data_collator, **self._atac_loader_kwargs())

    def _atac_stream_train_loader(self):
        """The prepared train loader of a streaming dataset: the restored stream on a resume."""
        if self._atac_stream_restored is not None:
            loader, packed = self._atac_stream_restored
            self._atac_stream_restored = None
            self._atac_skip_flag = bool(self.args.ignore_data_skip)
            self.args.ignore_data_skip = True  # the stream is positioned already: Trainer must not skip again
            self._atac_stream_defer_rng = True
            self._atac_stream_count = (packed.epoch, packed.num_rows // max(self.dp_size, 1))
        else:
            loader, packed = self._atac_stream_build(self.train_dataset)
            self._atac_stream_count = (0, 0)
        # with a worker the stream is packed in the worker's copy: the main process cannot save its position
        self.atac_stream = packed if self.args.dataloader_num_workers == 0 else None
        return self.accelerator.prepare(loader)

    # ------------------------------------------------------------------ resume
    def _atac_stream_check_resume(self, checkpoint: str) -> None:
        """Read, check and load the checkpoint's stream state before Trainer touches anything
        (a refusal raises here and changes nothing); warn where the resume cannot be exact."""
        if self.args.ignore_data_skip:
            return  # Trainer's meaning: skip nothing, the stream starts over
        path = os.path.join(checkpoint, STREAM_STATE_NAME)
        if self.args.dataloader_num_workers > 0:
            self._atac_stream_warn(
                f"dataloader_num_workers={self.args.dataloader_num_workers}: the stream is packed in the DataLoader "
                "worker, whose position a checkpoint cannot hold, so Trainer replays the stream up to the "
                "checkpoint, which is exact inside the stream's first pass only (from a later pass the run restarts "
                "at a pass start); set dataloader_num_workers=0 to save and resume the stream's position exactly")
            return
        if not os.path.isfile(path):
            self._atac_stream_warn(
                f"{path} not found (a checkpoint saved by an earlier atac-hf, or with dataloader_num_workers=1): "
                "Trainer replays the stream up to the checkpoint, which is exact inside the stream's first pass "
                "only (from a later pass the run restarts at a pass start); checkpoints saved with "
                "dataloader_num_workers=0 resume exactly in any pass")
            return
        saved = read_json(path, "stream state")
        self._atac_stream_check_settings(saved, path)
        loader, packed = self._atac_stream_build(self.train_dataset)
        try:
            packed.load_state_dict(saved["stream"], roll_over=True)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        if packed.num_rows % max(self.dp_size, 1):
            raise ValueError(f"{path}: {packed.num_rows} rows consumed is not a multiple of dp_size={self.dp_size} "
                             "(a truncated or edited checkpoint?)")
        self._atac_stream_restored = (loader, packed)

    def _atac_stream_check_settings(self, saved: Any, path: str) -> None:
        if not isinstance(saved, dict) or saved.get("format") != _FORMAT or not isinstance(saved.get("stream"), dict):
            raise ValueError(f"{path}: not an ATACTrainer stream state (expected format {_FORMAT!r} with a 'stream' "
                             "mapping); resume from a checkpoint ATACTrainer saved")
        self._atac_check_layout(saved, path, "stream state")

    def _atac_layout(self) -> dict[str, int]:
        """The settings a resume keeps: the pack size and the packs of an optimizer step (Trainer's skip counts
        steps, not packs: ``global_step x gradient_accumulation_steps`` micro-batches a replica)."""
        return {"max_tokens": int(self.atac_config.max_tokens), "dp_size": int(self.dp_size),
                "gradient_accumulation_steps": int(self.args.gradient_accumulation_steps)}

    def _atac_check_layout(self, saved: dict, path: str, what: str, missing_ok: bool = False) -> None:
        """Refuse a state saved with another :meth:`_atac_layout` (``missing_ok``: a setting the state does not
        hold, as in a sampler state of an earlier atac-hf, passes)."""
        cp, tp = self.atac_config.cp_size, getattr(self, "atac_tp_size", 1)
        why = {
            "max_tokens": "the packs were planned for that pack size: set ATACConfig(max_tokens={v}) (or "
                          "ATAC_MAX_TOKENS={v})",
            "dp_size": "the packs were dealt to that many data-parallel replicas: " + launch_hint(cp, tp),
            "gradient_accumulation_steps": "a window holds a multiple of dp_size x gradient_accumulation_steps packs, "
                                           "and Trainer skips that many a step: set "
                                           "TrainingArguments(gradient_accumulation_steps={v})",
        }
        if found := layout_mismatch(saved, self._atac_layout(), missing_ok):
            key, v, here = found
            raise ValueError(f"{path}: the {what} was saved with {key}={v!r}, this run has {key}={here}; "
                             f"it resumes only with {key}={v!r}: {why[key].format(v=v)} to resume from this "
                             "checkpoint, or pass TrainingArguments(ignore_data_skip=True) to skip no data (the data "
                             "order starts over), or train without resume_from_checkpoint")

    # ------------------------------------------------------------------ map-style datasets: the WFAP sampler
    def _atac_save_sampler_state(self, output_dir: str) -> None:
        """``atac_sampler.json``: the sampler's state at the packs of this epoch the loop consumed (all DP
        replicas together; the loader prefetches), and :meth:`_atac_layout`."""
        if self.atac_sampler is None or not self.args.should_save or not os.path.isdir(output_dir):
            return
        # Trainer rounds up: the last step of an epoch may hold fewer micro-batches
        per_replica = len(self.atac_sampler) // max(self.dp_size, 1)
        steps_per_epoch = max(-(-per_replica // self.args.gradient_accumulation_steps), 1)
        done = (self.state.global_step % steps_per_epoch) * self.args.gradient_accumulation_steps * self.dp_size
        state = {**self.atac_sampler.state_dict(position=min(done, len(self.atac_sampler))), **self._atac_layout()}
        if self._atac_unskipped_at is not None and self._atac_unskipped_at % steps_per_epoch:
            # this run's epochs begin at that step + k x steps_per_epoch, where Trainer's skip (by global_step alone)
            # does not look: a resume from this checkpoint would skip other packs than those trained
            state["epoch_start_offset"] = self._atac_unskipped_at % steps_per_epoch
        with open(os.path.join(output_dir, SAMPLER_STATE_NAME), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1)

    def _atac_sampler_check_resume(self, checkpoint: str) -> None:
        """Read and check the checkpoint's sampler state and load it into this run's sampler before Trainer loads
        anything (a refusal changes nothing); the loader is kept for ``get_train_dataloader``. The epoch and seed
        come from the state; Trainer itself skips the batches of the epoch already trained, so the sampler starts
        at 0. ``ignore_data_skip``: nothing is loaded (the epoch Trainer starts at is planned afresh)."""
        if not os.path.isdir(checkpoint):  # (no checkpoint there: Trainer says so)
            return
        if self.args.ignore_data_skip:
            self._atac_unskipped_at = _global_step(checkpoint)
            return
        path = os.path.join(checkpoint, SAMPLER_STATE_NAME)
        state = None
        if os.path.isfile(path):
            state = read_json(path, "sampler state")
            if not isinstance(state, dict):
                raise ValueError(f"{path}: not a WFAPBatchSampler state (a JSON object); resume from a checkpoint "
                                 "ATACTrainer saved")
            self._atac_check_layout(state, path, "sampler state", missing_ok=True)
            if state.get("epoch_start_offset"):
                raise ValueError(
                    f"{path}: this checkpoint comes from a run resumed with ignore_data_skip=True at a step that is "
                    f"not an epoch start (its epochs begin {state['epoch_start_offset']} optimizer steps after where "
                    "Trainer, counting global_step alone, places them): resuming it would skip other packs than those "
                    "trained. Pass TrainingArguments(ignore_data_skip=True) (the checkpoint's epoch starts over), or "
                    "resume from a checkpoint saved before that resume")
            state = {**state, "position": 0}
        loader, sampler = self._atac_train_loader(prepare=False)
        if state is None:
            warnings.warn(f"{path} not found (a checkpoint of an earlier atac-hf, or the file removed): resuming with a "
                          "fresh WFAP sampler, whose packs match the checkpoint's only with the same dataset, seed, "
                          "max_tokens, DP size and gradient accumulation, none of which can be checked", stacklevel=3)
        else:
            try:
                sampler.load_state_dict(state)
            except ValueError as e:
                raise ValueError(f"{path}: {e}. Resume with the train_dataset, ATACConfig and model (its cost model) "
                                 "of the checkpoint's run, or pass TrainingArguments(ignore_data_skip=True) to start "
                                 "the checkpoint's epoch over with this run's packs") from None
        self._atac_sampler_restored, self._atac_sampler_saved = (loader, sampler), state

    def _atac_stream_warn(self, message: str) -> None:
        if self.args.process_index == 0:
            warnings.warn(f"resuming a streaming run: {message}", stacklevel=3)

    def _atac_stream_end_train(self) -> None:
        """The end of a ``train()`` call: what its resume restored (a stream's or a sampler's) is dropped."""
        self._atac_sampler_restored = self._atac_sampler_saved = self._atac_unskipped_at = None
        self._atac_stream_restored = None
        self._atac_stream_defer_rng = False
        self._atac_stream_rng = None
        if self._atac_skip_flag is not None:
            self.args.ignore_data_skip = self._atac_skip_flag
            self._atac_skip_flag = None

    # ------------------------------------------------------------------ Trainer hooks
    def _load_rng_state(self, checkpoint: str | None) -> None:
        # a restored stream: Trainer (skipping nothing) would load the RNG before drawing the first
        # batch; its own skip loads it after, which the uninterrupted run matches
        if self._atac_stream_defer_rng and checkpoint is not None:
            self._atac_stream_defer_rng = False
            self._atac_stream_rng = checkpoint
            return None
        return super()._load_rng_state(checkpoint)

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any):
        """Trainer's; counts the micro-batches drawn from the current pass of a stream."""
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        packed = self.atac_stream
        if packed is not None:
            epoch, drawn = self._atac_stream_count
            if packed.epoch != epoch:  # the first batch of a new pass
                epoch, drawn = packed.epoch, 0
            self._atac_stream_count = (epoch, drawn + len(batches))
        if self._atac_stream_rng is not None:
            checkpoint, self._atac_stream_rng = self._atac_stream_rng, None
            super()._load_rng_state(checkpoint)
        return batches, num_items

    def _atac_save_stream_state(self, output_dir: str) -> None:
        packed = self.atac_stream
        if packed is None or not self.args.should_save or not os.path.isdir(output_dir):
            return
        rows = self._atac_stream_count[1] * max(self.dp_size, 1)  # this pass's rows, all replicas together
        state = {"format": _FORMAT, "max_tokens": int(self.atac_config.max_tokens), "dp_size": int(self.dp_size),
                 "gradient_accumulation_steps": int(self.args.gradient_accumulation_steps),
                 "cp_size": int(self.atac_config.cp_size), "stream": packed.state_dict(num_rows=rows)}
        with open(os.path.join(output_dir, STREAM_STATE_NAME), "w", encoding="utf-8") as f:
            json.dump(state, f)


def _global_step(checkpoint: str) -> int | None:
    """The ``global_step`` of a checkpoint's ``trainer_state.json`` (None where it cannot be read)."""
    try:
        state = read_json(os.path.join(checkpoint, "trainer_state.json"), "trainer state")
    except ValueError:
        return None
    step = state.get("global_step") if isinstance(state, dict) else None
    return step if isinstance(step, int) else None


def read_json(path: str, what: str) -> Any:
    """The JSON document at ``path``; a ValueError naming it and ``what`` it should be where it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable {what} ({e}); resume from an intact checkpoint") from None


def layout_mismatch(saved: dict, here: dict, missing_ok: bool = False) -> tuple[str, Any, Any] | None:
    """The first setting of a run's layout ``here`` that ``saved`` holds otherwise, as ``(key, saved value, this
    run's value)``; None where none does (``missing_ok``: a setting ``saved`` lacks matches)."""
    for key, value in here.items():
        if saved.get(key) != value and not (missing_ok and key not in saved):
            return key, saved.get(key), value
    return None


def launch_hint(cp: int, tp: int) -> str:
    """How to launch a DP size ``{v}`` (a format field) at this CP and TP size."""
    return f"launch world_size = dp_size x cp_size x tp_size = {{v}} x {cp} x {tp} processes"

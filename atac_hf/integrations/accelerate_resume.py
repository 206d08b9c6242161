"""The data layout of an ``ATACAccelerator`` checkpoint, checked where a resume skips batches.

``accelerator.skip_first_batches(loader, n)`` after ``load_state`` is exact only where the epoch's packs are those of
the checkpoint's run: the WFAP sampler plans and deals an epoch's packs by ``max_tokens``, the DP size and the
gradient accumulation, so skipping ``n`` batches of another layout's epoch trains some samples twice and others never
(red-team 34: 18 documents twice at DP 1 x CP 2 from a DP 2 checkpoint, silently). ``save_state`` writes the layout to
``atac_layout.json`` beside Accelerate's files, ``load_state`` reads it back, and a skip on a packed loader under
another layout is refused, naming the setting (the refused skip changes nothing). A checkpoint without the file (an
earlier atac-hf) is not checked.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from .stream_state import launch_hint, layout_mismatch, read_json

__all__ = ["LAYOUT_FILE", "LayoutResumeMixin"]

LAYOUT_FILE = "atac_layout.json"


class LayoutResumeMixin:
    """``save_state`` / ``load_state`` / ``skip_first_batches`` of ``ATACAccelerator`` (before ``Accelerator``)."""

    def _atac_layout(self) -> dict[str, int]:
        return {"max_tokens": int(self.atac_config.max_tokens), "dp_size": int(self.dp_size),
                "gradient_accumulation_steps": int(self.gradient_accumulation_steps)}

    def save_state(self, output_dir: str | None = None, *args: Any, **kwargs: Any):
        """``Accelerator.save_state``, and ``atac_layout.json`` (max_tokens, DP size, gradient accumulation).

        Raises:
            ValueError: with ``tp_size > 1`` (before anything is written): Accelerate cannot save a model
                tensor-parallelised on a sub-mesh of the world, nor its optimizer's shards for a resume.
        """
        if getattr(self, "tp_size", 1) > 1:
            raise ValueError(f"save_state with tp_size={self.tp_size}: Accelerate cannot save the TP shards of a model "
                             "atac-hf split over a sub-mesh, so TP runs are not resumable from checkpoints; save the "
                             "weights with atac_hf.integrations.tensor_parallel.full_state_dict(model) on every rank (a "
                             "collective) and save_pretrained(dir, state_dict=...) on the main process, or set "
                             "tp_size=1 (parallelism_config) to resume")
        location = super().save_state(output_dir, *args, **kwargs)
        if self.is_main_process and location is not None and os.path.isdir(location):  # (a str or a Path)
            with open(os.path.join(location, LAYOUT_FILE), "w", encoding="utf-8") as f:
                json.dump(self._atac_layout(), f)
        return location

    def load_state(self, input_dir: str | None = None, *args: Any, **kwargs: Any):
        """``Accelerator.load_state``; the checkpoint's ``atac_layout.json`` is kept for :meth:`skip_first_batches`
        (read first: an unreadable one is refused before Accelerate loads anything)."""
        folder = _checkpoint_dir(self, input_dir)
        path = None if folder is None else os.path.join(folder, LAYOUT_FILE)
        layout = None
        if path is not None and os.path.isfile(path):
            saved = read_json(path, "layout")
            layout = (path, saved if isinstance(saved, dict) else {})
        out = super().load_state(input_dir, *args, **kwargs)
        self._atac_loaded_layout = layout
        return out

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0):
        """``Accelerator.skip_first_batches``; on a packed loader, refused after a :meth:`load_state` of a checkpoint
        saved with another max_tokens, DP size or gradient accumulation (the batches skipped would not be those
        trained)."""
        from ..packing.data.sampler import WFAPBatchSampler

        loaded = getattr(self, "_atac_loaded_layout", None)
        sampler = getattr(dataloader, "batch_sampler", None)
        sampler = getattr(sampler, "batch_sampler", sampler)  # Accelerate's BatchSamplerShard, where it wraps one
        if loaded is not None and num_batches and isinstance(sampler, WFAPBatchSampler):
            path, saved = loaded
            cp, tp = self.atac_config.cp_size, getattr(self, "tp_size", 1)
            how = {"max_tokens": "ATACConfig(max_tokens={v})", "dp_size": launch_hint(cp, tp),
                   "gradient_accumulation_steps": "ATACAccelerator(gradient_accumulation_steps={v})"}
            if found := layout_mismatch(saved, self._atac_layout(), missing_ok=True):
                key, v, here = found
                raise ValueError(
                    f"skip_first_batches({num_batches}): {path} was saved with {key}={v!r}, this run has "
                    f"{key}={here}: the epoch's packs are planned and dealt for the checkpoint's layout, so skipping "
                    f"{num_batches} batches of this one would train some samples twice and others never. Resume "
                    f"with {key}={v!r} ({how[key].format(v=v)}), or start the epoch over without skip_first_batches")
        return super().skip_first_batches(dataloader, num_batches)


def _checkpoint_dir(accelerator: Any, input_dir: str | None) -> str | None:
    """The folder ``load_state(input_dir)`` reads: ``input_dir`` (``~`` expanded), or with automatic checkpoint
    naming the folder under ``project_dir/checkpoints`` whose name's first number is the largest (Accelerate's
    rule; equal numbers in listing order, as its stable sort); None where there is none (Accelerate then fails)."""
    if input_dir is not None:
        return os.path.expanduser(str(input_dir))
    config = getattr(accelerator, "project_configuration", None)
    if not getattr(config, "automatic_checkpoint_naming", False):
        return None
    root = os.path.join(accelerator.project_dir, "checkpoints")
    try:
        names = os.listdir(root)
        numbers = [int(re.search("[0-9]+", name).group()) for name in names]
    except (OSError, AttributeError):  # no folder, or a name without a number: Accelerate's own load fails
        return None
    if not names:
        return None
    return os.path.join(root, names[max(range(len(names)), key=lambda i: (numbers[i], i))])  # (the last of ties)

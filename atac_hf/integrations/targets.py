"""The next-token targets of a packed batch, as the loss under ATP-CP trains them.

A target never crosses a document: the last token of a document has no next token in it
(:func:`~atac_hf.attention.build_shift_labels`), so a label at a document start is never a
target. Trainer and :func:`~atac_hf.integrations.sharder.count_targets` count targets before the
batch is sharded (the loss divides by that count), so the packed loaders pass every collator's
batch through :class:`DocumentTargets` first:

* labels at document starts become -100 (what our collator writes; a custom collator copying
  ``input_ids`` into ``labels`` does not), so that counting ``labels[..., 1:]`` counts exactly
  the targets the loss sums;
* a collator with a ``separator_id`` token (transformers' ``DataCollatorWithFlattening`` or
  :class:`~atac_hf.packing.PackedDataCollator` with ``separator_id`` set to a token id, e.g. EOS)
  asks that each document's last token predict it, as the unsharded model's plain shift of the
  row trains it: the batch gets those targets as ``shift_labels`` (the row's labels shifted left
  by one, -100 last), which Trainer counts and the sharded loss uses as given.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch

from ..attention.shard import IGNORE_INDEX
from ..packing.validate import InputTypeError
from .config_files import short_repr

__all__ = ["DocumentTargets", "document_start_positions"]


def document_start_positions(batch: Mapping[str, Any]) -> np.ndarray | None:
    """Flat (row-major) positions of every document's first token in a packed batch, or None where
    the batch does not say where its documents are (the sharder then refuses it, naming why)."""
    from ..attention import doc_lengths_from_batch

    try:
        lengths = doc_lengths_from_batch(batch)
    except (ValueError, TypeError):
        return None
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else np.zeros(0, np.int64)


class DocumentTargets:
    """``collate(features)`` with the batch's targets made what the loss trains (see the module doc).

    Args:
        collate: the packed-row collator; its ``separator_id`` (an int other than -100) asks that
            each document's last token predict that token.
    """

    def __init__(self, collate: Callable) -> None:
        if isinstance(collate, DocumentTargets):
            collate = collate.collate
        sep = getattr(collate, "separator_id", None)
        if sep is not None and (isinstance(sep, bool) or not isinstance(sep, (int, np.integer))):
            raise InputTypeError(f"{type(collate).__name__}.separator_id={short_repr(sep)} is not an int: it is the "
                                 f"label of each document start ({IGNORE_INDEX}: none, or a token id such as EOS)")
        self.collate = collate
        self.separator_id = None if sep is None or int(sep) == IGNORE_INDEX else int(sep)

    def __call__(self, features: Any) -> Any:
        batch = self.collate(features)
        self._check_rows(features, batch)
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        if not isinstance(labels, torch.Tensor) or labels.dim() != 2 or batch.get("shift_labels") is not None:
            return batch
        starts = document_start_positions(batch)
        if starts is None or int(starts[-1] if len(starts) else 0) >= labels.numel():
            return batch
        flat = labels.reshape(-1)
        idx = torch.as_tensor(starts, device=labels.device)
        if self.separator_id is not None:
            # the unsharded model's plain shift of each row: the separator at a document start is the
            # target of the token before it (the previous document's last), -100 after a row's last token
            shift = torch.full_like(labels, IGNORE_INDEX)
            shift[:, :-1] = labels[:, 1:]
            batch["shift_labels"] = shift
        elif bool((flat.index_select(0, idx) != IGNORE_INDEX).any()):
            flat = flat.clone()
            flat[idx] = IGNORE_INDEX
            batch["labels"] = flat.view_as(labels)
        return batch

    def _check_rows(self, features: Any, batch: Any) -> None:
        """Refuse a batch of pre-packed rows (features with ``seq_lengths``: a streaming dataset's packs) whose
        documents the collator did not keep (one that does not read ``seq_lengths``, e.g. transformers'
        ``DataCollatorWithFlattening``, makes each row one document: its documents would attend to each other)."""
        if not isinstance(batch, Mapping) or not isinstance(features, (list, tuple)) or not features or not all(
                isinstance(f, Mapping) and f.get("seq_lengths") is not None for f in features):
            return
        want = [int(n) for f in features for n in np.asarray(f["seq_lengths"]).reshape(-1) if int(n) > 0]
        from ..attention import doc_lengths_from_batch

        try:
            got = [int(n) for n in doc_lengths_from_batch(batch) if int(n) > 0]
        except (ValueError, TypeError):
            return  # (the sharder refuses a batch whose documents cannot be found, naming why)
        if got != want:
            raise ValueError(
                f"{type(self.collate).__name__} changed the documents of pre-packed rows: the rows hold documents of "
                f"{short_repr(want)} tokens (seq_lengths), the collated batch {short_repr(got)}. A streaming dataset "
                "reaches the collator as packed rows with seq_lengths, which this collator does not read, so the "
                "documents would attend to each other. Leave data_collator / collate_fn unset (the default "
                "PackedDataCollator reads seq_lengths) or pass PackedDataCollator(...)")

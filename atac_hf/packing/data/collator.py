"""Padding-free collator: a list of features -> one packed row (batch dim 1).

Output of :class:`PackedDataCollator` (``S`` = tokens in the row, ``D`` = documents):

=================  ==========  ======  ==================================================
key                shape       dtype   meaning
=================  ==========  ======  ==================================================
``input_ids``      (1, S)      int64   every document's tokens, concatenated
``labels``         (1, S)      int64   the tokens (or a feature's own ``labels``) with
                                       ``separator_id`` (-100) at each document start
``position_ids``   (1, S)      int64   restart at 0 for every document
``seq_lengths``    (D,)        int64   document lengths (sum = S), never 0
``cu_seqlens``     (D + 1,)    int32   flash-attn style offsets: 0, L0, L0 + L1, ...
``max_seqlen``     int                 longest document
``shift_labels``   (1, S)      int64   only with ``return_shift_labels`` or a token
                                       ``separator_id``: ``labels`` shifted left by
                                       one, -100 last
=================  ==========  ======  ==================================================

``input_ids``, ``labels`` and ``position_ids`` equal those of transformers'
``DataCollatorWithFlattening(return_position_ids=True)`` for plain samples.
``cu_seqlens``/``max_seqlen`` describe the *full* row; whoever shards the row over a
context-parallel group must replace them (the add-on's Trainer does).

Accepted features (mixed freely within one batch):

* a plain sample ``{"input_ids": [...], "labels": [...]?}``: one document;
* a packed row ``{"input_ids": flat, "seq_lengths": [...], "labels": flat?}`` (from
  :func:`atac_hf.packing.data.dataset.pack_dataset` or
  :class:`atac_hf.packing.data.iterable.PackedIterableDataset`): several documents;
* a fragment of a sample as returned by :class:`atac_hf.packing.data.sampler.SpanDataset`
  (already sliced: it is a plain sample to the collator). A fragment is its own
  document in the row: its positions restart at 0 and its first label is -100, since
  the tokens before it are in another row.

* a pre-packed row ``{"input_ids": flat, "position_ids": flat}`` without ``seq_lengths``
  (older TRL ``pack_dataset``, ``DataCollatorWithFlattening`` conventions): a new document
  starts at every ``position_ids`` entry 0 (and at the feature's first token); between
  restarts the positions must count up by one (other patterns are refused).
  ``seq_lengths``, where a feature has both, wins.

Several packed rows in one batch are concatenated into the one row with their document
boundaries kept, so ``DataLoader(batch_size=k)`` over pre-packed rows gives rows of up to
``k`` x the packing cap: use ``batch_size=1`` to keep the cap.

Per-token mask columns (never dropped silently):

* ``attention_mask``: a packed row has no padding to mask, so it must be all ones (a padded
  sample is refused, since its pad tokens would be trained on as tokens of the document).
* ``completion_mask`` / ``assistant_masks`` (TRL's SFT columns, 0/1 per token): in a
  feature without ``labels`` they build the labels as TRL does, the token where every
  present mask is 1 and -100 elsewhere (the document-start -100 still applies). A feature
  with ``labels`` keeps its own labels and the masks are not read.

Other keys are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..validate import InputTypeError, _is_int, _short, check_token_ids

__all__ = ["CollatorStats", "LOSS_MASK_COLUMNS", "PackedDataCollator", "doc_lengths_from_position_ids", "labels_from_masks"]

_RETURN_TENSORS = ("pt", "np")


@dataclass
class CollatorStats:
    """Running counters of one collator instance (per DataLoader worker process).

    Attributes:
        num_rows: packed rows produced.
        num_documents: documents placed in rows.
        num_tokens: tokens placed in rows.
        num_empty_skipped: zero-length documents dropped (a row never holds a 0-length document).
    """

    num_rows: int = 0
    num_documents: int = 0
    num_tokens: int = 0
    num_empty_skipped: int = 0


@dataclass(frozen=True, kw_only=True)
class PackedDataCollator:
    """Flatten a batch of features into one padding-free packed row.

    Use it as ``data_collator=`` of ``transformers.Trainer`` or ``collate_fn=`` of a
    ``DataLoader``. The configuration is frozen; only :attr:`stats` changes.

    Attributes:
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
        separator_id: label written at each document start (-100: ignored by the loss). A token id
            (e.g. EOS) is the target of every document's last token but a row's last, as the plain
            shift of the row trains it: the row then carries ``shift_labels`` too, so that a
            context-parallel loss (which never shifts across a document) trains it the same.
        return_seq_lengths: emit ``seq_lengths``, ``cu_seqlens`` and ``max_seqlen``.
            They travel to ``model(**batch)`` as extra keyword arguments (HF decoder
            models accept and ignore them); turn off for a model that rejects them.
        return_shift_labels: also emit ``shift_labels`` (next-token targets), built on
            the full row as context parallelism requires.
        stats: counters (rows, documents, tokens, skipped empty documents).
    """

    return_tensors: str = "pt"
    separator_id: int = -100
    return_seq_lengths: bool = True
    return_shift_labels: bool = False
    stats: CollatorStats = field(default_factory=CollatorStats, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.return_tensors not in _RETURN_TENSORS:
            raise ValueError(
                f"PackedDataCollator.return_tensors={self.return_tensors!r}; legal values: {list(_RETURN_TENSORS)}"
            )
        for name in ("return_seq_lengths", "return_shift_labels"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InputTypeError(f"PackedDataCollator.{name}={_short(getattr(self, name))} is not a bool: "
                                     f"pass True or False")
        sep = self.separator_id
        if not _is_int(sep) or not -2**63 <= sep < 2**63:
            raise InputTypeError(f"PackedDataCollator.separator_id={_short(sep)} is invalid: it must be an int64 "
                                 "label, -100 (the loss ignores document starts, the default) or a token id")
        if sep < 0 and sep != -100:  # any other negative label fails the loss at the first step
            raise ValueError(f"PackedDataCollator.separator_id={int(sep)} is invalid: it must be -100 (the loss "
                             "ignores document starts, the default) or a token id >= 0 (set separator_id)")
        if not isinstance(self.stats, CollatorStats):
            raise InputTypeError(f"PackedDataCollator.stats={_short(self.stats)} is not a CollatorStats: leave it "
                                 "unset (the collator keeps its own counters)")

    def __call__(self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None) -> dict[str, Any]:
        """Pack ``features`` into one row.

        Args:
            features: a list of mappings, each with ``input_ids`` (1-D ints) and optionally
                ``labels`` (same length) and ``seq_lengths`` (document lengths summing to
                ``len(input_ids)``).
            return_tensors: overrides :attr:`return_tensors` for this call.

        Returns:
            a dict with the keys and shapes in the module docstring.

        Raises:
            TypeError: ``features`` is not a list of mappings, or a token field that is not
                a 1-D sequence of ints (text, floats, bools, nested lists; an
                :class:`~atac_hf.packing.validate.InputTypeError`, also a ``ValueError``).
            ValueError: a feature without ``input_ids`` (the message lists its keys), labels,
                ``seq_lengths``, ``position_ids``, an ``attention_mask``, ``completion_mask`` or
                ``assistant_masks`` that disagree with ``input_ids``, a padded ``attention_mask``,
                a mask with values other than 0/1, ``position_ids`` that neither restart at 0 nor
                count up by one (names the feature),
                negative ``input_ids`` or lengths, negative labels other than -100, values beyond
                int64, or a batch in which
                every document is empty.
        """
        rt = self.return_tensors if return_tensors is None else return_tensors
        if rt not in _RETURN_TENSORS:
            raise ValueError(f"return_tensors={rt!r}; legal values: {list(_RETURN_TENSORS)}")
        if isinstance(features, Mapping) or not isinstance(features, Sequence):
            raise TypeError(
                f"PackedDataCollator expects a list of features (dicts), got {type(features).__name__}"
            )
        ids_parts: list[np.ndarray] = []
        label_parts: list[np.ndarray] = []
        doc_parts: list[np.ndarray] = []
        num_empty = 0
        for row, feature in enumerate(features):
            if not isinstance(feature, Mapping):
                raise TypeError(f"feature {row} is a {type(feature).__name__}, expected a dict with 'input_ids'")
            if "input_ids" not in feature:
                raise ValueError(
                    f"feature {row} has no 'input_ids'; keys found: {sorted(feature)} "
                    "(tokenize the text, or rename the token column to 'input_ids')"
                )
            ids = _as_1d_ints(feature["input_ids"], row, "input_ids")
            labels = feature.get("labels")
            if labels is not None:
                labels = _as_1d_ints(labels, row, "labels")
                if labels.shape[0] != ids.shape[0]:
                    raise ValueError(
                        f"feature {row}: labels has {labels.shape[0]} entries but input_ids has {ids.shape[0]}; "
                        "labels must have one entry per token (-100 where no loss). Fix the tokenization, or drop "
                        "the column (the labels are then built from input_ids)"
                    )
                bad = labels[(labels < 0) & (labels != -100)]
                if bad.size:  # the loss ignores -100 only: -1 fails there (CUDA: device assert); as BatchSharder
                    raise ValueError(f"feature {row}: labels holds {int(bad[0])}: labels must be token ids >= 0, or "
                                     "-100 where a token gets no loss (the only index the loss ignores); replace the "
                                     "other negative labels with -100 in the dataset")
            else:
                labels = labels_from_masks(feature, ids, where=f"feature {row}")
            mask = feature.get("attention_mask")
            if mask is not None:
                mask = _as_mask(mask, row, "attention_mask")
                if mask.shape[0] != ids.shape[0] or not (mask == 1).all():
                    what = (f"{mask.shape[0]} entries for {ids.shape[0]} input_ids" if mask.shape[0] != ids.shape[0]
                            else f"{int((mask != 1).sum())} of {ids.shape[0]} entries not 1 (padding)")
                    raise ValueError(
                        f"feature {row}: attention_mask has {what}: a packed row has no padding, so padded tokens "
                        "would be trained on as tokens of the document; tokenize without padding (padding=False), or "
                        "strip the padding from input_ids/labels (keep the tokens where attention_mask is 1) and then "
                        "drop the attention_mask column (dropping it alone would train on the padding)")
            seq = feature.get("seq_lengths")
            if seq is None and feature.get("position_ids") is not None:
                docs = doc_lengths_from_position_ids(_as_1d_ints(feature["position_ids"], row, "position_ids"),
                                                     ids.shape[0], where=f"feature {row}")
            elif seq is None:
                docs = np.array([ids.shape[0]], dtype=np.int64)
            else:
                docs = _as_1d_ints(seq, row, "seq_lengths")
                if (docs < 0).any():
                    raise ValueError(f"feature {row}: seq_lengths has negative entries: {docs[docs < 0].tolist()}")
                if int(docs.sum()) != ids.shape[0]:
                    raise ValueError(
                        f"feature {row}: seq_lengths sum to {int(docs.sum())} but input_ids has "
                        f"{ids.shape[0]} tokens (the row's document lengths must add up to its length)"
                    )
            empty = docs == 0
            if empty.any():
                num_empty += int(empty.sum())
                docs = docs[~empty]
            if docs.size == 0:
                continue
            ids_parts.append(ids)
            label_parts.append(ids if labels is None else labels)
            doc_parts.append(docs)
        self.stats.num_empty_skipped += num_empty
        if not doc_parts:
            raise ValueError(
                f"every document in the batch is empty ({len(features)} features, {num_empty} empty documents): "
                "nothing to train on; drop the empty samples from the dataset "
                "(dataset.filter(lambda s: len(s['input_ids']) > 0))"
            )

        input_ids = np.concatenate(ids_parts).astype(np.int64, copy=False)
        labels = np.concatenate(label_parts).astype(np.int64, copy=True)
        seq_lengths = np.concatenate(doc_parts).astype(np.int64, copy=False)
        cu = np.zeros(seq_lengths.size + 1, dtype=np.int64)
        np.cumsum(seq_lengths, out=cu[1:])
        starts = cu[:-1]
        labels[starts] = self.separator_id
        position_ids = np.arange(input_ids.size, dtype=np.int64) - np.repeat(starts, seq_lengths)

        self.stats.num_rows += 1
        self.stats.num_documents += int(seq_lengths.size)
        self.stats.num_tokens += int(input_ids.size)

        out: dict[str, Any] = {
            "input_ids": input_ids[None, :],
            "labels": labels[None, :],
            "position_ids": position_ids[None, :],
        }
        if self.return_shift_labels or self.separator_id != -100:
            shift = np.full_like(labels, -100)
            shift[:-1] = labels[1:]
            out["shift_labels"] = shift[None, :]
        if self.return_seq_lengths:
            out["seq_lengths"] = seq_lengths
            out["cu_seqlens"] = cu.astype(np.int32)
        if rt == "pt":
            import torch

            out = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
        if self.return_seq_lengths:
            out["max_seqlen"] = int(seq_lengths.max())
        return out


#: TRL's per-token loss masks: labels are built from them where a sample has no ``labels``.
LOSS_MASK_COLUMNS = ("completion_mask", "assistant_masks")


def _as_mask(value: Any, row: int | str, key: str) -> np.ndarray:
    """A 0/1 mask field as a 1-D numpy array (ints or bools, list / numpy / torch, (n,) or (1, n))."""
    where = f"feature {row}" if isinstance(row, int) else row
    try:
        return np.asarray(value.cpu() if hasattr(value, "cpu") else value).reshape(-1)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}: {key} is not a sequence of 0/1 ({e})") from None


def labels_from_masks(feature: Mapping[str, Any], ids: np.ndarray, *, where: str) -> np.ndarray | None:
    """The labels TRL builds for a sample without ``labels`` from its ``completion_mask`` /
    ``assistant_masks``: ``ids`` where every present mask is 1, -100 elsewhere; ``None``
    where the sample has neither mask.

    Raises:
        ValueError: a mask whose length differs from ``ids`` or with values other than 0/1
            (names the mask and ``where``).
    """
    keep = None
    for key in LOSS_MASK_COLUMNS:
        value = feature.get(key)
        if value is None:
            continue
        mask = _as_mask(value, where, key)
        if mask.shape[0] != ids.shape[0]:
            raise ValueError(f"{where}: {key} has {mask.shape[0]} entries but input_ids has {ids.shape[0]}; {key} "
                             "must have one 0/1 entry per token (1: train on the token). Fix the tokenization, or "
                             f"drop the column (dataset.remove_columns({key!r}))")
        if mask.dtype != bool and not np.isin(mask, (0, 1)).all():
            bad = mask[~np.isin(mask, (0, 1))]
            raise ValueError(f"{where}: {key} has values {np.unique(bad)[:5].tolist()}; legal values: 0 (no loss on "
                             "the token) and 1 (train on it). Fix the mask, or give the sample its own 'labels' "
                             "(-100 where no loss)")
        keep = mask.astype(bool) if keep is None else keep & mask.astype(bool)
    if keep is None:
        return None
    return np.where(keep, ids, -100).astype(np.int64)


def doc_lengths_from_position_ids(pos: np.ndarray, num_tokens: int, *, where: str) -> np.ndarray:
    """Document lengths of a row from its ``position_ids`` (HF's ``DataCollatorWithFlattening``
    convention): a document starts at the first token and at every entry 0, and the positions
    count up by one in between.

    Raises:
        ValueError: a length that differs from ``num_tokens``, or a position that neither
            restarts at 0 nor follows the one before (names the token and ``where``).
    """
    if pos.shape[0] != num_tokens:
        raise ValueError(f"{where}: position_ids has {pos.shape[0]} entries but input_ids has {num_tokens}; "
                         "position_ids must have one entry per token (0 at each document start)")
    if num_tokens == 0:
        return np.zeros(1, dtype=np.int64)
    bad = np.flatnonzero((pos[1:] != 0) & (pos[1:] != pos[:-1] + 1)) + 1
    if bad.size:
        j = int(bad[0])
        raise ValueError(
            f"{where}: position_ids[{j}] = {int(pos[j])} after {int(pos[j - 1])}; legal: 0 (a new document starts) "
            f"or {int(pos[j - 1]) + 1} (the next position of the document). Pre-packed rows need position_ids "
            "restarting at 0 per document (or a 'seq_lengths' column); for other position_ids drop the column "
            "(dataset.remove_columns('position_ids')): the collator writes its own")
    starts = np.concatenate([[0], np.flatnonzero(pos[1:] == 0) + 1, [num_tokens]])
    return np.diff(starts).astype(np.int64)


def _as_1d_ints(value: Any, row: int, key: str) -> np.ndarray:
    """A feature's token/length field as a 1-D int64 array (lists, numpy, torch; (1, n) is
    flattened), checked by the one token-ids validator
    (:func:`~atac_hf.packing.validate.check_token_ids`)."""
    return check_token_ids(value, where=f"feature {row}", field=key)

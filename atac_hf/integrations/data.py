"""The WFAP feeder in front of a DataLoader: checks, sampler, collator.

One batch = one pack = one packed row of at most ``config.max_tokens`` tokens. The sampler
deals packs the way Accelerate's ``BatchSamplerShard`` hands batch ``b`` to DP replica
``b % num_replicas``, and every CP rank of a replica receives the same batches.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from ..packing.data.arrow_source import refuse_transform
from .columns import (_check_token_columns, _list_chunks, _refuse_no_target_rows, checked_stream,  # noqa: F401
                      prepare_stream_sample)
from .config import ATACConfig
from .config_files import check_count, short_repr
from .targets import DocumentTargets

__all__ = ["REQUIRED_COLUMNS", "PackedRowDocuments", "build_packed_dataloader", "check_collator", "check_dataset_columns",
           "checked_stream", "prepare_stream_sample"]

REQUIRED_COLUMNS = ("input_ids",)


def is_streaming_dataset(dataset: Any) -> bool:
    """A torch ``IterableDataset``, a ``datasets.IterableDataset`` or any iterable without
    ``__getitem__``: fed through the streaming packer (:func:`build_streaming_dataloader`)."""
    if isinstance(dataset, IterableDataset):
        return True
    try:
        import datasets

        if isinstance(dataset, datasets.IterableDataset):
            return True
    except ImportError:  # pragma: no cover - datasets is a dependency
        pass
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def check_dataset_columns(dataset: Any, *, name: str = "dataset", streaming: bool = False,
                          targets: bool = False) -> None:
    """Refuse a dataset the feeder cannot pack.

    Needs a map-style dataset (``datasets.Dataset`` or any indexable of dicts) with an
    ``input_ids`` column of token ids; ``labels`` is optional (default: the tokens). With
    ``streaming=True`` an iterable dataset is accepted too (its columns are checked when it
    declares them, as a ``datasets.IterableDataset`` with features does; otherwise sample
    by sample while packing).

    The per-token columns of a ``datasets.Dataset`` are checked up front too, with Arrow
    kernels (no Python loop over tokens): ``labels``, ``attention_mask``, ``completion_mask``,
    ``assistant_masks`` and ``position_ids`` need one entry per ``input_ids`` token, an
    ``attention_mask`` must be all ones (a packed row has no padding: the pad tokens would be
    trained on), and without ``labels`` the ``completion_mask`` / ``assistant_masks`` (from
    which the collator builds the labels, as TRL does) must be 0/1. Other indexables are
    checked batch by batch by the collator. With ``targets`` (ATACTrainer's ``train_dataset``) a
    dataset with no token to train is refused: ``labels`` all -100 or a loss mask all 0 (a list of dicts
    is read row by row until one has a target).

    Raises:
        ValueError: a ``DatasetDict`` (names its splits), an iterable dataset (unless
            ``streaming``), a stream of pre-packed rows (a ``seq_lengths`` column: their documents
            would attend to each other), a missing ``input_ids`` column (lists the columns found),
            a padded ``attention_mask``, a per-token column of the wrong length or a loss mask
            with values other than 0/1 (each naming the column and the first bad row).
    """
    splits = _splits_of(dataset)
    if splits is not None:
        raise ValueError(f"{name} is a {type(dataset).__name__} of splits {splits}, not one dataset: pass one split, "
                         f"e.g. {name}[{splits[0]!r}]" if splits else f"{name} is an empty {type(dataset).__name__}")
    if is_streaming_dataset(dataset):
        if streaming:
            names = getattr(dataset, "column_names", None)
            if names is not None:
                _check_names(names, name, packed_ok=False)
            return
        raise ValueError(f"{name} is an iterable dataset: the WFAP sampler needs a map-style dataset whose sample "
                         "lengths are known up front (datasets.Dataset, or a list of dicts with 'input_ids')")
    refuse_transform(dataset, name)
    names = getattr(dataset, "column_names", None)
    if names is None:
        if isinstance(dataset, Mapping) or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ValueError(f"{name} is a {type(dataset).__name__}, not a map-style dataset: pass a "
                             "datasets.Dataset (e.g. datasets.Dataset.from_dict(columns) for a dict of columns) or "
                             "a list of dicts with 'input_ids'")
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty")
        first = dataset[0]
        names = list(first) if hasattr(first, "keys") else [type(first).__name__]
    _check_names(names, name)
    _check_token_columns(dataset, name, targets=targets)
    if targets and getattr(dataset, "column_names", None) is None:
        _refuse_no_target_rows(dataset, names, name)


def _splits_of(dataset: Any) -> list | None:
    """The split names of a ``datasets.DatasetDict`` / ``IterableDatasetDict``, else None."""
    kind = type(dataset).__name__
    if kind in ("DatasetDict", "IterableDatasetDict") and isinstance(dataset, dict):
        return [str(k) for k in dataset]
    return None


def _check_names(names: Any, name: str, *, packed_ok: bool = True) -> None:
    if "seq_lengths" in names and not packed_ok:
        raise ValueError(
            f"{name} is a stream of pre-packed rows (a 'seq_lengths' column, e.g. from TRL's or atac-hf's "
            "pack_dataset): the streaming packer would treat each row as one document, so the documents of a row "
            "would attend to each other. Pass the unpacked stream, or the packed rows as a map-style dataset "
            "(their documents are then packed again, each kept whole)")
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ValueError(
            f"{name} has no {missing} column; columns found: {list(names)}. Tokenize it first, e.g. "
            "dataset.map(lambda b: tokenizer(b['text']), batched=True), or rename the token column to 'input_ids'"
            + (_CHAT_HINT if "messages" in names else "")
            + (_COMPLETION_HINT if "prompt" in names and "completion" in names else ""))


_CHAT_HINT = (  # TRL-style conversational data: ATACTrainer (and ATACSFTTrainer) refuse it before SFTTrainer tokenizes
    "; chat data: dataset.map(lambda ex: tokenizer.apply_chat_template(ex['messages'], tokenize=True, "
    "return_dict=True, return_assistant_tokens_mask=True)) gives 'input_ids' and 'assistant_masks', from which "
    "labels are built (-100 on the prompt; the chat template needs {% generation %} blocks), see docs/INTEGRATION.md "
    "\"TRL's SFTTrainer\"")

_COMPLETION_HINT = (  # TRL-style prompt-completion data: the loss on the completion only, as SFTTrainer's default
    "; prompt-completion data: tokenize both into 'input_ids' with a 'completion_mask' (0 on the prompt's tokens, 1 "
    "on the completion's), from which labels are built (-100 on the prompt), e.g. dataset.map(lambda ex: "
    "{'input_ids': (p := tokenizer(ex['prompt'])['input_ids']) + (c := tokenizer(ex['completion'], "
    "add_special_tokens=False)['input_ids']), 'completion_mask': [0] * len(p) + [1] * len(c)}), see "
    "docs/INTEGRATION.md \"TRL's SFTTrainer\"")


_COLLATOR_CONTRACT = (
    "a collator for ATACTrainer must turn a list of samples into ONE padding-free packed row: 'input_ids' (1, S), "
    "'labels' (1, S) and 'position_ids' (1, S) restarting at 0 for every sample (or 'seq_lengths' / "
    "'cu_seq_lens_q' giving the document lengths), no padding. Leave data_collator unset (the default "
    "PackedDataCollator) or use transformers' DataCollatorWithFlattening()"
)


def check_collator(collator: Callable, dataset: Any, *, max_tokens: int, name: str = "data_collator") -> None:
    """Dry-run ``collator`` on the first two samples of ``dataset``, as the WFAP sampler hands them.

    ATP-CP needs each batch as one packed row whose documents it can find; a padding
    collator (e.g. ``DataCollatorForLanguageModeling``) would otherwise fail much later, deep
    inside sharding. Samples are cut to ``max_tokens // 2`` tokens, as packing would.

    Raises:
        ValueError: the collator raises on the samples, returns no mapping, no ``input_ids`` or
            no ``labels``, pads, or returns rows whose documents cannot be found or do not
            keep each sample its own document (naming the collator and what it must emit).
    """
    from ..attention import doc_lengths_from_batch
    from ..packing.data.sampler import SpanDataset
    from ..packing.data.dataset import _sample_tokens as tokens  # a (1, n) row holds n tokens

    if len(dataset) == 0:
        return
    label = f"{name}={getattr(collator, '__qualname__', None) or type(collator).__name__}"
    view = SpanDataset(dataset)
    cut = max(1, int(max_tokens) // 2)
    features = []
    for i in range(min(2, len(view))):
        n = tokens(view[i]["input_ids"])
        features.append(view[(i, 0, min(n, cut))] if n else view[i])
    want = [tokens(f["input_ids"]) for f in features if tokens(f["input_ids"])]
    try:
        batch = collator(features)
    except Exception as e:  # the collator's own error, with what it was asked to do
        raise ValueError(f"{label} raised {type(e).__name__}: {e} on two samples of the training data; "
                         f"{_COLLATOR_CONTRACT}") from e
    if not hasattr(batch, "keys") or "input_ids" not in batch:
        keys = sorted(batch.keys()) if hasattr(batch, "keys") else type(batch).__name__
        raise ValueError(f"{label} returned {keys} (no 'input_ids'); {_COLLATOR_CONTRACT}")
    if batch.get("labels") is None and batch.get("shift_labels") is None:
        raise ValueError(f"{label} returned no 'labels' (keys {sorted(batch.keys())}); {_COLLATOR_CONTRACT}")
    mask = batch.get("attention_mask")
    if mask is not None and not bool(np.asarray(mask).astype(bool).all()):
        raise ValueError(f"{label} pads its rows (attention_mask has zeros); {_COLLATOR_CONTRACT}")
    try:
        found = [int(x) for x in doc_lengths_from_batch(batch)]
    except ValueError as e:
        raise ValueError(f"{label}: {e} (keys {sorted(batch.keys())}); {_COLLATOR_CONTRACT}") from None
    if len(found) != len(want):  # e.g. samples concatenated into one document: they would attend to each other
        raise ValueError(f"{label} gave {len(found)} document(s) of {found} tokens for {len(want)} samples of {want} "
                         f"tokens (each sample must stay its own document); {_COLLATOR_CONTRACT}")
    _check_collator_loss_masks(label, features, batch)


def _check_collator_loss_masks(label: str, features: list, batch: Any) -> None:
    """Refuse a collator that trains on tokens a sample's ``completion_mask`` / ``assistant_masks``
    exclude (samples without ``labels``; e.g. ``DataCollatorWithFlattening`` ignores the masks)."""
    from ..packing.data.collator import LOSS_MASK_COLUMNS, labels_from_masks
    from ..packing.validate import check_token_ids

    if batch.get("labels") is None or not any(f.get("labels") is None and any(f.get(k) is not None
                                                                            for k in LOSS_MASK_COLUMNS)
                                              for f in features):
        return
    want = []
    for i, f in enumerate(features):
        ids = check_token_ids(f["input_ids"], where=f"sample {i}", field="input_ids")
        built = labels_from_masks(f, ids, where=f"sample {i}") if f.get("labels") is None else None
        want.append(np.zeros(ids.shape[0], dtype=bool) if built is None else built == -100)
    excluded = np.concatenate(want)
    got = np.asarray(batch["labels"].cpu() if hasattr(batch["labels"], "cpu") else batch["labels"]).reshape(-1)
    if got.shape[0] == excluded.shape[0] and (got[excluded] != -100).any():
        n = int((got[excluded] != -100).sum())
        raise ValueError(f"{label} trains on {n} token(s) that the samples' {'/'.join(LOSS_MASK_COLUMNS)} exclude "
                         "(it ignores the masks, so the prompt would be trained on): leave data_collator unset (the "
                         "default PackedDataCollator builds the labels from the masks, -100 where 0), or give the "
                         "dataset a 'labels' column")


def build_packed_dataloader(dataset: Any, config: ATACConfig, *, num_replicas: int = 1, grad_accum: int = 1,
                            seed: int = 0, shuffle: bool | None = None, cost_model: Any = None,
                            collate_fn: Callable | None = None, even_batches: bool = True,
                            progress: bool | None = None, fixed_epoch_length: bool = False, **loader_kwargs: Any):
    """A DataLoader whose batches are WFAP packs (one packed row each), and its sampler.

    Args:
        dataset: map-style dataset with ``input_ids`` (and optional ``labels``; a ``completion_mask``
            / ``assistant_masks`` builds the labels where there are none; an ``attention_mask`` must
            be all ones; pre-packed rows give their documents by ``seq_lengths`` or by
            ``position_ids`` restarting at 0, see :class:`PackedRowDocuments`).
        config: the run's :class:`ATACConfig` (cap, packing strategy and options, window).
        num_replicas: DP replicas (world size // cp_size) the prepared loader deals batches to.
        grad_accum: micro-batches per optimizer step; one window = ``num_replicas x grad_accum`` packs.
        seed: shuffle seed (identical on every rank).
        shuffle: default ``config.shuffle``.
        cost_model: the packer's cost model.
        collate_fn: default :class:`~atac_hf.packing.PackedDataCollator`.
        even_batches: make the batch count a multiple of ``num_replicas``.
        progress: the sampler's progress bar while an epoch is planned (``None``: on rank 0 for
            large datasets; see :class:`~atac_hf.packing.WFAPBatchSampler`).
        fixed_epoch_length: every epoch as many batches as the first (what ``Trainer``, which
            sizes epochs by the first ``len``, needs; see the sampler).
        **loader_kwargs: passed to ``DataLoader`` (``num_workers``, ``pin_memory``, ...).

    Returns:
        ``(loader, sampler)``: prepare the loader with ``accelerator.prepare``; keep the
        :class:`~atac_hf.packing.WFAPBatchSampler` for ``set_epoch`` and ``state_dict``.
    """
    from ..packing.data.collator import PackedDataCollator
    from ..packing.data.dataset import dataset_lengths
    from ..packing.data.sampler import SpanDataset, WFAPBatchSampler

    num_replicas, grad_accum = _check_loader_args(config, num_replicas, grad_accum, collate_fn)
    check_dataset_columns(dataset)
    names = _column_names(dataset)
    docs = PackedRowDocuments(dataset) if "seq_lengths" in names or "position_ids" in names else None
    if docs is not None and ("seq_lengths" in names or not np.array_equal(docs.row, np.arange(len(dataset)))):
        # pre-packed rows (TRL, pack_dataset, DataCollatorWithFlattening's position_ids): pack their documents
        dataset = docs
        lengths = dataset.lengths
    else:  # plain rows (position_ids that never restart: one document a row, read as rows)
        lengths = dataset_lengths(dataset)
    _warn_small_window(config, num_replicas * grad_accum, lengths)
    sampler = WFAPBatchSampler(
        lengths, config.step_packing_config(num_replicas * grad_accum), window_size=config.window_size,
        num_replicas=num_replicas, shuffle=config.shuffle if shuffle is None else shuffle, seed=seed,
        cost_model=cost_model, even_batches=even_batches, progress=progress, fixed_epoch_length=fixed_epoch_length,
    )
    loader = DataLoader(SpanDataset(dataset), batch_sampler=sampler,
                        collate_fn=DocumentTargets(collate_fn if collate_fn is not None else PackedDataCollator()),
                        **loader_kwargs)
    return loader, sampler


def build_streaming_dataloader(dataset: Any, config: ATACConfig, *, num_replicas: int = 1, grad_accum: int = 1,
                               cost_model: Any = None, collate_fn: Callable | None = None, **loader_kwargs: Any):
    """A DataLoader of packed rows from a stream of samples (one row = one pack per batch).

    The stream goes through :class:`~atac_hf.packing.data.iterable.PackedIterableDataset`:
    windows of ``num_replicas x grad_accum`` packs, ordered for a round-robin deal to the
    DP replicas (Accelerate's ``IterableDatasetShard`` with ``dispatch_batches=False`` deals
    row ``k`` to replica ``k % num_replicas``), and a pass that ends on a multiple of
    ``num_replicas`` packs, so no replica gets a repeated row. The stream must replay the
    same order on each ``iter()`` (resume skips the rows already trained by replaying it).

    Args:
        dataset: an iterable of mappings with ``input_ids`` (``labels`` optional):
            ``datasets.IterableDataset``, a torch ``IterableDataset``... Its per-token mask
            columns are read sample by sample (:func:`checked_stream`).
        config, num_replicas, grad_accum, cost_model, collate_fn: as in :func:`build_packed_dataloader`.
        **loader_kwargs: passed to ``DataLoader`` (``num_workers`` at most 1).

    Returns:
        ``(loader, packed)``: prepare the loader with ``accelerator.prepare``; ``packed`` is the
        :class:`PackedIterableDataset` (its ``state_dict`` resumes a stream without a replay).
    """
    from ..packing.data.collator import PackedDataCollator
    from ..packing.data.iterable import PackedIterableDataset

    num_replicas, grad_accum = _check_loader_args(config, num_replicas, grad_accum, collate_fn)
    check_dataset_columns(dataset, streaming=True)
    _warn_small_window(config, num_replicas * grad_accum)
    packed = PackedIterableDataset(checked_stream(dataset), config.step_packing_config(num_replicas * grad_accum),
                                   window_size=config.window_size, num_replicas=num_replicas, cost_model=cost_model)
    loader = DataLoader(packed, batch_size=1,
                        collate_fn=DocumentTargets(collate_fn if collate_fn is not None else PackedDataCollator()),
                        **loader_kwargs)
    return loader, packed


def _check_loader_args(config: Any, num_replicas: Any, grad_accum: Any, collate_fn: Any) -> tuple[int, int]:
    """The loaders' ``config``, sizes and ``collate_fn``, refused with the value where they are wrong."""
    from ..packing.data.collator import PackedDataCollator
    from ..packing.validate import InputTypeError

    if not isinstance(config, ATACConfig):
        raise InputTypeError(f"config must be an ATACConfig (the run's cap, packing and window), got "
                             f"{type(config).__name__}")
    if collate_fn is not None and not callable(collate_fn):
        raise InputTypeError(f"collate_fn={short_repr(collate_fn)} is not callable: pass a collator such as "
                             "PackedDataCollator(), or None for the default")
    DocumentTargets(collate_fn if collate_fn is not None else PackedDataCollator())  # its separator_id, checked
    return (check_count(num_replicas, "num_replicas", "DP replicas: world size // (cp_size x tp_size)"),
            check_count(grad_accum, "grad_accum", "micro-batches per optimizer step"))


def _warn_small_window(config: ATACConfig, packs_per_window: int, lengths: Any = None) -> None:
    """Warn where ``window_size`` gives a window fewer new samples than it has packs to fill (DP
    replicas x gradient accumulation): packs then hold about one sample each, mostly padding; or,
    given the samples' ``lengths``, over twice the tokens its packs hold: the carried pool, the
    samples' delay and the planning time then grow window after window."""
    n = config.window_size
    if config.min_window_packs > 1 and (n is not None or config.packing_strategy != "wfap"):
        warnings.warn(f"min_window_packs={config.min_window_packs} is not used: it sizes wfap's windows by whole "
                      f"steps where windows are sized by tokens (here window_size={n}, packing_strategy="
                      f"{config.packing_strategy!r})", stacklevel=3)
    if n is not None and n < packs_per_window:
        warnings.warn(f"window_size={n} is smaller than the {packs_per_window} packs each window "
                      "fills (DP replicas x gradient accumulation): packs would hold about one sample each, mostly "
                      f"padding; set window_size to several times {packs_per_window}, or None (windows sized by "
                      "tokens)", stacklevel=3)
    elif n is not None and lengths is not None and len(lengths):
        room = packs_per_window * config.max_tokens
        if n * float(np.mean(lengths)) > 2 * room:
            warnings.warn(f"window_size={n} samples hold about {n * float(np.mean(lengths)):.3g} tokens, over twice "
                          f"the {room} that a window of {packs_per_window} pack{'s' if packs_per_window > 1 else ''} holds: the samples carried to later "
                          "windows, their delay and the planning time grow window after window. For fuller packs "
                          "set window_size=None and min_window_packs=16 (windows of whole optimizer steps)",
                          stacklevel=3)


def _column_names(dataset: Any) -> list[str]:
    names = getattr(dataset, "column_names", None)
    if names is None and len(dataset) and hasattr(dataset[0], "keys"):
        names = list(dataset[0])
    return list(names or [])


class PackedRowDocuments:
    """The documents of pre-packed rows as a map-style dataset of samples, one per document.

    A row gives its documents by a ``seq_lengths`` column (TRL's or atac-hf's ``pack_dataset``
    output) or, without one, by a ``position_ids`` column restarting at 0 at every document
    (older TRL ``pack_dataset``, HF's ``DataCollatorWithFlattening`` convention; between
    restarts the positions count up by one). ``seq_lengths`` wins where a row has both.

    ``transformers.Trainer`` with ``remove_unused_columns=True`` drops ``seq_lengths`` and the
    documents of a row attend to each other; ATACTrainer reads it instead: each document is
    a sample of its own (its slice of ``input_ids`` and of every other per-token column:
    ``labels``, ``attention_mask``, ``completion_mask``, ``assistant_masks``), packed again by WFAP.

    Raises:
        ValueError: a row whose ``seq_lengths`` do not sum to its ``input_ids`` length, or whose
            ``position_ids`` have another length or neither restart at 0 nor count up by one
            (names the row).
    """

    #: per-token columns sliced with ``input_ids`` into each document
    COLUMNS = ("labels", "attention_mask", "completion_mask", "assistant_masks")

    def __init__(self, dataset: Any) -> None:
        from ..packing.data.arrow_source import _is_hf_dataset
        from ..packing.data.dataset import dataset_lengths

        self.dataset = dataset
        names = _column_names(dataset)
        totals = dataset_lengths(dataset)
        if "seq_lengths" not in names and "position_ids" in names:
            self.row, self.lengths = _docs_from_position_ids(dataset, totals, hf=_is_hf_dataset(dataset))
            starts = np.cumsum(self.lengths) - self.lengths
            row_base = np.cumsum(totals) - totals
            self.offset = starts - row_base[self.row]
            return
        if getattr(dataset, "column_names", None) is not None and hasattr(dataset, "select_columns"):
            seq = dataset.select_columns(["seq_lengths"]).with_format(None)["seq_lengths"]
        else:
            seq = [dataset[i]["seq_lengths"] for i in range(len(dataset))]
        counts = np.fromiter((len(s) for s in seq), dtype=np.int64, count=len(seq))
        lens = np.fromiter((int(x) for s in seq for x in s), dtype=np.int64, count=int(counts.sum()))
        self.row = np.repeat(np.arange(len(seq), dtype=np.int64), counts)
        sums = np.bincount(self.row, weights=lens, minlength=len(seq)).astype(np.int64)
        bad = np.flatnonzero(sums != totals)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"row {i}: seq_lengths sum to {int(sums[i])} but input_ids has {int(totals[i])} tokens; "
                             "seq_lengths must list the lengths of the row's documents in order")
        starts = np.cumsum(lens) - lens  # each document's start in the concatenation of all rows
        row_base = np.cumsum(totals) - totals  # each row's start in it (seq_lengths sum to the row's length)
        self.offset = starts - row_base[self.row]
        self.lengths = lens

    def __len__(self) -> int:
        return int(self.lengths.size)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._document(self.dataset[int(self.row[i])], i)

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Documents ``indices`` with each of their rows read once (a row holds up to thousands of
        short documents: reading it per document made a batch cost documents x row length)."""
        rows = sorted({int(self.row[i]) for i in indices})
        if getattr(self.dataset, "column_names", None) is not None:  # datasets: one batched read
            cols = self.dataset[rows]
            got = {r: {c: cols[c][j] for c in cols} for j, r in enumerate(rows)}
        else:
            got = {r: self.dataset[r] for r in rows}
        return [self._document(got[int(self.row[i])], i) for i in indices]

    def _document(self, row: Mapping[str, Any], i: int) -> dict[str, Any]:
        o, n = int(self.offset[i]), int(self.lengths[i])
        out = {"input_ids": row["input_ids"][o:o + n]}
        for col in self.COLUMNS:
            if row.get(col) is not None:
                out[col] = row[col][o:o + n]
        return out


def _docs_from_position_ids(dataset: Any, totals: np.ndarray, *, hf: bool) -> tuple[np.ndarray, np.ndarray]:
    """(row, length) of every document of the rows, found at the ``position_ids`` restarts."""
    from ..packing.data.collator import doc_lengths_from_position_ids

    if not hf:
        rows, lens = [], []
        for r in range(len(dataset)):
            pos = dataset[r].get("position_ids")
            if pos is None:
                docs = [int(totals[r])]
            else:
                pos = np.asarray(pos.cpu() if hasattr(pos, "cpu") else pos, dtype=np.int64).reshape(-1)
                docs = doc_lengths_from_position_ids(pos, int(totals[r]), where=f"row {r}").tolist()
            docs = [d for d in docs if d] or [0]
            rows += [r] * len(docs)
            lens += docs
        return np.asarray(rows, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    rows_out, lens_out, base = [], [], 0
    for vals, off, null in _list_chunks(dataset, "position_ids"):
        n = len(off) - 1
        seg_len = np.diff(off)
        lo, hi = int(off[0]), int(off[-1])
        v = vals[lo:hi].astype(np.int64, copy=False)
        start = v == 0
        row_start = off[:-1][(seg_len > 0) & ~null] - lo
        start[row_start] = True
        bad_len = np.flatnonzero(~null & (seg_len != totals[base:base + n]))
        if bad_len.size:
            r = int(bad_len[0])
            raise ValueError(f"row {base + r}: position_ids has {int(seg_len[r])} entries but input_ids has "
                             f"{int(totals[base + r])}; position_ids must have one entry per token (0 at each "
                             "document start), or drop the column (dataset.remove_columns('position_ids'))")
        prev = np.concatenate([[-1], v[:-1]])
        bad = np.flatnonzero(~start & (v != prev + 1))
        if bad.size:
            j = int(bad[0])
            r = int(np.searchsorted(off, lo + j, side="right")) - 1
            doc_lengths_from_position_ids(v[off[r] - lo:off[r + 1] - lo], int(seg_len[r]), where=f"row {base + r}")
        idx = np.flatnonzero(start)
        lens = np.diff(np.concatenate([idx, [hi - lo]]))
        row = np.searchsorted(off, idx + lo, side="right") - 1
        # a null or empty row: one (empty) document of its input_ids length
        lone = np.flatnonzero(null | (seg_len == 0))
        row = np.concatenate([row, lone])
        lens = np.concatenate([lens, totals[base + lone]])
        order = np.argsort(row, kind="stable")
        rows_out.append(row[order] + base)
        lens_out.append(lens[order])
        base += n
    return np.concatenate(rows_out).astype(np.int64), np.concatenate(lens_out).astype(np.int64)

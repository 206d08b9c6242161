"""Cut a full packed batch into one CP rank's share, with the per-batch attention context.

The rows of a batch (B >= 1) are treated as one pack: their documents, concatenated
in row order, are the documents the plan was built from (``doc_lengths_from_batch``).
Every token goes to exactly one rank (``plan.rank_token_indices``); labels are
shifted on the full rows first, so each rank's loss is its local sum over the
global target count and summing gradients over the CP group reproduces
single-device training.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch
import torch.distributed as dist

from ..sharding.plan import LocalLayout, ShardPlan
from .backends import BACKENDS
from .collectives import group_device, peer_failure
from .ids import as_long_ids, is_index_dtype as _is_index_dtype
from .stock_guard import guard_stock_attention

__all__ = ["ShardContext", "shard_batch", "doc_lengths_from_batch", "build_shift_labels", "unshard"]

IGNORE_INDEX = -100
# Keys that describe the full rows: meaningless (and wrong) after sharding.
_DROP = frozenset({
    "seq_lengths", "cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
    "max_seqlen", "seq_idx", "attention_mask",
})


@dataclass(frozen=True, kw_only=True, eq=False)
class ShardContext:
    """What the ``atac_cp`` attention needs on one rank for one batch (passed as ``atac_shard=``).

    Attributes:
        plan: the pack's :class:`ShardPlan` (identical on every rank).
        rank: this rank's index in the CP group (0..cp_size-1).
        group: the CP process group (None: the default group; unused when cp_size is 1).
        layout: ``plan.local_layout(rank)``: local segments and the K/V gather layout.
        backend: attention kernel: a key of :data:`~.backends.BACKENDS` (``sdpa``, ``flash``, ``varlen``,
            ``flex``, ``varlen_reference``, ``auto``).
        debug: extra cross-rank checks (plan digests in :func:`shard_batch`).
    """

    plan: ShardPlan
    rank: int
    group: Any = None
    layout: LocalLayout
    backend: str = "sdpa"
    debug: bool = False
    cache: dict = field(default_factory=dict, repr=False)  # device index tensors, per layer reuse
    _reached: dict = field(default_factory=dict, repr=False)  # id -> attention module run in this forward

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {self.backend!r}; legal values: {sorted(BACKENDS)} "
                             "(set backend=)")
        if self.layout.rank != self.rank:
            raise ValueError(f"layout is for rank {self.layout.rank}, context for rank {self.rank}")

    def record_attention(self, module: Any) -> None:
        """Note that ``module`` ran the ``atac_cp`` attention (a re-run under checkpointing counts once)."""
        self._reached[id(module)] = module

    def reached_modules(self) -> list:
        """The distinct attention modules that ran ``atac_cp`` since :meth:`begin_forward`."""
        return list(self._reached.values())

    def begin_forward(self) -> None:
        """Start a new model forward (the runtime guard counts its attention modules afresh)."""
        self._reached.clear()

    @property
    def needs_gather(self) -> bool:
        """True when the plan all-gathers K/V (the same answer on every rank)."""
        return self.plan.cp_size > 1 and len(self.plan.gathered_docs) > 0


# ---------------------------------------------------------------------------- document lengths
def doc_lengths_from_batch(batch: Mapping[str, Any]) -> np.ndarray:
    """Document lengths of all rows of ``batch``, concatenated in row order.

    Read from ``seq_lengths`` (per row lists, a 1-D list/tensor for one row, or a
    (B, k) tensor whose trailing zeros are padding), else ``cu_seqlens`` /
    ``cu_seq_lens_q`` (over the flattened batch), else ``position_ids`` (a document
    starts at every row start and wherever the position does not continue by +1).
    When ``position_ids`` are present they are checked against the lengths.

    Raises:
        ValueError: a document of length 0, lengths that do not fill each row, or
            ``position_ids`` that disagree with the lengths (naming the row).
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of tensors with 'input_ids' and the documents' 'seq_lengths', "
                        f"'cu_seqlens' or 'position_ids' (a PackedDataCollator batch), got {type(batch).__name__}")
    input_ids = batch.get("input_ids")
    pos = batch.get("position_ids")
    ref = input_ids if input_ids is not None else pos
    if ref is None:
        raise ValueError("the batch needs 'input_ids' or 'position_ids' to find its documents")
    B, S = _rows_shape(ref)
    lengths = None
    if batch.get("seq_lengths") is not None:
        lengths = _lengths_from_seq_lengths(batch["seq_lengths"], B, S)
    else:
        cu = next((batch[k] for k in ("cu_seqlens", "cu_seq_lens_q") if batch.get(k) is not None), None)
        if cu is not None:
            lengths = _lengths_from_cu(cu, B, S)
    if pos is not None:
        pos_np = _np2d(pos, B, S, "position_ids")
        if lengths is None:
            return _lengths_from_positions(pos_np)
        _check_positions(pos_np, lengths)
    elif lengths is None:
        raise ValueError("cannot find the documents of the batch: pass 'position_ids', 'seq_lengths' or 'cu_seqlens'")
    return lengths


def _rows_shape(t: Any) -> tuple[int, int]:
    shape = tuple(t.shape) if hasattr(t, "shape") else np.asarray(t).shape
    if len(shape) == 1:
        return 1, int(shape[0])
    if len(shape) != 2:
        raise ValueError(f"packed rows must be (B, S) tensors, got shape {shape}")
    return int(shape[0]), int(shape[1])


def _np2d(t: Any, B: int, S: int, name: str) -> np.ndarray:
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    a = a.reshape(-1, a.shape[-1]) if a.ndim else a
    if a.shape != (B, S):
        raise ValueError(f"'{name}' has shape {tuple(a.shape)}, expected ({B}, {S}) like input_ids")
    return a.astype(np.int64)


def _check_nonzero(lengths: np.ndarray, where: str) -> None:
    if len(lengths) and lengths.min() < 1:
        d = int(np.argmin(lengths))
        raise ValueError(f"{where}: document {d} has length {int(lengths[d])}; every document needs >= 1 token "
                         "(drop empty documents before packing)")


def _lengths_from_seq_lengths(sl: Any, B: int, S: int) -> np.ndarray:
    if isinstance(sl, torch.Tensor):
        a = sl.detach().cpu().numpy().astype(np.int64)
        rows = [a] if a.ndim == 1 else [np.trim_zeros(r, "b") for r in a]
    else:
        sl = list(sl)
        rows = [sl] if (B == 1 and sl and np.ndim(sl[0]) == 0) else sl
        rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in rows]
    if len(rows) != B:
        raise ValueError(f"'seq_lengths' describes {len(rows)} rows, the batch has {B}")
    for b, r in enumerate(rows):
        _check_nonzero(r, f"seq_lengths of row {b}")
        if int(r.sum()) != S:
            raise ValueError(f"seq_lengths of row {b} sum to {int(r.sum())}, the row has {S} tokens")
    return np.concatenate(rows).astype(np.int64)


def _lengths_from_cu(cu: Any, B: int, S: int) -> np.ndarray:
    c = (cu.detach().cpu().numpy() if isinstance(cu, torch.Tensor) else np.asarray(cu)).astype(np.int64).reshape(-1)
    if len(c) < 2 or c[0] != 0 or c[-1] != B * S:
        raise ValueError(f"cu_seqlens must run from 0 to {B * S} (the batch's token count), got {c.tolist()[:8]}...")
    lengths = np.diff(c)
    _check_nonzero(lengths, "cu_seqlens")
    missing = sorted(set(range(S, B * S, S)) - set(c.tolist()))
    if missing:
        raise ValueError(f"cu_seqlens: a document crosses the end of row {missing[0] // S - 1}")
    return lengths


def _lengths_from_positions(pos: np.ndarray) -> np.ndarray:
    out = []
    for row in pos:
        starts = np.flatnonzero(np.concatenate([[True], np.diff(row) != 1]))
        out.append(np.diff(np.concatenate([starts, [len(row)]])))
    return np.concatenate(out).astype(np.int64)


def _check_positions(pos: np.ndarray, lengths: np.ndarray) -> None:
    """Document boundaries of ``lengths`` must be exactly where ``position_ids`` restart."""
    B, S = pos.shape
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if offsets[-1] != B * S:
        raise ValueError(f"the document lengths cover {int(offsets[-1])} tokens, the batch has {B} x {S} = {B * S}")
    starts = np.zeros(B * S, dtype=bool)
    starts[offsets[:-1]] = True
    flat = pos.reshape(-1)
    restart = np.concatenate([[True], np.diff(flat) != 1])
    restart[::S] = True
    bad = np.flatnonzero(starts != restart)
    if len(bad):
        t = int(bad[0])
        r, c = divmod(t, S)
        if c == 0:
            raise ValueError(f"row {r}: a document crosses into this row from row {r - 1} "
                             "(documents may not span rows; check the document lengths)")
        what = "a document starts" if starts[t] else "position_ids restart"
        raise ValueError(
            f"row {r}: position_ids disagree with the document lengths at column {c} ({what} there but not "
            f"the other; positions {flat[max(t - 2, r * S):t + 2].tolist()}); position_ids must count 0,1,2,... "
            "within each document and restart at each document start"
        )


# ---------------------------------------------------------------------------- labels
def build_shift_labels(labels: torch.Tensor, doc_lengths: np.ndarray) -> torch.Tensor:
    """(B, S) ``shift_labels[t] = labels[t + 1]`` within a document; -100 at every document's last token.

    Raises:
        TypeError: ``labels`` is not a tensor.
        ValueError: ``doc_lengths`` not ints >= 1 summing to the token count of ``labels``.
    """
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a tensor, got {type(labels).__name__}")
    lengths = np.asarray(doc_lengths).reshape(-1)  # (B, k) per-row lengths flatten in row order, as before
    if lengths.dtype.kind not in "iu" or (lengths.size and int(lengths.min()) < 0) \
            or int(lengths.sum()) != labels.numel():
        raise ValueError(f"doc_lengths {_short(lengths)} (dtype {lengths.dtype}) must be ints >= 0 summing to the "
                         f"{labels.numel()} tokens of labels (the documents in row order: doc_lengths_from_batch(batch))")
    flat = labels.reshape(-1)
    out = torch.full_like(flat, IGNORE_INDEX)
    out[:-1] = flat[1:]
    ends = torch.as_tensor(np.cumsum(doc_lengths) - 1, device=flat.device)
    out[ends] = IGNORE_INDEX
    return out.view_as(labels)


# ---------------------------------------------------------------------------- shard
def shard_batch(
    batch: Mapping[str, Any],
    plan: ShardPlan,
    rank: int,
    group: Any = None,
    *,
    backend: str = "sdpa",
    debug: bool = False,
) -> dict:
    """This rank's share of a full packed batch, ready for ``model(**local)``.

    Args:
        batch: ``input_ids`` (B, S); ``labels`` and/or ``shift_labels`` (B, S);
            ``position_ids`` (B, S); optional ``seq_lengths``/``cu_seqlens`` (validation
            only) and ``num_items_in_batch`` (kept if given, e.g. counted over gradient
            accumulation). Other (B, S) tensors are sharded like ``input_ids``; other
            values pass through. ``attention_mask`` (all ones) and the full-row
            ``cu_seq_lens_*``/``max_length_*``/``seq_idx`` are dropped.
        plan: the plan of this pack (built from ``doc_lengths_from_batch(batch)``).
        rank: this rank in the CP group.
        group: the CP process group (None: the default group).
        backend: attention kernel (``sdpa``, ``flash``, ``varlen``, ``flex``, ``varlen_reference``, ``auto``).
        debug: all-gather ``plan.digest`` and :func:`batch_digest` over the group (one
            collective) and compare.

    Returns:
        dict with ``input_ids``, ``position_ids`` (1, n_local), ``labels`` and
        ``shift_labels`` (1, n_local, when the batch has labels), ``num_items_in_batch``
        (the global count of target tokens), ``use_cache=False`` and ``atac_shard`` (a
        :class:`ShardContext`).

    Raises:
        ValueError: rank outside the group, a group of another size, documents of length
            0, position_ids disagreeing with the lengths, a token count or document
            lengths that differ from the plan's, labels with another token count than
            ``input_ids``, a plan that leaves a rank without tokens
            (cp_size > 1; raised on every rank alike), padding in ``attention_mask``.
        TypeError: ``plan`` is not a :class:`ShardPlan`, ``batch`` not a mapping, labels not tensors.
        RuntimeError: (debug) the ranks hold different plans, or different batches (same lengths).
    """
    if not isinstance(plan, ShardPlan):
        raise TypeError(f"plan must be a ShardPlan (from plan_shards(doc_lengths_from_batch(batch), cp_size)), "
                        f"got {type(plan).__name__}")
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of tensors (input_ids, labels, position_ids, ...), "
                        f"got {type(batch).__name__}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < plan.cp_size:
        raise ValueError(f"rank {rank!r} is outside the CP group of size {plan.cp_size} (legal: 0..{plan.cp_size - 1})")
    rank = int(rank)
    _check_group(plan, rank, group)
    if "input_ids" not in batch:
        raise ValueError("the batch needs 'input_ids' (B, S)")
    input_ids = batch["input_ids"]
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"'input_ids' must be a (B, S) tensor, got {type(input_ids).__name__} "
                         f"of shape {tuple(getattr(input_ids, 'shape', ()))}")
    if not _is_index_dtype(input_ids):
        raise ValueError(f"'input_ids' has dtype {input_ids.dtype}: token ids must be an integer tensor (torch.long)")
    if not isinstance(debug, (bool, np.bool_)):
        raise ValueError(f"debug={debug!r} is not a bool: pass True (compare the plan and batch over the group) or "
                         "False")
    B, S = input_ids.shape
    if plan.num_tokens != B * S:
        raise ValueError(f"the plan covers {plan.num_tokens} tokens but the batch has {B} x {S} = {B * S}: "
                         "build the plan from doc_lengths_from_batch(batch)")
    for key in ("labels", "shift_labels"):
        lab = batch.get(key)
        if lab is None:
            continue
        if not isinstance(lab, torch.Tensor):
            raise TypeError(f"'{key}' must be a tensor like input_ids, got {type(lab).__name__}")
        if not _is_index_dtype(lab):
            raise ValueError(f"'{key}' has dtype {lab.dtype}: labels must be an integer tensor (token ids, "
                             f"{IGNORE_INDEX} where a token gets no loss)")
        if lab.numel() != B * S or (lab.dim() == 2 and tuple(lab.shape) != (B, S)):
            raise ValueError(f"'{key}' has shape {tuple(lab.shape)} ({lab.numel()} tokens) but input_ids has shape "
                             f"({B}, {S}) ({B * S} tokens): {key} must have one entry per input token")
    batch = as_long_ids(batch)
    lengths = doc_lengths_from_batch(batch)
    if not np.array_equal(lengths, plan.doc_lengths):
        raise ValueError(f"the batch's document lengths {_short(lengths)} differ from the plan's "
                         f"{_short(plan.doc_lengths)}: build the plan from doc_lengths_from_batch(batch)")
    held = plan.rank_num_tokens()
    if plan.cp_size > 1 and int(held.min()) == 0:  # the same answer on every rank: all raise, none waits
        empty = np.flatnonzero(held == 0).tolist()
        raise ValueError(
            f"the plan leaves rank(s) {empty[:8]} without tokens ({plan.num_tokens} tokens over cp_size="
            f"{plan.cp_size}, strategy {plan.strategy!r}): transformers models cannot run on 0 tokens; plan_shards "
            "gives every rank a token when the pack has >= cp_size tokens: pack more tokens (drop samples shorter "
            "than cp_size) or lower cp_size"
        )
    _check_num_items(batch.get("num_items_in_batch"))
    mask = batch.get("attention_mask")
    if mask is not None and not bool(torch.as_tensor(mask).bool().all()):
        raise ValueError("attention_mask has padding (zeros): packed rows must not rely on it; make padding its "
                         "own document (labels -100) or drop it")
    if debug and plan.cp_size > 1:
        check_plan_digest(plan, group, content=batch_digest(batch))

    device = input_ids.device
    idx = torch.as_tensor(plan.rank_token_indices(rank), device=device)

    def take(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(B * S, *t.shape[2:]).index_select(0, idx.to(t.device)).unsqueeze(0)

    out: dict[str, Any] = {}
    for k, v in batch.items():
        if k == "position_ids" and not isinstance(v, torch.Tensor):
            v = torch.as_tensor(np.asarray(v), device=device)
        if k in _DROP or k in ("labels", "shift_labels", "num_items_in_batch"):
            continue
        if isinstance(v, torch.Tensor) and v.dim() >= 2 and tuple(v.shape[:2]) == (B, S):
            out[k] = take(v)
        elif isinstance(v, torch.Tensor) and k == "position_ids" and v.numel() == B * S:
            out[k] = take(v.reshape(B, S))
        else:
            out[k] = v
    if "position_ids" not in out:  # never let the model build local positions itself
        pos = np.concatenate([np.arange(n) for n in lengths])
        out["position_ids"] = torch.as_tensor(pos, device=device).view(B, S).reshape(-1)[idx].unsqueeze(0)

    labels, shift = batch.get("labels"), batch.get("shift_labels")
    if shift is None and labels is not None:
        shift = build_shift_labels(labels.reshape(B, S), lengths)
    if shift is not None:
        shift = shift.reshape(B, S)
        out["labels"] = take(labels.reshape(B, S) if labels is not None else shift)
        out["shift_labels"] = take(shift)
        n_items = batch.get("num_items_in_batch")
        out["num_items_in_batch"] = int((shift != IGNORE_INDEX).sum()) if n_items is None else n_items
    out["use_cache"] = False
    if plan.cp_size > 1:  # a second model run on this shard with sdpa (a teacher) is refused, not wrong
        guard_stock_attention()
    out["atac_shard"] = ShardContext(plan=plan, rank=rank, group=group, layout=plan.local_layout(rank),
                                     backend=backend, debug=debug)
    return out


def _check_num_items(n: Any) -> None:
    """``num_items_in_batch``: None, a number >= 0 (int or float: a count, or a count divided over
    ranks and micro-batches), or a one-element numeric tensor (Trainer's; its value is not read: that
    would sync the device). The loss divides by it, so a bool, a string or a non-finite or negative
    number would scale the loss silently."""
    if n is None:
        return
    if isinstance(n, np.ndarray) and n.size == 1 and n.dtype.kind in "iuf":
        n = n.item()
    if isinstance(n, torch.Tensor):
        if n.numel() != 1 or n.dtype == torch.bool or n.is_complex():
            raise ValueError(f"num_items_in_batch is a {tuple(n.shape)} {n.dtype} tensor: it must be the count of "
                             "target tokens the loss divides by, a number >= 0 or a one-element numeric tensor")
        return
    ok = isinstance(n, (int, float, np.integer, np.floating)) and not isinstance(n, (bool, np.bool_))
    if not ok or not math.isfinite(float(n)) or float(n) < 0:
        raise ValueError(f"num_items_in_batch={n!r} is invalid: it must be the count of target tokens the loss "
                         "divides by, a finite number >= 0 or a one-element numeric tensor (None: this batch's "
                         "own count)")


def _short(a: np.ndarray) -> str:
    a = np.asarray(a).tolist()
    return str(a) if len(a) <= 12 else f"{a[:12]}... ({len(a)} documents)"


def _check_group(plan: ShardPlan, rank: int, group: Any) -> None:
    if plan.cp_size == 1:
        return
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"cp_size={plan.cp_size} needs an initialized torch.distributed process group "
                         "(init_process_group) and the CP group as group=")
    size, grank = dist.get_world_size(group), dist.get_rank(group)
    if size != plan.cp_size:
        raise ValueError(f"the process group has {size} ranks but the plan is for cp_size={plan.cp_size}: "
                         "pass the CP group as group= (or plan with cp_size equal to its size)")
    if grank != rank:
        raise ValueError(f"rank={rank} but this process is rank {grank} of the CP group: pass rank=dist.get_rank(group)")


def batch_digest(batch: Mapping[str, Any]) -> str:
    """A short hash of the full rows (``input_ids``, ``labels``, ``shift_labels``,
    ``position_ids``): every CP rank must hold the same batch, not only the same document
    lengths (debug mode compares it across the group with the plan digest)."""
    h = hashlib.sha1()
    for key in ("input_ids", "labels", "shift_labels", "position_ids"):
        v = batch.get(key)
        if v is None:
            h.update(f"{key}:-".encode())
            continue
        a = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        a = np.ascontiguousarray(a.astype(np.int64, copy=False)).reshape(-1)
        h.update(f"{key}:{a.size}:".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def check_plan_digest(plan: ShardPlan, group: Any = None, *, content: str | None = None,
                      what: str = "plan digest check (debug)", ranks: str = "CP") -> None:
    """All-gather ``plan.digest`` (and ``content``, e.g. :func:`batch_digest`) over ``group`` in
    one collective; RuntimeError naming the ranks (``ranks``: the group's kind) and digests if they
    differ (``what``: the check's name where the collective itself fails)."""
    dev = group_device(group)
    text = plan.digest.encode("ascii").ljust(16, b"-")[:16] + (content or "").encode("ascii").ljust(16, b"-")[:16]
    mine = torch.tensor(list(text), dtype=torch.uint8, device=dev)
    world = dist.get_world_size(group)
    allg = torch.empty(world * 32, dtype=torch.uint8, device=dev)
    from .compat import all_gather_single

    try:
        all_gather_single(allg, mine, group=group)
    except RuntimeError as e:
        raise peer_failure(what, group, e) from e
    got = [bytes(allg[r * 32:(r + 1) * 32].tolist()).decode("ascii") for r in range(world)]
    digests = [g[:16] for g in got]
    if len(set(digests)) > 1:
        detail = ", ".join(f"rank {r}: {d}" for r, d in enumerate(digests))
        raise RuntimeError(f"the {ranks} ranks hold different shard plans ({detail}); every rank must plan the same "
                           "pack with the same strategy, cost model and options")
    contents = [g[16:] for g in got]
    if len(set(contents)) > 1:
        detail = ", ".join(f"rank {r}: {d}" for r, d in enumerate(contents))
        raise RuntimeError(f"the {ranks} ranks hold different batches with the same document lengths (batch digests "
                           f"{detail}); every rank of a {ranks} group must get the same full batch: check the "
                           "DataLoader sharding (the CP and TP ranks of one DP replica share its batches) and the "
                           "seeds")


def unshard(local: torch.Tensor, plan: ShardPlan, rank: int, group: Any = None) -> torch.Tensor:
    """Gather every rank's (1, n_local, ...) tensor back into (1, N, ...) row order (not differentiable).

    Rows are padded to the largest rank for an equal-size all-gather.

    Raises:
        TypeError: ``local`` is not a tensor or ``plan`` not a :class:`ShardPlan`.
        ValueError: ``rank`` outside the group, or ``local`` not (1, n, ...) with the n tokens
            the plan gives ``rank``.
    """
    if not isinstance(local, torch.Tensor) or not isinstance(plan, ShardPlan):
        raise TypeError(f"unshard takes a tensor and a ShardPlan, got {type(local).__name__} and "
                        f"{type(plan).__name__}")
    plan._check_rank(rank)
    counts = plan.rank_num_tokens()
    if local.dim() < 2 or local.shape[0] != 1 or local.shape[1] != int(counts[rank]):
        raise ValueError(f"local has shape {tuple(local.shape)}: it must be (1, {int(counts[rank])}, ...), this rank's "
                         f"tokens in the plan (rank {int(rank)} of {plan.cp_size}), as model(**shard_batch(...)) "
                         "returns them")
    x = local.detach().reshape(local.shape[1], *local.shape[2:])
    if plan.cp_size == 1:
        return x.unsqueeze(0).clone()
    m = int(counts.max())
    send = torch.zeros((m, *x.shape[1:]), dtype=x.dtype, device=x.device)
    send[: x.shape[0]] = x
    from .compat import all_gather_single

    allg = torch.empty((plan.cp_size * m, *x.shape[1:]), dtype=x.dtype, device=x.device)
    all_gather_single(allg, send, group=group)
    out = torch.empty((plan.num_tokens, *x.shape[1:]), dtype=x.dtype, device=x.device)
    for r in range(plan.cp_size):
        out[torch.as_tensor(plan.rank_token_indices(r), device=x.device)] = allg[r * m: r * m + int(counts[r])]
    return out.unsqueeze(0)

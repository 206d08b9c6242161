"""Per-batch CP work shared by the Trainer and the Accelerate helper: model checks, plan, shard,
target counting, gradient sum, and the balance figures that get logged.

Per packed batch on every rank of a CP group (the same batch on each)::

    local = sharder(batch, num_items_in_batch=N)   # plan_shards + shard_batch, timed
    loss = model(**local).loss                      # this rank's target sum / N
    loss.backward()                                 # then the CP ranks' gradients must be summed

``N`` is the global target count (every DP replica's batches of the step, counted once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ._hf_compat import track_group_holder
from ..packing.validate import InputTypeError
from .config import ATACConfig
from .config_files import check_count, short_repr
from ..attention.shard import IGNORE_INDEX
from ..attention.ids import as_long_ids
from .kv_bytes import model_kv_bytes_per_token  # noqa: F401  (re-exported)
from .targets import document_start_positions

__all__ = [
    "BatchSharder",
    "ShardStats",
    "check_model_shardable",
    "count_targets",
    "model_kv_bytes_per_token",
    "prepare_model",
    "sync_cp_gradients",
    "unwrap_base_model",
    "learned_position_limit",
    "check_position_limit",
    "check_token_ids",
    "token_limits",
]


# ---------------------------------------------------------------------------- models
_SUMMED = ("imbalance", "kv_mb", "planner_ms")  # the ShardStats fields pop_summary averages


def unwrap_base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP/FSDP/compile/PEFT wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):  # DDP
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif hasattr(model, "get_base_model") and callable(model.get_base_model):  # PEFT
            base = model.get_base_model()
            if base is model:
                break
            model = base
        else:
            break
    return model


def check_model_shardable(model: torch.nn.Module) -> None:
    """Refuse, with the reason, a model whose packed rows ATP-CP cannot shard exactly.

    The Trainer/Accelerate entry to :func:`atac_hf.check_model` (static rules, then the cached
    exactness probe on a tiny fp64 copy; installs the runtime guard on an accepted model).

    Raises:
        ValueError, NotImplementedError: naming the model class, the feature that breaks exactness
            (encoder-decoder, attention outside ``AttentionInterface``, no ``**kwargs`` in forward,
            attention dropout, position-dependent RoPE, chunked or mask-only windowed
            attention, non-attention token mixing, ...) and what to do instead.
    """
    from ..attention.model_check import check_model

    check_model(model)


def prepare_model(model: torch.nn.Module, config: ATACConfig | None = None) -> torch.nn.Module:
    """Check the model and select the ``atac_cp`` attention on it (in place; PEFT-wrapped models too).

    Idempotent. Returns ``model``.

    Raises:
        ValueError: see :func:`check_model_shardable`; a model tensor-parallelised at load time
            by transformers (:func:`~.tensor_parallel.check_not_presharded`).
        NotImplementedError: with ``config.cp_size > 1``, an MoE model that adds a router loss
            (:func:`~atac_hf.attention.model_check.router_loss_refusal`); attention sinks or
            logit soft-capping with an ``attention_backend`` other than ``sdpa`` / ``auto``.
    """
    from ..attention import ATTN_IMPLEMENTATION, register_attention
    from .tensor_parallel import check_not_presharded

    check_not_presharded(model)
    base = unwrap_base_model(model)
    if config is not None and hasattr(base, "config"):  # (before check_model_shardable adds the guard's hooks)
        from ..attention.model_check import router_loss_refusal

        refused = router_loss_refusal(base.config) if config.cp_size > 1 else None
        if refused is not None:
            exc, reason = refused
            raise exc(f"{type(base).__name__} (model_type {getattr(base.config, 'model_type', '?')!r}) {reason}")
        _check_score_features(base, config.attention_backend)
    check_model_shardable(model)
    register_attention()
    if getattr(base.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        base.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


def _check_score_features(base: torch.nn.Module, backend: str) -> None:
    """Refuse, before training, attention sinks or logit soft-capping with a backend that does not
    apply them (the ``atac_cp`` attention would refuse at its first call)."""
    from ..attention.runtime import SINK_BACKENDS

    if backend in SINK_BACKENDS:
        return
    cfg = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    uses = []
    if any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in base.modules()):
        uses.append("attention sinks (s_aux)")
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        uses.append(f"logit soft-capping (attn_logit_softcapping={cfg.attn_logit_softcapping})")
    if uses:
        raise NotImplementedError(
            f"{type(base).__name__} uses {' and '.join(uses)}, which attention_backend={backend!r} does not apply; "
            f"legal values for it: {list(SINK_BACKENDS)} (set attention_backend='sdpa' in ATACConfig)")


# ---------------------------------------------------------------------------- counting and gradients
def count_targets(batches: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> int:
    """Next-token targets in one or more full packed batches: what the loss sums.

    ``shift_labels`` when present, else ``labels`` less every document's first token (a target never
    crosses a document; ``labels[..., 1:]`` where the batch does not say where documents start).

    Raises:
        ValueError: a batch without ``labels`` or ``shift_labels`` (lists its keys).
    """
    given = batches
    batches = [given] if isinstance(given, Mapping) else list(given) \
        if isinstance(given, Iterable) and not isinstance(given, (str, bytes)) else None
    bad = None if batches is None else next((b for b in batches if not isinstance(b, Mapping)), None)
    if batches is None or bad is not None:
        what = type(given if batches is None else bad).__name__
        raise TypeError(f"count_targets / shard / count_items take a packed batch (a mapping with input_ids, "
                        f"labels, ...) or a list of them (the step's micro-batches), got {what}")
    total = 0
    for b in batches:
        if b.get("shift_labels") is not None:
            lab = torch.as_tensor(b["shift_labels"])
        elif b.get("labels") is not None:
            lab, starts = torch.as_tensor(b["labels"]), document_start_positions(b)
            if starts is not None and lab.numel() and int(starts.max(initial=0)) < lab.numel():
                total -= int(lab.reshape(-1)[torch.as_tensor(starts, device=lab.device)].ne(IGNORE_INDEX).sum())
            else:
                lab = lab[..., 1:]
        else:
            raise ValueError(f"a batch has no 'labels' or 'shift_labels' to count targets in; keys: {sorted(b)}; "
                             "collate it with PackedDataCollator (it builds labels, from input_ids where a sample "
                             "has none), or add 'labels' (-100 where no loss) to the batch")
        total += int(lab.ne(IGNORE_INDEX).sum())
    return total


def sync_cp_gradients(model: torch.nn.Module, group: Any = None) -> None:
    """Sum every parameter gradient over ``group`` (all_reduce SUM, bucketed by dtype and device).

    For loops that do not wrap the model in DDP/FSDP: after ``loss.backward()`` on each CP
    rank (loss = local target sum / global count), the summed gradient equals single-device
    training on the whole pack. With DP as well, pass the group of all ranks that hold a share
    of the step's batches (``None``: the default group). Under DDP/FSDP use
    :class:`~atac_hf.integrations.accelerate.ATACAccelerator` instead: it scales the loss so
    their gradient mean becomes this sum.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.grad is not None:
            buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n


def learned_position_limit(model: torch.nn.Module) -> tuple[int, str] | None:
    """``(positions, description)`` when ``model`` looks its positions up in a learned table of
    ``config.max_position_embeddings`` rows (GPT-2's ``wpe``, OPT's ``embed_positions``, ...): a document
    longer than that indexes past it. None for rotary and other computed positions (which extrapolate)."""
    base = unwrap_base_model(model)
    n = getattr(getattr(base, "config", None), "max_position_embeddings", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    inputs = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    for name, module in base.named_modules():
        last = name.rsplit(".", 1)[-1].lower()
        if isinstance(module, torch.nn.Embedding) and module is not inputs and ("pos" in last or last == "wpe") \
                and n <= module.num_embeddings <= n + 2:
            return n, (f"{type(base).__name__} looks positions up in a learned table of {n} rows ({name}, "
                       "config.max_position_embeddings)")
    return None


def token_limits(model: torch.nn.Module) -> tuple[int | None, int | None]:
    """``(input ids, label classes)``: the rows of ``model``'s input embedding table and the outputs of its
    LM head (None where either is not a plain ``nn.Embedding`` / ``nn.Linear``). Read from the modules'
    own sizes, which tensor parallelism leaves global."""
    base = unwrap_base_model(model)

    def get(name):
        try:
            return getattr(base, name)() if hasattr(base, name) else None
        except (AttributeError, NotImplementedError):  # remote-code models without the accessor
            return None

    emb, head = get("get_input_embeddings"), get("get_output_embeddings")
    return (emb.num_embeddings if isinstance(emb, torch.nn.Embedding) else None,
            head.out_features if isinstance(head, torch.nn.Linear) else None)


def check_token_ids(batch: Mapping[str, Any], limits: tuple[int | None, int | None]) -> None:
    """Refuse token ids outside ``[0, limits[0])`` and labels at or above ``limits[1]``:
    the embedding and the loss would fail with torch's bare ``IndexError`` (on CUDA a device-side assert
    that ends the process)."""
    checks = [("input_ids", limits[0], "input embedding table")] + \
             [(key, limits[1], "LM head's outputs") for key in ("labels", "shift_labels")]
    for key, n, what in checks:
        x = batch.get(key)
        if n is None or not isinstance(x, torch.Tensor) or x.numel() == 0:
            continue
        bad = (x >= n) | (x < 0) if key == "input_ids" else x >= n  # negative labels: refused before, by the caller
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{key}{list(where)} is {int(x[where])}, outside the model's {what} of {n} (legal: "
                             f"0..{n - 1}{'' if key == 'input_ids' else f', or {IGNORE_INDEX}'}): tokenize with the "
                             "model's own tokenizer, or call model.resize_token_embeddings(len(tokenizer)) after "
                             "adding tokens")


def _position_message(limit: tuple[int, str], length: int, where: str, max_tokens: int) -> str:
    n, what = limit
    return (f"{where} has {length} tokens, but {what}: positions {n}..{length - 1} are outside it (the model would "
            f"fail with 'index out of range'). Set max_tokens <= {n} (now {max_tokens}; longer samples are then "
            f"split into documents of at most max_tokens, overlength='split'), or truncate the samples to {n} tokens")


def check_position_limit(model: torch.nn.Module, dataset: Any, config: ATACConfig, name: str = "train_dataset"):
    """Refuse, before training, a ``datasets.Dataset`` whose longest sample, as packed (at most
    ``max_tokens``), is longer than ``model``'s learned position table (:func:`learned_position_limit`).
    Returns the limit (None: no learned table), for :attr:`BatchSharder.position_limit`."""
    limit = learned_position_limit(model)
    if limit is None or config.max_tokens <= limit[0] or dataset is None:
        return limit
    from ..packing.data.arrow_source import _is_hf_dataset
    from ..packing.data.dataset import dataset_lengths

    names = getattr(dataset, "column_names", None) or ()
    if not _is_hf_dataset(dataset) or "input_ids" not in names or {"seq_lengths", "position_ids"} & set(names) \
            or len(dataset) == 0:
        return limit  # pre-packed rows or other datasets: checked pack by pack (BatchSharder.plan)
    lengths = np.minimum(dataset_lengths(dataset), config.max_tokens)
    if int(lengths.max()) > limit[0]:
        row = int(np.argmax(lengths))
        raise ValueError(_position_message(limit, int(lengths[row]), f"{name} row {row}", config.max_tokens))
    return limit


_PAD_VALUES = {"input_ids": 0, "labels": IGNORE_INDEX, "shift_labels": IGNORE_INDEX, "position_ids": 0,
               "attention_mask": 1}


def pad_tiny_pack(batch: Mapping[str, Any], cp_size: int) -> Mapping[str, Any]:
    """A one-row pack of fewer tokens than ``cp_size`` (a lone short sample at the end of a pass: every CP
    rank needs a token) with one-token documents appended until each rank can hold one: token 0 at
    position 0 with label -100, each its own document, so no real token attends to it and it adds no
    target (the loss, its count and every gradient are unchanged). Other batches, and packs holding
    per-token columns this cannot pad, are returned as they are (``plan`` then names the problem)."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if cp_size <= 1 or not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1 \
            or not 0 < ids.shape[1] < cp_size:
        return batch
    S, k = int(ids.shape[1]), cp_size - int(ids.shape[1])
    per_token = [key for key, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() == 2
                 and tuple(v.shape) == (1, S)]
    if any(key not in _PAD_VALUES for key in per_token) or "position_ids" not in per_token:
        return batch
    out = dict(batch)
    for key in per_token:
        v = batch[key]
        out[key] = torch.cat([v, torch.full((1, k), _PAD_VALUES[key], dtype=v.dtype, device=v.device)], dim=1)
    seq = batch.get("seq_lengths")
    if seq is not None:
        seq = torch.as_tensor(seq).reshape(-1)
        out["seq_lengths"] = torch.cat([seq, torch.ones(k, dtype=seq.dtype, device=seq.device)])
    for key in ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k"):
        cu = batch.get(key)
        if cu is not None:
            cu = torch.as_tensor(cu).reshape(-1)
            out[key] = torch.cat([cu, cu[-1] + torch.arange(1, k + 1, dtype=cu.dtype, device=cu.device)])
    return out


# ---------------------------------------------------------------------------- sharder
@dataclass(frozen=True)
class ShardStats:
    """Balance figures of one pack's plan.

    Attributes:
        imbalance: estimated max / mean per-rank compute of the plan (1.0 is perfect).
        kv_mb: megabytes (1e6) of K/V one rank receives in the forward pass, all layers.
        planner_ms: wall milliseconds to find the documents and plan the pack.
        num_tokens: tokens in the pack.
        num_docs: documents in the pack.
        num_sharded: documents split over several ranks (anchors).
    """

    imbalance: float
    kv_mb: float
    planner_ms: float
    num_tokens: int
    num_docs: int
    num_sharded: int


class BatchSharder:
    """Plan and shard full packed batches for one CP rank, keeping balance statistics.

    Args:
        config: the run's :class:`ATACConfig` (strategy, backend, cap, min chunk, debug).
        cp_rank: this process's index in its CP group.
        cp_group: the CP process group (``None`` when ``cp_size`` is 1).
        cost_model: the planners' :class:`~atac_hf.cost.CostModel`.
        kv_bytes_per_token: K/V bytes of one token over all layers (for ``kv_mb``).
        device_type: ``"cuda"`` or ``"cpu"`` (default ``min_chunk``).
        strategy: sharding strategy; default ``config.sharding_strategy``.
        tp_group: with tensor parallelism, the TP group of this rank (its ranks must hold the same
            tokens): in ``debug`` mode each batch's plan and batch digests are compared over it too.
    """

    def __init__(self, config: ATACConfig, *, cp_rank: int = 0, cp_group: Any = None, cost_model: Any = None,
                 kv_bytes_per_token: float = 0.0, device_type: str = "cpu", strategy: str | None = None,
                 tp_group: Any = None) -> None:
        from ..cost import default_cost_model

        from ..sharding import STRATEGIES

        if not isinstance(config, ATACConfig):
            raise InputTypeError(f"config must be an ATACConfig, got {type(config).__name__}")
        self.config = config
        self.cp_size = config.cp_size
        self.cp_rank = check_count(cp_rank, "cp_rank", f"this process's index in its CP group, < cp_size="
                                   f"{config.cp_size}", low=0)
        if self.cp_rank >= config.cp_size:
            raise ValueError(f"cp_rank={cp_rank} is outside the CP group of size {config.cp_size} (legal: "
                             f"0..{config.cp_size - 1})")
        self.cp_group = cp_group
        self.cost_model = cost_model if cost_model is not None else default_cost_model()
        b = kv_bytes_per_token
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, float, np.integer, np.floating)) \
                or not 0 <= float(b) < np.inf:
            raise ValueError(f"kv_bytes_per_token={short_repr(b)} is invalid: a finite number >= 0 (K/V bytes of "
                             "one token over all layers)")
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.min_chunk = config.resolved_min_chunk(device_type)
        if strategy is not None and strategy not in STRATEGIES:
            raise ValueError(f"strategy={short_repr(strategy)} is not a sharding strategy; legal values: "
                             f"{sorted(STRATEGIES)}, or None for config.sharding_strategy")
        self.strategy = strategy or config.sharding_strategy
        self.tp_group = tp_group
        if cp_group is not None or tp_group is not None:
            track_group_holder(self)  # let the groups go before interpreter exit: _hf_compat (6)
        self._recorded: list[float] = [0.0] * 4  # since pop_summary: packs, then the sums of _SUMMED (a list of
        # stats would grow by one a step in a loop that never logs)
        self.last_plan = None
        self.last_stats: ShardStats | None = None
        #: ``(positions, what)`` of a model with a learned absolute position table (see
        #: :func:`learned_position_limit`): a longer document is refused before the model indexes past it
        self.position_limit: tuple[int, str] | None = None
        #: :func:`token_limits` of the model: ids and labels outside them are refused before the model runs
        self.token_limits: tuple[int | None, int | None] | None = None

    def bind_model(self, model: torch.nn.Module, position_limit: tuple[int, str] | None, *,
                   also: "BatchSharder | None" = None) -> None:
        """Set :attr:`position_limit` and :attr:`token_limits` from the model this sharder feeds; with ``also``
        (the sharder of a model prepared before, fed the same batches) the tighter of each."""
        self.position_limit, self.token_limits = position_limit, token_limits(model)
        if also is not None and also.position_limit is not None and (
                position_limit is None or also.position_limit[0] < position_limit[0]):
            self.position_limit = also.position_limit
        if also is not None and also.token_limits is not None:
            self.token_limits = tuple(min((n for n in pair if n is not None), default=None)
                                      for pair in zip(also.token_limits, self.token_limits))

    def plan(self, batch: Mapping[str, Any]):
        """The :class:`~atac_hf.sharding.ShardPlan` of a full packed batch, and its :class:`ShardStats`."""
        from ..attention import doc_lengths_from_batch
        from ..sharding import plan_shards

        t0 = time.perf_counter()
        lengths = doc_lengths_from_batch(batch)
        if self.position_limit is not None and lengths.size and int(lengths.max()) > self.position_limit[0]:
            raise ValueError(_position_message(self.position_limit, int(lengths.max()), "a document of this pack",
                                               self.config.max_tokens))
        plan = plan_shards(lengths, self.cp_size, self.strategy, self.cost_model,
                           max_tokens_per_rank=self.config.max_tokens_per_rank, min_chunk=self.min_chunk,
                           kv_exchange=self.config.kv_exchange)
        # plan_shards gives every rank a token whenever the pack has >= cp_size tokens; a smaller
        # pack (e.g. one short document, left by even_batches at the end of a pass) cannot run
        if self.cp_size > 1 and plan.num_tokens < self.cp_size:
            raise ValueError(f"a pack of {plan.num_tokens} tokens cannot be shared by cp_size={self.cp_size} "
                             "ranks (each needs >= 1 token); drop samples shorter than cp_size tokens")
        ms = (time.perf_counter() - t0) * 1e3
        stats = ShardStats(imbalance=float(plan.imbalance), kv_mb=plan.kv_bytes(self.kv_bytes_per_token) / 1e6,
                           planner_ms=ms, num_tokens=plan.num_tokens, num_docs=plan.num_docs,
                           num_sharded=int(len(plan.sharded_docs)))
        return plan, stats

    def __call__(self, batch: Mapping[str, Any], *, num_items_in_batch: Any = None, record: bool = True) -> dict:
        """This rank's inputs for ``model(**local)``: see :func:`atac_hf.attention.shard_batch`.

        Args:
            batch: a full packed batch (every CP rank passes the same one).
            num_items_in_batch: the global target count the loss divides by; ``None`` keeps the
                batch's own (or counts this batch alone).
            record: add this pack's :class:`ShardStats` to the means :meth:`pop_summary` returns (training batches).

        Raises:
            ValueError: a batch without ``input_ids`` (lists its keys), negative labels other than
                -100, token ids or labels outside the bound model's vocabulary (:meth:`bind_model`), or
                documents that cannot be found; see :func:`~atac_hf.attention.shard_batch`.
        """
        from ..attention import shard_batch
        from ..attention.batch_check import check_same_batch
        if "input_ids" not in batch:
            raise ValueError(f"a packed batch needs 'input_ids' (and 'position_ids' or 'seq_lengths'); "
                             f"keys found: {sorted(batch)}")
        batch = as_long_ids(batch)  # uint8/int16/int32/uint16 ids and labels: compared and padded in int64
        for key in ("labels", "shift_labels"):  # the loss ignores -100 only: -1 fails there (CUDA: device assert)
            labels = batch.get(key)
            bad = labels[(labels < 0) & (labels != IGNORE_INDEX)] if isinstance(labels, torch.Tensor) else ()
            if len(bad):
                raise ValueError(f"{key} holds {int(bad[0])}: labels must be token ids >= 0, or {IGNORE_INDEX} where "
                                 f"a token gets no loss (the only index the loss ignores); replace the other negative "
                                 f"labels with {IGNORE_INDEX} in the dataset")
        if self.token_limits is not None:
            check_token_ids(batch, self.token_limits)
        batch = pad_tiny_pack(batch, self.cp_size)
        plan, stats = self.plan(batch)
        if num_items_in_batch is not None:
            batch = {**batch, "num_items_in_batch": num_items_in_batch}
        if self.tp_group is not None and dist.get_world_size(self.tp_group) > 1:  # each computes its heads of one pack
            if self.config.debug:
                from ..attention.shard import batch_digest, check_plan_digest

                check_plan_digest(plan, self.tp_group, content=batch_digest(batch), ranks="TP")
            else:
                check_same_batch(plan, batch, self.tp_group, ranks="TP")
        if self.cp_size > 1 and not self.config.debug:  # (debug: shard_batch compares full digests)
            check_same_batch(plan, batch, self.cp_group)
        local = shard_batch(batch, plan, self.cp_rank, self.cp_group, backend=self.config.attention_backend,
                            debug=self.config.debug)
        if record:
            n, *sums = self._recorded
            self._recorded = [n + 1, *(t + getattr(stats, k) for t, k in zip(sums, _SUMMED))]
        self.last_plan, self.last_stats = plan, stats
        return local

    def pop_summary(self) -> dict[str, float]:
        """Mean ``imbalance``, ``kv_mb`` and ``planner_ms`` since the last call (empty if no batch)."""
        (n, *sums), self._recorded = self._recorded, [0.0] * 4
        return {k: float(t / n) for k, t in zip(_SUMMED, sums)} if n else {}

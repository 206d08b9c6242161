"""The one entry point of the sharding planners: :func:`plan_shards` and its strategy registry.

Every planner is a pure, deterministic function of (document lengths, cp_size,
cost model, options): no torch, no communication. No strategy needs document
lengths divisible by anything and none pads: head-tail splits spread the
remainder instead.

Strategies:
    atp          anchor-tail: the j most expensive documents are split head-tail
                 over all ranks, the rest stay whole; j is chosen by estimated
                 block time (compute + exposed K/V exchange), and the anchors' chunks
                 level the ranks in tokens and attention pairs where the tails allow;
                 where the K/V exchange is exposed, anchors may go to sub-groups of
                 ranks instead, and the K/V travel by all-gather or by an all-to-all
                 of only the needed rows, whichever is estimated faster.
    contiguous   Llama-3 style all-gather CP: the row cut into C contiguous runs.
    zigzag       head-tail over the whole row (torch / Accelerate default).
    per_doc      head-tail inside every document (Megatron THD, WLB-LLM per-doc).
    wlb_adaptive per pack, the faster of zigzag and per_doc by estimated latency.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..cost import CostModel, default_cost_model
from .atp import plan_atp
from .baselines import plan_contiguous, plan_per_doc, plan_wlb_adaptive, plan_zigzag
from .exchange import EXCHANGES
from .plan import ShardPlan
from .segments import check_doc_lengths, fill_empty_ranks, finish_plan, is_int, per_doc_segments

__all__ = ["MAX_CP_SIZE", "MAX_PLAN_SEGMENTS", "STRATEGIES", "plan_shards"]

#: Largest CP group planned: far above any real one (CP groups are 2-256 ranks), and low
#: enough that a plan, one segment list per rank, is built in well under a second.
MAX_CP_SIZE = 2**12
#: Most (rank, document) chunks a pack may give the planners to consider (the per-document
#: head-tail layout, which ``atp`` also prices, has about sum_d min(L_d, 2 C) of them). A real
#: pack has far fewer (4M tokens of 8K-token documents at cp 128: 128K; 10^6 one-token
#: documents: 10^6); the bound keeps every plan within about a second and ~100 MB.
MAX_PLAN_SEGMENTS = 2**20
#: Largest token cap or chunk size accepted (keeps the planners' int64 arithmetic exact).
_MAX_TOKENS = 2**62

STRATEGIES: dict[str, Callable[..., ShardPlan]] = {
    "atp": plan_atp,
    "contiguous": plan_contiguous,
    "zigzag": plan_zigzag,
    "per_doc": plan_per_doc,
    "wlb_adaptive": plan_wlb_adaptive,
}


def plan_shards(
    doc_lengths: Any,
    cp_size: int,
    strategy: str = "atp",
    cost_model: CostModel | None = None,
    *,
    max_tokens_per_rank: int | None = None,
    min_chunk: int = 1,
    max_anchors: int | None = None,
    kv_exchange: str | None = None,
) -> ShardPlan:
    """Plan how the documents of one pack are spread over a CP group.

    Args:
        doc_lengths: lengths of the pack's documents in row order (ints >= 1).
        cp_size: ranks in the CP group (>= 1).
        strategy: one of :data:`STRATEGIES`.
        cost_model: costs segments; :func:`~atac_hf.cost.default_cost_model` if None.
        max_tokens_per_rank: memory cap on tokens per rank, or None for no cap. ``atp``
            respects every cap that some placement can respect (>= ceil(tokens / cp_size)),
            falling back to a contiguous split when nothing better fits.
        min_chunk: ``atp`` only: a document is an anchor candidate only when each of
            its ``2 * cp_size`` chunks gets at least this many tokens (128 on GPU).
        max_anchors: ``atp`` only: largest number of anchors tried (default: all).
        kv_exchange: how gathered K/V travel: ``"all_gather"``, ``"all_to_all"`` (each rank
            receives only the key prefixes its chunks attend to), ``"auto"`` (the one the
            cost model estimates faster), or None: the strategy's own (``atp``: ``auto``;
            the baselines, modelled on all-gather CP systems: ``all_gather``). ``atp`` plans
            for the exchange given: its candidates are costed with it.

    Returns:
        The :class:`ShardPlan`. Every rank holds at least one token when the pack has at
        least ``cp_size`` tokens, whatever the strategy.

    Raises:
        ValueError: empty pack, a length < 1 or not an int (bools included), more than 2**62
            tokens, cp_size < 1 or over :data:`MAX_CP_SIZE`, a pack and cp_size that would give
            more than :data:`MAX_PLAN_SEGMENTS` chunks, a cost model that prices all work at
            0 s, an unknown strategy, a bad ``max_tokens_per_rank``/``min_chunk``/
            ``max_anchors``/``kv_exchange``, or a cap the strategy cannot respect (for
            ``atp``: a cap no placement can respect).
        TypeError: ``cost_model`` is not a :class:`~atac_hf.cost.CostModel`.
    """
    lengths = check_doc_lengths(doc_lengths)
    if not is_int(cp_size) or not 1 <= cp_size <= MAX_CP_SIZE:
        raise ValueError(f"cp_size must be an int >= 1 and <= {MAX_CP_SIZE} (MAX_CP_SIZE), got {_short(cp_size)} "
                         "(set cp_size in the ATAC config / --cp-size)")
    try:
        fn = STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown sharding strategy {strategy!r}; legal values: {sorted(STRATEGIES)} (set sharding_strategy)"
        ) from None
    if max_tokens_per_rank is not None and (not is_int(max_tokens_per_rank)
                                            or not 1 <= max_tokens_per_rank <= _MAX_TOKENS):
        raise ValueError(f"max_tokens_per_rank must be >= 1 or None (an int), at most 2**62, got "
                         f"{_short(max_tokens_per_rank)} (set max_tokens_per_rank)")
    if not is_int(min_chunk) or not 1 <= min_chunk <= _MAX_TOKENS:
        raise ValueError(f"min_chunk must be >= 1 (an int), at most 2**62, got {_short(min_chunk)} (set min_chunk)")
    if max_anchors is not None and (not is_int(max_anchors) or max_anchors < 0):
        raise ValueError(f"max_anchors must be an int >= 0 or None, got {_short(max_anchors)}")
    if kv_exchange is not None and (not isinstance(kv_exchange, str) or kv_exchange not in ("auto", *EXCHANGES)):
        raise ValueError(f"kv_exchange must be None or one of {['auto', *EXCHANGES]}, got "
                         f"{_short(kv_exchange)} (set kv_exchange)")
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel or None, got {type(cost_model).__name__}")
    segments = int(np.minimum(lengths, 2 * int(cp_size)).sum())  # chunks of head-tail inside every document
    if segments > MAX_PLAN_SEGMENTS:
        raise ValueError(f"planning {len(lengths)} documents ({float(lengths.sum()):.3g} tokens) over cp_size="
                         f"{int(cp_size)} means up to {segments} segments, more than {MAX_PLAN_SEGMENTS} "
                         "(MAX_PLAN_SEGMENTS): pack fewer tokens per row or lower cp_size")
    cm = cost_model if cost_model is not None else default_cost_model()
    cm.check_prices_compute("cost_model / cost_profile / --profile")
    plan = fn(lengths, int(cp_size), cm, max_tokens_per_rank=None if max_tokens_per_rank is None
              else int(max_tokens_per_rank), min_chunk=int(min_chunk),
              max_anchors=None if max_anchors is None else min(int(max_anchors), len(lengths)),
              kv_exchange=kv_exchange)
    # >= 1 token per rank whenever the pack has >= cp_size tokens (costed for the exchange asked for)
    filled = fill_empty_ranks(plan, cm, kv_exchange)
    if filled is not plan and strategy == "atp":
        # atp chose a layout with an idle rank, costed before the fill (plan_atp fills its flat plans
        # itself; a guard for any other): its per_doc candidate, filled the same way, may now be faster
        # (atp is never worse than per_doc)
        even = fill_empty_ranks(finish_plan(lengths, int(cp_size), "atp", per_doc_segments(lengths, int(cp_size)),
                                            None, cm, kv_exchange or "auto"), cm, kv_exchange)
        fits = max_tokens_per_rank is None or int(even.rank_num_tokens().max()) <= max_tokens_per_rank
        if fits and even.block_time_s < filled.block_time_s:
            filled = even
    plan = filled
    if kv_exchange is not None:
        if kv_exchange != plan.kv_exchange:
            plan = finish_plan(plan.doc_lengths, plan.cp_size, plan.strategy, list(plan.segments),
                               plan.gathered_docs, cm, kv_exchange)
    if max_tokens_per_rank is not None:
        worst = int(plan.rank_num_tokens().max())
        if worst > max_tokens_per_rank:
            raise CapExceededError(
                f"strategy {strategy!r} puts {worst} tokens on one rank, over max_tokens_per_rank="
                f"{max_tokens_per_rank} ({int(lengths.sum())} tokens over cp_size={cp_size}); raise the cap, "
                "raise cp_size or pack fewer tokens"
            )
    return plan


class CapExceededError(ValueError):
    """A strategy's plan puts more tokens on a rank than ``max_tokens_per_rank`` (another strategy,
    ``atp`` among them, may still fit the cap)."""


def _short(v: Any) -> str:
    """repr for messages, cut short (huge ints have no repr past 4300 digits)."""
    if isinstance(v, int) and abs(v) > 10**30:
        return f"<int of {v.bit_length()} bits>"
    text = repr(v) if isinstance(v, (int, float, str, type(None), np.generic)) else f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."

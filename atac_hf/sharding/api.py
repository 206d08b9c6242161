"""The one entry point of the sharding planners: :func:`plan_shards` and its strategy registry.

Every planner is a pure, deterministic function of (document lengths, cp_size,
cost model, options): no torch, no communication. No strategy needs document
lengths divisible by anything and none pads: head-tail splits spread the
remainder instead.

Strategies:
    atp          anchor-tail: the j most expensive documents are split head-tail
                 over all ranks, the rest stay whole; j is chosen by estimated
                 block time (compute + exposed K/V exchange), and the anchors' chunks
                 level the ranks in tokens and attention pairs where the tails allow.
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
from .plan import ShardPlan
from .segments import check_doc_lengths, is_int

__all__ = ["STRATEGIES", "plan_shards"]

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

    Returns:
        The :class:`ShardPlan`.

    Raises:
        ValueError: empty pack, a length < 1 or not an int, more than 2**62 tokens,
            cp_size < 1, an unknown strategy, a bad ``max_tokens_per_rank``/``min_chunk``/
            ``max_anchors``, or a cap the strategy cannot respect (for ``atp``: a cap no
            placement can respect).
        TypeError: ``cost_model`` is not a :class:`~atac_hf.cost.CostModel`.
    """
    lengths = check_doc_lengths(doc_lengths)
    if isinstance(cp_size, bool) or not isinstance(cp_size, (int, np.integer)) or cp_size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r} (set cp_size in the ATAC config)")
    try:
        fn = STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown sharding strategy {strategy!r}; legal values: {sorted(STRATEGIES)} (set sharding_strategy)"
        ) from None
    if max_tokens_per_rank is not None and (not is_int(max_tokens_per_rank) or max_tokens_per_rank < 1):
        raise ValueError(f"max_tokens_per_rank must be >= 1 or None (an int), got {max_tokens_per_rank!r} "
                         "(set max_tokens_per_rank)")
    if not is_int(min_chunk) or min_chunk < 1:
        raise ValueError(f"min_chunk must be >= 1 (an int), got {min_chunk!r} (set min_chunk)")
    if max_anchors is not None and (not is_int(max_anchors) or max_anchors < 0):
        raise ValueError(f"max_anchors must be an int >= 0 or None, got {max_anchors!r}")
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel or None, got {type(cost_model).__name__}")
    cm = cost_model if cost_model is not None else default_cost_model()
    plan = fn(lengths, int(cp_size), cm, max_tokens_per_rank=max_tokens_per_rank,
              min_chunk=int(min_chunk), max_anchors=max_anchors)
    if max_tokens_per_rank is not None:
        worst = int(plan.rank_num_tokens().max())
        if worst > max_tokens_per_rank:
            raise ValueError(
                f"strategy {strategy!r} puts {worst} tokens on one rank, over max_tokens_per_rank="
                f"{max_tokens_per_rank} ({int(lengths.sum())} tokens over cp_size={cp_size}); raise the cap, "
                "raise cp_size or pack fewer tokens"
            )
    return plan

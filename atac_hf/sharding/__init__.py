"""Sharding a packed row over a context-parallel group (pure numpy planners).

* :mod:`.api` - :func:`plan_shards`, the one entry point, and the strategy registry.
* :mod:`.atp` - ATP-CP, anchor-tail sharding.
* :mod:`.baselines` - contiguous, zigzag, per_doc, wlb_adaptive.
* :mod:`.segments` - shared head-tail bounds, segment lists and plan costing.
* :mod:`.plan` - :class:`ShardPlan` and the per-rank layouts it derives.
"""

from .api import MAX_CP_SIZE, MAX_PLAN_SEGMENTS, STRATEGIES, plan_shards
from .plan import LocalLayout, ShardPlan, VarlenLayout
from .segments import head_tail_bounds

__all__ = ["MAX_CP_SIZE", "MAX_PLAN_SEGMENTS", "ShardPlan", "LocalLayout", "VarlenLayout", "plan_shards", "STRATEGIES", "head_tail_bounds"]

"""Sharding a packed row over a context-parallel group (pure numpy planners)."""

from .plan import LocalLayout, ShardPlan, VarlenLayout
from .planners import STRATEGIES, head_tail_bounds, plan_shards

__all__ = ["ShardPlan", "LocalLayout", "VarlenLayout", "plan_shards", "STRATEGIES", "head_tail_bounds"]

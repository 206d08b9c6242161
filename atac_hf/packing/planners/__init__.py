"""The per-window packing planners (numpy only), driven by :class:`~atac_hf.packing.StreamPacker`.

* :mod:`.wfap` - WFAP: cost-balanced packs with bounded deferral of heavy samples.
* :mod:`.baselines` - sequential, best-fit decreasing (TRL's ``bfd``) and WLB-LLM.
* :mod:`.window` - what every planner shares: the pool item, the window context, and the
  placement of overdue and leftover items.

Each planner takes ``(items, ctx)`` and returns ``(packs, carry, splits)``; the registry by
strategy name is :data:`atac_hf.packing.stream.PLANNERS`.
"""

from .baselines import plan_bfd, plan_sequential, plan_wlb
from .wfap import plan_wfap

__all__ = ["plan_bfd", "plan_sequential", "plan_wfap", "plan_wlb"]

"""Pipeline-level simulator (DP x PP x CP x TP, explicit 1F1B), workloads and the
benchmark report. Reuses the real packing and sharding planners. Numpy only
(matplotlib for plots and ``datasets`` for dataset workloads load lazily)."""

from .cluster import ClusterConfig
from .results import NAMED_COMBINATIONS, PACKINGS, SHARDINGS, ComboResult, SimResult, combo_label
from .schedule import PipelineTimeline, forward_only, one_f_one_b
from .simulate import balanced_step_time, simulate
from ..workloads import BUILTIN_WORKLOADS, load_workload

__all__ = [
    "BUILTIN_WORKLOADS",
    "ClusterConfig",
    "ComboResult",
    "NAMED_COMBINATIONS",
    "PACKINGS",
    "PipelineTimeline",
    "SHARDINGS",
    "SimResult",
    "balanced_step_time",
    "combo_label",
    "forward_only",
    "load_workload",
    "one_f_one_b",
    "simulate",
]

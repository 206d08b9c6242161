"""Result containers of the simulator: one combination, one scenario.

Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sharding.api import CapExceededError
from .cluster import ClusterConfig

__all__ = ["PACKINGS", "SHARDINGS", "NAMED_COMBINATIONS", "ComboResult", "NoCombinationFitsError", "RefusedCombo",
           "SimResult", "UnknownComboError", "combo_label"]

PACKINGS = ("sequential", "bfd", "wlb", "wfap")
SHARDINGS = ("contiguous", "zigzag", "per_doc", "wlb_adaptive", "atp")
NAMED_COMBINATIONS = {
    "HF default": ("sequential", "zigzag"),
    "WLB-LLM": ("wlb", "wlb_adaptive"),
    "ATAC": ("wfap", "atp"),
}
_LABELS = {v: k for k, v in NAMED_COMBINATIONS.items()}


def combo_label(packing: str, sharding: str) -> str:
    """``"ATAC"``, ``"HF default"``, ``"WLB-LLM"`` or ``"<packing>+<sharding>"``."""
    return _LABELS.get((packing, sharding), f"{packing}+{sharding}")


@dataclass(frozen=True)
class RefusedCombo:
    """A combination that did not run: one of its packs' plans breaks the per-rank token cap
    (``reason``: which pack, by how much, and the cap's setting)."""

    packing: str
    sharding: str
    reason: str

    @property
    def label(self) -> str:
        return combo_label(self.packing, self.sharding)

    def row(self) -> dict[str, Any]:
        """Its row of :meth:`SimResult.to_dict`'s ``combinations``."""
        return {"label": self.label, "packing": self.packing, "sharding": self.sharding, "refused": self.reason}


def _as_label(x: Any) -> Any:
    """A ``"packing+sharding"`` label as :func:`combo_label` writes it (``"wfap+atp"`` -> ``"ATAC"``)."""
    if isinstance(x, str) and "+" in x:
        p, s = (t.strip() for t in x.split("+", 1))
        if p in PACKINGS and s in SHARDINGS:
            return combo_label(p, s)
    return x


class UnknownComboError(KeyError, ValueError):
    """A label that names no combination of a :class:`SimResult` (a ``KeyError``, as before, and a
    ``ValueError``); the message names the legal labels."""

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


class NoCombinationFitsError(CapExceededError):
    """No combination of a run fits the per-rank token cap (a ValueError); ``refused`` holds
    every combination's :class:`RefusedCombo`, by label."""

    def __init__(self, message: str, refused: dict[str, RefusedCombo]):
        super().__init__(message)
        self.refused = dict(refused)

    def __reduce__(self):  # picklable (bench's worker processes)
        return (type(self), (str(self), self.refused))


@dataclass
class ComboResult:
    """Measured steps of one packing x sharding combination.

    Arrays: ``S`` steps (flush steps included), ``N`` packs.

    Attributes:
        step_time_s, lb_time_s, tokens: (S,) step time, balance lower bound, tokens trained.
        pack_time_s: (N,) per-layer fwd+bwd time of each pack's CP group (block time).
        cp_imbalance: (N,) max / mean per-rank compute of each pack.
        kv_bytes: (N,) K/V bytes each rank receives per layer (forward).
        step_mb_imbalance: (S,) max / mean pack time within each step.
        shard_s: (N,) planner seconds per pack; pack_s: (S,) packing seconds per window.
        padding_share, fragmentation, delay_mean, delay_max, split_work_saving: packing metrics
            (:func:`atac_hf.sim.feed.packing_metrics`).
    """

    packing: str
    sharding: str
    step_time_s: np.ndarray
    lb_time_s: np.ndarray
    tokens: np.ndarray
    pack_time_s: np.ndarray
    cp_imbalance: np.ndarray
    kv_bytes: np.ndarray
    step_mb_imbalance: np.ndarray
    shard_s: np.ndarray
    pack_s: np.ndarray
    padding_share: float
    fragmentation: float
    delay_mean: float
    delay_max: int
    num_micro_batches: int
    split_work_saving: float = 0.0

    @property
    def label(self) -> str:
        return combo_label(self.packing, self.sharding)

    @property
    def time_s(self) -> float:
        return float(self.step_time_s.sum())

    @property
    def throughput(self) -> float:
        """Tokens per second of the whole cluster."""
        return float(self.tokens.sum()) / self.time_s if self.time_s > 0 else 0.0

    @property
    def lb_ratio(self) -> float:
        """Time / balance lower bound (1.0: perfectly balanced)."""
        lb = float(self.lb_time_s.sum())
        return self.time_s / lb if lb > 0 else float("nan")

    @property
    def lb_throughput(self) -> float:
        lb = float(self.lb_time_s.sum())
        return float(self.tokens.sum()) / lb if lb > 0 else 0.0

    def metrics(self) -> dict[str, Any]:
        """Flat JSON-friendly summary.

        ``throughput_tok_s``: tokens / total time; ``step_time_s``: mean step; ``lb_ratio``:
        time / balance lower bound; ``cp_imbalance``: mean over packs of max / mean rank
        compute; ``mb_imbalance``: mean over steps of max / mean pack time; ``pack_time_cv``:
        std / mean of pack times (dispersion); ``kv_mb_per_layer``: K/V MiB each rank receives
        per layer (forward), mean over packs; ``planner_ms_per_step``: packing of one window
        plus ``micro-batches x`` the mean sharding time of a pack (replicas plan in
        parallel); packing metrics as in :func:`atac_hf.sim.feed.packing_metrics`.
        """
        pt = self.pack_time_s
        return {
            "label": self.label,
            "packing": self.packing,
            "sharding": self.sharding,
            "throughput_tok_s": self.throughput,
            "step_time_s": float(self.step_time_s.mean()),
            "lb_ratio": self.lb_ratio,
            "cp_imbalance": float(self.cp_imbalance.mean()),
            "mb_imbalance": float(self.step_mb_imbalance.mean()),
            "pack_time_cv": float(pt.std() / pt.mean()) if pt.size and pt.mean() > 0 else 0.0,
            "kv_mb_per_layer": float(self.kv_bytes.mean() / 2**20) if self.kv_bytes.size else 0.0,
            "fragmentation": self.fragmentation,
            "split_work_saving": self.split_work_saving,
            "padding_share": self.padding_share,
            "delay_mean": self.delay_mean,
            "delay_max": self.delay_max,
            "num_steps": int(self.step_time_s.size),
            "planner_ms_per_step": 1e3 * (float(self.pack_s.mean()) + self.num_micro_batches
                                          * float(self.shard_s.mean() if self.shard_s.size else 0.0)),
            "tokens": int(self.tokens.sum()),
        }


@dataclass
class SimResult:
    """All combinations of one scenario.

    Attributes:
        cluster: the simulated cluster.
        workload: a label of the workload.
        combos: label -> :class:`ComboResult`, in run order.
        num_samples: samples in the stream every packer consumed.
        windows: packing strategy -> sample ids fed in each of its windows.
        packs: packing strategy -> per step, its packs (spans ``(sample, start, end)``,
            sample = index into the stream), in deal order.
        stream: the sample lengths of the stream (index = sample id).
        sample_pack: lengths of one heavy pack and per-rank compute of it under every
            sharding strategy that fits the per-rank cap (``{"lengths": [...], "rank_s":
            {strategy: [...]}, "refused": {strategy: reason}}``).
        refused: label -> :class:`RefusedCombo`, the combinations over the per-rank token cap
            (not in ``combos``; no figure, speedup or strongest baseline is computed from them).
    """

    cluster: ClusterConfig
    workload: str
    combos: dict[str, ComboResult]
    num_samples: int
    seed: int
    windows: dict[str, list[list[int]]] = field(default_factory=dict, repr=False)
    packs: dict[str, list[list[list[tuple[int, int, int]]]]] = field(default_factory=dict, repr=False)
    stream: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    sample_pack: dict[str, Any] = field(default_factory=dict)
    refused: dict[str, RefusedCombo] = field(default_factory=dict)

    @property
    def runnable(self) -> bool:
        """Whether the atac-hf integration runs this cluster today (see :meth:`ClusterConfig.what_if_reasons`)."""
        return self.cluster.runnable

    def speedup(self, label: str, over: str) -> float:
        """Throughput of ``label`` / throughput of ``over`` (each a label of :attr:`combos`, e.g.
        ``"ATAC"``, or its ``"packing+sharding"`` form, e.g. ``"wfap+atp"``).

        Raises:
            ValueError: either was refused (over the per-rank token cap); :class:`UnknownComboError` (a
            KeyError and a ValueError): either was not run (the message names the labels that ran).
        """
        label, over = _as_label(label), _as_label(over)
        for x in (label, over):
            if x in self.refused:
                raise ValueError(f"no speedup of {label!r} over {over!r}: {x!r} was refused ({self.refused[x].reason})")
        for x in (label, over):
            if x not in self.combos:
                shown = repr(x) if len(repr(x)) <= 80 else repr(x)[:77] + "..."
                raise UnknownComboError(f"no combination {shown} in this result: legal labels {list(self.combos)} "
                                        "(combination names such as 'ATAC', or 'packing+sharding')")
        return self.combos[label].throughput / self.combos[over].throughput

    def speedup_or_nan(self, label: str, over: str) -> float:
        """:meth:`speedup`, NaN where either was refused or not run."""
        label, over = _as_label(label), _as_label(over)
        return self.speedup(label, over) if label in self.combos and over in self.combos else float("nan")

    def strongest_baseline(self, exclude: str = "ATAC") -> str:
        """The fastest combination that ran, other than ``exclude`` (refused ones never count).

        Raises:
            ValueError: no combination other than ``exclude`` ran (simulate a baseline too).
        """
        others = [k for k in self.combos if k != exclude]
        if not others:
            raise ValueError(f"no baseline in this result: only {list(self.combos)} ran (refused: "
                             f"{list(self.refused)}); simulate another combination beside {exclude!r}")
        return max(others, key=lambda k: self.combos[k].throughput)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"workload": self.workload, "cluster": self.cluster.to_dict(),
                               "runnable": self.cluster.runnable,
                               "what_if_reasons": list(self.cluster.what_if_reasons()),
                               "num_samples": self.num_samples, "seed": self.seed,
                               "combinations": [c.metrics() for c in self.combos.values()]
                               + [r.row() for r in self.refused.values()]}
        base = {"HF default": "vs_hf_default", "WLB-LLM": "vs_wlb_llm"}
        if "ATAC" in self.refused:  # no ratio is computed from a refused combination, and that is said
            out["speedup_omitted"] = {"all": "ATAC refused"}
        if "ATAC" in self.combos:
            out["speedup"] = {v: self.speedup("ATAC", k) for k, v in base.items() if k in self.combos}
            omitted = {v: f"{k} refused" for k, v in base.items() if k in self.refused}
            if omitted:
                out["speedup_omitted"] = omitted
            if len(self.combos) > 1:
                best = self.strongest_baseline()
                out["speedup"]["vs_strongest"] = self.speedup("ATAC", best)
                out["strongest_baseline"] = best
        if "HF default" in self.combos:
            out["limit_vs_hf_default"] = self.combos["HF default"].lb_ratio
        return out



"""Robustness to cost-model error: plan with one cost model, time with another.

The planners balance the cost model's *estimate*; on real hardware the estimate is never
exact (attention efficiency changes with length, head dims and kernel; presets are
estimates; calibration has a few percent of error, more at new shapes). This module runs
the simulator with the cluster's model planning every pack and shard, and an *evaluation*
model timing them: the cluster's model with its attention price scaled by ``k`` (0.5x-2x:
the band of the issue's check), or another profile. Every time, bound and ratio is then
what those plans cost at the true prices.

Numpy only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..cost import CostModel
from ..cost.model import MAX_PRICE_S, scale_attention_price
from ..packing.metrics import pack_costs
from .cluster import ClusterConfig
from .results import SimResult
from .simulate import simulate

__all__ = ["DEFAULT_SCALES", "RobustnessRun", "run_robustness", "robustness_rows", "robustness_summary",
           "robustness_summary_lines", "robustness_table",
           "scale_attention", "window_imbalance_stats", "time_weighted_imbalance", "formula_lb_ratio"]

#: Attention price ratios of the evaluation model to the planning one.
DEFAULT_SCALES = (0.5, 1.0, 2.0)


def scale_attention(cost_model: CostModel, scale: float) -> CostModel:
    """``cost_model`` with every attention pair price (causal and masked) times ``scale``.

    Raises:
        ValueError: ``scale`` is not a finite number > 0.
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"attention price scale must be a finite number > 0, got {scale!r} (set --eval-attn-scale)")
    top = max(cost_model.attn_s_per_pair, cost_model.masked_attn_s_per_pair or 0.0)
    if top * float(scale) > MAX_PRICE_S:
        raise ValueError(f"attention price scale {float(scale):g} prices a pair at {top * float(scale):g} s, over the "
                         f"cost model's {MAX_PRICE_S:g} s bound; legal scales for this model: up to "
                         f"{MAX_PRICE_S / top:g} (set --eval-attn-scale)")
    return scale_attention_price(cost_model, float(scale), name=f"{cost_model.name}x{float(scale):g}attn")


@dataclass(frozen=True)
class RobustnessRun:
    """One evaluation model: its label, the model, and the simulator's result under it."""

    label: str
    eval_model: CostModel
    result: SimResult


def run_robustness(lengths: Any, cluster: ClusterConfig, *, scales: Sequence[float] = DEFAULT_SCALES,
                   profiles: Sequence[str] = (), **simulate_kwargs: Any) -> list[RobustnessRun]:
    """Simulate with the cluster's model planning and each evaluation model timing.

    Args:
        lengths: the workload's sample lengths.
        cluster: the cluster (its cost model plans).
        scales: attention price ratios of the evaluation models (1.0: the planning model itself).
        profiles: cost profile paths, each an evaluation model too (e.g. a profile calibrated
            on the hardware timing plans made with a preset), checked against the cluster's
            model and tp_size like :attr:`ClusterConfig.profile` and built the same way
            (:meth:`ClusterConfig.profile_cost_model`: the profile's compute, this cluster's
            CP link, node topology and TP all-reduces).
        **simulate_kwargs: passed to :func:`~atac_hf.sim.simulate` (combos, num_steps, seed, ...).

    Raises:
        ValueError: a bad scale; ``scales`` or ``profiles`` not a list; a profile that cannot
            be read or was measured for another model or tp_size. Nothing is simulated then.
    """
    for name, seq, item in (("scales", scales, "attention price ratios"), ("profiles", profiles, "profile paths")):
        if isinstance(seq, (str, bytes, os.PathLike)) or not isinstance(seq, (Sequence, np.ndarray)):
            raise ValueError(f"run_robustness {name}={seq!r:.80} must be a list of {item} (pass [{name[:-1]}]; "
                             f"set --eval-{'attn-scale' if name == 'scales' else 'profile'})")
    cm = cluster.cost_model()
    models = [(f"attention x{float(s):g}", scale_attention(cm, s)) for s in scales]
    for path in profiles:  # every profile checked before anything runs
        prof = cluster.profile_cost_model(path, setting="the evaluation profile (--eval-profile / "
                                                        "run_robustness(profiles=...))")
        models.append((f"profile {prof.name}", prof))
    return [RobustnessRun(label, m, simulate(lengths, cluster, eval_cost_model=m, **simulate_kwargs))
            for label, m in models]


def _window_ratios(result: SimResult, packing: str, cost_model: CostModel, steady: bool) -> list[tuple[float, float]]:
    """(max, mean) pack cost of every full window (``steady``: only those before the
    stream's last fed window, i.e. neither the last window of arrivals nor a flush one)."""
    per_step = result.cluster.packs_per_step
    fed = len(result.windows.get(packing, [])) if steady else None
    out = []
    for w, win in enumerate(result.packs.get(packing, [])):
        if len(win) < per_step or (fed is not None and w >= fed - 1):
            continue
        c = pack_costs(win, cost_model)
        if c.mean() > 0:
            out.append((float(c.max()), float(c.mean())))
    return out


def window_imbalance_stats(result: SimResult, packing: str, cost_model: CostModel, *,
                           steady: bool = False) -> tuple[float, float]:
    """(mean, worst) over full windows of max/mean pack cost, costed by ``cost_model``.

    Windows with fewer packs than the step's (the stream's last, flushed ones) are left out,
    as in the packing benchmark. ``steady``: also the stream's last window of arrivals and
    the flush windows (the end of a finite stream leaves windows that no planner can fill
    evenly: few samples left, or only the held-back heavy ones).
    """
    ratios = [m / a for m, a in _window_ratios(result, packing, cost_model, steady)]
    if not ratios:
        return float("nan"), float("nan")
    return float(np.mean(ratios)), float(np.max(ratios))


def time_weighted_imbalance(result: SimResult, packing: str, cost_model: CostModel) -> float:
    """Sum over full windows of the costliest pack over the sum of the mean pack: the time
    share balance costs when windows run their packs side by side (a window's weight is its
    cost, so a small window at the stream's end weighs little)."""
    pairs = _window_ratios(result, packing, cost_model, False)
    return sum(m for m, _ in pairs) / sum(a for _, a in pairs) if pairs else float("nan")


def formula_lb_ratio(combo: Any) -> float:
    """A combination's time over its balance bound, both timed by the closed-form 1F1B
    formula (:mod:`.onef1b`) instead of the event schedule; NaN for a result that does not
    carry that timing (e.g. one read back from JSON)."""
    steps, lbs = getattr(combo, "formula_step_s", None), getattr(combo, "formula_lb_s", None)
    if steps is None or lbs is None or not lbs.sum() > 0:
        return float("nan")
    return float(steps.sum() / lbs.sum())


def robustness_rows(runs: Sequence[RobustnessRun]) -> list[dict[str, Any]]:
    """One row per (evaluation model, combination): time over its balance bound, ATAC's
    speedup over it, the packing's window max/mean and the sharding's per-rank imbalance
    (mean and worst pack), all under the evaluation model."""
    rows = []
    for run in runs:
        res = run.result
        atac = res.combos.get("ATAC")
        for label, combo in res.combos.items():
            win_mean, win_worst = window_imbalance_stats(res, combo.packing, run.eval_model)
            rows.append({
                "eval": run.label,
                "combo": label,
                "lb_ratio": combo.lb_ratio,
                "formula_lb_ratio": formula_lb_ratio(combo),
                "delay_mean": combo.delay_mean,
                "delay_max": combo.delay_max,
                "atac_speedup": (res.speedup("ATAC", label) if atac is not None and label != "ATAC"
                                 else float("nan")),
                "window_imbalance": win_mean,
                "window_imbalance_worst": win_worst,
                "cp_imbalance": float(combo.cp_imbalance.mean()) if combo.cp_imbalance.size else 1.0,
                "cp_imbalance_worst": float(combo.cp_imbalance.max()) if combo.cp_imbalance.size else 1.0,
                "kv_mb_per_layer": combo.metrics()["kv_mb_per_layer"],
            })
        # a combination over the per-rank token cap: a row with its reason and no figures
        rows += [{"eval": run.label, "combo": label, "refused": r.reason} for label, r in res.refused.items()]
    return rows


def robustness_table(rows: Sequence[dict[str, Any]], *, markdown: bool = False) -> str:
    """The rows as a table (plain text or markdown)."""
    from .report import _render

    scenario = any("scenario" in r for r in rows)  # rows of several scenarios (atac-hf bench)
    head = ["scenario"] * scenario + [
        "timed by", "combination", "time/LB", "time/LB (1F1B formula)", "ATAC speedup", "window max/mean",
        "worst window", "CP max/mean", "worst pack", "K/V MiB/layer", "delay mean/max"]
    fmt = lambda v, f: "-" if v != v else format(v, f)  # noqa: E731 (NaN -> "-")
    body = [[r.get("scenario", "")] * scenario + (
             [r["eval"], r["combo"], "refused"] + ["-"] * (len(head) - 3 - scenario) if "refused" in r else [
             r["eval"], r["combo"], fmt(r["lb_ratio"], ".3f"), fmt(r["formula_lb_ratio"], ".3f"),
             fmt(r["atac_speedup"], ".2f"), fmt(r["window_imbalance"], ".3f"), fmt(r["window_imbalance_worst"], ".3f"),
             fmt(r["cp_imbalance"], ".3f"), fmt(r["cp_imbalance_worst"], ".3f"), fmt(r["kv_mb_per_layer"], ".1f"),
             f"{r['delay_mean']:.2f}/{r['delay_max']}"])
            for r in rows]
    notes = list(dict.fromkeys(f"{'- ' if markdown else ''}{r.get('scenario', '') + ': ' if scenario else ''}"
                               f"{r['combo']} refused: {r['refused']}" for r in rows if "refused" in r))
    return "\n".join([_render(head, body, markdown), *([""] * (markdown and bool(notes))), *notes])


def robustness_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per evaluation model, over the scenarios of ``rows`` (:func:`robustness_rows` with a
    ``scenario`` each): ATAC's time over its balance bound (geomean, worst and where), its
    smallest speedup over any other combination (and which, where), and in how many scenarios
    it is ahead of every other combination."""
    out = []
    for label in dict.fromkeys(r["eval"] for r in rows if "refused" not in r):
        mine = [r for r in rows if r["eval"] == label and "refused" not in r]  # refused rows have no figures
        atac = [r for r in mine if r["combo"] == "ATAC"]
        others = [r for r in mine if r["combo"] != "ATAC" and r["atac_speedup"] == r["atac_speedup"]]
        if not atac:
            continue
        worst = max(atac, key=lambda r: r["lb_ratio"])
        low = min(others, key=lambda r: r["atac_speedup"]) if others else None
        behind = {r["scenario"] for r in others if r["atac_speedup"] < 1.0}
        out.append({
            "eval": label, "scenarios": len(atac),
            "atac_lb_geomean": float(np.exp(np.mean(np.log([r["lb_ratio"] for r in atac])))),
            "atac_lb_worst": worst["lb_ratio"], "atac_lb_worst_scenario": worst["scenario"],
            "min_speedup": low["atac_speedup"] if low else float("nan"),
            "min_speedup_vs": f"{low['combo']} in {low['scenario']}" if low else "-",
            "ahead_of_all": len({r["scenario"] for r in atac} - behind),
        })
    return out


def robustness_summary_lines(summary: Sequence[dict[str, Any]]) -> list[str]:
    """One line per evaluation model of :func:`robustness_summary`."""
    return [f"{s['eval']}: ATAC/LB geomean {s['atac_lb_geomean']:.3f}, worst {s['atac_lb_worst']:.3f} "
            f"({s['atac_lb_worst_scenario']}); ATAC's smallest speedup {s['min_speedup']:.3f}x "
            f"(over {s['min_speedup_vs']}); ahead of every other combination in {s['ahead_of_all']} of "
            f"{s['scenarios']} scenarios" for s in summary]

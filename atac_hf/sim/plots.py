"""PNG plots of a benchmark run (matplotlib: extras ``plot`` and ``dev``; imported lazily).

Numpy only at import time.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

__all__ = ["have_matplotlib", "plot_all"]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedups(summary: dict[str, Any], path: str) -> str:
    """Grouped bars per scenario: ATAC over HF default / WLB-LLM / strongest baseline, with two bounds.

    What-if scenarios (layouts the integration cannot run, e.g. PP) sit on a grey band.

    ``limit`` (black tick) = HF default's time over its own balance lower bound: the most any
    balancing of the *same* work could gain. ATAC's bound (red tick) = HF default's time over
    ATAC's lower bound: higher when WFAP's splits cut attention work (a split document loses the
    attention across the cut), which is how ATAC's bar can pass ``limit``; the cut is annotated.
    """
    plt = _pyplot()
    rows = summary["scenarios"]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.8 * len(rows) + 2), 4.6))
    w = 0.26
    vs_hf = np.array([r["vs_hf"] for r in rows])
    ax.bar(x - w, vs_hf, w, label="ATAC / HF default")
    ax.bar(x, [r["vs_wlb"] for r in rows], w, label="ATAC / WLB-LLM")
    ax.bar(x + w, [r["vs_best"] for r in rows], w, label="ATAC / strongest baseline")
    ax.scatter(x - w, [r["limit"] for r in rows], marker="_", s=300, color="k", zorder=3,
               label="limit: HF default / its lower bound (same work)")
    atac_bound = vs_hf * np.array([r["atac_lb"] for r in rows])  # = HF time / ATAC's lower bound
    ax.scatter(x - w, atac_bound, marker="_", s=300, color="tab:red", zorder=3,
               label="HF default / ATAC's lower bound (after WFAP's work cut)")
    for xi, r, top in zip(x, rows, np.fmax(atac_bound, vs_hf)):
        for dx, key in ((-w, "vs_hf"), (0.0, "vs_wlb"), (w, "vs_best")):  # a ratio against a refused combination
            if not r[key] == r[key]:
                ax.annotate("refused", (xi + dx, 0.0), textcoords="offset points", xytext=(0, 3), ha="center",
                            rotation=90, fontsize=6, color="0.4")
        if np.isfinite(top) and r.get("atac_work_cut", 0.0) >= 0.001:
            ax.annotate(f"cut {100 * r['atac_work_cut']:.1f}%", (xi - w, top), textcoords="offset points",
                        xytext=(0, 4), ha="center", fontsize=7, color="tab:red")
    ax.axhline(1.0, color="grey", lw=0.8)
    what_if = [i for i, r in enumerate(rows) if not r.get("runnable", True)]
    if what_if:  # rows come runnable first (summarise_grid): shade the what-if block
        ax.axvspan(min(what_if) - 0.5, max(what_if) + 0.5, color="0.92", zorder=0,
                   label="what-if (e.g. PP: HF has none), not in the headline")
    ax.set_xticks(x, [r["scenario"] + ("" if r.get("runnable", True) else " (what-if)") for r in rows],
                  rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("throughput speedup")
    ax.set_title("Simulated speedup of ATAC (wfap + atp) per scenario")
    top = max(x for x in [1.0, *vs_hf, *atac_bound, *(r["limit"] for r in rows)] if np.isfinite(x))
    ax.set_ylim(0, 1.4 * top)  # headroom: the legend sits above the bars
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_pack_time_cdf(result: Any, path: str, labels: Sequence[str] = ("HF default", "WLB-LLM", "ATAC")) -> str:
    """CDF of per-layer pack (micro-batch) times of one scenario."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for label in labels:
        if label not in result.combos:
            continue
        t = np.sort(result.combos[label].pack_time_s) * 1e3
        ax.step(t, np.arange(1, len(t) + 1) / len(t), where="post", label=label)
    ax.set_xlabel("pack time per layer, fwd+bwd (ms)")
    ax.set_ylabel("share of packs")
    ax.set_title(f"Pack time CDF: {getattr(result, 'name', result.workload)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_rank_load(result: Any, path: str) -> str:
    """One heavy pack under every sharding strategy: per-rank compute (left) and the K/V each
    rank receives per layer (right), where strategies with the same compute split differ."""
    plt = _pyplot()
    sp = result.sample_pack
    names = list(sp["rank_s"])  # the strategies that fit the per-rank cap (plot_all skips a pack with none)
    C = len(next(iter(sp["rank_s"].values())))
    kv = sp.get("kv_bytes") or {}
    fig, (ax, ax_kv) = plt.subplots(1, 2, figsize=(max(8.0, 0.6 * C * len(names) / 2 + 4), 4.2),
                                    gridspec_kw={"width_ratios": [3, 1.3]})
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar(np.arange(C) + (i - (len(names) - 1) / 2) * w, np.asarray(sp["rank_s"][n]) * 1e3, w, label=n)
    ax.set_xticks(np.arange(C), [f"rank {r}" for r in range(C)], fontsize=8)
    ax.set_ylabel("compute per layer (ms)")
    lens = sorted(sp["lengths"], reverse=True)
    ax.set_title(f"One pack ({len(lens)} docs, longest {lens[0]}, {sum(lens)} tokens) over CP={C}", fontsize=9)
    ax.legend(fontsize=7)
    # the stream-wide mean of the same packing (sequential) too: one heavy pack is mostly one document,
    # which every strategy but contiguous splits alike; the many lighter packs are where they differ
    stream = {c.sharding: c.metrics()["kv_mb_per_layer"] for c in result.combos.values()
              if getattr(c, "packing", None) == "sequential"}
    if kv:
        xs = np.arange(len(names))
        bw = 0.4 if stream else 0.8
        series = [("this pack", [kv.get(n, 0.0) / 2**20 for n in names], 0.0)]
        if stream:
            series = [(series[0][0], series[0][1], -bw / 2),
                      ("mean over all packs", [stream.get(n, np.nan) for n in names], bw / 2)]
        for label, vals, off in series:
            ax_kv.bar(xs + off, vals, bw, label=label)
            for xi, v in zip(xs + off, vals):
                if np.isfinite(v):
                    ax_kv.annotate(f"{v:.0f}", (xi, v), textcoords="offset points", xytext=(0, 2), ha="center",
                                   fontsize=6)
        ax_kv.set_xticks(xs, names, rotation=40, ha="right", fontsize=8)
        ax_kv.set_ylabel("K/V received per rank per layer (MiB)")
        ax_kv.set_title("K/V traffic (sequential packing)", fontsize=9)
        ax_kv.legend(fontsize=7)
    else:
        ax_kv.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_all(summary: dict[str, Any], featured: Any, out_dir: str) -> list[str]:
    """Write the three plots into ``out_dir``; returns their paths ([] without matplotlib)."""
    if not have_matplotlib():
        return []
    os.makedirs(out_dir, exist_ok=True)
    paths = [plot_speedups(summary, os.path.join(out_dir, "sim_speedup.png")),
             plot_pack_time_cdf(featured, os.path.join(out_dir, "sim_pack_time_cdf.png"))]
    if featured.sample_pack and featured.sample_pack.get("rank_s"):
        paths.append(plot_rank_load(featured, os.path.join(out_dir, "sim_rank_load.png")))
    return paths

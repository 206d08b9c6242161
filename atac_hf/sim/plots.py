"""PNG plots of a benchmark run (matplotlib, optional extra ``plot``; imported lazily).

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
    """Grouped bars per scenario: ATAC over HF default / WLB-LLM / strongest baseline, and the limit."""
    plt = _pyplot()
    rows = summary["scenarios"]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.8 * len(rows) + 2), 4.2))
    w = 0.26
    ax.bar(x - w, [r["vs_hf"] for r in rows], w, label="ATAC / HF default")
    ax.bar(x, [r["vs_wlb"] for r in rows], w, label="ATAC / WLB-LLM")
    ax.bar(x + w, [r["vs_best"] for r in rows], w, label="ATAC / strongest baseline")
    ax.scatter(x - w, [r["limit"] for r in rows], marker="_", s=300, color="k", zorder=3,
               label="limit: HF default / lower bound")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(x, [r["scenario"] for r in rows], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("throughput speedup")
    ax.set_title("Simulated speedup of ATAC (wfap + atp) per scenario")
    ax.legend(fontsize=8)
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
    """Per-rank compute of one heavy pack under every sharding strategy."""
    plt = _pyplot()
    sp = result.sample_pack
    names = list(sp["rank_s"])
    C = len(next(iter(sp["rank_s"].values())))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * C * len(names) / 2), 4.0))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar(np.arange(C) + (i - (len(names) - 1) / 2) * w, np.asarray(sp["rank_s"][n]) * 1e3, w, label=n)
    ax.set_xticks(np.arange(C), [f"rank {r}" for r in range(C)], fontsize=8)
    ax.set_ylabel("compute per layer (ms)")
    lens = sorted(sp["lengths"], reverse=True)
    ax.set_title(f"One pack ({len(lens)} docs, longest {lens[0]}, {sum(lens)} tokens) over CP={C}", fontsize=9)
    ax.legend(fontsize=8)
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
    if featured.sample_pack:
        paths.append(plot_rank_load(featured, os.path.join(out_dir, "sim_rank_load.png")))
    return paths

"""Tables and the markdown section of the simulator's benchmark report.

Numpy only.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np

__all__ = ["COMBO_LEGEND", "combo_table", "grid_table", "headline", "summarise_grid", "geomean", "markdown_section",
           "write_section", "SECTION_HEADING"]

SECTION_HEADING = "## Simulator (pipeline-level)"

#: What each column of :func:`combo_table` means (printed under it by ``atac-hf simulate`` / ``bench``).
COMBO_LEGEND = (
    "Columns: tok/s = tokens trained per second; vs HF = throughput over HF default's (sequential packing + "
    "zigzag CP); /LB = time over this combination's balance lower bound (its own work spread evenly over every "
    "device and micro-batch, 1F1B bubble and gradient all-reduce kept; 1.000 = perfectly balanced); CP imb = "
    "max/mean per-rank compute inside a pack (mean over packs); mb imb = max/mean pack time among the "
    "micro-batches of a step (mean over steps; the slowest pack stalls the pipeline); CV = std/mean of pack "
    "times; KV MiB = K/V each CP rank receives per layer and pack (forward; all-gather: the mean rank, "
    "all-to-all: the busiest); frag = share of samples split into "
    "fragments; work cut = attention work removed by splits beyond what the token cap forces; pad = unused "
    "capacity of the steps run, 1 - tokens / (steps x packs per step x cap) (a step short of packs counts its "
    "empty slots); delay = windows a sample waits before its last fragment is trained, mean/max; plan ms = planner "
    "time per step (packing + sharding)."
)


def geomean(xs: Sequence[float]) -> float:
    xs = [float(x) for x in xs if x and math.isfinite(x) and x > 0]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def combo_table(result: Any, *, markdown: bool = False) -> str:
    """All combinations of one :class:`~atac_hf.sim.simulate.SimResult`, fastest first.

    Columns: throughput (tokens/s, and relative to HF default), time / balance lower
    bound, CP imbalance (max/mean rank compute per pack), micro-batch imbalance (max/mean
    pack time per step), CV of pack times, K/V MiB per rank per layer, fragmentation,
    work removed by splits, padding share, mean/max delay (windows), planner ms per step.
    """
    rows = [c.metrics() for c in result.combos.values()]
    base = result.combos.get("HF default")  # none (refused or not run): no "vs HF" ratio, "-"
    rows.sort(key=lambda r: -r["throughput_tok_s"])
    head = ["combination", "tok/s", "vs HF", "/LB", "CP imb", "mb imb", "CV", "KV MiB", "frag", "work cut", "pad",
            "delay", "plan ms"]
    body = []
    for r in rows:
        body.append([
            r["label"], f"{r['throughput_tok_s']:,.0f}",
            f"{r['throughput_tok_s'] / base.throughput:.2f}x" if base else "-",
            f"{r['lb_ratio']:.3f}", f"{r['cp_imbalance']:.3f}", f"{r['mb_imbalance']:.3f}", f"{r['pack_time_cv']:.3f}",
            f"{r['kv_mb_per_layer']:.1f}", f"{100 * r['fragmentation']:.1f}%", f"{100 * r['split_work_saving']:.1f}%",
            f"{100 * r['padding_share']:.1f}%",
            f"{r['delay_mean']:.2f}/{r['delay_max']}", f"{r['planner_ms_per_step']:.1f}",
        ])
    refused = getattr(result, "refused", {}) or {}
    body += [[label, "refused"] + ["-"] * (len(head) - 2) for label in refused]
    return "\n".join([_render(head, body, markdown), *refused_lines(result, markdown=markdown)])


def refused_lines(result: Any, *, markdown: bool = False) -> list[str]:
    """One line per combination of ``result`` refused over the per-rank token cap, with its reason."""
    refused = getattr(result, "refused", {}) or {}
    return ([""] * (markdown and bool(refused))
            + [f"{'- ' if markdown else ''}{label} refused: {r.reason}" for label, r in refused.items()])


def _finite(xs: Any) -> list[float]:
    return [float(x) for x in xs if x == x and math.isfinite(x)]


def _x(v: float, spec: str, refused: bool = False, unit: str = "x") -> str:
    """``v`` formatted; ``refused`` / ``-`` where it is NaN (a ratio against a refused combination)."""
    return format(v, spec) + unit if v == v else ("refused" if refused else "-")


def summarise_grid(results: Sequence[Any]) -> dict[str, Any]:
    """Per-scenario and geometric-mean speedups of ATAC and its lower-bound ratios.

    Each row says whether the atac-hf integration runs its cluster (``runnable``, from
    :meth:`~atac_hf.sim.cluster.ClusterConfig.what_if_reasons`; ``what_if``: why not). The
    top-level figures (``geomean_vs_hf``, ``geomean_vs_wlb``, ``geomean_vs_best``, ...) are over
    the runnable scenarios only (NaN when there are none); ``what_if_summary`` holds the same
    figures over the what-if ones. Rows are listed runnable first, each group in grid order.
    """
    rows = []
    nan = float("nan")
    for res in results:
        c = res.combos
        others = [k for k in c if k != "ATAC"]
        best = res.strongest_baseline() if others else "-"
        reasons = res.cluster.what_if_reasons()
        atac = c["ATAC"].metrics() if "ATAC" in c else {}
        rows.append({
            "scenario": getattr(res, "name", res.workload),
            "cluster": res.cluster.describe(),
            "workload": res.workload,
            "runnable": not reasons,
            "what_if": "; ".join(reasons),
            # a ratio of or against a refused combination is NaN (the row's "refused" says why)
            "vs_hf": res.speedup_or_nan("ATAC", "HF default"),
            "vs_wlb": res.speedup_or_nan("ATAC", "WLB-LLM"),
            "vs_best": res.speedup_or_nan("ATAC", best),
            "best": best,
            "limit": c["HF default"].lb_ratio if "HF default" in c else nan,
            "atac_lb": atac.get("lb_ratio", nan),
            "wlb_lb": c["WLB-LLM"].lb_ratio if "WLB-LLM" in c else nan,
            "atac_frag": atac.get("fragmentation", nan),
            "atac_work_cut": atac.get("split_work_saving", nan),
            "atac_delay": atac.get("delay_mean", nan),
            "refused": {k: r.reason for k, r in (getattr(res, "refused", {}) or {}).items()},
        })
    rows.sort(key=lambda r: not r["runnable"])  # stable: grid order inside each group
    runnable = [r for r in rows if r["runnable"]]
    return {"scenarios": rows, **_aggregate(runnable),
            "what_if_summary": _aggregate([r for r in rows if not r["runnable"]])}


def _aggregate(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "num_scenarios": len(rows),
        "geomean_vs_hf": geomean([r["vs_hf"] for r in rows]),
        "geomean_vs_wlb": geomean([r["vs_wlb"] for r in rows]),
        "geomean_vs_best": geomean([r["vs_best"] for r in rows]),
        "geomean_limit": geomean([r["limit"] for r in rows]),
        "geomean_atac_lb": geomean([r["atac_lb"] for r in rows]),
        "worst_atac_lb": max(_finite(r["atac_lb"] for r in rows), default=float("nan")),
        "min_vs_best": min(_finite(r["vs_best"] for r in rows), default=float("nan")),
        "num_below_best": sum(r["vs_best"] < 1.0 for r in rows),
        "num_refused": sum(bool(r.get("refused")) for r in rows),
    }


def headline(summary: dict[str, Any]) -> str:
    """One sentence each: the geometric means over the runnable scenarios, then over the what-if ones."""
    out = []
    for key, what in ((None, "runnable scenarios (layouts the atac-hf integration runs: FSDP2/DP x CP, DDP x TP x CP)"),
                      ("what_if_summary", "what-if scenarios (layouts it cannot run, e.g. pipeline parallelism)")):
        s = summary if key is None else summary.get(key, {})
        n = s.get("num_scenarios", 0)
        if not n:
            out.append(f"No {what.split(' (')[0]} in this grid.")
            continue
        g = lambda k, f: format(s[k], f) + "x" if s[k] == s[k] else "n/a (refused)"  # noqa: E731 (NaN: all refused)
        out.append(f"Geometric mean over {n} {what}: ATAC is {g('geomean_vs_hf', '.2f')} HF default, "
                   f"{g('geomean_vs_wlb', '.2f')} WLB-LLM and {g('geomean_vs_best', '.3f')} the strongest other "
                   f"combination of each scenario (below it in {s['num_below_best']} of {n}, lowest "
                   f"{g('min_vs_best', '.3f')}); ATAC's time is {g('geomean_atac_lb', '.3f')} its balance lower "
                   f"bound (worst scenario {g('worst_atac_lb', '.3f')}).")
        if s.get("num_refused"):
            out.append(f"In {s['num_refused']} of them some combination was refused (a pack over the per-rank token "
                       "cap): its ratios are left out of these means.")
    return " ".join(out)


def grid_table(summary: dict[str, Any], *, markdown: bool = False) -> str:
    head = ["scenario", "runs", "ATAC vs HF", "limit (HF/LB)", "ATAC/LB", "vs WLB-LLM", "vs strongest",
            "strongest baseline", "ATAC frag", "ATAC work cut", "ATAC delay"]
    any_refused = any(r.get("refused") for r in summary["scenarios"])
    body = []
    for r in summary["scenarios"]:
        no = set(r.get("refused") or ())
        a = "ATAC" in no
        pct = lambda v, d: _x(100 * v, f".{d}f", a, "%")  # noqa: E731
        body.append([r["scenario"], "yes" if r.get("runnable", True) else "what-if",
                     _x(r["vs_hf"], ".2f", a or "HF default" in no), _x(r["limit"], ".2f", "HF default" in no),
                     _x(r["atac_lb"], ".3f", a, ""), _x(r["vs_wlb"], ".2f", a or "WLB-LLM" in no),
                     _x(r["vs_best"], ".3f", a), r["best"], pct(r["atac_frag"], 2), pct(r["atac_work_cut"], 1),
                     _x(r["atac_delay"], ".2f", a, "")] + [", ".join(sorted(no)) or "-"] * any_refused)
    head += ["refused (over the per-rank cap)"] * any_refused
    for label, s in (("runnable", summary), ("what-if", summary.get("what_if_summary", {}))):
        if s.get("num_scenarios"):
            body.append([f"geometric mean, {label} ({s['num_scenarios']})", "", _x(s["geomean_vs_hf"], ".2f", True),
                         _x(s["geomean_limit"], ".2f", True), _x(s["geomean_atac_lb"], ".3f", True, ""),
                         _x(s["geomean_vs_wlb"], ".2f", True), _x(s["geomean_vs_best"], ".3f", True), "", "", "",
                         ""] + [""] * any_refused)
    return _render(head, body, markdown)


def _render(head: list[str], body: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = lambda r: "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in body])


def markdown_section(summary: dict[str, Any], results: Sequence[Any], *, command: str, seconds: float,
                     plots: Sequence[str] = (), paper: str | None = None) -> str:
    """The ``## Simulator (pipeline-level)`` section (heading included).

    ``plots``: image paths as the markdown file links them (relative to its folder).
    """
    out = [SECTION_HEADING, "",
           f"Reproduce: `{command}` ({seconds:.0f} s on this machine). Every packing x sharding combination "
           "runs on the same sample stream, through the real planners, in an explicit 1F1B pipeline "
           "(`atac_hf/sim`). HF default = sequential packing + zigzag CP; WLB-LLM = wlb packing + "
           "wlb_adaptive CP; ATAC = wfap + atp. *limit* = HF default time / its balance lower bound "
           "(same work spread evenly over every device and micro-batch, with the 1F1B bubble and the "
           "gradient all-reduce kept); *ATAC/LB* = ATAC's time over its own bound (ATAC can pass *limit* when WFAP's splits cut work, which lowers its own bound); *work cut* = attention work "
           "removed by splitting samples beyond what the token cap forces (a split loses the attention across "
           "the cut, so such speed is not free). The stream is finite and every packer is flushed at its end: "
           "all combinations train exactly the same samples, and the start and end of the stream are measured.", "",
           "*runs*: whether the atac-hf integration runs the scenario's layout today (DP replicated or FSDP2, CP "
           "and TP: `ParallelismConfig(dp_replicate, dp_shard, tp, cp)`, TP with DDP only, as the integration "
           "refuses FSDP x TP), derived from its cluster; a *what-if* (pipeline parallelism, which HF does not "
           "have, or model states of 16 bytes per parameter that do not fit the GPU held that way) is priced "
           "the same way but is not part of the headline. TP is "
           "priced as it runs: heads, weights and MLP divided over TP, each CP rank exchanging only its local K/V "
           "heads within its CP group (over the network once TP x CP exceeds a node's 8 GPUs), plus 4 ring "
           "all-reduces of the activations per layer (2 forward, 2 backward) over the TP group. DP replication "
           "and FSDP2 are both priced as one gradient all-reduce per step, not overlapped. Every sharding's K/V "
           "exchange is priced the way atac-hf runs it (an all-gather or all-to-all of the rows a rank needs, "
           "hidden only behind the attention of the rank's local documents); a ring (torch's CP) hides each step "
           "behind compute, so where K/V crosses nodes the baselines that move the most K/V (HF default's zigzag, "
           "WLB-LLM) may look slower here than they would with a ring.", "",
           "| scenario | cluster | workload | runs with atac-hf |", "|---|---|---|---|"]
    out += [f"| {r['scenario']} | {r['cluster']} | {r['workload']} | "
            f"{'yes' if r.get('runnable', True) else 'what-if: ' + r.get('what_if', '')} |"
            for r in summary["scenarios"]]
    out += ["", grid_table(summary, markdown=True), "", headline(summary)]
    if paper:
        out += ["", paper]
    if results:
        first = results[0]
        out += ["", f"All combinations, scenario `{getattr(first, 'name', first.workload)}` "
                    f"({first.cluster.describe()}, workload {first.workload}):", "",
                combo_table(first, markdown=True), "", COMBO_LEGEND]
    for p in plots:
        out += ["", f"![{os.path.splitext(os.path.basename(p))[0]}]({p.replace(os.sep, '/')})"]
    return "\n".join(out).rstrip() + "\n"


def write_section(path: str, section: str, heading: str = SECTION_HEADING) -> None:
    """Replace (or append) the ``heading`` section (default ``## Simulator (pipeline-level)``)
    of a markdown file, leaving every other section as it is; creates the file if missing."""
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    else:
        text = "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == heading), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)

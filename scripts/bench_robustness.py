#!/usr/bin/env python
"""Robustness to cost-model error, in the simulator: every scenario of `atac-hf bench`'s default
grid planned with its preset cost model and timed with that model at 0.5x, 1x and 2x attention
price; and a CPU-sized scenario planned with a GPU preset and timed by the calibrated CPU profile
(configs/cost_cpu_tiny_llama.json). Prints markdown and, with --output, writes it as the
"## Robustness to cost-model error (simulator)" section of that file (only that section).

    python scripts/bench_robustness.py --output docs/BENCHMARKS.md
    python scripts/bench_robustness.py --quick          # two scenarios, nothing written
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from atac_hf.cost import ModelDims
from atac_hf.sim import ClusterConfig
from atac_hf.sim.bench import _lengths, default_grid
from atac_hf.sim.report import geomean
from atac_hf.sim.robustness import run_robustness, window_imbalance_stats
from atac_hf.workloads import load_workload

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Robustness to cost-model error (simulator)"
CPU_PROFILE = ROOT / "configs" / "cost_cpu_tiny_llama.json"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", default="0.5,1,2", help="attention price ratios of the evaluation models")
    p.add_argument("--output", default=None, help="markdown file whose robustness section is (re)written")
    p.add_argument("--quick", action="store_true", help="two scenarios, 4 steps (a smoke test)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _row(name, run):
    res, cm = run.result, run.eval_model
    c = res.combos
    atac = c["ATAC"]
    others = [k for k in c if k != "ATAC"]
    best = min(others, key=lambda k: c[k].time_s)
    win_mean, win_worst = window_imbalance_stats(res, "wfap", cm)
    return {
        "scenario": name, "eval": run.label, "atac_lb": atac.lb_ratio,
        "vs_hf": res.speedup("ATAC", "HF default"), "vs_wlb": res.speedup("ATAC", "WLB-LLM"),
        "vs_best": res.speedup("ATAC", best), "best": best, "wfap_window": win_mean, "wfap_window_worst": win_worst,
        "atp_worst": float(atac.cp_imbalance.max()) if atac.cp_imbalance.size else 1.0,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    scales = tuple(float(x) for x in args.scales.split(","))
    t0 = time.perf_counter()
    grid = [s for s in default_grid() if not s.extra]
    if args.quick:
        grid = grid[:2]
    combos = [("sequential", "zigzag"), ("bfd", "per_doc"), ("wlb", "wlb_adaptive"), ("wfap", "per_doc"),
              ("bfd", "atp"), ("wfap", "atp")]
    rows = []
    for s in grid:
        runs = run_robustness(_lengths(s.workload), s.config(), scales=scales, combos=combos,
                              num_steps=4 if args.quick else s.num_steps, seed=args.seed, packing_options=s.options)
        rows += [_row(s.name, r) for r in runs]
        print(f"{s.name}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    # a CPU-sized run: planned with a GPU preset of the calibrated model's shape, timed by the CPU profile
    meta = json.loads(CPU_PROFILE.read_text())["metadata"]
    lengths = np.maximum(load_workload("wlbllm") // 8, 1)
    cpu_rows = []
    for cp in (2, 4):
        cluster = ClusterConfig(model=ModelDims(**meta["model"]), hardware="H100", max_tokens=16384, cp_size=cp,
                                dp_size=2, pp_size=1, num_micro_batches=4)
        runs = run_robustness(lengths, cluster, scales=(1.0,), profiles=[str(CPU_PROFILE)], combos=combos,
                              num_steps=4 if args.quick else 12, seed=args.seed)
        cpu_rows += [_row(f"tiny-16K-cp{cp}-dp2 (wlbllm / 8)", r) for r in runs]
    seconds = time.perf_counter() - t0
    command = "python scripts/bench_robustness.py" + (f" --output {shlex.quote(args.output)}" if args.output else "")
    text = _section(rows, cpu_rows, scales, command, seconds)
    print(text)
    if args.output:
        from atac_hf.sim.report import write_section

        write_section(args.output, text, heading=HEADING)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _table(rows):
    out = ["| scenario | timed by | ATAC/LB | vs HF default | vs WLB-LLM | vs strongest (which) | WFAP window max/mean "
           "(worst) | ATP worst pack |", "|---|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        out.append(f"| {r['scenario']} | {r['eval']} | {r['atac_lb']:.3f} | {r['vs_hf']:.2f}x | {r['vs_wlb']:.2f}x | "
                   f"{r['vs_best']:.3f}x ({r['best']}) | {r['wfap_window']:.3f} ({r['wfap_window_worst']:.2f}) | "
                   f"{r['atp_worst']:.3f} |")
    return "\n".join(out)


def _section(rows, cpu_rows, scales, command, seconds):
    lines = [HEADING, "",
             f"Reproduce: `{command}` ({seconds:.0f} s on this machine). Plans (packs and shards) are made with "
             "each scenario's preset cost model; the times are those plans under an *evaluation* model: the same "
             "model with the attention pair price scaled (`attention xK`), or a calibrated profile "
             "(`atac-hf simulate --eval-attn-scale 0.5,1,2` runs one scenario). *ATAC/LB*: ATAC's time over the "
             "balance lower bound of the evaluation model; *vs X*: ATAC's speedup over X; *vs strongest*: over the "
             "fastest other combination (bfd+per_doc, bfd+atp, wfap+per_doc, WLB-LLM, HF default); WFAP window: "
             "max/mean pack cost per full window (mean over windows, worst); ATP worst pack: the largest per-rank "
             "max/mean of ATAC's shard plans.", ""]
    summary = []
    for k in scales:
        sel = [r for r in rows if r["eval"] == f"attention x{k:g}"]
        summary.append(f"attention x{k:g}: ATAC/LB geomean {geomean([r['atac_lb'] for r in sel]):.3f}, worst "
                       f"{max(r['atac_lb'] for r in sel):.3f}; vs HF default geomean "
                       f"{geomean([r['vs_hf'] for r in sel]):.2f}x; vs strongest min "
                       f"{min(r['vs_best'] for r in sel):.3f}x; WFAP window mean worst "
                       f"{max(r['wfap_window'] for r in sel):.3f}; ATP worst pack {max(r['atp_worst'] for r in sel):.3f}")
    lines += ["Summary over the grid:", ""] + [f"- {s}" for s in summary] + ["", _table(rows), "",
              "Planned with the H100 preset for the calibrated tiny model's shape, timed by the calibrated CPU "
              "profile (`configs/cost_cpu_tiny_llama.json`), wlbllm lengths divided by 8, 16K packs:", "",
              _table(cpu_rows), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

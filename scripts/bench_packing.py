#!/usr/bin/env python
"""Packing benchmark: WFAP and the baselines side by side, plus TRL's BFD timing.

Runs every strategy on the built-in long-tail workload and on the WLB-LLM length sample
(the ``wlbllm`` sample shipped in ``atac_hf/workload_data``), prints
a markdown table and writes it (with the command) into ``docs/BENCHMARKS.md`` under
"## Packing (WFAP vs baselines)" (only that section is replaced).

    python scripts/bench_packing.py                      # 64K packs, 64 per window, 7B on A800
    python scripts/bench_packing.py --no-trl --no-docs   # quick look, nothing written
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: the planners are single-threaded anyway

import numpy as np  # noqa: E402

from atac_hf.cost import CostModel  # noqa: E402
from atac_hf.packing import PackingConfig, pack_costs, pack_lengths  # noqa: E402
from atac_hf.packing.metrics import window_imbalance  # noqa: E402
from atac_hf.workloads import describe_lengths, load_lengths, make_workload, sample_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WLB = Path(sample_path("wlbllm"))
HEADING = "## Packing (WFAP vs baselines)"

# (row label, strategy, extra PackingConfig options)
VARIANTS = [
    ("sequential", "sequential", {}),
    ("bfd", "bfd", {}),
    ("wlb", "wlb", {}),
    ("wfap", "wfap", {}),
    ("wfap, max_defer=8", "wfap", {"max_defer": 8}),
    ("wfap, no balance split", "wfap", {"balance_split": False}),
    ("wfap, no deferral", "wfap", {"defer_heavy": False}),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default=str(DEFAULT_WLB), help="JSON array of lengths (default: the WLB-LLM sample)")
    p.add_argument("--num-samples", type=int, default=99_519, help="samples of the built-in long-tail workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=65536)
    p.add_argument("--packs-per-window", type=int, default=64)
    p.add_argument("--model", default="7b")
    p.add_argument("--hardware", default="A800")
    p.add_argument("--repeats", type=int, default=3, help="timing repeats (best is reported)")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL pack_dataset timing")
    p.add_argument("--docs", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    p.add_argument("--no-docs", action="store_true", help="print only, do not edit docs/BENCHMARKS.md")
    return p.parse_args(argv)


def time_trl(lengths: np.ndarray, max_tokens: int, repeats: int) -> tuple[float, str]:
    """Best-of-`repeats` seconds of trl.data_utils.pack_dataset(strategy="bfd") on a Dataset
    whose rows have the given lengths (int8 dummy token ids; building it is not timed)."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable
    from trl.data_utils import pack_dataset

    pa.set_cpu_count(1)  # one core, like our planner (CPU time below counts every thread of the process)
    pa.set_io_thread_count(1)
    datasets.disable_progress_bars()
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = pa.array(np.zeros(int(offsets[-1]), dtype=np.int8))
    ids = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    ds = datasets.Dataset(InMemoryTable(pa.table({"input_ids": ids})))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        out = pack_dataset(ds, max_tokens, strategy="bfd", map_kwargs={"keep_in_memory": True})
        best = min(best, time.process_time() - t0)
    import trl

    note = (f"TRL {trl.__version__} `pack_dataset(strategy=\"bfd\")`, default map batch size, "
            f"keep_in_memory, int8 dummy ids, {len(out)} rows")
    return best, note


def run_workload(name: str, lengths: np.ndarray, args: argparse.Namespace, cm: CostModel) -> list[dict]:
    rows = []
    for label, strategy, options in VARIANTS:
        config = PackingConfig(max_tokens=args.max_tokens, packs_per_window=args.packs_per_window,
                               strategy=strategy, **options)
        best = wall = float("inf")
        for _ in range(args.repeats):
            t0, w0 = time.process_time(), time.perf_counter()
            res = pack_lengths(lengths, config, cm)
            best = min(best, time.process_time() - t0)
            wall = min(wall, time.perf_counter() - w0)
        m = res.metrics
        # worst window before the stream's last window of arrivals (the end of a stream leaves
        # partial windows that no planner can fill)
        last = max(res.arrival)
        steady = [window_imbalance(pack_costs(w, cm)) for k, w in enumerate(res.windows()) if w and k < last]
        rows.append({"workload": name, "label": label, "seconds": best, "wall": wall, "steady_worst": max(steady),
                     **m})
        print(f"  {name:9s} {label:24s} imbalance {m['imbalance_mean']:.3f} (worst {m['imbalance_worst']:.3f}) "
              f"split {100 * m['fragmentation']:.2f}% padding {100 * m['padding']:.2f}% cpu {best:.2f}s wall {wall:.2f}s",
              flush=True)
    return rows


def table(rows: list[dict], packs_per_window: int) -> str:
    cols = ["workload", "strategy", "max/mean pack cost (mean over windows)", "worst window",
            "worst before the end of stream", "CV of pack cost",
            "total cost (s/layer)", "est. time (s/layer)", "vs. its lower bound", "padding", "samples split",
            "samples deferred", "delay mean / max (windows)", "planner CPU time", "samples/s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lb = r["total_cost_s"] / packs_per_window
        lines.append(
            f"| {r['workload']} | {r['label']} | {r['imbalance_mean']:.3f} | {r['imbalance_worst']:.3f} "
            f"| {r['steady_worst']:.3f} "
            f"| {r['cost_cv']:.3f} | {r['total_cost_s']:.0f} | {r['est_time_s']:.1f} | {r['est_time_s'] / lb:.3f}x "
            f"| {100 * r['padding']:.2f}% | {100 * r['fragmentation']:.2f}% | {100 * r['deferred_share']:.2f}% "
            f"| {r['delay_mean_deferred']:.2f} / {r['delay_max']} | {r['seconds']:.2f} s "
            f"| {r['num_samples'] / r['seconds']:,.0f} |"
        )
    return "\n".join(lines)


def write_docs(path: Path, body: str) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    section = f"{HEADING}\n\n{body.strip()}\n"
    start = text.find(HEADING + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(HEADING))
        text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cm = CostModel.from_model(args.model, args.hardware)
    workloads = {"longtail": make_workload("longtail", args.num_samples, seed=args.seed)}
    if Path(args.lengths).exists():
        workloads["wlbllm"] = load_lengths(args.lengths)
    else:
        print(f"note: {args.lengths} not found; benchmarking the built-in workload only", file=sys.stderr)

    rows, shapes, trl_lines = [], [], []
    for name, lengths in workloads.items():
        d = describe_lengths(lengths)
        shapes.append(f"- `{name}`: {d['num_samples']:,} samples, {d['tokens']:,} tokens, median {d['median']:,.0f}, "
                      f"p99 {d['p99']:,.0f}, max {d['max']:,}; over 32K: {100 * d['long_sample_share']:.2f}% of "
                      f"samples, {100 * d['long_token_share']:.1f}% of tokens")
        print(f"{name}: {shapes[-1][2:]}", flush=True)
        wrows = run_workload(name, lengths, args, cm)
        rows += wrows
        if not args.no_trl:
            try:
                secs, note = time_trl(lengths, args.max_tokens, args.repeats)
            except ImportError as e:
                print(f"note: TRL timing skipped ({e})", file=sys.stderr)
            else:
                ours = next(r for r in wrows if r["label"] == "wfap")["seconds"]
                trl_lines.append(f"- `{name}`: TRL bfd {secs:.2f} s CPU ({len(lengths) / secs:,.0f} samples/s) vs. "
                                 f"WFAP {ours:.2f} s CPU ({len(lengths) / ours:,.0f} samples/s). {note}.")
                print(trl_lines[-1], flush=True)

    md = table(rows, args.packs_per_window)
    print()
    print(md)
    command = "python scripts/bench_packing.py" + "".join(" " + shlex.quote(a) for a in (argv or sys.argv[1:]))
    body = "\n".join([
        f"Packs of at most {args.max_tokens:,} tokens, {args.packs_per_window} packs per window, cost model "
        f"`CostModel.from_model(\"{args.model}\", \"{args.hardware}\")` ({cm.name}); windows sized by tokens "
        "(`pack_lengths(..., window=None)`); default `PackingConfig` unless the row says otherwise. "
        "Reproduce (from the repo root):",
        "",
        "```",
        command,
        "```",
        "",
        *shapes,
        "",
        md,
        "",
        "Columns: max/mean pack cost per window (1.0 = every pack of a window costs the same), its worst "
        "window, and its worst window before the stream's last window of arrivals (the end of a stream leaves "
        "partial windows); coefficient of variation of pack cost over all packs; total cost "
        "of all packs (seconds per layer, fwd+bwd); estimated time = sum over windows of the costliest pack (what "
        "a step waits for when a window's packs run side by side) and its ratio to that row's lower bound (total "
        "cost / packs per window); padding = 1 - tokens / (packs x cap); samples split (every strategy splits "
        "overlength samples into the fewest near-equal fragments; WFAP also splits overdue heavy samples it cannot "
        "balance, `balance_split`, which lowers its total cost a little: fragments attend to less context); "
        "samples carried to a later window and their delay; planner CPU time of the benchmark process "
        f"(`time.process_time`, best of {args.repeats}; the planners are single-threaded, so this is the time on "
        "one core, unaffected by other jobs on a shared machine) and samples planned per second.",
        "",
        "Notes: WFAP's padding is the price of variable token counts (a pack holding an expensive document "
        "stops below the cap instead of becoming the straggler); its deferral holds back heavy samples until "
        "`packs_per_window` of similar cost can anchor one pack each (default `max_defer=16` windows). `wlb` uses "
        "outlier queues at (cap/4, cap/2). Every strategy places a sample that has waited `max_defer` windows "
        "first, so no delay exceeds it. Windows are fed by tokens (`StreamPacker.window_size`), so a window "
        "that packs less than it was fed carries the rest: that is most of the baselines' deferred samples.",
        "",
        "Planner speed vs. TRL (planning plus building rows for TRL; planning only for ours; "
        "building our rows is `atac_hf.packing.data.dataset.pack_dataset`'s job):" if trl_lines else
        "TRL timing: not run.",
        *trl_lines,
    ])
    if not args.no_docs:
        write_docs(Path(args.docs), body)
        print(f"\nwrote {args.docs} ({HEADING})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

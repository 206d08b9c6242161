#!/usr/bin/env python
"""Packing benchmark: WFAP and the baselines side by side, and pack_dataset against TRL.

Runs every strategy on the built-in long-tail workload and on the WLB-LLM length sample
(the ``wlbllm`` sample shipped in ``atac_hf/workload_data``), then times
``atac_hf.pack_dataset`` end to end (planning + building the rows of a ``datasets.Dataset``)
against TRL's ``pack_dataset(strategy="bfd")`` on the same dataset (wlbllm lengths resampled
to 20K and 100K samples, int32 token ids, 128K cap), each run in its own subprocess with
its peak memory. Prints markdown tables and writes them (with the command) into
``docs/BENCHMARKS.md`` under "## Packing (WFAP vs baselines)" (only that section is replaced).

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
    ("wfap, balance split", "wfap", {"balance_split": True}),
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
    p.add_argument("--dataset-sizes", default="20000,100000",
                   help="samples of the pack_dataset vs TRL runs (comma-separated; '' skips them)")
    p.add_argument("--dataset-max-tokens", type=int, default=131072, help="cap of the pack_dataset vs TRL runs")
    p.add_argument("--split-cases", type=int, default=200, help="random cases of the split-mode table (0 skips it)")
    p.add_argument("--dataset-only", action="store_true",
                   help="run only the pack_dataset vs TRL table and replace only its subsection of docs/BENCHMARKS.md")
    p.add_argument("--split-only", action="store_true",
                   help="run only the split-mode table and replace only its subsection of docs/BENCHMARKS.md")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- pack_dataset vs TRL
# (row label, packer, pack_dataset options)
DATASET_RUNS = [
    ("atac pack_dataset, defaults (wfap)", "ours", {}),
    ("atac pack_dataset, strategy=bfd", "ours", {"strategy": "bfd"}),
    ("TRL pack_dataset, strategy=bfd", "trl", {}),
]
DATASET_WINDOW = 64  # packs per window (pack_dataset's default); TRL's packs are grouped alike to cost them


def _proc_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:  # Linux: reset VmHWM to the current RSS
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def token_dataset(num_samples: int):
    """An in-memory ``datasets.Dataset`` of int32 ``input_ids`` with the shipped ``wlbllm`` lengths
    resampled (seed 0) to ``num_samples``; the token pages are written (zeros would stay unmapped)."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    from atac_hf.workloads import load_workload

    sample = load_workload("wlbllm").astype(np.int64)
    lengths = np.random.default_rng(0).choice(sample, size=num_samples, replace=num_samples > sample.size)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = np.arange(int(offsets[-1]), dtype=np.int32)
    np.bitwise_and(tokens, 32767, out=tokens)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))
    return datasets.Dataset(InMemoryTable(pa.table({"input_ids": ids})))


def dataset_worker(kind: str, num_samples: int, max_tokens: int, options: dict) -> dict:
    """One timed end-to-end run in this (fresh) process; returns its figures."""
    import gc

    import datasets
    import pyarrow as pa

    from atac_hf.cost import default_cost_model
    from atac_hf.packing.data.dataset import pack_dataset

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    datasets.disable_progress_bars()
    ds = token_dataset(num_samples)
    gc.collect()
    try:  # hand freed heap pages back, so that the RSS before the run is the input and the interpreter
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    if kind == "trl":  # imported before the clock starts (TRL's import alone takes seconds)
        from trl.data_utils import pack_dataset as trl_pack_dataset
    _reset_peak()
    rss0 = _proc_kb("VmRSS")
    pool0 = pa.total_allocated_bytes()
    t0, w0 = time.process_time(), time.perf_counter()
    if kind == "trl":
        out = trl_pack_dataset(ds, max_tokens, strategy="bfd", map_kwargs={"keep_in_memory": True})
    else:
        out = pack_dataset(ds, max_tokens=max_tokens, progress=False, **options)
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    peak = _proc_kb("VmHWM") - rss0
    arrow_peak = (pa.default_memory_pool().max_memory() - pool0) / 2**20
    seq = out.with_format(None)["seq_lengths"]
    cm = default_cost_model()
    costs = np.array([float(cm.doc_cost(np.asarray(s, dtype=np.int64)).sum()) for s in seq])
    full = len(costs) // DATASET_WINDOW * DATASET_WINDOW
    win = costs[:full].reshape(-1, DATASET_WINDOW)
    tokens = int(sum(sum(s) for s in seq))
    docs = np.concatenate([np.asarray(s, dtype=np.int64) for s in seq])
    return {"cpu_s": cpu, "wall_s": wall, "num_packs": len(seq), "tokens": tokens,
            "lower_bound": -(-tokens // max_tokens), "whole_docs": int(docs.size),
            "imbalance_mean": float((win.max(axis=1) / win.mean(axis=1)).mean()) if full else float("nan"),
            "peak_mb": max(peak / 1024, arrow_peak), "rss_peak_mb": peak / 1024, "arrow_peak_mb": arrow_peak, "input_mb": ds.data.nbytes / 2**20, "num_samples": len(ds)}


def run_dataset_bench(sizes: list[int], max_tokens: int, with_trl: bool) -> tuple[str, list[dict]]:
    import json
    import subprocess

    rows = []
    for n in sizes:
        for label, kind, options in DATASET_RUNS:
            if kind == "trl" and not with_trl:
                continue
            cmd = [sys.executable, str(Path(__file__).resolve()), "--dataset-worker",
                   json.dumps({"kind": kind, "n": n, "max_tokens": max_tokens, "options": options})]
            res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if res.returncode != 0:
                print(f"note: {label} at {n} samples failed:\n{res.stderr[-2000:]}", file=sys.stderr)
                continue
            r = {"label": label, "kind": kind, "n": n, **json.loads(res.stdout.strip().splitlines()[-1])}
            rows.append(r)
            print(f"  {n:>7,} {label:38s} cpu {r['cpu_s']:.2f}s wall {r['wall_s']:.2f}s packs {r['num_packs']} "
                  f"(lb {r['lower_bound']}) max/mean {r['imbalance_mean']:.3f} peak {r['peak_mb']:.0f} MiB "
                  f"(input {r['input_mb']:.0f} MiB)", flush=True)
    cols = ["samples", "packer", "CPU time", "wall time", "vs TRL (CPU)", "packs", "vs ceil(tokens / cap)",
            "max/mean pack cost (mean over windows of 64)", "vs TRL", "peak memory", "vs input Arrow size"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        trl = next((t for t in rows if t["kind"] == "trl" and t["n"] == r["n"]), None)
        lines.append(
            f"| {r['n']:,} | {r['label']} | {r['cpu_s']:.2f} s | {r['wall_s']:.2f} s "
            f"| {r['cpu_s'] / trl['cpu_s']:.2f}x | " if trl else
            f"| {r['n']:,} | {r['label']} | {r['cpu_s']:.2f} s | {r['wall_s']:.2f} s | - | ")
        lines[-1] += (f"{r['num_packs']:,} | {r['num_packs'] / r['lower_bound'] - 1:+.3%} | {r['imbalance_mean']:.3f} "
                      f"| {(r['imbalance_mean'] - 1) / (trl['imbalance_mean'] - 1):.2f}x excess | "
                      if trl else f"{r['num_packs']:,} | {r['num_packs'] / r['lower_bound'] - 1:+.3%} "
                      f"| {r['imbalance_mean']:.3f} | - | ")
        lines[-1] += f"{r['peak_mb']:,.0f} MiB | {r['peak_mb'] / r['input_mb']:.2f}x |"
    return "\n".join(lines), rows


SPLIT_ROWS = [  # (row label, PackingConfig options, planner: "whole pass" = plan_packs(split_fill=True), else windowed)
    ("bfd, split_fill=True (pack_dataset / plan_packs), default min_fragment", {"strategy": "bfd"}, True),
    ("bfd, split_fill=True, min_fragment=1", {"strategy": "bfd", "min_fragment": 1}, True),
    ("bfd windowed (default; pack_lengths, samplers), default min_fragment", {"strategy": "bfd"}, False),
    ("bfd windowed, min_fragment=1", {"strategy": "bfd", "min_fragment": 1}, False),
    ("wfap (the default strategy), windowed, default min_fragment", {}, False),
    ("bfd, split_fill=True, the old default min_fragment min(128, cap / 2)", {"strategy": "bfd", "min_fragment": "old"},
     True),
    ("bfd windowed, the old default min_fragment", {"strategy": "bfd", "min_fragment": "old"}, False),
]


def split_case(case: int) -> tuple[int, np.ndarray]:
    """Case ``case`` of the split-mode table: a cap (64-511 tokens in even cases, 4K-32K in odd
    ones) and 100-399 samples of 1 to 3x the cap."""
    rng = np.random.default_rng(case)
    cap = int(rng.integers(64, 512)) if case % 2 == 0 else int(rng.integers(4096, 32768))
    return cap, rng.integers(1, 3 * cap, size=int(rng.integers(100, 400)))


def run_split_cases(num_cases: int, with_trl: bool) -> str:
    """Split mode against ceil(tokens / cap) on :func:`split_case` cases: our bfd over the whole
    pass (``split_fill``) and windowed, wfap, against TRL's bfd_split on the same lengths; with
    the pack count per case, how often it beats TRL, and the fragments' lengths."""
    import warnings
    from collections import Counter

    from atac_hf.packing.data.window_planner import plan_packs

    rows = {label: {"ratio": [], "packs": [], "frag": [], "margin": []} for label, _o, _f in SPLIT_ROWS}
    if with_trl:
        import datasets
        import pyarrow as pa
        from datasets.table import InMemoryTable
        from trl.data_utils import pack_dataset as trl_pack_dataset

        datasets.disable_progress_bars()
        rows["TRL bfd_split (no min_fragment)"] = {"ratio": [], "packs": [], "frag": [], "margin": []}
    for case in range(num_cases):
        cap, lengths = split_case(case)
        lb = -(-int(lengths.sum()) // cap)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for label, options, fill in SPLIT_ROWS:
                if options.get("min_fragment") == "old":
                    options = {**options, "min_fragment": min(128, max(1, cap // 2))}
                config = PackingConfig(max_tokens=cap, packs_per_window=64, **options)
                spans, offsets = plan_packs(lengths, config, split_fill=fill)
                cut = lengths[spans[:, 0]] > spans[:, 2] - spans[:, 1]
                frag = spans[cut, 2] - spans[cut, 1]
                r = rows[label]
                r["ratio"].append((len(offsets) - 1) / lb)
                r["packs"].append(len(offsets) - 1)
                r["frag"].append(frag / cap)
                r["margin"].append(frag.min() / config.min_fragment if frag.size else np.inf)
        if with_trl:
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(int(offsets[-1]), dtype=np.int8)))
            out = trl_pack_dataset(datasets.Dataset(InMemoryTable(pa.table({"input_ids": ids}))), cap,
                                   strategy="bfd_split")
            docs = Counter(n for row in out["seq_lengths"] for n in row)
            docs.subtract(Counter(int(n) for n in lengths if n <= cap))  # what is left: the fragments
            frag = np.array(sorted(docs.elements()), dtype=np.int64)
            r = rows["TRL bfd_split (no min_fragment)"]
            r["ratio"].append(len(out) / lb)
            r["packs"].append(len(out))
            r["frag"].append(frag / cap)
            r["margin"].append(np.nan)
    trl = rows.get("TRL bfd_split (no min_fragment)")
    lines = ["| packer | packs / ceil(tokens / cap), caps 64-511: min / mean / max | caps 4K-32K: min / mean / max "
             "| cases within 1% | cases with more packs than TRL / fewer | fragments per case | fragment / cap: "
             "min / median | fragments < cap / 8 | shortest fragment / min_fragment |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        ratio = np.asarray(r["ratio"])
        a, b = ratio[0::2], ratio[1::2]
        frag = np.concatenate(r["frag"])
        vs = "-"
        if trl is not None and r is not trl:
            mine, theirs = np.asarray(r["packs"]), np.asarray(trl["packs"])
            vs = f"{int((mine > theirs).sum())} / {int((mine < theirs).sum())}"
        margin = "-" if r is trl else f"{np.min(r['margin']):.2f}"
        lines.append(f"| {label} | {a.min():.3f} / {a.mean():.3f} / {a.max():.3f} | {b.min():.3f} / {b.mean():.3f} / "
                     f"{b.max():.3f} | {int((ratio <= 1.01).sum())} of {ratio.size} | {vs} | {frag.size / ratio.size:.0f} "
                     f"| {frag.min():.3f} / {np.median(frag):.3f} | {100 * (frag < 1 / 8).mean():.1f}% | {margin} |")
    return "\n".join(lines)


SPLIT_HEADING = "### Split mode: packs against ceil(tokens / cap)"


def split_section(num_cases: int, split_md: str, command: str) -> str:
    return "\n".join([
        f"{SPLIT_HEADING} ({num_cases} random cases)",
        "",
        "Each case: a cap (64-511 tokens in even cases, 4K-32K in odd ones) and 100-399 samples of 1 to 3x the "
        "cap, planned by `plan_packs` (what `pack_dataset` runs) with 64 packs per window, and by TRL's "
        "`pack_dataset(strategy=\"bfd_split\")`. Windowed, overlength samples are cut into full-cap fragments and "
        "the rest (TRL's rule; a rest shorter than `min_fragment` takes tokens from the fragment before it), and "
        "each window is planned on its own. `split_fill=True` (opt-in, bfd only: `atac_hf/packing/split_fill.py`) "
        "plans the whole pass at once: samples that fit stay whole (best-fit decreasing, the short ones plugging "
        "rooms no fragment may fill) and the overlength samples are poured into the room left, each ending where "
        "the next can still start; it is kept when it needs fewer packs than the windowed plan. The default "
        "`min_fragment` is min(128, cap / 8) since issue 14 (the last two rows: the old min(128, cap / 2), whose "
        "rooms at small caps no fragment may fill). Fragments: spans of samples that were cut (TRL's: "
        "its documents less the samples that fit). Only `split_fill` and `min_fragment=1` reach the bound "
        "everywhere; windowed bfd stays 1-5% above it, and WFAP, which balances pack cost and leaves room in "
        "packs holding an expensive sample on purpose, more. Reproduce:",
        "",
        "```",
        command,
        "```",
        "",
        split_md,
    ])


def write_split_section(path: Path, body: str, heading: str = SPLIT_HEADING) -> None:
    """Replace only one subsection of the packing section (``--split-only``, ``--dataset-only``)."""
    text = path.read_text(encoding="utf-8")
    start = text.find(heading)
    if start < 0:
        raise SystemExit(f"{path} has no '{heading}' subsection: run the full benchmark once")
    nxt = min((k for k in (text.find("\n### ", start + 1), text.find("\n## ", start + 1)) if k >= 0),
              default=len(text))
    path.write_text(text[:start] + body.strip() + "\n\n" + text[nxt + 1:], encoding="utf-8")


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
        arr = np.array([s for p in res.packs for s in p], dtype=np.int64)
        split = np.bincount(arr[:, 0], minlength=lengths.size)[arr[:, 0]] > 1  # spans of a split sample
        frag = np.sort(arr[split, 2] - arr[split, 1])
        frag_txt = (f"{frag.size:,}: {frag[0]:,} / {int(np.median(frag)):,} / {frag[-1]:,}" if frag.size else "0")
        rows.append({"workload": name, "label": label, "seconds": best, "wall": wall, "steady_worst": max(steady),
                     "fragments": frag_txt, **m})
        print(f"  {name:9s} {label:24s} imbalance {m['imbalance_mean']:.3f} (worst {m['imbalance_worst']:.3f}) "
              f"split {100 * m['fragmentation']:.2f}% padding {100 * m['padding']:.2f}% cpu {best:.2f}s wall {wall:.2f}s",
              flush=True)
    return rows


def table(rows: list[dict], packs_per_window: int) -> str:
    cols = ["workload", "strategy", "max/mean pack cost (mean over windows)", "worst window",
            "worst before the end of stream", "CV of pack cost",
            "total cost (s/layer)", "est. time (s/layer)", "vs. its lower bound", "padding", "samples split",
            "fragments: count: min / median / max tokens", "samples deferred", "delay mean / max (windows)",
            "planner CPU time", "samples/s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lb = r["total_cost_s"] / packs_per_window
        lines.append(
            f"| {r['workload']} | {r['label']} | {r['imbalance_mean']:.3f} | {r['imbalance_worst']:.3f} "
            f"| {r['steady_worst']:.3f} "
            f"| {r['cost_cv']:.3f} | {r['total_cost_s']:.0f} | {r['est_time_s']:.1f} | {r['est_time_s'] / lb:.3f}x "
            f"| {100 * r['padding']:.2f}% | {100 * r['fragmentation']:.2f}% | {r['fragments']} "
            f"| {100 * r['deferred_share']:.2f}% "
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


DATASET_HEADING = "### pack_dataset end to end vs. TRL"


def dataset_section(max_tokens: int, ds_md: str) -> str:
    """The pack_dataset vs TRL subsection: heading, how it was measured, the table."""
    return "\n".join([
        f"{DATASET_HEADING} ({max_tokens:,}-token cap)",
        "",
        "A `datasets.Dataset` of int32 token ids with the `wlbllm` lengths resampled (seed 0) to each size, packed "
        "by `atac_hf.pack_dataset` (planning + building the rows, default settings unless the row says otherwise: "
        "WFAP, 64 packs per window) and by TRL's `pack_dataset(strategy=\"bfd\", map_kwargs={\"keep_in_memory\": "
        "True})` (both keep the rows in memory), each in a fresh subprocess with one Arrow thread, its imports "
        "done before the clock starts (TRL's alone take about 5 s of CPU). CPU time is the "
        "process's `time.process_time`; peak memory is the larger of the peak RSS over the run (Linux `VmHWM`, "
        "reset before it) minus the RSS before it, and the peak of Arrow's memory pool (`max_memory`) over the "
        "run (the RSS delta alone can hide pages the allocators recycle); the input's Arrow size is `dataset.data.nbytes`. Max/mean pack cost: the "
        "packs in output order grouped in windows of 64 (what a 64-replica step runs side by side; the last "
        "partial window left out), costed with the package's default cost model; its \"vs TRL\" column is the "
        "ratio of the excess over 1.0. TRL 1.16 cuts samples over the cap (`bfd` truncates); these lengths have "
        "none over 128K. Our peak is the output rows themselves (built in memory, about the input's size: an "
        "in-memory source; one on disk gets its rows written to a cache file, next section)."
        if ds_md else "pack_dataset vs. TRL: not run.",
        "",
        ds_md,
    ])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--dataset-worker"]:
        import json

        spec = json.loads(argv[1])
        print(json.dumps(dataset_worker(spec["kind"], spec["n"], spec["max_tokens"], spec["options"])))
        return 0
    args = parse_args(argv)
    command = "python scripts/bench_packing.py" + "".join(" " + shlex.quote(a) for a in argv)
    if args.dataset_only:
        sizes = [int(x) for x in args.dataset_sizes.split(",") if x.strip()]
        ds_md, _ = run_dataset_bench(sizes, args.dataset_max_tokens, with_trl=not args.no_trl)
        print(ds_md)
        if not args.no_docs:
            write_split_section(Path(args.docs), dataset_section(args.dataset_max_tokens, ds_md), DATASET_HEADING)
            print(f"\nwrote {args.docs} ({DATASET_HEADING})")
        return 0
    if args.split_only:
        split_md = run_split_cases(args.split_cases, with_trl=not args.no_trl)
        print(split_md)
        if not args.no_docs:
            write_split_section(Path(args.docs), split_section(args.split_cases, split_md, command))
            print(f"\nwrote {args.docs} ({SPLIT_HEADING})")
        return 0
    cm = CostModel.from_model(args.model, args.hardware)
    workloads = {"longtail": make_workload("longtail", args.num_samples, seed=args.seed)}
    if Path(args.lengths).exists():
        workloads["wlbllm"] = load_lengths(args.lengths)
    else:
        print(f"note: {args.lengths} not found; benchmarking the built-in workload only", file=sys.stderr)

    rows, shapes = [], []
    for name, lengths in workloads.items():
        d = describe_lengths(lengths)
        shapes.append(f"- `{name}`: {d['num_samples']:,} samples, {d['tokens']:,} tokens, median {d['median']:,.0f}, "
                      f"p99 {d['p99']:,.0f}, max {d['max']:,}; over 32K: {100 * d['long_sample_share']:.2f}% of "
                      f"samples, {100 * d['long_token_share']:.1f}% of tokens")
        print(f"{name}: {shapes[-1][2:]}", flush=True)
        wrows = run_workload(name, lengths, args, cm)
        rows += wrows

    md = table(rows, args.packs_per_window)
    print()
    print(md)
    split_md = ""
    if args.split_cases:
        print(f"\nsplit mode on {args.split_cases} random cases:", flush=True)
        split_md = run_split_cases(args.split_cases, with_trl=not args.no_trl)
        print(split_md)
    sizes = [int(x) for x in args.dataset_sizes.split(",") if x.strip()]
    ds_md = ""
    if sizes:
        print(f"\npack_dataset end to end vs TRL ({args.dataset_max_tokens:,}-token cap):", flush=True)
        ds_md, _ds_rows = run_dataset_bench(sizes, args.dataset_max_tokens, with_trl=not args.no_trl)
        print(ds_md)
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
        "cost / packs per window); padding = 1 - tokens / (packs x cap); samples split and their fragments (every strategy splits "
        "overlength samples into full-cap fragments and the rest; with `balance_split=True`, opt-in since "
        "issue 14, WFAP also splits overdue heavy samples it cannot balance, which lowers its total cost a "
        "little: fragments attend to less context); "
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
        split_section(args.split_cases, split_md, command) if split_md else "",
        "",
        dataset_section(args.dataset_max_tokens, ds_md),
    ])
    if not args.no_docs:
        write_docs(Path(args.docs), body)
        print(f"\nwrote {args.docs} ({HEADING})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

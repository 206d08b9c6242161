"""`atac-hf simulate` and `atac-hf bench`.

:func:`add_parser` adds both sub-commands (each only once, so listing this module under
several command names is harmless); :func:`add_simulate_parser` and
:func:`add_bench_parser` add one each. Every parser sets ``func``, which returns the exit
code. (``atac-hf calibrate`` lives beside the calibration, in :mod:`atac_hf.cost.cli`.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .._argtypes import config_dims, parse_float, parse_int, parse_tokens, read_model_config
from ..cost import HARDWARE_PRESETS, MODEL_PRESETS
# the bounds of one run (packs, pack tokens, steps): the CLI checks its flags against the same
# numbers ClusterConfig and simulate() check their arguments against
from .cluster import MAX_SIM_PACKS, MAX_SIM_STEPS, MAX_SIM_TOKENS

__all__ = ["add_parser", "add_simulate_parser", "add_bench_parser", "run_simulate", "run_bench", "workload_info",
           "workload_line"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``simulate`` and ``bench`` (those not present yet)."""
    have = set(getattr(sub, "choices", {}) or {})
    for name, fn in (("simulate", add_simulate_parser), ("bench", add_bench_parser)):
        if name not in have:
            fn(sub)


def _cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    # (--cp-size etc. as aliases: `atac-hf plan --cp-size`, `calibrate --tp-size` and ATACConfig spell them so)
    g.add_argument("--dp", "--dp-size", type=parse_int, default=4, help="data-parallel replicas (default 4)")
    g.add_argument("--pp", "--pp-size", type=parse_int, default=4, help="pipeline stages (default 4)")
    g.add_argument("--cp", "--cp-size", type=parse_int, default=8, help="context-parallel ranks per pack (default 8)")
    g.add_argument("--tp", "--tp-size", type=parse_int, default=1, help="tensor-parallel ranks (default 1)")
    g.add_argument("--micro-batches", type=parse_int, default=8, help="packs per DP replica per step (default 8)")
    g.add_argument("--max-tokens", type=parse_tokens, default=131072,
                   help="token cap per pack, e.g. 128K (default 131072)")
    g.add_argument("--num-gpus", type=parse_int, default=None, help="check: must equal dp x pp x cp x tp")
    g.add_argument("--model", default="7b",
                   help=f"model preset {sorted(MODEL_PRESETS)} or an HF config.json path (default 7b; a --profile "
                        "or --eval-profile must have been measured for it)")
    g.add_argument("--hardware", default="A800", choices=sorted(HARDWARE_PRESETS),
                   help="hardware preset (default A800)")
    g.add_argument("--profile", "--cost-profile", default=None,
                   help="calibration profile JSON (replaces the preset's compute)")
    g.add_argument("--efficiency", type=parse_float, default=0.5, help="share of peak FLOP/s for presets (default 0.5)")


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    from .results import PACKINGS, SHARDINGS

    p = sub.add_parser("simulate", help="simulate one scenario: every packing x sharding combination",
                       description="Pipeline-level simulation (DP x PP x CP x TP, 1F1B) of one workload on one "
                                   "cluster, every packing x sharding combination on the same sample stream.")
    p.add_argument("--workload", default="longtail",
                   help="built-in (longtail, sft, uniform), a .json array of lengths, or dataset:<path>[:<column>] "
                        "(default longtail)")
    _cluster_args(p)
    p.add_argument("--steps", type=parse_int, default=16, help="stream length in optimizer steps (default 16)")
    p.add_argument("--seed", type=parse_int, default=0)
    p.add_argument("--windows", choices=("adaptive", "fixed"), default="adaptive",
                   help="adaptive: each packer sizes its windows like its feeder; fixed: identical windows")
    p.add_argument("--combos", default="all",
                   help=f"'all', 'named' (HF default, WLB-LLM, ATAC) or comma-separated names and packing+sharding "
                        f"pairs, each once; packings {list(PACKINGS)}, shardings {list(SHARDINGS)}")
    p.add_argument("--max-tokens-per-rank", type=parse_tokens, default=None, metavar="N",
                   help="per-rank token cap of the CP plans (default: ceil(--max-tokens / --cp x 1.25)); a "
                        "combination with a pack over it is reported as refused, an error only when none fits")
    p.add_argument("--eval-attn-scale", type=_scales, default=None, metavar="K[,K...]",
                   help="robustness report: plan with the cluster's cost model, time with it at these attention "
                        "price ratios (e.g. 0.5,1,2), every combination at each")
    p.add_argument("--eval-profile", action="append", default=[], metavar="PROFILE.json",
                   help="robustness report: also time the plans with this cost profile (repeatable)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run_simulate)


def _scales(text: str) -> tuple[float, ...]:
    try:
        if not str(text).isascii():  # float() also takes other scripts' digits
            raise ValueError(text)
        out = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers (e.g. 0.5,1,2)") from None
    if not out or any(not (0 < k < float("inf")) for k in out):
        raise argparse.ArgumentTypeError(f"{text!r}: attention price ratios must be finite numbers > 0 (e.g. 0.5,1,2)")
    if len(set(out)) < len(out):  # a repeated ratio would report the same run twice
        raise argparse.ArgumentTypeError(f"{text!r} repeats a ratio: give each attention price ratio once (e.g. 0.5,1,2)")
    return out


def workload_info(spec: str, lengths: Any, *, seed: int | None = None) -> dict[str, Any]:
    """What a run's workload is: name, source, number of samples and tokens (JSON-friendly)."""
    import numpy as np

    from ..workloads import SAMPLES, WORKLOADS, sample_path, workload_name

    if spec in WORKLOADS:
        source = f"built-in mix, {len(lengths):,} lengths drawn with seed {seed}"
    elif spec in SAMPLES or any(os.path.abspath(spec) == os.path.abspath(sample_path(n)) for n in SAMPLES):
        name = spec if spec in SAMPLES else next(n for n in SAMPLES if os.path.abspath(spec) == os.path.abspath(
            sample_path(n)))
        source = f"shipped sample {name!r}, atac_hf/workload_data/{SAMPLES[name]}"
    else:
        source = spec
    arr = np.asarray(lengths, dtype=np.int64)
    return {"name": workload_name(spec), "source": source, "num_samples": int(arr.size), "tokens": int(arr.sum()),
            "longest": int(arr.max()) if arr.size else 0}


def workload_line(spec: str, lengths: Any, *, seed: int | None = None) -> str:
    """``workload NAME (SOURCE): N samples, T tokens, longest L`` (the first line a run prints)."""
    w = workload_info(spec, lengths, seed=seed)
    return (f"workload {w['name']} ({w['source']}): {w['num_samples']:,} samples, {w['tokens']:,} tokens, "
            f"longest {w['longest']:,}")


def _check_sim_sizes(args: argparse.Namespace) -> None:
    def shown(v: int) -> str:
        return str(v) if abs(v) < 10**30 else f"<int of {v.bit_length()} bits>"

    for name, value, high in (("--steps", args.steps, MAX_SIM_STEPS), ("--max-tokens", args.max_tokens, MAX_SIM_TOKENS),
                              ("--dp", args.dp, MAX_SIM_PACKS), ("--micro-batches", args.micro_batches, MAX_SIM_PACKS)):
        if not 1 <= value <= high:
            raise ValueError(f"{name}={shown(value)} must be from 1 to {high}")
    packs = args.steps * args.dp * args.micro_batches
    if packs > MAX_SIM_PACKS:
        raise ValueError(f"--steps x --dp x --micro-batches = {packs} packs to simulate, more than {MAX_SIM_PACKS}: "
                         "lower one of them")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed={shown(args.seed)} must be from 0 to {MAX_SEED} (2**63 - 1)")
    cap = getattr(args, "max_tokens_per_rank", None)
    if cap is not None and not 1 <= cap <= MAX_SIM_TOKENS:
        raise ValueError(f"--max-tokens-per-rank={shown(cap)} must be from 1 to {MAX_SIM_TOKENS} (or omit it: "
                         "ceil(--max-tokens / --cp x 1.25))")


def run_simulate(args: argparse.Namespace) -> int:
    from .cluster import ClusterConfig
    from .combos import parse_combos
    from .report import COMBO_LEGEND, combo_table
    from .simulate import simulate
    from ..workloads import load_workload, workload_name

    combos = parse_combos(args.combos)  # before any work: a bad or duplicated entry costs nothing
    _check_sim_sizes(args)
    config = None if args.model.lower() in MODEL_PRESETS else read_model_config(args.model)  # read once
    model = args.model.lower() if config is None else config_dims(args.model, config)
    try:
        cluster = ClusterConfig(dp_size=args.dp, pp_size=args.pp, cp_size=args.cp, tp_size=args.tp,
                                num_micro_batches=args.micro_batches, max_tokens=args.max_tokens,
                                model=model, hardware=args.hardware, profile=args.profile,
                                efficiency=args.efficiency, num_gpus=args.num_gpus,
                                max_tokens_per_rank=getattr(args, "max_tokens_per_rank", None))
    except ValueError as e:
        if "is smaller than cp_size" not in str(e):
            raise
        # ClusterConfig names its fields; here the user set flags
        raise ValueError(f"--max-tokens={args.max_tokens} is smaller than --cp={args.cp}: every CP rank needs a token "
                         f"of each pack; lower --cp or raise --max-tokens to at least {args.cp}") from None
    lengths = load_workload(args.workload, seed=args.seed)
    if not args.json:
        print(workload_line(args.workload, lengths, seed=args.seed), flush=True)
    t0 = time.perf_counter()
    if args.eval_attn_scale or args.eval_profile:
        return _run_robustness(args, cluster, lengths, t0, combos)
    res = simulate(lengths, cluster, combos=combos, num_steps=args.steps, seed=args.seed,
                   windows=args.windows, workload=workload_name(args.workload))
    refusal = model_refusal(config)
    if args.json:
        print(json.dumps({**res.to_dict(), "workload_info": workload_info(args.workload, lengths, seed=args.seed),
                          **({"model_refusal": refusal} if refusal else {})}, default=float))
        return 0
    what_if = "; ".join(cluster.what_if_reasons() + ((f"the atac_cp attention refuses this model: {refusal}; "
                                                      "every layer priced as softmax attention",) if refusal else ()))
    print(f"{cluster.describe()} ({'what-if: ' + what_if if what_if else 'runs with the atac-hf integration'}); "
          f"workload {res.workload}; {res.num_samples} samples simulated; {time.perf_counter() - t0:.1f} s")
    print(combo_table(res))
    print(COMBO_LEGEND)
    d = res.to_dict()
    names = {"vs_hf_default": "HF default", "vs_wlb_llm": "WLB-LLM", "vs_strongest": "the strongest baseline"}
    parts = [f"{v:.2f}x {names.get(k, k)}" for k, v in d.get("speedup", {}).items()]
    parts += [f"no ratio over {names.get(k, k)} ({why})" for k, why in d.get("speedup_omitted", {}).items()
              if k != "all"]
    if parts:
        print("ATAC: " + ", ".join(parts) + (f" (strongest: {d['strongest_baseline']})" if "strongest_baseline" in d
                                              else ""))
    elif "ATAC" in res.refused:
        print("ATAC refused: no speedup computed")
    return 0


def model_refusal(config: Any) -> str | None:
    """Why the ``atac_cp`` attention refuses the model of ``--model``'s config.json (``config``, as
    :func:`~atac_hf._argtypes.read_model_config` read it) by its config alone (an encoder-decoder,
    non-attention layers, chunked or sparse attention, position-dependent RoPE: the rules ``atac-hf
    check-model`` applies before its probe), or None: a preset (``config`` None), a config transformers does
    not know (a dict), or one those rules accept (``atac-hf check-model --config`` runs the probe too)."""
    if config is None or isinstance(config, dict):
        return None
    if getattr(config, "is_encoder_decoder", False):
        return "is an encoder-decoder model: ATP-CP shards the packed rows of decoder-only causal LMs"
    from ..attention.model_check import config_refusal

    got = config_refusal(config)
    return None if got is None else got[1]


def _run_robustness(args: argparse.Namespace, cluster: Any, lengths: Any, t0: float, combos: Any) -> int:
    from .robustness import robustness_rows, robustness_table, run_robustness
    from ..workloads import workload_name

    runs = run_robustness(lengths, cluster, scales=args.eval_attn_scale or (), profiles=args.eval_profile,
                          combos=combos, num_steps=args.steps, seed=args.seed,
                          windows=args.windows, workload=workload_name(args.workload))
    rows = robustness_rows(runs)
    if args.json:
        print(json.dumps({"cluster": cluster.to_dict(), "workload": workload_name(args.workload), "rows": rows},
                         default=float))
        return 0
    print(f"{cluster.describe()}; workload {workload_name(args.workload)}; planned with {cluster.cost_model().name}, "
          f"timed by {len(runs)} evaluation models; {time.perf_counter() - t0:.1f} s")
    print(robustness_table(rows))
    print("time/LB: step time over the balance lower bound under the evaluation model; ATAC speedup: ATAC's time "
          "advantage over that row; window max/mean: costliest pack over the mean per full window (mean, worst); "
          "CP max/mean: per-rank imbalance of the shard plans (mean, worst pack).")
    return 0


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    from .bench import wlbllm_path

    p = sub.add_parser("bench", help="run the simulator's scenario grid and print (or write) the benchmark report",
                       description="Simulate the default grid (model sizes, 32K-128K packs, CP 2-8, TP 1-8, PP 1/4, "
                                   "DP>1; built-in workloads plus the shipped wlbllm lengths) and print the comparison. "
                                   "Each scenario is marked runnable (a layout the atac-hf integration runs: FSDP2/DP x "
                                   "CP, DDP x TP x CP) or what-if (PP, or model states that do not fit); the geometric means are over the runnable ones, the "
                                   "what-if ones are summarised apart. "
                                   "With --output FILE.md, (re)write that file's '## Simulator (pipeline-level)' "
                                   "section and put the PNG plots beside it; without it nothing is written.")
    p.add_argument("--workload-file", default=None,
                   help=f"wlbllm-style JSON array of lengths, or a length column of a parquet/csv/jsonl/arrow file or "
                        f"saved dataset as dataset:<path>[:<column>] (default: the shipped sample, {wlbllm_path()})")
    p.add_argument("--output", default=None, metavar="FILE.md",
                   help="markdown file whose simulator section is (re)written, e.g. docs/BENCHMARKS.md "
                        "(default: print only, write nothing)")
    p.add_argument("--plots-dir", default=None, help="where the PNG plots go (default: the --output file's folder)")
    p.add_argument("--no-write", action="store_true", help="print only, even with --output")
    p.add_argument("--profile", "--cost-profile", default=None,
                   help="calibration profile: every scenario then runs the profile's model and tp_size on its "
                        "measured compute (links still from each scenario's hardware preset)")
    p.add_argument("--workers", type=parse_int, default=None, help="processes (default: CPU count)")
    p.add_argument("--seed", type=parse_int, default=0)
    p.add_argument("--scenarios", default=None, help="comma-separated scenario names to run (default: all)")
    p.add_argument("--eval-attn-scale", type=_scales, default=None, metavar="K[,K...]",
                   help="robustness report: plan every scenario with its cost model, time it with that model's "
                        "attention priced at these ratios (e.g. 0.5,1,2); prints the report, writes nothing")
    p.add_argument("--eval-profile", action="append", default=[], metavar="PROFILE.json",
                   help="robustness report: also time every scenario's plans with this cost profile (repeatable)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run_bench)


def bench_command(args: argparse.Namespace) -> str:
    """The ``atac-hf bench`` command line that reproduces this run's report: every option that
    changes what is simulated or where it is written (``--workers`` changes neither)."""
    import shlex

    parts = ["atac-hf", "bench", "--output", args.output]
    for flag, value in (("--workload-file", args.workload_file), ("--plots-dir", args.plots_dir),
                        ("--profile", args.profile), ("--scenarios", args.scenarios)):
        if value:
            parts += [flag, value]
    if args.seed != 0:
        parts += ["--seed", str(args.seed)]
    return " ".join(shlex.quote(str(x)) for x in parts)


#: Most ``--workers`` processes bench starts.
MAX_WORKERS = 1024
#: ``--seed`` range (numpy's generators take any integer >= 0; beyond 2^63 it is a typo).
MAX_SEED = 2**63 - 1


def _check_bench_args(args: argparse.Namespace) -> None:
    """``--workers`` and ``--seed`` in range, before anything runs."""
    for name, value, low, high in (("--workers", args.workers, 1, MAX_WORKERS), ("--seed", args.seed, 0, MAX_SEED)):
        if value is not None and not low <= value <= high:
            shown = value if abs(value) < 10**30 else "<huge>"
            raise ValueError(f"{name} {shown} must be from {low} to {high}"
                             + (" (or omit it: one per CPU)" if name == "--workers" else ""))


def run_bench(args: argparse.Namespace) -> int:
    from .bench import (FEATURED_SCENARIO, PAPER_SCENARIO, PAPER_SPLIT, _lengths, default_grid, run_grid,
                        workload_file_missing)
    from .plots import have_matplotlib, plot_all
    from .report import COMBO_LEGEND, combo_table, grid_table, headline, markdown_section, summarise_grid, write_section

    _check_bench_args(args)
    if args.workload_file and workload_file_missing(args.workload_file):
        raise ValueError(f"--workload-file {args.workload_file!r} does not exist")
    if args.plots_dir and not args.output:
        raise ValueError(f"--plots-dir {args.plots_dir!r} needs --output FILE.md (the report the plots belong to); "
                         "without --output bench writes nothing")
    robust = bool(args.eval_attn_scale or args.eval_profile)
    if robust and args.output and not args.no_write:
        raise ValueError(f"--output {args.output!r} rewrites the simulator section from the planning model's run; "
                         "with --eval-attn-scale / --eval-profile bench prints the robustness report only "
                         "(scripts/bench_robustness.py --output writes its section): drop --output or the --eval "
                         "options")
    write = bool(args.output) and not args.no_write
    if write:  # before the grid runs (minutes): a bad path must not cost the run, nor leave plots behind
        from .._io import check_output_dir, check_output_file

        check_output_file(args.output, "--output", "report", example="BENCHMARKS.md", make_folders=True)
        if args.plots_dir:
            check_output_dir(args.plots_dir, "--plots-dir")
    if args.workload_file:  # read once here so that a bad file's message names --workload-file
        from ..workloads import load_workload

        load_workload(args.workload_file, num_samples=200_000, seed=1, setting="--workload-file")
    grid = default_grid(args.workload_file)
    if args.scenarios is not None:
        want = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        if not want:
            raise ValueError(f"--scenarios {args.scenarios!r} names no scenario; give comma-separated names "
                             f"from {[s.name for s in grid]} (or omit --scenarios for all)")
        unknown = sorted(set(want) - {s.name for s in grid})
        if unknown:
            raise ValueError(f"--scenarios: unknown {unknown}; legal: {[s.name for s in grid]}")
        grid = [s for s in grid if s.name in want]
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else (lambda msg: print(msg, flush=True))
    specs = list(dict.fromkeys(s.workload for s in grid))
    infos = [workload_info(w, _lengths(w), seed=1) for w in specs]
    for w in specs:  # first: which workloads this run uses
        say(workload_line(w, _lengths(w), seed=1))
    if write and not have_matplotlib():
        say("no plots: matplotlib is not installed (pip install matplotlib, or the package's [dev] extra)")
    t0 = time.perf_counter()
    if robust:
        return _bench_robustness(args, [s for s in grid if not s.extra], t0)
    results = run_grid(grid, seed=args.seed, workers=args.workers, profile=args.profile,
                       progress=not args.json)
    seconds = time.perf_counter() - t0
    side = {getattr(r, "name", ""): r for r in results if getattr(r, "extra", False)}
    results = [r for r in results if not getattr(r, "extra", False)]
    summary = summarise_grid(results)
    paper = next((r for r in results if getattr(r, "name", "") == PAPER_SCENARIO), None)
    paper_line = None
    named = ("ATAC", "HF default", "WLB-LLM")
    if paper is not None and not set(named) <= set(paper.combos):  # never a ratio against a refused combination
        paper_line = (f"Paper-like scenario (`{PAPER_SCENARIO}`): no comparison, "
                      f"{', '.join(k for k in named if k not in paper.combos)} refused over the per-rank token cap.")
    elif paper is not None:
        a = paper.combos["ATAC"]
        what = "; ".join(paper.cluster.what_if_reasons())
        label = f"a what-if for atac-hf ({what}), kept as the comparison with the paper" if what else "runnable"
        paper_line = (f"Paper-like scenario (`{PAPER_SCENARIO}`: {paper.cluster.describe()}, wlbllm lengths; "
                      f"{label}): ATAC "
                      f"{paper.speedup('ATAC', 'HF default'):.2f}x HF default (paper: 1.93x), limit "
                      f"{paper.combos['HF default'].lb_ratio:.2f}x; {paper.speedup('ATAC', 'WLB-LLM'):.2f}x WLB-LLM; "
                      f"ATAC/LB {a.lb_ratio:.3f}, work cut {100 * a.split_work_saving:.1f}%")
        sp = side.get(PAPER_SPLIT)
        if (sp is not None and {"ATAC", "HF default"} <= set(sp.combos)
                and sp.packs.get("wfap") == paper.packs.get("wfap")):  # the same packs: no sample was split
            paper_line += (f". WFAP's opt-in balance splits (`balance_split=True`) split no sample in this "
                           f"{len(paper.packs['wfap'])}-step run (they split only heavy samples held back past their "
                           "deadline): ATAC is unchanged.")
        elif sp is not None and {"ATAC", "HF default"} <= set(sp.combos):
            paper_line += (f". With WFAP's opt-in balance splits (`balance_split=True`), which cut "
                           f"{100 * sp.combos['ATAC'].split_work_saving:.1f}% of the attention work (a split "
                           f"document loses the attention across the cut), ATAC is "
                           f"{sp.speedup('ATAC', 'HF default'):.2f}x HF default at {sp.combos['ATAC'].lb_ratio:.3f}x "
                           "its lower bound.")
        else:
            paper_line += "."
    if args.json:
        print(json.dumps({**summary, "workloads": infos, "seconds": seconds}, default=float))
    else:
        print(grid_table(summary))
        print(f"\n{headline(summary)} ({seconds:.1f} s)")
        print("limit (HF/LB) = HF default's time over its own balance lower bound; ATAC can pass it when WFAP's "
              "splits cut work (ATAC work cut), which lowers ATAC's own bound: ATAC/LB is ATAC's time over that.")
        if paper_line:
            print(paper_line)
    featured = _featured(results, FEATURED_SCENARIO)
    if not args.json and featured is not None:
        print(f"\n{getattr(featured, 'name', '')}:")
        print(combo_table(featured))
        print(COMBO_LEGEND)
    if write:
        md_dir = os.path.dirname(os.path.abspath(args.output))
        plots = plot_all(summary, featured, args.plots_dir or md_dir) if featured is not None else []
        cmd = bench_command(args)
        write_section(args.output, markdown_section(summary, [featured] if featured else [], command=cmd,
                                                    seconds=seconds, plots=[os.path.relpath(p, md_dir) for p in plots],
                                                    paper=paper_line))
        say(f"wrote {args.output}" + (f" and {len(plots)} plots in {os.path.dirname(plots[0]) or '.'}" if plots
                                      else " (no plots)"))
    return 0


def _bench_robustness(args: argparse.Namespace, grid: list, t0: float) -> int:
    """``atac-hf bench --eval-attn-scale/--eval-profile``: every scenario of ``grid`` planned with its
    own cost model, timed by each evaluation model; the table and one summary line per model."""
    from .bench import run_robustness_grid
    from .robustness import robustness_summary, robustness_summary_lines, robustness_table

    rows = run_robustness_grid(grid, scales=args.eval_attn_scale or (), eval_profiles=args.eval_profile,
                               seed=args.seed, workers=args.workers, profile=args.profile, progress=not args.json)
    summary = robustness_summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary, "seconds": time.perf_counter() - t0}, default=float))
        return 0
    print(robustness_table(rows))
    print()
    print("\n".join(robustness_summary_lines(summary)))
    print(f"{len(grid)} scenarios, each planned with its own cost model; {time.perf_counter() - t0:.1f} s. "
          "time/LB: step time over the balance lower bound under the evaluation model; ATAC speedup: ATAC's time "
          "advantage over that row's combination.")
    return 0


def _featured(results: list, name: str) -> Any:
    """The scenario the report details: ``name`` if run, else the first runnable one, else the first."""
    by_name = {getattr(r, "name", ""): r for r in results}
    return by_name.get(name) or next((r for r in results if r.cluster.runnable), results[0] if results else None)

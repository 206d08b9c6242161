"""``atac-hf pack``: pack sample lengths with one strategy and print the packs or a summary.

Examples::

    atac-hf pack --lengths atac_hf/workload_data/wlbllm_doc_lengths.json.gz --max-tokens 65536 \\
        --packs-per-window 64 --strategy wfap --model 7b --hardware A800
    atac-hf pack --workload longtail --num-samples 20000 --max-tokens 65536 --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from .._argtypes import DEFAULT_MODEL, model_or_preset, parse_int, parse_tokens, profile_model
from ..cost import HARDWARE_PRESETS, MODEL_PRESETS, CostModel
from ..workloads import WORKLOADS, load_lengths, make_workload
from .config import OVERLENGTH_POLICIES, STRATEGIES, PackingConfig
from .stream import pack_lengths

__all__ = ["MAX_NUM_SAMPLES", "add_parser", "run"]

#: Most samples ``--workload`` generates (10M lengths: 80 MB, minutes of packing).
MAX_NUM_SAMPLES = 10_000_000


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``pack`` sub-command to an argparse sub-parser set."""
    p = subparsers.add_parser(
        "pack",
        help="pack sample lengths (WFAP or a baseline) and report balance, padding, fragmentation",
        description="Pack sample lengths window by window and print the packs (--json) or a summary.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--lengths", metavar="FILE.json", help="JSON array of sample lengths (ints >= 0)")
    src.add_argument("--workload", choices=sorted(WORKLOADS), help="a built-in parametric workload instead")
    p.add_argument("--num-samples", type=parse_int, default=100_000, help="samples of --workload (default 100000)")
    p.add_argument("--seed", type=parse_int, default=0, help="seed of --workload (default 0)")
    p.add_argument("--max-tokens", type=parse_tokens, required=True, help="token cap of one pack, e.g. 65536 or 64K")
    p.add_argument("--packs-per-window", type=parse_int, default=64,
                   help="packs per window, e.g. DP replicas x gradient accumulation (default 64)")
    p.add_argument("--window", type=parse_int, default=None,
                   help="new samples per window (default: size windows by tokens)")
    p.add_argument("--strategy", choices=STRATEGIES, default="wfap", help="packing strategy (default wfap)")
    p.add_argument("--overlength", choices=OVERLENGTH_POLICIES, default="split",
                   help="samples longer than --max-tokens (default split)")
    p.add_argument("--max-defer", type=parse_int, default=None,
                   help="windows a sample may be held back (default "
                        f"{PackingConfig.__dataclass_fields__['max_defer'].default}; 0: no deferral)")
    p.add_argument("--model", default=None, help=f"model of the cost model: a preset {sorted(MODEL_PRESETS)} or the "
                   f"path of an HF config.json (default {DEFAULT_MODEL}; with --cost-profile: the profile's model, "
                   "and a --model given must be the one it was measured for)")
    p.add_argument("--hardware", default="H100", help=f"hardware preset: {sorted(HARDWARE_PRESETS)} (default H100)")
    p.add_argument("--cost-profile", "--profile", default=None,
                   help="calibrated cost profile JSON (replaces --hardware and the "
                   "model's preset prices; refused with a --model it was not measured for)")
    p.add_argument("--json", action="store_true", help="print one JSON object {packs, deferred, metrics}")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar over the samples on stderr (default: when stderr is a terminal)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``atac-hf pack``; user errors raise ValueError (the main CLI prints them)."""
    if not 1 <= args.num_samples <= MAX_NUM_SAMPLES:
        raise ValueError(f"--num-samples={args.num_samples if abs(args.num_samples) < 10**30 else '<huge>'} must be "
                         f"from 1 to {MAX_NUM_SAMPLES}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed={args.seed if abs(args.seed) < 10**30 else '<huge>'} must be from 0 to 2**63 - 1")
    if args.lengths is not None:
        lengths = load_lengths(args.lengths)  # bounded: regular files only, size and depth capped
        source = args.lengths
    else:
        lengths = make_workload(args.workload, args.num_samples, seed=args.seed)
        source = f"workload {args.workload} (n={args.num_samples}, seed={args.seed})"
    if args.window is not None and args.window < 1:
        raise ValueError(f"--window={args.window if abs(args.window) < 10**30 else '<huge>'} is invalid: it must be an "
                         "int >= 1 (new samples per window), or omit --window to size windows by tokens")
    if args.cost_profile:
        cm = profile_model(args.cost_profile, "--cost-profile", args.model)
    else:
        model = DEFAULT_MODEL if args.model is None else args.model  # ("": refused, not taken for omitted)
        cm = CostModel.from_model(model_or_preset(model), args.hardware)
    options: dict[str, Any] = {}
    if args.max_defer is not None:
        options["max_defer"] = args.max_defer
    config = PackingConfig(max_tokens=args.max_tokens, packs_per_window=args.packs_per_window,
                           strategy=args.strategy, overlength=args.overlength, **options)
    t0 = time.perf_counter()
    progress = getattr(args, "progress", None)  # a Namespace built by hand may lack it
    progress = _stderr_is_tty() if progress is None else progress
    result = pack_lengths(lengths, config, cm, window=args.window, progress=bool(progress))
    seconds = time.perf_counter() - t0
    if args.json:
        out = {
            "packs": [[list(span) for span in pack] for pack in result.packs],
            "deferred": [list(d) for d in result.deferred],
            # NaN (no packs at all: every sample empty) is not JSON: null
            "metrics": {k: (None if isinstance(v, float) and math.isnan(v) else v)
                        for k, v in {**result.metrics, "planner_seconds": seconds}.items()},
        }
        json.dump(out, sys.stdout, separators=(",", ":"), allow_nan=False)
        sys.stdout.write("\n")
        return 0
    m = result.metrics
    print(f"{source}: {m['num_samples']} samples, {m['tokens']} tokens -> {m['num_packs']} packs in "
          f"{m['num_windows']} windows ({config.strategy}, cap {config.max_tokens}, "
          f"{config.packs_per_window} packs/window, cost model {cm.name})")
    if m["num_packs"] == 0:  # every sample empty: no balance, padding or time to report (--json: null)
        print(f"  no packs: every sample is empty (zero-length skipped {m['zero_length_skipped']}), so there is "
              "no balance, padding or time to report")
        return 0
    est = m["est_time_s"]  # a pack of a few K tokens takes well under a second a layer: ms there, not "0.00 s"
    print(f"  pack cost max/mean per window: mean {m['imbalance_mean']:.3f}, worst {m['imbalance_worst']:.3f}; "
          f"CV {m['cost_cv']:.3f}; est. time {f'{est:.2f} s' if est >= 1 else f'{est * 1e3:.3g} ms'}/layer")
    print(f"  padding {100 * m['padding']:.2f}%  split samples {100 * m['fragmentation']:.2f}%  "
          f"truncated tokens {m['truncated_tokens']}  zero-length skipped {m['zero_length_skipped']}")
    print(f"  deferred {100 * m['deferred_share']:.2f}% of samples, delay mean {m['delay_mean_deferred']:.2f} "
          f"max {m['delay_max']} windows; planned in {seconds:.2f} s")
    return 0


def _stderr_is_tty() -> bool:
    """Whether stderr is a terminal (the default of ``--progress``; a closed or odd stream is not)."""
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Run ``pack`` on its own (``python -m atac_hf.packing.cli ...``)."""
    parser = argparse.ArgumentParser(prog="atac-hf")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pack", *(sys.argv[1:] if argv is None else argv)])
    from ..cli import run_parsed  # lazy: atac_hf.cli loads this module

    return run_parsed(args)


if __name__ == "__main__":
    sys.exit(main())

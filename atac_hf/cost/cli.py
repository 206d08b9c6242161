"""`atac-hf calibrate`: measure this machine and write a cost profile (imports torch when it runs)."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from .._argtypes import model_arg, parse_int, parse_tokens

__all__ = ["MAX_CALIBRATE_LEN", "add_parser", "check_device", "run_calibrate"]

#: Longest document ``--max-len`` may ask to time (2M tokens: hours on a CPU already).
MAX_CALIBRATE_LEN = 2**21


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``calibrate``."""
    add_calibrate_parser(sub)


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure this device and fit a cost-model profile",
                       description="Time a transformer-layer-like block (linear part; SDPA causal attention per "
                                   "document) forward+backward on this device, fit the CostModel coefficients, "
                                   "report the error on held-out packs and write a profile JSON.")
    p.add_argument("--output", "-o", default="atac_profile.json",
                   help="profile JSON to write (default atac_profile.json)")
    p.add_argument("--model", default=None,
                   help="model preset (default: tiny on CPU, 1b on CUDA) or an HF config.json path")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--tp-size", type=parse_int, default=1, help="tensor-parallel degree the profile is for (default 1)")
    p.add_argument("--quick", action="store_true", help="a small grid (seconds), e.g. for tests")
    p.add_argument("--threads", type=parse_int, default=None, help="CPU threads (default 1, timed by the process clock)")
    p.add_argument("--backend", choices=["sdpa", "flash", "varlen", "varlen_reference"], default="sdpa",
                   help="attention backend the profile is for: the ATACConfig attention_backend of the run "
                        "(default sdpa; use sdpa for flex)")
    p.add_argument("--max-len", type=parse_tokens, default=None,
                   help="longest document to price, e.g. the run's max_tokens (16K): extends the grid up to it "
                        "(default: documents up to 4K on CPU, 32K on CUDA)")
    p.add_argument("--budget-s", default=None,
                   help=f"time budget in seconds (> 0): the grid is priced first and --max-len halved until it "
                        f"fits (default {CPU_BUDGET_S:.0f} on CPU, none on CUDA; 'none': no budget)")
    p.add_argument("--seed", type=parse_int, default=0)
    p.add_argument("--json", action="store_true", help="print the profile metadata as JSON")
    p.set_defaults(func=run_calibrate)


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad arguments before anything is measured (a calibration takes minutes)."""
    from .._io import check_output_file

    check_output_file(args.output, "--output", "profile", example="profile.json")
    args.device = check_device(args.device)
    args.budget_s = _parse_budget(args.budget_s)
    for name, value, low, high in (("--tp-size", args.tp_size, 1, 1024), ("--threads", args.threads, 1, 1024),
                                   ("--max-len", args.max_len, 1, MAX_CALIBRATE_LEN), ("--seed", args.seed, 0, 2**63 - 1)):
        if value is not None and not low <= value <= high:
            raise ValueError(f"{name}={value if abs(value) < 10**30 else '<huge>'} must be from {low} to {high}")


def check_device(device: str | None) -> str | None:
    """``--device``: None (the default), ``cpu``, ``cuda`` or ``cuda:N`` of a visible GPU; anything else
    (``meta``, ``mps``, a typo) is refused with the legal values."""
    if device is None:
        return None
    d = str(device).strip().lower()
    m = _DEVICE_RE.fullmatch(d)
    shown = repr(device) if len(str(device)) <= 80 else repr(str(device)[:77] + "...")
    if not m:
        raise ValueError(f"--device {shown} is not supported; legal values: cpu, cuda, cuda:N (a visible GPU index)")
    if d == "cpu":
        return d
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"--device {shown}: CUDA is not available on this machine; legal values here: cpu "
                         "(or omit --device)")
    count = torch.cuda.device_count()
    if m.group(1) is not None and int(m.group(1)) >= count:
        raise ValueError(f"--device {shown}: this machine has {count} CUDA device(s); legal values: cpu, cuda, "
                         f"cuda:0 to cuda:{count - 1}")
    return d


_DEVICE_RE = re.compile(r"cpu|cuda(?::(\d{1,4}))?")


def _parse_budget(text: str | None) -> float | None:
    """``--budget-s``: None (the default), ``none`` (no budget: 0.0 downstream) or a finite number > 0."""
    if text is None:
        return None
    t = str(text).strip()
    if t.lower() == "none":
        return 0.0  # calibrate(budget_s <= 0): no budget
    try:
        value = float(t)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        shown = repr(text) if len(str(text)) <= 80 else repr(str(text)[:77] + "...")
        raise ValueError(f"--budget-s {shown} must be a finite number of seconds > 0 (e.g. 600), or 'none' for "
                         "no budget")
    return value


CPU_BUDGET_S = 600.0  # a 64K-token document alone takes minutes per round on one CPU core


def run_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import calibrate

    _check_args(args)
    model = model_arg(args.model) if args.model else None
    if model is None:
        import torch

        model = "1b" if (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda") \
            else "tiny"
    import torch

    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    budget = args.budget_s if args.budget_s is not None else (None if cuda else CPU_BUDGET_S)
    say = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if say:
        say(f"calibrating model {args.model or model} on {'cuda' if cuda else 'cpu'} (backend {args.backend}, "
            f"max_len {args.max_len or 'default'}, budget {f'{budget:.0f} s' if budget else 'none'}): probing...")
    res = calibrate(model, device=args.device, quick=args.quick, tp_size=args.tp_size, seed=args.seed,
                    threads=args.threads, backend=args.backend, progress=say, max_len=args.max_len,
                    budget_s=budget)
    res.save(args.output)
    if args.json:
        print(json.dumps({"profile": args.output, **res.metadata(), "heldout": res.heldout}, default=float))
    else:
        print(res.summary())
        print(f"wrote {args.output}")
    return 0

"""`atac-hf` command line: one sub-command per tool, each defined beside its code."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules with `add_parser(subparsers)`; each adds its sub-command(s) and sets `func`.
_COMMAND_MODULES = (
    "atac_hf.packing.cli",  # pack
    "atac_hf.sharding.cli",  # plan
    "atac_hf.sim.cli",  # simulate, bench
    "atac_hf.cost.cli",  # calibrate
    "atac_hf.integrations.check_cli",  # check-model
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atac-hf",
        description="Workload-balanced packing and anchor-tail context parallelism for HF training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as e:  # user errors: one clean line, no traceback
        print(f"atac-hf {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

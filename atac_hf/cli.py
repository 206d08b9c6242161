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


#: What a user's input can raise on its way through a sub-command: each ends in one
#: ``atac-hf <cmd>: error: ...`` line and exit code 2, never a traceback. ValueError and
#: TypeError are the documented refusals, ImportError a missing optional dependency (e.g.
#: flash-attn for ``calibrate --backend flash``), NotImplementedError a feature this machine
#: lacks; the others are the last line of defence (an arithmetic overflow, a nesting or size no
#: check caught, an unwritable or unreadable path).
USER_ERRORS = (ValueError, TypeError, ImportError, NotImplementedError, ArithmeticError, RecursionError, MemoryError,
               OSError)
_MAX_MESSAGE = 2000


def error_line(command: str, error: BaseException) -> str:
    """The one line a sub-command's failure prints (the type named unless it is a ValueError)."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - a message that cannot be built (e.g. an int of 10^5 digits)
        text = "(message unavailable)"
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + f"... ({len(text) - _MAX_MESSAGE} more characters)"
    text = " ".join(text.split()) or type(error).__name__
    kind = "" if isinstance(error, ValueError) else f"{type(error).__name__}: "
    return f"atac-hf {command}: error: {kind}{text}"


def run_parsed(args: argparse.Namespace) -> int:
    """Run a parsed sub-command; a user error prints :func:`error_line` and returns 2."""
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        print(error_line(args.command, e), file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_parsed(args)


if __name__ == "__main__":
    sys.exit(main())

"""`atac-hf check-model`: the exactness verdict of one model family, one config.json, or every
causal-LM family of the installed transformers, probed at 2 gloo ranks on CPU.

The command spawns its own gloo workers once (``--world-size`` processes, a ``file://`` store) and
loops over the families inside them; rank 0 reports each verdict on a queue. A family that runs past
``--timeout`` seconds (or kills a worker) is recorded as such, the workers are replaced, and the loop
goes on with the next family.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

from .._argtypes import parse_float, parse_int

__all__ = ["add_parser", "run"]

_WINDOW_VARIANT = 8  # the extra "with a sliding window" variant of families whose default has none


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-model",
        help="verdict: is a model family exact under atac_cp, or refused (and why)",
        description="Run the exactness probe (a tiny fp64 copy of the architecture, atac_cp at --world-size gloo "
                    "ranks against each document run alone through the stock model) and print the verdict, its "
                    "reason and the measured error.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model-type", metavar="NAME", help="a transformers model_type (e.g. llama, qwen3, gpt2)")
    what.add_argument("--config", metavar="PATH", help="a config.json, or a checkpoint folder holding one (checked "
                      "as given: dropout etc. count)")
    what.add_argument("--all", action="store_true", help="every causal-LM family of the installed transformers")
    p.add_argument("--world-size", type=parse_int, default=2, help="gloo ranks of the probe (default 2)")
    p.add_argument("--timeout", type=parse_float, default=120.0, help="seconds one family may take (default 120)")
    p.add_argument("--output", metavar="PATH", help="also write the verdicts as a markdown table (docs/MODELS.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object per family instead of text")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------- work items
def _families() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [k for k in CONFIG_MAPPING.keys() if k in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]


def _items(args: argparse.Namespace) -> list[dict]:
    if args.config:
        if os.path.isdir(args.config) and os.path.isfile(os.path.join(args.config, "config.json")):
            args.config = os.path.join(args.config, "config.json")  # a checkpoint folder
        if not os.path.isfile(args.config):
            raise ValueError(f"--config {args.config!r} is not a file; pass the path of a config.json")
        try:
            with open(args.config) as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"--config {args.config!r} is not valid JSON ({e})") from None
        if not isinstance(d, dict) or "model_type" not in d:
            raise ValueError(f"--config {args.config!r} has no 'model_type': pass a transformers config.json")
        return [{"family": str(d["model_type"]), "config": d}]
    families = _families()
    if args.all:
        return [{"family": f, "config": None} for f in families]
    if args.model_type not in families:
        close = [f for f in families if args.model_type.lower().replace("-", "_") in f.replace("-", "_")][:8]
        raise ValueError(f"--model-type {args.model_type!r} is not a causal-LM family of the installed transformers"
                         f"{f' (did you mean {close}?)' if close else ''}; `atac-hf check-model --all` lists them")
    return [{"family": args.model_type, "config": None}]


def _variants(item: dict) -> list[tuple[str, Any]]:
    """(label, config) pairs to probe: a config.json as given; a family's default config with its dropout
    fields at 0, plus a sliding-window variant when the default has a window field left unset."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if item["config"] is not None:
        d = dict(item["config"])
        return [("config", AutoConfig.for_model(d.pop("model_type"), **d))]
    cfg = CONFIG_MAPPING[item["family"]]()
    for c in {id(c): c for c in (cfg, _text_config(cfg))}.values():
        for k, v in list(c.to_dict().items()):
            if isinstance(v, float) and ("dropout" in k or "pdrop" in k) and hasattr(c, k):
                setattr(c, k, 0.0)
    out = [("default", cfg)]
    text = _text_config(cfg)
    if hasattr(text, "sliding_window") and getattr(text, "sliding_window") is None:
        import copy

        win = copy.deepcopy(cfg)
        wtext = _text_config(win)
        if hasattr(wtext, "use_sliding_window"):
            wtext.use_sliding_window = True
        wtext.sliding_window = _WINDOW_VARIANT
        types = getattr(wtext, "layer_types", None)
        if isinstance(types, list) and types and set(types) == {"full_attention"}:
            # the layer types were derived from the unset window at init (Qwen2/3, SmolLM3): no layer would
            # slide, and this variant would re-run the default; alternate them (sliding first) instead
            wtext.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(len(types))]
        out.append(("sliding_window", win))
    return out


def _text_config(cfg: Any) -> Any:
    """The config's text config; the decoder's where it has several (MusicGen: a text encoder and a decoder),
    where plain ``get_text_config()`` raises."""
    try:
        return cfg.get_text_config()
    except ValueError:
        return cfg.get_text_config(decoder=True)


def _verdict(item: dict, rank: int, world: int) -> dict:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from ..attention.model_check import check_architecture

    t0 = time.perf_counter()
    try:
        variants = _variants(item)
    except Exception as e:  # noqa: BLE001 - reported as this family's verdict
        return _row(item, None, False, None, f"its config could not be built ({type(e).__name__}: {str(e)[:200]})",
                    "ValueError", t0)
    results = []
    for label, cfg in variants:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(cfg), None)
        if cls is None:
            return _row(item, None, False, None, f"has no causal-LM class for {type(cfg).__name__}", "ValueError", t0)
        results.append((label, check_architecture(cls, cfg, rank=rank, world=world, group=None)))
    errs = [v.max_error for _, v in results if v.max_error is not None]
    refused = [(label, v) for label, v in results if not v.exact]
    first = results[0][1]
    if refused:
        label, v = refused[0]
        where = ""
        if label not in ("default", "config"):
            where = f"with {label}={_WINDOW_VARIANT}: "
            if first.exact:  # the default config (no window) is exact: say so, the family is refused as a whole
                where = f"exact without a sliding window (max error {first.max_error:.1e}), but " + where
        return _row(item, v.model_class, False, max(errs) if errs else None, where + v.reason,
                    (v.error or NotImplementedError).__name__, t0)
    labels = " and ".join(label for label, _ in results)
    return _row(item, first.model_class, True, max(errs), f"{first.reason}; probed: {labels}", None, t0)


def _row(item: dict, cls: str | None, exact: bool, err: float | None, reason: str, error: str | None,
         t0: float) -> dict:
    return {"family": item["family"], "model_class": cls, "exact": exact, "max_error": err, "reason": reason,
            "error": error, "seconds": round(time.perf_counter() - t0, 2)}


# ---------------------------------------------------------------------------- workers
def _worker(rank: int, world: int, init_file: str, items: list[dict], queue: Any) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except Exception:  # noqa: BLE001 - logging level only
        pass
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for i, item in enumerate(items):
            if rank == 0:
                queue.put(("start", i, None))
            t0 = time.perf_counter()
            try:
                row = _verdict(item, rank, world)
            except Exception as e:  # noqa: BLE001 - this family's verdict, the loop goes on
                row = _row(item, None, False, None, f"the check itself failed ({type(e).__name__}: {str(e)[:200]})",
                           "NotImplementedError", t0)
            if rank == 0:
                queue.put(("done", i, row))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run_items(items: list[dict], world: int, timeout_s: float, progress: Any) -> list[dict]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    rows: list[dict] = []
    pending = list(items)
    while pending:
        fd, init_file = tempfile.mkstemp(prefix="atac_check_")
        os.close(fd)
        os.unlink(init_file)
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, world, init_file, pending, queue), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        done, current, started = 0, 0, time.monotonic()
        failed = None
        while done < len(pending):
            try:
                kind, i, row = queue.get(timeout=1.0)
            except Exception:  # noqa: BLE001 - queue.Empty: check the clock and the workers
                if time.monotonic() - started > timeout_s:
                    failed = f"timed out after {timeout_s:g} s (probe did not finish; raise --timeout)"
                elif any(p.exitcode not in (None, 0) for p in procs):
                    failed = "a probe worker died (" + ", ".join(str(p.exitcode) for p in procs) + ")"
                elif all(p.exitcode == 0 for p in procs):
                    failed = "the probe workers exited early"
                if failed:
                    break
                continue
            if kind == "start":
                current, started = i, time.monotonic()
            else:
                rows.append(row)
                done += 1
                progress(row)
        for p in procs:
            if p.is_alive() and failed:
                p.kill()
            p.join(timeout=30)
        if os.path.exists(init_file):
            os.unlink(init_file)
        if failed is None:
            break
        item = pending[current]
        row = {"family": item["family"], "model_class": None, "exact": False, "max_error": None,
               "reason": failed + "; refused: it cannot be shown exact", "error": "NotImplementedError",
               "seconds": round(timeout_s, 1)}
        rows.append(row)
        progress(row)
        pending = pending[current + 1:]
    return rows


# ---------------------------------------------------------------------------- output
def _fmt_err(err: float | None) -> str:
    return "-" if err is None else f"{err:.1e}"


def write_markdown(rows: list[dict], path: str, command: str) -> None:
    """The verdict table (family, class, verdict, max error, reason) with the command and versions."""
    import torch
    import transformers

    exact = [r for r in rows if r["exact"]]
    lines = [
        "# Model families under `atac_cp`: exact or refused",
        "",
        f"Generated by `{command}` with transformers {transformers.__version__} and torch {torch.__version__}.",
        "Each family's default config is shrunk to a tiny fp64 copy (same class; see "
        "`atac_hf/attention/model_probe.py`) and run through the `atac_cp` path at 2 gloo ranks on CPU, "
        "against each document of the packed row run alone through the stock model; families whose default "
        "has no sliding window are probed with one as well. The probe feeds token ids (embeddings to a class "
        "that takes only those); `max error` is the largest relative error of logits, input-embedding "
        "gradients and each parameter's gradient. `atac_hf.check_model(model)` (run by `ATACTrainer` and "
        "`ATACAccelerator`, which at cp_size > 1 also run the probe sharded over the run's CP ranks) gives "
        "the same verdict for a model built from such a config; every refusal raises with the reason shown "
        "here.",
        "",
        f"{len(exact)} of {len(rows)} families exact; {len(rows) - len(exact)} refused.",
        "",
        "| family | model class | verdict | max error | reason |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["family"]):
        reason = str(r["reason"]).replace("|", "\\|").replace("\n", " ")
        verdict = "exact" if r["exact"] else f"refused ({r['error']})"
        lines.append(f"| {r['family']} | {r['model_class'] or '-'} | {verdict} | {_fmt_err(r['max_error'])} | "
                     f"{reason} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


#: Most gloo ranks ``--world-size`` may spawn (each a process holding a model copy, on this machine).
MAX_WORLD_SIZE = 64


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad flags before any worker is spawned."""
    if not 1 <= args.world_size <= MAX_WORLD_SIZE:
        shown = args.world_size if abs(args.world_size) < 10**30 else "<huge>"
        raise ValueError(f"--world-size must be >= 1 and <= {MAX_WORLD_SIZE} (gloo processes on this machine; "
                         f"default 2), got {shown}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout must be > 0 seconds and finite (default 120; nan or inf would disable the "
                         f"watchdog), got {args.timeout:g}")
    if args.output:
        from .._io import check_output_file

        check_output_file(args.output, "--output", "report", example="MODELS.md")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    items = _items(args)
    bar = None
    if len(items) > 1:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(items), unit="family", file=sys.stderr)
        except ImportError:
            bar = None

    def progress(row: dict) -> None:
        if bar is not None:
            bar.set_postfix_str(row["family"])
            bar.update(1)
        elif len(items) > 1:
            print(f"[{progress.n}/{len(items)}] {row['family']}: {'exact' if row['exact'] else 'refused'} "
                  f"({row['seconds']} s)", file=sys.stderr, flush=True)
        progress.n += 1

    progress.n = 1
    rows = _run_items(items, args.world_size, args.timeout, progress)
    if bar is not None:
        bar.close()
    for r in rows:
        if args.json:
            print(json.dumps(r))
        else:
            verdict = "exact" if r["exact"] else f"refused ({r['error']})"
            print(f"{r['family']}: {verdict}, max error {_fmt_err(r['max_error'])} at {args.world_size} gloo "
                  f"rank(s): {r['model_class'] or '-'} {r['reason']}")
    if args.output:
        what = "--all" if args.all else (f"--model-type {args.model_type}" if args.model_type else
                                         f"--config {args.config}")
        write_markdown(rows, args.output, f"atac-hf check-model {what} --output {args.output}")
    return 0 if all(r["exact"] for r in rows) else 1

"""`atac-hf plan`: shard one pack over a CP group with every strategy and compare."""

from __future__ import annotations

import argparse
import json
import time

from .._argtypes import DEFAULT_MODEL, model_or_preset, parse_int, parse_tokens, profile_model
from ..cost import HARDWARE_PRESETS, MODEL_PRESETS, CostModel
from ..workloads import load_lengths
from .api import STRATEGIES, CapExceededError, plan_shards


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="shard one pack over a CP group (ATP-CP and baselines)",
        description="Plan how one pack's documents are spread over cp_size ranks, for each strategy.",
    )
    p.add_argument("--doc-lengths", "--lengths", required=True,
                   help="comma-separated document lengths of one pack, or a JSON file holding an array of ints")
    p.add_argument("--cp-size", type=parse_int, required=True, help="ranks in the context-parallel group")
    p.add_argument("--strategy", choices=[*STRATEGIES, "all"], default="all", help="default: all, side by side")
    p.add_argument("--model", default=None, help=f"model of the cost model: a preset {sorted(MODEL_PRESETS)} or the "
                   f"path of an HF config.json (default {DEFAULT_MODEL}; with --profile: the profile's model, and a "
                   "--model given must be the one it was measured for)")
    p.add_argument("--hardware", default="H100", choices=sorted(HARDWARE_PRESETS),
                   help="hardware preset (default H100)")
    p.add_argument("--profile", "--cost-profile",
                   help="calibration profile JSON (replaces --hardware and the model's preset prices; "
                   "refused with a --model it was not measured for)")
    p.add_argument("--max-tokens-per-rank", type=parse_tokens, default=None, metavar="N",
                   help="token cap of one rank, e.g. 16384 or 16K (default: none)")
    p.add_argument("--json", action="store_true", help="print one JSON object per strategy, one per line "
                   "(kv_mb_per_layer: MiB, 2**20 bytes, as the table's KV MiB)")
    p.set_defaults(func=run)


def _read_lengths(spec: str) -> list[int]:
    if spec.endswith(".json") or spec.endswith(".json.gz"):
        return load_lengths(spec, "--doc-lengths").tolist()  # bounded: regular files only, size and depth capped
    try:
        # digits only (int() would take '1_000', ' 3' and 4300-digit numbers)
        # every entry a length: '5,3,,2' (a lost digit?) and '5,3,' are refused, not read as 5,3,2 / 5,3
        parts = [x.strip() for x in spec.split(",")]
        if not all(p.isascii() and p.isdigit() and len(p) <= 19 for p in parts):
            raise ValueError
        return [int(p) for p in parts]
    except ValueError:
        shown = spec if len(spec) <= 80 else spec[:77] + "..."
        raise ValueError(f"--doc-lengths {shown!r} must be comma-separated ints >= 1 (at most 19 digits each) "
                         "or a .json file holding an array of ints") from None


def run(args: argparse.Namespace) -> int:
    lengths = _read_lengths(args.doc_lengths)
    model = DEFAULT_MODEL if args.model is None else args.model  # ("": refused, not taken for omitted)
    cm = (profile_model(args.profile, "--profile", args.model) if args.profile
          else CostModel.from_model(model_or_preset(model), args.hardware))
    names = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
    rows = []
    for name in names:
        try:  # warm-up
            plan_shards(lengths, args.cp_size, name, cm, max_tokens_per_rank=args.max_tokens_per_rank)
        except CapExceededError as e:
            if len(names) == 1:
                raise
            rows.append({"strategy": name, "refused": str(e)})  # a baseline over the cap: the others still run
            if args.json:
                print(json.dumps(rows[-1]))
            continue
        t0 = time.perf_counter()
        plan = plan_shards(lengths, args.cp_size, name, cm, max_tokens_per_rank=args.max_tokens_per_rank)
        ms = (time.perf_counter() - t0) * 1e3
        row = {
            "strategy": name,
            "imbalance": round(plan.imbalance, 4),
            "block_time_ms": round(plan.block_time_s * 1e3, 4),
            "kv_tokens": plan.kv_tokens,
            "kv_mb_per_layer": round(plan.kv_bytes(cm.kv_bytes_per_token) / 2**20, 3),
            "sharded_docs": plan.sharded_docs.tolist(),
            "rank_tokens": plan.rank_num_tokens().tolist(),
            "planner_ms": round(ms, 3),
            "digest": plan.digest,
        }
        rows.append(row)
        if args.json:
            print(json.dumps(row))
    if all("refused" in r for r in rows):
        raise ValueError(f"no strategy fits --max-tokens-per-rank={args.max_tokens_per_rank}: {rows[0]['refused']}")
    if not args.json:
        print(f"{len(lengths)} documents, {sum(lengths)} tokens, cp_size={args.cp_size}, cost model {cm.name}")
        print(f"{'strategy':<13}{'imbalance':>10}{'block ms':>10}{'KV MiB':>9}{'anchors':>9}{'plan ms':>9}")
        for r in rows:
            if "refused" in r:
                print(f"{r['strategy']:<13}  refused: over --max-tokens-per-rank={args.max_tokens_per_rank}")
                continue
            print(f"{r['strategy']:<13}{r['imbalance']:>10.3f}{r['block_time_ms']:>10.3f}{r['kv_mb_per_layer']:>9.2f}"
                  f"{len(r['sharded_docs']):>9}{r['planner_ms']:>9.2f}")
    return 0

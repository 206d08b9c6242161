#!/usr/bin/env python
"""Context-parallel benchmark on CPU: every sharding strategy side by side in one run.

For 2 and 4 gloo processes, a small Llama-like model (hidden 256, GQA 8/2 heads of 32,
2 layers by default: CPU attention at 16K tokens is slow) and packs of 8K-16K tokens drawn from the long-tail workload, it reports per
strategy:

* per-rank attention compute, forward + backward, max / mean over ranks (each rank's
  kernels timed alone in one process on its real shard, by the CPU time of one thread,
  so no rank's time includes waiting for another or other jobs on the machine);
* per-rank compute of a whole layer: that attention plus the rank's token-wise work
  (norms, projections, MLP) timed the same way; this is what the planners balance;
* the real distributed training step (forward + backward of the whole model under
  ``attn_implementation="atac_cp"``), the slowest rank's wall time, relative to
  ``contiguous``;
* K/V bytes moved per layer (what the all-gather sends, padding included) and the
  plan's own estimate;
* planner time per pack;

and, separately, the planner alone on a 128K-token, 200-document pack at cp_size 8.

The planner's cost model is calibrated on this machine first (``atac_hf.cost.calibrate``)
when available, else a CPU estimate, so that ``atp`` balances what this CPU spends.

    python scripts/bench_cp.py                 # full run (~10 min on 2 cores)
    python scripts/bench_cp.py --quick         # smaller packs, fewer repeats
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from atac_hf.workloads import sample_path

ROOT = Path(__file__).resolve().parents[1]
WLB_PATH = Path(sample_path("wlbllm"))
STRATEGIES = ("contiguous", "zigzag", "per_doc", "wlb_adaptive", "atp")
#: the strategies whose plans depend on the cost model (``--preset-plan`` plans them twice)
PRESET_STRATEGIES = ("per_doc", "wlb_adaptive", "atp")
PRESET_SUFFIX = " (preset-planned)"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--pack-tokens", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--packs", type=int, default=3, help="packs per pack size")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed rounds (per-rank timings: minimum kept; distributed steps: median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed ones")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the benchmark model")
    p.add_argument("--workload", default=str(WLB_PATH) if WLB_PATH.exists() else "longtail",
                   help="JSON array of document lengths, or a built-in workload name")
    p.add_argument("--profile", help="CPU cost profile JSON (default: calibrate now)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="divide the workload's document lengths by this (8: a 16K pack holds the document "
                        "mix of a 128K pack)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="packs of 4K-8K, one world size, 1 repeat")
    p.add_argument("--skip-steps", action="store_true",
                   help="only the per-rank timings (no distributed training steps)")
    p.add_argument("--preset-plan", metavar="MODEL@GPU", type=preset_cost_model,
                   help="also plan the cost-model-driven strategies (%s) with this preset (e.g. 8b@H100, the "
                        "library default) instead of this CPU's calibration, and time those plans' ranks in the "
                        "same rounds: what balance is left when the planning model's prices are off (issue 15)"
                        % ", ".join(PRESET_STRATEGIES))
    p.add_argument("--json-out", help="write all measurements to this JSON file")
    p.add_argument("--markdown-out", help="write the result tables (markdown) to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.world_sizes, args.pack_tokens, args.packs, args.repeats, args.warmup = [2], [4096], 1, 1, 0
    return args


# ---------------------------------------------------------------------------- inputs
def load_lengths(spec: str, seed: int) -> np.ndarray:
    if spec.endswith(".json"):
        return np.asarray(json.loads(Path(spec).read_text()), dtype=np.int64)
    from atac_hf.workloads import load_workload

    return np.asarray(load_workload(spec, num_samples=20000, seed=seed), dtype=np.int64)


def make_packs(lengths: np.ndarray, pack_tokens: int, n: int, seed: int) -> list[list[int]]:
    """WFAP packs of a random stretch of the workload (packed for a 7B model on A800, so the
    packs do not depend on this machine's calibration): each pack's document lengths."""
    from atac_hf.cost import CostModel
    from atac_hf.packing import PackingConfig, pack_lengths

    cost_model = CostModel.from_model("7b", "A800")
    rng = np.random.default_rng(seed)
    sample = lengths[rng.permutation(len(lengths))[: 40 * n * max(1, pack_tokens // 2048)]]
    cfg = PackingConfig(max_tokens=pack_tokens, packs_per_window=n, strategy="wfap")
    res = pack_lengths(sample, cfg, cost_model)
    packs = [[e - s for _, s, e in p] for p in res.packs]
    packs.sort(key=lambda p: -sum(p))  # fullest packs first
    return packs[:n]


def cpu_cost_model(profile: str | None, layers: int, max_len: int | None = None):
    from atac_hf.cost import CostModel

    if profile:
        return CostModel.from_profile(profile), f"profile {profile}"
    try:
        from atac_hf.cost.calibrate import calibrate

        res = calibrate(model_dims(layers), max_len=max_len)
        return res.cost_model, (f"calibrated on this CPU for this model (atac_hf.cost.calibrate, documents up to "
                                f"{res.longest_document} tokens; held-out error <= {100 * res.max_rel_err:.0f}%)")
    except ImportError:
        # hidden 256 fp32 on one CPU core: rough, measured once by hand
        return CostModel(linear_s_per_token=2e-6, attn_s_per_pair=4e-9, segment_overhead_s=3e-5, tile=1,
                         kv_bytes_per_token=2 * 2 * 32 * 4, link_bandwidth=2e9, link_latency_s=5e-5,
                         name="cpu-estimate"), "a fixed CPU estimate"


def preset_cost_model(spec: str):
    """``--preset-plan``: ``MODEL@GPU`` (keys of ``MODEL_PRESETS`` and ``HARDWARE_PRESETS``) as a cost model."""
    from atac_hf.cost import CostModel
    from atac_hf.cost.presets import HARDWARE_PRESETS, MODEL_PRESETS

    model, sep, gpu = spec.partition("@")
    if not sep or model not in MODEL_PRESETS or gpu not in HARDWARE_PRESETS:
        raise argparse.ArgumentTypeError(
            f"{spec!r}: expected MODEL@GPU with MODEL one of {sorted(MODEL_PRESETS)} and GPU one of "
            f"{sorted(HARDWARE_PRESETS)}, e.g. 8b@H100 (the library's default cost model)")
    return CostModel.from_model(model, gpu)


def model_dims(layers: int = 2):
    from atac_hf.cost import ModelDims

    return ModelDims.from_hf_config(model_config(layers))


def model_config(layers: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=layers, num_attention_heads=8,
                       num_key_value_heads=2, vocab_size=512, max_position_embeddings=32768,
                       attention_dropout=0.0)


# ---------------------------------------------------------------------------- link
def _link_worker(rank: int, world: int, init_file: str, sizes, repeats: int, out_file: str):
    import torch
    import torch.distributed as dist

    from atac_hf.attention.compat import all_gather_single, reduce_scatter_single

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    rows = []
    for n in sizes:  # floats sent per rank
        x = torch.randn(n)
        full = torch.empty(n * world)
        best = float("inf")
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            all_gather_single(full, x)  # forward: K/V all-gather; backward: gradient reduce-scatter
            reduce_scatter_single(x, full, op=dist.ReduceOp.SUM)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if i:
                best = min(best, float(dt))
        rows.append((n * 4 * (world - 1), best))  # bytes each rank receives in the all-gather
    if rank == 0:
        Path(out_file).write_text(json.dumps(rows))
    dist.destroy_process_group()


def measure_link(world: int, repeats: int = 5) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of this machine's gloo all-gather + reduce-scatter pair,
    fitted to the cost model's ``comm_cost`` form: ``2 * (latency * (C - 1) + bytes / bandwidth)``."""
    import tempfile

    import torch.multiprocessing as mp

    from atac_hf.cost.calibrate import fit_coefficients

    sizes = [2**12, 2**16, 2**18, 2**20]
    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "out.json")
        mp.spawn(_link_worker, args=(world, init_file, sizes, repeats, out_file), nprocs=world)
        rows = json.loads(Path(out_file).read_text())
    X = np.array([[2.0 * (world - 1), 2.0 * b] for b, _ in rows])
    lat, inv_bw = fit_coefficients(X, np.array([t for _, t in rows]))
    return 1.0 / max(inv_bw, 1e-15), float(lat)


# ---------------------------------------------------------------------------- per-rank compute
def per_rank_times(plans: dict, layers: int, repeats: int, warmup: int, seed: int) -> dict:
    """Per strategy, each rank's attention kernels and its token-wise layer work (norms,
    Q/K/V/O projections, MLP), forward + backward of one layer of the benchmark model on
    the rank's real shard, by one thread's CPU time (other jobs on the machine do not add
    to it). Every (strategy, rank, part) is one closure and the rounds visit them all in
    turn, so a slow moment of the machine hits every strategy alike; the minimum over the
    rounds is kept (load only ever adds time).

    Returns:
        ``{strategy: (attention seconds per rank, linear seconds per rank)}``.
    """
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from atac_hf.attention.timing import RankKernel, gathered_rows, time_calls

    H, K, D = 8, 2, 32
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    n = next(iter(plans.values())).num_tokens
    q, k, v = (torch.randn(h, n, D, generator=g) for h in (H, K, K))
    torch.manual_seed(seed)
    cfg = model_config(layers)
    layer = LlamaDecoderLayer(cfg, 0)
    attn = layer.self_attn

    def block(x):
        h = layer.input_layernorm(x)
        qq, kk, vv = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        x = x + attn.o_proj(qq) + 0 * (kk.sum() + vv.sum())  # attention itself is timed separately
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def linear_fn(tokens: int):
        x = torch.randn(1, tokens, cfg.hidden_size, requires_grad=True)
        return lambda: block(x).sum().backward()

    fns, before, keys = [], [], []
    for s, plan in plans.items():
        gathered = gathered_rows(plan, k, v)
        for r in range(plan.cp_size):
            kern = RankKernel(plan, r, q, k, v, gathered=gathered, generator=g)
            fns += [kern, linear_fn(int(plan.rank_num_tokens()[r]))]
            before += [kern.zero_grad, lambda: layer.zero_grad(set_to_none=True)]
            keys += [(s, r, "attn"), (s, r, "linear")]
    samples = time_calls(fns, device="cpu", warmup=warmup, repeats=repeats, before=before,
                         cpu_clock=time.process_time)
    best = {key: min(t) for key, t in zip(keys, samples)}
    return {s: ([best[(s, r, "attn")] for r in range(p.cp_size)], [best[(s, r, "linear")] for r in range(p.cp_size)])
            for s, p in plans.items()}


# ---------------------------------------------------------------------------- distributed step
def _worker(rank: int, world: int, init_file: str, packs, cm_dict, repeats: int, warmup: int, layers: int,
            seed: int, out_file: str):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import atac_hf.attention  # noqa: F401  (registers atac_cp)
    from atac_hf.attention import shard_batch
    from atac_hf.cost import CostModel
    from atac_hf.sharding import plan_shards
    from transformers import LlamaForCausalLM

    cm = CostModel.from_dict(cm_dict)
    torch.manual_seed(seed)
    model = LlamaForCausalLM._from_config(model_config(layers), attn_implementation="atac_cp")
    model.train()
    results = []
    for pi, lengths in enumerate(packs):
        g = torch.Generator().manual_seed(seed + pi)
        n = int(sum(lengths))
        ids = torch.randint(0, 512, (1, n), generator=g)
        pos = torch.cat([torch.arange(L) for L in lengths]).unsqueeze(0)
        batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": pos}
        for strategy in STRATEGIES:
            plan_shards(lengths, world, strategy, cm)  # warm-up: time the planner, not first-call costs
            t0 = time.perf_counter()
            plan = plan_shards(lengths, world, strategy, cm)
            plan_ms = (time.perf_counter() - t0) * 1e3
            local = shard_batch(batch, plan, rank)
            samples = []
            for i in range(repeats + warmup):
                dist.barrier()
                t0 = time.perf_counter()
                model(**local).loss.backward()
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                model.zero_grad(set_to_none=True)
                if i >= warmup:
                    samples.append(float(dt))
            results.append({"pack": pi, "strategy": strategy, "step_s": statistics.median(samples),
                            "plan_ms": plan_ms})
    if rank == 0:
        Path(out_file).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def distributed_steps(world: int, packs, cm, repeats: int, warmup: int, layers: int, seed: int) -> list[dict]:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "out.json")
        mp.spawn(_worker, args=(world, init_file, packs, cm.to_dict(), repeats, warmup, layers, seed, out_file),
                 nprocs=world)
        return json.loads(Path(out_file).read_text())


# ---------------------------------------------------------------------------- report
def same_plan(a, b) -> bool:
    """Whether two shard plans give every rank the same segments (then they run the same kernels)."""
    return a.cp_size == b.cp_size and all(np.array_equal(a.rank_segments(r), b.rank_segments(r))
                                          for r in range(a.cp_size))


def preset_table(rows: list[dict], preset: str) -> list[str]:
    """Markdown lines: each cost-model-driven strategy planned with the calibrated model and with
    ``preset``, measured side by side (same packs, same rounds)."""
    by = {(r["cp"], r["pack"], r["strategy"]): r for r in rows}
    md = ["", f"Planned with this CPU's calibrated model vs with the `{preset}` preset (the planners' prices "
              f"off by the GPU/CPU difference), every plan timed in the same rounds; `layer max, preset / "
              f"calibrated`: the slowest rank's layer compute of the preset-planned plan over the "
              f"calibrated-planned one's.", "",
          "| CP | pack | strategy | packs planned differently | attn max/mean: calibrated, preset "
          "| layer max/mean: calibrated, preset | layer max, preset / calibrated (mean over packs; those planned "
          "differently: worst) | KV MiB/layer: calibrated, preset |",
          "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for (cp, pack, s), cal in by.items():
        if s not in PRESET_STRATEGIES:
            continue
        pre = by[(cp, pack, s + PRESET_SUFFIX)]
        ratios = [b / a for a, b in zip(cal["layer max s per pack"], pre["layer max s per pack"])]
        differ = [q for q, same in zip(ratios, pre["same plan per pack"]) if not same]
        worst = f"{max(differ):.3f}" if differ else "-"
        md.append(f"| {cp} | {pack} | {s} | {len(differ)} of {len(ratios)} | "
                  f"{cal['attn max/mean']:.3f}, {pre['attn max/mean']:.3f} | "
                  f"{cal['layer max/mean']:.3f}, {pre['layer max/mean']:.3f} | "
                  f"{statistics.mean(ratios):.3f}; {worst} | "
                  f"{cal['KV MiB sent/layer']:.2f}, {pre['KV MiB sent/layer']:.2f} |")
    return md


def main(argv=None) -> int:
    args = parse_args(argv)
    from tqdm.auto import tqdm

    from atac_hf.sharding import plan_shards

    kv_bytes_tok = 2 * 2 * 32 * 4  # K and V, 2 kv heads x 32 dims, fp32
    lengths = load_lengths(args.workload, args.seed)
    if args.length_scale != 1.0:
        lengths = np.maximum(1, np.round(lengths / args.length_scale)).astype(np.int64)
    all_packs = {n: make_packs(lengths, n, args.packs, args.seed + n) for n in args.pack_tokens}
    # calibrate up to the longest document the packs hold: CPU per-pair cost keeps falling with length
    longest = max(max(p) for packs in all_packs.values() for p in packs)
    cm0, cm_source = cpu_cost_model(args.profile, args.layers, max_len=longest)
    preset_cm = args.preset_plan
    timed_strategies = STRATEGIES + (tuple(s + PRESET_SUFFIX for s in PRESET_STRATEGIES) if preset_cm else ())
    rows, raw, links = [], [], {}
    no_step = {"step_s": float("nan"), "plan_ms": float("nan")}  # --skip-steps, and the preset plans
    for world in args.world_sizes:
        bw, lat = measure_link(world)
        links[world] = (bw, lat)
        print(f"cp={world}: gloo link {bw / 1e9:.2f} GB/s, latency {lat * 1e6:.0f} us", file=sys.stderr, flush=True)
        cm = cm0.replace(link_bandwidth=bw, link_latency_s=lat)
        for pack_tokens in args.pack_tokens:
            packs = all_packs[pack_tokens]
            if args.skip_steps:
                step = {}
            else:
                print(f"cp={world}, {pack_tokens // 1024}K packs: distributed steps...", file=sys.stderr, flush=True)
                steps = distributed_steps(world, packs, cm, args.repeats, args.warmup, args.layers, args.seed)
                step = {(r["pack"], r["strategy"]): r for r in steps}
            per = {s: {"attn_max_over_mean": [], "layer_max_over_mean": [], "attn_max_s": [], "layer_max_s": [],
                       "step_s": [],
                       "kv_mb": [], "kv_mb_est": [], "plan_ms": [], "same_plan": []} for s in timed_strategies}
            for pi, pack in enumerate(tqdm(packs, desc=f"cp={world} {pack_tokens // 1024}K per-rank timing",
                                           leave=False)):
                plans = {s: plan_shards(pack, world, s, cm) for s in STRATEGIES}
                if preset_cm is not None:  # the preset as a user who did not calibrate has it (its own link too)
                    plans.update({s + PRESET_SUFFIX: plan_shards(pack, world, s, preset_cm)
                                  for s in PRESET_STRATEGIES})
                # a preset plan identical to the calibrated one is timed once (its twin's figures): the
                # differences left are the plans', not this shared machine's noise
                twins = {s + PRESET_SUFFIX: s for s in PRESET_STRATEGIES
                         if s + PRESET_SUFFIX in plans and same_plan(plans[s + PRESET_SUFFIX], plans[s])}
                timed = per_rank_times({s: p for s, p in plans.items() if s not in twins}, args.layers, args.repeats,
                                       args.warmup, args.seed + pi)
                timed.update({s: timed[t] for s, t in twins.items()})
                for s, plan in plans.items():
                    t, lin = timed[s]
                    layer_t = [a + b for a, b in zip(t, lin)]
                    lay = plan.local_layout(0)
                    sent = lay.max_send * world * kv_bytes_tok if len(plan.gathered_docs) else 0
                    d = per[s]
                    d["attn_max_over_mean"].append(max(t) / (sum(t) / len(t)))
                    d["layer_max_over_mean"].append(max(layer_t) / (sum(layer_t) / len(layer_t)))
                    d["attn_max_s"].append(max(t))
                    d["layer_max_s"].append(max(layer_t))
                    d["step_s"].append(step.get((pi, s), no_step)["step_s"])
                    d["kv_mb"].append(sent / 2**20)
                    d["kv_mb_est"].append(plan.kv_bytes(kv_bytes_tok) / 2**20)
                    d["plan_ms"].append(step.get((pi, s), no_step)["plan_ms"])
                    d["same_plan"].append(s in twins)  # a preset plan identical to the calibrated one
                    raw.append({"world": world, "pack_tokens": pack_tokens, "pack": pi, "docs": len(pack), "lengths": pack,
                                "strategy": s, "rank_attn_s": t, "rank_linear_s": lin,
                                **{k: v[-1] for k, v in d.items()}})
            base_step = sum(per["contiguous"]["step_s"])
            for s in timed_strategies:
                d = per[s]
                rows.append({
                    "cp": world, "pack": f"{pack_tokens // 1024}K", "strategy": s,
                    "attn max/mean": statistics.mean(d["attn_max_over_mean"]),
                    "attn max/mean worst": max(d["attn_max_over_mean"]),
                    "layer max/mean": statistics.mean(d["layer_max_over_mean"]),
                    "attn max ms": 1e3 * statistics.mean(d["attn_max_s"]),
                    "layer max ms": 1e3 * statistics.mean(d["layer_max_s"]),
                    "step vs contiguous": sum(d["step_s"]) / base_step,
                    "step ms": 1e3 * statistics.mean(d["step_s"]),
                    "KV MiB sent/layer": statistics.mean(d["kv_mb"]),
                    "planner ms": statistics.mean(d["plan_ms"]),
                    "layer max s per pack": d["layer_max_s"], "same plan per pack": d["same_plan"],
                })
    # planner alone: 128K tokens, 200 documents, cp 8
    rng = np.random.default_rng(args.seed)
    w = rng.lognormal(0.0, 1.0, 200)
    big = np.maximum(1, np.round(w / w.sum() * 131072)).astype(int)
    planner = {}
    for s in STRATEGIES:
        plan_shards(big, 8, s, cm)
        t0 = time.perf_counter()
        for _ in range(50):
            plan_shards(big, 8, s, cm)
        planner[s] = (time.perf_counter() - t0) / 50 * 1e3

    cm = cm0
    scale = f" with lengths divided by {args.length_scale:g}" if args.length_scale != 1.0 else ""
    link = "; ".join(f"CP {w}: {bw / 1e9:.2f} GB/s, {lat * 1e6:.0f} us" for w, (bw, lat) in links.items())
    md = [f"Cost model for planning: {cm_source}; link measured (gloo all-gather + reduce-scatter): {link}. "
          f"Workload: `{Path(args.workload).name}`{scale}; "
          f"{args.packs} WFAP packs per size; model: hidden 256, {args.layers} layers, 8 query / 2 K/V heads "
          f"of 32, fp32, one thread per rank; {args.repeats} rounds after {args.warmup} warm-up (per-rank "
          f"timings: every strategy and rank interleaved, minimum kept; steps: median).", "",
          "| CP | pack | strategy | attn max/mean (mean, worst) | layer max/mean | attn max ms | layer max ms "
          "| step vs contiguous "
          "| step ms | KV MiB sent/layer | planner ms |",
          "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['cp']} | {r['pack']} | {r['strategy']} | {r['attn max/mean']:.3f}, "
                  f"{r['attn max/mean worst']:.3f} | {r['layer max/mean']:.3f} | {r['attn max ms']:.1f} | "
                  f"{r['layer max ms']:.1f} | "
                  f"{r['step vs contiguous']:.3f} | "
                  f"{r['step ms']:.0f} | {r['KV MiB sent/layer']:.2f} | {r['planner ms']:.2f} |")
    if preset_cm is not None:
        md += preset_table(rows, preset_cm.name)
    md += ["", "Planner alone, 128K-token pack of 200 documents, cp_size 8 (mean of 50 calls):", "",
           "| strategy | ms per pack |", "|---|---:|"]
    md += [f"| {s} | {planner[s]:.3f} |" for s in STRATEGIES]
    text = "\n".join(md)
    print(text)
    if args.markdown_out:
        Path(args.markdown_out).write_text(text + "\n")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "raw": raw, "planner_ms": planner, "links": links,
                                                   "cost_model": cm0.to_dict()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

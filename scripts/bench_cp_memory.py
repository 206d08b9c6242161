#!/usr/bin/env python
"""Activation memory per CP rank on CPU: what each rank keeps for backward, strategies side by side.

Context parallelism is there so that a pack too long for one device's activations fits over C.
For 1, 2 and 4 gloo processes, a small Llama-like model (hidden 256, GQA 8/2 heads of 32,
2 layers) and packs drawn from the long-tail workload, this counts, on each rank, the bytes
of every tensor autograd saves for backward during the forward of its shard (distinct
storages, through ``torch.autograd.graph.saved_tensors_hooks``): the activations a rank
holds at the peak of a step, weights and optimizer state left out. The count is exact and does
not depend on the machine's load; it is not the allocator's peak (transients of one layer
come and go).

Rows: ``cp 1, stock sdpa`` (the model's own attention on the packed row, position ids
restarting per document: Transformers builds a document mask), ``cp 1, atac_cp`` (the same
row through the add-on at one rank), then each strategy at C ranks: the largest rank's bytes
against the add-on's one-rank figure, and 1/C, what a perfect split would give.
``--masked-rows`` runs every chunk that starts inside its document through the row-block
masked path (what the ``sdpa`` backend does on GPU, where the CPU prefix-merge kernel does
not exist); ``--expand-heads`` expands grouped K/V heads to every query head before the kernels,
as the masked kernels off CPU need (torch's CPU flash kernel takes grouped heads as they are).

    python scripts/bench_cp_memory.py                  # 8K and 16K-token packs (~2.5 min on 2 cores)
    python scripts/bench_cp_memory.py --masked-rows --expand-heads --pack-tokens 16384
    python scripts/bench_cp_memory.py --grouped-speed    # the CPU kernels' time, grouped heads kept vs expanded
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STRATEGIES = ("atp", "zigzag", "contiguous", "per_doc")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--pack-tokens", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--workload", default="longtail", help="a built-in workload name (atac_hf.workloads)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--masked-rows", action="store_true",
                   help="run chunks that start inside their document as masked row blocks (the GPU sdpa path)")
    p.add_argument("--expand-heads", action="store_true",
                   help="expand grouped K/V heads to every query head, as the kernels off CPU need")
    p.add_argument("--json-out", help="write every rank's bytes to this JSON file")
    p.add_argument("--grouped-speed", action="store_true",
                   help="instead: time the CPU kernels on grouped K/V heads kept against expanded, side by side")
    return p.parse_args(argv)


def make_pack(workload: str, tokens: int, seed: int) -> list[int]:
    """One pack of exactly ``tokens`` tokens: lengths drawn from the workload until it is full (the last
    one cut to fit), longest first."""
    from atac_hf.workloads import load_workload

    pool = load_workload(workload)
    rng = np.random.default_rng(seed)
    out, left = [], tokens
    while left > 0:
        n = int(min(left, max(1, rng.choice(pool))))
        out.append(n)
        left -= n
    return sorted(out, reverse=True)


def build_model(layers: int, max_len: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    import atac_hf.attention  # noqa: F401  (registers atac_cp)

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=max_len)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).train()


def make_batch(lengths: list[int]) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (1, sum(lengths)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    labels = ids.clone()
    labels[pos == 0] = -100
    return {"input_ids": ids, "position_ids": pos, "labels": labels, "seq_lengths": [list(lengths)]}


def saved_bytes(run) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` builds its graph."""
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    out.loss.backward()
    return sum(seen.values())


@contextlib.contextmanager
def grouped_heads(keep: bool):
    """Inside: the CPU kernels take grouped K/V heads as they are (``keep``) or expanded to every query
    head, whatever the dtype and the torch."""
    import atac_hf.attention.backends as kernels
    import atac_hf.attention.cpu_kernels as cpu_kernels

    saved = (kernels.groups_heads_natively, cpu_kernels.groups_heads_natively)
    kernels.groups_heads_natively = cpu_kernels.groups_heads_natively = lambda device, dtype: keep
    try:
        yield
    finally:
        kernels.groups_heads_natively, cpu_kernels.groups_heads_natively = saved


def chunk_paths(n_pre: int, n: int, scale: float) -> dict:
    """The two CPU paths of a chunk of ``n`` queries after ``n_pre`` tokens of its document, as
    ``fn(q (H, n, D), k, v (K, n_pre + n, D))``: the prefix merge and the masked row blocks."""
    import atac_hf.attention.backends as kernels
    import atac_hf.attention.cpu_kernels as cpu_kernels

    return {"prefix merge": lambda q, k, v: cpu_kernels._prefix_chunk(q, k, v, n_pre, scale),
            "masked row blocks": lambda q, k, v: kernels._masked_rows(
                lambda qb, kb, vb, m: kernels._sdpa(qb, kb, vb, m, scale), q, k, v, n_pre, n_pre + n, 0, None)}


def _worker(rank: int, world: int, init_file: str, lengths, strategies, layers: int, masked: bool, expand: bool,
            out_file: str):
    import atac_hf.attention.backends as kernels
    from atac_hf import check_model
    from atac_hf.attention import shard_batch
    from atac_hf.sharding import plan_shards

    torch.set_num_threads(1)
    if masked:
        kernels.MERGE_MIN_PAIRS = 1 << 62
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = build_model(layers, sum(lengths))
    check_model(model)
    model.set_attn_implementation("atac_cp")
    batch = make_batch(lengths)
    res = {}
    with grouped_heads(False) if expand else contextlib.nullcontext():
        for s in strategies:
            plan = plan_shards(np.asarray(lengths), world, s)
            local = shard_batch(batch, plan, rank)
            model.zero_grad(set_to_none=True)
            res[s] = dict(bytes=saved_bytes(lambda: model(**local)), tokens=int(local["input_ids"].shape[1]))
    gathered = [None] * world
    dist.all_gather_object(gathered, res)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


def per_rank(world: int, lengths, strategies, layers: int, masked: bool, expand: bool) -> list[dict]:
    fd, init_file = tempfile.mkstemp(prefix="atac_mem_")
    os.close(fd)
    os.unlink(init_file)
    out_file = init_file + ".json"
    try:
        mp.spawn(_worker, args=(world, init_file, lengths, strategies, layers, masked, expand, out_file), nprocs=world)
        with open(out_file) as f:
            return json.load(f)
    finally:
        for p in (init_file, out_file):
            if os.path.exists(p):
                os.unlink(p)


def one_device(lengths, layers: int) -> int:
    """Stock sdpa on the packed row in this process."""
    model = build_model(layers, sum(lengths))
    b = make_batch(lengths)
    return saved_bytes(lambda: model(input_ids=b["input_ids"], position_ids=b["position_ids"], labels=b["labels"],
                                     use_cache=False))


def grouped_speed(repeats: int = 5) -> None:
    """CPU time of forward + backward of one chunk (2,000 queries after a 6,000-token prefix, 16 query heads
    over 4 K/V heads of 64, fp32, one thread) through the prefix merge and the masked row blocks, with the
    grouped K/V heads kept and expanded, alternately; best of ``repeats``."""
    import time

    import atac_hf.attention.cpu_kernels as cpu_kernels

    if not cpu_kernels.groups_heads_natively("cpu", torch.float32):
        print("this torch's CPU flash kernel does not take grouped K/V heads: nothing to compare")
        return
    H, K, D, n_pre, n = 16, 4, 64, 6000, 2000
    print("| CPU kernel | grouped heads kept (s) | expanded (s) | ratio |\n|---|---|---|---|")
    for name, fn in chunk_paths(n_pre, n, D ** -0.5).items():
        best = {True: float("inf"), False: float("inf")}
        for _ in range(repeats):
            for keep in (True, False):
                g = torch.Generator().manual_seed(0)
                q = torch.randn(H, n, D, generator=g, requires_grad=True)
                k, v = (torch.randn(K, n_pre + n, D, generator=g, requires_grad=True) for _ in range(2))
                with grouped_heads(keep):
                    t0 = time.process_time()
                    fn(q, k, v).sum().backward()
                    best[keep] = min(best[keep], time.process_time() - t0)
        print(f"| {name} | {best[True]:.3f} | {best[False]:.3f} | {best[True] / best[False]:.3f} |")
    print("\nRelative L2 error of dK / dV against float64 (the same chunk, 8 query heads over 2 K/V heads, "
          "1,100 queries after 1,500 tokens, 4 seeds), grouped heads kept (forced in half precision) vs expanded:\n")
    print("| CPU kernel | dtype | kept: dK / dV | expanded: dK / dV |\n|---|---|---|---|")
    for name, fn in chunk_paths(1500, 1100, 0.125).items():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            err = {True: [0.0, 0.0], False: [0.0, 0.0]}
            for seed in range(4):
                g = torch.Generator().manual_seed(seed)
                q0, w = (torch.randn(8, 1100, 64, generator=g) for _ in range(2))
                k0, v0 = (torch.randn(2, 2600, 64, generator=g) for _ in range(2))
                grads = {}
                for keep, dt in ((True, torch.float64), (True, dtype), (False, dtype)):
                    with grouped_heads(keep):
                        q, k, v = (t.to(dt).requires_grad_() for t in (q0, k0, v0))
                        grads[(keep, dt)] = torch.autograd.grad((fn(q, k, v).double() * w.double()).sum(), (k, v))
                ref = grads[(True, torch.float64)]
                for keep in (True, False):
                    for i in range(2):
                        err[keep][i] += float((grads[(keep, dtype)][i].double() - ref[i]).norm() / ref[i].norm()) / 4
            print(f"| {name} | {str(dtype).replace('torch.', '')} | {err[True][0]:.2e} / {err[True][1]:.2e} "
                  f"| {err[False][0]:.2e} / {err[False][1]:.2e} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.grouped_speed:
        grouped_speed()
        return 0
    mib = 2.0 ** 20
    print(f"Saved-for-backward MiB per rank ({args.layers} layers, hidden 256, GQA 8/2 x 32, fp32"
          f"{', masked row blocks' if args.masked_rows else ''}"
          f"{', K/V heads expanded' if args.expand_heads else ''})\n")
    print("| pack tokens | documents (longest) | CP | strategy | tokens / rank (max) | MiB max / mean over ranks "
          "| max vs cp 1 atac_cp | 1/C |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for i, tokens in enumerate(args.pack_tokens):
        lengths = make_pack(args.workload, tokens, args.seed + i)
        head = f"| {tokens} | {len(lengths)} ({lengths[0]}) "
        stock = one_device(lengths, args.layers)
        base = per_rank(1, lengths, ["atp"], args.layers, args.masked_rows, args.expand_heads)[0]["atp"]["bytes"]
        print(f"{head}| 1 | stock sdpa | {tokens} | {stock / mib:.1f} | {stock / base:.2f} | 1 |")
        print(f"{head}| 1 | atac_cp | {tokens} | {base / mib:.1f} | 1.00 | 1 |")
        rows.append(dict(pack=lengths, cp=1, strategy="stock sdpa", bytes=[stock]))
        rows.append(dict(pack=lengths, cp=1, strategy="atac_cp", bytes=[base]))
        for world in args.world_sizes:
            ranks = per_rank(world, lengths, list(STRATEGIES), args.layers, args.masked_rows, args.expand_heads)
            for s in STRATEGIES:
                b = [r[s]["bytes"] for r in ranks]
                rows.append(dict(pack=lengths, cp=world, strategy=s, bytes=b))
                t = max(r[s]["tokens"] for r in ranks)
                print(f"{head}| {world} | {s} | {t} | {max(b) / mib:.1f} / {np.mean(b) / mib:.1f} "
                      f"| {max(b) / base:.2f} | {1 / world:.2f} |")
        sys.stdout.flush()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"masked_rows": args.masked_rows, "expand_heads": args.expand_heads, "layers": args.layers,
                       "rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

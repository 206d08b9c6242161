#!/usr/bin/env python
"""The sdpa backend's two CPU kernels for a chunk of a sharded document, side by side.

A chunk (queries at document positions ``[start, end)``, keys ``[0, end)``) runs either as
masked SDPA calls over blocks of query rows (``QUERY_BLOCK`` rows each; one call when the
chunk is shorter), or as an unmasked kernel over the key prefix merged by log-sum-exp with a
causal kernel over the chunk's own square. For each chunk shape this prints forward +
backward CPU time of both (one thread, minimum over rounds that alternate the two) and the
ratio, the kernel the backend picks (``MERGE_MIN_PAIRS``) and its time per causal pair.

    python scripts/bench_chunk_kernels.py
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from atac_hf.attention import backends

SHAPES = [(32, 16), (128, 64), (256, 128), (512, 256), (512, 64), (1024, 512), (1024, 896), (2048, 1024),
          (2048, 1792), (2048, 128), (4096, 2048), (4096, 1024), (4096, 3584), (8192, 4096)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--heads", type=int, nargs=2, default=[8, 2], metavar=("H", "K"))
    p.add_argument("--head-dim", type=int, default=32)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    H, K = args.heads
    D = args.head_dim
    g = torch.Generator().manual_seed(0)
    merge_ok = backends.prefix_merge_available("cpu")
    print(f"torch {torch.__version__}, one thread, H={H} K={K} D={D}, fp32, min of {args.rounds} rounds; "
          f"backend picks the merge from {backends.MERGE_MIN_PAIRS} causal pairs"
          + ("" if merge_ok else " (not available in this torch: masked only)"))
    print("| doc length | chunk | causal pairs | masked ms | merged ms | merged / masked | picked | ns/pair |")
    print("|---:|---|---:|---:|---:|---:|---|---:|")
    for L, ds in SHAPES:
        n = L - ds
        q = torch.randn(H, n, D, generator=g).requires_grad_()
        k, v = (torch.randn(K, L, D, generator=g).requires_grad_() for _ in range(2))

        def run(merge: bool) -> None:
            saved = backends.MERGE_MIN_PAIRS
            backends.MERGE_MIN_PAIRS = 0 if merge else 1 << 62
            try:
                backends._attend(q, k, v, ds, L, 0, None, D ** -0.5).sum().backward()
            finally:
                backends.MERGE_MIN_PAIRS = saved

        kinds = [False, True] if merge_ok else [False]
        best = {m: float("inf") for m in kinds}
        for rnd in range(args.rounds + 1):
            for m in kinds:
                t0 = time.process_time()
                run(m)
                dt = time.process_time() - t0
                if rnd:
                    best[m] = min(best[m], dt)
        pairs = n * ds + n * (n + 1) // 2
        picked = "merged" if merge_ok and pairs >= backends.MERGE_MIN_PAIRS else "masked"
        merged = best.get(True, float("nan"))
        used = merged if picked == "merged" else best[False]
        print(f"| {L} | [{ds}, {L}) | {pairs} | {1e3 * best[False]:.2f} | {1e3 * merged:.2f} | "
              f"{merged / best[False]:.2f} | {picked} | {1e9 * used / pairs:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

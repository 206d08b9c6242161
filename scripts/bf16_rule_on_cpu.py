#!/usr/bin/env python
"""The GPU tolerance test's loop (``tests/test_attention_backends.py::test_gpu_backends_within_twice_plain_bf16_error``)
run on CPU in bf16 with the CPU backends: each case's worst ratio of error to plain attention's error over out, dq,
dk and dv, and the tensors over the rule (2x plain's error plus 1/64 ulp). A stand-in for reading a GPU failure of
that test without a GPU (BENCHMARKS "GPU check (H200)").

    python scripts/bf16_rule_on_cpu.py                    # sdpa and varlen_reference
    python scripts/bf16_rule_on_cpu.py varlen_reference
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atac_hf.attention import emulate_cp_attention  # noqa: E402
from atac_hf.attention.reference import doc_mask_dense, doc_masked_sdpa_dense, reference_attention  # noqa: E402
from atac_hf.attention.tolerance import check_against_plain  # noqa: E402
from atac_hf.sharding import STRATEGIES, plan_shards  # noqa: E402


def fwd_bwd(fn, leaves, gout):
    leaves = [t.detach().requires_grad_() for t in leaves]
    out = fn(*leaves)
    return (out, *torch.autograd.grad(out, leaves, gout))


def main(backends: list[str]) -> None:
    lens = [700, 3, 1, 150, 40, 1, 2]  # the GPU test's pack, heads and seed
    N, H, K, D = sum(lens), 8, 2, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(h, N, D, generator=g, dtype=torch.float64) for h in (H, K, K))
    gout = torch.randn(N, H, D, generator=g, dtype=torch.float64)
    low, glow = [t.to(torch.bfloat16) for t in (q, k, v)], gout.to(torch.bfloat16)
    print("backend | window | cp | strategy | worst err/plain_err | over the rule")
    for backend in backends:
        for window in (None, 64):
            ref_out, ref_grads = reference_attention(q, k, v, lens, window=window, grad_out_NHD=gout)
            mask = doc_mask_dense(lens, "cpu", window)
            plain = fwd_bwd(lambda a, b, c: doc_masked_sdpa_dense(a, b, c, lens, mask=mask), low, glow)
            for C in (1, 2, 4):
                for strategy in sorted(STRATEGIES):
                    plan = plan_shards(lens, C, strategy, min_chunk=128)
                    got = fwd_bwd(lambda a, b, c: emulate_cp_attention(a, b, c, plan, backend=backend, window=window),
                                  low, glow)
                    checks = check_against_plain(got, plain, (ref_out, *ref_grads))
                    bad = " ".join(f"{c.tensor} {c.ratio:.2f}" for c in checks if not c.ok)
                    print(f"{backend} | {window} | {C} | {strategy} | {max(c.ratio for c in checks):.2f} | {bad or '-'}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["sdpa", "varlen_reference"])

"""Activation memory under CP: what a rank keeps for backward falls with the CP size, and a chunk
deep in a long document does not keep a copy of its key prefix per row block.

Counted, not timed: the bytes of the distinct storages autograd saves (``saved_tensors_hooks``),
which do not depend on the machine or its load. Figures: docs/BENCHMARKS.md, "Activation memory
per CP rank" (``scripts/bench_cp_memory.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _saved_storages(fn):
    """(output, {storage pointer: (bytes, shape of a tensor saved from it)}) of what ``fn()`` saves."""
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = (st.nbytes(), tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, seen


@pytest.mark.parametrize("native", [False, True], ids=["expanding", "cpu_native"])
@pytest.mark.parametrize("window", [None, 700])
def test_masked_row_blocks_keep_at_most_one_copy_of_grouped_keys(monkeypatch, window, native):
    """A chunk of 1,024 queries at positions 3,072-4,095 of a document, 8 query heads over 2 K/V heads,
    through the masked row-block path (the sdpa backend's off CPU, where the prefix merge does not exist;
    on CPU below MERGE_MIN_PAIRS). Where the kernel needs K/V expanded to every query head (off CPU;
    ``expanding``), what it keeps for backward is one expanded copy of the chunk's keys and values: it kept
    one per block of QUERY_BLOCK rows (4 here: about 3.5x), each expanded again. Where the CPU kernel takes
    grouped heads (``cpu_native``), it keeps no copy: only views of the keys and values it was given. The
    output and the gradients are those of one masked call over the whole chunk."""
    from atac_hf.attention import backends, cpu_kernels

    if native and not cpu_kernels.groups_heads_natively("cpu", torch.float32):
        pytest.skip("this torch's CPU flash kernel does not take grouped K/V heads")
    monkeypatch.setattr(backends, "MERGE_MIN_PAIRS", 1 << 62)
    if not native:
        monkeypatch.setattr(backends, "groups_heads_natively", lambda device, dtype: False)
    H, K, D, ds, de = 8, 2, 16, 3072, 4096
    lo = 0 if window is None else ds - window + 1
    g = torch.Generator().manual_seed(0)
    q = torch.randn(H, de - ds, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(K, de - lo, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(K, de - lo, D, generator=g, dtype=torch.float64, requires_grad=True)
    out, seen = _saved_storages(lambda: backends._attend(q, k, v, ds, de, lo, window, D ** -0.5))
    given = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    copies = [b for p, (b, shape) in seen.items()
              if p not in given and len(shape) >= 3 and shape[-1] == D and b >= 8 * K * 1200 * D]
    one_copy = H * (de - lo) * D * 8
    if native:
        assert copies == [] and {k.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()} <= set(seen)
    else:
        assert len(copies) == 2 and sum(copies) == 2 * one_copy, (len(copies), sum(copies) / one_copy)

    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad)
    pos_q = torch.arange(ds, de)[:, None]
    pos_k = torch.arange(lo, de)[None, :]
    mask = pos_k <= pos_q
    if window is not None:
        mask &= pos_k > pos_q - window
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[None], k.repeat_interleave(H // K, 0)[None], v.repeat_interleave(H // K, 0)[None], attn_mask=mask,
        scale=D ** -0.5)[0]
    want = torch.autograd.grad(ref, (q, k, v), grad)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_cpu_prefix_merge_keeps_grouped_keys_unexpanded():
    """The CPU prefix merge (a chunk's queries over its unmasked key prefix and its own causal square) with
    8 query heads over 2 K/V heads: where torch's CPU flash kernel takes grouped heads, what it keeps for
    backward holds the keys and values as given (views), no expanded copy (4x their size); output and
    gradients equal the expanded computation's."""
    from atac_hf.attention import cpu_kernels

    if not cpu_kernels.groups_heads_natively("cpu", torch.float32):
        pytest.skip("this torch's CPU flash kernel does not take grouped K/V heads")
    H, K, D, n_pre, n = 8, 2, 16, 3000, 512
    g = torch.Generator().manual_seed(1)
    q = torch.randn(H, n, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(K, n_pre + n, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(K, n_pre + n, D, generator=g, dtype=torch.float64, requires_grad=True)
    out, seen = _saved_storages(lambda: cpu_kernels._prefix_chunk(q, k, v, n_pre, D ** -0.5))
    big = [b for b, shape in seen.values() if len(shape) >= 3 and shape[-1] == D and b > 8 * K * (n_pre + n) * D]
    assert big == [], big
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad)
    ke, ve = k.repeat_interleave(H // K, 0), v.repeat_interleave(H // K, 0)
    pos = torch.arange(n_pre + n)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[None], ke[None], ve[None], attn_mask=pos[None, :] <= pos[n_pre:, None], scale=D ** -0.5)[0]
    want = torch.autograd.grad(ref, (q, k, v), grad)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_grouped_head_probe_refuses_a_kernel_that_differs(monkeypatch):
    """The one-time probe takes grouped heads natively only where the CPU kernel gives what it gives on
    expanded K/V: a kernel that raises on them, or that returns other values, is not used that way."""
    from atac_hf.attention import cpu_kernels

    real = cpu_kernels._CPU_FLASH

    def raising(q, k, v, *a, **kw):
        if q.shape[1] != k.shape[1]:
            raise RuntimeError("number of heads in key/value must equal the query's")
        return real(q, k, v, *a, **kw)

    def wrong(q, k, v, *a, **kw):
        o, lse = real(q, k, v, *a, **kw)
        return (o * 1.001, lse) if q.shape[1] != k.shape[1] else (o, lse)

    for fake in (raising, wrong):
        cpu_kernels._cpu_flash_groups_heads.cache_clear()
        monkeypatch.setattr(cpu_kernels, "_CPU_FLASH", fake)
        try:
            assert cpu_kernels.groups_heads_natively("cpu", torch.float32) is False
        finally:
            monkeypatch.setattr(cpu_kernels, "_CPU_FLASH", real)
            cpu_kernels._cpu_flash_groups_heads.cache_clear()
    assert cpu_kernels.groups_heads_natively("meta", torch.float32) is False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_expanding_grouped_heads(dtype):
    """In half precision the CPU kernels still get K/V expanded to every query head (the kernel would sum a
    group's K/V gradients at the inputs' precision: bf16 dK/dV about 25% further from float64 than autograd's
    float32 sum of the expanded heads' gradients), so their gradients are those of the expanded computation
    exactly."""
    from atac_hf.attention import cpu_kernels

    assert cpu_kernels.groups_heads_natively("cpu", dtype) is False
    H, K, D, n_pre, n = 4, 2, 16, 300, 200
    g = torch.Generator().manual_seed(2)
    q = torch.randn(H, n, D, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(K, n_pre + n, D, generator=g).to(dtype).requires_grad_() for _ in range(2))
    out = cpu_kernels._prefix_chunk(q, k, v, n_pre, D ** -0.5)
    got = torch.autograd.grad(out.float().sum(), (k, v))
    ke, ve = (t.detach().repeat_interleave(H // K, 0).requires_grad_() for t in (k, v))
    ref = cpu_kernels._prefix_chunk(q.detach(), ke, ve, n_pre, D ** -0.5)
    want = torch.autograd.grad(ref.float().sum(), (ke, ve))
    assert torch.equal(out, ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.unflatten(0, (K, H // K)).sum(1), rtol=0, atol=0)


@pytest.mark.slow  # ~40 s on 2 cores: gloo groups of 2 and 4 processes
def test_saved_activations_per_rank_fall_with_the_cp_size(tmp_path):
    """`scripts/bench_cp_memory.py` on a 4K-token pack: at CP 2 and CP 4 the largest rank keeps at most
    0.56 and 0.34 of what one rank keeps for the whole pack (1/C plus what every rank holds whole: the
    gathered keys of split documents, its own logits; measured 0.52-0.53 and 0.28-0.31), for every
    strategy; 0.62 and 0.42 where torch's CPU kernel does not take grouped K/V heads and they are expanded
    (measured 0.57-0.60 and 0.33-0.39 so, before stop 59). The stock model on the packed row (a dense
    document mask) keeps more than the add-on at one rank."""
    from atac_hf.attention.cpu_kernels import groups_heads_natively

    out = tmp_path / "mem.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_cp_memory.py"), "--pack-tokens", "4096",
                          "--json-out", str(out)], cwd=ROOT, timeout=600, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    base = next(r["bytes"][0] for r in rows if r["strategy"] == "atac_cp")
    stock = next(r["bytes"][0] for r in rows if r["strategy"] == "stock sdpa")
    assert stock > base
    bound = {2: 0.56, 4: 0.34} if groups_heads_natively("cpu", torch.float32) else {2: 0.62, 4: 0.42}
    seen = set()
    for r in rows:
        if r["cp"] > 1:
            assert len(r["bytes"]) == r["cp"]
            assert max(r["bytes"]) <= bound[r["cp"]] * base, (r["cp"], r["strategy"], max(r["bytes"]) / base)
            seen.add((r["cp"], r["strategy"]))
    assert seen == {(c, s) for c in (2, 4) for s in ("atp", "zigzag", "contiguous", "per_doc")}


def test_cpu_autocast_expands_grouped_heads_where_sdpa_runs_in_half_precision(monkeypatch):
    """Under CPU autocast (bf16) float32 inputs reach the masked SDPA blocks, which autocast runs in bf16:
    there, as for bf16 inputs, the kernel gets K/V expanded to every query head (red-team 54: it got them
    grouped, keyed on the inputs' float32); without autocast it gets them grouped."""
    from atac_hf.attention import backends

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        out = sdpa(q, k, v, *args, **kwargs)
        seen.append((k.shape[1], out.dtype))  # (the dtype the kernel ran in: autocast casts inside the call)
        return out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    H, K, D, ds, de = 4, 2, 16, 300, 700
    g = torch.Generator().manual_seed(3)
    q = torch.randn(H, de - ds, D, generator=g)
    k, v = (torch.randn(K, de, D, generator=g) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        backends._masked_rows(lambda *a: backends._sdpa(*a, D ** -0.5), q, k, v, ds, de, 0, None)
    assert seen and all(heads == H and dtype == torch.bfloat16 for heads, dtype in seen)
    seen.clear()
    backends._masked_rows(lambda *a: backends._sdpa(*a, D ** -0.5), q, k, v, ds, de, 0, None)
    native = backends.groups_heads_natively("cpu", torch.float32)
    assert seen and all(heads == (K if native else H) and dtype == torch.float32 for heads, dtype in seen)

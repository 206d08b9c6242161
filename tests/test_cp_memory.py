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


@pytest.mark.parametrize("window", [None, 700])
def test_masked_row_blocks_keep_one_expanded_copy_of_grouped_keys(monkeypatch, window):
    """A chunk of 1,024 queries at positions 3,072-4,095 of a document, 8 query heads over 2 K/V heads,
    through the masked row-block path (what the sdpa backend runs off CPU, where the prefix merge does not
    exist): the K/V it keeps for backward are one expanded copy of the chunk's keys. It kept one per block
    of QUERY_BLOCK rows (4 here: about 3.5x the keys), each expanded by the kernel again. The output and
    the gradients are those of one masked call over the whole chunk."""
    from atac_hf.attention import backends

    monkeypatch.setattr(backends, "MERGE_MIN_PAIRS", 1 << 62)
    H, K, D, ds, de = 8, 2, 16, 3072, 4096
    lo = 0 if window is None else ds - window + 1
    g = torch.Generator().manual_seed(0)
    q = torch.randn(H, de - ds, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(K, de - lo, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(K, de - lo, D, generator=g, dtype=torch.float64, requires_grad=True)
    out, seen = _saved_storages(lambda: backends._attend(q, k, v, ds, de, lo, window, D ** -0.5))
    expanded = [b for b, shape in seen.values() if len(shape) >= 3 and shape[-1] == D and b >= 8 * H * 1200 * D]
    one_copy = H * (de - lo) * D * 8
    assert len(expanded) == 2 and sum(expanded) == 2 * one_copy, (len(expanded), sum(expanded) / one_copy)

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


@pytest.mark.slow  # ~40 s on 2 cores: gloo groups of 2 and 4 processes
def test_saved_activations_per_rank_fall_with_the_cp_size(tmp_path):
    """`scripts/bench_cp_memory.py` on a 4K-token pack: at CP 2 and CP 4 the largest rank keeps at most
    0.62 and 0.42 of what one rank keeps for the whole pack (1/C plus what every rank holds whole: the
    gathered keys of split documents, its own logits), for every strategy; the stock model on the packed
    row (a dense document mask) keeps more than the add-on at one rank."""
    out = tmp_path / "mem.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_cp_memory.py"), "--pack-tokens", "4096",
                    "--json-out", str(out)], check=True, cwd=ROOT, timeout=600, capture_output=True)
    rows = json.loads(out.read_text())["rows"]
    base = next(r["bytes"][0] for r in rows if r["strategy"] == "atac_cp")
    stock = next(r["bytes"][0] for r in rows if r["strategy"] == "stock sdpa")
    assert stock > base
    bound = {2: 0.62, 4: 0.42}
    seen = set()
    for r in rows:
        if r["cp"] > 1:
            assert len(r["bytes"]) == r["cp"]
            assert max(r["bytes"]) <= bound[r["cp"]] * base, (r["cp"], r["strategy"], max(r["bytes"]) / base)
            seen.add((r["cp"], r["strategy"]))
    assert seen == {(c, s) for c in (2, 4) for s in ("atp", "zigzag", "contiguous", "per_doc")}

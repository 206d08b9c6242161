"""Single-device document-masked attention on a whole packed row: the references the CP
path is checked against, and the plain implementations its overhead is measured against.

* :func:`reference_attention`: exact (float64 by default) causal attention per document,
  forward and, given an output gradient, backward; computed one document and one K/V
  head group at a time so that long documents fit (no (H, N, N) buffer).
* :func:`doc_masked_sdpa_dense`: one SDPA call over the whole row with a dense
  document-causal mask (the "plain PyTorch" low-precision reference).
* :func:`doc_masked_sdpa_loop`: one causal SDPA call per document (what a packed row
  costs with stock SDPA and no CP).
* :func:`doc_block_mask` + :func:`doc_masked_flex`: one ``flex_attention`` call with a
  document block mask (compiled on CUDA).

Shape legend: H query heads, K key/value heads, N tokens of the row, D head dim.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "doc_block_mask",
    "doc_mask_dense",
    "doc_masked_flex",
    "doc_masked_sdpa_dense",
    "doc_masked_sdpa_loop",
    "reference_attention",
]


def _bounds(lengths: Sequence[int]) -> list[tuple[int, int]]:
    off = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    return [(int(a), int(b)) for a, b in zip(off[:-1], off[1:])]


def _causal(L: int, window: int | None, device) -> torch.Tensor:
    i = torch.arange(L, device=device)[:, None]
    j = torch.arange(L, device=device)[None, :]
    m = j <= i
    if window is not None:
        m &= j > i - window
    return m


def reference_attention(
    q_HND: torch.Tensor,
    k_KND: torch.Tensor,
    v_KND: torch.Tensor,
    lengths: Sequence[int],
    *,
    scaling: float | None = None,
    window: int | None = None,
    grad_out_NHD: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """Document-masked causal attention of the whole row in ``dtype`` (no autograd graph kept).

    Args:
        q_HND: (H, N, D); k_KND, v_KND: (K, N, D), H a multiple of K (GQA).
        lengths: document lengths in row order (sum N).
        scaling: softmax scale (``D ** -0.5`` if None).
        window: sliding window W (keys ``i - W < j <= i``) or None.
        grad_out_NHD: (N, H, D) gradient of the output, or None for forward only.
        dtype: compute dtype (inputs are upcast; float64 for an exact reference).
        sinks: (H,) attention sinks (``s_aux``): an extra logit per head in every query's
            softmax, with a zero value (as GPT-OSS's eager attention), or None.
        softcap: attention logit soft-capping (scores ``softcap * tanh(s / softcap)``, as
            Gemma 2's eager attention), or None.

    Returns:
        ``(out_NHD, grads)``: the output in ``dtype`` and, when ``grad_out_NHD`` is given,
        ``(dq_HND, dk_KND, dv_KND)`` in ``dtype`` (and ``d_sinks`` (H,) after them with
        ``sinks``), else None.
    """
    H, N, D = q_HND.shape
    K = k_KND.shape[0]
    if H % K or sum(int(x) for x in lengths) != N:
        raise ValueError(f"heads {H} must be a multiple of kv heads {K} and lengths must sum to N={N}")
    rep = H // K
    scale = D ** -0.5 if scaling is None else float(scaling)
    q, k, v = (t.detach().to(dtype) for t in (q_HND, k_KND, v_KND))
    sk = None if sinks is None else sinks.detach().to(dtype).reshape(H)
    out = q.new_zeros(N, H, v.shape[-1])
    grads = None
    if grad_out_NHD is not None:
        g_out = grad_out_NHD.detach().to(dtype)
        grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
        if sk is not None:
            grads = grads + (torch.zeros_like(sk),)
    for s, e in _bounds(lengths):
        mask = _causal(e - s, window, q.device)
        for g in range(K):
            hs = slice(g * rep, (g + 1) * rep)
            with torch.enable_grad():
                qg = q[hs, s:e].clone().requires_grad_(grads is not None)
                kg = k[g, s:e].clone().requires_grad_(grads is not None)
                vg = v[g, s:e].clone().requires_grad_(grads is not None)
                scores = (qg @ kg.transpose(0, 1)) * scale  # (rep, L, L)
                if softcap is not None:
                    scores = torch.tanh(scores / softcap) * softcap
                scores = scores.masked_fill(~mask, float("-inf"))
                inputs = (qg, kg, vg)
                if sk is None:
                    p = torch.softmax(scores, dim=-1)
                else:  # the sink's logit joins every row's softmax; its value is zero
                    sg = sk[hs].clone().requires_grad_(grads is not None)
                    inputs = inputs + (sg,)
                    col = sg[:, None, None].expand(rep, e - s, 1)
                    p = torch.softmax(torch.cat([scores, col], dim=-1), dim=-1)[..., :-1]
                o = p @ vg  # (rep, L, D)
                if grads is not None:
                    got = torch.autograd.grad(o, inputs, g_out[s:e, hs].transpose(0, 1))
                    grads[0][hs, s:e] = got[0]
                    grads[1][g, s:e] = got[1]
                    grads[2][g, s:e] = got[2]
                    if sk is not None:
                        grads[3][hs] += got[3]
            out[s:e, hs] = o.detach().transpose(0, 1)
    return out, grads


def doc_mask_dense(lengths: Sequence[int], device: Any, window: int | None = None) -> torch.Tensor:
    """(N, N) bool document-causal mask of the row (True = attend)."""
    lens = torch.as_tensor(np.asarray(lengths, dtype=np.int64), device=device)
    doc = torch.repeat_interleave(torch.arange(len(lens), device=device), lens)
    pos = torch.cat([torch.arange(int(n), device=device) for n in lens.tolist()])
    m = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    if window is not None:
        m &= pos[None, :] > pos[:, None] - window
    return m


def doc_masked_sdpa_dense(q_HND: torch.Tensor, k_KND: torch.Tensor, v_KND: torch.Tensor, lengths: Sequence[int], *,
                          scaling: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """One SDPA call over the whole row with a dense document-causal mask. Returns (N, H, D).

    K/V heads are repeated to H (SDPA's fused kernels take an arbitrary mask only
    without ``enable_gqa``). Pass ``mask`` (from :func:`doc_mask_dense`) to reuse it.
    """
    H, K = q_HND.shape[0], k_KND.shape[0]
    if mask is None:
        mask = doc_mask_dense(lengths, q_HND.device)
    k, v = k_KND, v_KND
    if H != K:
        k, v = k.repeat_interleave(H // K, dim=0), v.repeat_interleave(H // K, dim=0)
    # 4-D inputs: SDPA's fused kernels reject 3-D ones (they would run the math kernel)
    out = F.scaled_dot_product_attention(q_HND[None], k[None], v[None], attn_mask=mask, scale=scaling)
    return out[0].transpose(0, 1)


def doc_masked_sdpa_loop(q_HND: torch.Tensor, k_KND: torch.Tensor, v_KND: torch.Tensor, lengths: Sequence[int], *,
                         scaling: float | None = None) -> torch.Tensor:
    """One causal SDPA call per document on (1, H, L, D) views (``enable_gqa`` for GQA), as a
    model without CP runs a packed row. Returns (N, H, D), contiguous."""
    gqa = q_HND.shape[0] != k_KND.shape[0]
    outs = [F.scaled_dot_product_attention(q_HND[None, :, s:e], k_KND[None, :, s:e], v_KND[None, :, s:e],
                                           is_causal=True, scale=scaling, enable_gqa=gqa)
            for s, e in _bounds(lengths)]  # 4-D: the fused kernels reject 3-D inputs
    return torch.cat(outs, dim=2)[0].transpose(0, 1).contiguous()


def doc_block_mask(lengths: Sequence[int], device: Any, window: int | None = None):
    """``flex_attention`` BlockMask of the row's document-causal mask (built once per pack)."""
    from torch.nn.attention.flex_attention import create_block_mask

    lens = torch.as_tensor(np.asarray(lengths, dtype=np.int64), device=device)
    doc = torch.repeat_interleave(torch.arange(len(lens), device=device), lens)
    pos = torch.cat([torch.arange(int(n), device=device) for n in lens.tolist()])
    N = int(lens.sum())

    def mask_mod(b, h, qi, ki):
        m = (doc[qi] == doc[ki]) & (pos[ki] <= pos[qi])
        if window is not None:
            m = m & (pos[ki] > pos[qi] - window)
        return m

    return create_block_mask(mask_mod, None, None, N, N, device=device)


def doc_masked_flex(q_HND: torch.Tensor, k_KND: torch.Tensor, v_KND: torch.Tensor, block_mask: Any, *,
                    scaling: float | None = None) -> torch.Tensor:
    """One ``flex_attention`` call over the row (compiled on CUDA, the same compiled function
    the ``flex`` backend uses). Returns (N, H, D), contiguous."""
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if q_HND.is_cuda:
        from .backends import _COMPILED_FLEX  # share the backend's compiled function: one compile cache

        fn = _COMPILED_FLEX.setdefault("fn", torch.compile(flex_attention))
    out = fn(q_HND[None], k_KND[None], v_KND[None], block_mask=block_mask, scale=scaling,
             enable_gqa=q_HND.shape[0] != k_KND.shape[0])
    return out[0].transpose(0, 1).contiguous()

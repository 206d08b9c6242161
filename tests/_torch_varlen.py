"""CPU stand-ins for ``torch.nn.attention.varlen.varlen_attn`` (CUDA-only in torch), one per
signature generation, computing what torch's kernel computes.

The kernel is ``aten::_flash_attention_forward`` (torch's vendored flash-attention 2). Its
argument handling (flash_api.cpp ``mha_varlen_fwd``) and mask (mask.h) are emulated
literally, independently of :func:`atac_hf.attention.varlen_attention_reference`:

* ``max_q == 1`` turns ``is_causal`` off; ``is_causal`` sets ``right = 0``; a window side
  ``>= max_k`` becomes -1 (unbounded); causal = ``left < 0 and right == 0``.
* row ``i`` of a sequence with ``Lq`` queries and ``Lk`` keys sees columns ``j`` with
  ``i + Lk - Lq - left <= j < i + 1 + Lk - Lq + right`` (unbounded sides dropped);
  causal: ``j < i + 1 + Lk - Lq``.
* query head ``h`` reads K/V head ``h // (H / K)``; a row that sees no key gives zeros.

Computed in float32 (float64 for float64 inputs) and returned in the input dtype, as the
kernel accumulates in float32; differentiable through autograd (the real backward is the
kernel's own; these stand-ins test the bookkeeping and the argument translation).
"""

from __future__ import annotations

import math

import torch


def flash_forward(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, left, right):
    """Emulated ``aten::_flash_attention_forward`` (varlen path, no dropout). q (Tq, H, D),
    k/v (Tk, K, D); returns (Tq, H, D) in q's dtype."""
    if max_q == 1:
        is_causal = False
    if is_causal:
        right = 0
    if left >= max_k:
        left = -1
    if right >= max_k:
        right = -1
    causal = left < 0 and right == 0
    local = (left >= 0 or right >= 0) and not causal
    H, K, D = q.shape[1], k.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    heads = torch.arange(H) // (H // K)
    outs = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].to(work).transpose(0, 1)  # (H, Lq, D)
        ks = k[ck[b]:ck[b + 1]].to(work).transpose(0, 1)[heads]
        vs = v[ck[b]:ck[b + 1]].to(work).transpose(0, 1)[heads]
        Lq, Lk = qs.shape[1], ks.shape[1]
        if Lq == 0:
            continue
        i = torch.arange(Lq)[:, None]
        j = torch.arange(Lk)[None, :]
        allowed = torch.ones(Lq, Lk, dtype=torch.bool)
        if causal:
            allowed &= j < i + 1 + Lk - Lq
        if local:
            if right >= 0:
                allowed &= j < i + 1 + Lk - Lq + right
            if left >= 0:
                allowed &= j >= i + Lk - Lq - left
        s = (qs @ ks.transpose(1, 2)) * scale
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        outs.append((p @ vs).transpose(0, 1).to(q.dtype))
    return torch.cat(outs) if outs else q.new_zeros(q.shape[0], H, v.shape[-1])


CALLS: list[dict] = []  # what each stand-in was called with (heads of K, keyword arguments)


def _record(key, kwargs):
    CALLS.append({"kv_heads": int(key.shape[1]), **kwargs})


def varlen_attn_2_13(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    """torch >= 2.12 signature (window_size, enable_gqa), as its wrapper checks heads."""
    _record(key, dict(scale=scale, window_size=window_size, enable_gqa=enable_gqa))
    if not enable_gqa and query.size(1) != key.size(1):
        raise ValueError("Expect query and key/value to have the same number of heads. Try setting enable_gqa=True")
    is_causal = window_size == (-1, 0)
    return flash_forward(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale, *window_size)


def varlen_attn_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1)):
    """torch 2.10/2.11 signature (scale, window_size; no enable_gqa: heads must match here)."""
    _record(key, dict(scale=scale, window_size=window_size))
    if query.size(1) != key.size(1):
        raise ValueError("query and key/value heads differ and this varlen_attn has no enable_gqa")
    is_causal = window_size == (-1, 0)
    return flash_forward(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale, *window_size)


def varlen_attn_2_9(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.9 signature (is_causal; no scale, window or GQA)."""
    _record(key, dict(is_causal=is_causal))
    if query.size(1) != key.size(1):
        raise ValueError("query and key/value heads differ and this varlen_attn has no enable_gqa")
    return flash_forward(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None, -1, -1)


GENERATIONS = {"2.13": varlen_attn_2_13, "2.10": varlen_attn_2_10, "2.9": varlen_attn_2_9}

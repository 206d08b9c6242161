"""CPU attention kernels of the ``sdpa`` backend that need a softmax's log-sum-exp: torch's CPU flash
kernel run on a chunk's key prefix and its own square and merged by log-sum-exp, attention sinks
(``s_aux``) joining that merge, and the explicit-score blocks for what no fused kernel computes
(logit soft-capping; sinks off CPU). Used by :mod:`atac_hf.attention.backends`.

Shape legend: H query heads, K key/value heads, L tokens, D head dim.
"""

from __future__ import annotations

import functools

import torch

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_FLASH_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


@functools.lru_cache(maxsize=1)
def _cpu_flash_groups_heads() -> bool:
    """Whether torch's CPU flash kernel takes fewer K/V heads than query heads (grouped-query
    attention, torch 2.13 does) and gives, forward and backward, masked and causal, exactly what it
    gives on K/V expanded to every query head: probed once on tiny float64 tensors, so a torch whose
    kernel lacks it (an error, or other values) expands K/V as before."""
    if _CPU_FLASH is None or _CPU_FLASH_BWD is None:
        return False
    with torch.no_grad(), torch.autocast("cpu", enabled=False):  # the caller's autocast would cast the probe
        return _probe_grouped_heads()


def _probe_grouped_heads() -> bool:
    g = torch.Generator().manual_seed(0)
    H, K, D, Lq, Lk = 4, 2, 8, 5, 7
    f64 = dict(dtype=torch.float64, device="cpu")
    q = torch.randn(1, H, Lq, D, generator=g, **f64)
    k, v = (torch.randn(1, K, Lk, D, generator=g, **f64) for _ in range(2))
    d_out = torch.randn(1, H, Lq, D, generator=g, **f64)
    mask = torch.zeros(Lq, Lk, **f64).masked_fill(
        ~torch.ones(Lq, Lk, dtype=torch.bool, device="cpu").tril(Lk - Lq), float("-inf"))
    try:
        for kk, vv, causal, m in ((k, v, False, mask), (k[:, :, :Lq], v[:, :, :Lq], True, None)):
            ke, ve = kk.repeat_interleave(H // K, dim=1), vv.repeat_interleave(H // K, dim=1)
            o, lse = _CPU_FLASH(q, kk, vv, 0.0, causal, attn_mask=m, scale=0.5)
            o_e, lse_e = _CPU_FLASH(q, ke, ve, 0.0, causal, attn_mask=m, scale=0.5)
            grads = _CPU_FLASH_BWD(d_out, q, kk, vv, o, lse, 0.0, causal, attn_mask=m, scale=0.5)
            grads_e = _CPU_FLASH_BWD(d_out, q, ke, ve, o_e, lse_e, 0.0, causal, attn_mask=m, scale=0.5)
            grads_e = (grads_e[0], *(x.unflatten(1, (K, H // K)).sum(2) for x in grads_e[1:]))
            if not all(a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12)
                       for a, b in zip((o, lse, *grads), (o_e, lse_e, *grads_e))):
                return False
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def groups_heads_natively(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether the CPU kernels take grouped K/V heads as they are (no expanded copy of the keys
    kept for backward): for float32 / float64 inputs on CPU where torch's CPU flash kernel does
    (:func:`_cpu_flash_groups_heads`). Never off CPU (the masked SDPA kernels there do not), nor for
    half-precision inputs: the kernel sums a group's K/V gradients at the inputs' precision, where the
    expanded heads' gradients are summed by autograd in float32 (bf16 dK/dV relative errors about 25%
    larger against float64 on torch 2.13; at float32 both are at its rounding)."""
    return torch.device(device).type == "cpu" and dtype in (torch.float32, torch.float64) and _cpu_flash_groups_heads()


def prefix_merge_available(device: torch.device | str) -> bool:
    """Whether the sdpa backend runs unwindowed chunks as two unmasked kernels merged by
    log-sum-exp (CPU, torch's CPU flash kernel present) instead of masked row blocks."""
    return torch.device(device).type == "cpu" and _CPU_FLASH is not None and _CPU_FLASH_BWD is not None


class _PrefixChunkAttention(torch.autograd.Function):
    """Attention of a chunk's queries over ``[prefix keys, own keys]``: the prefix with no
    mask (every prefix key precedes every query) and the chunk's own square with the plain
    causal kernel, merged by their log-sum-exps. Both are fused unmasked kernels, where one
    masked call would compute and mask whole rectangles. Backward: the same two kernels'
    backward with the merged output and log-sum-exp (the partitioned-softmax identity).
    Inputs (1, H, L, D) and K/V (1, K, L, D): K = H, or grouped heads where the kernel takes them
    (:func:`groups_heads_natively`). ``sinks`` (H,) or None: attention
    sinks, a third part of the softmax with a zero value (see :class:`_SinkChunkAttention`)."""

    @staticmethod
    def forward(ctx, q, k_pre, v_pre, k_own, v_own, scale, sinks=None):
        o_pre, l_pre = _CPU_FLASH(q, k_pre, v_pre, 0.0, False, scale=scale)
        o_own, l_own = _CPU_FLASH(q, k_own, v_own, 0.0, True, scale=scale)
        lse = torch.logaddexp(l_pre, l_own)
        s = None if sinks is None else sinks.to(lse.dtype).view(1, -1, 1)
        if s is not None:
            lse = torch.logaddexp(lse, s)
        out = (o_pre * torch.exp(l_pre - lse).unsqueeze(-1).to(o_pre.dtype)
               + o_own * torch.exp(l_own - lse).unsqueeze(-1).to(o_own.dtype))
        ctx.save_for_backward(q, k_pre, v_pre, k_own, v_own, out, lse, s)
        ctx.scale = scale
        ctx.sink_dtype = None if sinks is None else sinks.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k_pre, v_pre, k_own, v_own, out, lse, s = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq_pre, dk_pre, dv_pre = _CPU_FLASH_BWD(grad_out, q, k_pre, v_pre, out, lse, 0.0, False, scale=ctx.scale)
        dq_own, dk_own, dv_own = _CPU_FLASH_BWD(grad_out, q, k_own, v_own, out, lse, 0.0, True, scale=ctx.scale)
        return dq_pre + dq_own, dk_pre, dv_pre, dk_own, dv_own, None, _sink_grad(grad_out, out, lse, s, ctx.sink_dtype)


def _sink_grad(grad_out, out, lse, s, dtype):
    """(H,) gradient of the sinks' logits ``s`` (1, H, 1) of a block whose final output and
    log-sum-exp are ``out``, ``lse``: ``-sum_rows exp(s - lse) * rowsum(dO * out)``; None without."""
    if s is None:
        return None
    rowdot = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1)
    return (-(torch.exp(s - lse) * rowdot).sum(dim=(0, 2))).to(dtype)


def _prefix_chunk(q, k, v, n_pre: int, scaling: float, sinks=None) -> torch.Tensor:
    """q (H, Lq, D) at the last Lq of k/v's (K, n_pre + Lq, D) positions. Returns (H, Lq, D)."""
    H, K = q.shape[0], k.shape[0]
    if H != K and not groups_heads_natively(q.device, q.dtype):
        k = k.repeat_interleave(H // K, dim=0)
        v = v.repeat_interleave(H // K, dim=0)
    k, v = k[None], v[None]
    return _PrefixChunkAttention.apply(q[None], k[:, :, :n_pre], v[:, :, :n_pre], k[:, :, n_pre:], v[:, :, n_pre:],
                                       scaling, sinks)[0]


def _math_block(q, k, v, p0: int, lo: int, window: int | None, scaling: float, softcap: float | None,
                sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention of queries ``q`` (H, Lq, D) at document positions ``[p0, p0 + Lq)`` over keys
    and values (K, Lk, D) at ``[lo, lo + Lk)``, bottom-right causal (windowed), with the scores
    soft-capped (``softcap * tanh(s / softcap)``) and sinks joining the softmax, as the eager
    implementations compute them (in fp32 at least, where some take the model's dtype).
    Returns (H, Lq, Dv) in ``q``'s dtype."""
    H, Lq, D = q.shape
    K, Lk = k.shape[0], k.shape[1]
    dt = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.reshape(K, H // K * Lq, D).to(dt), k.to(dt).transpose(1, 2)).reshape(H, Lq, Lk)
    scores = scores * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    p = torch.arange(p0, p0 + Lq, device=q.device)[:, None]
    j = torch.arange(lo, lo + Lk, device=q.device)[None, :]
    m = j <= p
    if window is not None:
        m &= j > p - window
    scores = scores.masked_fill(~m, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.to(dt)[:, None, None].expand(H, Lq, 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    out = torch.matmul(probs.reshape(K, H // K * Lq, Lk), v.to(dt))
    return out.reshape(H, Lq, v.shape[-1]).to(q.dtype)


class _SinkChunkAttention(torch.autograd.Function):
    """CPU flash attention of a block of queries with attention sinks: the kernel's output and
    log-sum-exp ``l``, rescaled by ``exp(l - lse)`` with ``lse = logaddexp(l, sink)``. Backward:
    the kernel's backward with the final output and ``lse`` (the sink's column has a zero value,
    so it adds nothing to ``dP`` and the kernel's ``rowsum(dO * out)`` stays right), and the
    sinks' gradient ``-sum_rows exp(sink - lse) * rowsum(dO * out)``. Inputs (1, H, L, D), K/V
    (1, K, L, D) as in :class:`_PrefixChunkAttention`; ``mask`` a float (Lq, Lk) mask (0 / -inf) or
    None with ``causal``."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, mask, causal, scale):
        o, l = _CPU_FLASH(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
        s = sinks.to(l.dtype).view(1, -1, 1)
        lse = torch.logaddexp(l, s)
        out = o * torch.exp(l - lse).unsqueeze(-1).to(o.dtype)
        ctx.save_for_backward(q, k, v, out, lse, s, mask)
        ctx.causal, ctx.scale, ctx.sink_dtype = causal, scale, sinks.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, s, mask = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq, dk, dv = _CPU_FLASH_BWD(grad_out, q, k, v, out, lse, 0.0, ctx.causal, attn_mask=mask, scale=ctx.scale)
        return dq, dk, dv, _sink_grad(grad_out, out, lse, s, ctx.sink_dtype), None, None, None


def _sink_flash(q, k, v, mask, scaling: float, sinks) -> torch.Tensor:
    """q (H, Lq, D), k/v (K, Lk, D), ``mask`` (Lq, Lk) bool or None (plain causal, Lq == Lk),
    sinks (H,): :class:`_SinkChunkAttention`. Returns (H, Lq, D)."""
    H, K = q.shape[0], k.shape[0]
    if H != K and not groups_heads_natively(q.device, q.dtype):
        k = k.repeat_interleave(H // K, dim=0)
        v = v.repeat_interleave(H // K, dim=0)
    fmask = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
        ~mask, float("-inf"))
    return _SinkChunkAttention.apply(q[None].contiguous(), k[None].contiguous(), v[None].contiguous(), sinks,
                                     fmask, mask is None, scaling)[0]

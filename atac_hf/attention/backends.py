"""Per-segment attention kernels for one rank's shard.

Every backend computes, for each local segment (a run of one document's queries,
document positions ``[ds, de)``), attention over that document's key prefix
``[lo, de)`` with the causal mask bottom-right aligned (query at document position
``p`` sees keys ``j <= p``, and ``j > p - W`` under a sliding window ``W``).
Keys of a segment whose document is whole on this rank are local rows; keys of a
gathered document are rows of the all-gathered buffer. Local segments are computed
first, so they overlap with the gather; ``wait()`` is called once, before the first
gathered segment.

Backends: ``sdpa`` (reference, CPU and GPU: a loop of SDPA calls, one per segment;
a chunk that starts after its document's first token runs, on CPU and when it is big
enough, as an unmasked kernel over its key prefix plus a causal kernel over its own
square merged by log-sum-exp, and otherwise as masked blocks of query rows), ``flex``
(``flex_attention``; GPU for training, forward-only on CPU), and the varlen backends of
:mod:`atac_hf.attention.varlen`: ``flash`` (``flash_attn_varlen_func``, CUDA), ``varlen``
(torch's own ``varlen_attn``, CUDA, torch >= 2.9) and ``varlen_reference`` (the same
bookkeeping fed to a pure-torch varlen kernel: slow, for tests and debugging).
``auto`` picks one per call from the inputs' device and dtype (:func:`auto_backend`).

Shape legend: H query heads, K key/value heads, S local tokens, R gathered rows
(``C * max_send``), D head dim.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..sharding.plan import LocalLayout
from .varlen import VARLEN_KERNELS, Wait, auto_backend, make_varlen_backend, varlen_attention_reference
from .cpu_kernels import _math_block, _prefix_chunk, _sink_flash, groups_heads_natively, prefix_merge_available

__all__ = ["BACKENDS", "SEGMENT_BACKENDS", "attend_segment", "auto_backend", "prefix_merge_available",
           "resolve_backend", "run_backend", "varlen_attention_reference"]


# ---------------------------------------------------------------------------- segment table
def _segments(layout: LocalLayout, window: int | None) -> list[tuple]:
    """Per segment ``(ls, le, ds, de, lo, gathered, doc)``; ``lo`` is the first key position."""
    out = []
    for i in range(len(layout.seg_doc)):
        ls, le = int(layout.seg_local_start[i]), int(layout.seg_local_end[i])
        ds, de = int(layout.seg_doc_start[i]), int(layout.seg_doc_end[i])
        lo = 0 if window is None else max(0, ds - int(window) + 1)
        gathered = bool(layout.seg_gathered[i])
        if not gathered:
            # a document that is not gathered is whole on this rank: its prefix precedes locally
            assert ls - ds >= 0, "a non-gathered segment without its local document prefix"
        out.append((ls, le, ds, de, lo, gathered, int(layout.seg_doc[i])))
    return out


def _segment_mask(ds: int, de: int, lo: int, window: int | None, device) -> torch.Tensor | None:
    """(Lq, Lk) bool mask, or None where plain ``is_causal`` (top-left = bottom-right) is exact."""
    if ds == 0 and lo == 0 and (window is None or window >= de):
        return None
    p = torch.arange(ds, de, device=device)[:, None]
    j = torch.arange(lo, de, device=device)[None, :]
    m = j <= p
    if window is not None:
        m &= j > p - window
    return m


def _sdpa_tables(layout: LocalLayout, window: int | None, device, cache: dict):
    key = ("sdpa", str(device), window)
    if key not in cache:
        segs = _segments(layout, window)
        rows = {}
        for ls, le, ds, de, lo, gathered, doc in segs:
            if gathered and (doc, lo, de) not in rows:
                rows[(doc, lo, de)] = torch.as_tensor(layout.doc_key_index[doc][lo:de], device=device)
        cache[key] = (segs, rows)
    return cache[key]


def _sdpa_dtype(q: torch.Tensor) -> torch.dtype:
    """The dtype SDPA computes ``q`` in: CPU autocast's half precision for float32 inputs where it is on
    (SDPA is on its lower-precision list; the CPU prefix merge's direct kernel calls are not), else
    ``q``'s. Grouped K/V heads are kept by that dtype (:func:`groups_heads_natively`)."""
    if q.device.type == "cpu" and q.dtype == torch.float32 and torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return q.dtype


def _sdpa(q, k, v, mask, scaling):
    """q (H, Lq, D), k/v (K, Lk, D); mask None -> causal. Returns (H, Lq, D).

    The calls get a batch dim: SDPA's fused kernels (flash / memory-efficient, CPU flash)
    accept only 4-D inputs and would fall back to the math kernel, which materialises
    the (H, Lq, Lk) scores."""
    H, K = q.shape[0], k.shape[0]
    if mask is None:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scaling,
                                             enable_gqa=H != K)
        return out[0]
    if H != K and groups_heads_natively(q.device, _sdpa_dtype(q)):  # CPU: its flash kernel takes the mask, grouped heads
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scaling,
                                              enable_gqa=True)[0]
    if H != K:
        k = k.repeat_interleave(H // K, dim=0)
        v = v.repeat_interleave(H // K, dim=0)
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scaling)[0]


# Causal pairs from which a chunk runs as the merged pair of kernels on CPU: their extra
# calls cost ~0.15 ms, which one masked call of a small chunk does not pay (measured on
# x86 with torch 2.13: the merge wins from ~1K-token chunks over a long prefix, loses on
# chunks of a few hundred tokens).
MERGE_MIN_PAIRS = 1 << 18

# Query rows per SDPA call for a chunk that needs an explicit mask (it does not start at its
# document's first token, or has a window): mask kernels compute the whole (queries x keys)
# rectangle, so one call per chunk would spend ~Lq * Lk instead of the causal pairs the cost
# model plans with; blocks of rows cut the waste to about half a block per row.
QUERY_BLOCK = 256


# Score entries (heads x query rows x keys) per block of the explicit-score path (soft-capping,
# sinks off CPU): bounds their transient buffer (64 MiB in fp32; 4x on CUDA);
# the blocks are recomputed in backward, not kept.
SINK_BLOCK_ELEMENTS = 1 << 24


def _score_block_rows(H: int, ds: int, de: int, lo: int, window: int | None, device) -> int:
    """Query rows per explicit-score block: as many as keep heads x rows x (the keys a block reads)
    within the budget. A block of r rows reads up to ``de - lo`` keys, or ``window - 1 + r`` under
    a sliding window (solved for r)."""
    budget = SINK_BLOCK_ELEMENTS * (4 if torch.device(device).type == "cuda" else 1) / max(1, H)
    if window is None:
        rows = budget // max(1, de - lo)
    else:
        w = min(int(window), de - lo) - 1
        rows = (-w + math.sqrt(w * w + 4 * budget)) / 2
    return int(max(1, min(de - ds, rows)))


def _attend_math(q, k, v, ds: int, de: int, lo: int, window: int | None, scaling: float, softcap: float | None,
                 sinks: torch.Tensor | None) -> torch.Tensor:
    """:func:`_attend` for what no fused kernel computes (logit soft-capping; sinks off CPU): explicit scores in
    blocks of query rows of at most SINK_BLOCK_ELEMENTS entries, each checkpointed (recomputed in
    backward), so no (H, Lq, Lk) buffer is kept. Returns (H, Lq, D)."""
    from torch.utils.checkpoint import checkpoint

    rows = _score_block_rows(q.shape[0], ds, de, lo, window, q.device)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    outs = []
    for p0 in range(ds, de, rows):
        p1 = min(p0 + rows, de)
        klo = lo if window is None else max(lo, p0 - int(window) + 1)
        args = (q[:, p0 - ds:p1 - ds], k[:, klo - lo:p1 - lo], v[:, klo - lo:p1 - lo], p0, klo, window, scaling,
                softcap, sinks)
        outs.append(checkpoint(_math_block, *args, use_reentrant=False) if grad else _math_block(*args))
    return torch.cat(outs, dim=1)


def _attend(q, k, v, ds: int, de: int, lo: int, window: int | None, scaling: float,
            sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Bottom-right causal (windowed) attention of a chunk: q (H, Lq, D) at document positions
    ``[ds, de)``, k/v (K, de - lo, D) at positions ``[lo, de)``. Returns (H, Lq, D).

    ``sinks`` (H,): attention sinks (``s_aux`` of GPT-OSS-like models): one extra logit per head
    in every query's softmax, with a zero value: the plain attention's output times
    ``sigmoid(lse - sink)`` (``lse``: the log-sum-exp of the query's scores). On CPU the flash
    kernel's own log-sum-exp gives it (:func:`_attend_sinks_cpu`); elsewhere the explicit-score
    path puts the sink column in the softmax (:func:`_attend_math`). Computed in fp32 at least
    (GPT-OSS's eager attention takes that softmax in the model's dtype: bf16 models may differ by
    bf16's rounding).

    ``softcap``: attention logit soft-capping (Gemma 2: scores ``softcap * tanh(s / softcap)``),
    which no fused kernel applies: :func:`_attend_math`."""
    if softcap is not None or (sinks is not None and not prefix_merge_available(q.device)):
        return _attend_math(q, k, v, ds, de, lo, window, scaling, softcap, sinks)
    if sinks is None:
        return _attend_plain(q, k, v, ds, de, lo, window, scaling)
    return _attend_sinks_cpu(q, k, v, ds, de, lo, window, scaling, sinks)


def _attend_sinks_cpu(q, k, v, ds: int, de: int, lo: int, window: int | None, scaling: float, sinks) -> torch.Tensor:
    """:func:`_attend` with sinks on CPU: one kernel call where the plain causal mask is exact,
    else blocks of QUERY_BLOCK query rows, each with its explicit mask (as :func:`_attend_plain`)."""
    n = de - ds
    if lo == 0 and ds > 0 and (window is None or window >= de) and n * ds + n * (n + 1) // 2 >= MERGE_MIN_PAIRS:
        return _prefix_chunk(q, k, v, ds, scaling, sinks)
    return _masked_rows(lambda qb, kb, vb, m: _sink_flash(qb, kb, vb, m, scaling, sinks), q, k, v, ds, de, lo, window)


def _masked_rows(kernel, q, k, v, ds: int, de: int, lo: int, window: int | None) -> torch.Tensor:
    """A chunk through ``kernel(q, k, v, mask)``: one call where the plain causal mask is exact
    (``mask`` None) or the chunk has at most QUERY_BLOCK rows, else blocks of QUERY_BLOCK query
    rows, each with its own explicit mask (the chunk's whole mask is never built for them)."""
    if ds == 0 and lo == 0 and (window is None or window >= de):  # _segment_mask's None case
        return kernel(q, k, v, None)
    if de - ds <= QUERY_BLOCK:
        return kernel(q, k, v, _segment_mask(ds, de, lo, window, q.device))
    H, K = q.shape[0], k.shape[0]
    if H != K and not groups_heads_natively(q.device, _sdpa_dtype(q)):
        # grouped K/V heads expanded once for the chunk: the kernels would expand each block's keys
        # again, and autograd keeps every block's copy (a chunk of n rows deep in a long document held
        # about n / QUERY_BLOCK expanded copies of its prefix until backward)
        k = k.repeat_interleave(H // K, dim=0)
        v = v.repeat_interleave(H // K, dim=0)
    outs = []
    for p0 in range(ds, de, QUERY_BLOCK):
        p1 = min(p0 + QUERY_BLOCK, de)
        klo = lo if window is None else max(lo, p0 - int(window) + 1)
        outs.append(kernel(q[:, p0 - ds:p1 - ds], k[:, klo - lo:p1 - lo], v[:, klo - lo:p1 - lo],
                           _segment_mask(p0, p1, klo, window, q.device)))
    return torch.cat(outs, dim=1)


def _attend_plain(q, k, v, ds: int, de: int, lo: int, window: int | None, scaling: float) -> torch.Tensor:
    """:func:`_attend` without sinks."""
    n = de - ds
    if (lo == 0 and ds > 0 and (window is None or window >= de) and n * ds + n * (n + 1) // 2 >= MERGE_MIN_PAIRS
            and prefix_merge_available(q.device)):
        return _prefix_chunk(q, k, v, ds, scaling)
    return _masked_rows(lambda qb, kb, vb, m: _sdpa(qb, kb, vb, m, scaling), q, k, v, ds, de, lo, window)


def sdpa_backend(q_HSD, k_HSD, v_HSD, layout: LocalLayout, cache: dict, wait: Wait | None, *,
                 scaling: float, window: int | None, sinks: torch.Tensor | None = None,
                 softcap: float | None = None) -> torch.Tensor:
    """Loop of SDPA calls, one per local segment (row blocks for masked chunks). Returns (S, H, D).
    ``sinks`` (H,) and ``softcap``: attention sinks and logit soft-capping (see :func:`_attend`);
    the one backend that applies them."""
    segs, rows = _sdpa_tables(layout, window, q_HSD.device, cache)
    outs: list[torch.Tensor | None] = [None] * len(segs)
    for i, (ls, le, ds, de, lo, gathered, doc) in enumerate(segs):
        if gathered:
            continue
        k0 = ls - ds + lo
        outs[i] = _attend(q_HSD[:, ls:le], k_HSD[:, k0:le], v_HSD[:, k0:le], ds, de, lo, window, scaling, sinks,
                          softcap)
    if any(s[5] for s in segs):
        assert wait is not None, "a gathered segment without a gather"
        k_RKD, v_RKD = wait()
        for i, (ls, le, ds, de, lo, gathered, doc) in enumerate(segs):
            if not gathered:
                continue
            idx = rows[(doc, lo, de)]
            kk = k_RKD.index_select(0, idx).transpose(0, 1)
            vv = v_RKD.index_select(0, idx).transpose(0, 1)
            outs[i] = _attend(q_HSD[:, ls:le], kk, vv, ds, de, lo, window, scaling, sinks, softcap)
    if not outs:
        return q_HSD.new_zeros(0, q_HSD.shape[0], v_HSD.shape[-1])
    return torch.cat(outs, dim=1).transpose(0, 1)


# ---------------------------------------------------------------------------- flex
_COMPILED_FLEX: dict = {}


def _flex_tables(layout: LocalLayout, window: int | None, num_gathered: int, device, cache: dict):
    key = ("flex", str(device), window, num_gathered)
    if key in cache:
        return cache[key]
    from torch.nn.attention.flex_attention import create_block_mask

    S = layout.n_local
    q_doc = np.repeat(layout.seg_doc, layout.seg_local_end - layout.seg_local_start)
    q_pos = np.concatenate([np.arange(a, b) for a, b in zip(layout.seg_doc_start, layout.seg_doc_end)]
                           or [np.zeros(0, np.int64)])
    kv_doc = np.full(S + num_gathered, -1, dtype=np.int64)
    kv_pos = np.zeros(S + num_gathered, dtype=np.int64)
    local = ~np.repeat(layout.seg_gathered, layout.seg_local_end - layout.seg_local_start)
    kv_doc[:S][local], kv_pos[:S] = q_doc[local], q_pos  # gathered docs' local rows come via the buffer
    for d, rows in layout.doc_key_index.items():
        # an all-to-all layout maps only the positions this rank attends to (-1 elsewhere)
        pos = np.flatnonzero(rows >= 0)
        kv_doc[S + rows[pos]], kv_pos[S + rows[pos]] = d, pos
    qd, qp, kd, kp = (torch.as_tensor(a, device=device) for a in (q_doc, q_pos, kv_doc, kv_pos))

    def mask_mod(b, h, qi, ki):
        m = (kd[ki] == qd[qi]) & (kp[ki] <= qp[qi])
        if window is not None:
            m = m & (kp[ki] > qp[qi] - window)
        return m

    cache[key] = create_block_mask(mask_mod, None, None, S, S + num_gathered, device=device)
    return cache[key]


def flex_backend(q_HSD, k_HSD, v_HSD, layout: LocalLayout, cache: dict, wait: Wait | None, *,
                 scaling: float, window: int | None) -> torch.Tensor:
    """One flex_attention call over ``cat(local keys, gathered keys)`` (no overlap). Returns (S, H, D)."""
    from torch.nn.attention.flex_attention import flex_attention

    k_all, v_all = k_HSD, v_HSD
    n_g = 0
    if wait is not None:
        k_RKD, v_RKD = wait()
        n_g = k_RKD.shape[0]
        k_all = torch.cat([k_HSD, k_RKD.transpose(0, 1)], dim=1)
        v_all = torch.cat([v_HSD, v_RKD.transpose(0, 1)], dim=1)
    block_mask = _flex_tables(layout, window, n_g, q_HSD.device, cache)
    fn = flex_attention
    if q_HSD.is_cuda:
        fn = _COMPILED_FLEX.setdefault("fn", torch.compile(flex_attention))
    out = fn(q_HSD[None], k_all[None], v_all[None], block_mask=block_mask, scale=scaling,
             enable_gqa=q_HSD.shape[0] != k_HSD.shape[0])
    return out[0].transpose(0, 1)


def auto(q_HSD, k_HSD, v_HSD, layout: LocalLayout, cache: dict, wait: Wait | None, *,
         scaling: float, window: int | None) -> torch.Tensor:
    """``attention_backend='auto'``: the backend :func:`auto_backend` picks for this call's device
    and dtype (decided per call, so that autocast's bf16 inputs run the flash kernels and fp32
    ones ``sdpa``). Returns (S, H, D)."""
    key = ("auto", str(q_HSD.device), q_HSD.dtype, q_HSD.shape[-1])
    if key not in cache:
        cache[key] = auto_backend(q_HSD.device, q_HSD.dtype, q_HSD.shape[-1])
    return BACKENDS[cache[key]](q_HSD, k_HSD, v_HSD, layout, cache, wait, scaling=scaling, window=window)


BACKENDS: dict[str, Callable] = {
    "sdpa": sdpa_backend,
    "flash": make_varlen_backend(VARLEN_KERNELS["flash"]),
    "flex": flex_backend,
    "varlen": make_varlen_backend(VARLEN_KERNELS["varlen"]),
    "varlen_reference": make_varlen_backend(VARLEN_KERNELS["varlen_reference"]),
    "auto": auto,
}


SEGMENT_BACKENDS = ("sdpa", "flash", "varlen", "varlen_reference")


def resolve_backend(name: str, device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """``name``, or for ``"auto"`` the backend :func:`auto_backend` picks on ``device`` (for
    ``dtype`` inputs).

    Raises:
        ValueError: ``name`` not a key of :data:`BACKENDS`.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; legal values: {sorted(BACKENDS)} "
                         "(set attention_backend=)")
    return auto_backend(device, dtype) if name == "auto" else name


def attend_segment(backend: str, q_HLD: torch.Tensor, k_KLD: torch.Tensor, v_KLD: torch.Tensor, ds: int, de: int,
                   lo: int = 0, *, window: int | None = None, scaling: float | None = None) -> torch.Tensor:
    """One segment's attention exactly as ``backend`` runs it inside a layer (what
    :mod:`atac_hf.cost.calibrate` times): queries at document positions ``[ds, de)`` against
    keys ``[lo, de)``, bottom-right causal, windowed if ``window``. Returns (H, de - ds, D).

    Raises:
        ValueError: ``backend`` not in :data:`SEGMENT_BACKENDS` (``flex`` runs a whole layout
            in one call and has no per-segment kernel).
    """
    scale = q_HLD.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if backend == "sdpa":
        return _attend(q_HLD, k_KLD, v_KLD, ds, de, lo, window, scale)
    if backend not in VARLEN_KERNELS:
        raise ValueError(f"backend {backend!r} has no per-segment kernel; legal values: {list(SEGMENT_BACKENDS)}")
    dev = q_HLD.device
    cu_q = torch.tensor([0, de - ds], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, de - lo], dtype=torch.int32, device=dev)
    out = VARLEN_KERNELS[backend](q_HLD.transpose(0, 1), k_KLD.transpose(0, 1), v_KLD.transpose(0, 1), cu_q, cu_k,
                           de - ds, de - lo, scale, window)
    return out.transpose(0, 1)


def run_backend(name: str, *args, **kwargs) -> torch.Tensor:
    """Dispatch to ``BACKENDS[name]`` (see :func:`sdpa_backend` for the arguments)."""
    q_HSD, v_HSD = args[0], args[2]
    if q_HSD.shape[1] == 0:  # a rank without tokens (tiny packs): nothing to attend
        return q_HSD.new_zeros(0, q_HSD.shape[0], v_HSD.shape[-1])
    return BACKENDS[name](*args, **kwargs)

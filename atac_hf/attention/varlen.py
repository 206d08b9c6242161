"""Varlen (``cu_seqlens``) backends: ``flash``, ``varlen`` and ``varlen_reference``.

All three run one rank's segments as varlen attention calls with the same bookkeeping:
each local query segment (document positions ``[ds, de)``) is one varlen sequence whose
keys are its document's prefix ``[lo, de)`` (``lo = 0``, or the window's first key), with
the causal mask bottom-right aligned (query ``i`` of a sequence with ``Lq`` queries and
``Lk`` keys sees keys ``j <= i + Lk - Lq``). Two calls per layer: the segments of local
documents first (overlapping the K/V gather), then those of gathered documents, whose
keys are rows of the all-gathered buffer.

Kernels:

* ``flash``: ``flash_attn.flash_attn_varlen_func`` (flash-attn >= 2.1, CUDA).
* ``varlen``: ``torch.nn.attention.varlen.varlen_attn``, the flash kernels shipped inside
  torch >= 2.9 (CUDA, float16/bfloat16): no flash-attn build. Its signature moved between
  torch releases; :class:`~atac_hf.attention.compat.VarlenAttn` adapts to the installed one
  (scale, sliding window, GQA by repeating K/V heads where ``enable_gqa`` is missing) and
  refuses what that version cannot express.
* ``varlen_reference``: :func:`varlen_attention_reference`, a pure-torch kernel with the
  same semantics (slow; tests and debugging, any device and dtype).

Shape legend: H query heads, K key/value heads, S local tokens, T varlen rows, D head dim.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch

from ..packing.validate import InputTypeError, _short
from ..sharding.plan import LocalLayout, check_window
from .compat import VarlenAttn, torch_varlen_attn

__all__ = ["VARLEN_KERNELS", "auto_backend", "check_varlen_runtime", "flash_attn_installed", "make_varlen_backend",
           "varlen_attention_reference", "varlen_kernel_source"]

Wait = Callable[[], "tuple[torch.Tensor, torch.Tensor]"]  # -> (k_RKD, v_RKD)


# ---------------------------------------------------------------------------- reference kernel
def varlen_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = True,
    window: int | None = None,
    scaling: float | None = None,
) -> torch.Tensor:
    """Pure-torch varlen attention with flash-attn (>= 2.1) semantics.

    Args:
        q: (total_q, H, D); k, v: (total_k, K, D) with H a multiple of K (GQA).
        cu_seqlens_q, cu_seqlens_k: (B + 1,) segment boundaries.
        causal: bottom-right aligned: query ``i`` of a segment sees keys ``j <= i + Lk - Lq``.
        window: sliding window ``W`` as Transformers' ``sliding_window``: additionally
            ``j > i + Lk - Lq - W`` (flash ``window_size=(W - 1, 0)``).
        scaling: softmax scale, ``D ** -0.5`` if None.

    Returns:
        (total_q, H, D) output; a query that sees no key gets zeros (as flash-attn).

    Raises:
        InputTypeError: ``cu_seqlens_q``/``cu_seqlens_k`` not a 1-D integer tensor or array.
        ValueError: boundaries that do not start at 0, decrease, or end elsewhere than at the
            row count (``total_q``/``total_k``); the two of different lengths; ``window`` not
            None or an int >= 1.
    """
    H, K = q.shape[1], k.shape[1]
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    window = check_window(window, "window")
    cq = _boundaries(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    ck = _boundaries(cu_seqlens_k, "cu_seqlens_k", k.shape[0])
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_q has {len(cq) - 1} segments and cu_seqlens_k {len(ck) - 1}: pass one "
                         "(query, key) boundary pair per segment")
    outs = []
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].transpose(0, 1)
        ks = k[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(H // K, dim=0)
        vs = v[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(H // K, dim=0)
        Lq, Lk = qs.shape[1], ks.shape[1]
        if Lq == 0:
            continue
        i = torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq)
        j = torch.arange(Lk, device=q.device)[None, :]
        allowed = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device)
        if causal:
            allowed &= j <= i
        if window is not None:
            allowed &= j > i - window
            if not causal:
                allowed &= j < i + window
        scores = (qs @ ks.transpose(1, 2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        outs.append((p @ vs).transpose(0, 1))
    if not outs:
        return q.new_zeros(q.shape[0], H, v.shape[-1])
    return torch.cat(outs, dim=0)


def _boundaries(cu, name: str, rows: int) -> list[int]:
    """``cu`` (segment boundaries over ``rows`` rows) as a list of ints, checked."""
    if isinstance(cu, torch.Tensor):
        integer = not (cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool)
    else:
        integer = isinstance(cu, np.ndarray) and cu.dtype.kind in "iu"
    if not integer or cu.ndim != 1:
        raise InputTypeError(f"{name}={_short(cu)} is not a 1-D integer tensor: pass the (B + 1,) segment "
                             "boundaries, e.g. torch.tensor([0, 3, 5], dtype=torch.int32)")
    out = [int(x) for x in cu.tolist()]
    if not out or out[0] != 0 or out[-1] != rows or any(b < a for a, b in zip(out, out[1:])):
        raise ValueError(f"{name}={_short(out)} must start at 0, never decrease and end at the row count {rows} "
                         f"of its tensor ({'q' if name.endswith('q') else 'k'}.shape[0]); pass its segment boundaries")
    return out


# ---------------------------------------------------------------------------- kernels
def _reference_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling, window):
    return varlen_attention_reference(q, k, v, cu_q, cu_k, causal=True, window=window, scaling=scaling)


def _flash_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling, window):
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as e:
        raise ImportError(
            "backend='flash' needs flash-attn (CUDA only): `pip install atac-hf[flash]`, "
            "or use backend='varlen' (torch's own flash kernels, torch >= 2.9) or backend='sdpa'"
        ) from e
    return flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=scaling, causal=True,
        window_size=(-1, -1) if window is None else (int(window) - 1, 0),
    )


def varlen_kernel_source() -> VarlenAttn:
    """The installed torch's ``varlen_attn``, probed (what backend ``varlen`` calls).

    Raises:
        NotImplementedError: torch < 2.9 (no ``torch.nn.attention.varlen``).
    """
    fn = torch_varlen_attn()
    if fn is None:
        raise NotImplementedError(
            f"backend='varlen' needs torch.nn.attention.varlen.varlen_attn (torch >= 2.9), not in torch "
            f"{torch.__version__}; upgrade torch, or use backend='sdpa' (or 'flash' with flash-attn)")
    return fn


def check_varlen_runtime(device_type: str) -> None:
    """Fail early (``ATACConfig.check_runtime``) where backend ``varlen`` cannot run.

    Raises:
        ValueError: torch without ``varlen_attn`` (< 2.9), or a device other than CUDA.
    """
    if torch_varlen_attn() is None:
        raise ValueError(f"attention_backend='varlen' needs torch.nn.attention.varlen.varlen_attn (torch >= 2.9), "
                         f"not in torch {torch.__version__}: upgrade torch, or set attention_backend='sdpa'")
    if device_type != "cuda":
        raise ValueError(f"attention_backend='varlen' runs on CUDA only, this run is on {device_type!r}; "
                         "set attention_backend='sdpa' (or 'auto')")


def _torch_varlen_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling, window):
    return varlen_kernel_source()(q, k, v, cu_q, cu_k, max_q, max_k, scale=scaling, window=window)


VARLEN_KERNELS: dict[str, Callable] = {
    "flash": _flash_kernel,
    "varlen": _torch_varlen_kernel,
    "varlen_reference": _reference_kernel,
}


@functools.lru_cache(maxsize=1)
def flash_attn_installed() -> bool:
    """Whether ``import flash_attn`` works (cached: a failed import is not, and would scan the
    path on every layer)."""
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


_FLASH_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=16)
def _ampere_or_newer(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 8


def auto_backend(device: torch.device | str, dtype: torch.dtype | None = None, head_dim: int | None = None) -> str:
    """The backend ``attention_backend='auto'`` runs for attention inputs on ``device`` in
    ``dtype`` with ``head_dim`` (None: not checked): where the flash kernels run (CUDA,
    compute capability >= 8.0, float16/bfloat16 inputs, head_dim a multiple of 8 up to 256)
    ``flash`` when flash-attn is installed, else ``varlen`` when torch's ``varlen_attn`` takes
    ``scale`` and ``window_size`` (torch >= 2.10); ``sdpa`` otherwise (CPU and float32
    included)."""
    device = torch.device(device)
    if device.type != "cuda" or (dtype is not None and dtype not in _FLASH_DTYPES):
        return "sdpa"
    if head_dim is not None and (head_dim % 8 or head_dim > 256):
        return "sdpa"
    if torch.cuda.is_available() and not _ampere_or_newer(device):
        return "sdpa"
    if flash_attn_installed():
        return "flash"
    fn = torch_varlen_attn()
    if fn is not None and fn.takes_scale and fn.takes_window:
        return "varlen"
    return "sdpa"


# ---------------------------------------------------------------------------- bookkeeping
def _index(a: np.ndarray, num_rows: int | None, device) -> torch.Tensor | None:
    """``a`` as a device index into ``num_rows`` rows, or None when it takes them all in order
    (``arange(num_rows)``: no gather needed)."""
    if num_rows is not None and len(a) == num_rows and np.array_equal(a, np.arange(num_rows)):
        return None
    return torch.as_tensor(np.asarray(a, dtype=np.int64), device=device)


def _varlen_tables(layout: LocalLayout, window: int | None, device, cache: dict):
    """Two parts, local then gathered: ``(q_index, k_index, cu_q, cu_k, max_q, max_k)`` each
    (an index is None where it is the identity), plus the permutation that puts ``cat(part
    outputs)`` back in local order (None if identity)."""
    key = ("varlen", str(device), window)
    if key in cache:
        return cache[key]
    vl = layout.varlen_layout(sliding_window=window)
    parts, order = [], []
    for want in (False, True):
        segs = [i for i in range(len(layout.seg_doc)) if bool(layout.seg_gathered[i]) == want]
        if not segs:
            parts.append(None)
            continue
        q_idx = np.concatenate([np.arange(vl.cu_seqlens_q[i], vl.cu_seqlens_q[i + 1]) for i in segs])
        k_idx = np.concatenate([vl.k_index[vl.cu_seqlens_k[i]:vl.cu_seqlens_k[i + 1]] for i in segs])
        if want:
            k_idx = k_idx - layout.n_local  # rows of the gathered buffer
        lq = np.array([vl.cu_seqlens_q[i + 1] - vl.cu_seqlens_q[i] for i in segs])
        lk = np.array([vl.cu_seqlens_k[i + 1] - vl.cu_seqlens_k[i] for i in segs])
        cu = [torch.as_tensor(np.concatenate([[0], np.cumsum(x)]).astype(np.int32), device=device) for x in (lq, lk)]
        S = layout.n_local
        parts.append((_index(q_idx, S, device), _index(k_idx, None if want else S, device), cu[0], cu[1],
                      int(lq.max()), int(lk.max())))
        order.append(q_idx)
    order_np = np.concatenate(order) if order else np.zeros(0, np.int64)
    inv = None
    if not np.array_equal(order_np, np.arange(len(order_np))):
        inv_np = np.empty_like(order_np)
        inv_np[order_np] = np.arange(len(order_np))
        inv = torch.as_tensor(inv_np, device=device)
    cache[key] = (parts, inv)
    return cache[key]


def _rows(x: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    """Rows ``idx`` of ``x`` (all of them for None) with a unit-stride last dim, which the
    flash kernels need (flash-attn's ``maybe_contiguous``): (S, H, D) views of the model's
    (H, S, D) tensors already have one, so the common case copies nothing."""
    x = x if idx is None else x.index_select(0, idx)
    return x if x.stride(-1) == 1 else x.contiguous()


def make_varlen_backend(kernel: Callable) -> Callable:
    """A backend (see :func:`~atac_hf.attention.backends.sdpa_backend` for the arguments)
    running one rank's segments through ``kernel(q_TND, k_TKD, v_TKD, cu_q, cu_k, max_q,
    max_k, scaling, window)`` in two calls, local then gathered documents. Returns (S, H, D)."""

    def backend(q_HSD, k_HSD, v_HSD, layout: LocalLayout, cache: dict, wait: Wait | None, *,
                scaling: float, window: int | None) -> torch.Tensor:
        (local, gathered), inv = _varlen_tables(layout, window, q_HSD.device, cache)
        q_SHD, k_SKD, v_SKD = q_HSD.transpose(0, 1), k_HSD.transpose(0, 1), v_HSD.transpose(0, 1)
        outs = []
        for part, is_gathered in ((local, False), (gathered, True)):
            if part is None:
                continue
            q_idx, k_idx, cu_q, cu_k, max_q, max_k = part
            if is_gathered:
                assert wait is not None, "a gathered segment without a gather"
                k_src, v_src = wait()
            else:
                k_src, v_src = k_SKD, v_SKD
            outs.append(kernel(_rows(q_SHD, q_idx), _rows(k_src, k_idx), _rows(v_src, k_idx), cu_q, cu_k, max_q,
                               max_k, scaling, window))
        if not outs:
            return q_HSD.new_zeros(0, q_HSD.shape[0], v_HSD.shape[-1])
        out = torch.cat(outs, dim=0) if len(outs) > 1 else outs[0]
        return out if inv is None else out.index_select(0, inv)

    return backend

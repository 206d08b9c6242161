"""Version workarounds, in one place. Each says when it can go.

Nothing here patches another library: these are small adapters the rest of the
package calls instead of the moving upstream API.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["VarlenAttn", "all_gather_single", "reduce_scatter_single", "rope_types", "sub_configs", "torch_varlen_attn"]

# torch 2.13 renamed the single-tensor collectives and deprecated the old names
# (``all_gather_into_tensor``/``reduce_scatter_tensor`` warn on every call).
# Can go when pyproject requires torch >= 2.13.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def sub_configs(config: Any, nested: bool = False) -> list[Any]:
    """The config and its text config; ``nested`` (or where ``get_text_config`` finds several,
    as for musicgen): every config-valued field too (DBRX's ``ffn_config``, a composite's parts)."""
    out = [config]
    if hasattr(config, "get_text_config"):
        try:
            text = config.get_text_config()
        except ValueError:  # several text configs
            text, nested = None, True
        if text is not None and text is not config:
            out.append(text)
    if nested:
        out += [v for c in list(out) for k, v in getattr(c, "__dict__", {}).items()
                if not k.startswith("_") and hasattr(v, "to_dict") and hasattr(v, "model_type") and v not in out]
    return out


def rope_types(config: Any) -> list[str]:
    """RoPE types a config uses (``"default"`` when it declares none).

    Transformers 5 keeps them in ``config.rope_parameters`` (one dict, or one dict per
    layer type, e.g. ``{"full_attention": {...}, "sliding_attention": {...}}``);
    4.x and some remote-code configs use ``rope_scaling`` with ``type`` or
    ``rope_type``. Reading ``rope_scaling`` can go when no supported transformers
    version or checkpoint format carries it (pyproject already requires >= 5.0, but
    remote-code configs still set it).
    """
    found: list[str] = []
    for attr in ("rope_parameters", "rope_scaling"):
        params = getattr(config, attr, None)
        if not isinstance(params, dict):
            continue
        dicts = [params] if ("rope_type" in params or "type" in params) else [
            v for v in params.values() if isinstance(v, dict)
        ]
        for d in dicts:
            t = d.get("rope_type", d.get("type"))
            if t is not None:
                found.append(str(t))
    return found or ["default"]


# ---------------------------------------------------------------------------- torch varlen_attn
# ``torch.nn.attention.varlen.varlen_attn`` (torch's own flash kernels, CUDA, torch >= 2.9)
# changed its signature between releases; the adapter below probes the installed one:
#   2.9:    (q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None)
#   2.10+:  (..., *, return_aux=None, scale=None, window_size=(-1, -1)); causal is
#           ``window_size=(-1, 0)``, a sliding window of W keys ``(W - 1, 0)``
#   2.12+:  adds ``enable_gqa=`` (before it, K/V must have as many heads as Q)
# Every version runs ``aten::_flash_attention_forward`` (torch's vendored flash-attention 2),
# whose mask is bottom-right aligned (mask.h: query row i of a sequence with Lq queries and
# Lk keys sees columns j with i + Lk - Lq - left <= j < i + 1 + Lk - Lq + right), as
# flash-attn >= 2.1: exactly the alignment a chunk paired with its document's key prefix needs.
# The probing can go when pyproject requires a torch whose varlen_attn has ``enable_gqa``.
@dataclass(frozen=True, kw_only=True)
class VarlenAttn:
    """One ``varlen_attn`` function and what its signature accepts.

    Attributes:
        fn: the function (``torch.nn.attention.varlen.varlen_attn``, or a stand-in with one
            of its signatures in tests).
        torch_version: the version named in refusals.
        takes_is_causal, takes_scale, takes_window, takes_gqa: whether ``fn`` accepts
            ``is_causal=``, ``scale=``, ``window_size=``, ``enable_gqa=``.
        cuda_only: refuse tensors that are not on CUDA (torch's kernels have no CPU code).
        dtypes: the input dtypes the kernels take (None: any).
    """

    fn: Callable[..., Any]
    torch_version: str
    takes_is_causal: bool
    takes_scale: bool
    takes_window: bool
    takes_gqa: bool
    cuda_only: bool = True
    dtypes: tuple | None = (torch.float16, torch.bfloat16)

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, torch_version: str | None = None, cuda_only: bool = True,
                      dtypes: tuple | None = (torch.float16, torch.bfloat16)) -> "VarlenAttn":
        """Probe ``fn``'s signature.

        Raises:
            NotImplementedError: ``fn`` can express no causal mask (neither ``is_causal=``
                nor ``window_size=``).
        """
        params = inspect.signature(fn).parameters
        version = torch_version or torch.__version__
        out = cls(fn=fn, torch_version=version, takes_is_causal="is_causal" in params, takes_scale="scale" in params,
                  takes_window="window_size" in params, takes_gqa="enable_gqa" in params, cuda_only=cuda_only,
                  dtypes=dtypes)
        if not (out.takes_is_causal or out.takes_window):
            raise NotImplementedError(
                f"torch {version}'s varlen_attn takes neither is_causal= nor window_size=: it cannot run causal "
                "attention; use attention_backend='sdpa' (or 'flash' with flash-attn)")
        return out

    def __call__(self, q_TND: torch.Tensor, k_TKD: torch.Tensor, v_TKD: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, scale: float | None = None,
                 window: int | None = None) -> torch.Tensor:
        """Bottom-right causal varlen attention, windowed as Transformers' ``sliding_window``
        (query ``i`` sees keys ``i + Lk - Lq - W < j <= i + Lk - Lq``).

        Args:
            q_TND: (total_q, H, D); k_TKD, v_TKD: (total_k, K, D), H a multiple of K.
            cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 boundaries; max_seqlen_q/k their longest.
            scale: softmax scale (``D ** -0.5`` if None).
            window: sliding window W, or None.

        Returns:
            (total_q, H, D).

        Raises:
            ValueError: tensors off CUDA (when ``cuda_only``).
            TypeError: a dtype the kernels do not take.
            NotImplementedError: a window, or a scale other than ``D ** -0.5``, that this
                torch's ``varlen_attn`` cannot express.
        """
        if self.cuda_only and not q_TND.is_cuda:
            raise ValueError(f"attention_backend='varlen' runs torch's flash kernels on CUDA only, got tensors on "
                             f"{q_TND.device.type!r}; set attention_backend='sdpa'")
        if self.dtypes is not None and q_TND.dtype not in self.dtypes:
            raise TypeError(f"attention_backend='varlen' takes {[str(d) for d in self.dtypes]} inputs (torch's flash "
                            f"kernels), got {q_TND.dtype}; train in bfloat16 or set attention_backend='sdpa'")
        kwargs: dict[str, Any] = {}
        D = q_TND.shape[-1]
        if scale is not None:
            if self.takes_scale:
                kwargs["scale"] = float(scale)
            elif not math.isclose(float(scale), D ** -0.5, rel_tol=1e-9):
                raise NotImplementedError(
                    f"torch {self.torch_version}'s varlen_attn has no scale= (added in torch 2.10) and the softmax "
                    f"scale {scale} is not head_dim ** -0.5 = {D ** -0.5}; upgrade torch, or set "
                    "attention_backend='sdpa' (or 'flash' with flash-attn)")
        if window is not None and int(window) < int(max_seqlen_k):
            if not self.takes_window:
                raise NotImplementedError(
                    f"torch {self.torch_version}'s varlen_attn has no window_size= (added in torch 2.10): it cannot "
                    f"run sliding_window={int(window)} over key runs of up to {int(max_seqlen_k)} tokens; upgrade "
                    "torch, or set attention_backend='flex', 'sdpa' (or 'flash' with flash-attn)")
            kwargs["window_size"] = (int(window) - 1, 0)
        elif self.takes_window:
            kwargs["window_size"] = (-1, 0)  # causal; a window covering every key run is causal too
        if self.takes_is_causal:
            kwargs["is_causal"] = True
        H, K = q_TND.shape[1], k_TKD.shape[1]
        if H != K:
            if self.takes_gqa:
                kwargs["enable_gqa"] = True
            else:  # exact: every query head of a group reads the same K/V head (memory: K/V x H/K)
                k_TKD = k_TKD.repeat_interleave(H // K, dim=1)
                v_TKD = v_TKD.repeat_interleave(H // K, dim=1)
        return self.fn(q_TND, k_TKD, v_TKD, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                       **kwargs)


@functools.lru_cache(maxsize=1)
def torch_varlen_attn() -> VarlenAttn | None:
    """The installed ``torch.nn.attention.varlen.varlen_attn``, probed; None before torch 2.9."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    try:
        return VarlenAttn.from_function(varlen_attn)
    except NotImplementedError:
        return None

"""The exactness rule for low-precision attention kernels (GPU tests, ``scripts/device_check.py``).

A kernel in dtype ``t`` cannot match a float64 reference better than rounding allows, and a
fixed tolerance is either too tight for some shapes or loose enough to hide real bugs (one
dropped key out of hundreds, a sliding window off by one). So, as flash-attention's own
tests do, each tensor's error is compared with the error of *plain attention in the same
dtype* against the same reference::

    max|x - ref| <= FACTOR * max|x_plain - ref| + floor,    floor = eps(t) * max(1, max|ref|) / 64

for the output and each gradient (dq, dk, dv), where ``ref`` is float64 attention and
``x_plain`` plain attention (one dense-masked SDPA call over the whole row, or any simple
implementation) run in dtype ``t`` on the same inputs. The floor (1/64 of an ulp at the
tensor's scale) only matters where plain attention is exact; it keeps a zero-error
comparison from failing on the last bit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch

__all__ = ["FACTOR", "FLOOR_ULPS", "TENSORS", "ToleranceCheck", "check_against_plain", "check_errors",
           "max_abs_error"]

#: How many times plain attention's error a kernel may have (flash-attention's tests: 2).
FACTOR = 2.0
#: The absolute floor, in ulps of the dtype at the reference tensor's scale.
FLOOR_ULPS = 1.0 / 64
#: Names of the compared tensors, in order.
TENSORS = ("out", "dq", "dk", "dv")


@dataclass(frozen=True)
class ToleranceCheck:
    """One tensor's comparison.

    Attributes:
        tensor: its name (``out``, ``dq``, ``dk``, ``dv``).
        err: ``max|x - ref|`` of the kernel under test.
        plain_err: ``max|x_plain - ref|`` of plain attention in the same dtype.
        bound: ``FACTOR * plain_err + floor``.
        ratio: ``err / plain_err`` (``inf`` when plain attention is exact and the kernel is not).
        ok: ``err <= bound``.
    """

    tensor: str
    err: float
    plain_err: float
    bound: float
    ratio: float
    ok: bool

    def as_dict(self) -> dict:
        return asdict(self)


def max_abs_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|x - ref|`` in float64 (0 for empty tensors)."""
    if x.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs reference {tuple(ref.shape)}")
    if x.numel() == 0:
        return 0.0
    return (x.detach().to(torch.float64) - ref.detach().to(torch.float64)).abs().max().item()


def check_errors(errs: Sequence[float], plain_errs: Sequence[float], ref_max: Sequence[float], dtype: torch.dtype, *,
                 names: Sequence[str] = TENSORS, factor: float = FACTOR,
                 floor_ulps: float = FLOOR_ULPS) -> list[ToleranceCheck]:
    """The rule on errors measured elsewhere (e.g. plain attention's errors computed once per input).

    Args:
        errs: ``max|x - ref|`` of the kernel per tensor.
        plain_errs: ``max|x_plain - ref|`` of plain attention per tensor.
        ref_max: ``max|ref|`` per tensor (sets the floor).
        dtype: the dtype both ran in (its ``eps`` sets the floor).
        names: tensor names, as many as ``errs``.

    Raises:
        ValueError: sequences of different lengths, or a ``dtype`` that is not floating point.
    """
    if not (len(errs) == len(plain_errs) == len(ref_max) == len(names)):
        raise ValueError(f"need one value per tensor: {len(errs)} errors, {len(plain_errs)} plain errors, "
                         f"{len(ref_max)} reference maxima, {len(names)} names")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype {dtype} is not a floating-point dtype")
    eps = torch.finfo(dtype).eps
    out = []
    for name, e, p, m in zip(names, errs, plain_errs, ref_max):
        e, p = float(e), float(p)
        bound = factor * p + floor_ulps * eps * max(1.0, float(m))
        ratio = e / p if p > 0 else (0.0 if e == 0 else float("inf"))
        out.append(ToleranceCheck(tensor=name, err=e, plain_err=p, bound=bound, ratio=ratio,
                                  ok=bool(e <= bound)))
    return out


def check_against_plain(got: Sequence[torch.Tensor], plain: Sequence[torch.Tensor], ref: Sequence[torch.Tensor], *,
                        names: Sequence[str] = TENSORS, factor: float = FACTOR,
                        floor_ulps: float = FLOOR_ULPS) -> list[ToleranceCheck]:
    """The rule on tensors: ``got`` (kernel under test) and ``plain`` (plain attention), both
    in the same low-precision dtype, against ``ref`` (float64), tensor by tensor.

    Args:
        got: e.g. ``(out, dq, dk, dv)`` of the kernel under test.
        plain: the same tensors from plain attention in ``got``'s dtype.
        ref: the same tensors in float64.

    Returns:
        One :class:`ToleranceCheck` per tensor; all pass iff ``all(c.ok for c in ...)``.

    Raises:
        ValueError: different numbers of tensors or shapes, or ``got`` and ``plain`` in
            different dtypes.
    """
    if not (len(got) == len(plain) == len(ref) == len(names)):
        raise ValueError(f"need one tensor per name {list(names)}: got {len(got)}, plain {len(plain)}, "
                         f"ref {len(ref)}")
    dtypes = {t.dtype for t in got} | {t.dtype for t in plain}
    if len(dtypes) != 1:
        raise ValueError(f"the kernel and plain attention must run in one dtype, got {sorted(map(str, dtypes))}")
    return check_errors([max_abs_error(g, r) for g, r in zip(got, ref)],
                        [max_abs_error(p, r) for p, r in zip(plain, ref)],
                        [r.detach().abs().max().item() if r.numel() else 0.0 for r in ref],
                        dtypes.pop(), names=names, factor=factor, floor_ulps=floor_ulps)

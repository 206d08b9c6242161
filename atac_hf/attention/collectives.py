"""Differentiable asynchronous all-gather of K/V rows for the CP attention.

Forward: every rank contributes ``max_send`` rows (its rows of gathered documents,
zero-padded, so the collective has equal sizes); the all-gather is started at once
and the caller computes something else until it calls :meth:`KVGather.wait`.
Backward: the gradient of the gathered buffer is reduce-scattered (summed) back to
the rank that owns each row.

The buffer is reachable only through :meth:`KVGather.wait`, which waits for the
collective first and may be called once; :func:`attach` ties an unused buffer into
the graph so that every rank runs the backward collective (a rank that skipped it
would leave the others hanging in their reduce-scatter).

Shape legend: R = rows per rank (``max_send``), C = group size, X = any trailing dims.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .compat import all_gather_single, reduce_scatter_single

__all__ = ["AsyncExchange", "KVGather", "attach", "group_device", "peer_failure"]


class AsyncExchange:
    """What every in-flight K/V collective shares: started in ``__init__`` (subclasses set
    ``_send``, ``_group``, ``_buf``, ``_payload`` and ``_work``), waited for exactly once
    through :meth:`wait` (which applies the subclass's autograd ``_WAIT`` function), and
    never left un-waited (its buffer may still be written)."""

    _WAIT: Any = None  # a torch.autograd.Function: forward(send, handle) -> received buffer

    @staticmethod
    def _require_process_group(what: str) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                f"the plan {what} K/V but torch.distributed is not initialized; call "
                "torch.distributed.init_process_group before the forward pass (or use cp_size=1)"
            )

    def wait(self) -> torch.Tensor:
        """Wait for the collective; return the received buffer (differentiable)."""
        if self.waited:
            raise RuntimeError(f"{type(self).__name__}.wait() called twice: each exchange is waited for exactly once")
        self.waited = True
        out = self._WAIT.apply(self._send, self)
        self._send = self._buf = self._work = self._payload = None
        return out

    def __del__(self):  # never leave a collective un-waited (its buffer may still be written)
        if getattr(self, "waited", True) is False and self._work is not None:
            try:
                self._work.wait()
            except RuntimeError:  # a failed peer: the error was (or will be) raised where it was waited for
                pass


class KVGather(AsyncExchange):
    """One in-flight all-gather of ``send_RX`` over ``group``.

    Args:
        send_RX: this rank's rows, the same shape on every rank; may carry autograd history.
        group: the CP process group (None: the default group).

    Raises:
        RuntimeError: ``wait`` called twice, or the default process group is not initialized.
    """

    def __init__(self, send_RX: torch.Tensor, group: Any = None):
        self._require_process_group("all-gathers")
        self._send = send_RX
        self._group = group
        world = dist.get_world_size(group)
        payload = send_RX.detach().contiguous()
        self._buf = torch.empty((world * payload.shape[0], *payload.shape[1:]), dtype=payload.dtype,
                                device=payload.device)
        self._payload = payload  # kept alive until the collective is waited for
        self._work = all_gather_single(self._buf, payload, group=group, async_op=True)
        self.waited = False

    def wait(self) -> torch.Tensor:
        """Wait for the collective; return the gathered (C * R, X) buffer (differentiable)."""
        return super().wait()


def peer_failure(what: str, group: Any, error: BaseException) -> RuntimeError:
    """A clear error for a CP collective that failed because another rank did (raise it ``from error``)."""
    try:
        where = f"rank {dist.get_rank(group)} of {dist.get_world_size(group)}"
    except Exception:  # noqa: BLE001 - only for the message; the group may be unusable now
        where = "this rank"
    return RuntimeError(
        f"atac_cp: the {what} over the CP group failed on {where}: another CP rank crashed, raised or is stuck "
        "(look for the first error in the other ranks' logs), and the process group's timeout ran out or its "
        "connection closed. The timeout is the process group's: init_process_group(timeout=) / new_group(timeout=), "
        f"TrainingArguments(ddp_timeout=), accelerate InitProcessGroupKwargs(timeout=). Cause: {error}"
    )


class _GatherWait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, send_RX: torch.Tensor, handle: KVGather) -> torch.Tensor:
        try:
            handle._work.wait()
        except RuntimeError as e:
            raise peer_failure("forward K/V all-gather", handle._group, e) from e
        ctx.group = handle._group
        ctx.rows = send_RX.shape[0]
        return handle._buf

    @staticmethod
    def backward(ctx, grad_CRX: torch.Tensor):
        grad_RX = torch.empty((ctx.rows, *grad_CRX.shape[1:]), dtype=grad_CRX.dtype, device=grad_CRX.device)
        try:
            reduce_scatter_single(grad_RX, grad_CRX.contiguous(), op=dist.ReduceOp.SUM, group=ctx.group)
        except RuntimeError as e:
            raise peer_failure("backward K/V reduce-scatter", ctx.group, e) from e
        return grad_RX, None


KVGather._WAIT = _GatherWait


class _Attach(torch.autograd.Function):
    """``out`` unchanged; in backward, a zero gradient for ``dep`` (keeps ``dep``'s collective in the graph)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, dep: torch.Tensor) -> torch.Tensor:
        ctx.dep_meta = (dep.shape, dep.dtype, dep.device)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        shape, dtype, device = ctx.dep_meta
        return grad, torch.zeros(shape, dtype=dtype, device=device)


def attach(out: torch.Tensor, dep: torch.Tensor) -> torch.Tensor:
    """Return ``out`` with a graph edge to ``dep`` so that ``dep``'s backward always runs."""
    if not (torch.is_grad_enabled() and dep.requires_grad):
        return out
    return _Attach.apply(out, dep)


def group_device(group: Any = None) -> torch.device:
    """Device for small control tensors of ``group``'s backend (CUDA for NCCL, else CPU)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

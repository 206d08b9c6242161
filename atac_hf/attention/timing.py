"""Timing one CP rank's attention kernels on its real shard, without a process group.

:class:`RankKernel` holds one rank's local Q/K/V (leaves) and the plan's all-gathered
K/V buffer, precomputed by concatenation (as in
:func:`~atac_hf.attention.emulate_cp_attention`), so that calling it runs exactly the
kernels that rank runs in a layer, forward + backward, and nothing else: no
collective and no waiting for another rank. :func:`time_calls` times closures with
CUDA events on CUDA (wall clock on CPU), interleaved round by round.

Shape legend: H query heads, K key/value heads, N tokens of the row, S local tokens,
R gathered rows, D head dim.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch

from ..sharding.plan import ShardPlan
from .backends import run_backend
from .kv_exchange import received_rows
from .runtime import _send_rows, _split

__all__ = ["RankKernel", "gathered_rows", "per_rank_times", "time_calls"]


def gathered_rows(plan: ShardPlan, k_KND: torch.Tensor, v_KND: torch.Tensor) -> torch.Tensor | None:
    """(C * max_send, K, Dk + Dv): what the plan's all-gather returns (every rank's send rows,
    zero-padded, concatenated), or None when the plan gathers nothing."""
    if not len(plan.gathered_docs) or plan.kv_exchange == "all_to_all":  # a2a: one buffer per rank
        return None
    dev = k_KND.device
    sends = []
    for r in range(plan.cp_size):
        lay = plan.local_layout(r)
        tok = torch.as_tensor(plan.rank_token_indices(r), device=dev)
        sends.append(_send_rows(k_KND.index_select(1, tok), v_KND.index_select(1, tok),
                                torch.as_tensor(lay.send_index, device=dev), lay.max_send))
    return torch.cat(sends, dim=0)


class RankKernel:
    """One rank's attention (forward + backward) on its shard; call it to run once.

    Args:
        plan: the shard plan.
        rank: which rank.
        q_HND, k_KND, v_KND: the full row (detached; any dtype/device).
        backend: a key of ``BACKENDS``.
        gathered: :func:`gathered_rows` of the plan (pass it to share one buffer between
            ranks); computed when None and the plan gathers.
        scaling, window: as in the runtime.
        generator: for the random output gradient (same device as the inputs).
    """

    def __init__(self, plan: ShardPlan, rank: int, q_HND: torch.Tensor, k_KND: torch.Tensor, v_KND: torch.Tensor, *,
                 backend: str = "sdpa", gathered: torch.Tensor | None = None, scaling: float | None = None,
                 window: int | None = None, generator: torch.Generator | None = None) -> None:
        dev = q_HND.device
        tok = torch.as_tensor(plan.rank_token_indices(rank), device=dev)
        self.layout = plan.local_layout(rank, window)
        self.q = q_HND.detach().index_select(1, tok).requires_grad_()
        self.k = k_KND.detach().index_select(1, tok).requires_grad_()
        self.v = v_KND.detach().index_select(1, tok).requires_grad_()
        self.dk = k_KND.shape[-1]
        if len(plan.gathered_docs) and plan.kv_exchange == "all_to_all":  # this rank's received rows
            gathered = received_rows(plan, rank, k_KND.detach(), v_KND.detach(), window)
        elif gathered is None and len(plan.gathered_docs):
            gathered = gathered_rows(plan, k_KND.detach(), v_KND.detach())
        self.buf = None if gathered is None else gathered.detach().requires_grad_()
        self.backend, self.window = backend, window
        self.scaling = q_HND.shape[-1] ** -0.5 if scaling is None else float(scaling)
        self.cache: dict = {}
        S, H = self.q.shape[1], self.q.shape[0]
        self.grad_out = torch.randn(S, H, v_KND.shape[-1], device=dev, dtype=q_HND.dtype, generator=generator)

    @property
    def num_tokens(self) -> int:
        return int(self.q.shape[1])

    def _wait(self):
        return _split(self.buf, self.dk)

    def __call__(self) -> None:
        if self.num_tokens == 0:
            return
        out = run_backend(self.backend, self.q, self.k, self.v, self.layout, self.cache,
                          self._wait if self.buf is not None else None, scaling=self.scaling, window=self.window)
        out.backward(self.grad_out)

    def zero_grad(self) -> None:
        for t in (self.q, self.k, self.v, self.buf):
            if t is not None:
                t.grad = None


def time_calls(fns: Sequence[Callable[[], Any]], *, device: Any, warmup: int = 1, repeats: int = 5,
               before: Sequence[Callable[[], Any]] | None = None,
               cpu_clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Seconds of each call, ``repeats`` rounds after ``warmup`` rounds; each round runs every
    closure once in order, each timed alone (CUDA events between synchronisations on CUDA,
    ``cpu_clock`` on CPU: ``time.process_time`` with one torch thread is immune to other
    jobs on a shared machine). ``before[i]`` runs untimed before each call of ``fns[i]``.

    Returns:
        Per closure, its ``repeats`` timings in seconds.
    """
    cuda = torch.device(device).type == "cuda"
    out: list[list[float]] = [[] for _ in fns]
    for rnd in range(warmup + repeats):
        for i, fn in enumerate(fns):
            if before is not None:
                before[i]()
            if cuda:
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 1e3
            else:
                t0 = cpu_clock()
                fn()
                dt = cpu_clock() - t0
            if rnd >= warmup:
                out[i].append(dt)
    return out


def per_rank_times(plan: ShardPlan, q_HND: torch.Tensor, k_KND: torch.Tensor, v_KND: torch.Tensor, *,
                   backend: str = "sdpa", warmup: int = 1, repeats: int = 5, scaling: float | None = None,
                   window: int | None = None, generator: torch.Generator | None = None,
                   cpu_clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Median forward + backward seconds of each rank's attention, each rank timed alone on
    its real shard with the gathered buffer precomputed (one rank's tensors alive at a time)."""
    gathered = gathered_rows(plan, k_KND.detach(), v_KND.detach())
    times = []
    for r in range(plan.cp_size):
        kern = RankKernel(plan, r, q_HND, k_KND, v_KND, backend=backend, gathered=gathered, scaling=scaling,
                          window=window, generator=generator)
        (samples,) = time_calls([kern], device=q_HND.device, warmup=warmup, repeats=repeats,
                                before=[kern.zero_grad], cpu_clock=cpu_clock)
        times.append(statistics.median(samples))
        del kern
    return times

"""Differentiable asynchronous only-needed K/V exchange (all-to-all) for the CP attention.

Forward: every rank sends each other rank exactly the K/V rows that rank's query chunks
attend to (:mod:`atac_hf.sharding.exchange` decides which), in one ``all_to_all_single``
with per-pair counts, started at once; the caller computes the attention of its whole
local documents until it calls :meth:`KVAllToAll.wait`. Backward: the gradient of the
received rows goes back to their owners through the transposed all-to-all (the send
buffer's gradient); a row sent to several ranks gets the sum of their contributions
(``index_select``'s backward adds them up).

The received buffer is reachable only through :meth:`KVAllToAll.wait`, which waits for the
collective first and may be called once; a rank whose chunks use no received row still
ties the buffer into its graph (:func:`~atac_hf.attention.collectives.attach`), so that
every rank takes part in the backward all-to-all.

A node-routed layout (``layout.route``, :mod:`atac_hf.sharding.routing`) runs two of them: the
first (to node proxies, and directly inside a node) overlaps the local attention as above; when it
has landed, the proxies forward inside their node what their peers need (the second); the
backward runs them in reverse, each the transposed all-to-all of its own.

Works on every backend with ``all_to_all_single`` and uneven splits (gloo, NCCL).

Shape legend: N rows sent, M rows received, X any trailing dims (K heads, Dk + Dv).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from ..sharding.plan import LocalLayout
from .collectives import AsyncExchange, peer_failure

__all__ = ["KVAllToAll", "RoutedAllToAll", "received_rows", "start_all_to_all"]


class KVAllToAll(AsyncExchange):
    """One in-flight all-to-all of ``send_NX`` over ``group``.

    Args:
        send_NX: this rank's rows, destination by destination; may carry autograd history.
        send_counts: (C,) rows for each rank (``sum == N``).
        recv_counts: (C,) rows from each rank.
        group: the CP process group (None: the default group).

    Raises:
        RuntimeError: ``wait`` called twice, or torch.distributed is not initialized.
        ValueError: counts that do not match the group size or the send buffer.
    """

    def __init__(self, send_NX: torch.Tensor, send_counts, recv_counts, group: Any = None):
        self._require_process_group("exchanges (all-to-all)")
        world = dist.get_world_size(group)
        self._send_counts = [int(x) for x in send_counts]
        self._recv_counts = [int(x) for x in recv_counts]
        if len(self._send_counts) != world or len(self._recv_counts) != world:
            raise ValueError(f"K/V all-to-all: {len(self._send_counts)} send / {len(self._recv_counts)} receive "
                             f"counts for a group of {world} ranks (the plan is for another cp_size)")
        if sum(self._send_counts) != send_NX.shape[0]:
            raise ValueError(f"K/V all-to-all: send counts sum to {sum(self._send_counts)}, the buffer has "
                             f"{send_NX.shape[0]} rows")
        self._send = send_NX
        self._group = group
        payload = send_NX.detach().contiguous()
        self._buf = torch.empty((sum(self._recv_counts), *payload.shape[1:]), dtype=payload.dtype,
                                device=payload.device)
        self._payload = payload  # kept alive until the collective is waited for
        self._work = dist.all_to_all_single(self._buf, payload, output_split_sizes=self._recv_counts,
                                            input_split_sizes=self._send_counts, group=group, async_op=True)
        self.waited = False

    def wait(self) -> torch.Tensor:
        """Wait for the collective; return the received (M, X) rows (differentiable)."""
        return super().wait()


class _AllToAllWait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, send_NX: torch.Tensor, handle: KVAllToAll) -> torch.Tensor:
        try:
            handle._work.wait()
        except RuntimeError as e:
            raise peer_failure("forward K/V all-to-all", handle._group, e) from e
        ctx.group = handle._group
        ctx.counts = (handle._send_counts, handle._recv_counts)
        return handle._buf

    @staticmethod
    def backward(ctx, grad_MX: torch.Tensor):
        send_counts, recv_counts = ctx.counts
        grad_NX = torch.empty((sum(send_counts), *grad_MX.shape[1:]), dtype=grad_MX.dtype, device=grad_MX.device)
        try:
            dist.all_to_all_single(grad_NX, grad_MX.contiguous(), output_split_sizes=send_counts,
                                   input_split_sizes=recv_counts, group=ctx.group)
        except RuntimeError as e:
            raise peer_failure("backward K/V all-to-all", ctx.group, e) from e
        return grad_NX, None


KVAllToAll._WAIT = _AllToAllWait


class RoutedAllToAll:
    """The node-routed exchange in flight: its first phase started; :meth:`wait` waits for it,
    runs the second (the proxies forward inside their node what their peers need) and returns
    both phases' rows. Like :class:`KVAllToAll`, waited for exactly once (``waited``): a rank whose
    chunks use no received row waits all the same, so every rank joins both phases."""

    def __init__(self, first: KVAllToAll, send2_idx: torch.Tensor, send2_counts, recv2_counts, group: Any):
        self._first, self._idx, self._group = first, send2_idx, group
        self._counts = (send2_counts, recv2_counts)
        self.waited = False

    def wait(self) -> torch.Tensor:
        if self.waited:
            raise RuntimeError("RoutedAllToAll.wait() called twice: each exchange is waited for exactly once")
        self.waited = True
        got = self._first.wait()
        second = KVAllToAll(_rows(got, self._idx), *self._counts, self._group).wait()
        return torch.cat([got, second], dim=0)


def _rows(kv_SKX: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return kv_SKX.index_select(0, index)


def start_all_to_all(k_KSD: torch.Tensor, v_KSD: torch.Tensor, layout: LocalLayout, cache: dict, group: Any,
                     collective: bool) -> tuple[KVAllToAll | RoutedAllToAll | None,
                                                Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    """Start the only-needed exchange of one layer's K/V.

    Args:
        k_KSD, v_KSD: this rank's local keys and values (K heads, S local tokens).
        layout: the rank's ``all_to_all`` :class:`~atac_hf.sharding.plan.LocalLayout`.
        cache: per-batch dict for the index tensors.
        group: the CP process group.
        collective: False when there is no other rank (cp_size 1): the buffer is the own rows.

    Returns:
        ``(handle, wait)``: the in-flight exchange (None without a collective) and a
        function returning the key buffer ``cat([own rows, received rows])`` split into
        (keys (R, K, Dk), values (R, K, Dv)); call it once.
    """
    dev, dk = k_KSD.device, k_KSD.shape[-1]
    key = ("a2a_index", str(dev), layout.window)
    if key not in cache:
        cache[key] = (torch.as_tensor(layout.send_index, device=dev), torch.as_tensor(layout.self_index, device=dev),
                      None if layout.route is None else torch.as_tensor(layout.route["send2"], device=dev))
    send_idx, self_idx, send2_idx = cache[key]
    kv_SKX = torch.cat([k_KSD.transpose(0, 1), v_KSD.transpose(0, 1)], dim=-1)
    own = _rows(kv_SKX, self_idx)
    if not collective:
        return None, lambda: (own[..., :dk], own[..., dk:])
    handle = KVAllToAll(_rows(kv_SKX, send_idx), layout.send_counts, layout.recv_counts, group)
    if send2_idx is not None:  # routed: the proxies forward inside their node once the first phase lands
        handle = RoutedAllToAll(handle, send2_idx, layout.route["send2_counts"], layout.route["recv2_counts"], group)

    def wait() -> tuple[torch.Tensor, torch.Tensor]:
        buf = torch.cat([own, handle.wait()], dim=0)
        return buf[..., :dk], buf[..., dk:]

    return handle, wait


def received_rows(plan, rank: int, k_KND: torch.Tensor, v_KND: torch.Tensor,
                  window: int | None = None) -> torch.Tensor:
    """(R, K, Dk + Dv): the key buffer rank ``rank`` of an ``all_to_all`` plan attends to (its own
    rows of gathered documents, then what every other rank sends it, for a layer with sliding
    window ``window``), built from the full row's keys and values without a process group
    (benchmarks, single-process checks)."""
    from ..sharding.exchange import a2a_rows
    from ..sharding.routing import routed_tables

    dev = k_KND.device
    gathered = plan.gathered_mask()
    tok = plan.rank_token_indices(rank)
    lay = plan.local_layout(rank, window)
    parts = [tok[lay.self_index]]
    if lay.route is not None:  # both phases' rows, by document position
        t = routed_tables(plan.segments, gathered, lay.window, plan.kv_route_node, rank)
        parts.append(plan.doc_offsets[t["recv_docs"]] + t["recv_pos"])
    for s in range(plan.cp_size) if lay.route is None else ():
        if s != rank:
            rows, _, _ = a2a_rows(plan.segments, gathered, s, rank, lay.window)
            parts.append(plan.rank_token_indices(s)[rows])
    idx = torch.as_tensor(np.concatenate(parts), device=dev)
    return torch.cat([k_KND.index_select(1, idx).transpose(0, 1), v_KND.index_select(1, idx).transpose(0, 1)],
                     dim=-1)

"""Lower bounds of ATP's candidates' block times, exact enough to skip building a candidate that
cannot win: the mean exact work of a pack, and the ``per_doc`` layout's block time (all-gather and
all-to-all). Pure numpy; used by :func:`~atac_hf.sharding.atp.plan_atp`.
"""

from __future__ import annotations

import numpy as np

from ..cost import CostModel
from .baselines import per_doc_block_time
from .segments import _cheapest, _exact_pairs


def _work_lower_bound(lengths: np.ndarray, C: int, cm: CostModel, pairs: np.ndarray | None = None) -> float:
    """A lower bound of any plan's per-rank compute: the exact causal pairs (no tile waste, at the
    cheaper of the causal and masked prices, no per-call overhead) and the token-wise work of the
    pack, spread evenly over the ``C`` ranks. Splitting a document never lowers either term.
    ``pairs``: :func:`_exact_pairs` of the pack, where the caller has it."""
    pairs = float((_exact_pairs(lengths, cm) if pairs is None else pairs).sum())
    price = _cheapest(cm.attn_s_per_pair, cm.masked_attn_s_per_pair)
    return (pairs * price + float(lengths.sum()) * cm.linear_s_per_token) / C


def _per_doc_lower_bound(lengths: np.ndarray, C: int, cm: CostModel, work: float | None = None,
                         comm: float | None = None) -> float:
    """A lower bound of the per_doc layout's block time, without costing its chunks: it gathers
    every document of 2+ tokens and only rank 0 holds local (1-token) documents, so every other
    rank waits for the whole exchange; summed over the ranks, the block time is at least all the
    compute (>= C x the work lower bound) plus the exchange on C - 1 ranks. ``work``:
    :func:`_work_lower_bound`, where the caller has it; ``comm``: the exchange's time (default:
    the all-gather's), or a lower bound of it."""
    if comm is None:
        split = lengths >= 2
        comm = float(cm.comm_cost(int(lengths[split].sum()), C)) if split.any() else 0.0
    return (_work_lower_bound(lengths, C, cm) if work is None else work) + (C - 1) * comm / C


def _per_doc_a2a_floor(lengths: np.ndarray, C: int, cm: CostModel) -> float:
    """A lower bound of the per_doc layout's all-to-all exchange time (the ``"auto"`` exchange
    prices the layout with it where it is estimated faster than the all-gather): rank 0 holds the
    first and the last chunk of every document it splits (chunks 0 and 2C - 1 of
    :func:`~atac_hf.sharding.segments.head_tail_bounds`), and where that last chunk is not empty
    it needs the keys before it (inside the sliding window) that other ranks hold; the busiest
    rank receives at least those rows, over its two links at once where ranks span nodes."""
    if C < 2:
        return 0.0
    base, rem = np.divmod(lengths, 2 * C)
    extra = rem // C + (rem % C > 0)  # rank 0 takes a share of the remainder first
    tail = base + extra // 2  # rank 0's last chunk [L - tail, L), its head [0, base + (extra + 1) // 2)
    if cm.exchange_window is None:  # the keys between its head and its last chunk: L - head - tail
        rows = int((lengths - 2 * base - extra)[tail > 0].sum())
    else:
        start = lengths - tail
        lo = np.maximum(base + (extra + 1) // 2, start - int(cm.exchange_window) + 1)
        rows = int(np.maximum(start - lo, 0)[tail > 0].sum())
    if rows == 0:
        return 0.0
    bw = cm.link_bandwidth
    if cm.node_size is not None:  # rows within a node and across nodes travel at once (a2a_pair_cost)
        bw += cm.link_bandwidth if cm.intra_node_bandwidth is None else cm.intra_node_bandwidth
    return 2.0 * (cm.link_latency_s * (C - 1) + rows * cm.kv_bytes_per_token / bw)


def _per_doc_may_win(lengths: np.ndarray, C: int, cm: CostModel, work: float, threshold: float) -> bool:
    """Whether ATP's per_doc candidate (head-tail inside every document, its exchange priced as
    ``"auto"`` prices it: the all-gather, or the all-to-all where that is estimated faster) can
    have a block time under ``threshold``, without building it. Its all-gather block time
    (:func:`per_doc_block_time`) and lower bound are exact for the all-gather; the all-to-all can
    only be cheaper by the gap down to :func:`_per_doc_a2a_floor`, and the block time, a max over
    ranks of compute plus the exposed exchange, falls by at most what the exchange falls by."""
    split = lengths >= 2
    comm = float(cm.comm_cost(int(lengths[split].sum()), C)) if split.any() else 0.0
    floor = None
    if _per_doc_lower_bound(lengths, C, cm, work, comm) >= threshold:
        floor = min(comm, _per_doc_a2a_floor(lengths, C, cm))
        if _per_doc_lower_bound(lengths, C, cm, work, floor) >= threshold:
            return False
    block = per_doc_block_time(lengths, C, cm)
    if block < threshold:
        return True
    if floor is None:
        floor = min(comm, _per_doc_a2a_floor(lengths, C, cm))
    return block - (comm - floor) < threshold

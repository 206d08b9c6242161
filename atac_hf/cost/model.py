"""The cost model: token counts -> seconds, for one transformer layer, forward + backward.

Every planner (packing, sharding) and the simulator cost work through
:meth:`CostModel.segment_cost`; nothing else hard-codes a cost formula.

A *segment* is a run of query rows ``[start, end)`` of one document, attending
causally to that document's keys ``[0, end)`` (bottom-right aligned). A whole
document of length ``L`` is the segment ``[0, L)``; a chunk of a document
sharded over a context-parallel group is ``[start, end)`` with ``start > 0``.

Attention work is counted in causal (query, key) pairs actually computed by a
tiled kernel: query rows are cut into tiles of ``tile`` rows starting at
``start``, keys into tiles starting at 0, and every key tile that holds at least
one visible key for a query tile counts as ``tile * tile`` pairs. With
``tile=1`` this is the exact number of causal pairs.

Numpy only.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from . import profile
from .presets import HardwarePreset, ModelDims, model_label, resolve_hardware, resolve_model
from .presets import _is_int, _is_real, _short  # the same checks and message reprs as the presets'

__all__ = ["CostModel", "default_cost_model"]

# Forward + backward FLOPs relative to forward: 3x for matmuls (dX and dW);
# flash-attention backward recomputes P and does 4 matmuls against 2 forward: 3.5x.
_LINEAR_FWD_BWD = 3.0
_ATTN_FWD_BWD = 3.5
#: Largest price accepted (seconds per token, pair or call): real ones are under a millisecond.
MAX_PRICE_S = 1e6
#: Segment ends up to which pair counts are computed in int64 (squares stay below 2**63).
_INT_PAIRS_MAX = 2**31


def _window_mix(pairs: np.ndarray, band: np.ndarray, share: float) -> np.ndarray:
    """Pairs of a layer mix: ``share`` of the layers compute the window's ``band`` (at most the
    causal ``pairs``), the others every causal pair."""
    windowed = np.minimum(pairs, band)
    return windowed if share == 1 else share * windowed + (1 - share) * pairs


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Seconds for one transformer layer, forward + backward, on one device.

    Attributes:
        linear_s_per_token: projections, MLP, norms: seconds per token.
        attn_s_per_pair: seconds per computed causal (query, key) pair.
        segment_overhead_s: fixed seconds per attention segment (kernel launch,
            small-chunk overhead).
        tile: kernel tile edge in tokens (128 on GPU; 1 for exact pair counts).
        kv_bytes_per_token: bytes of K and V of one token in one layer
            (``2 * num_kv_heads * head_dim * dtype_bytes``).
        link_bandwidth: bytes/s one rank receives over the CP link.
        link_latency_s: latency of one collective step.
        sliding_window: attention window in tokens (keys ``(i - w, i]``), or None.
        name: a label for reports.
        masked_attn_s_per_pair: seconds per pair of a *masked* segment, one a plain causal
            kernel cannot run: a chunk that does not start at its document's first token, or
            a segment longer than the sliding window. The ``sdpa`` backend runs those on other
            kernels (on CPU, big chunks as two unmasked kernels merged by log-sum-exp and
            small ones as one masked call; elsewhere, and under a window, masked blocks of
            query rows, which compute and mask whole rectangles: see ``mask_block``). None:
            the same as ``attn_s_per_pair`` (the CPU merge, or kernels with native
            bottom-right causal masking such as flash-attn's varlen kernel).
        masked_segment_overhead_s: fixed seconds per kernel call of a masked segment (the
            ``sdpa`` backend's chunk kernels are several calls with more set-up than one
            causal call); None: ``segment_overhead_s``.
        mask_block: query rows per masked kernel call (the ``sdpa`` backend's row blocks);
            each call computes its rows against every key up to its last row, so a masked
            segment of ``n`` rows computes about ``n * (mask_block - 1) / 2`` pairs beyond
            the causal ones, and pays the per-call overhead once per block. 0: masked
            segments are one call and compute only their causal pairs.
        node_size: CP ranks per node (ranks ``[k * node_size, (k + 1) * node_size)`` share
            node ``k``), or None: one link for the whole group. With it, the all-to-all K/V
            exchange prices rows between ranks of one node at ``intra_node_bandwidth`` and the
            others at ``link_bandwidth`` (the all-gather ring is priced at ``link_bandwidth``,
            its slowest hop, either way).
        intra_node_bandwidth: bytes/s one rank receives from a rank of its own node (None:
            ``link_bandwidth``).
        sliding_window_share: the share of layers (of their attention) within ``sliding_window``,
            in (0, 1]; the others attend to whole prefixes (Gemma 2/3, GPT-OSS, Qwen2's
            ``max_window_layers``). Their pairs are priced as that mixture, and the K/V exchange
            as the whole prefixes the full layers need (:attr:`exchange_window`).
    """

    linear_s_per_token: float
    attn_s_per_pair: float
    segment_overhead_s: float = 0.0
    tile: int = 128
    kv_bytes_per_token: float = 0.0
    link_bandwidth: float = 100e9
    link_latency_s: float = 10e-6
    sliding_window: int | None = None
    name: str = "custom"
    masked_attn_s_per_pair: float | None = None
    masked_segment_overhead_s: float | None = None
    mask_block: int = 0
    node_size: int | None = None
    intra_node_bandwidth: float | None = None
    sliding_window_share: float = 1.0

    def __post_init__(self) -> None:
        # Bounds keep every cost finite: at most 2**62 tokens (pairs < 2**124) times a price of
        # at most MAX_PRICE_S stays far below float's 1.8e308.
        for f in ("linear_s_per_token", "attn_s_per_pair", "segment_overhead_s", "link_latency_s",
                  "masked_attn_s_per_pair", "masked_segment_overhead_s"):
            v = getattr(self, f)
            if v is None and f.startswith("masked_"):
                continue
            if not _is_real(v) or not math.isfinite(v) or not 0 <= v <= MAX_PRICE_S:
                what = "None or " if f.startswith("masked_") else ""
                raise ValueError(f"CostModel.{f} must be {what}a finite number >= 0 (seconds, at most "
                                 f"{MAX_PRICE_S:g}), got {_short(v)}")
        if not _is_real(self.kv_bytes_per_token) or not 0 <= self.kv_bytes_per_token <= 2.0**40:
            raise ValueError(f"CostModel.kv_bytes_per_token must be a finite number >= 0 (bytes, at most 2**40), "
                             f"got {_short(self.kv_bytes_per_token)}")
        if not _is_real(self.link_bandwidth) or not 1.0 <= self.link_bandwidth <= 1e18:
            raise ValueError(f"CostModel.link_bandwidth must be > 0 bytes/s (from 1 to 1e18), "
                             f"got {_short(self.link_bandwidth)}")
        for f, low, legal in (("tile", 1, "an int >= 1 (128 on GPU, 1 for exact)"),
                              ("mask_block", 0, "an int >= 0 (0: one call per masked segment)")):
            v = getattr(self, f)
            if not _is_int(v) or not low <= v <= 2**20:
                raise ValueError(f"CostModel.{f} must be {legal}, at most 2**20, got {_short(v)}")
        if self.sliding_window is not None and (not _is_int(self.sliding_window)
                                                or not 1 <= self.sliding_window <= 2**62):
            raise ValueError(f"CostModel.sliding_window must be None or an int >= 1, got {_short(self.sliding_window)}")
        if self.node_size is not None and (not _is_int(self.node_size) or not 1 <= self.node_size <= 2**20):
            raise ValueError(f"CostModel.node_size must be None or an int >= 1 (CP ranks per node), "
                             f"got {_short(self.node_size)}")
        if self.intra_node_bandwidth is not None and (not _is_real(self.intra_node_bandwidth)
                                                      or not 1.0 <= self.intra_node_bandwidth <= 1e18):
            raise ValueError(f"CostModel.intra_node_bandwidth must be None or > 0 bytes/s (from 1 to 1e18), "
                             f"got {_short(self.intra_node_bandwidth)}")
        if not _is_real(self.sliding_window_share) or not 0 < self.sliding_window_share <= 1:
            raise ValueError(f"CostModel.sliding_window_share must be a number in (0, 1] (the share of layers "
                             f"within sliding_window), got {_short(self.sliding_window_share)}")
        if not isinstance(self.name, str):
            raise TypeError(f"CostModel.name must be a str, got {type(self.name).__name__}")

    @property
    def exchange_window(self) -> int | None:
        """The sliding window the K/V exchange is priced for: ``sliding_window`` where every layer
        slides, else None (a full-attention layer needs whole key prefixes)."""
        return self.sliding_window if self.sliding_window_share == 1 else None

    @property
    def prices_compute(self) -> bool:
        """Whether any token-wise, attention or per-call work costs more than 0 s. A model that
        prices all of it at zero (only the K/V link, e.g. for costing communication alone)
        cannot balance anything: planners refuse it (see :meth:`check_prices_compute`)."""
        return any(bool(v) for v in (self.linear_s_per_token, self.attn_s_per_pair, self.segment_overhead_s,
                                     self.masked_attn_s_per_pair, self.masked_segment_overhead_s))

    def check_prices_compute(self, setting: str = "the cost model / cost_profile") -> None:
        """Raise ValueError when :attr:`prices_compute` is False (every planner calls this)."""
        if not self.prices_compute:
            raise ValueError(
                f"cost model {_short(self.name)} prices all work at 0 s (linear_s_per_token, attn_s_per_pair and "
                "segment_overhead_s are 0): every plan would look balanced, whatever its tokens; use a "
                f"calibrated profile (`atac-hf calibrate`) or a preset (check {setting})")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_model(
        cls,
        model: ModelDims | str | Any,
        hardware: str | HardwarePreset = "H100",
        *,
        efficiency: float = 0.5,
        attn_efficiency: float | None = None,
        dtype_bytes: int = 2,
        tp_size: int = 1,
        inter_node: bool = False,
        segment_overhead_s: float = 15e-6,
        tile: int = 128,
    ) -> "CostModel":
        """Build a cost model from model dimensions and a hardware preset.

        Args:
            model: a :class:`ModelDims`, a key of :data:`MODEL_PRESETS`, or an HF config.
            hardware: a key of :data:`HARDWARE_PRESETS` or a :class:`HardwarePreset`.
            efficiency: achieved share of peak FLOP/s for the linear part.
            attn_efficiency: achieved share of peak for attention (default: ``efficiency``).
            dtype_bytes: bytes per K/V element on the wire.
            tp_size: tensor-parallel degree (divides heads and weights).
            inter_node: use the inter-node bandwidth for the CP link.
            segment_overhead_s: fixed cost per attention segment, fwd+bwd.
            tile: kernel tile edge.

        Raises:
            ValueError: unknown preset names, efficiencies outside (0, 1].
        """
        dims = resolve_model(model)
        hw = resolve_hardware(hardware)
        attn_eff = efficiency if attn_efficiency is None else attn_efficiency
        for name, v in (("efficiency", efficiency), ("attn_efficiency", attn_eff)):
            if not _is_real(v) or not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1] (a number), got {_short(v)}")
        for name, v, high in (("dtype_bytes", dtype_bytes, 64), ("tp_size", tp_size, 2**20)):
            if not _is_int(v) or not 1 <= v <= high:
                raise ValueError(f"{name} must be an int from 1 to {high}, got {_short(v)}")
        if not isinstance(inter_node, (bool, np.bool_)):
            raise TypeError(f"inter_node must be True or False, got {_short(inter_node)}")
        if tp_size < 1 or dims.num_heads % tp_size:
            raise ValueError(f"tp_size={tp_size} must be >= 1 and divide num_heads={dims.num_heads}")
        linear_flops = 2.0 * _LINEAR_FWD_BWD * dims.params_per_layer / tp_size
        # QK^T (head_dim) and PV (the values' width): 2 FLOPs per multiply-add, per head.
        v_dim = dims.head_dim if dims.v_head_dim is None else dims.v_head_dim
        attn_flops = 2.0 * _ATTN_FWD_BWD * dims.num_heads * (dims.head_dim + v_dim) / tp_size
        kv_heads = max(1, dims.num_kv_heads // tp_size)
        share = dims.window_share
        return cls(
            linear_s_per_token=linear_flops / (hw.bf16_flops * efficiency),
            attn_s_per_pair=attn_flops / (hw.bf16_flops * attn_eff),
            segment_overhead_s=segment_overhead_s,
            tile=tile,
            kv_bytes_per_token=1.0 * kv_heads * (dims.head_dim + v_dim) * dtype_bytes,
            link_bandwidth=hw.inter_node_bw if inter_node else hw.intra_node_bw,
            link_latency_s=hw.link_latency_s,
            sliding_window=dims.sliding_window if share > 0 else None,
            sliding_window_share=share if share > 0 else 1.0,
            name=f"{model_label(model)}@{hw.name}",
        )

    @classmethod
    def from_profile(cls, path: str | os.PathLike) -> "CostModel":
        """Load a calibration profile written by :meth:`save` (JSON; never executes code)."""
        return profile.load_profile(cls, path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>") -> "CostModel":
        """Build the model from a profile's JSON object (see :mod:`atac_hf.cost.profile`)."""
        return profile.model_from_dict(cls, data, source=source)

    def to_dict(self, **metadata: Any) -> dict[str, Any]:
        """This model as a profile JSON object, ``metadata`` kept beside it."""
        return profile.model_to_dict(self, **metadata)

    def save(self, path: str | os.PathLike, **metadata: Any) -> None:
        """Write this model as a JSON profile; ``metadata`` (device, model, fit error) is kept beside it."""
        profile.save_profile(self, path, **metadata)

    def replace(self, **changes: Any) -> "CostModel":
        """This model with ``changes`` applied; an unknown field is a TypeError naming the legal fields."""
        legal = [f.name for f in dataclasses.fields(self)]
        unknown = [k for k in changes if k not in legal]
        if unknown:
            raise TypeError(f"CostModel.replace got unknown fields {unknown}; legal fields: {legal}")
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ costing
    def attention_pairs(self, start: Any, end: Any) -> np.ndarray:
        """Tile-quantised causal pairs for query rows ``[start, end)`` against keys ``[0, end)``.

        Vectorised over ``start``/``end`` (broadcastable int arrays). Empty segments give 0.
        """
        return self._pairs(np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64))[1]

    def _pairs(self, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(n, pairs, nonempty)`` of int64 segments ``[s, e)``: rows ``max(e - s, 0)``, tile-quantised
        pairs (float64) and ``n > 0``. One pass shared by every costing method: the planners cost
        arrays of 10-100 segments, where each numpy operation (about 1 us) costs more than its
        arithmetic, so the rows and the non-empty mask are computed once, not per method."""
        n = np.maximum(e - s, 0)
        nonempty = n > 0
        t = self.tile
        if e.size and int(e.max()) > _INT_PAIRS_MAX:  # products past int64: the same formulas in float64
            return self._pairs_float(s, e, n, nonempty)
        if t == 1:
            pairs = n * s + n * (n + 1) // 2
        else:
            k = int(t).bit_length() - 1
            # query tile i < nq - 1 (nq = ceil(n/t) query tiles) sees keys [0, s + (i+1) t):
            # ceil(s/t) + i + 1 key tiles; the last query tile sees ceil(e/t) key tiles.
            if t == 1 << k:  # the ceilings as shifts (the same integers, fewer and cheaper ops)
                # m = max(nq - 1, 0) = max(floor((n - 1) / t), 0); c1 = ceil(s/t) + 1 = floor((s + 2t - 1) / t)
                m = np.maximum((n - 1) >> k, 0)
                c1, last = (s + (2 * t - 1)) >> k, (e + (t - 1)) >> k
            else:
                m = np.maximum(-(-n // t) - 1, 0)
                c1, last = -(-s // t) + 1, -(-e // t)
            tiles = m * c1 + ((m * (m - 1)) >> 1) + np.where(nonempty, last, 0)
            pairs = tiles * (t * t)
        pairs = pairs.astype(np.float64)
        if self.sliding_window is not None:
            # query i sees keys (i - w, i]; a tiled kernel rounds each row's band up by < one tile.
            w = int(self.sliding_window)

            def prefix(x: np.ndarray) -> np.ndarray:  # sum_{i<x} min(i + 1, w)
                a = np.minimum(x, w)
                return a * (a + 1) // 2 + np.maximum(x - w, 0) * w

            band = (prefix(e) - prefix(s)).astype(np.float64) + (n * (t - 1) if t > 1 else 0)
            pairs = _window_mix(pairs, band, self.sliding_window_share)
        return n, pairs, nonempty

    def _pairs_float(self, s: np.ndarray, e: np.ndarray, n: np.ndarray,
                     nonempty: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_pairs` for segments ending past ``_INT_PAIRS_MAX`` (2**31), where int64 pair counts
        overflow: the same counts in float64 (exact up to 2**53, then rounded, never wrapped)."""
        sf, ef, nf, t = s.astype(np.float64), e.astype(np.float64), n.astype(np.float64), float(self.tile)
        if t == 1:
            pairs = nf * sf + nf * (nf + 1) / 2
        else:
            m = np.maximum(np.ceil(nf / t) - 1, 0)
            tiles = m * (np.ceil(sf / t) + 1) + m * (m - 1) / 2 + np.where(nonempty, np.ceil(ef / t), 0)
            pairs = tiles * (t * t)
        if self.sliding_window is not None:
            w = float(self.sliding_window)

            def prefix(x: np.ndarray) -> np.ndarray:  # sum_{i<x} min(i + 1, w)
                a = np.minimum(x, w)
                return a * (a + 1) / 2 + np.maximum(x - w, 0) * w

            pairs = _window_mix(pairs, prefix(ef) - prefix(sf) + (nf * (t - 1) if t > 1 else 0), self.sliding_window_share)
        return n, pairs, nonempty

    @property
    def models_masking(self) -> bool:
        """Whether masked segments cost differently from causal ones (see ``masked_attn_s_per_pair``)."""
        return (self.masked_attn_s_per_pair is not None or self.masked_segment_overhead_s is not None
                or self.mask_block > 0)

    def needs_mask(self, start: Any, end: Any) -> np.ndarray:
        """Bool: which non-empty segments ``[start, end)`` a causal kernel cannot run unmasked
        (a chunk after its document's first token, or longer than the sliding window)."""
        s = np.asarray(start, dtype=np.int64)
        e = np.asarray(end, dtype=np.int64)
        masked = s > 0
        if self.sliding_window is not None:
            masked = masked | (e > int(self.sliding_window))
        return masked & (e > s)

    def attention_cost(self, start: Any, end: Any) -> np.ndarray:
        """Seconds of attention (work + per-call overhead) of segments ``[start, end)``."""
        s = np.asarray(start, dtype=np.int64)
        e = np.asarray(end, dtype=np.int64)
        return self._attention(s, e, *self._pairs(s, e))

    def _attention(self, s: np.ndarray, e: np.ndarray, n: np.ndarray, pairs: np.ndarray,
                   nonempty: np.ndarray) -> np.ndarray:
        """:meth:`attention_cost` of int64 segments ``[s, e)`` given their :meth:`_pairs`."""
        calls = nonempty.astype(np.float64)
        if not self.models_masking:
            return pairs * self.attn_s_per_pair + calls * self.segment_overhead_s
        masked = self.needs_mask(s, e)
        b = int(self.mask_block)
        if b:
            # each call of b rows computes the rectangle up to its last row: the causal
            # pairs plus a triangle of b (b - 1) / 2 per full block, r (r - 1) / 2 for the rest.
            r = n % b
            waste = (n // b) * (b * (b - 1) // 2) + r * (r - 1) // 2
            calls = np.where(masked, -(-n // b), calls)
            pairs = pairs + np.where(masked, waste, 0)
        per_pair = np.where(masked, self.attn_s_per_pair if self.masked_attn_s_per_pair is None
                            else self.masked_attn_s_per_pair, self.attn_s_per_pair)
        per_call = np.where(masked, self.segment_overhead_s if self.masked_segment_overhead_s is None
                            else self.masked_segment_overhead_s, self.segment_overhead_s)
        return pairs * per_pair + calls * per_call

    def segment_cost(self, start: Any, end: Any) -> np.ndarray:
        """Seconds (fwd+bwd, one layer) of segments: linear + attention + overhead.

        The one costing function: a document of length L is ``segment_cost(0, L)``,
        a chunk of a sharded document is ``segment_cost(start, end)``, and a pack is
        the sum over its documents (:meth:`pack_cost`).
        """
        return self.segment_and_attention_cost(start, end)[0]

    def segment_and_attention_cost(self, start: Any, end: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(segment_cost(start, end), attention_cost(start, end))``, the attention costed once."""
        s = np.asarray(start, dtype=np.int64)
        e = np.asarray(end, dtype=np.int64)
        n, pairs, nonempty = self._pairs(s, e)
        attn = self._attention(s, e, n, pairs, nonempty)
        return n * self.linear_s_per_token + attn, attn

    def doc_cost(self, lengths: Any) -> np.ndarray:
        """Seconds of whole documents of the given lengths (ints or integral floats; the planners' hot path)."""
        a = np.asarray(lengths)
        if a.dtype.kind not in "iu" and a.size and not (a.dtype.kind == "f" and np.isfinite(a).all()
                                                         and (a == np.round(a)).all()):  # never truncated into a price
            first = a.flat[0]
            raise TypeError(f"doc_cost lengths must be ints (token counts), got dtype {a.dtype} (e.g. "
                            f"{_short(first.item() if isinstance(first, np.generic) else first)})")
        return self.segment_cost(np.zeros(a.shape, np.int64), a.astype(np.int64, copy=False))

    def pack_cost(self, lengths: Any) -> float:
        """Seconds of one pack holding whole documents of the given lengths (ints >= 0)."""
        a, costs = np.asarray(lengths), self.doc_cost(lengths)
        if a.size and a.min() < 0:
            raise ValueError(f"pack_cost lengths[{int(np.argmin(a))}] = {_short(a.min().item())} is negative: "
                             "document lengths must be token counts >= 0")
        return float(costs.sum())

    def comm_cost(self, kv_tokens: Any, cp_size: int) -> np.ndarray:
        """Seconds of the K/V all-gather (forward) plus reduce-scatter of its gradient (backward).

        ``kv_tokens`` is the total number of tokens, over the whole CP group, whose K/V
        travel; with a ring, each rank receives ``(C - 1) / C`` of them.
        """
        if type(kv_tokens) in (int, float) and (type(cp_size) is int or _is_int(cp_size)) and cp_size > 1:
            # one number (the planners' calls: a plan's gathered tokens): the same IEEE arithmetic in
            # Python floats, in the same order, without numpy's per-call overhead (about 10 ops of 1 us)
            kv = float(kv_tokens)
            if 0 < kv < math.inf:
                return np.float64(2.0 * (self.link_latency_s * (cp_size - 1) + kv * self.kv_bytes_per_token
                                         * (cp_size - 1) / cp_size / self.link_bandwidth))
            if kv <= 0:  # (a count <= 0 costs nothing, as on the array path)
                return np.float64(0.0)
            raise ValueError(f"comm_cost kv_tokens={_short(kv_tokens)}: kv_tokens must be finite token counts")
        _check_cp_size(cp_size)
        raw = np.asarray(kv_tokens)
        kv = raw.astype(np.float64)
        if raw.dtype.kind not in "iu" and not np.isfinite(kv).all():  # (a planner's ints: no scan)
            raise ValueError(f"comm_cost kv_tokens holds {kv[~np.isfinite(kv)].flat[0].item()}: kv_tokens must be "
                             "finite token counts")
        if cp_size <= 1:
            return np.zeros_like(kv)
        bytes_in = kv * self.kv_bytes_per_token * (cp_size - 1) / cp_size
        one_way = np.where(kv > 0, self.link_latency_s * (cp_size - 1) + bytes_in / self.link_bandwidth, 0.0)
        return 2.0 * one_way

    def a2a_comm_cost(self, max_rank_tokens: Any, cp_size: int) -> np.ndarray:
        """Seconds of the only-needed K/V exchange (forward all-to-all with per-pair counts,
        plus the transposed all-to-all of its gradient in backward).

        ``max_rank_tokens`` is the most K/V rows any rank receives or sends (the slowest
        rank's link sets the time); ``cp_size - 1`` peers each cost one latency.
        """
        _check_cp_size(cp_size)
        kv = np.asarray(max_rank_tokens, dtype=np.float64)
        if cp_size <= 1:
            return np.zeros_like(kv)
        one_way = np.where(kv > 0, self.link_latency_s * (cp_size - 1) + kv * self.kv_bytes_per_token
                           / self.link_bandwidth, 0.0)
        return 2.0 * one_way

    def a2a_pair_cost(self, rows: Any) -> float:
        """Seconds of the all-to-all K/V exchange (forward + backward) given ``rows[s, r]``, the
        K/V rows rank ``s`` sends rank ``r`` ((C, C)). Each rank's time is that of its busiest
        link, receiving or sending: rows within its node at ``intra_node_bandwidth``, the rest at
        ``link_bandwidth`` (the two links run at once); the slowest rank sets the time. Without
        ``node_size`` this is :meth:`a2a_comm_cost` of the most rows a rank receives or sends.
        """
        m = np.asarray(rows, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise ValueError(f"a2a_pair_cost rows={_short(rows)} of shape {m.shape} must be a (C, C) array (K/V rows)")
        C = m.shape[0]
        if C <= 1 or not m.any():
            return 0.0
        if self.node_size is None:  # a2a_comm_cost of the busiest rank, in Python floats (the same arithmetic)
            kv = float(max(m.sum(axis=0).max(), m.sum(axis=1).max()))
            return 2.0 * (self.link_latency_s * (C - 1) + kv * self.kv_bytes_per_token / self.link_bandwidth) \
                if kv > 0 else 0.0
        node = np.arange(C) // int(self.node_size)
        same = node[:, None] == node[None, :]
        intra_bw = self.link_bandwidth if self.intra_node_bandwidth is None else self.intra_node_bandwidth
        busiest = 0.0
        for mat in (m, m.T):  # sending (rows), receiving (columns)
            t = np.maximum((mat * same).sum(axis=1) / intra_bw, (mat * ~same).sum(axis=1) / self.link_bandwidth)
            busiest = max(busiest, float(t.max()))
        return 2.0 * (self.link_latency_s * (C - 1) + busiest * self.kv_bytes_per_token)


def _check_cp_size(cp_size: Any) -> None:
    """``cp_size`` of the communication prices: an int >= 1 (the context-parallel group size)."""
    ok = _is_int(cp_size)
    if not ok or cp_size < 1:
        raise (ValueError if ok else TypeError)(f"cp_size={_short(cp_size)} is {'too small' if ok else 'not an int'}: "
                                                "cp_size must be an int >= 1 (the context-parallel group size)")


def default_cost_model() -> CostModel:
    """The model planners use when none is given: a Llama-3-8B-like layer on an H100."""
    return CostModel.from_model("8b", "H100")


def scale_attention_price(cost_model: CostModel, factor: float, *, name: str | None = None) -> CostModel:
    """``cost_model`` with every attention pair price (causal and masked) times ``factor`` (> 0),
    each capped at :data:`MAX_PRICE_S`: the planners' what-ifs (a price band, ATP's 0.25x-4x check)
    stay valid models for every price a model may hold (a 4x of a legal 6e5 s is not a user's
    setting to refuse). ``name``: the scaled model's name (default: the model's own)."""
    masked = cost_model.masked_attn_s_per_pair
    fields = dict(attn_s_per_pair=min(cost_model.attn_s_per_pair * factor, MAX_PRICE_S),
                  masked_attn_s_per_pair=None if masked is None else min(masked * factor, MAX_PRICE_S))
    return cost_model.replace(**fields, **({} if name is None else {"name": name}))

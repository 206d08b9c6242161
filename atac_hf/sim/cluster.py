"""`ClusterConfig`: the training cluster the simulator runs a workload on.

Mesh order (Megatron's, innermost first): TP, CP, DP, PP. A group whose ranks fit
in one node (``gpus_per_node``) talks over the intra-node link, otherwise over the
network: the CP group spans ``tp x cp`` GPUs, the gradient all-reduce spans
``tp x cp x dp`` GPUs (``cp x dp`` ranks hold the same parameters), and pipeline
hops cross nodes once ``tp x cp x dp >= gpus_per_node``.

Tensor parallelism is priced the way Megatron-style TP (and transformers' ``tp_plan``:
column-wise q/k/v/gate/up, row-wise o/down) runs it: heads, weights and the MLP are
divided over TP (the cost model's compute and K/V bytes per token), each CP rank
exchanges only its local K/V heads within its CP group, and every layer adds 2 ring
all-reduces of ``tokens x hidden`` activations in the forward and 2 in the backward over
the TP group (:meth:`ClusterConfig.tp_comm_s_per_token`, not overlapped).

Runnable or what-if (:meth:`ClusterConfig.what_if_reasons`): the atac-hf integration runs
DP (replicated or FSDP2-sharded), CP and TP (``ParallelismConfig(dp_replicate, dp_shard,
tp, cp)``); a layout it cannot run (pipeline parallelism: HF has none) is a what-if.
The integration runs TP with plain DDP only (it refuses FSDP x TP), FSDP2 without TP: a
layout whose model states cannot fit in GPU memory that way is a what-if too. The simulator
does not otherwise tell DP replication from FSDP2 sharding: both are priced as one gradient
all-reduce per step, not overlapped.

Numpy only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..cost import HARDWARE_PRESETS, MODEL_PRESETS, CostModel, HardwarePreset, ModelDims

__all__ = ["ClusterConfig", "RUNNABLE_AXES", "GPU_MEMORY_BYTES", "STATE_BYTES_PER_PARAM"]

#: Memory of one GPU of each hardware preset, bytes (the presets' spec sheets: A800/H100 SXM 80 GB, H200 141 GB).
GPU_MEMORY_BYTES = {"A800": 80e9, "H100": 80e9, "H200": 141e9}
#: Model-state bytes per parameter in mixed-precision Adam training (bf16 weights and gradients,
#: fp32 master weights and two moments: ZeRO's 16).
STATE_BYTES_PER_PARAM = 16

#: Mesh axes the atac-hf integration runs (``ParallelismConfig(dp_replicate, dp_shard, tp, cp)``;
#: ``dp`` covers both replicated and FSDP2-sharded data parallelism).
RUNNABLE_AXES = ("dp", "cp", "tp")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Parallel layout, model and hardware of one simulated training run.

    Attributes:
        dp_size: data-parallel replicas.
        pp_size: pipeline stages.
        cp_size: context-parallel ranks sharing one pack.
        tp_size: tensor-parallel ranks (divide heads and weights; the cost model is built for it).
        num_micro_batches: packs (micro-batches) per DP replica per optimizer step.
        max_tokens: token cap of one pack (the whole CP group's row).
        model: a :data:`~atac_hf.cost.MODEL_PRESETS` key, a :class:`~atac_hf.cost.ModelDims`,
            an HF config object, or a dict of HF config fields.
        hardware: a :data:`~atac_hf.cost.HARDWARE_PRESETS` key (compute and links).
        profile: a calibration profile JSON (``atac-hf calibrate``): replaces the
            preset's compute coefficients; links still come from ``hardware``.
        efficiency: achieved share of peak FLOP/s for the presets (ignored with a profile).
        num_gpus: when given, must equal ``dp x pp x cp x tp`` (a consistency check).
        gpus_per_node: GPUs per node (decides intra- vs inter-node links).
        grad_bytes: bytes per gradient element in the data-parallel all-reduce (4: fp32).
        act_bytes: bytes per activation element on a pipeline hop (2: bf16).
        fwd_fraction: share of a layer's fwd+bwd time spent in the forward; ``None``
            derives it per pack from the cost model (linear: 1/3, attention: 1/3.5).
        rank_token_slack: per-rank token cap = ``ceil(max_tokens / cp x slack)`` (memory);
            ``None`` for no per-rank cap.
        max_tokens_per_rank: the per-rank token cap itself (``--max-tokens-per-rank``), in place
            of the one ``rank_token_slack`` derives; ``None``: derived. A combination with a
            pack over it is refused (:attr:`~atac_hf.sim.results.SimResult.refused`).
    """

    dp_size: int = 1
    pp_size: int = 1
    cp_size: int = 1
    tp_size: int = 1
    num_micro_batches: int = 1
    max_tokens: int = 32768
    model: Any = "7b"
    hardware: str = "H100"
    profile: str | None = None
    efficiency: float = 0.5
    num_gpus: int | None = None
    gpus_per_node: int = 8
    grad_bytes: int = 4
    act_bytes: int = 2
    fwd_fraction: float | None = None
    rank_token_slack: float | None = 1.25
    max_tokens_per_rank: int | None = None

    def __post_init__(self) -> None:
        for f in ("dp_size", "pp_size", "cp_size", "tp_size", "num_micro_batches", "max_tokens", "gpus_per_node",
                  "grad_bytes", "act_bytes"):
            v = getattr(self, f)
            if not _is_int(v) or v < 1:
                raise ValueError(f"ClusterConfig.{f}={v!r} is invalid: it must be an int >= 1")
        world = self.dp_size * self.pp_size * self.cp_size * self.tp_size
        if self.num_gpus is not None and self.num_gpus != world:
            raise ValueError(
                f"ClusterConfig.num_gpus={self.num_gpus!r} does not match dp_size x pp_size x cp_size x tp_size = "
                f"{self.dp_size} x {self.pp_size} x {self.cp_size} x {self.tp_size} = {world}; change the sizes or num_gpus"
            )
        dims = self.dims
        if self.pp_size > dims.num_layers:
            raise ValueError(
                f"ClusterConfig.pp_size={self.pp_size} exceeds the model's num_layers={dims.num_layers}: "
                "every pipeline stage needs at least one layer"
            )
        if dims.num_heads % self.tp_size or dims.num_kv_heads % self.tp_size and self.tp_size % dims.num_kv_heads:
            raise ValueError(
                f"ClusterConfig.tp_size={self.tp_size} must divide num_heads={dims.num_heads} and divide (or be a "
                f"multiple of) num_kv_heads={dims.num_kv_heads}"
            )
        if self.max_tokens < self.cp_size:
            raise ValueError(f"ClusterConfig.max_tokens={self.max_tokens} is smaller than cp_size={self.cp_size}")
        if self.hardware.upper() not in HARDWARE_PRESETS:
            raise ValueError(
                f"ClusterConfig.hardware={self.hardware!r} is unknown; legal values: {sorted(HARDWARE_PRESETS)}"
            )
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"ClusterConfig.efficiency={self.efficiency!r} must be in (0, 1]")
        if self.fwd_fraction is not None and not 0 < self.fwd_fraction < 1:
            raise ValueError(f"ClusterConfig.fwd_fraction={self.fwd_fraction!r} must be in (0, 1) or None")
        if self.rank_token_slack is not None and not self.rank_token_slack >= 1:
            raise ValueError(f"ClusterConfig.rank_token_slack={self.rank_token_slack!r} must be >= 1 or None")
        if self.max_tokens_per_rank is not None and (not _is_int(self.max_tokens_per_rank)
                                                     or not 1 <= self.max_tokens_per_rank <= 2**62):
            raise ValueError(f"ClusterConfig.max_tokens_per_rank={self.max_tokens_per_rank!r} must be an int from 1 "
                             "to 2**62 or None (derived from rank_token_slack)")
        if self.profile is not None:
            self.cost_model()  # a profile that does not match the model fails here, not mid-run

    # ------------------------------------------------------------------ derived values
    @property
    def dims(self) -> ModelDims:
        m = self.model
        if isinstance(m, ModelDims):
            return m
        if isinstance(m, str):
            if m.lower() not in MODEL_PRESETS:
                raise ValueError(f"ClusterConfig.model={m!r} is unknown; legal presets: {sorted(MODEL_PRESETS)} "
                                 "(or pass ModelDims / an HF config)")
            return MODEL_PRESETS[m.lower()]
        return ModelDims.from_hf_config(m)

    @property
    def world_size(self) -> int:
        return self.dp_size * self.pp_size * self.cp_size * self.tp_size

    @property
    def packs_per_step(self) -> int:
        return self.dp_size * self.num_micro_batches

    @property
    def hw(self) -> HardwarePreset:
        return HARDWARE_PRESETS[self.hardware.upper()]

    def _bandwidth(self, span_gpus: int) -> float:
        return self.hw.intra_node_bw if span_gpus <= self.gpus_per_node else self.hw.inter_node_bw

    def stage_layers(self) -> np.ndarray:
        """(P,) layers per pipeline stage (the first stages take the remainder)."""
        L, P = self.dims.num_layers, self.pp_size
        return np.array([L // P + (s < L % P) for s in range(P)], dtype=np.int64)

    def tp_comm_s_per_token(self) -> float:
        """Seconds per token per layer (forward + backward) of the TP activation all-reduces.

        Megatron-style TP all-reduces the ``hidden_size`` activations of every token after the
        row-parallel attention output and MLP down projections in the forward (2 all-reduces),
        and the input gradients of the column-parallel projections in the backward (2 more):
        4 ring all-reduces of ``tokens x hidden x act_bytes`` bytes over ``tp_size`` ranks, each
        rank sending ``2 (T - 1) / T`` of them, over NVLink while the TP group fits in a node.
        0 for ``tp_size == 1``. Per-call latency (4 x 2 (T - 1) steps per layer and pack) is left
        out: a few tens of microseconds against milliseconds of layer time.
        """
        T = self.tp_size
        if T <= 1:
            return 0.0
        per_token = self.dims.hidden_size * self.act_bytes
        return 4.0 * 2.0 * (T - 1) / T * per_token / self._bandwidth(T)

    def what_if_reasons(self) -> tuple[str, ...]:
        """Why the atac-hf integration cannot run this layout today; ``()`` when it can.

        The integration runs DP (replicated or FSDP2), CP and TP (see :data:`RUNNABLE_AXES`).
        A what-if: ``pp_size > 1`` (HF has no pipeline parallelism), ``tp_size`` above the
        model's ``num_kv_heads`` (transformers' ``tp_plan`` splits K/V heads column-wise, it
        cannot replicate them the way Megatron does), or model states that do not fit in the
        GPU's memory the way the integration holds them (:meth:`model_state_bytes_per_gpu`). TP also needs a model with a ``tp_plan``,
        which the model presets (Llama/Qwen-like) have; a custom model is assumed to have one.
        """
        out = []
        if self.pp_size > 1:
            out.append(f"PP {self.pp_size}: HF has no pipeline parallelism")
        if self.tp_size > self.dims.num_kv_heads:
            out.append(f"TP {self.tp_size} > {self.dims.num_kv_heads} K/V heads: tp_plan cannot replicate K/V heads")
        mem = GPU_MEMORY_BYTES.get(self.hardware.upper())
        states = self.model_state_bytes_per_gpu()
        if mem is not None and states > mem:
            how = "TP with DDP: FSDP x TP is refused" if self.tp_size > 1 else "FSDP2 over DP x CP"
            out.append(f"model states {states / 1e9:.0f} GB per GPU ({how}) exceed the {self.hw.name}'s "
                       f"{mem / 1e9:.0f} GB")
        return tuple(out)

    def model_state_bytes_per_gpu(self) -> float:
        """Weights, gradients and Adam states per GPU the way the integration holds them.

        :data:`STATE_BYTES_PER_PARAM` x (layers + untied embedding and LM head), divided over TP
        and PP stages, and with ``tp_size == 1`` also over the ``dp x cp`` ranks FSDP2 shards
        over; with TP the integration runs plain DDP, so DP and CP ranks each hold a full TP
        shard. Activations are left out (they depend on checkpointing), so a layout that passes
        this check may still need activation checkpointing to fit.
        """
        d = self.dims
        params = d.num_layers * d.params_per_layer + 2 * d.vocab_size * d.hidden_size
        shards = self.tp_size * self.pp_size * (self.dp_size * self.cp_size if self.tp_size == 1 else 1)
        return STATE_BYTES_PER_PARAM * params / shards

    @property
    def runnable(self) -> bool:
        """Whether the atac-hf integration runs this layout today (no :meth:`what_if_reasons`)."""
        return not self.what_if_reasons()

    def cost_model(self) -> CostModel:
        """Per-layer cost model for one TP group (compute / tp), with this cluster's CP link.

        The TP activation all-reduces (:meth:`tp_comm_s_per_token`) are added to the linear
        price per token: every CP rank pays them on its own tokens, so they fall on a pack's
        slowest rank like its projections, and the planners see them as such.

        Raises:
            ValueError: a profile that cannot be read or does not match ``model``/``tp_size``.
        """
        inter = self.tp_size * self.cp_size > self.gpus_per_node
        # a CP group over several nodes: the all-to-all K/V exchange prices rows inside a node
        # at NVLink speed (CP ranks are consecutive GPUs, TP innermost)
        nodes = dict(node_size=max(1, self.gpus_per_node // self.tp_size),
                     intra_node_bandwidth=self.hw.intra_node_bw) if inter else {}
        tp_comm = self.tp_comm_s_per_token()
        if self.profile is None:
            cm = CostModel.from_model(self.dims, self.hw, efficiency=self.efficiency, tp_size=self.tp_size,
                                      inter_node=inter)
            return cm.replace(linear_s_per_token=cm.linear_s_per_token + tp_comm, **nodes)
        cm = CostModel.from_profile(self.profile)  # measured per TP rank: compute only, no TP collectives
        self._check_profile(cm)
        return cm.replace(link_bandwidth=self._bandwidth(self.tp_size * self.cp_size),
                          link_latency_s=self.hw.link_latency_s, linear_s_per_token=cm.linear_s_per_token + tp_comm,
                          **nodes)

    def _check_profile(self, cm: CostModel) -> None:
        with open(self.profile, encoding="utf-8") as f:
            meta = json.load(f).get("metadata") or {}
        d = self.dims
        pm = meta.get("model")
        if isinstance(pm, Mapping):
            ours = dataclasses.asdict(d)
            bad = {k: (pm[k], ours[k]) for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim",
                                                 "intermediate_size") if k in pm and pm[k] != ours[k]}
            if bad:
                detail = ", ".join(f"{k}: profile {a} vs model {b}" for k, (a, b) in bad.items())
                raise ValueError(
                    f"cost profile {self.profile!r} was measured for another model ({detail}); "
                    "calibrate for this model or change the model setting"
                )
        ptp = meta.get("tp_size", 1)
        if ptp != self.tp_size:
            raise ValueError(
                f"cost profile {self.profile!r} was measured with tp_size={ptp}, the cluster has "
                f"tp_size={self.tp_size}; calibrate with the cluster's tp_size or change tp_size"
            )
        kv_heads = max(1, d.num_kv_heads // self.tp_size)
        legal = [2.0 * kv_heads * d.head_dim * b for b in (1, 2, 4)]
        if cm.kv_bytes_per_token and not any(math.isclose(cm.kv_bytes_per_token, x) for x in legal):
            raise ValueError(
                f"cost profile {self.profile!r} has kv_bytes_per_token={cm.kv_bytes_per_token}, which does not "
                f"match the model (2 x {kv_heads} kv heads x head_dim {d.head_dim} x 1, 2 or 4 bytes = {legal}); "
                "calibrate for this model or change the model setting"
            )

    def grad_sync_s(self) -> float:
        """Seconds of the ring all-reduce of the largest stage's gradients over ``dp x cp`` ranks."""
        n = self.dp_size * self.cp_size
        if n <= 1:
            return 0.0
        params = int(self.stage_layers().max()) * self.dims.params_per_layer / self.tp_size
        bw = self._bandwidth(self.tp_size * self.cp_size * self.dp_size)
        return 2.0 * (n - 1) / n * params * self.grad_bytes / bw + 2 * (n - 1) * self.hw.link_latency_s

    def hop_s(self, tokens_per_rank: Any) -> np.ndarray:
        """Seconds of one pipeline hop carrying ``tokens_per_rank`` tokens' hidden states."""
        t = np.asarray(tokens_per_rank, dtype=np.float64)
        if self.pp_size <= 1:
            return np.zeros_like(t)
        bw = self._bandwidth(2 * self.tp_size * self.cp_size * self.dp_size)  # two neighbouring stages
        return t * self.dims.hidden_size * self.act_bytes / self.tp_size / bw + self.hw.link_latency_s

    def rank_token_cap(self) -> int | None:
        """Most tokens one CP rank may hold: ``max_tokens_per_rank``, else ``ceil(max_tokens /
        cp x rank_token_slack)`` (None at cp 1 or without a slack: no cap)."""
        if self.max_tokens_per_rank is not None:
            return int(self.max_tokens_per_rank)
        if self.rank_token_slack is None or self.cp_size == 1:
            return None
        return int(math.ceil(self.max_tokens / self.cp_size * self.rank_token_slack))

    def rank_cap_setting(self) -> str:
        """Where :meth:`rank_token_cap` comes from, for messages: the setting to change."""
        if self.max_tokens_per_rank is not None:
            return "set by max_tokens_per_rank (--max-tokens-per-rank): raise it, or raise cp_size (--cp)"
        return (f"ceil(max_tokens {self.max_tokens} / cp_size {self.cp_size} x rank_token_slack "
                f"{self.rank_token_slack}): set max_tokens_per_rank (--max-tokens-per-rank) or raise cp_size (--cp)")

    def describe(self) -> str:
        d = self.dims
        m = self.model if isinstance(self.model, str) else f"h{d.hidden_size}x{d.num_layers}"
        src = f"profile {os.path.basename(self.profile)}" if self.profile else self.hardware
        nodes = -(-self.world_size // self.gpus_per_node)
        return (f"{m} on {src}: DP{self.dp_size} PP{self.pp_size} CP{self.cp_size} TP{self.tp_size} "
                f"({self.world_size} GPUs, {nodes} node{'s' if nodes > 1 else ''}), "
                f"{self.num_micro_batches} micro-batches, {self.max_tokens // 1024}K-token packs")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not isinstance(self.model, (str, type(None))):
            out["model"] = dataclasses.asdict(self.dims)
        return out

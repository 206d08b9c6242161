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
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cost import HARDWARE_PRESETS, MODEL_PRESETS, CostModel, HardwarePreset, ModelDims
from ..cost.presets import resolve_hardware
from ..cost.profile import profile_metadata, profile_model_mismatch
from ..sharding import MAX_CP_SIZE

__all__ = ["ClusterConfig", "RUNNABLE_AXES", "GPU_MEMORY_BYTES", "STATE_BYTES_PER_PARAM", "MAX_SIM_PACKS",
           "MAX_SIM_STEPS", "MAX_SIM_TOKENS"]

#: Memory of one GPU of each hardware preset, bytes (the presets' spec sheets: A800/H100 SXM 80 GB, H200 141 GB).
GPU_MEMORY_BYTES = {"A800": 80e9, "H100": 80e9, "H200": 141e9}
#: Model-state bytes per parameter in mixed-precision Adam training (bf16 weights and gradients,
#: fp32 master weights and two moments: ZeRO's 16).
STATE_BYTES_PER_PARAM = 16

#: Mesh axes the atac-hf integration runs (``ParallelismConfig(dp_replicate, dp_shard, tp, cp)``;
#: ``dp`` covers both replicated and FSDP2-sharded data parallelism).
RUNNABLE_AXES = ("dp", "cp", "tp")

#: Largest pack (``max_tokens``, ``--max-tokens``) a simulated cluster takes, and the most packs
#: per step (``dp_size x num_micro_batches``) and per run (``atac-hf simulate``'s ``--steps x --dp
#: x --micro-batches``): a simulation holds every sample of its stream, so absurd sizes fail at
#: once instead of exhausting memory.
MAX_SIM_TOKENS = 2**26
MAX_SIM_PACKS = 2**18
#: Most steps one simulation runs (``simulate(num_steps=...)``, ``--steps``).
MAX_SIM_STEPS = 10_000
#: Most GPUs per node, and bytes per gradient / activation element (bounds that keep every derived
#: figure finite; real values are 4-8 GPUs and 1-4 bytes).
_MAX_GPUS_PER_NODE = 2**20
_MAX_ELEMENT_BYTES = 64
#: Largest ``rank_token_slack`` (above ``cp_size`` it caps nothing; the bound keeps the cap an int).
_MAX_SLACK = 2.0**20


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    """A number (numpy floats and ints too), never a bool or a string."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _shown(v: Any) -> str:
    """``repr(v)`` cut short for messages (a huge int or string is not printed whole)."""
    if _is_int(v) and abs(int(v)) >= 10**30:
        return f"<int of {int(v).bit_length()} bits>"
    text = repr(v)
    return text[:77] + "..." if len(text) > 80 else text


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Parallel layout, model and hardware of one simulated training run.

    Attributes:
        dp_size: data-parallel replicas.
        pp_size: pipeline stages.
        cp_size: context-parallel ranks sharing one pack.
        tp_size: tensor-parallel ranks (divide heads and weights; the cost model is built for it).
        num_micro_batches: packs (micro-batches) per DP replica per optimizer step.
        max_tokens: token cap of one pack (the whole CP group's row), at most
            :data:`MAX_SIM_TOKENS` (``dp_size x num_micro_batches`` at most :data:`MAX_SIM_PACKS`).
        model: a :data:`~atac_hf.cost.MODEL_PRESETS` key, a :class:`~atac_hf.cost.ModelDims`,
            an HF config object, or a dict of HF config fields.
        hardware: a :data:`~atac_hf.cost.HARDWARE_PRESETS` key (compute and links), or a
            :class:`~atac_hf.cost.HardwarePreset`.
        profile: the path (str or os.PathLike, kept as a str) of a calibration profile JSON
            (``atac-hf calibrate``): replaces the preset's compute coefficients; links and node
            topology still come from ``hardware`` and ``gpus_per_node``.
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
    hardware: str | HardwarePreset = "H100"
    profile: str | os.PathLike | None = None
    efficiency: float = 0.5
    num_gpus: int | None = None
    gpus_per_node: int = 8
    grad_bytes: int = 4
    act_bytes: int = 2
    fwd_fraction: float | None = None
    rank_token_slack: float | None = 1.25
    max_tokens_per_rank: int | None = None

    def __post_init__(self) -> None:
        # types and ranges first: every later check and every derived figure may then rely on them
        limits = {"dp_size": (MAX_SIM_PACKS, "--dp"), "pp_size": (None, "--pp"), "cp_size": (None, "--cp"),
                  "tp_size": (None, "--tp"), "num_micro_batches": (MAX_SIM_PACKS, "--micro-batches"),
                  "max_tokens": (MAX_SIM_TOKENS, "--max-tokens"), "gpus_per_node": (_MAX_GPUS_PER_NODE, None),
                  "grad_bytes": (_MAX_ELEMENT_BYTES, None), "act_bytes": (_MAX_ELEMENT_BYTES, None)}
        for f, (high, flag) in limits.items():
            v = getattr(self, f)
            if not _is_int(v) or v < 1 or (high is not None and v > high):
                legal = "an int >= 1" if high is None else f"an int from 1 to {high}"
                raise ValueError(f"ClusterConfig.{f}={_shown(v)} is invalid: it must be {legal}"
                                 + (f" (set {f} / {flag})" if flag else f" (set {f})"))
        if self.dp_size * self.num_micro_batches > MAX_SIM_PACKS:
            raise ValueError(
                f"ClusterConfig.dp_size x num_micro_batches = {self.dp_size} x {self.num_micro_batches} packs per "
                f"step, more than {MAX_SIM_PACKS}: lower dp_size (--dp) or num_micro_batches (--micro-batches)")
        if self.num_gpus is not None and not _is_int(self.num_gpus):
            raise ValueError(f"ClusterConfig.num_gpus={_shown(self.num_gpus)} is invalid: it must be None or an int "
                             "(dp_size x pp_size x cp_size x tp_size; set num_gpus / --num-gpus)")
        if not isinstance(self.hardware, (str, HardwarePreset)) or (
                isinstance(self.hardware, str) and self.hardware.upper() not in HARDWARE_PRESETS):
            raise ValueError(
                f"ClusterConfig.hardware={_shown(self.hardware)} is unknown; legal values: "
                f"{sorted(HARDWARE_PRESETS)} or a HardwarePreset (set hardware / --hardware; or calibrate and set "
                "profile / --profile)"
            )
        for f, in_range, legal, flag in (
                ("efficiency", lambda v: 0 < v <= 1, "a number in (0, 1] (the achieved share of peak FLOP/s)",
                 "--efficiency"),
                ("fwd_fraction", lambda v: 0 < v < 1, "None or a number in (0, 1) (the forward's share of a layer's "
                 "time)", None),
                ("rank_token_slack", lambda v: 1 <= v <= _MAX_SLACK,
                 f"None or a number from 1 to {int(_MAX_SLACK)} (2**20)", None)):
            v = getattr(self, f)
            if v is None and f != "efficiency":
                continue
            if not (_is_real(v) and math.isfinite(v) and in_range(v)):
                raise ValueError(f"ClusterConfig.{f}={_shown(v)} is invalid: it must be {legal}"
                                 + (f" (set {f} / {flag})" if flag else f" (set {f})"))
        if self.profile is not None:
            path = self.profile
            if isinstance(path, os.PathLike):
                path = os.fspath(path)
            if not isinstance(path, str):
                raise ValueError(f"ClusterConfig.profile={_shown(self.profile)} is invalid: it must be None or the "
                                 "path (a str or os.PathLike) of a calibration profile JSON (set profile / --profile)")
            object.__setattr__(self, "profile", path)  # a str from here on (describe, to_dict, JSON reports)
        world = self.dp_size * self.pp_size * self.cp_size * self.tp_size
        if self.num_gpus is not None and self.num_gpus != world:
            raise ValueError(
                f"ClusterConfig.num_gpus={self.num_gpus!r} does not match dp_size x pp_size x cp_size x tp_size = "
                f"{self.dp_size} x {self.pp_size} x {self.cp_size} x {self.tp_size} = {world}; change the sizes (dp_size / --dp, "
                f"pp_size / --pp, cp_size / --cp, tp_size / --tp) or set num_gpus / --num-gpus to {world}"
            )
        dims = self.dims
        if self.pp_size > dims.num_layers:
            raise ValueError(
                f"ClusterConfig.pp_size={self.pp_size} exceeds the model's num_layers={dims.num_layers}: "
                f"every pipeline stage needs at least one layer; set pp_size / --pp to at most {dims.num_layers}"
            )
        if dims.num_heads % self.tp_size or dims.num_kv_heads % self.tp_size and self.tp_size % dims.num_kv_heads:
            raise ValueError(
                f"ClusterConfig.tp_size={self.tp_size} must divide num_heads={dims.num_heads} and divide (or be a "
                f"multiple of) num_kv_heads={dims.num_kv_heads}; legal: "
                f"{[t for t in range(1, dims.num_heads + 1) if not dims.num_heads % t and not (dims.num_kv_heads % t and t % dims.num_kv_heads)]} "
                "(set tp_size / --tp)"
            )
        if self.max_tokens < self.cp_size:
            raise ValueError(f"ClusterConfig.max_tokens={self.max_tokens} is smaller than cp_size={self.cp_size}: it "
                             "must be >= cp_size (every CP rank needs a token); set max_tokens / --max-tokens or "
                             "cp_size / --cp")
        if self.cp_size > MAX_CP_SIZE:  # after the check above: the CLI words that one in its flags
            raise ValueError(f"ClusterConfig.cp_size={self.cp_size} is invalid: it must be an int from 1 to "
                             f"{MAX_CP_SIZE} (MAX_CP_SIZE, the planners' largest CP group; set cp_size / --cp)")
        if self.max_tokens_per_rank is not None and (not _is_int(self.max_tokens_per_rank)
                                                     or not 1 <= self.max_tokens_per_rank <= 2**62):
            raise ValueError(f"ClusterConfig.max_tokens_per_rank={_shown(self.max_tokens_per_rank)} must be an int "
                             "from 1 to 2**62 or None (derived from rank_token_slack)")
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
                raise ValueError(f"ClusterConfig.model={_shown(m)} is unknown; legal presets: "
                                 f"{sorted(MODEL_PRESETS)} (or pass ModelDims / an HF config; set model / --model)")
            return MODEL_PRESETS[m.lower()]
        try:
            return ModelDims.from_hf_config(m)
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"ClusterConfig.model={_shown(m)} is invalid: {e} (legal: a preset in "
                             f"{sorted(MODEL_PRESETS)}, a ModelDims or an HF config; set model / --model)") from None

    @property
    def world_size(self) -> int:
        return self.dp_size * self.pp_size * self.cp_size * self.tp_size

    @property
    def packs_per_step(self) -> int:
        return self.dp_size * self.num_micro_batches

    @property
    def hw(self) -> HardwarePreset:
        return resolve_hardware(self.hardware)

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
        mem = GPU_MEMORY_BYTES.get(self.hw.name.upper())
        states = self.model_state_bytes_per_gpu()
        if mem is not None and states > mem:
            how = "TP with DDP: FSDP x TP is refused" if self.tp_size > 1 else "FSDP2 over DP x CP"
            out.append(f"model states {states / 1e9:.0f} GB per GPU ({how}) exceed the {self.hw.name}'s "
                       f"{mem / 1e9:.0f} GB")
        return tuple(out)

    def model_state_bytes_per_gpu(self) -> float:
        """Weights, gradients and Adam states per GPU the way the integration holds them.

        :data:`STATE_BYTES_PER_PARAM` x (layers + the embedding and, unless the model ties them
        (``ModelDims.tie_word_embeddings``, HF's ``tie_word_embeddings``), the LM head), divided over TP
        and PP stages, and with ``tp_size == 1`` also over the ``dp x cp`` ranks FSDP2 shards
        over; with TP the integration runs plain DDP, so DP and CP ranks each hold a full TP
        shard. Activations are left out (they depend on checkpointing), so a layout that passes
        this check may still need activation checkpointing to fit.
        """
        d = self.dims
        vocab_matrices = 1 if d.tie_word_embeddings else 2  # a tied LM head is the embedding itself
        params = d.num_layers * d.params_per_layer + vocab_matrices * d.vocab_size * d.hidden_size
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
        slowest rank like its projections, and the planners see them as such. With a
        ``profile``: :meth:`profile_cost_model` of it.

        Raises:
            ValueError: a profile that cannot be read or does not match ``model``/``tp_size``.
        """
        if self.profile is not None:
            return self.profile_cost_model(self.profile)
        cm = CostModel.from_model(self.dims, self.hw, efficiency=self.efficiency, tp_size=self.tp_size,
                                  inter_node=self._inter_node())
        return cm.replace(linear_s_per_token=cm.linear_s_per_token + self.tp_comm_s_per_token(), **self._topology())

    def profile_cost_model(self, path: str | os.PathLike,
                           setting: str = "the profile (ClusterConfig.profile / --profile)") -> CostModel:
        """The cost model of this cluster running on a calibration profile's compute.

        The profile (measured per TP rank: compute only) gives the compute coefficients and
        K/V bytes; the cluster gives everything the profile cannot know: the CP link
        (bandwidth and latency of ``hardware``), the node topology (CP ranks per node and the
        intra-node link, for a CP group over several nodes; none otherwise) and the TP
        all-reduces (:meth:`tp_comm_s_per_token`). The same model whether the profile plans
        (``profile``) or only times (an evaluation profile of :mod:`.robustness`).

        Args:
            path: the profile JSON (``atac-hf calibrate``).
            setting: the setting that named ``path``, for messages.

        Raises:
            ValueError: a profile that cannot be read, or one measured for another model or
                ``tp_size`` (its metadata) or with K/V bytes this model cannot have.
        """
        path = os.fspath(path)
        cm = CostModel.from_profile(path)
        self._check_profile(cm, path, setting)
        return cm.replace(link_bandwidth=self._bandwidth(self.tp_size * self.cp_size),
                          link_latency_s=self.hw.link_latency_s,
                          linear_s_per_token=cm.linear_s_per_token + self.tp_comm_s_per_token(), **self._topology())

    def _inter_node(self) -> bool:
        return self.tp_size * self.cp_size > self.gpus_per_node

    def _topology(self) -> dict[str, Any]:
        """The CP group's node layout as CostModel fields: a group over several nodes has the
        all-to-all K/V exchange price rows inside a node at NVLink speed (CP ranks are
        consecutive GPUs, TP innermost); a group in one node has one link."""
        if not self._inter_node():
            return dict(node_size=None, intra_node_bandwidth=None)
        return dict(node_size=max(1, self.gpus_per_node // self.tp_size), intra_node_bandwidth=self.hw.intra_node_bw)

    def _model_label(self) -> str:
        d = self.dims
        return repr(self.model) if isinstance(self.model, str) else f"h{d.hidden_size}x{d.num_layers}"

    def _check_profile(self, cm: CostModel, path: str, setting: str) -> None:
        meta = profile_metadata(path)
        d = self.dims
        fix = f"calibrate for the cluster's model, change the model (ClusterConfig.model / --model) or {setting}"
        detail = profile_model_mismatch(meta, d)
        if detail:
            pm = meta["model"]
            theirs = f"h{_shown(pm.get('hidden_size'))}x{_shown(pm.get('num_layers'))}"
            raise ValueError(
                f"cost profile {path!r} was measured for another model ({theirs}) than the cluster's "
                f"{self._model_label()} ({detail}); {fix}"
            )
        ptp = meta.get("tp_size", 1)
        if ptp != self.tp_size:
            raise ValueError(
                f"cost profile {path!r} was measured with tp_size={_shown(ptp)}, the cluster has "
                f"tp_size={self.tp_size}; calibrate with the cluster's tp_size, change tp_size (--tp) or {setting}"
            )
        kv_heads = max(1, d.num_kv_heads // self.tp_size)
        v_dim = d.head_dim if d.v_head_dim is None else d.v_head_dim
        legal = [1.0 * kv_heads * (d.head_dim + v_dim) * b for b in (1, 2, 4)]
        if cm.kv_bytes_per_token and not any(math.isclose(cm.kv_bytes_per_token, x) for x in legal):
            raise ValueError(
                f"cost profile {path!r} has kv_bytes_per_token={cm.kv_bytes_per_token}, which does not "
                f"match the cluster's model {self._model_label()} ({kv_heads} kv heads x (head_dim {d.head_dim} + "
                f"value width {v_dim}) x 1, 2 or 4 bytes = {legal}); {fix}"
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
        src = f"profile {os.path.basename(self.profile)}" if self.profile else self.hw.name
        nodes = -(-self.world_size // self.gpus_per_node)
        mb = self.num_micro_batches
        tokens = f"{self.max_tokens // 1024}K" if self.max_tokens % 1024 == 0 else f"{self.max_tokens:,}"
        return (f"{m} on {src}: DP{self.dp_size} PP{self.pp_size} CP{self.cp_size} TP{self.tp_size} "
                f"({self.world_size} GPUs, {nodes} node{'s' if nodes > 1 else ''}), "
                f"{mb} micro-batch{'es' if mb != 1 else ''}, {tokens}-token packs")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not isinstance(self.model, (str, type(None))):
            out["model"] = dataclasses.asdict(self.dims)
        return out

"""`ATACConfig`: every setting of the add-on, from a YAML file, ``ATAC_*`` variables or code.

``accelerate launch`` exports only the keys it knows (``parallelism_config_cp_size`` becomes
``PARALLELISM_CONFIG_CP_SIZE``) and refuses unknown ones, so the add-on reads its own file
(``--atac_config`` / ``ATAC_CONFIG``) and ``ATAC_*`` variables. Precedence, lowest first
(:meth:`ATACConfig.from_sources`)::

    field defaults < YAML/JSON file < ATAC_* variables < explicit overrides (code / CLI)

``cp_size`` left unset everywhere falls back to ``PARALLELISM_CONFIG_CP_SIZE`` (the launch
YAML's ``parallelism_config_cp_size``); a set value that disagrees with it is an error.

Files are read with a safe YAML loader / ``json``: nothing in them is executed. Reads are
bounded: regular files only (never a device or a pipe), at most :data:`MAX_CONFIG_BYTES`
bytes, no YAML aliases (``*name``: a few hundred bytes of them expand to billions of items),
nesting at most :data:`MAX_CONFIG_DEPTH` deep, string keys only. Error messages quote values
through :func:`short_repr`, so a huge value never makes a huge message.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..packing.validate import InputTypeError
from .config_files import (MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, device_type as _device_type, path_repr,
                           read_config_file, short_repr, short_text, token_count, unique_keys)

__all__ = ["ATACConfig", "ENV_PREFIX", "ATTENTION_BACKENDS", "COST_PRESETS", "KV_EXCHANGES", "MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH",
           "MIN_COLLECTIVE_TIMEOUT_S", "MAX_COLLECTIVE_TIMEOUT_S", "short_repr"]

ENV_PREFIX = "ATAC_"
ENV_CONFIG_FILE = "ATAC_CONFIG"
# "auto": flash (flash-attn) or varlen (torch's varlen_attn) on CUDA, sdpa elsewhere
ATTENTION_BACKENDS = ("sdpa", "flash", "flex", "varlen", "varlen_reference", "auto")
#: Legal ``kv_exchange`` values besides None (the strategy's own): ``plan_shards``'s.
KV_EXCHANGES = ("auto", "all_gather", "all_to_all")
# "default": the package's default cost model; the others: HARDWARE_PRESETS keys, with the
# model's dimensions read from its config.
COST_PRESETS = ("default", "A800", "H100", "H200")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_NONE = ("", "none", "null")
#: Range of ``collective_timeout_s``: below a second a busy rank looks dead; over a day a dead
#: one looks busy (and the backends' timers overflow on absurd values).
MIN_COLLECTIVE_TIMEOUT_S = 1.0
MAX_COLLECTIVE_TIMEOUT_S = 86_400.0
#: Largest int accepted for a token count or size (far above any real one; keeps numpy int64 exact).
_MAX_INT = 2**62

def _is_int(v: Any) -> bool:
    """An int (numpy ints too), never a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@dataclass(frozen=True, kw_only=True)
class ATACConfig:
    """Settings of WFAP packing and ATP-CP sharding for one training run.

    Attributes:
        cp_size: ranks in one context-parallel group (1 to ``MAX_CP_SIZE`` = 4096). Must divide the
            world size; the DP size is ``world_size // cp_size``.
        max_tokens: token cap of one pack = one micro-batch row before sharding (> 0).
        packing_strategy: ``wfap`` (cost-balanced, default), ``sequential``, ``bfd`` or ``wlb``
            (see :class:`~atac_hf.packing.PackingConfig`).
        packing_options: further :class:`~atac_hf.packing.PackingConfig` fields
            (``overlength``, ``min_fragment``, ``max_defer``, ``balance_tolerance``, ...).
            ``max_tokens``, ``packs_per_window`` and ``strategy`` are set from the fields above
            and the run (DP replicas x gradient accumulation), not here.
        window_size: new samples per packing window; ``None`` sizes windows by tokens. A fixed count
            above what the window's packs hold makes the carried pool (and the planning time) grow
            window after window: to raise pack fill at few packs per step, use ``min_window_packs``.
        min_window_packs: (``wfap`` with windows sized by tokens) the packs one packing window plans
            together at least: a window holds ``k`` optimizer steps of DP replicas x gradient
            accumulation packs, the smallest ``k`` with ``k x DP x GA >= min_window_packs``, and
            ``max_defer`` (unless set in ``packing_options``) is divided by ``k``, rounded up. Default
            1 (one step per window). 16 fills packs better at DP x GA under 16 (``docs/INTEGRATION.md``,
            pack fill), but a DP run then groups packs into steps otherwise than a GA run.
        shuffle: shuffle the sample order each epoch (seeded by the run's ``data_seed``/``seed``).
        sharding_strategy: how a pack is split over the CP group: ``atp`` (anchor-tail, default)
            or a baseline (``contiguous``, ``zigzag``, ``per_doc``, ``wlb_adaptive``).
        attention_backend: kernel of the ``atac_cp`` attention: ``auto`` (default; decided per
            call: on CUDA with bf16/fp16 inputs ``flash`` when flash-attn is installed, else
            ``varlen`` where torch's varlen_attn takes a scale and a window (torch >= 2.10);
            ``sdpa`` otherwise, fp32 and CPU included),
            ``sdpa`` (CPU and GPU), ``flash`` (flash-attn, CUDA), ``varlen`` (torch's own
            flash kernels, ``torch.nn.attention.varlen``, CUDA, bf16/fp16), ``flex``
            (flex_attention, CUDA for training), ``varlen_reference`` (slow, for debugging).
        cost_preset: cost model the planners use when no profile is given: a hardware preset
            (``A800``, ``H100``, ``H200``; the model's dimensions come from its config) or
            ``default`` (the package default model).
        cost_profile: path of a calibration profile (JSON from ``atac-hf calibrate``); takes
            precedence over ``cost_preset``. Checked to exist; read with ``json.load``.
        max_tokens_per_rank: memory cap on tokens one CP rank may hold, or ``None``.
        min_chunk: shortest chunk an anchor document may be cut into, in tokens;
            ``None``: 128 on CUDA (kernel tile), 1 elsewhere.
        debug: extra checks: every CP rank compares its plan's digest and a hash of the full
            batch (ids, labels, positions) in one small all-gather per batch, and the first batches
            are validated more strictly. (Without it the plan digest and a cheap checksum of the
            ids and labels are compared: ranks fed different data are caught either way.)
        collective_timeout_s: seconds a CP collective (K/V gather, digest check) waits for the
            other ranks of its CP group before failing with a clear error (a rank that crashed,
            raised or hangs), set on the CP group; ``None`` keeps the process group's timeout
            (``TrainingArguments.ddp_timeout`` / accelerate ``InitProcessGroupKwargs(timeout=)``;
            a CP group that is a mesh subgroup, when DP > 1, otherwise gets torch's 30 minutes).
            When the CP group is the whole world it is the default group: the value then
            applies to every collective of the run. From 1 s to one day.
        kv_exchange: how the K/V of documents split over the CP group travel
            (:func:`~atac_hf.sharding.plan_shards`'s ``kv_exchange``): ``all_gather`` (every rank
            receives every split document's K/V), ``all_to_all`` (each rank receives only the key
            prefixes its chunks attend to), ``auto`` (the one the cost model estimates faster,
            per pack) or ``None`` (default: the sharding strategy's own; ``atp``: ``auto``, the
            baselines: ``all_gather``).
    """

    cp_size: int = 1
    max_tokens: int = 8192
    packing_strategy: str = "wfap"
    packing_options: Mapping[str, Any] = field(default_factory=dict)
    window_size: int | None = None
    min_window_packs: int = 1
    shuffle: bool = True
    sharding_strategy: str = "atp"
    attention_backend: str = "auto"
    cost_preset: str = "H100"
    cost_profile: str | None = None
    max_tokens_per_rank: int | None = None
    min_chunk: int | None = None
    debug: bool = False
    collective_timeout_s: float | None = None
    kv_exchange: str | None = None

    def __post_init__(self) -> None:
        from ..packing.config import STRATEGIES as PACKING_STRATEGIES
        from ..sharding import MAX_CP_SIZE, STRATEGIES as SHARDING_STRATEGIES

        r = short_repr
        for name in _TOKEN_FIELDS:  # "16K", as the command-line tools and ATAC_* variables take it
            if isinstance(getattr(self, name), str):
                setting = f"{name} / {ENV_PREFIX}{name.upper()}"
                object.__setattr__(self, name, token_count(getattr(self, name), name, setting))
        if not _is_int(self.cp_size) or not 1 <= self.cp_size <= MAX_CP_SIZE:
            raise ValueError(f"cp_size={r(self.cp_size)} must be an int >= 1 and <= {MAX_CP_SIZE} (MAX_CP_SIZE) "
                             "(set cp_size / ATAC_CP_SIZE)")
        if not _is_int(self.max_tokens) or not 1 <= self.max_tokens <= _MAX_INT:
            raise ValueError(f"max_tokens={r(self.max_tokens)} must be an int >= 1 (the per-pack token cap; "
                             "set max_tokens / ATAC_MAX_TOKENS)")
        for name, legal in (("packing_strategy", list(PACKING_STRATEGIES)),
                            ("sharding_strategy", sorted(SHARDING_STRATEGIES)),
                            ("attention_backend", list(ATTENTION_BACKENDS)), ("cost_preset", list(COST_PRESETS))):
            v = getattr(self, name)
            if not isinstance(v, str) or v not in legal:
                hint = " (or give a calibration profile as cost_profile)" if name == "cost_preset" else ""
                raise ValueError(f"unknown {name} {r(v)}; legal values: {legal}{hint} "
                                 f"(set {name} / {ENV_PREFIX}{name.upper()})")
        if not isinstance(self.packing_options, Mapping):
            raise TypeError(f"packing_options must be a mapping of PackingConfig fields, got "
                            f"{type(self.packing_options).__name__}")
        bad_keys = [k for k in self.packing_options if not isinstance(k, str)]
        if bad_keys:
            raise ValueError(f"packing_options keys must be strings (PackingConfig field names), got "
                             f"{r(bad_keys)} (set packing_options / ATAC_PACKING_OPTIONS)")
        reserved = sorted({"max_tokens", "packs_per_window", "strategy"} & set(self.packing_options))
        if reserved:
            raise ValueError(f"packing_options may not set {reserved}: use max_tokens / packing_strategy; "
                             "packs_per_window follows from DP replicas x gradient accumulation")
        object.__setattr__(self, "packing_options", dict(self.packing_options))
        try:  # validates the options (names and values), naming the setting they came from
            self.packing_config(packs_per_window=1)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e} (in packing_options / {ENV_PREFIX}PACKING_OPTIONS)") from None
        if not _is_int(self.min_window_packs) or not 1 <= self.min_window_packs <= 2**20:
            raise ValueError(f"min_window_packs={r(self.min_window_packs)} must be an int >= 1 and <= 2**20 (1: one "
                             f"optimizer step per packing window; set min_window_packs / {ENV_PREFIX}MIN_WINDOW_PACKS)")
        for name in ("window_size", "max_tokens_per_rank", "min_chunk"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or not 1 <= v <= _MAX_INT):
                raise ValueError(f"{name}={r(v)} must be None or an int >= 1 and <= 2**62 "
                                 f"(set {name} / {ENV_PREFIX}{name.upper()})")
        for name in ("shuffle", "debug"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={r(getattr(self, name))} must be True or False "
                                f"(set {name} / {ENV_PREFIX}{name.upper()})")
        if self.cost_profile is not None:
            if not isinstance(self.cost_profile, (str, os.PathLike)):
                raise TypeError(f"cost_profile must be a path, got {type(self.cost_profile).__name__} "
                                f"{r(self.cost_profile)} (set cost_profile / {ENV_PREFIX}COST_PROFILE)")
            path = os.fspath(self.cost_profile)
            if not isinstance(path, str) or not os.path.isfile(path):
                raise ValueError(f"cost_profile {path_repr(path)} does not exist or is not a file (write one with "
                                 "`atac-hf calibrate`, or unset cost_profile to use cost_preset)")
            from ..cost import CostModel

            try:  # read now: a bad profile is refused here, not at the first batch
                CostModel.from_profile(path)
            except ValueError as e:
                raise ValueError(f"{e} (set cost_profile / {ENV_PREFIX}COST_PROFILE)") from None
            object.__setattr__(self, "cost_profile", path)
        t = self.collective_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real)
                              or not MIN_COLLECTIVE_TIMEOUT_S <= t <= MAX_COLLECTIVE_TIMEOUT_S):
            raise ValueError(f"collective_timeout_s={r(t)} must be None or a number of seconds > 0, from "
                             f"{MIN_COLLECTIVE_TIMEOUT_S:g} to {MAX_COLLECTIVE_TIMEOUT_S:g} (one day) "
                             "(set collective_timeout_s / ATAC_COLLECTIVE_TIMEOUT_S)")
        if t is not None:
            object.__setattr__(self, "collective_timeout_s", float(t))
        if self.kv_exchange is not None and (not isinstance(self.kv_exchange, str)
                                             or self.kv_exchange not in KV_EXCHANGES):
            raise ValueError(f"unknown kv_exchange {r(self.kv_exchange)}; legal values: None, "
                             f"{list(KV_EXCHANGES)} (set kv_exchange / {ENV_PREFIX}KV_EXCHANGE)")
        cap = self.max_tokens_per_rank
        if cap is not None and int(cap) * int(self.cp_size) < int(self.max_tokens):
            need = -(-int(self.max_tokens) // int(self.cp_size))
            raise ValueError(f"max_tokens_per_rank={int(cap)} x cp_size={int(self.cp_size)} holds fewer than "
                             f"max_tokens={int(self.max_tokens)} tokens: a full pack would put {need} tokens on some "
                             f"rank and fail mid-training; raise max_tokens_per_rank to >= {need} or lower max_tokens "
                             f"to <= {int(cap) * int(self.cp_size)} (set max_tokens_per_rank / "
                             f"{ENV_PREFIX}MAX_TOKENS_PER_RANK)")
        for name in ("cp_size", "max_tokens", "window_size", "min_window_packs", "max_tokens_per_rank", "min_chunk"):
            if getattr(self, name) is not None:  # numpy ints become plain ints (YAML/JSON-serialisable)
                object.__setattr__(self, name, int(getattr(self, name)))

    # ------------------------------------------------------------------ derived objects
    def packing_config(self, packs_per_window: int):
        """The :class:`~atac_hf.packing.PackingConfig` for windows of ``packs_per_window`` packs."""
        from ..packing.config import PackingConfig
        if not _is_int(packs_per_window) or packs_per_window < 1:
            raise ValueError(f"packs_per_window={short_repr(packs_per_window)} is invalid: it must be an int >= 1, the "
                             "packs of one window (DP replicas x gradient accumulation steps)")
        return PackingConfig.from_dict({**self.packing_options, "max_tokens": self.max_tokens,
                                        "packs_per_window": int(packs_per_window),
                                        "strategy": self.packing_strategy})

    def steps_per_window(self, packs_per_step: int) -> int:
        """Optimizer steps of ``packs_per_step`` (DP x GA) packs one packing window holds: the smallest
        ``k`` with ``k x packs_per_step >= min_window_packs`` (``wfap`` with windows sized by tokens; else 1)."""
        if not _is_int(packs_per_step) or packs_per_step < 1:
            raise InputTypeError(f"packs_per_step={short_repr(packs_per_step)} is invalid: it must be an int >= 1, "
                                 "the packs of one optimizer step (DP replicas x gradient accumulation steps)")
        if self.window_size is not None or self.packing_strategy != "wfap":
            return 1
        return max(1, -(-self.min_window_packs // int(packs_per_step)))

    def step_packing_config(self, packs_per_step: int):
        """The :class:`~atac_hf.packing.PackingConfig` of a loader whose optimizer step takes
        ``packs_per_step`` packs (DP x GA): windows of :meth:`steps_per_window` steps, ``max_defer``
        (unless set in ``packing_options``) divided by that many steps, rounded up."""
        k = self.steps_per_window(packs_per_step)
        cfg = self.packing_config(packs_per_window=int(packs_per_step) * k)
        if k > 1 and "max_defer" not in self.packing_options:
            cfg = dataclasses.replace(cfg, max_defer=max(1, -(-cfg.max_defer // k)))
        return cfg

    def cost_model(self, model_config: Any = None, *, dtype_bytes: int = 2):
        """The :class:`~atac_hf.cost.CostModel` the planners use.

        Args:
            model_config: the model's HF config (dimensions for a hardware preset); ``None``
                falls back to the package default model.
            dtype_bytes: bytes per K/V element (2 for bf16/fp16, 4 for fp32).
        """
        from ..cost import CostModel, ModelDims, default_cost_model
        from ..cost.profile import profile_model_mismatch

        if self.cost_profile is not None:
            cm = CostModel.from_profile(self.cost_profile)
            differs = None
            if model_config is not None:
                try:
                    dims = ModelDims.from_hf_config(model_config)
                except ValueError:  # a config without readable dimensions: nothing to compare
                    dims = None
                differs = dims is not None and profile_model_mismatch(self.cost_profile, dims)
            if differs:
                raise ValueError(
                    f"cost_profile {self.cost_profile!r} was measured for another model ({differs}): its prices "
                    "would balance this model's packs by another model's costs. Calibrate for this model "
                    "(`atac-hf calibrate --model <its config.json> -o profile.json`) and set cost_profile to it, "
                    "or set cost_profile to null (cost_preset then prices the model from its config)")
            return cm
        if self.cost_preset == "default" or model_config is None:
            return default_cost_model()
        text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
        return CostModel.from_model(text, self.cost_preset, dtype_bytes=dtype_bytes)

    def resolved_min_chunk(self, device_type: str) -> int:
        """``min_chunk`` with the default filled in for ``device_type``."""
        device_type = _device_type(device_type)
        if self.min_chunk is not None:
            return self.min_chunk
        return 128 if device_type == "cuda" else 1

    def resolved_attention_backend(self, device_type: str) -> str:
        """``attention_backend`` with ``auto`` resolved for ``device_type`` and bf16/fp16 inputs
        (the kernel a bf16 run uses; ``auto`` itself decides per call, fp32 inputs run ``sdpa``)."""
        device_type = _device_type(device_type)
        if self.attention_backend != "auto":
            return self.attention_backend
        from ..attention.backends import auto_backend

        return auto_backend(device_type)

    def check_runtime(self, device_type: str) -> None:
        """Fail early when the attention backend cannot run here.

        Raises:
            ValueError: ``flash`` without flash-attn or without CUDA; ``varlen`` without
                torch's varlen_attn or without CUDA; ``flex`` for training on CPU.
        """
        device_type = _device_type(device_type)
        backend = self.resolved_attention_backend(device_type)
        if backend == "varlen":
            from ..attention.varlen import check_varlen_runtime

            check_varlen_runtime(device_type)
        if backend == "flash":
            try:
                import flash_attn  # noqa: F401
            except ImportError:
                raise ValueError(
                    "attention_backend='flash' needs flash-attn, which is not installed: `pip install "
                    "atac-hf[flash]` (CUDA only), or set attention_backend='sdpa' (works everywhere)"
                ) from None
            if device_type != "cuda":
                raise ValueError(f"attention_backend='flash' runs on CUDA only, this run is on {device_type!r}; "
                                 "set attention_backend='sdpa'")
        elif backend == "flex":
            try:
                from torch.nn.attention import flex_attention  # noqa: F401
            except ImportError:
                raise ValueError("attention_backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5): "
                                 "upgrade torch, or set attention_backend='sdpa'") from None
            if device_type != "cuda":
                raise ValueError(f"attention_backend='flex' has no backward on {device_type!r} (torch 2.13); "
                                 "set attention_backend='sdpa' for CPU training")

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML/JSON-serialisable fields (inverse of :meth:`from_dict`)."""
        d = dataclasses.asdict(self)
        d["packing_options"] = dict(self.packing_options)
        return d

    def replace(self, **changes: Any) -> "ATACConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>") -> "ATACConfig":
        """Build from a mapping of field names; unknown keys are an error (typos do not pass silently)."""
        return cls(**_check_keys(data, source))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "ATACConfig":
        """Read a YAML (or JSON) file: the fields at top level, or under an ``atac:`` key.

        Raises:
            ValueError: a missing file, a file that is not a mapping, unknown keys, bad values.
        """
        return cls.from_dict(read_config_file(path), source=os.fspath(path))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ATACConfig":
        """Build from ``ATAC_<FIELD>`` variables only (e.g. ``ATAC_CP_SIZE=2``); see :meth:`from_sources`."""
        return cls(**_env_values(os.environ if environ is None else environ))

    @classmethod
    def from_sources(cls, path: str | os.PathLike | None = None, *, environ: Mapping[str, str] | None = None,
                     overrides: Mapping[str, Any] | None = None) -> "ATACConfig":
        """Merge every source, lowest precedence first: defaults, the file, ``ATAC_*``, ``overrides``.

        Args:
            path: a YAML/JSON config file; ``None`` reads ``ATAC_CONFIG`` if set.
            environ: the environment (default ``os.environ``).
            overrides: explicit values (e.g. command-line flags); ``None`` values are skipped.

        Raises:
            ValueError: unknown keys or ``ATAC_*`` variables, unparsable values, or a ``cp_size``
                that disagrees with ``PARALLELISM_CONFIG_CP_SIZE`` (the launch config).
        """
        if environ is not None and not isinstance(environ, Mapping):
            raise TypeError(f"environ must be a mapping of environment variables or None, got {type(environ).__name__}")
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        file = path if path is not None else (env.get(ENV_CONFIG_FILE) or None)
        if file is not None:
            values.update(_check_keys(read_config_file(file), os.fspath(file)))
        values.update(_env_values(env))
        if overrides is not None and not isinstance(overrides, Mapping):
            raise TypeError(f"overrides must be a mapping of ATAC config fields (e.g. {{'cp_size': 2}}) or None, got "
                            f"{type(overrides).__name__}")
        if overrides:
            values.update(_check_keys({k: v for k, v in overrides.items() if v is not None}, "overrides"))
        launch_cp = env.get("PARALLELISM_CONFIG_CP_SIZE")
        if launch_cp not in (None, ""):
            launch = _parse_int("PARALLELISM_CONFIG_CP_SIZE", launch_cp)
            if "cp_size" not in values:
                values["cp_size"] = launch
            elif values["cp_size"] != launch:
                raise ValueError(
                    f"cp_size={short_repr(values['cp_size'])} (ATAC config) disagrees with PARALLELISM_CONFIG_CP_SIZE={launch} "
                    "(the accelerate launch config's parallelism_config_cp_size): set them to the same value"
                )
        return cls(**values)


# ---------------------------------------------------------------------------- helpers
def _check_keys(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"ATAC config from {source} must be a mapping of settings, got {type(data).__name__}")
    legal = ATACConfig.field_names()
    not_str = [k for k in data if not isinstance(k, str)]
    if not_str:
        raise ValueError(f"ATAC config keys in {source} must be strings, got {short_repr(not_str)}; "
                         f"legal keys: {legal}")
    unknown = sorted(set(data) - set(legal))
    if unknown:
        raise ValueError(f"unknown ATAC config keys {short_repr(unknown)} in {source}; legal keys: {legal}")
    return dict(data)


def _parse_int(name: str, raw: str) -> int:
    text = raw.strip()
    # ASCII digits only: int() also reads "1_0" as 10 and other scripts' digits, which a typo should not pass
    try:
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError
        return int(text)  # (over 4300 digits: ValueError too)
    except ValueError:
        raise ValueError(f"{name}={short_repr(raw)} is not an integer (ASCII digits, e.g. {name}=4)") from None


def _env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """``ATAC_<FIELD>`` variables parsed to field types; unknown ``ATAC_*`` names are an error."""
    fields = {f.name: f for f in dataclasses.fields(ATACConfig)}
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key == ENV_CONFIG_FILE:
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in fields:
            legal = [ENV_PREFIX + n.upper() for n in fields] + [ENV_CONFIG_FILE]
            raise ValueError(f"unknown environment variable {key}; legal ATAC_* variables: {legal}")
        out[name] = _parse_env(key, name, raw)
    return out


_INT_FIELDS = ("cp_size", "min_window_packs")
_OPT_INT_FIELDS = ("window_size",)
_TOKEN_FIELDS = ("max_tokens", "max_tokens_per_rank", "min_chunk")  # also "16K"
_BOOL_FIELDS = ("shuffle", "debug")


def _parse_env(key: str, name: str, raw: str) -> Any:
    text = raw.strip()
    if name in _INT_FIELDS:
        return _parse_int(key, text)
    if name in _OPT_INT_FIELDS:
        return None if text.lower() in _NONE else _parse_int(key, text)
    if name in _TOKEN_FIELDS:
        return None if name != "max_tokens" and text.lower() in _NONE else token_count(text, key, key)
    if name in _BOOL_FIELDS:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{key}={short_repr(raw)} is not a boolean; use one of {list(_TRUE + _FALSE)}")
    if name == "packing_options":
        from .._io import _max_depth

        try:
            if len(text) > MAX_CONFIG_BYTES or _max_depth(text) > MAX_CONFIG_DEPTH:
                raise ValueError(f"over {MAX_CONFIG_BYTES} bytes or nested over {MAX_CONFIG_DEPTH} levels")
            value = json.loads(text, object_pairs_hook=unique_keys) if text else {}
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise ValueError(f"{key} must be a JSON object of PackingConfig fields, e.g. "
                             f"'{{\"overlength\": \"split\"}}': {short_text(e)}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a JSON object, got {type(value).__name__}")
        return value
    if name in ("cost_profile", "kv_exchange"):
        return None if text.lower() in _NONE else text
    if name == "collective_timeout_s":
        if text.lower() in _NONE:
            return None
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{key}={short_repr(raw)} is not a number of seconds") from None
    return text

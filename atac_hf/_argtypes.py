"""Argument types shared by the ``atac-hf`` sub-commands (argparse only, no numpy)."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["DEFAULT_MODEL", "config_dims", "model_arg", "model_or_preset", "parse_float", "parse_int", "parse_tokens", "profile_model",
           "read_model_config"]


def _ascii_number(text: str, convert: Any, what: str) -> Any:
    """``convert`` of ``text`` stripped, ASCII only (Python's ``int`` and ``float`` also take other
    scripts' digits, such as ``"٢"``, which ``--doc-lengths`` and the ``ATAC_*`` variables refuse)."""
    t = str(text).strip()
    try:
        if not t.isascii():
            raise ValueError(t)
        return convert(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def parse_int(text: str) -> int:
    """An int flag: ASCII digits and an optional sign."""
    return _ascii_number(text, int, "an int (ASCII digits, e.g. 8)")


def parse_float(text: str) -> float:
    """A number flag, ASCII only."""
    return _ascii_number(text, float, "a number (ASCII digits, e.g. 0.5)")


def parse_tokens(text: str) -> int:
    """``"131072"``, ``"128K"`` or ``"128k"`` -> tokens (K = 1024); ASCII digits only."""
    return _ascii_number(text, lambda t: int(t[:-1]) * 1024 if t[-1:].lower() == "k" else int(t),
                         "a token count (e.g. 32768 or 32K)")


def model_arg(spec: str) -> Any:
    """``--model``: a model preset name (lower-cased), or the :class:`~atac_hf.cost.ModelDims` of an HF
    ``config.json`` (or of the one in a checkpoint folder), read as :func:`read_model_config` reads it."""
    from .cost import MODEL_PRESETS

    if spec.lower() in MODEL_PRESETS:
        return spec.lower()
    return config_dims(spec, read_model_config(spec))


def config_dims(spec: str, config: Any) -> Any:
    """The :class:`~atac_hf.cost.ModelDims` of ``config``, ``--model spec``'s file as :func:`read_model_config`
    read it; ValueError naming ``--model`` where its fields cannot be read."""
    from .cost import MODEL_PRESETS, ModelDims

    try:
        return ModelDims.from_hf_config(config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--model {spec!r}: {e}; give --model a preset {sorted(MODEL_PRESETS)} or a config.json "
                         "with those fields") from None


def read_model_config(spec: str) -> Any:
    """The HF ``config.json`` at ``spec`` (or in the checkpoint folder ``spec``) as transformers reads it:
    through its config class where transformers knows its ``model_type``, which maps the file's field
    aliases (GPT-2's ``n_embd``, Falcon's ``n_head``), fills the fields the file leaves at their defaults
    and derives the rest (``layer_types`` from Gemma's ``sliding_window_pattern``); else the file's own
    fields (a dict). Raises ValueError for a path that is not a JSON object's file."""
    from .cost import MODEL_PRESETS

    path = _config_file(spec)
    if not os.path.exists(path):
        raise ValueError(f"--model {spec!r} is neither a preset {sorted(MODEL_PRESETS)} nor an existing config.json "
                         "(or a checkpoint folder holding one)")
    from ._io import load_json  # bounded: regular files only, size and depth capped

    data = load_json(path, "--model config", "--model")  # HF config.json fields
    if not isinstance(data, dict):
        raise ValueError(f"--model {spec!r} must hold a JSON object (an HF config.json), got {type(data).__name__}")
    if not isinstance(data.get("model_type"), str) or not _few_layers(data):
        return data
    try:
        import transformers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # (a config class's notes on its own defaults)
        try:
            return transformers.AutoConfig.for_model(**data)
        finally:
            transformers.logging.set_verbosity(verbosity)
    except Exception:  # noqa: BLE001 - no transformers, a model_type it does not know, or fields its class
        return data  # refuses: the file's own fields, which ModelDims checks and names


#: Layer counts above this are not handed to a transformers config class, which builds per-layer lists
#: (``layer_types``) of that length at once: the file's own fields are read instead (no real model comes near).
MAX_CONFIG_LAYERS = 1 << 16


def _few_layers(data: Any) -> bool:
    """Whether every int field of ``data`` (and of the mappings in it) named like a layer count is at most
    :data:`MAX_CONFIG_LAYERS`."""
    if isinstance(data, dict):
        return all(_few_layers(v) and not ("layer" in str(k) and isinstance(v, int) and v > MAX_CONFIG_LAYERS)
                   for k, v in data.items())
    return all(_few_layers(v) for v in data) if isinstance(data, list) else True


def model_or_preset(spec: str) -> Any:
    """``--model`` of ``plan`` / ``pack``: an HF ``config.json`` (its fields, as :func:`model_arg`), else the name,
    which :meth:`~atac_hf.cost.CostModel.from_model` checks against the presets."""
    return model_arg(spec) if os.path.isfile(_config_file(spec)) else spec


def _config_file(spec: str) -> str:
    """A checkpoint folder holding a ``config.json`` -> that file; anything else unchanged."""
    inner = os.path.join(spec, "config.json")
    return inner if os.path.isdir(spec) and os.path.isfile(inner) else spec


#: ``--model`` of ``plan`` / ``pack`` when neither it nor a cost profile is given.
DEFAULT_MODEL = "8b"


def profile_model(path: str, flag: str, model: str | None = None) -> Any:
    """``CostModel.from_profile(path)``, its refusals naming the flag that gave the path.

    ``model``: the ``--model`` given beside the profile (None: omitted, the profile's model). It
    must be the model the profile was measured for (its ``metadata.model``, as ``atac-hf
    calibrate`` writes it; a profile that does not say is taken as measured for it).

    Raises:
        ValueError: an unreadable profile, a bad ``--model``, or one the profile was not measured for.
    """
    from .cost import CostModel
    from .cost.presets import resolve_model
    from .cost.profile import profile_metadata, profile_model_mismatch

    try:
        cm = CostModel.from_profile(path)
    except ValueError as e:
        raise ValueError(f"{e} (check {flag})") from None
    if model is None:
        return cm
    dims = resolve_model(model_or_preset(model))
    meta = profile_metadata(path)
    detail = profile_model_mismatch(meta, dims)
    if detail:
        pm = meta["model"]
        theirs = f"h{pm.get('hidden_size')!r:.20}x{pm.get('num_layers')!r:.20}"
        raise ValueError(f"--model {model!r} (h{dims.hidden_size}x{dims.num_layers}) is not the model {flag} "
                         f"{path!r} was measured for ({theirs}; {detail}): omit --model to use the profile's "
                         f"model, give the model it was measured for, or calibrate one for {model!r} "
                         f"(`atac-hf calibrate --model {model}`)")
    return cm

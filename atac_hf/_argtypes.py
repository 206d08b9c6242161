"""Argument types shared by the ``atac-hf`` sub-commands (argparse only, no numpy)."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["DEFAULT_MODEL", "model_arg", "model_or_preset", "parse_float", "parse_int", "parse_tokens", "profile_model"]


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
    """``--model``: a model preset name (lower-cased) or the fields of an HF ``config.json`` (or of the one
    in a checkpoint folder)."""
    from .cost import MODEL_PRESETS

    if spec.lower() in MODEL_PRESETS:
        return spec.lower()
    spec = _config_file(spec)
    if os.path.exists(spec):
        from ._io import load_json  # bounded: regular files only, size and depth capped

        data = load_json(spec, "--model config", "--model")  # HF config.json fields
        if not isinstance(data, dict):
            raise ValueError(f"--model {spec!r} must hold a JSON object (an HF config.json), got {type(data).__name__}")
        if "hidden_size" not in data and isinstance(data.get("text_config"), dict):
            return _text_model(data, spec)
        return data
    raise ValueError(f"--model {spec!r} is neither a preset {sorted(MODEL_PRESETS)} nor an existing config.json")


def _text_model(data: dict, spec: str) -> Any:
    """The text model of a composite config.json (a vision-language model's ``text_config``), as
    :class:`~atac_hf.cost.ModelDims`: read through its transformers config class where transformers
    knows the ``model_type`` (the file leaves out the fields equal to that class's defaults, such as
    Gemma 3's heads), else from the file's own fields."""
    from .cost import ModelDims

    config: Any = data["text_config"]
    try:
        from transformers import AutoConfig

        config = AutoConfig.for_model(**data).get_text_config()
    except Exception:  # noqa: BLE001 - no transformers, or a model_type it does not know: the file's fields
        pass
    try:
        return ModelDims.from_hf_config(config)
    except (TypeError, ValueError) as e:
        from .cost import MODEL_PRESETS

        raise ValueError(f"--model {spec!r}: its text_config cannot be read: {e}; give --model a preset "
                         f"{sorted(MODEL_PRESETS)} or a config.json whose text_config has those fields") from None


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

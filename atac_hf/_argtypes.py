"""Argument types shared by the ``atac-hf`` sub-commands (argparse only, no numpy)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

__all__ = ["model_arg", "parse_tokens"]


def parse_tokens(text: str) -> int:
    """``"131072"``, ``"128K"`` or ``"128k"`` -> tokens (K = 1024)."""
    t = str(text).strip()
    try:
        return int(t[:-1]) * 1024 if t[-1:].lower() == "k" else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count (e.g. 32768 or 32K)") from None


def model_arg(spec: str) -> Any:
    """``--model``: a model preset name (lower-cased) or the fields of an HF ``config.json``."""
    from .cost import MODEL_PRESETS

    if spec.lower() in MODEL_PRESETS:
        return spec.lower()
    if os.path.exists(spec):
        with open(spec, encoding="utf-8") as f:
            try:
                return json.load(f)  # HF config.json fields
            except json.JSONDecodeError as e:
                raise ValueError(f"--model {spec!r} is not a valid HF config JSON: {e}") from None
    raise ValueError(f"--model {spec!r} is neither a preset {sorted(MODEL_PRESETS)} nor an existing config.json")

"""Reading the project's JSON files (profiles, length lists) with one set of clear errors.

JSON only: nothing read here can execute code. Numpy-free, torch-free.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["load_json"]


def load_json(path: str | os.PathLike, what: str, setting: str) -> Any:
    """Parse the JSON file at ``path``.

    Args:
        path: the file.
        what: what the file is, for messages (``"cost profile"``, ``"lengths file"``).
        setting: the option or field that named it, so the message says what to change.

    Raises:
        ValueError: the path does not exist, is a directory, or holds invalid JSON.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{what} {path!r} is a directory, not a JSON file (check {setting})")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{what} {path!r} does not exist (check {setting})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path!r} is not valid JSON: {e}") from None

"""Reading the project's JSON files (profiles, length lists) with one set of clear errors.

JSON only: nothing read here can execute code. Reads are bounded: only regular files (never
a device or a pipe such as ``/dev/zero``), at most :data:`MAX_JSON_BYTES` bytes after
decompression, nested at most :data:`MAX_JSON_DEPTH` deep. ``.gz`` files are decompressed.
Numpy-free, torch-free.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
from typing import Any

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "load_json"]

#: Largest JSON text read (bytes, after decompression): 64M lengths of 3-4 digits fit.
MAX_JSON_BYTES = 256 * 2**20
#: Deepest nesting of arrays and objects accepted (the project's files nest at most 4 deep).
MAX_JSON_DEPTH = 32
_BRACKETS = re.compile(r"[\[\]{}]")


def load_json(path: str | os.PathLike, what: str, setting: str) -> Any:
    """Parse the JSON file at ``path`` (gzip-compressed when it ends in ``.gz``).

    Args:
        path: the file.
        what: what the file is, for messages (``"cost profile"``, ``"lengths file"``).
        setting: the option or field that named it, so the message says what to change.

    Raises:
        ValueError: the path does not exist, is not a regular file, is larger than
            :data:`MAX_JSON_BYTES`, nests deeper than :data:`MAX_JSON_DEPTH`, or holds
            invalid JSON.
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"{what} {path!r} does not exist (check {setting})") from None
    except OSError as e:
        raise ValueError(f"{what} {path!r} cannot be read: {e.strerror or e} (check {setting})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what} {path!r} is a directory, not a JSON file (check {setting})")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {path!r} is not a regular file (a device, pipe or socket); give a JSON file "
                         f"(check {setting})")
    limit = MAX_JSON_BYTES
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read(limit + 1)
    except (OSError, EOFError) as e:
        raise ValueError(f"{what} {path!r} cannot be read: {e} (check {setting})") from None
    if len(raw) > limit:
        raise ValueError(f"{what} {path!r} holds more than {limit} bytes of JSON, over the limit "
                         f"atac_hf._io.MAX_JSON_BYTES (check {setting})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path!r} is not valid JSON: {e}") from None
    depth = _max_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{what} {path!r} nests {depth} levels deep, more than {MAX_JSON_DEPTH} "
                         f"(check {setting})")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{what} {path!r} is not valid JSON: {e}") from None


def _max_depth(text: str) -> int:
    """Nesting depth of brackets outside strings, an upper bound on the JSON's depth
    (cheap: it skips string contents by splitting on quotes)."""
    depth = best = 0
    # even-indexed parts lie outside strings; escaped quotes inside strings are rare and
    # can only make this over-count, which a refusal then reports honestly as depth
    parts = text.replace('\\\\', '').replace('\\"', '').split('"')
    for part in parts[::2]:
        for m in _BRACKETS.finditer(part):
            if m.group() in "[{":
                depth += 1
                best = max(best, depth)
            else:
                depth -= 1
    return best

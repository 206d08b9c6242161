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
import tempfile
from typing import Any

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "check_output_dir", "check_output_file", "load_json"]

#: Largest JSON text read (bytes, after decompression): 64M lengths of 3-4 digits fit.
MAX_JSON_BYTES = 256 * 2**20
#: Deepest nesting of arrays and objects accepted (the project's files nest at most 4 deep).
MAX_JSON_DEPTH = 32
_BRACKETS = re.compile(r"[\[\]{}]")


def load_json(path: str | os.PathLike, what: str, setting: str, *, format_hint: str = "") -> Any:
    """Parse the JSON file at ``path`` (gzip-compressed when it ends in ``.gz``).

    Args:
        path: the file.
        what: what the file is, for messages (``"cost profile"``, ``"lengths file"``).
        setting: the option or field that named it, so the message says what to change.
        format_hint: what ``setting`` reads (and where other formats go), added to the message
            of a file that is not JSON text (e.g. a ``.npy`` or ``.csv`` file).

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
        raise ValueError(f"{what} {path!r} is not valid JSON: {e}{format_hint} (check {setting})") from None
    depth = _max_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{what} {path!r} nests {depth} levels deep, more than {MAX_JSON_DEPTH} "
                         f"(check {setting})")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{what} {path!r} is not valid JSON: {e}{format_hint} (check {setting})") from None
    except ValueError as e:  # an int of more than 4300 digits (Python's int-from-string limit)
        raise ValueError(f"{what} {path!r} cannot be parsed: {e} (check {setting})") from None


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


def check_output_file(path: str | os.PathLike, flag: str, what: str, *, example: str = "out.json",
                      make_folders: bool = False) -> None:
    """Refuse an output file path before any work is done (a run may take minutes).

    Args:
        path: the file to be written.
        flag: the option that named it (``"--output"``), for messages.
        what: what the file is (``"profile"``, ``"report"``).
        example: a file name the message suggests when ``path`` is a directory.
        make_folders: the writer creates missing folders (then the nearest existing folder
            above must be writable); otherwise the folder must exist.

    Raises:
        ValueError: ``path`` is a directory or an existing non-regular file (a device, a pipe),
            its folder is missing (``make_folders=False``) or not a folder, or nothing can be
            written there (probed with a temporary file that is removed at once).
    """
    shown = _shown(path)
    out = os.path.abspath(os.fspath(path))
    if os.path.isdir(out):
        raise ValueError(f"{flag} {shown} is a directory; give the {what}'s file name (e.g. {example})")
    if os.path.exists(out) and not os.path.isfile(out):
        raise ValueError(f"{flag} {shown} exists and is not a regular file (a device or pipe); give a file name "
                         f"for the {what}")
    folder = os.path.dirname(out)
    if not os.path.isdir(folder):
        if not make_folders:
            raise ValueError(f"{flag} {shown}: the folder {folder!r} does not exist; create it first or choose "
                             f"another {flag}")
        folder = _existing_ancestor(folder, flag, shown)
    if os.path.exists(out) and not os.access(out, os.W_OK):
        raise ValueError(f"{flag} {shown} is not writable here; choose another {flag}")
    _probe_writable(folder, flag, shown)


def check_output_dir(path: str | os.PathLike, flag: str) -> None:
    """Refuse an output folder before any work is done: it must be a directory (or not exist yet,
    under a writable folder: the writer creates it) where files can be written.

    Raises:
        ValueError: ``path`` exists and is not a directory, or nothing can be written there.
    """
    shown = _shown(path)
    out = os.path.abspath(os.fspath(path))
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{flag} {shown} exists and is not a directory; give a folder for the files (it is "
                         "created if missing)")
    _probe_writable(out if os.path.isdir(out) else _existing_ancestor(out, flag, shown), flag, shown)


def _shown(path: Any) -> str:
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    return repr(text) if len(text) <= 200 else repr(text[:197] + "...")


def _existing_ancestor(folder: str, flag: str, shown: str) -> str:
    """The nearest existing path above ``folder``; it must be a directory."""
    up = folder
    while not os.path.exists(up):
        parent = os.path.dirname(up)
        if parent == up:
            break
        up = parent
    if not os.path.isdir(up):
        raise ValueError(f"{flag} {shown}: {up!r} is not a folder, so the folders below it cannot be created; "
                         f"choose another {flag}")
    return up


def _probe_writable(folder: str, flag: str, shown: str) -> None:
    """Create (and at once remove) a temporary file in ``folder``: os.access alone says yes to root
    everywhere, even where the kernel refuses (``/proc``, a read-only mount)."""
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {shown} is not writable here (folder {folder!r}); choose another {flag}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {shown} is not writable here (folder {folder!r}: {e.strerror or e}); choose "
                         f"another {flag}") from None

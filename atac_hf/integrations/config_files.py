"""Reading ATAC config files, bounded: nothing in them is executed, and no file, however hostile,
hangs the reader, fills the memory or produces a huge message.

Regular files only (never a device, a pipe or a directory), at most :data:`MAX_CONFIG_BYTES`
bytes, YAML through ``SafeLoader`` with aliases refused (a few hundred bytes of them stand for
billions of items: the billion laughs) and nesting at most :data:`MAX_CONFIG_DEPTH` deep, JSON
depth-checked before parsing, every mapping key a string. Messages quote values through
:func:`short_repr`. Used by :class:`~atac_hf.integrations.config.ATACConfig`.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import stat
from typing import Any, Mapping

__all__ = ["MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH", "path_repr", "read_config_file", "short_repr", "short_text",
           "token_count"]

#: Largest config file read (bytes): real configs are a few hundred; parsing 64 KiB takes < 1 s.
MAX_CONFIG_BYTES = 64 << 10
#: Deepest nesting of mappings and lists accepted in a config file (real ones nest 3 deep).
MAX_CONFIG_DEPTH = 16

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_repr.maxlevel = 3


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to about 100 characters (safe on huge or deeply nested values)."""
    try:
        return _repr.repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__: only for a message
        return f"<{type(value).__name__}>"


def check_count(value: Any, name: str, what: str, low: int | None = 1) -> int:
    """``value`` as an int >= ``low`` (a Python or numpy int; never a bool, a float or a string; ``low``
    None: any int), or a ValueError naming it, what it counts and the legal values."""
    import numpy as np

    from ..packing.validate import InputTypeError

    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not is_int or (low is not None and value < low):
        legal = "an int" if low is None else f"an int >= {low}"
        raise (ValueError if is_int else InputTypeError)(f"{name}={short_repr(value)} is invalid: it must be "
                                                         f"{legal} ({what})")
    return int(value)


def token_count(text: str, name: str, setting: str) -> int:
    """A token count written as text, as the command-line tools take it: ASCII digits, or digits and
    ``K`` (x 1024): ``"16384"`` and ``"16K"`` -> 16384. ``ValueError`` naming ``setting`` otherwise."""
    m = re.fullmatch(r"([0-9]{1,18})([kK]?)", text.strip())
    if m is None:
        raise ValueError(f"{name}={short_repr(text)} is not a token count: write ASCII digits, or digits and K "
                         f"(x 1024), e.g. 16384 or 16K (set {setting})")
    return int(m[1]) * (1024 if m[2] else 1)


def path_repr(path: str) -> str:
    """repr of a path for messages: whole up to 400 characters (paths are what users search for)."""
    text = repr(path)
    return text if len(text) <= 400 else text[:200] + "..." + text[-197:]


def _load_yaml(text: str) -> Any:
    """Plain data from YAML text through ``SafeLoader`` (no tag constructs an object), refusing
    aliases (a few hundred bytes of them stand for billions of items: the billion laughs) and
    nesting deeper than :data:`MAX_CONFIG_DEPTH`. The events are checked first, then loaded;
    both passes run in libyaml (C) where it is installed."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = 0
    maps: list = []  # per open collection: [keys seen, expecting a key] for a mapping, None for a sequence
    for event in yaml.parse(text, Loader=loader):
        if maps and maps[-1] is not None and isinstance(event, (yaml.NodeEvent, yaml.CollectionStartEvent)):
            seen = maps[-1]
            if seen[1] and isinstance(event, yaml.ScalarEvent):  # a key: YAML loaders keep the last of duplicates
                if event.value in seen[0]:
                    raise yaml.YAMLError(f"the key {event.value[:40]!r} appears twice in one mapping "
                                         f"({_mark(event)}): keep one")
                seen[0].add(event.value)
            seen[1] = not seen[1]
        if isinstance(event, yaml.MappingStartEvent):
            maps.append([set(), True])
        elif isinstance(event, yaml.SequenceStartEvent):
            maps.append(None)
        elif isinstance(event, yaml.CollectionEndEvent):
            maps.pop()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.YAMLError(f"found the alias *{str(event.anchor)[:40]} ({_mark(event)}): YAML aliases are "
                                 "not allowed in an ATAC config")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                raise yaml.YAMLError(f"nesting deeper than {MAX_CONFIG_DEPTH} levels ({_mark(event)}; "
                                     "atac_hf.integrations.config.MAX_CONFIG_DEPTH)")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    parser = loader(text)  # what yaml.safe_load does, with the C loader where there is one
    try:
        return parser.get_single_data()
    finally:
        parser.dispose()


def unique_keys(pairs: list) -> dict:
    """A JSON object's dict, refusing a key given twice (``json`` keeps the last)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        dup = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
        raise ValueError(f"the key {dup[:40]!r} appears twice in one object: keep one")
    return out


def _mark(event: Any) -> str:
    m = getattr(event, "start_mark", None)
    return f"line {m.line + 1}, column {m.column + 1}" if m is not None else "?"


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    where = "(check --atac_config / ATAC_CONFIG)"
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise TypeError(f"ATAC config file must be a path (str or os.PathLike), got {type(path).__name__} {where}")
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise ValueError(f"ATAC config file {path_repr(path)} does not exist or is not a file (a directory, "
                         f"device or pipe) {where}")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"ATAC config file {path_repr(path)} has {st.st_size} bytes, more than "
                         f"{MAX_CONFIG_BYTES} (atac_hf.integrations.config.MAX_CONFIG_BYTES): not a config {where}")
    is_json = path.endswith(".json")
    kind = "JSON" if is_json else "YAML"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ValueError(f"ATAC config file {path_repr(path)} cannot be read: {e.strerror or e} {where}") from None
    if len(raw) > MAX_CONFIG_BYTES:  # grew since the stat
        raise ValueError(f"ATAC config file {path_repr(path)} has more than {MAX_CONFIG_BYTES} bytes {where}")
    try:
        text = raw.decode("utf-8")
        if is_json:
            from .._io import _max_depth

            depth = _max_depth(text)
            if depth > MAX_CONFIG_DEPTH:
                raise ValueError(f"nesting {depth} levels deep, more than {MAX_CONFIG_DEPTH}")
            data = json.loads(text, object_pairs_hook=unique_keys)
        else:
            data = _load_yaml(text)
    except (yaml.YAMLError, ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise ValueError(f"ATAC config file {path_repr(path)} is not valid {kind}: {short_text(e)}") from None
    _check_tree_keys(data, path)
    if data is None:
        return {}
    if isinstance(data, Mapping) and set(data) == {"atac"}:
        data = data["atac"] or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"ATAC config file {path_repr(path)} must hold a mapping of settings (optionally under "
                         f"'atac:'), got {type(data).__name__}")
    data = dict(data)
    profile = data.get("cost_profile")
    if isinstance(profile, str) and profile and not os.path.isabs(profile):
        # a relative profile path is relative to the config file, not to the working directory
        data["cost_profile"] = os.path.join(os.path.dirname(os.path.abspath(path)), profile)
    return data


def short_text(e: BaseException, limit: int = 300) -> str:
    text = str(e)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_tree_keys(data: Any, path: str) -> None:
    """Every mapping key in a loaded file is a string (YAML also makes ints, bools, dates and
    None keys; mixed key types would break sorting and lookups later). Iterative: the depth
    is bounded already, the node count by the file size."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            bad = [k for k in node if not isinstance(k, str)]
            if bad:
                raise ValueError(f"ATAC config file {path_repr(path)} has non-string keys {short_repr(bad)}: "
                                 "keys are setting names (quote them, e.g. '1': ...)")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def device_type(device: Any) -> str:
    """The device type (``"cpu"``, ``"cuda"``, ...) of a ``torch.device``, a device type or a device
    string such as ``"cuda:0"``; anything else is refused."""
    import torch

    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        try:
            return torch.device(device).type
        except (RuntimeError, ValueError):
            pass
    from ..packing.validate import InputTypeError

    raise (ValueError if isinstance(device, str) else InputTypeError)(
        f"device_type={short_repr(device)} is not a device: pass a device type such as 'cpu' or 'cuda', a device "
        "string such as 'cuda:0', or a torch.device (e.g. accelerator.device)")

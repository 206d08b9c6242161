"""Cost profiles: a :class:`~atac_hf.cost.CostModel` as JSON (``atac-hf calibrate`` writes
them, ``cost_profile`` settings read them). Loading validates the format, the keys and every
field, and never executes code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from typing import Any, Mapping

from .._io import load_json

__all__ = ["PROFILE_FORMAT", "load_profile", "model_from_dict", "model_to_dict", "profile_metadata", "profile_model_mismatch", "profile_text",
           "save_profile"]

#: The model dimensions a profile's measured prices depend on (its ``metadata.model``).
PROFILE_DIMS = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")

PROFILE_FORMAT = "atac-hf/cost-profile/v1"


def load_profile(cls: type, path: str | os.PathLike) -> Any:
    """Read the profile at ``path`` into a ``cls`` (a CostModel class)."""
    path = _fspath(path)
    data = load_json(path, "cost profile", "the cost profile path setting")
    return model_from_dict(cls, data, source=path)


def profile_metadata(path: str | os.PathLike) -> Mapping[str, Any]:
    """A profile's ``metadata`` object (empty where it has none)."""
    meta = load_json(_fspath(path), "cost profile", "the cost profile path setting").get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def profile_model_mismatch(path: str | os.PathLike | Mapping[str, Any], dims: Any) -> str | None:
    """How the model a profile was measured for (its ``metadata.model``, written by ``atac-hf
    calibrate``) differs from ``dims`` (a :class:`~atac_hf.cost.ModelDims`), e.g. ``"hidden_size:
    profile 128 vs model 4096"``; None where they agree or the profile does not say. ``path``: the
    profile, or its :func:`profile_metadata` already read."""
    meta = path if isinstance(path, Mapping) else profile_metadata(path)
    pm = meta.get("model")
    if not isinstance(pm, Mapping):
        return None
    bad = [f"{k}: profile {_cut_repr(pm[k])} vs model {getattr(dims, k)!r}" for k in PROFILE_DIMS
           if k in pm and pm[k] != getattr(dims, k)]
    return ", ".join(bad) or None


def _fspath(path: Any) -> str:
    """A profile path as a str; anything but a str or an ``os.PathLike`` is a TypeError naming it."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"cost profile path must be a str or os.PathLike (a JSON file written by CostModel.save or "
                        f"`atac-hf calibrate`), got {type(path).__name__} {_cut_repr(path)}")
    return os.fspath(path)


def model_from_dict(cls: type, data: Mapping[str, Any], *, source: str = "<dict>") -> Any:
    """Validate a profile JSON object and build a ``cls`` from its ``cost_model`` fields."""
    if not isinstance(data, Mapping):
        raise ValueError(f"cost profile {source} must be a JSON object, got {type(data).__name__}")
    if data.get("format") != PROFILE_FORMAT:
        raise ValueError(
            f"cost profile {source} has format {_cut_repr(data.get('format'))}; expected {PROFILE_FORMAT!r} "
            "(write profiles with CostModel.save or `atac-hf calibrate`)"
        )
    extra = _few(set(data) - {"format", "cost_model", "metadata"})
    if extra:
        raise ValueError(f"cost profile {source} has unknown top-level keys {extra}; legal keys: "
                         "['cost_model', 'format', 'metadata']")
    fields = {f.name for f in dataclasses.fields(cls)}
    params = data.get("cost_model")
    if not isinstance(params, Mapping):
        raise ValueError(f"cost profile {source} has no 'cost_model' object")
    unknown = _few(set(params) - fields)
    if unknown:
        raise ValueError(f"cost profile {source} has unknown fields {unknown}; legal fields: {sorted(fields)}")
    required = sorted(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                      and f.default_factory is dataclasses.MISSING and f.init)
    missing = [k for k in required if k not in params]
    if missing:
        raise ValueError(f"cost profile {source} has no {missing} in its 'cost_model' object (required fields: "
                         f"{required}); write profiles with CostModel.save or `atac-hf calibrate`")
    try:
        model = cls(**params)
    except (TypeError, ValueError) as e:
        raise ValueError(f"cost profile {source}: {e}") from None
    model.check_prices_compute(f"the cost profile {source}")
    return model


def _few(keys: Any, limit: int = 10) -> list:
    """Up to ``limit`` keys, sorted whatever their types, each repr cut short (for messages)."""
    out = sorted(keys, key=lambda k: (type(k).__name__, str(k)[:100]))
    shown = [k if isinstance(k, str) and len(k) <= 80 else _cut(k) for k in out[:limit]]
    return shown + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def _cut_repr(v: Any) -> str:
    text = repr(v) if isinstance(v, (str, type(None), float, bool)) or (isinstance(v, int) and abs(v) < 10**60) \
        else f"<{type(v).__name__}>"
    return text[:77] + "..." if len(text) > 80 else text


def _cut(k: Any) -> str:
    text = k if isinstance(k, str) else type(k).__name__
    return text[:77] + "..." if len(text) > 80 else text


def model_to_dict(model: Any, /, **metadata: Any) -> dict[str, Any]:
    """The profile JSON object of a cost model, ``metadata`` kept beside it (numpy numbers and
    arrays become plain Python numbers and lists, so the object always serialises)."""
    return {"format": PROFILE_FORMAT, "cost_model": _plain(dataclasses.asdict(model)), "metadata": _plain(metadata)}


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars (``np.float32``, ``np.int64``, ``np.bool_``) and arrays turned
    into Python numbers and lists, recursively through dicts, lists and tuples."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if type(value).__module__ == "numpy":
        if hasattr(value, "tolist"):  # np.generic and np.ndarray
            return _plain(value.tolist())
    return value


def profile_text(model: Any, /, **metadata: Any) -> str:
    """The JSON text :func:`save_profile` writes.

    Raises:
        ValueError: a metadata value (or a field) is not JSON-serialisable; the message names it.
    """
    data = model_to_dict(model, **metadata)
    try:
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as e:
        bad = [k for k, v in data["metadata"].items() if not _serialisable(v)]
        where = f"metadata {bad}" if bad else "its cost_model fields"
        raise ValueError(f"cost profile cannot be written: {where} are not JSON-serialisable ({e}); "
                         "pass plain numbers, strings, lists or dicts") from None


def _serialisable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def save_profile(model: Any, path: str | os.PathLike, /, **metadata: Any) -> None:
    """Write a cost model as a JSON profile.

    Atomic: the JSON text is built first (a value that cannot be serialised raises before any
    file is touched), written to a temporary file in the same folder and moved over ``path``
    with :func:`os.replace`, so an existing profile is either fully replaced or left as it was.
    """
    text = profile_text(model, **metadata)
    path = _fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot save the cost profile to {path!r}: it is a directory; give a file name "
                                f"(e.g. {os.path.join(path, 'profile.json')!r})")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot save the cost profile to {path!r}: its folder {folder!r} does not exist; "
                                "create it first or choose another path")
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    except OSError as e:  # named by the user's path, not the temporary file's
        raise type(e)(f"cannot save the cost profile to {path!r}: {e.strerror or e} in its folder {folder!r}; "
                      "choose a writable folder") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

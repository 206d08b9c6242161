"""Make ``import atac_hf`` enough for ``attn_implementation="atac_cp"``, without importing torch.

Registering the attention needs ``transformers.AttentionInterface`` (and so torch), which
the numpy-only planning code must not pull in. So ``import atac_hf`` either registers at
once, when the module defining ``AttentionInterface`` is already loaded, or installs a
one-shot post-import hook: a :class:`importlib.abc.MetaPathFinder` that wraps the loader of
that module and registers ``atac_cp`` right after the module has executed. Nothing of
transformers is patched on import; the finder removes itself after it fired (or on
:func:`remove_hook`), and registration is idempotent. (The first CP > 1 shard later wraps the
registry's other functions, through its public ``register``, so that a model left on ``sdpa`` refuses a
shard: :mod:`atac_hf.attention.stock_guard`.)

A registration that fails (e.g. another function already holds the name) warns instead of
breaking the user's ``import transformers``; ``ATACTrainer`` / ``ATACAccelerator`` register
again and then raise the error.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Any

__all__ = ["TARGET_MODULE", "install", "remove_hook"]

#: The transformers module that defines ``AttentionInterface`` (transformers >= 4.48, 5.x).
TARGET_MODULE = "transformers.modeling_utils"


def _register() -> None:
    try:
        from .attention import register_attention  # imports torch: transformers already did

        register_attention()
    except Exception as e:  # noqa: BLE001 - never break the user's transformers import
        warnings.warn(f"atac_hf could not register the 'atac_cp' attention on import ({type(e).__name__}: {e}); "
                      "import atac_hf.attention to see the error", RuntimeWarning, stacklevel=2)


class _RegisteringLoader(importlib.abc.Loader):
    """The target module's own loader, plus a registration once the module executed."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        remove_hook()
        module.__loader__ = self._loader  # later readers (inspect, resources) see the original
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _register()

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders for :data:`TARGET_MODULE` and wraps its loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


_FINDER = _Finder()


def install() -> bool:
    """Register now if transformers' attention registry is loaded, else hook its import.

    Returns True when ``atac_cp`` was registered now. Idempotent.
    """
    if TARGET_MODULE in sys.modules:
        _register()
        return True
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return False


def remove_hook() -> None:
    """Take the import hook out of ``sys.meta_path`` (a no-op when it is not there)."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)

"""Refuse a stock attention (``sdpa``, ``flash_attention_2``, ``flex_attention``, ...) handed a CP shard.

``shard_batch`` gives each CP rank a part of the pack, and the ``atac_shard=`` keyword that only the
``atac_cp`` attention reads. A second model run on that shard with another attention (a teacher for
distillation, a reference model or an EMA copy loaded with the default ``sdpa``) ignores the keyword: at
``cp_size > 1`` each document split over ranks then attends only to this rank's part of it, and the
model's outputs are wrong without an error. (At ``cp_size == 1`` the rank holds the whole pack.)

:func:`guard_stock_attention` wraps each function of transformers' global ``AttentionInterface``
registry other than the atac ones, through the registry's public ``register``, once: the wrapper raises
when its keywords carry the shard of a CP group of 2 or more ranks, and otherwise calls the function it
wraps (a user's own registration included). ``shard_batch`` installs it at each shard with
``cp_size > 1`` (a no-op once done; a function registered later is wrapped at the next shard). Not
covered: a model's own eager attention (a function of its modeling file, not in the registry) and
attention computed outside the interface; ``check_model`` refuses those for the models the integrations
prepare.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Callable

__all__ = ["guard_stock_attention", "is_guarded"]

_WRAPS = "_atac_guarded"  # the attribute holding the wrapped function
_KWARG = "atac_shard"  # runtime.SHARD_KWARG (not imported: runtime imports shard, which imports this)
_OURS = ("atac_cp",)  # runtime.ATTN_IMPLEMENTATION and the names registered for tests


def is_guarded(fn: Any) -> bool:
    """Whether ``fn`` is a guard made by :func:`guard_stock_attention`."""
    return callable(getattr(fn, _WRAPS, None))


def _guard(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def guarded(module: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get(_KWARG)
        cp_size = getattr(getattr(ctx, "plan", None), "cp_size", 1)
        # numbers.Integral: a hand-built ShardPlan may hold a numpy integer (np.int64 is no int)
        if isinstance(cp_size, numbers.Integral) and not isinstance(cp_size, bool) and cp_size > 1:
            raise ValueError(
                f"{type(module).__name__} runs attn_implementation={name!r} on a pack sharded over {cp_size} CP "
                f"ranks (its keywords carry {_KWARG}=): that attention ignores the shard, so each document split "
                "over the ranks would attend only to this rank's part, a wrong result. Every model run on a shard "
                "needs the atac_cp attention, a frozen teacher or reference model too: load it with "
                "attn_implementation='atac_cp', or call atac_hf.integrations.prepare_model(model, atac_config) "
                "(it checks the model and needs no accelerator.prepare); or run it on the unsharded batch")
        return fn(module, *args, **kwargs)

    setattr(guarded, _WRAPS, fn)
    return guarded


def guard_stock_attention() -> None:
    """Wrap every unguarded non-atac function of the global ``AttentionInterface`` (idempotent)."""
    from transformers import AttentionInterface

    mapping = getattr(AttentionInterface, "_global_mapping", {})
    for name, fn in list(mapping.items()):
        if name in _OURS or not callable(fn) or is_guarded(fn) or getattr(fn, "__name__", "") == "atac_cp_attention":
            continue
        AttentionInterface.register(name, _guard(name, fn))

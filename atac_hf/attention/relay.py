"""Relay of the per-batch shard context to attention layers that never receive it.

``shard_batch`` hands the :class:`~.shard.ShardContext` to the model as the ``atac_shard=``
keyword; most transformers models pass their forward's ``**kwargs`` down to every attention
call. Some (StableLM, Nemotron, ...) pass them to the decoder layer, which then calls its
attention module without them. :func:`install_relay` puts a forward pre-hook on every module
of the model whose ``forward`` takes ``**kwargs``: while such a module runs with a shard
context in its keywords, the context is the *active* one (a :mod:`contextvars` variable), and
the ``atac_cp`` attention falls back to it when its own keywords lack the context.

Gradient checkpointing: transformers' ``GradientCheckpointingLayer`` checkpoints the layer's
``forward``, not ``Module.__call__``, so its recomputation in backward runs no hooks. The
pre-hook therefore also wraps the layer's ``_gradient_checkpointing_func`` (once, whenever it is
set, e.g. by ``gradient_checkpointing_enable()`` after :func:`install_relay`): the wrapper
captures the context active at the forward and makes it active again around the recomputation
of that very call. Checkpointing through ``Module.__call__`` (``torch.utils.checkpoint`` on a
module, FSDP's activation-checkpoint wrapper) runs the hooks again with the same keywords.
Outside such calls the active context is ``None``; contexts nest and are restored in order, also
when a forward raises.
"""

from __future__ import annotations

import contextvars
import inspect
from typing import Any

import torch

from .shard import ShardContext

__all__ = ["active_context", "install_relay", "relay_installed"]

_ACTIVE: contextvars.ContextVar[ShardContext | None] = contextvars.ContextVar("atac_active_shard", default=None)
_RELAY_ATTR = "_atac_relay_handles"
_KWARG = "atac_shard"  # runtime.SHARD_KWARG (not imported: runtime imports this module)
_WRAPPED = "_atac_relayed"


def active_context() -> ShardContext | None:
    """The shard context of the innermost running module that received one (None outside)."""
    return _ACTIVE.get()


def _takes_kwargs(module: torch.nn.Module) -> bool:
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class _Relay:
    """The pre/post hooks of one module: a stack of contextvar tokens (re-entrant calls nest)."""

    def __init__(self) -> None:
        self.tokens: list = []

    def before(self, module, args, kwargs):
        ctx = kwargs.get(_KWARG)
        self.tokens.append(_ACTIVE.set(ctx) if isinstance(ctx, ShardContext) else None)
        func = getattr(module, "_gradient_checkpointing_func", None)
        if callable(func) and not getattr(func, _WRAPPED, False):
            object.__setattr__(module, "_gradient_checkpointing_func", _relaying(func))

    def after(self, module, args, kwargs, output):
        if self.tokens:
            token = self.tokens.pop()
            if token is not None:
                _ACTIVE.reset(token)
        return None


def _relaying(checkpoint_func):
    """``checkpoint_func`` (transformers' ``partial(checkpoint, ...)``) that runs the checkpointed
    function, in forward and in its recomputation, under the context active when it was called."""

    def relayed(function, *args, **kwargs):
        ctx = _ACTIVE.get()
        if ctx is None:
            return checkpoint_func(function, *args, **kwargs)

        def run(*a, **k):
            token = _ACTIVE.set(ctx)
            try:
                return function(*a, **k)
            finally:
                _ACTIVE.reset(token)

        return checkpoint_func(run, *args, **kwargs)

    setattr(relayed, _WRAPPED, True)
    relayed.__wrapped__ = checkpoint_func
    return relayed


def install_relay(model: torch.nn.Module) -> int:
    """Put the relay hooks on every module of ``model`` whose ``forward`` takes ``**kwargs``.

    Idempotent (a second call adds nothing). Returns the number of modules hooked.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"install_relay needs a torch.nn.Module, got {type(model).__name__}")
    hooked = 0
    for module in model.modules():
        if getattr(module, _RELAY_ATTR, None) is not None or not _takes_kwargs(module):
            continue
        relay = _Relay()
        handles = (module.register_forward_pre_hook(relay.before, with_kwargs=True),
                   module.register_forward_hook(relay.after, with_kwargs=True, always_call=True))
        object.__setattr__(module, _RELAY_ATTR, handles)
        hooked += 1
    return hooked


def relay_installed(model: torch.nn.Module) -> bool:
    """Whether :func:`install_relay` hooked ``model`` itself."""
    return getattr(model, _RELAY_ATTR, None) is not None


def _remove_relay(model: torch.nn.Module) -> int:
    """Remove every relay hook under ``model`` (tests); returns how many modules had one."""
    n = 0
    for module in model.modules():
        handles: Any = getattr(module, _RELAY_ATTR, None)
        if handles is not None:
            for h in handles:
                h.remove()
            object.__delattr__(module, _RELAY_ATTR)
            n += 1
    return n

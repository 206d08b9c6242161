"""A refused operation changes nothing: what ``ATACTrainer`` and ``ATACAccelerator.prepare`` change in the objects
a user passed, put back where the call is refused afterwards, by atac-hf's later checks or by Trainer's and
Accelerate's own (red-team 36: ``ATACTrainer(..., tokenizer=...)`` or ``prepare(model, opt, device_placement=[True])``
left the model on ``atac_cp`` with the guard's hooks and ``TrainingArguments.parallelism_config`` set, so a corrected
retry was refused again for the stale mesh).

Put back: each model's attention implementation, ``config.use_cache``, and the guard and relay hooks :func:`~atac_hf.check_model` adds
(where the model had none before), ``TrainingArguments``' fields and its ``accelerator_config``'s, and named
attributes of an owner (``ATACAccelerator.sharder``). Not undone: a model sharded by tensor parallelism (its
parameters are DTensors; the TP refusals run before it, :func:`~.tensor_parallel.check_tp_prepare`), and process-wide
state (a process group, Accelerate's shared state).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch

__all__ = ["refused_changes_nothing"]

_UNSET = object()


def _model_state(model: torch.nn.Module) -> tuple:
    from ..attention.model_check import _GUARD_ATTR
    from ..attention.relay import relay_installed
    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    config = getattr(base, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    return (base, attention, getattr(config, "use_cache", _UNSET), getattr(base, _GUARD_ATTR, None) is not None,
            relay_installed(base))


def _restore_model(base: torch.nn.Module, attention: Any, use_cache: Any, guarded: bool, relayed: bool) -> None:
    from ..attention.model_check import remove_guard
    from ..attention.relay import _remove_relay, relay_installed

    if not guarded:
        remove_guard(base)  # (its relay hooks too)
    if not relayed and relay_installed(base):
        _remove_relay(base)
    config = getattr(base, "config", None)
    if attention is not None and getattr(config, "_attn_implementation", None) != attention:
        base.set_attn_implementation(attention)
    if use_cache is not _UNSET and getattr(config, "use_cache", _UNSET) != use_cache:  # (Trainer sets it last)
        config.use_cache = use_cache


@contextlib.contextmanager
def refused_changes_nothing(models: Iterable[Any] = (), args: Any = None, owner: Any = None,
                            attrs: tuple[str, ...] = ()) -> Iterator[None]:
    """Run the body; where it raises, put back what it changed in ``models`` (those that are modules), ``args``
    (a ``TrainingArguments``, or None) and ``owner``'s ``attrs``, then re-raise."""
    saved_models = [_model_state(m) for m in models if isinstance(m, torch.nn.Module)]
    saved_args = None
    if args is not None:
        acc = getattr(args, "accelerator_config", None)
        saved_args = (dict(vars(args)), acc, dict(vars(acc)) if hasattr(acc, "__dict__") else None)
    saved_attrs = {a: getattr(owner, a, _UNSET) for a in attrs}
    try:
        yield
    except BaseException:
        for state in saved_models:
            _restore_model(*state)
        if saved_args is not None:
            fields, acc, acc_fields = saved_args
            vars(args).clear()
            vars(args).update(fields)
            if acc_fields is not None:
                vars(acc).clear()
                vars(acc).update(acc_fields)
        for a, v in saved_attrs.items():
            if v is _UNSET:
                if a in vars(owner):
                    delattr(owner, a)
            else:
                setattr(owner, a, v)
        raise

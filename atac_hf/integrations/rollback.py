"""A refused operation changes nothing: what ``ATACTrainer`` and ``ATACAccelerator.prepare`` change in the objects
a user passed, put back where the call is refused afterwards, by atac-hf's later checks or by Trainer's and
Accelerate's own (red-team 36: ``ATACTrainer(..., tokenizer=...)`` or ``prepare(model, opt, device_placement=[True])``
left the model on ``atac_cp`` with the guard's hooks and ``TrainingArguments.parallelism_config`` set, so a corrected
retry was refused again for the stale mesh).

Put back: each model's attention implementation, ``config.use_cache``, and the guard and relay hooks
:func:`~atac_hf.check_model` adds (where the model had none before), ``TrainingArguments``' fields and its
``accelerator_config``'s, and named attributes of an owner (``ATACAccelerator.sharder``). Each is put back on its own
(one that fails is noted on the refusal, which stays the error raised). Not undone: a model sharded by tensor parallelism (its
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
    except BaseException as err:
        steps = [lambda state=state: _restore_model(*state) for state in saved_models]
        if saved_args is not None:
            steps.append(lambda: _restore_vars(args, *saved_args))
        steps += [lambda a=a, v=v: _restore_attr(owner, a, v) for a, v in saved_attrs.items()]
        for step in steps:  # each on its own: one that fails leaves the others to run, and the refusal is raised
            try:
                step()
            except Exception as e:  # noqa: BLE001 - reported on the refusal, which stays the error raised
                if hasattr(err, "add_note"):
                    err.add_note(f"atac-hf could not put back what the refused call changed: {e!r}")
        raise


def _restore_vars(args: Any, fields: dict, acc: Any, acc_fields: dict | None) -> None:
    vars(args).clear()
    vars(args).update(fields)
    if acc_fields is not None:
        vars(acc).clear()
        vars(acc).update(acc_fields)


def _restore_attr(owner: Any, name: str, value: Any) -> None:
    if value is not _UNSET:
        setattr(owner, name, value)
    elif name in vars(owner):
        delattr(owner, name)

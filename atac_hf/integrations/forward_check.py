"""Refuse, under CP, a backward whose loss did not come from a model that ``prepare`` returned.

``accelerator.prepare(model)`` wraps the model in DDP (a separate module around it). A loop that keeps
calling the original module gets no gradient all-reduce: each CP rank then steps on its own shard's
gradient, and the ranks' weights drift apart without an error (each holds a part of the pack's
gradient only). :class:`PreparedForwardCheck` counts the forwards with autograd on of each prepared
wrapper (a forward pre-hook; an evaluation under ``no_grad`` does not count) and
:meth:`~PreparedForwardCheck.before_backward` raises when none ran since the last ``shard()`` and since
the last backward (either suffices: a next batch sharded ahead of the backward, or two backwards of one
forward, pass). FSDP2 and tensor parallelism wrap nothing, so nothing is
watched there; at ``cp_size == 1`` the accelerator does not install the check.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch

__all__ = ["PreparedForwardCheck", "is_wrapper"]


def is_wrapper(obj: Any) -> bool:
    """Whether ``obj`` is a module wrapping another (DDP, FSDP1, or a compiled module around one)."""
    inner = getattr(obj, "module", None) if isinstance(obj, torch.nn.Module) else None
    return isinstance(inner, torch.nn.Module) and inner is not obj


class PreparedForwardCheck:
    """Counts the forwards of prepared wrappers and refuses a backward that bypassed them all."""

    def __init__(self) -> None:
        self.num_forwards = 0
        self._at_shard: int | None = None  # None: shard() never called (nothing to check)
        self._at_backward = 0
        self._watched: weakref.WeakSet = weakref.WeakSet()  # weak: free_memory() still frees a model

    def watch(self, prepared: Iterable[Any]) -> None:
        """Count the forwards of each wrapper among ``prepared`` (``Accelerator.prepare``'s results)."""
        for obj in prepared:
            if is_wrapper(obj) and obj not in self._watched:
                obj.register_forward_pre_hook(self._count)
                self._watched.add(obj)

    def _count(self, module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():  # only a forward that builds a graph can feed a backward
            self.num_forwards += 1

    def on_shard(self) -> None:
        self._at_shard = self.num_forwards

    def before_backward(self) -> None:
        """Raise if no watched wrapper ran a forward since the last ``shard()`` and the last backward.

        Raises:
            ValueError: the loss came from a module that ``prepare`` did not return (nothing changed).
        """
        if self._watched and self._at_shard == self.num_forwards == self._at_backward:
            names = ", ".join(sorted({type(m).__name__ for m in self._watched}))
            raise ValueError(
                "accelerator.backward(loss) under cp_size > 1: no model returned by accelerator.prepare "
                f"({names}) ran a forward since the last accelerator.shard(batch), so the loss came from a "
                "module prepare did not return (e.g. the original model) and the CP ranks' gradients would not "
                "be summed: each CP rank would step on its own shard's gradient and their weights drift apart. "
                "Use the model prepare returns: model, optimizer = accelerator.prepare(model, optimizer), then "
                "loss = model(**accelerator.shard(batch)).loss (this backward was not run)")
        self._at_backward = self.num_forwards

"""Refuse, under CP, a backward whose loss did not come from a model that ``prepare`` returned.

``accelerator.prepare(model)`` wraps the model in DDP (a separate module around it). A loop that keeps
calling the original module gets no gradient all-reduce: each CP rank then steps on its own shard's
gradient, and the ranks' weights drift apart without an error (each holds a part of the pack's
gradient only). :class:`PreparedForwardCheck` counts the forwards with autograd on of each prepared
wrapper (a forward pre-hook; an evaluation under ``no_grad`` does not count) and
:meth:`~PreparedForwardCheck.before_backward` raises when none ran since the last backward: DDP sums the
gradients once per forward through it, in the first backward after it, so a second backward of one forward
(``backward(loss1, retain_graph=True)`` then ``backward(loss2)``, or two forwards then two backwards) stays on
each rank (red-team 25: grad norms 12-28% off, the ranks' weights apart). A next batch sharded ahead of the
backward passes. A direct ``wrapper.forward(...)`` call runs no hooks; the wrapped module's hook finds the
wrapper's ``forward`` on the stack and counts it as a forward through it (DDP's ``forward`` sets up the sum).
It also watches the module each wrapper wraps: a backward after a forward of it with
autograd on outside its wrapper (``accelerator.unwrap_model(model)(...)``, the original module) while
the wrapper itself ran none since the last backward is refused too, even where another prepared model
ran (a reference model) or the wrapper was freed (``model = accelerator.unwrap_model(model)``;
Accelerate keeps the module, not the wrapper). (An extra forward of the module beside one through its
wrapper is summed: DDP reduces each parameter's whole gradient once the backward has accumulated it.) The hooks
run outside ``torch.compile`` graphs (their counters would otherwise be guarded on and recompile every
step). FSDP2 and tensor parallelism wrap nothing, so nothing is watched there; at ``cp_size == 1`` the
accelerator does not install the check.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Iterable

import torch

__all__ = ["PreparedForwardCheck", "UnusedParameterCheck", "is_wrapper"]

_STACK_FRAMES = 32  # frames searched for a wrapper's forward called directly (DDP: 5 above the module's hook)


def is_wrapper(obj: Any) -> bool:
    """Whether ``obj`` is a module wrapping another (DDP, FSDP1, or a compiled module around one)."""
    inner = getattr(obj, "module", None) if isinstance(obj, torch.nn.Module) else None
    return isinstance(inner, torch.nn.Module) and inner is not obj


class _Noop:
    """What a hook of the check becomes in a copy of its module (``copy.deepcopy``, pickle): a copy such as an
    EMA model is not watched, and copying never copies the check."""

    def __call__(self, *args: Any) -> None:
        return None


class _Hook(_Noop):
    """A hook of the check that copies and pickles as a :class:`_Noop`."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    @torch.compiler.disable  # run as Python under torch.compile: its counters are never guarded on
    def __call__(self, *args: Any) -> None:
        return self._fn(*args)

    def __deepcopy__(self, memo: dict) -> _Noop:
        return _Noop()

    def __reduce__(self):
        return (_Noop, ())


class PreparedForwardCheck:
    """Counts the forwards of prepared wrappers and refuses a backward that bypassed them."""

    def __init__(self, fix: str | None = None) -> None:
        self._fix = fix or ("keep and call the model prepare returns: model, optimizer = accelerator.prepare(model, "
                            "optimizer), then loss = model(**accelerator.shard(batch)).loss; run other forwards of the "
                            "unwrapped module under torch.no_grad()")
        self.num_forwards = 0
        self.num_bypassed = 0  # forwards of a wrapped module with autograd on, outside its wrapper
        self._in_wrapper = 0
        # per wrapped module since the last backward: [forwards outside its wrapper, forwards through it]
        self._since: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._at_shard: int | None = None  # None: shard() never called (the message says which)
        self._at_backward = 0
        self._watched: weakref.WeakSet = weakref.WeakSet()  # weak: free_memory() still frees a model
        self._inner: weakref.WeakSet = weakref.WeakSet()
        self._names: set[str] = set()

    def watch(self, prepared: Iterable[Any]) -> None:
        """Count the forwards of each wrapper among ``prepared`` (``Accelerator.prepare``'s results) and
        watch the module it wraps for forwards outside it."""
        for obj in prepared:
            if is_wrapper(obj) and obj not in self._watched:
                obj.register_forward_pre_hook(_Hook(self._enter))
                obj.register_forward_hook(_Hook(self._leave), always_call=True)
                self._watched.add(obj)
                self._names.add(type(obj).__name__)
                inner = obj.module
                if inner not in self._inner:
                    inner.register_forward_pre_hook(_Hook(self._inner_forward))
                    self._inner.add(inner)
                    self._since[inner] = [0, 0]

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        self._in_wrapper += 1
        if torch.is_grad_enabled():  # only a forward that builds a graph can feed a backward
            self.num_forwards += 1
            counts = self._since.get(getattr(module, "module", None))
            if counts is not None:
                counts[1] += 1

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._in_wrapper = max(0, self._in_wrapper - 1)

    def _inner_forward(self, module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and not self._in_wrapper:
            through = self._wrapper_forward_running(module)  # wrapper.forward(...) called directly: no hooks ran
            self.num_forwards += through
            self.num_bypassed += not through
            counts = self._since.get(module)
            if counts is not None:
                counts[int(through)] += 1

    def _wrapper_forward_running(self, module: torch.nn.Module) -> bool:
        """Whether a watched wrapper of ``module`` is in its ``forward`` on the stack (DDP's ``forward`` runs the
        wrapped module from ``_run_ddp_forward``, a few frames up)."""
        frame = sys._getframe(1)
        for _ in range(_STACK_FRAMES):
            if frame is None:
                return False
            if frame.f_code.co_name in ("forward", "_run_ddp_forward"):
                owner = frame.f_locals.get("self")
                if (isinstance(owner, torch.nn.Module) and owner in self._watched
                        and getattr(owner, "module", None) is module):
                    return True
            frame = frame.f_back
        return False

    def forwarded(self) -> list:
        """The watched wrappers that ran a forward with autograd on since the last backward (read before
        :meth:`before_backward`, which resets the counts): those whose DDP reducer expects this backward."""
        return [w for w in self._watched if self._since.get(w.module, (0, 0))[1]]

    def on_shard(self) -> None:
        self._at_shard = self.num_forwards

    def before_backward(self) -> None:
        """Raise if a watched module ran a forward with autograd on outside its wrapper since the last
        backward, or if no watched wrapper ran one since the last backward.

        Raises:
            ValueError: the loss came from a module that ``prepare`` did not return (nothing changed).
        """
        names = ", ".join(sorted(self._names))
        bypassed = [type(m).__name__ for m, (outside, through) in self._since.items() if outside and not through]
        for counts in self._since.values():  # told once: a corrected step may follow
            counts[:] = [0, 0]
        if bypassed:
            raise ValueError(
                "accelerator.backward(loss) under cp_size > 1: a model that accelerator.prepare wrapped "
                f"({', '.join(bypassed)}, in {names}) ran a forward with autograd on only outside the wrapper prepare "
                "returned (the original module, or accelerator.unwrap_model(model)) since the last backward. Its CP "
                "ranks' gradients would not be summed: each CP rank would step on its own shard's gradient and their "
                f"weights drift apart. Fix: {self._fix} (this backward was not run)")
        if self._names and self.num_forwards == self._at_backward:  # (a wrapper freed too)
            since = (" since the last accelerator.shard(batch) and" if self._at_shard == self.num_forwards
                     else "")
            raise ValueError(
                f"accelerator.backward(loss) under cp_size > 1: no model returned by accelerator.prepare ({names}) "
                f"ran a forward with autograd on{since} since the last backward. DDP sums the CP ranks' gradients "
                "once per forward through the model prepare returned, in the first backward after it, so this "
                "loss came from a module prepare did not return (e.g. the original model), or is a second backward "
                "of one forward (backward(loss1, retain_graph=True), then backward(loss2)): each CP rank would step "
                "on its own shard's gradient and their weights drift apart. Use the model prepare returns (model, "
                "optimizer = accelerator.prepare(model, optimizer), then loss = model(**accelerator.shard(batch))"
                ".loss) and run one backward per forward: accelerator.backward(loss1 + loss2) (this backward was "
                "not run)")
        self._at_backward = self.num_forwards


class UnusedParameterCheck:
    """Refuse a gradient-sync backward in which a trainable parameter of a DDP wrapper got no gradient.

    DDP with ``find_unused_parameters=False`` (Accelerate's and Trainer's default) all-reduces a bucket of
    gradients once every parameter in it got one in the backward; a parameter the loss does not reach (a loss
    on an intermediate layer's hidden states, a head or an adapter branch left out) keeps its bucket from being
    reduced, so its bucket-mates step on each rank's own gradient: under CP a shard's share, the ranks' weights
    then drift apart (red-teams 29-30: 117-230% off), and DDP's own error comes only at the next forward. Use:
    ``before(wrappers)`` ahead of the backward, ``after()`` behind it where the step syncs the gradients. A
    parameter "got a gradient" where its ``.grad`` was created or changed (its version) in the backward.
    """

    def __init__(self, fix: str | None = None) -> None:
        self._fix = fix or ("ATACAccelerator(..., kwargs_handlers=[DistributedDataParallelKwargs("
                            "find_unused_parameters=True)])")
        self._seen: list[tuple[str, torch.nn.Parameter, _Stamp]] = []

    @staticmethod
    def _watched(wrapper: Any) -> bool:
        return (isinstance(wrapper, torch.nn.parallel.DistributedDataParallel)
                and not getattr(wrapper, "find_unused_parameters", True)
                and not getattr(wrapper, "static_graph", False)
                and getattr(wrapper, "require_backward_grad_sync", True))  # False under no_sync(): no reduction

    def before(self, wrappers: Iterable[Any]) -> None:
        """Note the trainable parameters' gradients of each DDP wrapper among ``wrappers`` (cheap: no copy)."""
        self._seen = []
        for w in wrappers:
            if self._watched(w):
                ignored = getattr(w, "parameters_to_ignore", ()) or ()
                self._seen += [(n, p, _Stamp(p.grad)) for n, p in w.module.named_parameters()
                               if p.requires_grad and n not in ignored]

    def after(self) -> None:
        """Raise where a noted parameter's gradient did not change in the backward.

        Raises:
            ValueError: naming the parameters and the settings to change.
        """
        seen, self._seen = self._seen, []
        unused = [n for n, p, stamp in seen if stamp.unchanged(p)]
        if unused:
            more = f" and {len(unused) - 4} more" if len(unused) > 4 else ""
            raise ValueError(
                f"{len(unused)} trainable parameter(s) got no gradient in this backward "
                f"({', '.join(unused[:4])}{more}) "
                "while DDP runs with find_unused_parameters=False: DDP then leaves their gradient bucket unreduced, "
                "so each rank would step on its own gradient (under CP a shard's share) and the ranks' weights drift "
                f"apart. Fix: {self._fix}, or freeze the parameters the loss does not use (requires_grad_(False))")


class _Stamp:
    """A parameter's gradient before a backward: the tensor itself (not its ``id``: a gradient replaced by a new
    tensor, as ``create_graph=True`` accumulates, may land at the freed one's address) and its version."""

    __slots__ = ("grad", "version")

    def __init__(self, grad: torch.Tensor | None) -> None:
        self.grad, self.version = grad, None if grad is None else grad._version

    def unchanged(self, p: torch.nn.Parameter) -> bool:
        return p.grad is self.grad and (self.grad is None or self.grad._version == self.version)

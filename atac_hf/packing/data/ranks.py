"""What every rank computes alike (each DP / CP / TP rank plans the same packs from the same lengths
and config) is shown once: progress bars and the packers' warnings on the first rank of the job only,
as Trainer logs on its main process. Without a process group every process is the first."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

__all__ = ["first_rank_warnings", "is_first_rank"]


def is_first_rank(default: bool = True) -> bool:
    """True on global rank 0 of an initialised process group (also in its forked DataLoader workers); ``default``
    without one (a spawned worker: pass what the process that built the dataset found)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return default
    return dist.get_rank() == 0


def _not_shown(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def first_rank_warnings(first: bool | None = None) -> Iterator[None]:
    """Warnings raised inside the block are displayed on the first rank only (``first``: None asks
    :func:`is_first_rank`). Elsewhere every warning filter still applies, so an ``"error"`` filter raises on
    every rank alike; only the display is dropped."""
    if is_first_rank() if first is None else first:
        yield
        return
    with warnings.catch_warnings():
        warnings.showwarning = _not_shown
        yield

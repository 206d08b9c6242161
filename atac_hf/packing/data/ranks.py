"""What every rank computes alike (each DP / CP / TP rank plans the same packs from the same lengths
and config) is shown once: progress bars and the packers' warnings on the first rank of the job only,
as Trainer logs on its main process. Without a process group every process is the first."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

__all__ = ["first_rank_warnings", "is_first_rank"]


def is_first_rank() -> bool:
    """True outside a process group, else on global rank 0 (also in its forked DataLoader workers)."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


@contextlib.contextmanager
def first_rank_warnings() -> Iterator[None]:
    """Warnings raised inside the block are shown on the first rank only (the others raise the same ones);
    errors are raised everywhere."""
    if is_first_rank():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield

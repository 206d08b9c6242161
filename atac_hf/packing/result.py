""":class:`PackResult`, what :func:`~atac_hf.packing.stream.pack_lengths` returns.

Numpy-free; re-exported by :mod:`atac_hf.packing.stream` and :mod:`atac_hf.packing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PackResult"]

Span = tuple[int, int, int]
Pack = list[Span]


@dataclass(frozen=True)
class PackResult:
    """Output of :func:`~atac_hf.packing.stream.pack_lengths`.

    Attributes:
        packs: every pack in emission order; spans ``(sample, start, end)`` with sample =
            index into the input lengths.
        deferred: ``(sample, delay)`` of every sample emitted ``delay >= 1`` windows after it
            arrived, by sample index.
        metrics: the metrics table (:mod:`atac_hf.packing.metrics`).
        pack_window: window index of each pack.
        arrival: window each sample arrived in (index into the input lengths).
    """

    packs: list[Pack]
    deferred: list[tuple[int, int]]
    metrics: dict[str, Any]
    pack_window: list[int] = field(default_factory=list)
    arrival: list[int] = field(default_factory=list)

    def windows(self) -> list[list[Pack]]:
        """The packs grouped by window (empty windows included)."""
        n = (max(self.pack_window) + 1) if self.pack_window else 0
        out: list[list[Pack]] = [[] for _ in range(n)]
        for p, w in zip(self.packs, self.pack_window):
            out[w].append(p)
        return out

"""Shared pieces of the per-window planners: the pool item, the window context, and the
generic post-steps every strategy gets (fill empty packs, split overdue samples).

A pool *item* is a tuple ``(sample_id, start, end, arrival, seq, frag)``: the span
``[start, end)`` of a sample, the window it arrived in, its position in data order
(``seq``, unique and increasing), and ``frag`` = 1 when the span is a fragment of a
split sample (0 for a whole sample, or the kept head of a truncated one).

Numpy only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...cost import CostModel
from ...cost.model import scale_attention_price  # noqa: F401  (re-exported: tests, callers)
from ..config import PackingConfig

Item = tuple  # (sample_id, start, end, arrival, seq, frag)
SID, START, END, ARRIVAL, SEQ, FRAG = range(6)

# planner(items, ctx) -> (packs, carry, newly_split): packs = ctx.num_packs lists of items
# (some may be empty); carry = items left for later windows; newly_split = (sample_id,
# tokens) of every item that was a whole sample and was split by the planner.
Planner = Callable[[list, "WindowContext"], tuple[list[list[Item]], list[Item], list[tuple[int, int]]]]


@dataclass(frozen=True)
class WindowContext:
    """What one planning decision sees besides the pool.

    Attributes:
        config: the packing configuration.
        cost_model: costs documents (a fragment costs as its own document).
        window: index of the window being planned (0, 1, ...).
        final: end of stream: nothing may be held back.
        ref_cost_per_token: cost per token of a full pack of short documents
            (``reference_doc_tokens`` long): the cheapest way to fill a pack.
        pack_multiple: the short last window of the end of a stream (``wfap``) gets a
            multiple of this many packs (the feeders' DP replicas, so every replica gets
            as many; see :mod:`~atac_hf.packing.planners.wfap_end`).
    """

    config: PackingConfig
    cost_model: CostModel
    window: int
    final: bool
    ref_cost_per_token: float
    pack_multiple: int = 1

    @property
    def max_tokens(self) -> int:
        return int(self.config.max_tokens)

    @property
    def num_packs(self) -> int:
        return int(self.config.packs_per_window)

    @property
    def light_pack_cost(self) -> float:
        """Cost of a pack filled to the cap with short documents."""
        return self.ref_cost_per_token * self.max_tokens

    def is_overdue(self, item: Item) -> bool:
        """The item has waited ``max_defer`` windows: it must be placed in this window."""
        return self.window - item[ARRIVAL] >= self.config.max_defer

    @functools.cached_property
    def balance(self) -> "BalanceModels":
        """The cost models whose worse balance ``wfap`` minimises (see :class:`BalanceModels`)."""
        return balance_models(self.config, self.cost_model, self.ref_cost_per_token)

    def is_due(self, item: Item) -> bool:
        """The item goes first: it is overdue, or the stream ends."""
        return self.final or self.window - item[ARRIVAL] >= self.config.max_defer


@dataclass(frozen=True, eq=False)
class BalanceModels:
    """The ``K`` cost models a planner balances at once, and how their costs are scaled.

    Without ``price_band``: ``K = 1``, the cost model itself, costs unscaled. With it: the
    cost model with its attention pair price times ``low`` and times ``high``, each cost
    divided by that model's light pack cost (so ``light = 1`` and costs of both models
    compare); a pack's *score* is then the larger of its two scaled costs.

    Attributes:
        models: the K cost models.
        scale: (K,) factor applied to each model's costs.
        ref: (K,) scaled cost per token of a full pack of short documents.
        light: (K,) scaled cost of a pack filled to the cap with short documents.
    """

    models: tuple[CostModel, ...]
    scale: np.ndarray
    ref: np.ndarray
    light: np.ndarray

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """(n, K) scaled cost of each span length under each model."""
        return np.stack([m.doc_cost(lengths) * s for m, s in zip(self.models, self.scale.tolist())], axis=1)


def balance_models(config: PackingConfig, cost_model: CostModel, ref: float | None = None) -> BalanceModels:
    """The :class:`BalanceModels` of ``config.price_band`` (``ref``: the cost model's
    :func:`ref_cost_per_token`, when known)."""
    C = int(config.max_tokens)
    if config.price_band is None:
        r = ref_cost_per_token(config, cost_model) if ref is None else ref
        return BalanceModels((cost_model,), np.ones(1), np.array([r]), np.array([r * C]))
    models = tuple(scale_attention_price(cost_model, k) for k in config.price_band)
    refs = np.array([ref_cost_per_token(config, m) for m in models])
    if not (refs > 0).all():
        raise ValueError(f"price_band={config.price_band!r}: a pack of short documents costs 0 s under the cost "
                         f"model {cost_model.name!r} with its attention price scaled by {config.price_band[0]:g} "
                         "(it prices only attention): raise the band's low end above 0 (set price_band)")
    scale = 1.0 / (refs * C)
    return BalanceModels(models, scale, refs * scale, np.ones(len(models)))


def ref_cost_per_token(config: PackingConfig, cost_model: CostModel) -> float:
    """Seconds a token of a reference document (``reference_doc_tokens``, at most the cap) costs."""
    ref = min(int(config.reference_doc_tokens), int(config.max_tokens))
    return float(cost_model.doc_cost([ref])[0]) / ref


def checked_ref_cost_per_token(config: PackingConfig, cost_model: CostModel) -> float:
    """:func:`ref_cost_per_token`, every packer's unit; ValueError where the model prices whole
    documents at 0 s (nothing to balance, and the packers' ratios would divide by 0)."""
    cost_model.check_prices_compute("the packer's cost_model")
    ref = ref_cost_per_token(config, cost_model)
    if not ref > 0:  # only chunks priced (masked work): a whole document costs nothing
        n = min(int(config.reference_doc_tokens), int(config.max_tokens))
        raise ValueError(f"cost model {cost_model.name!r:.60} prices a whole document of {n} tokens "
                         f"(reference_doc_tokens) at {ref * n!r} s: packing balances whole documents' costs, so "
                         "linear_s_per_token, attn_s_per_pair or segment_overhead_s must be > 0 (check the packer's cost_model)")
    return ref


def overlength_pieces(length: int, max_tokens: int, min_fragment: int) -> list[int]:
    """Fragment sizes of a sample longer than the cap (``overlength="split"``): the fewest
    pieces, full-cap pieces first and the remainder last (as TRL's ``bfd_split``), so that
    every piece but the last fills a pack on its own. A remainder shorter than
    ``min_fragment`` takes the missing tokens from the piece before it (``min_fragment <=
    max_tokens // 2`` keeps that piece legal too).

    >>> overlength_pieces(25, 10, 2), overlength_pieces(21, 10, 3)
    ([10, 10, 5], [10, 8, 3])
    """
    L, C, m = int(length), int(max_tokens), int(min_fragment)
    k = -(-L // C)
    sizes = [C] * (k - 1) + [L - (k - 1) * C]
    if k > 1 and sizes[-1] < m:
        sizes[-2] -= m - sizes[-1]
        sizes[-1] = m
    return sizes


def span_len(item: Item) -> int:
    return item[END] - item[START]


def fill_empty_packs(packs: list[list[Item]], carry: list[Item], ctx: WindowContext) -> list[Item]:
    """Give every empty pack one carried item (oldest due first, then in data order), so a
    window yields ``packs_per_window`` packs whenever the pool holds that many items.
    Every item fits an empty pack (spans never exceed the cap)."""
    empty = [j for j, p in enumerate(packs) if not p]
    if not empty or not carry:
        return carry
    order = sorted(range(len(carry)), key=lambda i: (not ctx.is_due(carry[i]), carry[i][SEQ], carry[i][START]))
    take = order[: len(empty)]
    for j, i in zip(empty, take):
        packs[j].append(carry[i])
    taken = set(take)
    return [it for i, it in enumerate(carry) if i not in taken]


def place_overdue(packs: list[list[Item]], carry: list[Item], ctx: WindowContext) -> tuple[list[Item], list[tuple[int, int]]]:
    """Place overdue items that the strategy left over: whole into the cheapest pack with room;
    else a whole sample (it fits the cap) displaces items that are not overdue to the next
    window (:func:`_make_room`), so it is not cut, and where no pack can make room it waits a
    window more, whole (``max_defer >= 1``: late rather than cut); else (``split_overdue``)
    over the ends of the packs with the most room, in fragments >= ``min_fragment`` (a whole
    sample, with ``max_defer=0`` only, only where all of it goes). A fragment of an over-cap
    sample that cannot go all that way displaces items too; only where no pack can make room
    do its pieces go as far as they do. Returns the new carry and ``(sample_id, tokens)`` of
    every item that was whole before and is split now."""
    if not carry or not any(ctx.is_overdue(it) for it in carry):
        return carry, []
    cfg = ctx.config
    C, m = ctx.max_tokens, int(cfg.min_fragment)
    room = [C - sum(span_len(it) for it in p) for p in packs]
    cost = [float(costs_of(p, ctx.cost_model).sum()) for p in packs]
    out: list[Item] = []
    newly: list[tuple[int, int]] = []
    for it in carry:
        L = span_len(it)
        if not ctx.is_overdue(it):
            out.append(it)
            continue
        fits = [j for j in range(len(packs)) if room[j] >= L]
        if fits:
            j = min(fits, key=lambda j: (cost[j], j))
            packs[j].append(it)
            room[j] -= L
            cost[j] += float(costs_of([it], ctx.cost_model)[0])
            continue
        if it[FRAG] == 0 and _place_by_eviction(packs, room, cost, it, out, ctx):
            continue  # a whole sample that fits the cap stays whole: room made for it
        pieces: list[tuple[int, int]] = []  # (pack, size)
        left = L
        # into two fragments of at least min_fragment; a whole sample (it fits the cap) only
        # where deferral is off: with max_defer >= 1 it waits whole rather than be cut (fidelity)
        can_cut = cfg.split_overdue and L >= 2 * m and (it[FRAG] == 1 or cfg.max_defer == 0)
        for j in sorted(range(len(packs)), key=lambda j: (-room[j], j)) if can_cut else []:
            if left == 0:
                break
            take = min(room[j], left)
            if 0 < left - take < m:
                take = left - m  # leave a legal fragment behind
            if take < m:
                continue
            pieces.append((j, take))
            left -= take
        # A fragment (of a sample over the cap) that cannot go all now makes room, as a whole
        # sample does: else part of it would miss its deadline while packs hold samples that may
        # wait (red-team 9); where no pack can make room, its pieces go as far as they do.
        if (not pieces or left) and it[FRAG] and _place_by_eviction(packs, room, cost, it, out, ctx):
            continue
        if not pieces or 0 < left < m or (left and it[FRAG] == 0):
            # a whole sample is cut only where its pieces all go now: a part carried on would still
            # finish late, so the cut would break fidelity for nothing
            out.append(it)
            continue
        sid, s, e, arr, seq, _f = it
        pos = s
        for j, size in pieces:
            piece = (sid, pos, pos + size, arr, seq, 1)
            packs[j].append(piece)
            room[j] -= size
            cost[j] += float(costs_of([piece], ctx.cost_model)[0])
            pos += size
        if left:
            out.append((sid, pos, e, arr, seq, 1))
        if it[FRAG] == 0:
            newly.append((sid, L))
    return out, newly


def _place_by_eviction(packs: list[list[Item]], room: list[int], cost: list[float], it: Item, out: list[Item],
                       ctx: WindowContext) -> bool:
    """Put ``it`` whole into the pack :func:`_make_room` picks, its evicted items onto ``out`` (the
    carry); False (nothing changed) where no pack can make room."""
    made = _make_room(packs, room, cost, span_len(it), ctx)
    if made is None:
        return False
    j, evicted = made
    for x in evicted:
        packs[j].remove(x)
        out.append(x)
    packs[j].append(it)
    room[j] = ctx.max_tokens - sum(span_len(x) for x in packs[j])
    cost[j] = float(costs_of(packs[j], ctx.cost_model).sum())
    return True


def _make_room(packs: list[list[Item]], room: list[int], cost: list[float], length: int,
               ctx: WindowContext) -> tuple[int, list[Item]] | None:
    """The pack and the items to carry to the next window so that ``length`` tokens fit whole:
    only items that are not overdue leave (largest first, so few do), in the pack where the
    fewest tokens leave (then the cheapest, then the first). ``None``: no pack can make room.
    The carried items are younger than ``max_defer``, so the deferral bound still holds."""
    best = None
    for j, p in enumerate(packs):
        need = length - room[j]
        movable = sorted((x for x in p if not ctx.is_overdue(x)), key=lambda x: (-span_len(x), x[SEQ]))
        taken, freed = [], 0
        for x in movable:
            if freed >= need:
                break
            taken.append(x)
            freed += span_len(x)
        if freed >= need and (best is None or (freed, cost[j], j) < best[0]):
            best = ((freed, cost[j], j), j, taken)
    return None if best is None else (best[1], best[2])


def costs_of(items: list[Item], cost_model: CostModel) -> np.ndarray:
    if not items:
        return np.zeros(0)
    return cost_model.doc_cost(np.fromiter((it[END] - it[START] for it in items), dtype=np.int64, count=len(items)))

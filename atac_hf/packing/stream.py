"""StreamPacker: window-by-window packing of a sample stream, resumable; and
:func:`pack_lengths`, the same over a whole array of lengths.

Numpy only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from ..cost import CostModel, default_cost_model
from .planners.window import ARRIVAL, END, FRAG, SEQ, SID, START, Item, Planner, WindowContext, fill_empty_packs
from .planners.window import checked_ref_cost_per_token, overlength_pieces, place_overdue
from .planners.baselines import WLB_COHORT_MAX_DEFER, WLB_COHORT_SHARE, plan_bfd, plan_sequential, plan_wlb, wlb_held
from .config import PackingConfig
from .validate import (_is_int, check_lengths, check_overlength, check_packer_pool, check_window, state_field_diff,
                       state_int)
from .metrics import MetricsAccumulator, pack_costs
from .feed import MIN_LOOK, next_window
from .result import Pack, PackResult, Span
from .planners.wfap import HELD_LIMIT, heavy_lengths, plan_wfap, wfap_held
from .planners.wfap_end import rest_fits_window

__all__ = ["StreamPacker", "PackResult", "pack_lengths", "PLANNERS"]

PLANNERS: dict[str, Planner] = {
    "wfap": plan_wfap,
    "sequential": plan_sequential,
    "bfd": plan_bfd,
    "wlb": plan_wlb,
}
_HELD = {"wfap": wfap_held, "wlb": wlb_held}
_STATE_FORMAT = "atac-hf/stream-packer/v1"
MAX_WINDOWS = 2**62  # bound on the window / sample counters of a loaded state
_DATA_ORDER = operator.itemgetter(SEQ, START)


class StreamPacker:
    """Packs a stream of samples window by window; stateful, deterministic, resumable.

    Each :meth:`add_window` call packs the new samples together with those carried from
    earlier windows (held back on purpose, or that did not fit) into up to
    ``packs_per_window`` packs. A pack is a list of spans ``(sample_id, start, end)``: a
    whole sample is ``(i, 0, len_i)``; a split sample appears as several fragments, each
    its own document in its row. :meth:`flush` ends the stream: everything left is packed,
    nothing is lost. At the end (``last=True``, flush) ``wfap`` gives the last window only
    the packs its samples need (planners/wfap_end.py), a multiple of ``pack_multiple``.

    Args:
        config: the packing configuration.
        cost_model: costs documents (default: :func:`~atac_hf.cost.default_cost_model`).
        pack_multiple: DP replicas the packs are dealt to (an int >= 1; the feeders pass theirs).

    Attributes:
        config, cost_model, pack_multiple: as given.
    """

    def __init__(self, config: PackingConfig, cost_model: CostModel | None = None, *, pack_multiple: int = 1) -> None:
        if not isinstance(config, PackingConfig):
            raise TypeError(f"config must be a PackingConfig, got {type(config).__name__}")
        if cost_model is not None and not isinstance(cost_model, CostModel):
            raise TypeError(f"cost_model must be a CostModel or None, got {type(cost_model).__name__}")
        if not _is_int(pack_multiple) or pack_multiple < 1:
            raise ValueError(f"pack_multiple={pack_multiple!r:.40} must be an int >= 1 (the DP replicas; set pack_multiple)")
        self.config, self.pack_multiple = config, int(pack_multiple)
        self.cost_model = cost_model if cost_model is not None else default_cost_model()
        self._ref = checked_ref_cost_per_token(config, self.cost_model)  # refuses models that price nothing
        self._planner = PLANNERS[config.strategy]
        self._window = self._seq = 0
        self._pool: list[Item] = []
        # split samples with more fragments than packs_per_window: the rest wait here, in
        # start order, and join the pool as earlier ones leave it (a window places at most
        # one full-cap fragment per pack, and a planner's work grows with its pool)
        self._backlog: dict[int, list[Item]] = {}
        self._backlog_tokens = 0
        self._open: dict[int, list[int]] = {}  # split sample -> [tokens not yet emitted, max delay so far]
        self._metrics = MetricsAccumulator(config.max_tokens, config.max_defer)
        self._warned_overlength = False

    # ------------------------------------------------------------------ read-only views
    @property
    def window_index(self) -> int:
        """Index of the next window (= windows planned so far, flush windows included)."""
        return self._window

    @property
    def pending_ids(self) -> list[int]:
        """Sample ids carried into the next window (in data order, each once)."""
        return list(dict.fromkeys(it[SID] for it in sorted(self._pool, key=lambda it: (it[SEQ], it[START]))))

    @property
    def carried_spans(self) -> list[Span]:
        """Every span carried into the next window, ``(sample, start, end)``."""
        items = self._pool + [it for wait in self._backlog.values() for it in wait]
        return [(it[SID], it[START], it[END]) for it in items]

    @property
    def pending_tokens(self) -> int:
        """Tokens carried into the next window."""
        return sum(it[END] - it[START] for it in self._pool) + self._backlog_tokens

    def _held(self) -> tuple[int, int]:
        held_fn = _HELD.get(self.config.strategy)
        return held_fn(self._pool, self._context(final=False)) if held_fn and self._pool else (0, 0)

    @property
    def tokens_wanted(self) -> int:
        """Tokens of new samples the next window can use: the window's capacity
        (``packs_per_window * max_tokens``) minus the carried tokens it will pack (carried
        samples the strategy keeps holding back do not count). See :meth:`window_size`."""
        return self.config.window_tokens - (self.pending_tokens - self._held()[0])

    def _held_class(self, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens after overlength handling, fragments per sample, held back on arrival?)"""
        cfg = self.config
        C = int(cfg.max_tokens)
        if cfg.overlength == "truncate":
            eff = np.minimum(lengths, C)
            pieces = np.minimum(lengths, 1)
        else:
            eff = lengths.copy()
            pieces = -(-lengths // C)
        piece = np.where(pieces > 1, C, eff)  # longest fragment (full-cap pieces first)
        held = np.zeros(lengths.shape, dtype=bool)
        if cfg.max_defer > 0 and cfg.strategy == "wfap" and cfg.defer_heavy:
            held = heavy_lengths(piece, self._context(final=False))
        elif cfg.max_defer > 0 and cfg.strategy == "wlb" and cfg.resolved_wlb_thresholds:
            held = piece >= cfg.resolved_wlb_thresholds[0]
        return eff, pieces, held & (lengths > 0)

    def supply_tokens(self, lengths: Sequence[int]) -> np.ndarray:
        """Tokens each of these (new) samples would add to a window's packable supply: its
        length after ``overlength`` handling, or 0 for a sample the strategy holds back on
        arrival (``wfap`` heavy samples, ``wlb`` outliers). A state-free approximation of
        :meth:`window_size` (which also bounds how many held-back samples a window takes)."""
        eff, _pieces, held = self._held_class(check_lengths(lengths, "lengths"))
        eff[held] = 0
        return eff

    def window_size(self, lengths: Sequence[int]) -> int:
        """How many of these upcoming samples (in stream order) the next window should take.

        Samples are taken until their supply reaches :attr:`tokens_wanted`. A sample counts
        with its tokens, except one the strategy holds back on arrival (``wfap`` heavy
        samples, ``wlb`` outliers): it counts 0 while the pool of held fragments stays
        under ``3 x packs_per_window``, and ``max_tokens`` per fragment beyond (each will
        need a pack of its own), so a stream where such samples are common is fed at the
        pace the packer can release them. With ``wlb`` and ``max_defer`` under
        ``WLB_COHORT_MAX_DEFER``, a sample over half a pack counts a whole pack (an outlier only
        with ``max_defer=1``), and a window stops before the outliers it takes pass
        ``WLB_COHORT_SHARE`` of its capacity (it takes at least one): they mostly fall due
        together, ``max_defer`` windows later.

        Args:
            lengths: token counts of the next samples of the stream (any number; pass
                enough to fill a window, or the rest of the stream).

        Returns:
            a count in ``[0, len(lengths)]``; ``len(lengths)`` when even all of them do not
            fill the window (take them and look further). 0 when the carried samples already fill it.
        """
        lens = lengths if _is_checked(lengths) else check_lengths(lengths, "lengths")
        held_tokens, held_items = self._held()
        wanted = self.config.window_tokens - (self.pending_tokens - held_tokens)
        if wanted <= 0 or lens.size == 0:
            return 0
        eff, pieces, held = self._held_class(lens)
        budget = HELD_LIMIT * int(self.config.packs_per_window) - held_items
        over = held & (np.cumsum(np.where(held, pieces, 0)) > budget)
        weight = np.where(held, 0, eff)
        weight[over] = pieces[over] * int(self.config.max_tokens)
        tight = self.config.strategy == "wlb" and 0 < self.config.max_defer < WLB_COHORT_MAX_DEFER
        if tight:
            # the samples fed now fall due within a few windows: one over half a pack needs a pack of
            # its own (two such share none), so it counts a whole pack; with max_defer 1 so does an
            # outlier over half a pack (due next window beside that window's own, released or not)
            C = int(self.config.max_tokens)
            room = np.where(2 * eff > C, np.maximum(eff, C), eff)
            free = held & ((2 * eff <= C) | (self.config.max_defer > 1))
            weight = np.where(over | free, weight, room)
        k = int(np.searchsorted(np.cumsum(weight), wanted, side="left")) + 1
        if tight and held.any():
            # WLB-LLM's queues release a document only when packs_per_window of them wait, so
            # the outliers a window takes mostly fall due together max_defer windows later: a
            # window takes at most WLB_COHORT_SHARE of its capacity of them (at least one)
            cum = np.cumsum(np.where(held, room, 0))
            stop = np.flatnonzero(held & (cum > room) & (cum > WLB_COHORT_SHARE * self.config.window_tokens))
            if stop.size:
                k = min(k, int(stop[0]))
        return min(k, int(lens.size))

    def rest_fits_window(self, lengths: Sequence[int]) -> bool:
        """One-window lookahead: whether the rest of the stream after the window being fed
        (``lengths``, all of it) should join that window, fed with ``last=True``
        (:func:`~atac_hf.packing.planners.wfap_end.rest_fits_window`)."""
        return rest_fits_window(self.config, lengths if _is_checked(lengths) else check_lengths(lengths, "lengths"))

    @property
    def metrics(self) -> dict[str, Any]:
        """Running metrics of everything emitted so far (see :mod:`atac_hf.packing.metrics`)."""
        return self._metrics.summary()

    # ------------------------------------------------------------------ packing
    def add_window(self, sample_ids: Sequence[int], lengths: Sequence[int], *, last: bool = False) -> list[Pack]:
        """Pack one window: the new samples plus those carried from earlier windows.

        Args:
            sample_ids: ids of the new samples (ints, unique, not pending).
            lengths: their token counts (ints >= 0; 0 is skipped and counted).
            last: no samples follow (the end of the stream or epoch, when the feeder
                knows it): the window is planned as :meth:`flush` plans its windows, so
                nothing is held back for windows that will not come (``wfap`` releases the
                heavy samples it holds; ``wlb`` its queued outliers). Call :meth:`flush`
                after it for whatever did not fit.

        Returns:
            up to ``packs_per_window`` packs (that many unless too few samples are available
            or, ``last``, the samples need fewer), each a list of ``(sample_id, start, end)``.

        Raises:
            ValueError / TypeError: bad ids or lengths (nothing is changed then), a
                non-bool ``last``, or a sample over ``max_tokens`` with ``overlength="error"``.
        """
        if not isinstance(last, (bool, np.bool_)):
            raise TypeError(f"last={last!r} must be True or False (True: no samples follow this window)")
        ids, lens = check_window(sample_ids, lengths, self.config)
        return self._add_checked(ids, lens, last=bool(last))

    def _add_checked(self, ids: list[int], lens: list[int], last: bool = False) -> list[Pack]:
        pending = {it[SID] for it in self._pool} | set(self._open)
        clash = [i for i in ids if i in pending]
        if clash:
            raise ValueError(
                f"sample id {clash[0]} is still pending in the packer (carried from an earlier window); "
                "every sample id of a stream must be unique"
            )
        self._ingest(ids, lens)
        return self._step(final=last)

    def flush(self) -> list[Pack]:
        """End of stream: pack everything carried (as many windows as it takes)."""
        return [p for window in self.flush_windows() for p in window]

    def flush_windows(self) -> list[list[Pack]]:
        """Like :meth:`flush`, but keeps the window structure (each window up to
        ``packs_per_window`` packs)."""
        out = []
        while self._pool:
            before = len(self._pool), self.pending_tokens
            out.append(self._step(final=True))
            if not out[-1] and (len(self._pool), self.pending_tokens) == before:  # pragma: no cover
                raise AssertionError("flush made no progress; this is a bug in the packer")
        return out

    def _context(self, final: bool) -> WindowContext:
        return WindowContext(self.config, self.cost_model, self._window, final, self._ref, self.pack_multiple)

    def _ingest(self, ids: list[int], lens: list[int]) -> None:
        cfg, C, w = self.config, int(self.config.max_tokens), self._window
        m, split_here = self._metrics, []
        for sid, L in zip(ids, lens):
            if L == 0:
                m.zero_length_skipped += 1
                continue
            seq, self._seq = self._seq, self._seq + 1
            if L <= C:
                self._pool.append((sid, 0, L, w, seq, 0))
            elif cfg.overlength == "truncate":
                self._pool.append((sid, 0, C, w, seq, 0))
                m.truncated_tokens += L - C
            else:  # split into full-cap fragments and the remainder (planners/window.py)
                split_here.append(L)
                pos = 0
                pieces = []
                for size in overlength_pieces(L, C, int(cfg.min_fragment)):
                    pieces.append((sid, pos, pos + size, w, seq, 1))
                    pos += size
                shown = int(cfg.packs_per_window)
                self._pool.extend(pieces[:shown])
                if len(pieces) > shown:
                    self._backlog[sid] = pieces[shown:]
                    self._backlog_tokens += sum(it[END] - it[START] for it in pieces[shown:])
                self._open[sid] = [L, 0]
                m.num_split += 1
        if split_here and not self._warned_overlength:
            self._warned_overlength = True  # once per packer: a stream may hold many
            warnings.warn(
                f"{len(split_here)} sample(s) of this window are longer than max_tokens={C} (the longest has "
                f"{max(split_here)} tokens) and were split into fragments, each its own document "
                "(overlength='split'); set overlength='error' to refuse such samples or 'truncate' to cut them "
                "to max_tokens (ATACTrainer / ATACAccelerator: ATACConfig(packing_options={'overlength': ...}); "
                "pack_dataset(overlength=...); atac-hf pack --overlength). Warned once per packer; "
                "metrics['num_split'] counts them all",
                UserWarning, stacklevel=4,
            )

    def _step(self, final: bool) -> list[Pack]:
        ctx = self._context(final)
        packs, carry, newly_split = self._planner(self._pool, ctx)
        carry = fill_empty_packs(packs, carry, ctx)
        carry, more = place_overdue(packs, carry, ctx)
        for sid, tokens in newly_split + more:
            self._open[sid] = [tokens, 0]
            self._metrics.num_split += 1
        packs = [sorted(p, key=_DATA_ORDER) for p in packs if p]
        self._pool = carry
        self._top_up()
        out = [[(it[SID], it[START], it[END]) for it in p] for p in packs]
        self._metrics.add_window(pack_costs(out, self.cost_model), sum(e - s for p in out for _, s, e in p))
        w = self._window
        for p in packs:
            for it in p:
                delay = w - it[ARRIVAL]
                if it[FRAG]:
                    rec = self._open[it[SID]]
                    rec[0] -= it[END] - it[START]
                    rec[1] = max(rec[1], delay)
                    if rec[0] == 0:
                        del self._open[it[SID]]
                        self._metrics.add_sample(rec[1])
                else:
                    self._metrics.add_sample(delay)
        self._window += 1
        return out

    def _top_up(self) -> None:
        """Keep the pool canonical: each split sample shows its first ``packs_per_window``
        fragments (by start), the rest wait in the backlog (:meth:`_split_backlog` derives
        the same split from a saved pool). Fragments a planner split off itself beyond that
        number move to the backlog; backlog fragments join as shown ones leave."""
        shown = int(self.config.packs_per_window)
        visible: dict[int, list[Item]] = {}
        for it in self._pool:
            if it[FRAG]:
                visible.setdefault(it[SID], []).append(it)
        over = {sid: sorted(v, key=_DATA_ORDER)[shown:] for sid, v in visible.items() if len(v) > shown}
        if over:
            drop = {(it[SID], it[START]) for v in over.values() for it in v}
            self._pool = [it for it in self._pool if (it[SID], it[START]) not in drop]
            for sid, moved in over.items():
                self._backlog[sid] = sorted(moved + self._backlog.get(sid, []), key=_DATA_ORDER)
                self._backlog_tokens += sum(it[END] - it[START] for it in moved)
        for sid in list(self._backlog):
            wait = self._backlog[sid]
            take = max(0, shown - min(shown, len(visible.get(sid, ()))))
            self._pool.extend(wait[:take])
            self._backlog_tokens -= sum(it[END] - it[START] for it in wait[:take])
            if take >= len(wait):
                del self._backlog[sid]
            else:
                self._backlog[sid] = wait[take:]

    def _split_backlog(self, pool: list[Item]) -> tuple[list[Item], dict[int, list[Item]]]:
        """Inverse of how :meth:`state_dict` stores the backlog in ``pool``: a split sample's
        fragments beyond its first ``packs_per_window`` (by start) are its backlog."""
        shown = int(self.config.packs_per_window)
        starts: dict[int, list[int]] = {}
        for it in pool:
            if it[FRAG]:
                starts.setdefault(it[SID], []).append(it[START])
        cut = {sid: sorted(v)[shown] for sid, v in starts.items() if len(v) > shown}
        if not cut:
            return pool, {}
        visible = [it for it in pool if it[SID] not in cut or it[START] < cut[it[SID]]]
        backlog: dict[int, list[Item]] = {}
        for it in sorted((it for it in pool if it[SID] in cut and it[START] >= cut[it[SID]]), key=_DATA_ORDER):
            backlog.setdefault(it[SID], []).append(it)
        return visible, backlog

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, JSON-serialisable."""
        return {
            "format": _STATE_FORMAT,
            "config": self.config.to_dict(),
            "cost_model": dataclasses.asdict(self.cost_model),
            "window": self._window,
            "seq": self._seq,
            "pool": [list(it) for it in self._pool] + [list(it) for items in self._backlog.values() for it in items],
            "open": [[sid, rec[0], rec[1]] for sid, rec in self._open.items()],
            "metrics": self._metrics.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (also after a JSON round trip).

        Raises:
            ValueError: the state is not a packer state, is malformed (missing or unparsable
                fields; nothing is changed then), or was saved with a different config or cost model.
        """
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"not a StreamPacker state (expected format {_STATE_FORMAT!r})")
        missing = sorted({"config", "cost_model", "window", "seq", "pool", "open", "metrics"} - set(state))
        if missing or not isinstance(state["config"], Mapping) or not isinstance(state["metrics"], Mapping):
            raise ValueError(f"malformed StreamPacker state (missing {missing} or a non-mapping config/metrics): "
                             "a truncated or edited checkpoint? Resume from an intact one")
        mine = self.config.to_dict()
        diff = sorted(k for k in mine if state["config"].get(k) != mine[k])
        if diff:
            saved = ", ".join(f"{k}={state['config'].get(k)!r}" for k in diff)
            have = ", ".join(f"{k}={mine[k]!r}" for k in diff)
            raise ValueError(
                f"packer state was saved with a different PackingConfig ({saved}; this packer has {have}): "
                "resume with the same config"
            )
        if state["cost_model"] != (cm := dataclasses.asdict(self.cost_model)):
            raise ValueError(f"packer state was saved with a different cost model "
                             f"({state_field_diff(state['cost_model'], cm)}): resume with that cost_model")
        # parse and check everything before changing anything
        window = state_int(state, "window", "StreamPacker", 0, MAX_WINDOWS)
        seq = state_int(state, "seq", "StreamPacker", 0, MAX_WINDOWS)
        pool, open_ = check_packer_pool(state["pool"], state["open"], window=window, seq=seq,
                                        max_tokens=int(self.config.max_tokens))
        metrics = MetricsAccumulator.check_state(state["metrics"])
        for f, v in metrics.items():
            setattr(self._metrics, f, v)
        pool, backlog = self._split_backlog(pool)
        self._window, self._seq, self._pool, self._open, self._backlog = window, seq, pool, open_, backlog
        self._backlog_tokens = sum(it[END] - it[START] for items in backlog.values() for it in items)


def _progress_bar(total: int) -> Any:
    """A tqdm bar over ``total`` samples on stderr (tqdm imported here: planning stays numpy-only)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="pack_lengths", unit="samples")


def _is_checked(lengths: Any) -> bool:
    """An int64 1-D array (the feeders pass slices of lengths they checked already)."""
    return isinstance(lengths, np.ndarray) and lengths.dtype == np.int64 and lengths.ndim == 1


def pack_lengths(lengths: Sequence[int], config: PackingConfig | None = None, cost_model: CostModel | None = None, *,
                 window: int | None = None, progress: bool = False, **settings: Any) -> PackResult:
    """Pack a whole array of sample lengths window by window (a :class:`StreamPacker` fed in data order, the
    last window with ``last=True``, then flushed). With token-sized windows (``window=None``), a rest of the
    stream smaller than one window joins the window before it (:meth:`StreamPacker.rest_fits_window`).

    Args:
        lengths: token count of every sample (ints >= 0; zeros are skipped and counted).
        config: the packing configuration; ``settings`` (its fields by name, e.g. ``max_tokens=4096``) go over it.
        cost_model: default :func:`~atac_hf.cost.default_cost_model`.
        window: new samples per window; ``None`` sizes each window by tokens: samples are
            added until they reach the packer's :attr:`StreamPacker.tokens_wanted`.
        progress: show a tqdm bar over the samples packed, on stderr (default off; the
            packs are the same either way). Not a packing setting.

    Returns:
        :class:`PackResult`; sample ids are indices into ``lengths``.

    Raises:
        ValueError / TypeError: empty input, non-integer or negative lengths, a bad ``window``, no config
            and no ``max_tokens``, an unknown setting, a non-bool ``progress``, or (``overlength="error"``) a
            sample over ``max_tokens``.
    """
    if not isinstance(progress, (bool, np.bool_)):
        raise TypeError(f"pack_lengths: progress={progress!r:.60} must be True or False (set progress: True shows a "
                        "progress bar on stderr)")
    config = PackingConfig.resolve(config, settings, "pack_lengths")
    arr = check_lengths(lengths, "lengths")
    if arr.size == 0:
        raise ValueError("lengths is empty: nothing to pack (pass at least one sample length)")
    if window is not None and (not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window={window!r} is invalid: it must be None (size windows by tokens) or an int >= 1 samples")
    check_overlength(arr, np.arange(arr.size), config)
    packer = StreamPacker(config, cost_model)
    n = arr.size
    arrival = np.zeros(n, dtype=np.int64)
    windows: list[list[Pack]] = []
    pos, look = 0, MIN_LOOK
    with _progress_bar(n) if progress else contextlib.nullcontext() as bar:
        while pos < n:
            if window is not None:
                k = max(0, min(int(window), n - pos))
            else:
                k, look = next_window(packer, arr, pos, look, prev_empty=not windows or not windows[-1])
            arrival[pos:pos + k] = packer.window_index
            windows.append(packer._add_checked(list(range(pos, pos + k)), arr[pos:pos + k].tolist(),
                                               last=pos + k >= n))
            pos += k
            if bar is not None:
                bar.update(k)
        windows.extend(packer.flush_windows())
    packs = [p for win in windows for p in win]
    pack_window = [w for w, win in enumerate(windows) for _ in win]
    last = np.full(n, -1, dtype=np.int64)
    for p, w in zip(packs, pack_window):
        for sid, _s, _e in p:
            last[sid] = w
    delay = np.where(last >= 0, last - arrival, 0)
    deferred = [(int(i), int(delay[i])) for i in np.flatnonzero(delay > 0)]
    return PackResult(packs=packs, deferred=deferred, metrics=packer.metrics, pack_window=pack_window,
                      arrival=arrival.tolist())

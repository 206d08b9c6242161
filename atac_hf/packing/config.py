"""PackingConfig: every knob of the packing planners, validated once.

Numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

__all__ = ["PackingConfig", "STRATEGIES", "OVERLENGTH_POLICIES", "MAX_LENGTH", "MAX_PACKS_PER_WINDOW",
           "MAX_DEFER"]

STRATEGIES = ("wfap", "sequential", "bfd", "wlb")
OVERLENGTH_POLICIES = ("split", "truncate", "error")
# Bounds that keep every count an exact int64 and every loop finite (a window plans
# packs_per_window packs at once; 2**40 tokens is ~10^12, far beyond any sample or cap).
MAX_LENGTH = 2**40  # max_tokens, sample lengths, wlb thresholds, reference_doc_tokens
MAX_PACKS_PER_WINDOW = 2**16  # DP replicas x micro-batches of one window (a window plans them all at once)
MAX_DEFER = 2**31  # windows a sample may wait


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True, kw_only=True)
class PackingConfig:
    """How samples are packed into rows of at most ``max_tokens`` tokens, window by window.

    Attributes:
        max_tokens: token cap of one pack (memory), > 0.
        packs_per_window: packs produced per window (>= 1), e.g. DP replicas x
            gradient-accumulation micro-batches of one optimizer step. ``wfap`` gives the
            last window of a stream only the packs its samples need (planners/wfap_end.py).
        strategy: ``"wfap"`` (cost-balanced, deferral of heavy samples), ``"sequential"``
            (next-fit in data order), ``"bfd"`` (best-fit decreasing on tokens, TRL's
            default) or ``"wlb"`` (WLB-LLM variable-length packing with outlier delay).
        overlength: what happens to a sample longer than ``max_tokens``: ``"split"`` into
            the fewest fragments that fit, full-cap ones first and the rest last (each its own
            document in its row; see :func:`~atac_hf.packing.planners.window.overlength_pieces`),
            ``"truncate"`` to the first ``max_tokens`` tokens (the rest is dropped and
            counted), or ``"error"`` (raise ValueError).
        min_fragment: shortest fragment a split may leave, in tokens (>= 1). Default
            ``None``: ``min(128, max_tokens // 8)`` (at least 1): 128 from a 1,024-token
            cap up, an eighth of the cap below it (a fixed 128, or half the cap, would
            leave rooms at small caps that no fragment may fill: split-mode packs then
            stay 5-10% above ``ceil(tokens / max_tokens)``, docs/BENCHMARKS.md "Split
            mode"). Must be at most ``max_tokens // 2`` so that an overlength split can
            always respect it.
        max_defer: windows a sample may be held back (>= 0): in the window where it has
            waited this many windows it is *overdue* and placed before everything else
            (a whole one displaces samples that may still wait), so no sample is emitted
            more than ``max_defer`` windows after it arrived as long as a window's overdue
            samples fit in its packs whole. Where they do not (no two of them share a pack,
            say), a sample that fits the cap waits a window more, whole: a late sample keeps
            what is learned, a cut one does not. ``0`` disables deferral. Mostly ``wfap``'s
            heavy samples wait long; others rarely wait more than one window.
        split_overdue: split an overdue fragment of a sample over the cap, or with
            ``max_defer=0`` an overdue sample that fits the cap, that fits in no pack whole
            over pack ends (fragments >= ``min_fragment``) rather than let it wait longer;
            a sample that fits the cap only where the packs' room holds all of it (it is never
            cut for a part that would still finish late). With ``max_defer >= 1`` no sample
            that fits the cap is cut.
        balance_tolerance: ``wfap``: target max/mean pack cost of a window (> 1). A sample
            is *heavy* (held back as an anchor) when it alone costs more than
            ``balance_tolerance`` x a full pack of short documents; held samples are
            released together as soon as the pool holds ``packs_per_window`` of them whose
            packs would be balanced within this tolerance (or when they are overdue).
        local_search: ``wfap``: after the greedy placement, move or swap tails between the
            most and least expensive packs while that lowers the maximum.
        balance_split: ``wfap``: an overdue heavy sample that no group of similar anchors
            can balance is split into the fewest near-equal fragments (>= ``min_fragment``)
            that each cost no more than a full pack of short documents, and placed as
            tails. Counted in ``fragmentation`` when the sample was whole. ``False`` (the
            default: no default cuts a sample that fits the cap) releases it as an anchor
            anyway (the window is then unbalanced).
        defer_heavy: ``wfap``: hold heavy samples back (bounded by ``max_defer``) until a
            window can give each pack an anchor of similar cost. ``False`` places every
            sample in the window it arrives in (cost-balanced greedy only).
        wlb_thresholds: ``wlb``: outlier-delay length thresholds ``L1 < ... < Ln`` in
            tokens; a document of length >= ``L_k`` (and < ``L_{k+1}``) waits in queue
            ``k``, which releases ``packs_per_window`` documents, one per pack, once it
            holds that many. Default ``None``: ``(max_tokens // 4, max_tokens // 2)``.
            An empty tuple disables the outlier delay.
        reference_doc_tokens: length of the "short document" used as the reference
            when costing a full pack of light work (``wfap`` heavy threshold), >= 1.
        price_band: ``wfap``: attention price ratios ``(low, high)`` (relative to the cost
            model's) the balance must hold for, ``0 <= low <= 1 <= high <= 1000``, low < high.
            The planner then costs every sample under the cost model with its attention pair
            price scaled by ``low`` and by ``high`` and balances the worse of the two (each
            pack's cost over the window's mean is monotone in the price, so the band's ends
            bound every price inside it): heavy samples are those heavy at either end,
            released in runs of similar length, and tails go where the worse end stays
            lowest. ``(0.5, 2.0)`` holds the balance when the attention price is off by up
            to 2x either way (docs/BENCHMARKS.md "Robustness to cost-model error"). Default
            ``None``: balance the cost model's estimate alone (slightly tighter windows when
            the cost model is exact). ``(0, 1000)`` about balances token-wise work and
            attention pairs separately.
        band_placement: ``wfap`` with ``price_band``: tails and local search balance the
            band too (True, the default); False: only the deferral (which samples are
            heavy, which run is released) uses the band, tails balance the cost model alone.
    """

    max_tokens: int
    packs_per_window: int
    strategy: str = "wfap"
    overlength: str = "split"
    min_fragment: int | None = None
    max_defer: int = 16
    split_overdue: bool = True
    balance_tolerance: float = 1.05
    local_search: bool = True
    balance_split: bool = False
    defer_heavy: bool = True
    wlb_thresholds: tuple[int, ...] | None = None
    reference_doc_tokens: int = 2048
    price_band: tuple[float, float] | None = None
    band_placement: bool = True

    def __post_init__(self) -> None:
        # numeric fields accept Python and numpy numbers (never bools) and are stored as
        # Python ints / floats, so to_dict() is JSON and equal configs compare equal
        if not _is_int(self.max_tokens) or not 0 < self.max_tokens <= MAX_LENGTH:
            raise ValueError(
                f"max_tokens={self.max_tokens!r} is invalid: it must be an int > 0 and <= {MAX_LENGTH} "
                "(2**40; the per-pack token cap; set max_tokens / --max-tokens)"
            )
        object.__setattr__(self, "max_tokens", int(self.max_tokens))
        if not _is_int(self.packs_per_window) or not 1 <= self.packs_per_window <= MAX_PACKS_PER_WINDOW:
            raise ValueError(
                f"packs_per_window={self.packs_per_window!r} is invalid: it must be an int >= 1 and "
                f"<= {MAX_PACKS_PER_WINDOW} (2**16; e.g. DP replicas x gradient-accumulation steps; set "
                "packs_per_window / --packs-per-window)"
            )
        object.__setattr__(self, "packs_per_window", int(self.packs_per_window))
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"unknown packing strategy {self.strategy!r}; legal values: {list(STRATEGIES)} (set strategy / --strategy)"
            )
        if self.overlength not in OVERLENGTH_POLICIES:
            raise ValueError(
                f"unknown overlength policy {self.overlength!r}; legal values: {list(OVERLENGTH_POLICIES)} "
                "(set overlength / --overlength)"
            )
        limit = max(1, self.max_tokens // 2)
        if self.min_fragment is None:
            object.__setattr__(self, "min_fragment", _default_min_fragment(self.max_tokens))
        elif not _is_int(self.min_fragment) or not 1 <= self.min_fragment <= limit:
            raise ValueError(
                f"min_fragment={self.min_fragment!r} is invalid: it must be an int in [1, max_tokens // 2 = {limit}] "
                "(set min_fragment, or None for the default)"
            )
        object.__setattr__(self, "min_fragment", int(self.min_fragment))
        if not _is_int(self.max_defer) or not 0 <= self.max_defer <= MAX_DEFER:
            raise ValueError(
                f"max_defer={self.max_defer!r} is invalid: it must be an int >= 0 and <= {MAX_DEFER} windows "
                "(0 disables deferral; set max_defer)"
            )
        object.__setattr__(self, "max_defer", int(self.max_defer))
        for name in ("split_overdue", "local_search", "balance_split", "defer_heavy", "band_placement"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False (set {name})")
            object.__setattr__(self, name, bool(getattr(self, name)))
        tol = self.balance_tolerance
        if not _is_number(tol) or not math.isfinite(float(tol)) or not 1.0 < float(tol) <= 1e6:
            raise ValueError(
                f"balance_tolerance={tol!r} is invalid: it must be a number > 1 and <= 1e6 (target max/mean pack "
                "cost, e.g. 1.05; set balance_tolerance)"
            )
        object.__setattr__(self, "balance_tolerance", float(tol))
        if self.wlb_thresholds is not None:
            th = self.wlb_thresholds
            if isinstance(th, (str, bytes)) or not hasattr(th, "__iter__"):
                raise TypeError(f"wlb_thresholds={th!r} must be None or a sequence of ints (set wlb_thresholds)")
            th = tuple(th)
            if len(th) > 64 or not all(_is_int(x) and 1 <= x <= MAX_LENGTH for x in th) \
                    or any(a >= b for a, b in zip(th, th[1:])):
                raise ValueError(
                    f"wlb_thresholds={th!r} is invalid: it must be at most 64 strictly increasing ints in "
                    f"[1, {MAX_LENGTH}] (token lengths L1 < ... < Ln; () disables the outlier delay; set "
                    "wlb_thresholds)"
                )
            object.__setattr__(self, "wlb_thresholds", tuple(int(x) for x in th))
        if not _is_int(self.reference_doc_tokens) or not 1 <= self.reference_doc_tokens <= MAX_LENGTH:
            raise ValueError(f"reference_doc_tokens={self.reference_doc_tokens!r} must be an int >= 1 and "
                             f"<= {MAX_LENGTH} (set reference_doc_tokens)")
        object.__setattr__(self, "reference_doc_tokens", int(self.reference_doc_tokens))
        if self.price_band is not None:
            object.__setattr__(self, "price_band", _check_band(self.price_band))

    # ------------------------------------------------------------------ derived values
    @property
    def window_tokens(self) -> int:
        """Token capacity of one window: ``packs_per_window * max_tokens``."""
        return int(self.max_tokens) * int(self.packs_per_window)

    @property
    def resolved_wlb_thresholds(self) -> tuple[int, ...]:
        """``wlb_thresholds`` with the default filled in."""
        if self.wlb_thresholds is not None:
            return self.wlb_thresholds
        c = int(self.max_tokens)
        return tuple(sorted({max(1, c // 4), max(1, c // 2)}))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def for_training(cls, max_tokens: int, *, dp_size: int = 1, grad_accum: int = 1, **options: Any) -> "PackingConfig":
        """One window per optimizer step: ``packs_per_window = dp_size * grad_accum``."""
        if "packs_per_window" in options:
            raise TypeError(
                f"for_training: packs_per_window={options['packs_per_window']!r} cannot be set here: for_training "
                "sets packs_per_window = dp_size * grad_accum (pass dp_size / grad_accum, or build "
                "PackingConfig(max_tokens=..., packs_per_window=...) directly)")
        legal = [f.name for f in dataclasses.fields(cls) if f.name not in ("max_tokens", "packs_per_window")]
        unknown = sorted(set(options) - set(legal))
        if unknown:
            raise TypeError(f"for_training: unknown packing setting(s) {unknown}; legal: "
                            f"{['dp_size', 'grad_accum', *legal]}")
        for name, v in (("dp_size", dp_size), ("grad_accum", grad_accum)):
            if not _is_int(v) or not 1 <= v <= MAX_PACKS_PER_WINDOW:
                raise ValueError(f"{name}={v!r} must be an int >= 1 and <= {MAX_PACKS_PER_WINDOW}")
        return cls(max_tokens=max_tokens, packs_per_window=int(dp_size) * int(grad_accum), **options)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PackingConfig":
        """Build from a mapping (e.g. a JSON/YAML config section); unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a packing config must be a mapping, got {type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields, key=repr)
        if unknown:
            raise ValueError(f"unknown packing config keys {unknown}; legal keys: {sorted(fields)}")
        missing = [k for k in ("max_tokens", "packs_per_window") if k not in data]
        if missing:
            raise ValueError(f"packing config is missing the required key(s) {missing}: a packing config needs "
                             f"'max_tokens' and 'packs_per_window' (legal keys: {sorted(fields)})")
        kwargs = dict(data)
        for key in ("wlb_thresholds", "price_band"):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    @classmethod
    def resolve(cls, config: "PackingConfig | None", settings: Mapping[str, Any], caller: str) -> "PackingConfig":
        """``config`` with ``settings`` (field values, e.g. ``max_tokens=4096``) over it, or a new config of
        ``settings`` alone (``packs_per_window`` 64 unless given, as in ``pack_dataset``): the two ways
        :func:`~atac_hf.packing.pack_lengths` is called."""
        if config is not None and not isinstance(config, cls):
            raise TypeError(f"{caller}: config must be a PackingConfig or None, got {type(config).__name__} "
                            f"(pass settings by name, e.g. {caller}(lengths, max_tokens=4096))")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - fields)
        if unknown:
            raise TypeError(f"{caller}: unknown packing setting(s) {unknown}; legal: {sorted(fields)}")
        if config is None and "max_tokens" not in settings:
            raise TypeError(f"{caller} needs a token cap: {caller}(lengths, max_tokens=4096) or "
                            f"{caller}(lengths, PackingConfig(max_tokens=4096, packs_per_window=64))")
        if not settings:
            return config
        if config is None:
            return cls(**{"packs_per_window": 64, **settings})
        if "max_tokens" in settings and "min_fragment" not in settings \
                and config.min_fragment == _default_min_fragment(config.max_tokens):
            # the default derived from the old cap is derived again from the new one (a min_fragment
            # set to exactly that default by hand is taken as the default too)
            settings = {**settings, "min_fragment": None}
        return dataclasses.replace(config, **settings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields (inverse of :meth:`from_dict`)."""
        d = dataclasses.asdict(self)
        for key in ("wlb_thresholds", "price_band"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d


def _check_band(band: Any) -> tuple[float, float]:
    legal = ("it must be None or two numbers (low, high) with 0 <= low <= 1 <= high <= 1000 and low < high "
             "(attention price ratios the balance must hold for, e.g. (0.5, 2.0); set price_band)")
    if isinstance(band, (str, bytes)) or not hasattr(band, "__iter__"):
        raise TypeError(f"price_band={band!r} is invalid: {legal}")
    vals = tuple(band)
    if len(vals) != 2 or not all(_is_number(v) and math.isfinite(float(v)) for v in vals):
        raise ValueError(f"price_band={band!r} is invalid: {legal}")
    lo, hi = float(vals[0]), float(vals[1])
    if not (0.0 <= lo <= 1.0 <= hi <= 1000.0 and lo < hi):
        raise ValueError(f"price_band={band!r} is invalid: {legal}")
    return lo, hi


def _default_min_fragment(max_tokens: int) -> int:
    """``min_fragment``'s default for a token cap: an eighth of it, at most 128 (at least 1)."""
    return min(128, max(1, int(max_tokens) // 8))

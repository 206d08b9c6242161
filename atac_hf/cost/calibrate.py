"""`atac-hf calibrate`: measure one transformer-layer-like block on this device and fit
the :class:`~atac_hf.cost.CostModel` coefficients.

What is measured (forward + backward, the minimum over ``repeats`` timed rounds after a
warm-up):

* **linear**: RMSNorm, Q/K/V/O projections and a gated MLP (two matrices where the model's is plain:
  ``ModelDims.gated_mlp``) on ``n`` tokens (the attention is replaced by an element-wise stand-in), for a grid of ``n``;
  fits ``linear_s_per_token`` (least squares on ``n`` plus an intercept that is
  dropped: the cost model has no per-call constant).
* **attention**, through the attention backend's own per-segment kernel
  (:func:`~atac_hf.attention.backends.attend_segment`, the code a CP rank runs):
  whole documents (single documents and packs of many), and *chunks* of documents
  (queries ``[start, end)`` against keys ``[0, end)``: what a rank computes for a
  document sharded over the CP group). The ``sdpa`` backend runs chunks on other
  kernels than whole documents (on CPU two unmasked kernels merged by log-sum-exp for
  big chunks, one masked call for small ones; elsewhere masked blocks of query rows),
  with far more set-up per call; non-negative least squares (relative errors) on
  tokens, pairs, calls and chunk calls fits ``attn_s_per_pair``,
  ``segment_overhead_s`` and ``masked_segment_overhead_s``. Where chunks run as
  masked row blocks (CUDA, or a sliding window), which compute and mask whole
  rectangles, their pairs get their own price, ``masked_attn_s_per_pair``, and
  ``mask_block`` is the backend's row block. On CPU the merge runs the same fused
  kernel as whole documents, so pairs share one price there. Backends with native bottom-right causal
  kernels (flash) fit one pair price and one call price. The per-token part of
  attention joins ``linear_s_per_token``.
* **held out**: the whole block (linear + per-document attention) on packs the
  fit never saw, and attention on rank-like shards (whole documents plus chunks);
  the report gives the fitted model's relative error on them.

Times are the minimum over ``repeats`` rounds that visit every measurement in a
shuffled order (other processes only add time, and interleaving spreads their load).
CPU: float32, ``tile=1`` (exact pair counts), one thread by default and the
process CPU clock, so that other processes sharing the cores do not leak into the
profile (the profile then describes one core). CUDA: bfloat16, ``tile=128``, wall
clock with synchronisation.

This is the only planning-side module that imports torch (lazily, inside the functions).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .calibration_grid import estimate_seconds, fit_to_budget, job_seconds, probe_rates, progress_bar
from .calibration_grid import measurement_grid as _grid
from .model import CostModel
from .presets import MODEL_PRESETS, ModelDims

__all__ = ["CalibrationResult", "calibrate", "fit_coefficients"]


@dataclass
class CalibrationResult:
    """Fitted model and how well it predicts held-out measurements.

    Attributes:
        cost_model: the fitted :class:`CostModel`.
        device: ``"cpu"`` or the CUDA device name.
        dims: the model dimensions measured.
        backend: the attention backend measured (``sdpa``, ``flash``, ``varlen_reference``).
        linear: rows ``(tokens, seconds)``; attention: rows ``(segments, seconds)`` with
            ``segments`` a list of ``(document length, start, end)``.
        heldout: rows ``{"kind", "segments", "measured_s", "predicted_s", "rel_err"}``;
            kind ``"pack"`` is the whole block on whole documents, ``"shard"`` attention only.
        seconds: wall time of the calibration.
        capped_from: the ``max_len`` asked for when the time budget cut it (else None).
    """

    cost_model: CostModel
    device: str
    dims: ModelDims
    tp_size: int
    backend: str = "sdpa"
    linear: list[tuple[int, float]] = field(default_factory=list)
    attention: list[tuple[list[tuple[int, int, int]], float]] = field(default_factory=list)
    heldout: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    capped_from: int | None = None

    @property
    def max_rel_err(self) -> float:
        return max((abs(h["rel_err"]) for h in self.heldout), default=float("nan"))

    @property
    def mean_rel_err(self) -> float:
        return float(np.mean([abs(h["rel_err"]) for h in self.heldout])) if self.heldout else float("nan")

    @property
    def longest_document(self) -> int:
        """Length of the longest document measured: prices beyond it are extrapolated."""
        return max((seg[0] for segments, _ in self.attention for seg in segments), default=0)

    def metadata(self) -> dict[str, Any]:
        """What :meth:`CostModel.save` stores beside the coefficients (the simulator checks ``model``/``tp_size``)."""
        return {
            "device": self.device,
            "model": dataclasses.asdict(self.dims),
            "tp_size": self.tp_size,
            "backend": self.backend,
            "heldout_max_rel_err": self.max_rel_err,
            "heldout_mean_rel_err": self.mean_rel_err,
            "num_measurements": len(self.linear) + len(self.attention) + len(self.heldout),
            "longest_document": self.longest_document,
            "max_len_capped_from": self.capped_from,
            "seconds": self.seconds,
            "tool": "atac-hf calibrate",
        }

    def save(self, path: str) -> None:
        self.cost_model.save(path, **self.metadata())

    def summary(self) -> str:
        cm = self.cost_model
        fmt = lambda v: "same" if v is None else f"{v:.3e}"
        masked = f"{fmt(cm.masked_attn_s_per_pair)}  masked_segment_overhead_s {fmt(cm.masked_segment_overhead_s)}"
        lines = [
            f"device {self.device}, backend {self.backend}; {len(self.linear)} linear + {len(self.attention)} "
            f"attention measurements (documents up to {self.longest_document} tokens) in {self.seconds:.1f} s",
            f"linear_s_per_token {cm.linear_s_per_token:.3e}  attn_s_per_pair {cm.attn_s_per_pair:.3e}  "
            f"masked_attn_s_per_pair {masked}  segment_overhead_s {cm.segment_overhead_s:.3e}  "
            f"mask_block {cm.mask_block}  tile {cm.tile}",
            f"held out: mean |error| {100 * self.mean_rel_err:.1f}%, max |error| {100 * self.max_rel_err:.1f}% "
            f"over {len(self.heldout)} cases",
        ]
        if self.capped_from:
            lines.insert(1, f"max_len {self.capped_from} was capped at {self.longest_document} tokens by the time "
                            "budget: prices of longer documents are extrapolated")
        for h in self.heldout:
            lines.append(f"  {h['kind']:<5} {_describe(h['segments']):<34} measured {1e3 * h['measured_s']:8.2f} ms  "
                         f"predicted {1e3 * h['predicted_s']:8.2f} ms  ({100 * h['rel_err']:+.1f}%)")
        return "\n".join(lines)


def _describe(segments: Sequence[Sequence[int]]) -> str:
    """``768+256`` for whole documents, ``2048[1024:2048]`` for chunks; counts for long lists."""
    if len(segments) > 3:
        return f"{len(segments)} segs, {sum(e - s for _, s, e in segments)} tok"
    return "+".join(str(L) if (s, e) == (0, L) else f"{L}[{s}:{e}]" for L, s, e in segments)


def fit_coefficients(X: np.ndarray, y: np.ndarray, *, relative: bool = True) -> np.ndarray:
    """Non-negative least squares for a few columns (active set by refitting without
    negative coefficients). ``relative`` weights rows by ``1 / y`` (fits relative error).

    Raises:
        ValueError: shapes disagree or fewer rows than columns.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] != y.shape[0] or X.shape[0] < X.shape[1]:
        raise ValueError(f"fit needs rows >= columns and matching shapes, got X {X.shape}, y {y.shape}")
    w = 1.0 / np.maximum(y, 1e-12) if relative else np.ones_like(y)
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(X[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


# ---------------------------------------------------------------------------- measuring
def _interleaved_min_times(fns: Sequence[Callable[[], None]], repeats: int, sync: Callable[[], None],
                           clock: Callable[[], float], seed: int, say: Callable[[str], None],
                           bar: Any = None, weights: Sequence[float] | None = None) -> list[float]:
    """Minimum time of each closure over ``repeats`` rounds after a warm-up round.

    Rounds visit the closures in a fresh shuffled order, so that load from other
    processes (which only ever adds time) spreads over all measurements instead of
    biasing the ones that happened to run during it. ``bar`` (tqdm-like) advances by each
    closure's ``weights`` entry (its estimated seconds) as it finishes.
    """
    rng = np.random.default_rng(seed)
    best = [math.inf] * len(fns)
    t_first = time.perf_counter()
    for rnd in range(repeats + 1):
        for i in rng.permutation(len(fns)):
            t0 = clock()
            fns[i]()
            sync()
            if rnd:
                best[i] = min(best[i], clock() - t0)
            if bar is not None:
                bar.update(weights[i] if weights is not None else 1)
        if bar is not None:
            bar.set_postfix_str(f"round {rnd + 1}/{repeats + 1} done")
        if not rnd:
            took = time.perf_counter() - t_first
            msg = f"warm-up round done in {took:.0f} s: about {repeats * took / 60:.1f} min to go"
            bar.write(msg, file=sys.stderr) if bar is not None else say(msg)
        elif bar is None:
            say(f"round {rnd}/{repeats} done")
    return best


class _Block:
    """A Llama-like decoder layer split into its linear part and its attention (torch)."""

    def __init__(self, dims: ModelDims, tp_size: int, device: Any, dtype: Any, seed: int, backend: str) -> None:
        import torch
        from torch import nn

        g = torch.Generator().manual_seed(seed)
        h = dims.hidden_size
        self.heads, self.kv_heads = dims.num_heads // tp_size, max(1, dims.num_kv_heads // tp_size)
        self.hd = dims.head_dim
        inter = dims.intermediate_size // tp_size

        def lin(i: int, o: int) -> nn.Linear:
            m = nn.Linear(i, o, bias=False)
            with torch.no_grad():
                m.weight.copy_(torch.randn(o, i, generator=g) / math.sqrt(i))
            return m.to(device=device, dtype=dtype)

        self.q, self.k, self.v = lin(h, self.heads * self.hd), lin(h, self.kv_heads * self.hd), lin(h, self.kv_heads * self.hd)
        self.o = lin(self.heads * self.hd, h)
        self.gate = lin(h, inter) if dims.gated_mlp else None  # (a plain MLP: up, activation, down)
        self.up, self.down = lin(h, inter), lin(inter, h)
        self.n1 = nn.RMSNorm(h).to(device=device, dtype=dtype)
        self.n2 = nn.RMSNorm(h).to(device=device, dtype=dtype)
        self.h, self.device, self.dtype, self.g = h, device, dtype, g
        self.backend, self.window = backend, dims.sliding_window

    def input(self, n: int):
        import torch

        return torch.randn(n, self.h, generator=self.g).to(self.device, self.dtype).requires_grad_(True)

    def _attend(self, q, k, v, lengths: Sequence[int] | None):
        import torch

        from ..attention.backends import attend_segment

        if lengths is None:  # stand-in for the linear-only measurement
            rep = self.heads // self.kv_heads
            return q + k.repeat_interleave(rep, dim=0) + v.repeat_interleave(rep, dim=0)
        outs, start = [], 0
        for L in lengths:  # one kernel per document, as the runtime runs it
            sl = slice(start, start + L)
            outs.append(attend_segment(self.backend, q[:, sl], k[:, sl], v[:, sl], 0, L, 0, window=self.window))
            start += L
        return torch.cat(outs, dim=1)

    def layer(self, x, lengths: Sequence[int] | None):
        """Forward of the whole layer on a packed row ``x`` (n, hidden)."""
        import torch.nn.functional as F

        n = x.shape[0]
        y = self.n1(x)
        q = self.q(y).view(n, self.heads, self.hd).transpose(0, 1)
        k = self.k(y).view(n, self.kv_heads, self.hd).transpose(0, 1)
        v = self.v(y).view(n, self.kv_heads, self.hd).transpose(0, 1)
        a = self._attend(q, k, v, lengths).transpose(0, 1).reshape(n, self.heads * self.hd)
        x = x + self.o(a)
        y = self.n2(x)
        if self.gate is None:
            return x + self.down(F.gelu(self.up(y)))
        return x + self.down(F.silu(self.gate(y)) * self.up(y))

    def attention_only(self, segments: Sequence[tuple[int, int, int]]):
        """Leaf q/k/v for segments ``(document length, start, end)`` (queries ``[start, end)``,
        keys from the window's start, or 0, to ``end``), and a closure running their attention
        forward + backward."""
        import torch

        from ..attention.backends import attend_segment

        def mk(h: int, n: int):
            return torch.randn(h, n, self.hd, generator=self.g).to(self.device, self.dtype).requires_grad_(True)

        leaves = []
        for _, ds, de in segments:
            lo = 0 if self.window is None else max(0, ds - self.window + 1)
            leaves.append((ds, de, lo, mk(self.heads, de - ds), mk(self.kv_heads, de - lo), mk(self.kv_heads, de - lo)))

        def run() -> None:
            outs = [attend_segment(self.backend, q, k, v, ds, de, lo, window=self.window)
                    for ds, de, lo, q, k, v in leaves]
            torch.cat(outs, dim=1).float().sum().backward()

        return run


def _resolve_dims(model: Any) -> ModelDims:
    if isinstance(model, ModelDims):
        return model
    if isinstance(model, str):
        if model.lower() not in MODEL_PRESETS:
            raise ValueError(f"calibration model {model!r} is unknown; legal presets: {sorted(MODEL_PRESETS)}")
        return MODEL_PRESETS[model.lower()]
    return ModelDims.from_hf_config(model)


def calibrate(model: Any = "tiny", *, device: str | None = None, quick: bool = False, tp_size: int = 1,
              seed: int = 0, threads: int | None = None, backend: str | None = None,
              progress: Callable[[str], None] | None = None, grid: dict[str, Any] | None = None,
              max_len: int | None = None, budget_s: float | None = None) -> CalibrationResult:
    """Measure the block on ``device`` and fit a :class:`CostModel`.

    Args:
        model: a :data:`~atac_hf.cost.MODEL_PRESETS` key, :class:`ModelDims` or an HF config
            (the layer measured; heads and MLP are divided by ``tp_size``).
        device: ``"cpu"``, ``"cuda"`` or None (CUDA when available).
        quick: a small grid (< 15 s on a laptop CPU with the ``tiny`` model).
        tp_size: tensor-parallel degree the profile is for.
        seed: weights and inputs.
        threads: torch CPU threads (default 1: see module doc; more threads are timed by
            wall clock, which picks up other processes' load).
        backend: the attention backend the profile is for (the ``attention_backend`` the run
            uses): ``sdpa``, ``flash`` or ``varlen_reference``; default ``sdpa``.
        progress: called with short messages (the time estimate, a cap on ``max_len``, each
            round); when given, a tqdm bar on stderr also follows the measurements.
        grid: override the measurement grid (keys ``linear``, ``attention``, ``chunks``,
            ``heldout``, ``heldout_shards``, ``repeats``; see ``_grid``).
        max_len: the longest document the profile must price, e.g. the run's ``max_tokens``.
            The default grid covers documents up to 4K tokens on CPU (32K on CUDA); a longer
            ``max_len`` adds whole documents and chunks of doubling lengths up to it, so the
            fitted prices hold where the run's long documents are (per-pair cost keeps
            falling with length on CPU kernels). Long rows take time: a 16K-token document
            is about 8 s per round on one CPU core, a 64K one about 2 min.
        budget_s: wall-time budget. Two probe measurements price the grid first; when the
            estimate is over the budget, ``max_len`` is halved until it fits (said through
            ``progress``, recorded as :attr:`CalibrationResult.capped_from`; longer documents
            are then extrapolated). ``None`` or ``<= 0``: no budget.

    Returns:
        The :class:`CalibrationResult` (``.save(path)`` writes the profile JSON).

    Raises:
        ValueError: unknown model or backend, ``tp_size`` not dividing the heads, CUDA
            requested but absent.
    """
    import torch

    from ..attention.backends import SEGMENT_BACKENDS

    dims = _resolve_dims(model)
    if tp_size < 1 or dims.num_heads % tp_size:
        raise ValueError(f"tp_size={tp_size} must be >= 1 and divide num_heads={dims.num_heads}")
    if max_len is not None and (not isinstance(max_len, (int, np.integer)) or max_len < 1):
        raise ValueError(f"max_len={max_len!r} must be a positive token count (e.g. the run's max_tokens) or None")
    backend = backend or "sdpa"
    if backend not in SEGMENT_BACKENDS:
        raise ValueError(f"calibration backend {backend!r} is not supported; legal values: {list(SEGMENT_BACKENDS)} "
                         "(flex runs whole layouts in one call: calibrate sdpa for it)")
    cuda_ok = torch.cuda.is_available()
    dev = device or ("cuda" if cuda_ok else "cpu")
    if not isinstance(dev, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", dev):
        raise ValueError(f"device={dev!r} is not supported; legal values: 'cpu', 'cuda', 'cuda:N' (the timings "
                         "and the profile's device label need a real CPU or CUDA device)")
    if dev.startswith("cuda") and not cuda_ok:
        raise ValueError(f"device={dev!r} requested but CUDA is not available (use device='cpu')")
    cuda = dev.startswith("cuda")
    clock = time.perf_counter
    old_threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(int(threads or 1))
        if (threads or 1) == 1:
            clock = time.process_time
    make_grid = lambda ml: dict(_grid(quick, cuda, ml), **(grid or {}))  # noqa: E731
    try:
        return _measure_and_fit(dims, tp_size, dev, cuda, clock, make_grid, max_len, budget_s, seed, backend,
                                progress)
    finally:
        torch.set_num_threads(old_threads)


def _measure_and_fit(dims: ModelDims, tp_size: int, dev: str, cuda: bool, clock: Callable[[], float],
                     make_grid: Callable[[int | None], dict[str, Any]], max_len: int | None, budget_s: float | None,
                     seed: int, backend: str, progress: Callable[[str], None] | None) -> CalibrationResult:
    import torch

    from ..attention.backends import QUERY_BLOCK, prefix_merge_available

    say = progress or (lambda msg: None)
    dtype = torch.bfloat16 if cuda else torch.float32
    tile = 128 if cuda else 1
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t_start = time.perf_counter()
    blk = _Block(dims, tp_size, dev, dtype, seed, backend)
    s_tok, s_pair = probe_rates(blk, cuda, sync)
    got, g, est = fit_to_budget(make_grid, max_len, budget_s, s_tok, s_pair)
    capped_from = max_len if got != max_len else None
    if capped_from is not None:
        say(f"max_len={max_len} would take about {estimate_seconds(make_grid(max_len), s_tok, s_pair) / 60:.0f} min "
            f"here (estimated); measuring documents up to {got or 'the base grid'} instead to stay within the "
            f"budget of {budget_s:g} s (longer documents are extrapolated; raise the budget, or --budget-s none "
            "for none, to measure them)")
    say(f"{sum(len(g.get(k, [])) for k in ('linear', 'attention', 'chunks', 'heldout', 'heldout_shards'))} "
        f"measurements x {g['repeats'] + 1} rounds: estimated {est / 60:.1f} min")

    def whole(lengths: Sequence[int] | None, n: int) -> Callable[[], None]:
        x = blk.input(n)
        return lambda: blk.layer(x, lengths).float().sum().backward()

    docs = lambda lengths: [(int(L), 0, int(L)) for L in lengths]
    segs = lambda rows: [tuple(int(x) for x in r) for r in rows]
    jobs = ([("linear", int(n), whole(None, int(n))) for n in g["linear"]]
            + [("attention", docs(ls), blk.attention_only(docs(ls))) for ls in g["attention"]]
            + [("attention", segs(ch), blk.attention_only(segs(ch))) for ch in g.get("chunks", [])]
            + [("pack", docs(ls), whole(ls, int(sum(ls)))) for ls in g["heldout"]]
            + [("shard", segs(sh), blk.attention_only(segs(sh))) for sh in g.get("heldout_shards", [])])
    weights = [job_seconds(k, key, s_tok, s_pair) for k, key, _ in jobs]
    bar = progress_bar(sum(weights) * (g["repeats"] + 1)) if progress is not None else None
    try:
        times = _interleaved_min_times([fn for _, _, fn in jobs], g["repeats"], sync, clock, seed, say, bar, weights)
    finally:
        if bar is not None:
            bar.close()
    rows = {kind: [(key, t) for (k, key, _), t in zip(jobs, times) if k == kind]
            for kind in ("linear", "attention", "pack", "shard")}
    del jobs

    n_arr = np.array([r[0] for r in rows["linear"]], dtype=np.float64)
    lin_coef = fit_coefficients(np.stack([n_arr, np.ones_like(n_arr)], 1), np.array([r[1] for r in rows["linear"]]))
    # The sdpa backend runs chunks with other kernels than whole documents (on CPU an unmasked
    # prefix kernel merged with a causal one; elsewhere, and under a window, masked blocks of
    # QUERY_BLOCK query rows): fit a separate pair price for them when the grid measured any.
    # Features come from the cost model itself (probes with one unit coefficient), so fit
    # and prediction agree.
    masked_rows = any(s > 0 or (dims.sliding_window or math.inf) < e
                      for segments, _ in rows["attention"] for _, s, e in segments)
    masking = backend == "sdpa" and masked_rows
    # Masked row blocks compute and mask whole rectangles: their own price per pair. The CPU
    # merge runs the same fused kernel as whole documents (one price per pair), and only its
    # extra calls cost more; small chunks' single masked call is folded into the same columns.
    blocks = masking and (dims.sliding_window is not None or not prefix_merge_available(dev))
    base = dict(linear_s_per_token=0.0, attn_s_per_pair=0.0, tile=tile, sliding_window=dims.sliding_window,
                mask_block=QUERY_BLOCK if blocks else 0)
    if not masking:
        columns = [dict(attn_s_per_pair=1.0), dict(segment_overhead_s=1.0)]
    else:
        off = dict(masked_attn_s_per_pair=0.0 if blocks else None, masked_segment_overhead_s=0.0)
        columns = ([dict(off, attn_s_per_pair=1.0)] + ([dict(off, masked_attn_s_per_pair=1.0)] if blocks else [])
                   + [dict(off, segment_overhead_s=1.0), dict(off, masked_segment_overhead_s=1.0)])
    probes = [CostModel(**dict(base, **c)) for c in columns]

    def features(segments) -> list[float]:
        s, e = np.array([x[1] for x in segments]), np.array([x[2] for x in segments])
        return [float((e - s).sum())] + [float(p.attention_cost(s, e).sum()) for p in probes]

    Xa = np.array([features(segments) for segments, _ in rows["attention"]])
    coef = [float(c) for c in fit_coefficients(Xa, np.array([r[1] for r in rows["attention"]]))]
    attn_tok, pair = coef[0], coef[1]
    masked_pair = coef[2] if blocks else None
    overhead = coef[3 if blocks else 2]
    masked_overhead = coef[-1] if masking else None
    kv_bytes = 1.0 * blk.kv_heads * (dims.head_dim + (dims.v_head_dim or dims.head_dim)) * (2 if cuda else 4)
    # attention kernels also cost per query token (softmax statistics, the backward's
    # delta): that part joins the linear coefficient, as the cost model has no other home for it.
    cm = CostModel(linear_s_per_token=float(lin_coef[0]) + attn_tok, attn_s_per_pair=pair,
                   masked_attn_s_per_pair=masked_pair, masked_segment_overhead_s=masked_overhead,
                   mask_block=base["mask_block"],
                   segment_overhead_s=overhead, tile=tile, kv_bytes_per_token=kv_bytes,
                   sliding_window=dims.sliding_window, name=f"calibrated@{_device_name(dev)}/{backend}")
    held = []
    for kind in ("pack", "shard"):
        for segments, meas in rows[kind]:
            s, e = np.array([x[1] for x in segments]), np.array([x[2] for x in segments])
            # a pack is the whole block; a shard is attention only (its per-token part included)
            pred = float(cm.segment_cost(s, e).sum()) if kind == "pack" else \
                float(cm.attention_cost(s, e).sum() + attn_tok * (e - s).sum())
            held.append({"kind": kind, "segments": segments, "measured_s": meas, "predicted_s": pred,
                         "rel_err": (pred - meas) / meas})
    # the layer measured is one under the window; a model whose other layers attend to whole prefixes
    # (dims.sliding_window_layers) is priced as that mixture (the held-out figures are the layer's)
    share = dims.window_share
    if share < 1:
        cm = cm.replace(sliding_window_share=share) if share > 0 else cm.replace(sliding_window=None)
    return CalibrationResult(cost_model=cm, device=_device_name(dev), dims=dims, tp_size=tp_size, backend=backend,
                             linear=rows["linear"], attention=rows["attention"], heldout=held,
                             seconds=time.perf_counter() - t_start, capped_from=capped_from)



def _device_name(dev: str) -> str:
    if dev.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(dev))
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"

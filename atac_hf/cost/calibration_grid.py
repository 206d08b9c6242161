"""The measurement grid of `atac-hf calibrate`, what one round of it costs, and fitting it
to a time budget (numpy only).

A round measures every grid entry once; a calibration runs ``repeats + 1`` rounds (the
first is a warm-up). Attention work grows with the square of document length, so the
longest documents (``max_len``) dominate: on one CPU core a 64K-token document costs
minutes per round. :func:`estimate_seconds` prices a grid from two probe rates (seconds
per linear token, seconds per causal attention pair) measured first; :func:`fit_to_budget`
halves ``max_len`` until the estimate fits a budget, so a CPU calibration ends in bounded
time and says what it left out.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

__all__ = ["estimate_seconds", "fit_to_budget", "grid_work", "job_seconds", "measurement_grid", "probe_rates",
           "progress_bar"]


def measurement_grid(quick: bool, cuda: bool, max_len: int | None = None) -> dict[str, Any]:
    """Measurement grid: whole-document packs (lengths), sets of chunks ``(document length,
    start, end)`` (one big chunk, or many small ones as head-tail splits of short documents
    give) and held-out cases (packs for the whole block, shards of segments for attention).

    ``max_len`` (tokens) extends the grid with documents, chunks and shards of up to that
    length, doubling from the grid's longest document (see :func:`~atac_hf.cost.calibrate.calibrate`)."""
    s = 8 if cuda else 1  # GPUs need far longer rows before times stop being launch-bound
    if quick:
        lin = [256, 512, 1024, 2048]
        attn = [[256], [512], [1024], [1536], [128] * 8, [32] * 32, [512] * 2, [64] * 8]
        chunks = [[(1024, 512, 1024)], [(2048, 1024, 2048)], [(2048, 512, 1536)], [(1536, 1280, 1536)],
                  [(1024, 128, 384)], [(2048, 1920, 2048)], [(64, 32, 64)] * 32, [(256, 64, 192)] * 8]
        held = [[768, 256], [1024, 128, 128, 64], [96] * 12]
        shards = [[(2048, 0, 512), (2048, 1536, 2048), (300, 0, 300)], [(1536, 384, 1152), (200, 0, 200), (90, 0, 90)]]
        repeats = 3
    else:
        lin = [256, 512, 1024, 1536, 2048]
        attn = [[256], [512], [1024], [1536], [2048], [256] * 8, [128] * 16, [64] * 16, [32] * 32, [16] * 64,
                [1024, 512, 256], [768] * 2, [128] * 4, [512] * 4]
        chunks = [[(1024, 512, 1024)], [(2048, 1024, 2048)], [(2048, 512, 1536)], [(1536, 1280, 1536)],
                  [(1024, 128, 384)], [(2048, 1920, 2048)], [(3072, 2048, 3072)], [(3072, 768, 2304)],
                  [(512, 256, 512)], [(2048, 1000, 1100)], [(4096, 3584, 4096)], [(768, 100, 700)],
                  [(64, 32, 64)] * 32, [(32, 8, 24)] * 64, [(256, 64, 192)] * 8, [(128, 96, 128)] * 16,
                  [(512, 128, 384)] * 4]
        held = [[1536, 512], [1024, 256, 128, 128], [96] * 16, [1792], [700, 300, 600, 40] + [20] * 10]
        shards = [[(2048, 0, 512), (2048, 1536, 2048), (300, 0, 300)], [(1536, 384, 1152), (200, 0, 200), (90, 0, 90)],
                  [(3072, 1024, 2048), (1024, 0, 1024)], [(2560, 0, 640), (2560, 1920, 2560)] + [(40, 0, 40)] * 8]
        repeats = 8  # many short rounds: the minimum finds the machine's quiet moments
    scale_seg = lambda seg: tuple(x * s for x in seg)
    g = dict(linear=[n * s for n in lin], attention=[[x * s for x in p] for p in attn],
             chunks=[[scale_seg(c) for c in ch] for ch in chunks], heldout=[[x * s for x in p] for p in held],
             heldout_shards=[[scale_seg(c) for c in sh] for sh in shards], repeats=repeats)
    longest = max(c[0] for ch in g["chunks"] for c in ch)
    lengths = []
    while max_len and longest < max_len:  # long documents: what the run's packs hold
        longest = min(2 * longest, int(max_len))
        lengths.append(longest)
    for L in lengths:  # a whole document, a tail chunk, a middle chunk (head-tail sharding's two kinds)
        g["attention"].append([L])
        g["chunks"] += [[(L, L // 2, L)], [(L, L // 4, 3 * L // 4)]]
    if lengths:  # held out: a rank's head-tail pair of the longest document, with a short whole one
        L = lengths[-1]
        g["heldout_shards"].append([(L, 0, L // 4), (L, 3 * L // 4, L), (L // 8, 0, L // 8)])
    return g


def _pairs(start: int, end: int) -> float:
    """Causal query-key pairs of query rows ``[start, end)`` over keys ``[0, row]``."""
    return float((end * (end + 1) - start * (start + 1)) / 2)


def grid_work(g: dict[str, Any]) -> tuple[float, float]:
    """``(linear tokens, attention pairs)`` that one round of grid ``g`` computes."""
    tokens = float(sum(g["linear"])) + float(sum(sum(p) for p in g["heldout"]))
    pairs = sum(_pairs(0, L) for p in g["attention"] + g["heldout"] for L in p)
    pairs += sum(_pairs(s, e) for ch in g.get("chunks", []) + g.get("heldout_shards", []) for _, s, e in ch)
    return tokens, float(pairs)


def estimate_seconds(g: dict[str, Any], s_per_token: float, s_per_pair: float) -> float:
    """Estimated wall time of a calibration on grid ``g`` (``repeats + 1`` rounds)."""
    tokens, pairs = grid_work(g)
    return (g["repeats"] + 1) * (tokens * s_per_token + pairs * s_per_pair)


def fit_to_budget(make_grid: Callable[[int | None], dict[str, Any]], max_len: int | None, budget_s: float | None,
                  s_per_token: float, s_per_pair: float) -> tuple[int | None, dict[str, Any], float]:
    """The longest ``max_len`` (halving from the requested one) whose grid fits ``budget_s``.

    Returns ``(max_len, grid, estimated seconds)``; ``max_len`` is unchanged when it fits or
    when there is no budget (``None`` or ``<= 0``), and ``None`` when even the base grid is over.
    """
    g = make_grid(max_len)
    est = estimate_seconds(g, s_per_token, s_per_pair)
    if not budget_s or budget_s <= 0 or est <= budget_s or not max_len:
        return max_len, g, est
    base_longest = max(c[0] for ch in make_grid(None)["chunks"] for c in ch)
    cap = int(max_len)
    while cap > base_longest:
        cap = max(cap // 2, base_longest)
        g = make_grid(cap if cap > base_longest else None)
        est = estimate_seconds(g, s_per_token, s_per_pair)
        if est <= budget_s:
            break
    return (cap if cap > base_longest else None), g, est


def job_seconds(kind: str, key: Any, s_per_token: float, s_per_pair: float) -> float:
    """Estimated seconds of one measurement: ``linear`` (``key`` = tokens), ``pack`` (whole block on
    documents ``key`` = ``[(L, 0, L), ...]``), ``attention`` / ``shard`` (segments ``key``)."""
    if kind == "linear":
        return float(key) * s_per_token
    pairs = sum(_pairs(s, e) for _, s, e in key) * s_per_pair
    return pairs + (sum(e - s for _, s, e in key) * s_per_token if kind == "pack" else 0.0)


def probe_rates(block: Any, cuda: bool, sync: Callable[[], None]) -> tuple[float, float]:
    """Wall seconds per linear token and per causal attention pair of ``block`` (the calibration's
    layer), from one timed run each, after a warm-up, of a 1K-token linear pass and a 2K-token
    document (x8 on CUDA). Per-pair cost falls with length on CPU, so longer grids come out
    somewhat over-estimated."""
    s = 8 if cuda else 1
    n, L = 1024 * s, 2048 * s
    x = block.input(n)
    runs: Sequence[Callable[[], None]] = [lambda: block.layer(x, None).float().sum().backward(),
                                          block.attention_only([(L, 0, L)])]
    out = []
    for fn in runs:
        fn()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out[0] / n, out[1] / _pairs(0, L)


def progress_bar(total_s: float):
    """A tqdm bar on stderr counting estimated seconds of work (its ETA is the time left); None where stderr
    is not a terminal."""
    import sys

    from tqdm.auto import tqdm

    # only on a terminal: redrawn into a log file it is one line of thousands of carriage returns; without it
    # (None) calibrate prints the time estimate and each round as lines
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        if not (isatty and isatty()):
            return None
    except (OSError, ValueError):  # a closed or odd stream is no terminal
        return None
    return tqdm(total=total_s, file=sys.stderr, desc="calibrate", unit="s",
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}")

"""The pipeline-level simulator: every packing x sharding combination on the same stream.

One run:

1. The workload's lengths become one shuffled sample stream (seeded) of
   ``num_steps x DP x micro-batches x max_tokens`` tokens; every packing strategy
   reads this same stream through the real
   :class:`~atac_hf.packing.stream.StreamPacker`, one window per optimizer step
   (``DP x micro-batches`` packs). Windows are sized the way each strategy's feeder
   sizes them (``windows="adaptive"``: new samples until the packer's
   ``tokens_wanted`` is met), or cut once for all strategies (``windows="fixed"``:
   identical sample ids per window). At the end every packer is flushed, so every
   combination trains exactly the same samples; the start (deferral queues still
   empty) and the flush (what was held back) are measured, as at an epoch boundary.
2. A window's packs are dealt to DP replicas round-robin (pack ``j`` to replica
   ``j % DP``, how Accelerate deals batches). ``wfap`` packs are first ordered by
   ATAC's feeder rule (:func:`atac_hf.packing.data.window_planner.replica_order`: cost-balanced
   replicas, each replica's packs heaviest first). The baselines keep their packers' order.
3. Every pack is sharded over the CP group with the real planner
   (:func:`~atac_hf.sharding.plan_shards`, per-rank token cap from
   :meth:`ClusterConfig.rank_token_cap`). Its per-layer fwd+bwd time is the plan's
   ``block_time_s`` (slowest rank + exposed K/V exchange); stage ``s`` spends
   ``layers_s x block x phi`` on the forward and ``layers_s x block x (1 - phi)`` on
   the backward, ``phi`` from ``ClusterConfig.fwd_fraction`` or the cost model
   (linear work 1/3 forward, attention 1/3.5).
4. Each replica runs its micro-batches through an explicit 1F1B schedule
   (:func:`~atac_hf.sim.schedule.one_f_one_b`, with activation hops between stages);
   step time = slowest replica + the gradient all-reduce
   (:meth:`ClusterConfig.grad_sync_s`, not overlapped).

**Balance lower bound** (per step, per combination, :func:`balanced_step_time`):
the same step if its work were perfectly balanced: every micro-batch of every
replica carries the step's mean work, split evenly over the CP ranks with no
exposed communication, run through the same 1F1B schedule (so the pipeline's
ramp-up/ramp-down bubble, ``(P - 1) / M`` of the work, is kept), plus the same
gradient all-reduce and activation hops. Work is :func:`work_lower_bound` of the
packs' documents: what no CP split of them undercuts under any prices (the
cheaper of the causal and masked prices, the pairs and calls every split
computes at least), which for a document left whole is its whole-document cost
when masked segments cost what causal ones do. With one pipeline stage every
plan's step time is at least the bound; with several, a plan whose *first and
last* micro-batches are lighter than the rest shrinks the 1F1B ramps and could in
principle beat it (by less than ``(P - 1) / M`` of the work); ratios are reported
as measured.

**Second timing** (:mod:`.onef1b`): every step and its bound are also timed by the
closed-form 1F1B formula instead of the event schedule (same stage times, hops and
all-reduce); each :class:`ComboResult` carries them as ``formula_step_s`` and
``formula_lb_s`` ((S,) arrays, set by :func:`simulate`).

Numpy only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..cost import CostModel
from ..packing.validate import InputTypeError, _is_int, _short, check_lengths, check_seed
from ..sharding import plan_shards
from ..sharding.api import CapExceededError
from ..sharding.segments import _cheapest, _doc_work_lower_bounds, finish_plan
from .cluster import MAX_SIM_PACKS, MAX_SIM_STEPS, MAX_SIM_TOKENS, ClusterConfig
from .feed import PackedStream, cut_windows, pack_cost, packing_metrics, run_packer
from .combos import check_combos
from .results import PACKINGS, SHARDINGS, ComboResult, NoCombinationFitsError, RefusedCombo, SimResult
from .onef1b import onef1b_formula
from .schedule import one_f_one_b
from ..workloads import sample_stream

__all__ = ["simulate", "balanced_step_time", "plan_summaries", "PlanSummary", "work_lower_bound"]


@dataclass(frozen=True)
class PlanSummary:
    """What the simulator keeps of one :class:`~atac_hf.sharding.ShardPlan`."""

    block_s: float
    imbalance: float
    kv_bytes: float
    max_rank_tokens: int
    plan_s: float


def _summary(plan: Any, cm: CostModel, seconds: float, eval_cm: CostModel | None = None) -> PlanSummary:
    if eval_cm is not None and eval_cm is not cm:  # the same segments and exchange, timed by another cost model
        plan = finish_plan(plan.doc_lengths, plan.cp_size, plan.strategy, list(plan.segments), plan.gathered_docs,
                           eval_cm, plan.kv_exchange, route=plan.kv_route_node)
        cm = eval_cm
    return PlanSummary(float(plan.block_time_s), float(plan.imbalance), float(plan.kv_bytes(cm.kv_bytes_per_token)),
                       int(plan.rank_num_tokens().max()), seconds)


def plan_summaries(lengths_per_pack: Sequence[np.ndarray], strategies: Sequence[str], cp_size: int, cm: CostModel,
                   cap: int | None, eval_cm: CostModel | None = None,
                   refused: dict[str, str] | None = None) -> dict[str, list[PlanSummary]]:
    """Plan every pack with every strategy (the real planner), with the planning cost model
    ``cm``; the summaries time the plans with ``eval_cm`` (default ``cm``).

    With ``cp_size == 1`` nothing is sharded: every strategy is the whole pack on one
    rank (its cost model time). ``wlb_adaptive`` is, by definition, the faster of
    ``zigzag`` and ``per_doc`` by
    estimated block time (ties: zigzag); when both are planned anyway it is taken from
    them instead of planning both a second time (planner time: the sum of the two).

    A strategy with a pack over ``cap`` raises the planner's
    :class:`~atac_hf.sharding.api.CapExceededError`; with a ``refused`` dict it is left out
    of the result instead, ``refused[strategy]`` saying which pack and why.
    """
    out: dict[str, list[PlanSummary]] = {}
    ecm = cm if eval_cm is None else eval_cm

    def refuse(s: str, k: int, e: CapExceededError) -> None:
        if refused is None:
            raise e
        refused[s] = f"pack {k + 1} of {len(lengths_per_pack)}: {e}"

    if cp_size == 1:  # no context parallelism: the pack runs whole on one rank, nothing to plan
        big = next((k for k, x in enumerate(lengths_per_pack) if cap is not None and int(x.sum()) > cap), None)
        if big is not None:
            for s in strategies:
                refuse(s, big, CapExceededError(f"{int(lengths_per_pack[big].sum())} tokens on the one rank of "
                                                f"cp_size=1, over max_tokens_per_rank={cap}"))
            return {}
        whole = [PlanSummary(float(ecm.doc_cost(x).sum()), 1.0, 0.0, int(x.sum()), 0.0) for x in lengths_per_pack]
        return {s: whole for s in strategies}
    # wlb_adaptive picks by the planning estimate: derived from zigzag/per_doc only when that is what times them
    derive = ecm is cm and "wlb_adaptive" in strategies and {"zigzag", "per_doc"} <= set(strategies)
    for s in [*(x for x in strategies if not (x == "wlb_adaptive" and derive)), *["wlb_adaptive"] * derive]:
        if s == "wlb_adaptive" and derive and "zigzag" in out and "per_doc" in out:
            out[s] = [PlanSummary(**{**(z if z.block_s <= d.block_s else d).__dict__, "plan_s": z.plan_s + d.plan_s})
                      for z, d in zip(out["zigzag"], out["per_doc"])]
            continue  # (a refused zigzag or per_doc: wlb_adaptive is planned itself, it may still fit)
        rows = []
        for k, lens in enumerate(lengths_per_pack):
            t0 = time.perf_counter()
            try:
                plan = plan_shards(lens, cp_size, s, cm, max_tokens_per_rank=cap)
            except CapExceededError as e:
                refuse(s, k, e)
                break
            seconds = time.perf_counter() - t0
            rows.append(_summary(plan, cm, seconds, ecm))
        else:
            out[s] = rows
    return {s: out[s] for s in strategies if s in out}


def _fwd_fraction(cm: CostModel, lengths: np.ndarray, fixed: float | None) -> float:
    if fixed is not None:
        return fixed
    lin = float(lengths.sum()) * cm.linear_s_per_token
    attn = float(cm.attention_cost(np.zeros_like(lengths), lengths).sum())
    return (lin / 3.0 + attn / 3.5) / (lin + attn) if lin + attn > 0 else 1.0 / 3.0


def _stage_times(cluster: ClusterConfig, block_M: np.ndarray, phi_M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    layers_P = cluster.stage_layers().astype(np.float64)[:, None]
    return layers_P * (block_M * phi_M)[None, :], layers_P * (block_M * (1.0 - phi_M))[None, :]


def work_lower_bound(lengths: Any, cm: CostModel, *, split: bool = True) -> np.ndarray:
    """(D,) per-layer fwd+bwd seconds that no CP plan of documents ``lengths`` undercuts.

    Any plan runs each document as one segment ``[0, L)`` (left whole, or its chunks on one
    rank merged into one kernel call) or, where documents may be split (``split``: CP over
    two ranks or more), as two or more non-empty segments; the bound is the cheaper case:

    * whole: the document's token-wise work, its pairs as ``cm`` counts them for ``[0, L)``
      and one kernel call, each at the cheaper of the causal and masked prices (a whole
      document is masked under a sliding window shorter than it);
    * split: :func:`~atac_hf.sharding.segments._doc_work_lower_bounds` (exact causal pairs,
      windows counted, at the cheaper price, one call) plus a second call and, with tiles
      (``tile = t > 1``), ``(t - 1) / 2`` pairs per row: a tiled kernel computes whole
      ``t x t`` tiles, and a query tile of ``r <= t`` rows ending at key ``e >= r`` computes
      ``t * e`` pairs or more against its at most ``r * e - r * (r - 1) / 2`` causal ones,
      at least ``r * (t - 1) / 2`` more; under a window the band adds ``t - 1`` per row. Mask
      row blocks only add pairs and calls.

    With masked segments priced like causal ones (every preset), the bound is the documents'
    :meth:`~atac_hf.cost.CostModel.doc_cost` without ``split`` (CP 1, where the simulator
    runs every document whole) and with exact pair counts (``tile`` 1); with tiles the split
    case is cheaper by at most about the whole document's partial last query tile
    (``(t - L mod t) x L`` pairs) less one kernel call: within 0.6 % of the whole-document
    cost for the preset models. Numpy only.
    """
    L = np.asarray(lengths, dtype=np.int64)
    price = _cheapest(cm.attn_s_per_pair, cm.masked_attn_s_per_pair)
    call = _cheapest(cm.segment_overhead_s, cm.masked_segment_overhead_s)
    whole = L * cm.linear_s_per_token + cm.attention_pairs(np.zeros_like(L), L) * price + call
    if not split:
        return whole
    cut = _doc_work_lower_bounds(L, cm) + call
    if cm.tile > 1:
        cut = cut + L * ((cm.tile - 1) / 2.0) * price
    return np.minimum(whole, cut)


def balanced_step_time(cluster: ClusterConfig, work_s: float, tokens: int, num_micro_batches: int,
                       phi: float = 1.0 / 3.0, timing: str = "schedule") -> float:
    """The balance lower bound of one step (see module doc).

    Args:
        cluster: the cluster.
        work_s: per-layer fwd+bwd seconds of all the step's packs that no CP split undercuts
            (the sum of :func:`work_lower_bound` of their documents).
        tokens: tokens of the step.
        num_micro_batches: micro-batches per replica.
        phi: forward share of the work.
        timing: ``"schedule"`` (the event schedule) or ``"formula"`` (:func:`~.onef1b.onef1b_formula`).

    Raises:
        InputTypeError: ``cluster`` not a ClusterConfig, or an argument of the wrong type;
        ValueError: ``work_s`` or ``tokens`` not finite and >= 0, ``num_micro_batches`` < 1, ``phi``
            outside [0, 1], an unknown ``timing``.
    """
    if not isinstance(cluster, ClusterConfig):
        raise InputTypeError(f"cluster={_short(cluster)} is not a ClusterConfig (set cluster)")
    for name, v, ok, legal in (("work_s", work_s, lambda x: 0 <= x < np.inf, "a finite number of seconds >= 0"),
                               ("tokens", tokens, lambda x: 0 <= x < np.inf, "a finite token count >= 0"),
                               ("phi", phi, lambda x: 0 <= x <= 1, "a number in [0, 1] (the forward's share)")):
        if not _is_number(v):
            raise InputTypeError(f"{name}={_short(v)} is not a number: {name} must be {legal} (set {name})")
        if not ok(v):
            raise ValueError(f"{name}={_short(v)} is invalid: {name} must be {legal} (set {name})")
    if not _is_int(num_micro_batches):
        raise InputTypeError(f"num_micro_batches={_short(num_micro_batches)} is not an int: num_micro_batches must be "
                             "an int >= 1 (set num_micro_batches)")
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches={int(num_micro_batches)} is invalid: num_micro_batches must be an int "
                         ">= 1 (set num_micro_batches)")
    if timing not in ("schedule", "formula"):
        raise ValueError(f"timing={_short(timing)} is invalid: legal values are 'schedule' and 'formula' (set timing)")
    M = int(num_micro_batches)
    per_mb = work_s / (cluster.dp_size * M * cluster.cp_size)
    f, b = _stage_times(cluster, np.full(M, per_mb), np.full(M, phi))
    hop = cluster.hop_s(np.full(M, tokens / (cluster.dp_size * M * cluster.cp_size)))
    span = onef1b_formula(f, b, hop) if timing == "formula" else one_f_one_b(f, b, hop).makespan
    return span + cluster.grad_sync_s()


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


#: ``packing_options`` keys the cluster sets (``max_tokens``, ``packs_per_window``) or the combination (``strategy``).
RESERVED_PACKING_OPTIONS = ("max_tokens", "packs_per_window", "strategy")


def _check_packing_options(packing_options: Any, cluster: ClusterConfig, packings: Sequence[str]) -> dict[str, Any]:
    """``packing_options`` as a dict of :class:`~atac_hf.packing.PackingConfig` fields other than the
    reserved ones, its values checked by building every packer's config once, before any work."""
    import dataclasses
    from collections.abc import Mapping

    from ..packing import PackingConfig

    if packing_options is None:
        return {}
    if not isinstance(packing_options, Mapping):
        raise InputTypeError(f"packing_options={_short(packing_options)} is not a dict: packing_options must be None "
                             "or a dict of PackingConfig fields (set packing_options)")
    legal = sorted(f.name for f in dataclasses.fields(PackingConfig) if f.init and f.name not in
                   RESERVED_PACKING_OPTIONS)
    reserved = [k for k in packing_options if k in RESERVED_PACKING_OPTIONS]
    if reserved:
        raise ValueError(f"packing_options sets {reserved}, which the simulator sets itself (max_tokens and "
                         "packs_per_window from the cluster, strategy from each combination): set them on the "
                         f"ClusterConfig or in combos instead; legal packing_options keys: {legal}")
    unknown = ", ".join(_short(k) for k in packing_options if k not in legal)
    if unknown:
        raise ValueError(f"packing_options has unknown keys {unknown}: legal keys (PackingConfig fields): {legal}")
    options = dict(packing_options)
    for p in dict.fromkeys(packings):
        PackingConfig(max_tokens=cluster.max_tokens, packs_per_window=cluster.packs_per_step, strategy=p, **options)
    return options


def _check_fragments(arr: np.ndarray, stream: np.ndarray, cluster: ClusterConfig, options: dict[str, Any]) -> None:
    """Refuse a stream sample the packers would split into more fragments than a sample may have,
    naming the settings of a simulation (the packers' own message names PackingConfig fields)."""
    from ..packing.validate import MAX_FRAGMENT_WINDOWS, MAX_FRAGMENTS

    if options.get("overlength", "split") != "split":
        return  # "truncate" cuts it, "error" refuses it with its own message (packing_options: Python only)
    limit = min(MAX_FRAGMENTS, MAX_FRAGMENT_WINDOWS * cluster.packs_per_step)
    most = limit * cluster.max_tokens
    if stream.size == 0 or stream.max() <= most:
        return
    v = int(stream[np.argmax(stream > most)])
    i = int(np.argmax(arr == v))  # the user's position of that length
    need = -(-v // limit)
    raise ValueError(
        f"lengths[{i}] = {v} tokens: split at max_tokens={cluster.max_tokens} that is {-(-v // cluster.max_tokens)} "
        f"fragments, more than the {limit} a sample may have (min({MAX_FRAGMENTS}, {MAX_FRAGMENT_WINDOWS} x dp_size "
        f"{cluster.dp_size} x num_micro_batches {cluster.num_micro_batches})); "
        + (f"raise max_tokens (--max-tokens) to at least {need}, " if need <= MAX_SIM_TOKENS else "")
        + ("raise dp_size x num_micro_batches (--dp, --micro-batches), " if limit < MAX_FRAGMENTS else "")
        + "or drop or shorten that sample in the workload (--workload)")


def simulate(lengths: Any, cluster: ClusterConfig, *, combos: Sequence[tuple[str, str]] | None = None,
             num_steps: int = 16, seed: int = 0, windows: str = "adaptive",
             packing_options: dict[str, Any] | None = None, workload: str = "custom",
             progress: Any = None, eval_cost_model: CostModel | None = None,
             end_of_stream: str = "flush") -> SimResult:
    """Simulate packing x sharding combinations on the same sample stream.

    Args:
        lengths: the workload's sample lengths (a pool; shuffled into a stream by ``seed``).
        cluster: the :class:`ClusterConfig`.
        combos: ``(packing, sharding)`` pairs, combination names (``"ATAC"``) or ``"packing+sharding"``
            labels (``"wfap+atp"``, as ``--combos`` takes them); default: all of :data:`PACKINGS` x
            :data:`SHARDINGS`.
        num_steps: stream length in steps: the stream holds ``num_steps x DP x
            micro-batches x max_tokens`` tokens (a strategy may need more steps, e.g. to
            flush what it held back, or fewer).
        seed: stream shuffle seed (an int in [0, 2**63)).
        windows: ``"adaptive"``: each packer takes windows from the shared stream the way
            its feeder does (until the window's packable supply reaches the packer's
            ``tokens_wanted``; deferral strategies take more samples while they hold some
            back). ``"fixed"``: identical windows (sample ids) for every packer, cut from the
            stream at ``DP x micro-batches x max_tokens`` tokens each.
        packing_options: extra :class:`~atac_hf.packing.PackingConfig` fields for every packer (not
            ``max_tokens``, ``packs_per_window`` or ``strategy``: the cluster and the combinations set those).
        workload: a label for reports.
        progress: an object with ``update(n)`` (a tqdm bar), advanced once per packing strategy.
        eval_cost_model: the cost model that *times* the run (default: the cluster's, which
            also plans it). Packers and sharding planners always plan with the cluster's model;
            with another one here, every time, bound and metric is what those plans cost
            when the true prices differ from the planners' estimate (see :mod:`.robustness`).
        end_of_stream: ``"flush"`` (default): every packer gets the stream's last window like
            any other, then is flushed; ``"last"``: the feeder knows the end and passes
            ``add_window(last=True)`` (nothing held back for windows that will not come).

    Returns:
        The :class:`~atac_hf.sim.results.SimResult`.

    Raises:
        ValueError: bad lengths, counts (``num_steps`` from 1 to :data:`~.cluster.MAX_SIM_STEPS`, at
            most :data:`~.cluster.MAX_SIM_PACKS` packs in all), strategy names or a combination given twice;
            :class:`~atac_hf.sim.results.NoCombinationFitsError` (a ValueError) when every
            combination has a pack over the per-rank token cap. A combination over it while
            others fit is not an error: it is in ``SimResult.refused``, with the reason.
    """
    arr = check_lengths(lengths, "lengths")  # the user's positions in messages (the stream is shuffled)
    if arr.size == 0 or (arr < 1).any():
        where = " is empty" if arr.size == 0 else f"[{int(np.argmin(arr))}] = 0"
        raise ValueError(f"lengths{where}: workload lengths must be a non-empty 1-D array of ints >= 1 (check the "
                         "workload setting)")
    seed = check_seed(seed, "seed")
    if progress is not None and not callable(getattr(progress, "update", None)):
        raise InputTypeError(f"progress={_short(progress)} has no update(n) method: progress must be None or a "
                             "progress bar (e.g. tqdm) (set progress)")
    if (isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer))
            or not 1 <= num_steps <= MAX_SIM_STEPS):
        raise ValueError(f"num_steps={num_steps!r:.80} must be an int from 1 to {MAX_SIM_STEPS}")
    if not isinstance(cluster, ClusterConfig):
        raise TypeError(f"cluster must be a ClusterConfig, got {type(cluster).__name__}")
    if num_steps * cluster.packs_per_step > MAX_SIM_PACKS:
        raise ValueError(f"num_steps x dp_size x num_micro_batches = {num_steps} x {cluster.dp_size} x "
                         f"{cluster.num_micro_batches} packs to simulate, more than {MAX_SIM_PACKS}: lower one of "
                         "them (--steps, --dp, --micro-batches)")
    if windows not in ("adaptive", "fixed"):
        raise ValueError(f"windows={windows!r}: legal values are 'adaptive' and 'fixed'")
    if end_of_stream not in ("flush", "last"):
        raise ValueError(f"end_of_stream={end_of_stream!r}: legal values are 'flush' (the feeder does not know the "
                         "last window) and 'last' (it passes add_window(last=True))")
    combos = check_combos(combos) if combos is not None else [(p, s) for p in PACKINGS for s in SHARDINGS]
    options = _check_packing_options(packing_options, cluster, [p for p, _ in combos])
    cm = cluster.cost_model()
    if eval_cost_model is not None and not isinstance(eval_cost_model, CostModel):
        raise TypeError(f"eval_cost_model must be a CostModel or None, got {type(eval_cost_model).__name__}")
    ecm = cm if eval_cost_model is None else eval_cost_model
    window_tokens = cluster.packs_per_step * cluster.max_tokens
    stream = sample_stream(arr, int(num_steps * window_tokens), seed)
    _check_fragments(arr, stream, cluster, options)
    fixed = cut_windows(stream, window_tokens, num_steps) if windows == "fixed" else None
    by_packing: dict[str, list[str]] = {}
    for p, s in combos:
        by_packing.setdefault(p, []).append(s)
    results: dict[str, ComboResult] = {}
    refused: dict[str, RefusedCombo] = {}
    packed_by: dict[str, PackedStream] = {}
    cap = cluster.rank_token_cap()
    for packing, shardings in by_packing.items():
        packed = packed_by[packing] = run_packer(packing, stream, cluster, cm, options, fixed, end_of_stream)
        lens = [np.array([e - s for _, s, e in p], dtype=np.int64) for win in packed.packs for p in win]
        why: dict[str, str] = {}  # a sharding over the per-rank cap: refused, the other combinations still run
        plans = plan_summaries(lens, shardings, cluster.cp_size, cm, cap, ecm, refused=why)
        pm = packing_metrics(packed, stream, cluster.max_tokens, cluster.packs_per_step, ecm)
        for sharding in shardings:
            if sharding in why:
                r = RefusedCombo(packing, sharding, f"over the per-rank token cap {cap} ({why[sharding]})")
                refused[r.label] = r
                continue
            res = _evaluate(packing, sharding, packed, lens, plans[sharding], cluster, ecm, pm)
            results[res.label] = res
        if progress is not None:
            progress.update(1)
    if not results:
        first = next(iter(refused.values()))
        raise NoCombinationFitsError(
            f"no combination fits the per-rank token cap of {cap} tokens ({cluster.rank_cap_setting()}); "
            f"{len(refused)} of {len(combos)} refused, first {first.label}: {first.reason}", refused)
    order = lambda r: combos.index((r.packing, r.sharding))  # noqa: E731
    results = {r.label: r for r in sorted(results.values(), key=order)}
    sim = SimResult(cluster=cluster, workload=workload, combos=results, num_samples=len(stream), seed=seed,
                    windows={k: [w.tolist() for w in v.windows] for k, v in packed_by.items()},
                    packs={k: v.packs for k, v in packed_by.items()}, stream=stream,
                    refused={r.label: r for r in sorted(refused.values(), key=order)})
    sim.sample_pack = _sample_pack(packed_by, cluster, cm)  # planned (and shown) with the planning model
    return sim


def _evaluate(packing: str, sharding: str, packed: PackedStream, lens: list[np.ndarray], plans: list[PlanSummary],
              cluster: ClusterConfig, cm: CostModel, pm: dict[str, Any]) -> ComboResult:
    D = cluster.dp_size
    sync = cluster.grad_sync_s()
    steps, lbs, toks, mbimb = [], [], [], []
    f_steps, f_lbs = [], []  # the same, timed by the closed-form 1F1B formula
    k = 0
    for packs in packed.packs:
        n = len(packs)
        if n == 0:
            steps.append(sync)
            lbs.append(sync)
            f_steps.append(sync)
            f_lbs.append(sync)
            toks.append(0)
            mbimb.append(1.0)
            continue
        step_lens, step_plans = lens[k:k + n], plans[k:k + n]
        k += n
        block = np.array([p.block_s for p in step_plans])
        phi = np.array([_fwd_fraction(cm, x, cluster.fwd_fraction) for x in step_lens])
        hop_tok = np.array([p.max_rank_tokens for p in step_plans], dtype=np.float64)
        mbimb.append(float(block.max() / block.mean()) if block.mean() > 0 else 1.0)
        worst = f_worst = 0.0
        for r in range(min(D, n)):
            idx = np.arange(r, n, D)
            f, b = _stage_times(cluster, block[idx], phi[idx])
            hop = cluster.hop_s(hop_tok[idx])
            worst = max(worst, one_f_one_b(f, b, hop).makespan)
            f_worst = max(f_worst, onef1b_formula(f, b, hop))
        steps.append(worst + sync)
        f_steps.append(f_worst + sync)
        ntok = int(sum(int(x.sum()) for x in step_lens))
        toks.append(ntok)
        work = float(sum(float(work_lower_bound(x, cm, split=cluster.cp_size > 1).sum()) for x in step_lens))
        M = max(cluster.num_micro_batches, -(-n // D))
        phi_mean = float(np.average(phi, weights=np.maximum(block, 1e-30)))
        lbs.append(balanced_step_time(cluster, work, ntok, M, phi_mean))
        f_lbs.append(balanced_step_time(cluster, work, ntok, M, phi_mean, timing="formula"))
    res = ComboResult(
        packing=packing, sharding=sharding, step_time_s=np.asarray(steps), lb_time_s=np.asarray(lbs),
        tokens=np.asarray(toks, dtype=np.int64), pack_time_s=np.array([p.block_s for p in plans]),
        cp_imbalance=np.array([p.imbalance for p in plans]), kv_bytes=np.array([p.kv_bytes for p in plans]),
        step_mb_imbalance=np.asarray(mbimb), shard_s=np.array([p.plan_s for p in plans]),
        pack_s=packed.pack_s, num_micro_batches=cluster.num_micro_batches, **pm,
    )
    res.formula_step_s = np.asarray(f_steps)  # type: ignore[attr-defined]  (module doc: second timing)
    res.formula_lb_s = np.asarray(f_lbs)  # type: ignore[attr-defined]
    return res


def _sample_pack(packed_by: dict[str, PackedStream], cluster: ClusterConfig, cm: CostModel) -> dict:
    """The most expensive pack of ``sequential`` packing (else the first packer's),
    planned with every sharding strategy: per-rank compute (``rank_s``), K/V bytes each rank
    receives per layer (``kv_bytes``) and the estimated block time (``block_s``)."""
    packed = packed_by.get("sequential") or next(iter(packed_by.values()))
    packs = [p for win in packed.packs for p in win]
    if not packs:
        return {}
    pack = max(packs, key=lambda p: pack_cost(cm, p))
    lens = np.array([e - s for _, s, e in pack], dtype=np.int64)
    cap = cluster.rank_token_cap()
    plans, refused = {}, {}
    for s in SHARDINGS:  # a strategy over the per-rank cap is left out of the sample (and named)
        try:
            plans[s] = plan_shards(lens, cluster.cp_size, s, cm, max_tokens_per_rank=cap)
        except CapExceededError as e:
            refused[s] = str(e)
    return {"lengths": lens.tolist(), "rank_s": {s: p.rank_compute_s.tolist() for s, p in plans.items()},
            "kv_bytes": {s: float(p.kv_bytes(cm.kv_bytes_per_token)) for s, p in plans.items()},
            "block_s": {s: float(p.block_time_s) for s, p in plans.items()}, "refused": refused}

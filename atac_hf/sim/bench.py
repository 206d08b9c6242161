"""The default scenario grid of `atac-hf bench` and its runner (process pool, tqdm).

Numpy only (tqdm for the progress bar).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..cost import CostModel, ModelDims
from ..cost.profile import profile_metadata
from ..packing.validate import _short
from .cluster import ClusterConfig
from .results import NoCombinationFitsError
from .simulate import SimResult, simulate
from ..workloads import load_workload, sample_path, workload_name

__all__ = ["Scenario", "default_grid", "run_grid", "run_robustness_grid", "run_scenario", "wlbllm_path", "PAPER_SCENARIO", "PAPER_SPLIT",
           "FEATURED_SCENARIO"]

PAPER_SCENARIO = "paper-7b-128K"  # the paper's setting (PP 4): a what-if for atac-hf, the comparison with the paper
PAPER_SPLIT = "paper-7b-128K-balance-split"  # side run: WFAP's opt-in balance splits (they cut work)
#: The runnable scenario whose combinations and plots the report shows (2 nodes, FSDP2 x CP 8).
FEATURED_SCENARIO = "8b-128K-cp8-pp1-wlbllm"


def wlbllm_path() -> str:
    """The ``wlbllm`` document-length sample shipped with the package (see :mod:`atac_hf.workloads`)."""
    return sample_path("wlbllm")


@dataclass(frozen=True)
class Scenario:
    """One grid point: a name, a cluster, a workload spec and the stream length in steps.

    ``options``: extra PackingConfig fields; ``combos``: the combinations (None: all);
    ``extra``: a side run reported beside the grid, not part of its summary. Whether the
    atac-hf integration runs it (:meth:`what_if_reasons`) comes from its cluster, never a label.
    """

    name: str
    cluster: dict[str, Any]
    workload: str
    num_steps: int = 16
    options: dict[str, Any] = field(default_factory=dict)
    combos: tuple[tuple[str, str], ...] | None = None
    extra: bool = False

    def config(self, profile: str | None = None) -> ClusterConfig:
        """The cluster; with a calibration ``profile``, the scenario runs the profile's
        model and tp_size (from its metadata) on the profile's compute coefficients."""
        kw = dict(self.cluster)
        if profile:
            meta = _profile_metadata(profile)
            if meta.get("model") is not None:
                kw["model"] = _profile_dims(profile, meta["model"])
            kw["tp_size"] = _profile_tp_size(profile, meta.get("tp_size", 1))
            kw["profile"] = profile
        return ClusterConfig(**kw)

    def what_if_reasons(self, profile: str | None = None) -> tuple[str, ...]:
        """Why the integration cannot run this scenario (:meth:`ClusterConfig.what_if_reasons`); ``()``: runnable."""
        return self.config(profile).what_if_reasons()

    @property
    def runnable(self) -> bool:
        return not self.what_if_reasons()


def _profile_metadata(path: str) -> dict[str, Any]:
    """The profile's ``metadata`` object ({} where it has none; read bounded, as every profile)."""
    CostModel.from_profile(path)  # readable, right format (raises ValueError otherwise)
    return dict(profile_metadata(path))


_FIX_PROFILE = "re-run `atac-hf calibrate` for the model, or give another --profile"


def _profile_dims(path: str, fields: Any) -> ModelDims:
    """The model a profile was measured for (its ``metadata.model``, as ``atac-hf calibrate`` writes it)."""
    names = [f.name for f in dataclasses.fields(ModelDims)]
    required = [f.name for f in dataclasses.fields(ModelDims) if f.default is dataclasses.MISSING]
    if not isinstance(fields, Mapping):
        raise ValueError(f"cost profile {path!r} has metadata.model={_short(fields)}, not an object of ModelDims "
                         f"fields {names}; {_FIX_PROFILE}")
    unknown = sorted(str(k)[:80] for k in fields if k not in names)
    missing = [k for k in required if k not in fields]
    if unknown or missing:
        raise ValueError(f"cost profile {path!r} has metadata.model with " + " and ".join(
            x for x in (f"unknown fields {unknown[:10]}" if unknown else "", f"no {missing}" if missing else "") if x)
            + f"; legal fields: {names} (required: {required}); {_FIX_PROFILE}")
    try:
        return ModelDims(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"cost profile {path!r} has a bad metadata.model: {e}; {_FIX_PROFILE}") from None


def _profile_tp_size(path: str, tp_size: Any) -> int:
    """The tp_size a profile was measured with (its ``metadata.tp_size``): an int >= 1."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"cost profile {path!r} has metadata.tp_size={_short(tp_size)}; legal values: an int >= 1 "
                         f"(the tensor-parallel size it was measured with); {_FIX_PROFILE}")
    return tp_size


def workload_file_missing(path: str) -> bool:
    """Whether ``path``, a ``--workload-file``, names a file that does not exist (a ``dataset:`` spec is
    :func:`~atac_hf.workloads.load_workload`'s to check)."""
    return not path.startswith("dataset:") and not os.path.exists(path)


def default_grid(workload_file: str | None = None) -> list[Scenario]:
    """Model sizes 1B-70B; 32K/64K/128K packs; CP 2/4/8; TP 1/2/8; PP 1 and 4; DP 2-8; the
    built-in workloads, plus the ``wlbllm`` lengths (``workload_file``, default the shipped
    sample, :func:`wlbllm_path`). The first scenario is the paper-like one (PP 4, a what-if);
    the PP 1 scenarios (DP/FSDP2 x CP x TP, one node of 8 GPUs up to 8 nodes) are the ones the
    integration runs.

    Raises:
        ValueError: ``workload_file`` does not exist (nothing falls back silently).
    """
    wl = workload_file or wlbllm_path()
    if workload_file_missing(wl):
        raise ValueError(f"workload file {wl!r} does not exist (check --workload-file; the default is the shipped "
                         "wlbllm sample)")
    real, tag = wl, "wlbllm"

    def c(model, hw, pack_k, cp, pp, dp, mb, tp=1):
        return dict(model=model, hardware=hw, max_tokens=pack_k * 1024, cp_size=cp, pp_size=pp, dp_size=dp,
                    num_micro_batches=mb, tp_size=tp)

    grid = [
        Scenario(PAPER_SCENARIO, c("7b", "A800", 128, 8, 4, 4, 8), real, 12),
        Scenario(f"7b-64K-cp4-pp4-{tag}", c("7b", "A800", 64, 4, 4, 4, 8), real, 12),
        Scenario(f"7b-32K-cp2-pp1-{tag}", c("7b", "A800", 32, 2, 1, 8, 4), real, 12),
        Scenario(f"13b-64K-cp8-pp4-{tag}", c("13b", "A800", 64, 8, 4, 2, 8), real, 16),
        Scenario("8b-128K-cp8-pp1-longtail", c("8b", "H100", 128, 8, 1, 4, 4), "longtail", 16),
        Scenario("8b-64K-cp4-pp4-longtail", c("8b", "H100", 64, 4, 4, 2, 8), "longtail", 16),
        Scenario("8b-32K-cp2-pp4-longtail", c("8b", "H100", 32, 2, 4, 2, 8), "longtail", 16),
        Scenario("70b-128K-cp8-pp4-tp8-longtail", c("70b", "H100", 128, 8, 4, 2, 8, tp=8), "longtail", 16),
        Scenario("1b-32K-cp4-pp1-sft", c("1b", "H100", 32, 4, 1, 4, 4), "sft", 16),
        Scenario("8b-64K-cp2-pp1-uniform", c("8b", "H100", 64, 2, 1, 4, 4), "uniform", 16),
        # layouts the integration runs (FSDP2 / DP x CP x TP, no PP), one node up to several
        Scenario(f"8b-64K-cp4-pp1-{tag}", c("8b", "H100", 64, 4, 1, 2, 4), real, 16),  # 1 node: DP 2 x CP 4
        Scenario(FEATURED_SCENARIO, c("8b", "H100", 128, 8, 1, 2, 4), real, 16),  # 2 nodes: CP 8 in, DP across
        Scenario(f"8b-64K-cp4-pp1-tp2-{tag}", c("8b", "H100", 64, 4, 1, 2, 4, tp=2), real, 16),  # TP2 x CP4 / node
        Scenario(f"8b-128K-cp8-pp1-tp2-{tag}", c("8b", "H100", 128, 8, 1, 2, 4, tp=2), real, 16),  # CP over 2 nodes
        Scenario("13b-64K-cp4-pp1-tp4-longtail", c("13b", "H100", 64, 4, 1, 2, 4, tp=4), "longtail", 16),
        Scenario("70b-128K-cp8-pp1-longtail", c("70b", "H100", 128, 8, 1, 4, 4), "longtail", 16),  # FSDP2 x CP 8
    ]
    # what WFAP's opt-in balance splits (balance_split=True: they cut attention work) would add
    grid.append(Scenario(PAPER_SPLIT, grid[0].cluster, real, grid[0].num_steps, {"balance_split": True},
                         (("sequential", "zigzag"), ("wfap", "atp")), extra=True))
    return grid


@functools.lru_cache(maxsize=8)
def _lengths(spec: str) -> np.ndarray:
    return load_workload(spec, num_samples=200_000, seed=1)


def run_scenario(scenario: Scenario, *, seed: int = 0, profile: str | None = None,
                 combos: Sequence[tuple[str, str]] | None = None) -> SimResult:
    """One scenario; one where no combination fits the per-rank token cap is a result with every
    combination in ``refused`` (a refused cell of the grid, not a failed grid)."""
    t0 = time.perf_counter()
    cluster = scenario.config(profile)
    try:
        res = simulate(_lengths(scenario.workload), cluster, num_steps=scenario.num_steps, seed=seed,
                       combos=combos if combos is not None else scenario.combos,
                       workload=workload_name(scenario.workload), packing_options=scenario.options)
    except NoCombinationFitsError as e:
        res = SimResult(cluster=cluster, workload=workload_name(scenario.workload), combos={}, num_samples=0,
                        seed=seed, refused=e.refused)
    res.name = scenario.name  # type: ignore[attr-defined]
    res.seconds = time.perf_counter() - t0  # type: ignore[attr-defined]
    res.extra = scenario.extra  # type: ignore[attr-defined]
    return res


def _run_one(args: tuple) -> tuple[int, SimResult]:
    i, scenario, seed, profile, combos = args
    return i, run_scenario(scenario, seed=seed, profile=profile, combos=combos)


def _check_scenarios(scenarios: Sequence[Scenario], profile: str | None) -> None:
    for s in scenarios:  # fail fast on user errors, in this process
        s.config(profile)
        _lengths(s.workload)


def _pool_map(fn, jobs: list[tuple], scenarios: Sequence[Scenario], workers: int | None, progress: bool) -> list:
    """``fn(job) -> (i, result)`` over ``jobs`` (the i-th for ``scenarios[i]``), in a fork pool when
    ``workers > 1``, heaviest scenario first; results in grid order."""
    workers = min(len(jobs), workers if workers is not None else (os.cpu_count() or 1))
    out: list[Any] = [None] * len(jobs)
    bar = _bar(len(jobs), progress)
    if workers <= 1:
        for job in jobs:
            i, res = fn(job)
            out[i] = res
            bar.update(1)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        weight = lambda s: -s.num_steps * s.cluster["dp_size"] * s.cluster["num_micro_batches"] * (  # noqa: E731
            1 if s.combos is None else 0.2)
        jobs = sorted(jobs, key=lambda j: weight(scenarios[j[0]]))  # so that the pool's tail is short
        with ctx.Pool(workers) as pool:
            for i, res in pool.imap_unordered(fn, jobs):
                out[i] = res
                bar.update(1)
    bar.close()
    return [r for r in out if r is not None]


def run_grid(scenarios: Sequence[Scenario], *, seed: int = 0, workers: int | None = None, profile: str | None = None,
             combos: Sequence[tuple[str, str]] | None = None, progress: bool = True) -> list[SimResult]:
    """Run every scenario (in a process pool when ``workers > 1``), in grid order.

    Raises:
        ValueError: a scenario with an inconsistent cluster or a bad workload (checked
            up front, before any worker starts).
    """
    _check_scenarios(scenarios, profile)
    jobs = [(i, s, seed, profile, combos) for i, s in enumerate(scenarios)]
    return _pool_map(_run_one, jobs, scenarios, workers, progress)


def _robust_one(args: tuple) -> tuple[int, list[dict[str, Any]]]:
    from .robustness import robustness_rows, run_robustness

    i, scenario, seed, profile, scales, eval_profiles = args
    try:
        runs = run_robustness(_lengths(scenario.workload), scenario.config(profile), scales=scales,
                              profiles=eval_profiles, combos=scenario.combos, num_steps=scenario.num_steps, seed=seed,
                              workload=workload_name(scenario.workload), packing_options=scenario.options)
    except NoCombinationFitsError as e:  # a refused scenario: its rows say so, the grid goes on
        return i, [{"scenario": scenario.name, "eval": "-", "combo": label, "refused": r.reason}
                   for label, r in e.refused.items()]
    return i, [{"scenario": scenario.name, **row} for row in robustness_rows(runs)]


def run_robustness_grid(scenarios: Sequence[Scenario], *, scales: Sequence[float] = (),
                        eval_profiles: Sequence[str] = (), seed: int = 0, workers: int | None = None,
                        profile: str | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Every scenario planned with its own cost model and timed by each evaluation model (its
    model with attention priced ``scales`` x, and each of ``eval_profiles``): the rows of
    :func:`~atac_hf.sim.robustness.robustness_rows`, each with its ``scenario``, in grid order.

    Raises:
        ValueError: as :func:`run_grid`; a scale that is not a finite number > 0; no evaluation model;
            an evaluation profile measured for another model or tp_size than a scenario's.
    """
    from .robustness import scale_attention

    if not scales and not eval_profiles:
        raise ValueError("run_robustness_grid needs an evaluation model: attention scales (--eval-attn-scale) or "
                         "profiles (--eval-profile)")
    _check_scenarios(scenarios, profile)
    for path in eval_profiles:
        CostModel.from_profile(path)  # unreadable: the same error whatever the scenarios
    for s in scenarios:  # bad scales and profiles fail here, before any worker starts
        cluster = s.config(profile)
        cm = cluster.cost_model()
        for k in scales:
            scale_attention(cm, k)
        for path in eval_profiles:  # measured for another model than this scenario's: refused
            cluster.profile_cost_model(path, setting=f"the evaluation profile (--eval-profile; scenario {s.name}, "
                                                     "or set --profile to run every scenario on the profile's model)")
    jobs = [(i, s, seed, profile, tuple(scales), tuple(eval_profiles)) for i, s in enumerate(scenarios)]
    return [row for rows in _pool_map(_robust_one, jobs, scenarios, workers, progress) for row in rows]


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return _NoBar()
    return tqdm(total=total, desc="scenarios", unit="scenario")

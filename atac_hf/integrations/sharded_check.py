"""The exactness probe sharded over the run's own CP ranks (``cp_size > 1``).

:func:`atac_hf.check_model` probes a tiny copy of the model's class in one process (cp_size 1),
where every document of the packed row is contiguous. Under CP a rank holds chunks of a split
document beside other documents, so a model that computes something from its *local* row, such as
RoPE positions from ``arange`` of the row length instead of ``position_ids``, or a token shift or
convolution that restarts at ``position_ids == 0``, is exact at cp_size 1 and wrong at cp_size 2
(red-team 26). :func:`check_model_sharded` runs the same probe with its row sharded over the CP
group, as ``atac-hf check-model`` does at 2 ranks, before training starts.

The probe's tensors are on the CPU, so it runs on a gloo group of the same ranks: the CP group
itself where it is gloo, else a gloo twin of each CP group, made for the probe of each architecture and
destroyed after it (every process of the job takes part in making them, as
``torch.distributed.new_group`` requires). The probe's row has 64 tokens, so it runs on the first
``min(cp_size, 4)`` CP ranks; the others take its verdict.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

__all__ = ["check_model_sharded"]

_VERDICTS: dict[tuple, Any] = {}  # (class, config, cp_size) -> ModelVerdict: one entry per model architecture
PROBE_RANKS = 4  # the probe runs on the first min(cp_size, 4) CP ranks (its row has 64 tokens)


def _gloo_groups(cp_group: Any, k: int, timeout_s: float | None) -> tuple[Any, Any, list[Any]]:
    """Gloo groups of this process's CP group's ranks and of its first ``k`` ranks, and those of them made here
    (for :func:`_free`)."""
    import torch.distributed as dist

    mine = tuple(dist.get_process_group_ranks(cp_group))
    groups: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(groups, mine)  # every process: each CP group's ranks, in one order
    timeout = datetime.timedelta(seconds=float(timeout_s)) if timeout_s is not None else None
    gloo = dist.get_backend(cp_group) == "gloo"  # (the same on every process: one mesh)
    out: tuple[Any, Any] = (None, None)
    made: list[Any] = []
    for ranks in sorted(set(groups)):  # new_group: called by every process, for every group, in one order
        full = (cp_group if ranks == mine else None) if gloo else dist.new_group(list(ranks), backend="gloo",
                                                                                timeout=timeout)
        probe = full if k >= len(ranks) else dist.new_group(list(ranks[:k]), backend="gloo", timeout=timeout)
        made += [g for g in {id(full): full, id(probe): probe}.values() if g is not cp_group and g is not None]
        if ranks == mine:
            out = (full, probe)
    return out[0], out[1], made


def _free(groups: list[Any]) -> None:
    """Destroy the groups :func:`_gloo_groups` made: one left to interpreter exit can abort it there (gloo's
    worker threads; ``_hf_compat`` items 6 and 8), and each probed architecture would add more."""
    import torch.distributed as dist

    from ._hf_compat import drain_gloo_workers

    if groups:
        drain_gloo_workers()  # (the probe's collectives freed first: _hf_compat 8)
    for group in groups:
        dist.destroy_process_group(group)  # (a process outside the group: NON_GROUP_MEMBER, a no-op)


def check_model_sharded(model: torch.nn.Module, cp_rank: int, cp_group: Any, cp_size: int, *,
                        timeout_s: float | None = None, restore: str | None = None) -> None:
    """Refuse ``model`` if its tiny copy, sharded over the CP ranks, differs from per-document runs.

    A collective over ``cp_group`` (every CP rank calls it alike; the verdict is cached per class,
    config and ``cp_size``). Nothing to do at ``cp_size`` 1. Run after :func:`atac_hf.check_model`
    accepted the model. ``restore``: the attention implementation to put back on a refused model
    (the one it had before :func:`~.sharder.prepare_model` selected ``atac_cp``).

    Raises:
        NotImplementedError, ValueError: naming the model class, the measured error and the cp_size.
    """
    if cp_size <= 1 or cp_group is None:
        return
    import torch.distributed as dist

    from ..attention.model_check import ModelVerdict, _cache_key, check_architecture
    from ..attention.model_probe import PROBE_TOLERANCE
    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    key = (*_cache_key(type(base), base.config), cp_size)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        k = min(cp_size, PROBE_RANKS)
        group, probe_group, made = _gloo_groups(cp_group, k, timeout_s)
        try:
            if cp_rank < k:
                verdict = check_architecture(type(base), base.config, rank=cp_rank, world=k, group=probe_group)
            else:  # no part in the probe: the verdict comes with the all-reduce below
                verdict = ModelVerdict(type(base).__name__, str(getattr(base.config, "model_type", "?")), True, "")
            agreed = torch.tensor([1 if verdict.exact else 0])
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=group)  # refused on one rank: refused on all
        finally:
            _free(made)
        if verdict.exact and not agreed.item():
            verdict = ModelVerdict(verdict.model_class, verdict.model_type, False,
                                   "refused on CP rank 0 (see its error)", error=NotImplementedError)
        _VERDICTS[key] = verdict
    if not verdict.exact:
        if restore is not None and base.config._attn_implementation != restore:
            base.set_attn_implementation(restore)  # a refused model is left as it came
        measured = (f"probe max relative error {verdict.max_error:.1e} > {PROBE_TOLERANCE:g}"
                    if verdict.max_error is not None else f"probe refused: {verdict.reason}")
        raise (verdict.error or NotImplementedError)(
            f"{verdict.model_class} (model_type {verdict.model_type!r}) is exact at cp_size=1 but not with its packed "
            f"row sharded over {min(cp_size, PROBE_RANKS)} CP ranks ({measured}): it computes something from each "
            "rank's local row, which holds a split document in chunks beside other documents (e.g. positions from "
            "the row's length instead of position_ids, or a token shift or convolution that restarts where "
            "position_ids is 0). Set cp_size=1 (its packed rows are exact there), or compute positions and token "
            "mixing from position_ids and the attention alone")

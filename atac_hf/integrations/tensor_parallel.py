"""Tensor parallelism (TP) x ATP-CP: the model's own ``tp_plan`` on the TP axis of the accelerator's mesh.

The mesh (Accelerate's order) is ``dp_replicate, dp_shard, cp, tp``: TP innermost (its ranks
are consecutive, on one node: TP all-reduces activations in every layer), CP next. With
``tp_size=T`` and ``cp_size=C`` global rank ``r`` has TP coordinate ``r % T``, CP coordinate
``(r // T) % C`` and DP replica ``r // (T x C)``; Accelerate's prepared DataLoaders give every
rank of a replica the same batch.

What runs where:

* The q/k/v projections are column-sharded by the model's ``tp_plan`` (transformers'
  ``apply_tensor_parallelism``, DTensor): each TP rank computes the local heads ``H / T`` and
  ``K / T``, and the ``atac_cp`` attention runs on them. K/V move only inside the CP group of
  that TP rank (``mesh["cp"]``: the ranks with the same TP and DP coordinates).
* Every TP rank of a CP rank holds the same tokens: the plan is a pure function of the pack,
  and every rank of a replica gets the same pack.
* Gradients: TP ranks compute the same (replicated) loss; DTensor's backward gives each its
  shard's gradient. Accelerate does not wrap a TP model in DDP, so :func:`sync_tp_gradients`
  averages gradients over ``mesh["dp_cp"]`` (the ranks holding the same shard); with each
  rank's loss scaled by ``(world / T) x grad_accum`` (what Trainer does, and
  :meth:`ATACAccelerator.shard`) that mean is the sum of the CP and DP shares: the
  single-device gradient.

* Two fixes around transformers' ``apply_tensor_parallelism`` (see ``_hf_compat`` 5): tied
  weights are re-pointed at one shard, and the per-head norms' gradients
  (``replicated_with_grad_allreduce``) are summed over TP in :func:`sync_tp_gradients`, each
  backward's contribution once (held apart until then: :func:`_hold_partial_grad`), not
  after every micro-batch on the accumulated gradient.
* :func:`full_state_dict` gathers the shards for saving (every rank; tied weights once).

Supported: plain TP x CP x DP (no FSDP). Refused: FSDP2 with ``tp_size > 1``, PEFT under TP, a
model without a layer ``tp_plan``, ``tp_size`` not dividing the heads, a model that
transformers sharded at load time (its mesh spans the whole world).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable

import torch
import torch.distributed as dist

from ._hf_compat import track_group_holder
from .tp_heads import _check_per_head_params, _head_split_of_plan, _layer_heads, _legal_tp_sizes, _resolved_plan
from .tp_heads import _text_config, tp_head_split

__all__ = ["apply_tensor_parallel", "check_not_presharded", "check_tp_model", "check_tp_prepare", "check_tp_refusals",
           "dp_cp_group", "full_state_dict", "remap_optimizer_params", "sync_tp_gradients", "tp_head_split"]


def check_tp_model(model: torch.nn.Module, tp_size: int, *, world_size: int | None = None,
                   cp_size: int = 1) -> dict[str, str]:
    """The model's resolved TP plan for ``tp_size`` (one entry per module or parameter), or a clear refusal.

    Args:
        model: the model (PEFT / DDP wrappers are unwrapped for the checks).
        tp_size: the TP axis size.
        world_size, cp_size: the suggested tp sizes of a refusal are only those that divide
            ``world_size / cp_size`` (``world_size`` None: the default process group's size, if any).

    Raises:
        ValueError: a PEFT-wrapped model, a model that is not a transformers ``PreTrainedModel``,
            one without a ``tp_plan`` (``base_model_tp_plan`` unset), ``tp_size`` not dividing its
            attention heads or key/value heads where the plan splits them (:func:`tp_head_split`),
            or a parameter laid out per head (``(heads, head_dim)``, e.g. Cohere's
            ``use_qk_norm`` norms) that the plan leaves whole while it splits the heads; each names
            the model class, ``tp_size`` and what to do.
    """
    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    name = type(base).__name__
    if base is not model and hasattr(model, "get_base_model"):
        raise ValueError(f"tp_size={tp_size} with a PEFT-wrapped {name}: tensor parallelism under PEFT adapters is "
                         "not supported by atac-hf; set tp_size=1 (parallelism_config) or train without PEFT")
    if hasattr(base, "tp_plan") and not hasattr(base, "_resolve_parallel_plans"):  # transformers < 5.23
        import transformers

        raise ValueError(f"tp_size={tp_size} needs transformers >= 5.23 (its tensor-parallel API; installed "
                         f"{transformers.__version__}): upgrade transformers, or set tp_size=1 (parallelism_config / "
                         "parallelism_config_tp_size) and use cp_size / DP instead")
    if not hasattr(base, "_resolve_parallel_plans") or not hasattr(base, "tp_plan"):
        raise ValueError(f"tp_size={tp_size} needs a transformers PreTrainedModel with a tp_plan; {name} is not one: "
                         "set tp_size=1 (parallelism_config / parallelism_config_tp_size)")
    if not _layer_rules(base):
        raise ValueError(
            f"tp_size={tp_size}: {name} (model_type {getattr(base.config, 'model_type', '?')!r}) has no tensor "
            "parallel plan (config.base_model_tp_plan is empty), so it cannot be split over TP ranks; set tp_size=1 "
            "(parallelism_config / parallelism_config_tp_size) and use cp_size / DP instead, or give the config a "
            "base_model_tp_plan"
        )
    layers = _layer_heads(_text_config(base.config))  # (heads, kv heads) of each layer, or of the config
    plan = _resolved_plan(base, tp_size)
    if _head_split_of_plan(base, plan, tp_size) == 1:  # q/k/v gathered (Olmo2, Phi3): every rank runs all heads
        return plan
    every = math.gcd(*[n for pair in layers for n in pair])  # a tp size must divide every layer's counts
    for heads, kv in layers:
        for field, n in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
            if n and n % tp_size:
                legal = _legal_tp_sizes(every, every, world_size, cp_size)
                raise ValueError(f"tp_size={tp_size} does not divide {name}'s {field}={n} (each TP rank holds whole "
                                 f"heads); set tp_size to one of {legal} (parallelism_config tp_size / "
                                 "parallelism_config_tp_size), or use cp_size / DP instead")
    _check_per_head_params(base, plan, tp_size, *layers[0])
    return plan


def _layer_rules(base: torch.nn.Module) -> dict[str, str]:
    """The model's TP rules other than those for its input/output embeddings (a causal LM class
    has an ``lm_head`` rule of its own even when its decoder has no plan at all)."""
    skip = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(base, get, lambda: None)()
        skip.update(n for n, m in base.named_modules() if module is not None and m is module)
    return {k: v for k, v in (base.tp_plan or {}).items() if k not in skip}


def check_not_presharded(model: torch.nn.Module) -> None:
    """Refuse a model that transformers tensor-parallelised at load time (``from_pretrained(tp_plan=...)`` /
    ``distributed_config``).

    Its mesh is transformers' own, over the whole world (it cannot share the world with CP), and
    Trainer then takes it over (``tp_size`` and ``dp_shard_size`` rewritten, saves and resumes
    handled apart).

    Raises:
        ValueError: naming the model class, its tp size and what to do instead.
    """
    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    tp = getattr(base, "_tp_size", None) or 1
    if getattr(base, "_is_distributed_loading_by_transformers", False) and tp > 1:
        raise ValueError(
            f"{type(base).__name__} was tensor-parallelised at load time by transformers (tp_size={tp}, "
            "from_pretrained(tp_plan=...) / distributed_config): its mesh spans the whole world and cannot carry "
            "CP; load it without tp_plan / distributed_config and set parallelism_config tp_size (or "
            "parallelism_config_tp_size): ATACTrainer / ATACAccelerator apply the model's own tp_plan on the mesh"
        )


def _mesh_ranks(mesh: Any) -> list[int]:
    return [int(r) for r in mesh.mesh.flatten().tolist()]


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: Any) -> torch.nn.Module:
    """Shard ``model`` in place with its own ``tp_plan`` over ``tp_mesh`` (a 1-D DeviceMesh, the "tp" axis).

    Idempotent: a model already sharded on the same ranks is left alone. Before sharding,
    every parameter and buffer is broadcast from global rank 0 (as DDP does at wrap time), so
    every DP/CP replica shards the same weights. Sets ``config.distributed_config`` (tp_size)
    so Accelerate recognises the model as tensor-parallel and ``save_pretrained`` gathers the
    shards. Collective (every rank).

    Raises:
        ValueError: see :func:`check_tp_model`; parameters already DTensors on other ranks (a
            model loaded with ``tp_plan`` on another mesh).
    """
    from torch.distributed.tensor import DTensor
    from transformers.distributed import DistributedConfig

    from .sharder import unwrap_base_model

    tp = int(tp_mesh.size())
    base = unwrap_base_model(model)
    sharded = [p for p in base.parameters() if isinstance(p, DTensor)]
    if sharded:
        want = _mesh_ranks(tp_mesh)
        other = {tuple(_mesh_ranks(p.device_mesh)) for p in sharded} - {tuple(want)}
        if other:
            raise ValueError(
                f"{type(base).__name__} is already sharded (DTensor parameters on ranks {sorted(other)[0]}), not on "
                f"this rank's TP group {want} (tp_size={tp}): build or load the model without tp_plan / "
                "distributed_config and let ATACTrainer / ATACAccelerator apply its tp_plan on the mesh"
            )
        return model
    plan = check_tp_model(model, tp)
    aliases = _tied_aliases(base, plan)  # may refuse: before anything changes the model
    if dist.is_initialized() and dist.get_world_size() > 1:
        with torch.no_grad():
            for t in list(base.parameters()) + list(base.buffers()):
                dist.broadcast(t.data, src=0)
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    # "replicated_with_grad_allreduce" (Qwen3's per-head q_norm/k_norm: each TP rank's gradient
    # covers its own heads) all-reduces .grad in a post-accumulate hook, i.e. after every
    # micro-batch: under gradient accumulation the earlier micro-batches are summed again
    # (tp_size - 1 extra times). Each backward's contribution is held apart instead
    # (_hold_partial_grad) and summed over TP in sync_tp_gradients, exactly once.
    params = dict(base.named_parameters())
    partial = sorted(k for k, v in plan.items() if v == _PARTIAL_GRAD_STYLE and k in params)
    apply_tensor_parallelism(base, tp_mesh, {k: v for k, v in plan.items()
                                             if k not in aliases and v != _PARTIAL_GRAD_STYLE})
    for alias, owner in aliases.items():  # tied weights (lm_head = embed_tokens): point at the one shard
        module_name, _, param_name = alias.rpartition(".")
        setattr(base.get_submodule(module_name), param_name, base.get_parameter(owner))
    base.config.distributed_config = DistributedConfig(tp_size=tp)
    base._atac_tp_partial_grads = tuple(partial)
    _hook_partial_grads([base.get_parameter(n) for n in partial])  # (a frozen one: at the first sync once unfrozen)
    base._atac_tp_group = tp_mesh.get_group()
    track_group_holder(base)  # let the group go before interpreter exit: _hf_compat (6)
    return model


def check_tp_refusals(model: torch.nn.Module, tp_size: int, *, world_size: int | None = None,
                      cp_size: int = 1) -> None:
    """Raise what :func:`apply_tensor_parallel` would refuse for ``model`` at ``tp_size``, before anything changes
    it (ATACTrainer / ATACAccelerator check every model first: a refused operation changes nothing). A model whose
    parameters are DTensors already is left to :func:`apply_tensor_parallel` (it compares their mesh with the TP
    group's)."""
    from torch.distributed.tensor import DTensor

    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    if not any(isinstance(p, DTensor) for p in base.parameters()):
        _tied_aliases(base, check_tp_model(model, tp_size, world_size=world_size, cp_size=cp_size))


def check_tp_prepare(args: tuple, models: list, tp_size: int, *, world_size: int | None = None,
                     cp_size: int = 1) -> None:
    """``ATACAccelerator.prepare``'s TP refusals, raised before anything changes: each model's
    (:func:`check_tp_refusals`), and a module beside the model (a head that runs no attention): Accelerate
    prepares tensor-parallel models only under TP, and would fail on it after the model was sharded."""
    check_optimizers_unstepped([a for a in args if isinstance(a, torch.optim.Optimizer)], models)
    for model in models:
        check_tp_refusals(model, tp_size, world_size=world_size, cp_size=cp_size)
        drop = next((n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0), None)
        if drop is not None:  # a replicated activation must get the same mask on every TP rank
            warnings.warn(f"{type(model).__name__}.{drop} drops out with p > 0 under tp_size={tp_size}: the TP ranks "
                          "of a CP rank must draw the same dropout masks (they compute one hidden state), so seed every "
                          "rank alike (accelerate.utils.set_seed(seed), not device_specific=True) or set the "
                          "dropout to 0", stacklevel=3)
    heads = [a for a in args if isinstance(a, torch.nn.Module) and not any(a is m for m in models)]
    if heads:
        raise ValueError(f"prepare() got {type(heads[0]).__name__} (no attention) beside the model with "
                         f"tp_size={tp_size}: under TP Accelerate prepares tensor-parallel models only (and would "
                         "refuse it after the model was sharded); prepare the model alone "
                         "(model, optimizer = accelerator.prepare(model, optimizer)), or train the head with "
                         "tp_size=1 (parallelism_config) and cp_size / DP")


_PARTIAL_GRAD_STYLE = "replicated_with_grad_allreduce"


def _hold_partial_grad(p: torch.nn.Parameter) -> None:
    """Note each backward's gradient of ``p`` (a parameter whose gradient on a TP rank covers its own
    heads only) in ``p._atac_tp_pending``, summed there until :func:`sync_tp_gradients` replaces that
    local share in ``p.grad`` by its sum over the TP group: whatever number of backwards and syncs a
    step has (gradient accumulation by hand, two models on one accelerator), each contribution is
    summed over TP once.

    Two hooks: before accumulation the contribution is noted, and whether ``p.grad`` starts a new
    accumulation; after it (a backward that accumulates: not ``torch.autograd.grad``, which gets the
    rank's own share as without the hooks) the contribution is added to the held sum. ``p.grad``
    itself accumulates as without the hooks (this rank's share until the sync), so a ``.grad`` zeroed
    since the last backward is seen as zeroed: a backward that finds ``p.grad`` None
    (``zero_grad()``, whose default sets None) or changed and all zeros
    (``zero_grad(set_to_none=False)``) starts a new accumulation: what was held is dropped. One changed
    otherwise (``clip_grad_norm_`` between micro-batches, which multiplies every gradient in place)
    keeps it."""

    def before(grad: torch.Tensor) -> torch.Tensor:
        g = p.grad
        new = g is None or (_grad_mark(g) != getattr(p, "_atac_tp_left", None) and not _local(g).any())
        p._atac_tp_last = (grad.detach().clone(), new)
        return grad

    def after(param: torch.Tensor) -> None:
        grad, new = param._atac_tp_last
        held = None if new else getattr(param, "_atac_tp_pending", None)
        param._atac_tp_pending = grad if held is None else held.add_(grad)
        param._atac_tp_last, param._atac_tp_left = None, _grad_mark(param.grad)

    p.register_hook(before)
    p.register_post_accumulate_grad_hook(after)
    p._atac_tp_hooked = True  # (a copy of the parameter has neither: hooked at its first sync)


def _grad_mark(g: torch.Tensor) -> tuple[int, int]:
    """Which gradient tensor, at which in-place version: how a hook sees that ``.grad`` changed since."""
    return id(g), g._version


def _local(g: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, else ``g``."""
    from torch.distributed.tensor import DTensor

    return g._local_tensor if isinstance(g, DTensor) else g


def _hook_partial_grads(params: list) -> None:
    """:func:`_hold_partial_grad` on each of ``params`` that is trainable and not hooked yet (a hook needs
    ``requires_grad``; hooks and the mark are not copied with a parameter)."""
    for p in params:
        if p.requires_grad and not getattr(p, "_atac_tp_hooked", False):
            _hold_partial_grad(p)


#: Tensor dim a TP style shards a 2-D weight on (tied weights must agree).
_WEIGHT_SHARD_DIM = {"embedding_rowwise": 0, "colwise": 0, "colwise_gather_output": 0, "colwise_rep": 0,
                     "embedding_colwise": 1, "rowwise": 1, "rowwise_rep": 1, "rowwise_split_input": 1}


def _tied_aliases(base: torch.nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """``{alias: owner}`` for parameter names that share one tensor with an earlier name (tied weights).

    transformers' ``apply_tensor_parallelism`` indexes the de-duplicated parameters, so an alias
    in the plan would fail; it is re-pointed at the owner's shard instead.

    Raises:
        ValueError: tied weights whose plan entries shard different dims.
    """
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in base.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    for alias, owner in aliases.items():
        a, o = plan.get(alias), plan.get(owner)
        if a is None and o is None:
            continue
        da, do = _WEIGHT_SHARD_DIM.get(a, -1), _WEIGHT_SHARD_DIM.get(o, -2)
        if da != do:
            raise ValueError(f"tied weights {owner!r} ({o}) and {alias!r} ({a}) are split differently by "
                             f"{type(base).__name__}'s tp_plan; untie them (tie_word_embeddings=False) or set "
                             "tp_size=1")
    return aliases


_STEPPED = ("the optimizer has already stepped: with tp_size > 1 pass it to prepare() (or to the Trainer) before any "
            "optimizer.step(), so its state is built on the sharded parameters")


def check_optimizers_unstepped(optimizers: Iterable[Any], models: Iterable[torch.nn.Module]) -> None:
    """:func:`remap_optimizer_params`' refusal, raised before anything changes (a refused call changes nothing): an
    optimizer whose state holds a parameter of ``models``."""
    params = {id(p) for m in models for p in m.parameters()}
    for opt in optimizers:
        if opt is not None and any(id(p) in params for p in getattr(opt, "optimizer", opt).state):
            raise ValueError(_STEPPED)


def remap_optimizer_params(optimizers: Iterable[Any], old: dict[str, torch.nn.Parameter],
                           new: dict[str, torch.nn.Parameter]) -> None:
    """Point optimizers built before :func:`apply_tensor_parallel` at the sharded parameters (by name).

    Raises:
        ValueError: an optimizer that has already stepped (its state belongs to the full tensors).
    """
    by_id = {id(p): new[n] for n, p in old.items() if n in new and new[n] is not p}
    if not by_id:
        return
    for opt in optimizers:
        inner = getattr(opt, "optimizer", opt)
        if any(id(p) in by_id for p in inner.state):
            raise ValueError(_STEPPED)
        for group in inner.param_groups:
            group["params"] = [by_id.get(id(p), p) for p in group["params"]]


def sync_tp_gradients(model: torch.nn.Module, group: Any) -> None:
    """Finish the gradients of a model sharded by :func:`apply_tensor_parallel`, at each gradient-sync step.

    1. Sum over the TP group the gradients of replicated parameters that see only this rank's
       heads (the ``replicated_with_grad_allreduce`` entries of the plan, e.g. Qwen3's
       ``q_norm``/``k_norm``): the contributions of the backwards since the last sync, noted
       apart (:func:`_hold_partial_grad`), are summed and replace this rank's share in ``.grad``.
    2. Average every gradient over ``group`` (the ranks that hold the same TP shard:
       ``mesh["dp_cp"]``); DTensor gradients on their local shards.

    Bucketed by dtype and device (one all_reduce each). Run it once per optimizer step, on the
    accumulated gradients, or after more backwards (both steps are then still exact: a mean of
    equal values changes nothing, and a contribution is summed once); every rank of the group
    must call it.
    """
    from .sharder import unwrap_base_model

    base = unwrap_base_model(model)
    partial = getattr(base, "_atac_tp_partial_grads", ())
    params = [base.get_parameter(n) for n in partial]
    # (the same on every TP rank: one graph) a parameter without the hook (frozen when the model was sharded, or a
    # copy's) has its gradient in .grad, accumulated since the step began: summed in place, then hooked
    loose = [p for p in params if not getattr(p, "_atac_tp_hooked", False) and p.grad is not None]
    held = [(p, p._atac_tp_pending) for p in params if getattr(p, "_atac_tp_pending", None) is not None]
    if held or loose:
        with torch.no_grad():
            for p, g in held:  # this rank's share out of .grad (None: discarded since its backwards)
                if p.grad is not None:
                    p.grad.sub_(g)
            _all_reduce([g for _, g in held] + [p.grad for p in loose], base._atac_tp_group, average=False)
            for p, g in held:  # ... and its sum over TP in
                if p.grad is not None:
                    p.grad.add_(g)
                p._atac_tp_pending = None
    _hook_partial_grads(params)
    if group is None or dist.get_world_size(group) == 1:
        return
    grads = []
    for p in model.parameters():
        if p.grad is not None:
            grads.append(_local(p.grad))
    _all_reduce(grads, group, average=True)


def _all_reduce(grads: list[torch.Tensor], group: Any, *, average: bool) -> None:
    """SUM (or mean) ``grads`` in place over ``group``, one flat all_reduce per dtype and device."""
    n = dist.get_world_size(group)
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        buckets.setdefault((g.dtype, g.device), []).append(g)
    for bucket in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        if average:
            flat /= n
        offset = 0
        for g in bucket:
            k = g.numel()
            g.copy_(flat[offset:offset + k].view_as(g))
            offset += k


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every DTensor gathered (``full_tensor``); tied entries stay one tensor
    (``save_pretrained`` then drops the alias, as for an unsharded model). Collective (every rank)."""
    from torch.distributed.tensor import DTensor

    from .sharder import unwrap_base_model

    done: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, t in unwrap_base_model(model).state_dict().items():
        if isinstance(t, DTensor):  # state_dict detaches each entry: tied ones share the local storage only
            loc = t._local_tensor
            key = (loc.untyped_storage().data_ptr(), loc.storage_offset(), tuple(loc.shape), tuple(loc.stride()))
            if key not in done:
                done[key] = t.full_tensor()
            t = done[key]
        out[name] = t
    return out


def dp_cp_group(mesh: Any) -> Any:
    """The process group of the ranks holding the same TP shard (``mesh["dp_cp"]``), or None if only TP."""
    if mesh is None:
        return None
    try:
        return mesh["dp_cp"].get_group()
    except (KeyError, RuntimeError, ValueError):
        return None

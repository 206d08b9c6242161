"""Where each parallel group lands on the machines: the rank groups of a mesh, and the placement rules.

Accelerate orders the mesh axes ``dp_replicate, dp_shard, cp, tp`` (the last varies fastest),
and ``torchrun`` / ``accelerate launch`` number the ranks node by node (node ``k`` holds ranks
``k x G ... k x G + G - 1`` for ``G`` processes per node). So, with sizes ``R, S, C, T``::

    rank = ((r x S + s) x C + c) x T + t        (r, s, c, t: the coordinates on each axis)

and a group along an axis is the ranks whose other coordinates agree. The rules (docs/INTEGRATION.md):

1. **TP innermost, inside a node**: TP all-reduces activations twice per layer, forward and
   backward; ``T`` must divide ``G`` or TP traffic crosses nodes.
2. **CP next, inside a node**: every layer the CP group exchanges K/V (all-gather or
   all-to-all, and the reduce-scatter of their gradients in backward); keep ``C x T <= G``
   and dividing ``G``, so one CP group (with its TP peers) sits on one node's NVLink.
3. **DP outside, across nodes**: replicas exchange gradients once per step. With FSDP2, HSDP
   (``dp_replicate`` = nodes, ``dp_shard x cp x tp`` = one node) keeps FSDP's per-layer
   parameter all-gathers inside a node too; only the gradient all-reduce crosses nodes.

:func:`mesh_groups` computes the groups without a process group (tested against torch's
``DeviceMesh``); :func:`placement_warnings` checks rules 1-3 for a node size; :func:`check_tp_layout`
refuses the TP layout the add-on does not run (FSDP with TP).
"""

from __future__ import annotations

from itertools import product
from typing import Any

from ..packing.validate import InputTypeError
from .config_files import check_count

__all__ = ["AXES", "check_tp_layout", "mesh_groups", "placement_warnings", "warn_placement"]

#: Accelerate's mesh order, outermost first.
AXES = ("dp_replicate", "dp_shard", "cp", "tp")


def _sizes(pc: Any) -> dict[str, int]:
    if isinstance(pc, dict):
        unknown = sorted(str(k) for k in pc if k not in AXES)
        if unknown:
            raise ValueError(f"unknown mesh axis key(s) {unknown} in {pc!r}: the legal keys are {list(AXES)} "
                             "(e.g. {'cp': 2, 'tp': 2}; a ParallelismConfig's cp_size is the key 'cp')")
        sizes = {a: pc.get(a, 1) for a in AXES}
    elif all(hasattr(pc, f"{a}_size") for a in AXES):
        sizes = {a: getattr(pc, f"{a}_size") for a in AXES}
    else:
        raise InputTypeError(f"{type(pc).__name__} is not a mesh: pass an accelerate ParallelismConfig (e.g. "
                         f"build_parallelism_config(config, world_size)) or a dict of sizes with keys {list(AXES)}")
    sizes = {a: check_count(v, f"mesh size {a}", "ranks along that axis", low=None) for a, v in sizes.items()}
    bad = {a: v for a, v in sizes.items() if v < 1}
    if bad:
        raise ValueError(f"mesh sizes must be >= 1, got {bad}")
    return sizes


def mesh_groups(pc: Any) -> dict[str, list[list[int]]]:
    """The global ranks of every group of the mesh, in Accelerate's axis order.

    Args:
        pc: a ``ParallelismConfig`` or a dict of sizes ``{"dp_replicate", "dp_shard", "cp", "tp"}``.

    Returns:
        ``{"tp", "cp", "dp_shard", "dp_replicate", "dp", "dp_shard_cp"}`` -> groups (lists of
        ranks, each sorted; groups in order of their first rank). ``dp``: the ranks that get
        different batches and hold the same shard (all DP coordinates, same cp and tp);
        ``dp_shard_cp``: the ranks FSDP shards parameters over (same dp_replicate and tp).
    """
    sizes = _sizes(pc)
    shape = [sizes[a] for a in AXES]

    def rank(coord: tuple[int, ...]) -> int:
        r = 0
        for c, n in zip(coord, shape):
            r = r * n + c
        return r

    def groups(varying: tuple[str, ...]) -> list[list[int]]:
        out: dict[tuple, list[int]] = {}
        for coord in product(*(range(n) for n in shape)):
            key = tuple(c for a, c in zip(AXES, coord) if a not in varying)
            out.setdefault(key, []).append(rank(coord))
        return sorted((sorted(g) for g in out.values()), key=lambda g: g[0])

    return {"tp": groups(("tp",)), "cp": groups(("cp",)), "dp_shard": groups(("dp_shard",)),
            "dp_replicate": groups(("dp_replicate",)), "dp": groups(("dp_replicate", "dp_shard")),
            "dp_shard_cp": groups(("dp_shard", "cp"))}


def placement_warnings(pc: Any, procs_per_node: int, *, fsdp: bool = False) -> list[str]:
    """The placement rules this layout breaks for ``procs_per_node`` processes per node (empty: none).

    Args:
        pc: a ``ParallelismConfig`` or a dict of sizes.
        procs_per_node: processes per node (``LOCAL_WORLD_SIZE``; GPUs per node).
        fsdp: FSDP2 shards the parameters (rule 3 then also checks the shard group).

    Raises:
        ValueError: ``procs_per_node`` < 1; a dict with keys other than :data:`AXES`.
    """
    g = check_count(procs_per_node, "procs_per_node", "processes per node: LOCAL_WORLD_SIZE, GPUs per node", low=None)
    if g < 1:
        raise ValueError(f"procs_per_node must be >= 1, got {procs_per_node!r}")
    sizes = _sizes(pc)
    world = 1
    for a in AXES:
        world *= sizes[a]
    if world <= g:
        return []
    tp, cp = sizes["tp"], sizes["cp"]
    out = []
    if tp > 1 and g % tp:
        out.append(f"tp_size={tp} does not divide the {g} processes per node: TP groups cross nodes and "
                   "all-reduce activations over the inter-node network every layer; keep tp_size a divisor "
                   "of the GPUs per node")
    if cp > 1 and g % (cp * tp):
        out.append(f"cp_size x tp_size = {cp * tp} does not divide the {g} processes per node: CP groups cross "
                   "nodes and exchange K/V over the inter-node network every layer; keep cp_size x tp_size a "
                   "divisor of the GPUs per node and put DP across nodes")
    shard = sizes["dp_shard"] * cp * tp  # consecutive ranks (dp_replicate is outermost): one FSDP shard group
    if fsdp and (shard > g or g % shard):
        where = "more than one node" if shard > g else "not a divisor of one node"
        out.append(f"FSDP shards parameters over dp_shard x cp x tp = {shard} ranks, {where} ({g} processes; "
                   f"dp_replicate={sizes['dp_replicate']}): its per-layer all-gathers cross nodes; use HSDP "
                   "(parallelism_config_dp_replicate_size = nodes, dp_shard x cp x tp = GPUs per node)")
    return out


def warn_placement(pc: Any, *, fsdp: bool = False, environ: Any = None) -> list[str]:
    """On global rank 0, warn (``UserWarning``) about each rule :func:`placement_warnings` finds for this
    launch (``LOCAL_WORLD_SIZE`` processes per node; nothing without it). Returns the messages."""
    import os
    import warnings

    env = os.environ if environ is None else environ
    local = env.get("LOCAL_WORLD_SIZE")
    if not local or not str(local).isdigit() or int(local) < 1:
        return []
    found = placement_warnings(pc, int(local), fsdp=fsdp)
    if str(env.get("RANK", "0")) == "0":
        for msg in found:
            warnings.warn(msg, stacklevel=3)
    return found


def check_tp_layout(pc: Any, *, fsdp: bool) -> None:
    """Refuse the TP layouts the add-on does not run: FSDP with ``tp_size > 1``.

    Raises:
        ValueError: names the sizes and what to change.
    """
    if pc.tp_size > 1 and fsdp:
        raise ValueError(f"tp_size={pc.tp_size} with FSDP: atac-hf runs tensor parallelism with plain data "
                         "parallelism only (the add-on averages gradients over dp x cp); drop the FSDP plugin "
                         "(distributed_type: MULTI_GPU), or set tp_size=1 and shard parameters with FSDP2")

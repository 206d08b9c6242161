"""Multi-node layouts (issue 19): which global ranks form each CP, TP and DP group, and where they land.

Fast: the shipped multi-node and TP launch configs load (accelerate's own schema check) and give
a mesh of the right sizes; :func:`mesh_groups` on the 2 nodes x 8 GPUs layout, by hand; the
placement rules. Slow: 8 gloo processes as "2 nodes x 4" build the meshes with Accelerate's own
code (``ATACAccelerator`` for tp 2 x cp 2 x dp 2; ``ParallelismConfig.build_device_mesh`` for the
scaled-down HSDP layout of ``gpu_2nodes_fsdp2_cp4.yaml``), and every rank reports the ranks of
its CP, TP and DP groups: they must equal :func:`mesh_groups`, and every CP group (with its TP
peers) must be consecutive ranks of one node.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from atac_hf.integrations import ATACConfig
from atac_hf.integrations.accelerate import build_parallelism_config
from atac_hf.integrations.layout import mesh_groups, placement_warnings, warn_placement

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _launch_env(raw: dict) -> dict:
    env = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true"}
    env.update({k.upper(): str(v) for k, v in raw["parallelism_config"].items()})
    return env


@pytest.mark.parametrize("name, sizes", [("gpu_2nodes_fsdp2_cp4.yaml", (2, 2, 4, 1)),
                                         ("gpu_tp2_cp4.yaml", (1, 1, 4, 2)),
                                         ("cpu_tp2_cp2.yaml", (1, 1, 2, 2))])
def test_new_launch_configs_load_and_give_their_mesh(name, sizes):
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    path = CONFIGS / name
    cfg = load_config_from_file(str(path))
    raw = yaml.safe_load(path.read_text())
    env = _launch_env(raw)
    atac = ATACConfig.from_sources(environ=env)
    fsdp = raw["distributed_type"] == "FSDP"
    pc = build_parallelism_config(atac, cfg.num_processes, fsdp=fsdp, environ=env)
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.cp_size, pc.tp_size) == sizes
    assert pc.total_size == cfg.num_processes
    per_node = cfg.num_processes // cfg.num_machines
    assert placement_warnings(pc, per_node, fsdp=fsdp) == [], "the shipped layouts follow the placement rules"
    if fsdp:
        assert raw["fsdp_config"]["fsdp_version"] == 2 and cfg.num_machines == 2 and per_node == 8


def test_two_nodes_of_eight_groups_by_hand():
    g = mesh_groups({"dp_replicate": 2, "dp_shard": 2, "cp": 4, "tp": 1})
    assert g["cp"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert g["dp_shard_cp"] == [list(range(8)), list(range(8, 16))]  # FSDP shards inside a node
    assert g["dp_replicate"] == [[r, r + 8] for r in range(8)]  # replicas across the nodes
    assert g["dp"] == [[c, c + 4, c + 8, c + 12] for c in range(4)]  # DP 4: same CP coordinate
    assert all(len({r // 8 for r in grp}) == 1 for grp in g["cp"] + g["dp_shard_cp"])
    t = mesh_groups({"dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2})
    assert t["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert t["cp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]  # TP ranks apart
    assert t["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_placement_rules_warn_about_groups_that_cross_nodes():
    assert placement_warnings({"cp": 16}, 8) == [placement_warnings({"cp": 16}, 8)[0]]
    (msg,) = placement_warnings({"cp": 16}, 8)
    assert "cp_size x tp_size = 16 does not divide the 8 processes per node: CP groups cross nodes" in msg
    msgs = placement_warnings({"dp_shard": 2, "cp": 3, "tp": 3}, 8)
    assert any("tp_size=3 does not divide the 8 processes per node" in m for m in msgs)
    (msg,) = placement_warnings({"dp_shard": 4, "cp": 4}, 8, fsdp=True)
    assert "FSDP shards parameters over dp_shard x cp x tp = 16 ranks, more than one node" in msg and "HSDP" in msg
    assert placement_warnings({"dp_shard": 4, "cp": 4}, 16, fsdp=True) == []  # one node: nothing crosses
    with pytest.raises(ValueError, match=r"procs_per_node must be >= 1, got 0"):
        placement_warnings({"cp": 2}, 0)
    with pytest.raises(ValueError, match=r"mesh sizes must be >= 1, got \{'cp': 0\}"):
        mesh_groups({"cp": 0})
    with pytest.warns(UserWarning, match=r"CP groups cross nodes"):
        assert warn_placement({"cp": 8}, environ={"LOCAL_WORLD_SIZE": "4", "RANK": "0"})
    assert warn_placement({"cp": 8}, environ={}) == []  # no LOCAL_WORLD_SIZE: nothing known


# ---------------------------------------------------------------------------- 8 processes
NODE = 4  # "2 nodes x 4"
LAYOUTS = {"tp2_cp2_dp2": {"dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2},
           "hsdp_cp2": {"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 1}}  # gpu_2nodes_fsdp2_cp4 scaled


def _entry(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank % NODE), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(NODE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key in [k for k in os.environ if k.startswith(("ATAC_", "PARALLELISM_CONFIG_", "ACCELERATE_"))]:
        del os.environ[key]
    res: dict = {}
    try:
        import torch
        import torch.distributed as dist
        from accelerate.parallelism_config import ParallelismConfig

        from atac_hf.integrations import ATACAccelerator

        torch.set_num_threads(1)

        def ranks(mesh, axis):
            return sorted(dist.get_process_group_ranks(mesh[axis].get_group()))

        s = LAYOUTS["tp2_cp2_dp2"]
        acc = ATACAccelerator(ATACConfig(cp_size=s["cp"]), cpu=True, parallelism_config=ParallelismConfig(
            dp_shard_size=s["dp_shard"], cp_size=s["cp"], tp_size=s["tp"]))
        mesh = acc.torch_device_mesh
        res["tp2_cp2_dp2"] = {"tp": ranks(mesh, "tp"), "cp": ranks(mesh, "cp"), "dp": ranks(mesh, "dp"),
                              "cp_group": sorted(dist.get_process_group_ranks(acc.cp_group)),
                              "cp_rank": acc.cp_rank, "dp_size": acc.dp_size, "names": list(mesh.mesh_dim_names)}
        # plans and batches are compared over the TP group too (every batch; debug: full digests): a TP
        # rank fed another batch (same document lengths) is caught on both ranks of its TP group
        from atac_hf.integrations.sharder import BatchSharder

        tp_rank = int(mesh["tp"].get_local_rank())
        for key, debug in (("tp_debug", True), ("tp_default", False)):
            sharder = BatchSharder(ATACConfig(cp_size=2, debug=debug), cp_rank=acc.cp_rank, cp_group=acc.cp_group,
                                   tp_group=mesh["tp"].get_group())
            ids = torch.arange(40)[None] % 30 + (tp_rank if rank < NODE else 0)  # node 1 fed alike: no error
            pos = torch.cat([torch.arange(30), torch.arange(10)])[None]
            try:
                sharder({"input_ids": ids, "position_ids": pos, "labels": ids.clone()})
                res[key] = "ok"
            except RuntimeError as e:
                res[key] = str(e)
        s = LAYOUTS["hsdp_cp2"]  # Accelerate's own mesh code, sizes from the launch-config path
        env = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2",
               "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2", "PARALLELISM_CONFIG_CP_SIZE": "2"}
        pc = build_parallelism_config(ATACConfig(cp_size=2), world, fsdp=True, environ=env)
        mesh = pc.build_device_mesh("cpu")
        res["hsdp_cp2"] = {"cp": ranks(mesh, "cp"), "dp": ranks(mesh, "dp"), "dp_shard_cp": ranks(mesh, "dp_shard_cp"),
                           "dp_replicate": ranks(mesh, "dp_replicate"), "names": list(mesh.mesh_dim_names)}
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["setup_error"] = _dist.error_text(e)
    _dist.report_and_exit(os.path.join(out_dir, f"{rank}.json"), res)


@pytest.mark.slow
def test_eight_processes_build_the_groups_of_two_nodes():
    import torch.multiprocessing as mp

    import _dist
    from _launch import free_port

    out_dir = tempfile.mkdtemp(prefix="atac_mesh_")
    ctx = mp.spawn(_entry, args=(8, free_port(), out_dir), nprocs=8, join=False)
    assert not _dist.join_or_kill(ctx, 300), "a rank hung"
    res = [json.loads(open(os.path.join(out_dir, f"{r}.json")).read()) for r in range(8)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    for layout, sizes in LAYOUTS.items():
        want = mesh_groups(sizes)
        for rank, r in enumerate(res):
            got = r[layout]
            for axis, groups in got.items():
                if axis in want:
                    (mine,) = [g for g in want[axis] if rank in g]
                    assert groups == mine, (layout, rank, axis, groups, mine)
        for grp in want["cp"]:  # CP groups: evenly spaced by tp, inside one node
            assert len({g // NODE for g in grp}) == 1, (layout, grp)
            assert grp == list(range(grp[0], grp[-1] + 1, sizes["tp"]))
    t = [r["tp2_cp2_dp2"] for r in res]
    assert t[0]["names"] == ["dp_shard", "cp", "tp"]
    assert [x["cp_rank"] for x in t] == [0, 0, 1, 1, 0, 0, 1, 1] and all(x["dp_size"] == 2 for x in t)
    assert all(x["cp_group"] == x["cp"] for x in t), "ATACAccelerator's CP group is the mesh's cp axis"
    assert all(len({g // NODE for g in x["dp"]}) == 2 for x in t), "DP replicas sit on both nodes"
    for rank, r in enumerate(res):
        if rank < NODE:
            assert r["tp_debug"].startswith("the TP ranks hold different batches with the same document "
                                            "lengths"), r
            assert r["tp_default"].startswith("the TP ranks hold different batches with the same document "
                                              "lengths") and "(Checked on every batch.)" in r["tp_default"], r
        else:
            assert r["tp_debug"] == r["tp_default"] == "ok", r
    h = [r["hsdp_cp2"] for r in res]
    assert h[0]["names"] == ["dp_replicate", "dp_shard", "cp"]
    assert all(len({g // NODE for g in x["dp_shard_cp"]}) == 1 for x in h), "FSDP shards inside a node"
    assert all(len({g // NODE for g in x["dp_replicate"]}) == 2 for x in h), "replicas across the nodes"

"""Red-team 52: red-team 44's ``ATACAccelerator`` loop and FSDP2 runs (``tests/_redteam44_fsdp.py``) with red-team
49's families (``tests/_redteam49_worker.py``: tiny fp64 configs, transformers' fp32 steps kept in fp64 on both
sides by ``Fp64Steps``), against the same one-device replays (each document alone).

``python tests/_redteam52_worker.py accel FAMILY WORLD CP GA counted|accumulate`` and
``python tests/_redteam52_worker.py fsdp FAMILY WORLD CP`` print the errors as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
import _redteam44_fsdp as f44  # noqa: E402
import _redteam49_worker as w49  # noqa: E402


def _family(family: str, ga: int = f44.ACC_GA) -> None:
    """Point red-team 44's FSDP/Accelerate harness at ``family`` (in this process)."""
    os.environ["RT49_FAMILY"] = family
    w49.FAMILY, w49.DTYPE = family, torch.float64
    f44.build_model = w49.build_model
    f44.ACC_GA = ga


def _accel_entry(rank, family, ga, world, cp, port, out_dir, counted):
    _family(family, ga)
    with w49.Fp64Steps():
        f44.accel_entry(rank, world, cp, port, out_dir, counted)


def _fsdp_entry(rank, family, world, cp, port, out_dir):
    _family(family)
    with w49.Fp64Steps():
        f44.entry(rank, world, cp, port, out_dir)


def _spawn(fn, world: int, args: tuple, out_dir: str, timeout_s: float) -> list[dict]:
    import torch.multiprocessing as mp

    ctx = mp.spawn(fn, args=args, nprocs=world, join=False)
    hung = _dist.join_or_kill(ctx, timeout_s)
    assert not hung, f"ranks hung: {hung}"
    res = [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    return res


def run_accel(family: str, world: int, cp: int, ga: int, counted: bool, out_dir: str, timeout_s: float = 900):
    """Red-team 44's ``ATACAccelerator`` loop (one epoch of ``packed_dataloader``, GA ``ga``, DDP) and its replay."""
    from _redteam44_worker import rel

    _family(family, ga)
    from _launch import free_port

    res = _spawn(_accel_entry, world, (family, ga, world, cp, free_port(), out_dir, counted), out_dir, timeout_s)
    with w49.Fp64Steps():
        ref = f44.accel_reference(res, counted)
    return {"params": max(rel(res[0]["final"][k], v) for k, v in ref["final"].items()),
            "rank_spread": max(rel(r["final"][k], res[0]["final"][k]) for r in res for k in r["final"]),
            "moved": max(rel(res[0]["final"][k], res[0]["init"][k]) for k in res[0]["init"]),
            "loss": f44.loss_error(res, ref), "steps": ref["steps"], "micro": ref["micro"]}


def run_fsdp(family: str, world: int, cp: int, out_dir: str, timeout_s: float = 900):
    """Red-team 44's FSDP2 run (``fully_shard`` per decoder block and the root over ``dp_shard_cp``) and replay."""
    _family(family)
    from _launch import free_port

    res = _spawn(_fsdp_entry, world, (family, world, cp, free_port(), out_dir), out_dir, timeout_s)
    with w49.Fp64Steps():
        ref = f44.reference(world // cp)
    return res, {"split": res[0]["split"], "mesh": res[0]["shard_mesh_size"],
                 "sharded": all(r["sharded"] for r in res), **f44.errors(res, ref)}


if __name__ == "__main__":
    kind, family, world, cp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    d = tempfile.mkdtemp(prefix=f"rt52_{kind}_")
    if kind == "accel":
        out = run_accel(family, world, cp, int(sys.argv[5]), sys.argv[6] == "counted", d)
    else:
        out = run_fsdp(family, world, cp, d)[1]
    print(json.dumps({"kind": kind, "family": family, "world": world, "cp": cp, **out}))

"""Reliability: the collective timeout is configurable through the integration (issue #6, item 4).

4 gloo processes (DP 2 x CP 2, as ``accelerate launch`` would start them) build an
``ATACAccelerator`` with ``InitProcessGroupKwargs(timeout=)`` and
``ATACConfig(collective_timeout_s=)``:

* the process group honours ``InitProcessGroupKwargs`` (the accelerator used to create it
  before reading the handler: 30 minutes whatever was asked);
* the CP group (a mesh subgroup when DP > 1, which torch creates with its 30-minute default)
  gets ``collective_timeout_s``;
* a CP rank that raises before the K/V gather makes its partner fail with the add-on's clear
  error within that timeout, while the other CP group trains on.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
import _reliability  # noqa: E402
from _launch import free_port  # noqa: E402

pytestmark = pytest.mark.slow

CP_TIMEOUT_S = 2.0
INIT_TIMEOUT_S = 40.0


def _timeout_s(group) -> float:
    """The gloo backend's default timeout of ``group`` (private accessor: tests only)."""
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def _entry(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key in [k for k in os.environ if k.startswith(("ATAC_", "PARALLELISM_CONFIG_", "ACCELERATE_"))]:
        del os.environ[key]
    torch.set_num_threads(1)
    res: dict = {}
    try:
        import torch.distributed as dist
        from accelerate.utils import InitProcessGroupKwargs

        from atac_hf.integrations import ATACAccelerator, ATACConfig

        acc = ATACAccelerator(
            ATACConfig(cp_size=2, min_chunk=4, sharding_strategy="zigzag", collective_timeout_s=CP_TIMEOUT_S), cpu=True,
            kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))])
        res["world_timeout_s"] = _timeout_s(dist.group.WORLD)
        res["cp_timeout_s"] = _timeout_s(acc.cp_group)
        res["cp_rank"], res["dp_size"] = acc.cp_rank, acc.dp_size
        model = _dist.tiny_model("llama", torch.float32)
        model = acc.prepare(model)
        base = acc.unwrap_model(model)  # no DDP collective in the way: only the CP group's K/V gather
        batch = _dist.make_batch([[150, 30, 1, 2, 20, 1, 7]], seed=0)
        faulty = rank == 1  # CP group {0, 1}: rank 1 fails; CP group {2, 3} trains on
        t0 = time.monotonic()
        try:
            # zigzag: every document's K/V gathered; the fault comes after the batch check (a collective
            # every rank of the group runs first), so the K/V all-gather is what the survivor waits on
            local = acc.sharder(batch, num_items_in_batch=100)
            if faulty:
                raise RuntimeError("injected fault")
            base(**local).loss.backward()
            res["completed"] = True
        except RuntimeError as e:
            res["error"] = str(e)
        res["elapsed_s"] = time.monotonic() - t0
        if faulty:
            time.sleep(CP_TIMEOUT_S + 2)  # stay alive: the partner must time out, not see a closed socket
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["setup_error"] = _dist.error_text(e)
    _dist.report_and_exit(os.path.join(out_dir, f"{rank}.json"), res)


def test_collective_timeout_reaches_the_cp_group_and_a_faulty_rank_fails_fast():
    import torch.multiprocessing as mp

    out_dir = tempfile.mkdtemp(prefix="atac_timeout_")
    ctx = mp.spawn(_entry, args=(4, free_port(), out_dir), nprocs=4, join=False)
    assert not _dist.join_or_kill(ctx, 150), "a rank hung"
    res = [json.loads(open(os.path.join(out_dir, f"{r}.json")).read()) for r in range(4)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    assert [r["cp_rank"] for r in res] == [0, 1, 0, 1] and res[0]["dp_size"] == 2
    assert all(r["world_timeout_s"] == INIT_TIMEOUT_S for r in res), "InitProcessGroupKwargs(timeout=) ignored"
    assert all(r["cp_timeout_s"] == CP_TIMEOUT_S for r in res), "collective_timeout_s did not reach the CP group"
    survivor = res[0]
    assert "completed" not in survivor
    assert "atac_cp: the forward K/V all-gather over the CP group failed" in survivor["error"], survivor["error"]
    assert 0.8 * CP_TIMEOUT_S <= survivor["elapsed_s"] <= CP_TIMEOUT_S + 5, survivor
    assert res[2].get("completed") and res[3].get("completed"), "the healthy CP group must train on"
    _reliability.count("faults.injected")
    _reliability.count("faults.survivor_failed_clearly")
    _reliability.flush(__name__)

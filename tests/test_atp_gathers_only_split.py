"""ATP gathers the K/V of the documents it splits over ranks, and of no other.

Until 2026-12-04 ATP listed every anchor it water-filled as gathered, even where the fill had put
the whole anchor on one rank (tile-quantised prices make a split of a short anchor cost more than
keeping it whole). Such a plan moved that document's K/V to every rank with the all-gather, which
no rank reads, and costed it: `[37, 42]` at CP 2 with the default cost model and
``kv_exchange="all_gather"`` received 42 needless tokens on rank 0 and was 13% slower by its own
estimate than the same segments with nothing gathered. (The thirteenth mutation pass left the
mutant ``gathered_docs=None`` "not told apart"; this is that mutant, taken as the fix.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from atac_hf.cost import default_cost_model
from atac_hf.sharding import plan_shards


@pytest.mark.parametrize("exchange", [None, "all_gather", "all_to_all"])
def test_an_anchor_kept_whole_on_one_rank_is_not_gathered(exchange):
    cm = default_cost_model()
    plan = plan_shards(np.array([37, 42]), 2, "atp", cm, kv_exchange=exchange)
    assert [np.asarray(s).tolist() for s in plan.segments] == [[[0, 0, 37]], [[1, 0, 42]]]
    assert plan.gathered_docs.tolist() == []
    assert plan.kv_recv_tokens.tolist() == [0, 0]
    assert plan.comm_s == 0.0
    # the block time is the slower rank's compute: nothing is exchanged
    assert plan.block_time_s == pytest.approx(float(np.max(plan.rank_compute_s)), rel=1e-12)


def test_atp_gathers_exactly_the_documents_held_by_two_or_more_ranks():
    rng = np.random.default_rng(20261204)
    base = default_cost_model()
    models = [base, dataclasses.replace(base, tile=16), dataclasses.replace(base, tile=4),
              dataclasses.replace(base, tile=1)]
    for i in range(240):
        D = int(rng.integers(1, 24))
        C = int(rng.choice([2, 3, 4, 8]))
        L = rng.integers(1, [64, 600, 4096, 20000][i % 4], D).astype(np.int64)
        cap = None if i % 3 else int(np.ceil(L.sum() / C * 1.1))
        exchange = [None, "all_gather", "all_to_all"][i % 3]
        plan = plan_shards(L, C, "atp", models[i % 4], kv_exchange=exchange, max_tokens_per_rank=cap,
                           min_chunk=int(rng.choice([1, 16])))
        # sharded_docs: the documents whose tokens lie on 2+ ranks
        assert plan.gathered_docs.tolist() == plan.sharded_docs.tolist(), (L.tolist(), C, i)

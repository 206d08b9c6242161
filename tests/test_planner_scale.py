"""Red-team 19: ATP planning at CP 128 took seconds to minutes per pack.

* The "fewest anchors that level the ranks" search tried every anchor count where none levels them
  (O(D^2 x C): 1.5-7.7 s for 192-448 equal documents at CP 128); it now tries at most
  ``LEVEL_SEARCH_LIMIT`` more counts (the same plans there: block times 1.64 / 2.46 / 3.28 ms as before).
* The per_doc candidate (every document split over every rank) was costed with the node-routed
  all-to-all, counting O(D x C^2) rows (6.3 s at CP 128, 51 s at CP 256 on 8K tokens per rank); above
  ``PER_DOC_ROUTE_LIMIT`` it is costed with the direct all-to-all (0.28 s / 2.1 s, the same plans).
Counted, not timed: the number of water fills and the layouts whose routed rows are counted.
"""

from __future__ import annotations

import numpy as np

import atac_hf.sharding.atp as atp
import atac_hf.sharding.segments as segments
from atac_hf.cost import default_cost_model
from atac_hf.sharding import plan_shards
from atac_hf.sim import ClusterConfig
from atac_hf.workloads import load_workload


def test_level_search_tries_a_bounded_number_of_anchor_counts(monkeypatch):
    calls = []
    real = atp._water_fill
    monkeypatch.setattr(atp, "_water_fill", lambda *a: calls.append(len(a[1])) or real(*a))
    for D in (192, 320):
        calls.clear()
        plan = plan_shards(np.full(D, 300, np.int64), 128, "atp", default_cost_model())
        plan.validate()
        assert len(calls) <= 12, (D, len(calls))  # was D (every count); LEVEL_SEARCH_LIMIT = 8
        assert int(plan.rank_num_tokens().min()) > 0


def test_per_doc_candidate_is_not_routed_above_the_limit(monkeypatch):
    pool = load_workload("longtail", num_samples=200_000, seed=1)
    rng = np.random.default_rng(0)
    C = 128
    L = np.minimum(pool[rng.integers(0, len(pool), 200_000)], 8192 * C)
    L = L[:int(np.searchsorted(np.cumsum(L), 8192 * C))].astype(np.int64)
    assert int(np.count_nonzero(L >= 2)) * C * C > 1 << 18  # PER_DOC_ROUTE_LIMIT
    cm = ClusterConfig(model="8b", hardware="A800", cp_size=C, gpus_per_node=8, max_tokens=1 << 22).cost_model()
    gathered_per_call = []
    real = segments.routed_pair_counts
    monkeypatch.setattr(segments, "routed_pair_counts",
                        lambda seg, g, *a: gathered_per_call.append(int(np.count_nonzero(g))) or real(seg, g, *a))
    plan = plan_shards(L, C, "atp", cm, min_chunk=128)
    plan.validate()
    assert gathered_per_call and max(gathered_per_call) < len(L) // 2, gathered_per_call  # per_doc gathers all

"""The simulator's feed: forced-split costs follow the packers' own cut, and the packers'
overlength warning (the simulated policy) does not leak out of simulate()."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from atac_hf.cost import default_cost_model
from atac_hf.packing.planners.window import overlength_pieces
from atac_hf.sim import ClusterConfig, simulate
from atac_hf.sim.feed import forced_piece_cost


@pytest.mark.parametrize("cap,min_fragment", [(10, 1), (10, 2), (10, 5), (64, 32), (1000, 128)])
def test_forced_piece_cost_is_the_packers_cut(cap, min_fragment):
    cm = default_cost_model()
    lengths = np.random.default_rng(cap + min_fragment).integers(1, 10 * cap, 400)
    lengths[:3] = [cap, cap + 1, 2 * cap + min_fragment - 1]  # edges: exactly the cap, a 1-token remainder
    expected = sum(float(cm.doc_cost(np.array(overlength_pieces(int(x), cap, min_fragment) if x > cap
                                              else [int(x)])).sum()) for x in lengths)
    assert forced_piece_cost(lengths, cap, min_fragment, cm) == pytest.approx(expected, rel=1e-12)


def test_simulate_does_not_warn_about_the_splits_it_simulates():
    lengths = np.array([50_000, 300, 4000, 20_000] * 30)
    cluster = ClusterConfig(model="1b", max_tokens=16384, cp_size=2, dp_size=2, num_micro_batches=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = simulate(lengths, cluster, num_steps=2, combos=[("wfap", "atp"), ("bfd", "zigzag")])
    assert res.combos["ATAC"].fragmentation > 0  # samples over the cap were split, and counted
    assert res.combos["ATAC"].split_work_saving == pytest.approx(0.0, abs=1e-9)  # default: no balance split

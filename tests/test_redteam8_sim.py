"""Red-team 8, the simulator: every ClusterConfig field checked for type, bool, NaN, inf and
range (a named ValueError, never a bare AttributeError/TypeError/OverflowError or an
out-of-memory run); evaluation profiles (``--eval-profile``, ``run_robustness(profiles=...)``)
checked against the cluster's model and tp_size like ``--profile`` and built with the cluster's
topology and TP all-reduces; the balance lower bound is one under every cost model (masked
kernels cheaper or dearer, windows with tiles)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from atac_hf.cli import main
from atac_hf.cost import HARDWARE_PRESETS, CostModel
from atac_hf.sharding import MAX_CP_SIZE
from atac_hf.sim import ClusterConfig, simulate
from atac_hf.sim import cli as sim_cli
from atac_hf.sim import cluster as cluster_mod
from atac_hf.sim.bench import Scenario, run_robustness_grid
from atac_hf.sim.results import PACKINGS, SHARDINGS
from atac_hf.sim.robustness import run_robustness
from atac_hf.sim.simulate import work_lower_bound

TINY_PROFILE = str(Path(__file__).resolve().parents[1] / "configs" / "cost_cpu_tiny_llama.json")


def _cl(**kw):
    return ClusterConfig(**{"model": "8b", "max_tokens": 8192, "cp_size": 2, **kw})


# ------------------------------------------------------------------ 1. ClusterConfig fields
BAD_FIELDS = [
    # hardware: was AttributeError: 'NoneType' object has no attribute 'upper'
    ("hardware", None, r"ClusterConfig\.hardware=None is unknown; legal values: \['A800', 'H100', 'H200'\] or a "
                       r"HardwarePreset \(set hardware / --hardware"),
    ("hardware", 5, r"ClusterConfig\.hardware=5 is unknown; legal values"),
    ("hardware", b"H100", r"ClusterConfig\.hardware=b'H100' is unknown"),
    ("hardware", "TPU", r"ClusterConfig\.hardware='TPU' is unknown"),
    # numbers: were TypeError '<' not supported, or a bool accepted
    *[("efficiency", v, r"ClusterConfig\.efficiency=.* is invalid: it must be a number in \(0, 1\].*--efficiency")
      for v in ("0.5", True, np.bool_(True), None, float("nan"), float("inf"), 0, 1.5)],
    *[("fwd_fraction", v, r"ClusterConfig\.fwd_fraction=.* is invalid: it must be None or a number in \(0, 1\)")
      for v in ("x", True, float("nan"), float("inf"), 0.0, 1.0)],
    *[("rank_token_slack", v, r"ClusterConfig\.rank_token_slack=.* is invalid: it must be None or a number from 1 "
                              r"to 1048576 \(2\*\*20\) \(set rank_token_slack\)")
      for v in ("2", True, float("inf"), float("nan"), 0.5, 2.0**30)],
    # profile: was TypeError: expected str, bytes or os.PathLike object
    *[("profile", v, r"ClusterConfig\.profile=.* is invalid: it must be None or the path \(a str or os\.PathLike\)")
      for v in (5, b"p.json", 1.5)],
    # sizes: bools, floats, strings and values past the simulator's bounds
    ("max_tokens", 2**40, r"ClusterConfig\.max_tokens=1099511627776 is invalid: it must be an int from 1 to 67108864 "
                          r"\(set max_tokens / --max-tokens\)"),
    ("max_tokens", 2**26 + 1, r"max_tokens=67108865 is invalid: it must be an int from 1 to 67108864"),
    ("max_tokens", 2**200, r"max_tokens=<int of 201 bits> is invalid"),
    ("dp_size", 2**30, r"ClusterConfig\.dp_size=1073741824 is invalid: it must be an int from 1 to 262144 "
                       r"\(set dp_size / --dp\)"),
    ("num_micro_batches", 2**19, r"num_micro_batches=524288 is invalid: .* from 1 to 262144 .*--micro-batches"),
    ("cp_size", 2 * MAX_CP_SIZE, rf"cp_size={2 * MAX_CP_SIZE} is invalid: it must be an int from 1 to {MAX_CP_SIZE}"),
    ("tp_size", 2.0, r"ClusterConfig\.tp_size=2\.0 is invalid: it must be an int >= 1 \(set tp_size / --tp\)"),
    ("pp_size", True, r"ClusterConfig\.pp_size=True is invalid"),
    ("gpus_per_node", 2**40, r"gpus_per_node=1099511627776 is invalid: it must be an int from 1 to 1048576"),
    ("grad_bytes", 2**70, r"grad_bytes=1180591620717411303424 is invalid: it must be an int from 1 to 64"),
    ("act_bytes", True, r"act_bytes=True is invalid"),
    ("num_gpus", True, r"ClusterConfig\.num_gpus=True is invalid: it must be None or an int"),
    ("num_gpus", 2.0, r"ClusterConfig\.num_gpus=2\.0 is invalid"),
    ("num_gpus", 4, r"num_gpus=4 does not match"),
    ("model", 5, r"ClusterConfig\.model=5 is invalid: cannot read model dimensions.*legal: a preset in "
                 r"\['13b', .*set model / --model"),
    ("model", None, r"ClusterConfig\.model=None is invalid"),
]


@pytest.mark.parametrize("field,value,match", BAD_FIELDS, ids=[f"{f}={v!r:.20}" for f, v, _ in BAD_FIELDS])
def test_every_bad_cluster_field_is_a_named_value_error(field, value, match):
    with pytest.raises(ValueError, match=match):
        _cl(**{field: value})


def test_packs_per_step_over_the_bound():
    with pytest.raises(ValueError, match=r"dp_size x num_micro_batches = 1024 x 1024 packs per step, more than 262144: "
                                         r"lower dp_size \(--dp\) or num_micro_batches \(--micro-batches\)"):
        _cl(dp_size=1024, num_micro_batches=1024)


def test_the_bounds_are_the_clis():
    assert sim_cli.MAX_SIM_TOKENS == cluster_mod.MAX_SIM_TOKENS == 2**26
    assert sim_cli.MAX_SIM_PACKS == cluster_mod.MAX_SIM_PACKS and sim_cli.MAX_SIM_STEPS == cluster_mod.MAX_SIM_STEPS
    assert _cl(max_tokens=2**26).max_tokens == 2**26  # the bound itself is legal


def test_an_infinite_slack_no_longer_overflows_later():
    """Was: accepted, then rank_token_cap() and simulate() raised OverflowError."""
    with pytest.raises(ValueError, match="rank_token_slack=inf"):
        ClusterConfig(cp_size=2, rank_token_slack=float("inf"))
    big = _cl(rank_token_slack=2.0**20)  # the largest legal slack gives an int cap the planner takes
    assert big.rank_token_cap() == 8192 // 2 * 2**20


def test_simulate_refuses_absurd_step_counts_before_any_work():
    """Was: max_tokens=2**40 accepted and simulate(num_steps=1) ran out of memory; the step count
    and the packs of a run are bounded as the CLI's --steps / --dp / --micro-batches."""
    lengths = np.array([100, 200])
    with pytest.raises(ValueError, match=r"num_steps=1000000000 must be an int from 1 to 10000"):
        simulate(lengths, _cl(), num_steps=10**9)
    with pytest.raises(ValueError, match=r"num_steps x dp_size x num_micro_batches = 1000 x 512 x 1 packs to "
                                         r"simulate, more than 262144: lower one of them \(--steps, --dp"):
        simulate(lengths, _cl(dp_size=512), num_steps=1000)
    with pytest.raises(TypeError, match="cluster must be a ClusterConfig, got dict"):
        simulate(lengths, {"cp_size": 2}, num_steps=1)


def test_hardware_preset_object_and_path_profile_are_accepted(tmp_path):
    by_name = _cl(hardware="h200")
    by_object = _cl(hardware=HARDWARE_PRESETS["H200"])
    assert by_object.hw is HARDWARE_PRESETS["H200"] and by_name.hw is HARDWARE_PRESETS["H200"]
    assert by_object.cost_model() == by_name.cost_model()
    assert by_object.model_state_bytes_per_gpu() == by_name.model_state_bytes_per_gpu()
    assert by_object.what_if_reasons() == by_name.what_if_reasons()
    assert "on H200" in by_object.describe()
    path = _profile(tmp_path, "tiny")
    cl = ClusterConfig(model="tiny", max_tokens=1024, profile=Path(path))
    assert cl.profile == path and isinstance(cl.profile, str)  # kept as a str: JSON reports, describe
    json.dumps(cl.to_dict())


# ------------------------------------------------------------------ 2. evaluation profiles
def _profile(tmp_path, model, tp=1, name="p.json"):
    dims = ClusterConfig(model=model, max_tokens=64).dims
    cm = CostModel(linear_s_per_token=2e-6, attn_s_per_pair=1e-9, segment_overhead_s=1e-5,
                   kv_bytes_per_token=2.0 * max(1, dims.num_kv_heads // tp) * dims.head_dim * 2,
                   node_size=3, intra_node_bandwidth=7e9, link_bandwidth=5e8)  # a topology the cluster replaces
    path = tmp_path / name
    cm.save(path, model=dataclasses.asdict(dims), tp_size=tp)
    return str(path)


def test_eval_profile_of_another_model_is_refused_like_profile(tmp_path):
    """Was: --profile refused the tiny model's profile for a 70B, --eval-profile took it and timed
    the 70B with the tiny model's K/V bytes and compute."""
    cl = ClusterConfig(model="70b", max_tokens=8192, cp_size=2)
    with pytest.raises(ValueError, match="measured for another model"):
        ClusterConfig(model="70b", max_tokens=8192, cp_size=2, profile=TINY_PROFILE)
    msg = (re.escape(f"cost profile {TINY_PROFILE!r} was measured for another model (h128x4) than the cluster's "
                     "'70b' (hidden_size: profile 128 vs model 8192")
           + r".*calibrate for the cluster's model, change the model \(ClusterConfig\.model / --model\) or the "
             r"evaluation profile \(--eval-profile / run_robustness\(profiles=\.\.\.\)\)")
    with pytest.raises(ValueError, match=msg):
        run_robustness(np.array([100, 2000]), cl, scales=(1.0,), profiles=[TINY_PROFILE], num_steps=1)
    tp2 = _profile(tmp_path, "8b", tp=2)
    with pytest.raises(ValueError, match=r"measured with tp_size=2, the cluster has tp_size=1; .*--eval-profile"):
        run_robustness(np.array([100]), _cl(), scales=(), profiles=[tp2], num_steps=1)
    for bad in (TINY_PROFILE, 0.5):
        with pytest.raises(ValueError, match=r"run_robustness (profiles|scales)=.* must be a list of"):
            run_robustness(np.array([100]), _cl(), scales=(1.0,) if isinstance(bad, str) else bad,
                           profiles=bad if isinstance(bad, str) else (), num_steps=1)


def test_eval_profile_cli_refused_with_one_line(capsys):
    argv = ["simulate", "--workload", "sft", "--model", "70b", "--dp", "1", "--pp", "1", "--cp", "2",
            "--micro-batches", "1", "--max-tokens", "8K", "--steps", "1", "--combos", "ATAC",
            "--eval-profile", TINY_PROFILE]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "measured for another model (h128x4) than the cluster's '70b'" in err
    assert "--eval-profile" in err and TINY_PROFILE in err


def test_bench_grid_refuses_an_eval_profile_of_another_model_before_any_worker(tmp_path):
    c = dict(model="8b", hardware="H100", max_tokens=8192, cp_size=2, pp_size=1, dp_size=1, num_micro_batches=1)
    grid = [Scenario("tiny-8b", c, "sft", 1)]
    with pytest.raises(ValueError, match=r"measured for another model \(h128x4\) than the cluster's '8b'.*"
                                         r"scenario tiny-8b, or set --profile"):
        run_robustness_grid(grid, eval_profiles=[TINY_PROFILE], workers=1, progress=False)


def test_eval_model_keeps_the_clusters_topology_and_tp_allreduces(tmp_path):
    """The evaluation model of a profile is built like the cluster's own profile model: its
    compute, the cluster's CP link, node layout (CP over 2 nodes) and TP all-reduces. With the
    cluster's own profile as the evaluation profile the run is the plain one."""
    path = _profile(tmp_path, "tiny", tp=2)
    cl = ClusterConfig(model="tiny", max_tokens=4096, cp_size=8, tp_size=2, gpus_per_node=8, profile=path)
    own = cl.cost_model()
    assert own.node_size == 4 and own.intra_node_bandwidth == cl.hw.intra_node_bw
    assert own.link_bandwidth == cl.hw.inter_node_bw and own.link_latency_s == cl.hw.link_latency_s
    assert own.linear_s_per_token == pytest.approx(2e-6 + cl.tp_comm_s_per_token()) and cl.tp_comm_s_per_token() > 0
    lengths = np.array([3000, 900, 60, 20, 1500, 4000])
    runs = run_robustness(lengths, cl, scales=(), profiles=[path], num_steps=2, combos=[("wfap", "atp")])
    assert runs[0].eval_model == own
    plain = simulate(lengths, cl, num_steps=2, combos=[("wfap", "atp")])
    np.testing.assert_array_equal(runs[0].result.combos["ATAC"].step_time_s, plain.combos["ATAC"].step_time_s)
    # a CP group inside one node: one link, the profile's own node layout dropped
    one_node = ClusterConfig(model="tiny", max_tokens=4096, cp_size=2, tp_size=2, gpus_per_node=8, profile=path)
    m = one_node.cost_model()
    assert m.node_size is None and m.intra_node_bandwidth is None and m.link_bandwidth == one_node.hw.intra_node_bw


# ------------------------------------------------------------------ 3. the balance lower bound
def test_red_team_repro_step_over_lb_at_least_one():
    """Was: 0.919-0.964 with masked kernels priced at half the causal price."""
    cl = ClusterConfig(cp_size=4, max_tokens=16384, model="8b")
    cm = cl.cost_model()
    ev = cm.replace(masked_attn_s_per_pair=cm.attn_s_per_pair * 0.5)
    r = simulate(np.array([16000, 12000, 9000, 300, 200]), cl, num_steps=2,
                 combos=[("wfap", "atp"), ("sequential", "zigzag")], eval_cost_model=ev)
    for c in r.combos.values():
        assert (c.step_time_s >= c.lb_time_s * (1 - 1e-9)).all(), c.step_time_s / c.lb_time_s


def _eval_models(cm):
    return {
        "preset": cm,
        "masked cheaper": cm.replace(masked_attn_s_per_pair=cm.attn_s_per_pair * 0.4,
                                     masked_segment_overhead_s=cm.segment_overhead_s * 0.2),
        "masked dearer, row blocks": cm.replace(masked_attn_s_per_pair=cm.attn_s_per_pair * 2.5, mask_block=64),
        "window 700, tile 128": cm.replace(sliding_window=700),
        "window 300, tile 96, masked cheaper": cm.replace(sliding_window=300, tile=96,
                                                          masked_attn_s_per_pair=cm.attn_s_per_pair * 0.5),
        "exact pairs, masked calls cheaper": cm.replace(tile=1, masked_segment_overhead_s=0.0),
    }


def test_step_over_lb_is_at_least_one_for_every_combo_and_cost_model():
    """Property: random packs, one pipeline stage (the case the bound covers exactly), several
    evaluation models; every combination's step time is at least its balance bound."""
    rng = np.random.default_rng(8)
    cl = ClusterConfig(cp_size=4, dp_size=2, num_micro_batches=2, max_tokens=8192, model="1b")
    combos = [(p, s) for p in PACKINGS for s in SHARDINGS]
    seen = 0
    for name, ev in _eval_models(cl.cost_model()).items():
        lengths = np.concatenate([rng.integers(1, 200, 40), rng.integers(500, 8192, 12)])
        r = simulate(lengths, cl, num_steps=2, combos=combos, eval_cost_model=ev, seed=int(rng.integers(100)))
        for label, c in r.combos.items():
            ratio = c.step_time_s / c.lb_time_s
            assert (ratio >= 1 - 1e-9).all(), (name, label, ratio)
            assert (c.formula_step_s >= c.formula_lb_s * (1 - 1e-9)).all(), (name, label)
            seen += 1
    assert seen >= 6 * len(PACKINGS)  # nothing refused wholesale: the property was checked


@pytest.mark.parametrize("tile", [1, 2, 3, 64, 100, 128])
def test_work_lower_bound_under_every_split(tile):
    """Unit property: no cut of a document into chunks (costed as the planners cost them) is
    cheaper than its work_lower_bound, under windows, masks and row blocks."""
    rng = np.random.default_rng(tile)
    for window in (None, 5, 300):
        for masked, block in ((None, 0), (0.3e-9, 0), (3e-9, 7)):
            cm = CostModel(linear_s_per_token=1e-7, attn_s_per_pair=1e-9, segment_overhead_s=1e-5, tile=tile,
                           sliding_window=window, masked_attn_s_per_pair=masked, mask_block=block,
                           masked_segment_overhead_s=None if masked is None else 2e-6)
            for _ in range(40):
                L = int(rng.integers(1, 3000))
                k = min(int(rng.integers(1, 6)), L)
                b = np.concatenate([[0], np.sort(rng.choice(np.arange(1, L), k - 1, replace=False)), [L]])
                cost = float(cm.segment_cost(b[:-1], b[1:]).sum())
                assert cost >= float(work_lower_bound([L], cm)[0]) * (1 - 1e-12), (tile, window, masked, L, b)


def test_work_lower_bound_is_tight_for_the_presets():
    """Masked priced as causal (every preset): a document the bound keeps whole is its
    whole-document cost, and no document is more than 0.6 % under it."""
    for model in ("1b", "8b", "70b"):
        cm = ClusterConfig(model=model, max_tokens=2**17, cp_size=8).cost_model()
        L = np.arange(1, 2**17 + 1, 7)
        ratio = work_lower_bound(L, cm) / cm.doc_cost(L)
        assert ratio.max() <= 1 + 1e-12 and ratio.min() > 0.994, (model, ratio.min())
        aligned = np.arange(128, 2**17 + 1, 128)
        np.testing.assert_allclose(work_lower_bound(aligned, cm), cm.doc_cost(aligned), rtol=1e-12)
        assert math.isclose(float(work_lower_bound([100], cm)[0]), float(cm.doc_cost([100])[0]), rel_tol=1e-12)
        # nothing split (CP 1) or exact pair counts: the whole-document cost itself
        np.testing.assert_allclose(work_lower_bound(L, cm, split=False), cm.doc_cost(L), rtol=1e-12)
        exact = cm.replace(tile=1)
        np.testing.assert_allclose(work_lower_bound(L, exact), exact.doc_cost(L), rtol=1e-12)

"""The pipeline-level simulator: consistency, lower bound, identical streams, bad input."""

import json

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.sharding import plan_shards
from atac_hf.sim import ClusterConfig, simulate
from atac_hf.sim.simulate import balanced_step_time, plan_summaries
from atac_hf.workloads import lengths_from_dataset, lengths_from_json, load_workload, sample_stream


def _lengths(seed=0, n=3000):
    rng = np.random.default_rng(seed)
    bulk = np.clip(rng.lognormal(np.log(600), 0.9, n), 16, 8192)
    long = rng.integers(3000, 8192, n)
    return np.where(rng.random(n) < 0.04, long, bulk).astype(np.int64)


def _cluster(**kw):
    base = dict(dp_size=2, pp_size=2, cp_size=4, num_micro_batches=3, max_tokens=8192, model="1b", hardware="H100")
    base.update(kw)
    return ClusterConfig(**base)


@pytest.fixture(scope="module")
def small_run():
    return simulate(_lengths(), _cluster(), num_steps=5, seed=3)


def test_every_combination_and_named_ones(small_run):
    assert len(small_run.combos) == 20
    for label in ("HF default", "WLB-LLM", "ATAC"):
        assert label in small_run.combos
    assert small_run.combos["HF default"].packing == "sequential"
    assert small_run.combos["HF default"].sharding == "zigzag"
    assert small_run.combos["WLB-LLM"].sharding == "wlb_adaptive"
    d = small_run.to_dict()
    json.dumps(d)  # JSON-serialisable
    assert set(d["speedup"]) == {"vs_hf_default", "vs_wlb_llm", "vs_strongest"}


def test_all_combinations_train_the_same_samples(small_run):
    n = small_run.num_samples
    stream = small_run.stream
    tokens = {c.label: int(c.tokens.sum()) for c in small_run.combos.values()}
    assert len(set(tokens.values())) == 1 and tokens["ATAC"] == int(stream.sum())
    for packing, wins in small_run.windows.items():
        fed = [i for w in wins for i in w]
        assert fed == list(range(n)), f"{packing} was not fed the shared stream in order"
        covered = np.zeros(n, dtype=np.int64)
        for step in small_run.packs[packing]:
            for pack in step:
                assert sum(e - s for _, s, e in pack) <= 8192
                for sid, s, e in pack:
                    covered[sid] += e - s
        assert (covered == stream).all(), f"{packing}: some sample lost or repeated"


def test_fixed_windows_are_identical_for_every_packer():
    res = simulate(_lengths(1), _cluster(), num_steps=4, seed=1, windows="fixed",
                   combos=[("sequential", "zigzag"), ("bfd", "zigzag"), ("wlb", "wlb_adaptive"), ("wfap", "atp")])
    wins = list(res.windows.values())
    assert len(wins) == 4 and all(w == wins[0] for w in wins)
    assert len(wins[0]) == 4 and all(len(w) > 1 for w in wins[0])


def test_sharding_strategies_see_identical_packs(small_run):
    # same packing -> same packs -> same tokens per step and same work in the bound
    for packing in ("sequential", "wfap"):
        rows = [c for c in small_run.combos.values() if c.packing == packing]
        assert len(rows) == 5
        for c in rows[1:]:
            assert np.array_equal(c.tokens, rows[0].tokens)
            assert np.allclose(c.lb_time_s, rows[0].lb_time_s)


def test_lower_bound_never_exceeds_any_strategy(small_run):
    checked = 0
    for res in (small_run, simulate(_lengths(2), _cluster(pp_size=4, num_micro_batches=4, dp_size=1), num_steps=4)):
        for c in res.combos.values():
            assert (c.lb_time_s <= c.step_time_s * (1 + 1e-9)).all(), c.label
            assert c.lb_ratio >= 1.0
            checked += 1
    assert checked == 40


def test_deterministic_for_a_seed():
    a = simulate(_lengths(), _cluster(), num_steps=3, seed=5, combos=[("wfap", "atp"), ("sequential", "zigzag")])
    b = simulate(_lengths(), _cluster(), num_steps=3, seed=5, combos=[("wfap", "atp"), ("sequential", "zigzag")])
    c = simulate(_lengths(), _cluster(), num_steps=3, seed=6, combos=[("wfap", "atp"), ("sequential", "zigzag")])

    def strip(d):
        for row in d["combinations"]:
            row.pop("planner_ms_per_step")
        return d

    assert strip(a.to_dict()) == strip(b.to_dict())
    assert a.packs == b.packs
    assert a.packs != c.packs


def test_cp1_pp1_dp1_step_is_the_pack_cost():
    cl = _cluster(dp_size=1, pp_size=1, cp_size=1, num_micro_batches=1)
    cm = cl.cost_model()
    res = simulate(_lengths(), cl, num_steps=3, combos=[("sequential", s) for s in ("zigzag", "atp", "per_doc")])
    for c in res.combos.values():
        steps = res.packs["sequential"]
        assert len(steps) == len(c.step_time_s)
        for step, t in zip(steps, c.step_time_s):
            assert len(step) == 1
            expect = cl.dims.num_layers * cm.pack_cost([e - s for _, s, e in step[0]])
            assert t == pytest.approx(expect, rel=1e-12)
        assert c.lb_ratio == pytest.approx(1.0)


def test_balanced_step_time_formula():
    cl = _cluster(dp_size=2, pp_size=4, cp_size=2, num_micro_batches=8)
    work = 3.0  # per layer, all packs of the step
    per_device = work * cl.dims.num_layers / (cl.dp_size * cl.pp_size * cl.cp_size)
    t = balanced_step_time(cl, work, tokens=0, num_micro_batches=8)
    hops = 2 * (cl.pp_size - 1) * cl.hw.link_latency_s * 8  # a few latency-only hops at most
    expect = per_device * (8 + 4 - 1) / 8 + cl.grad_sync_s()
    assert expect <= t <= expect + hops


def test_wlb_adaptive_derived_equals_planner():
    cm = CostModel.from_model("8b", "H100")
    rng = np.random.default_rng(0)
    packs = [rng.integers(1, 6000, rng.integers(1, 12)) for _ in range(30)]
    derived = plan_summaries(packs, ["zigzag", "per_doc", "wlb_adaptive"], 4, cm, None)["wlb_adaptive"]
    for lens, d in zip(packs, derived):
        plan = plan_shards(lens, 4, "wlb_adaptive", cm)
        assert d.block_s == plan.block_time_s and d.imbalance == plan.imbalance
        assert d.kv_bytes == plan.kv_bytes(cm.kv_bytes_per_token)


def test_wfap_packs_are_dealt_cost_balanced(small_run):
    cm = small_run.cluster.cost_model()
    D = small_run.cluster.dp_size
    spreads = {}
    for packing in ("wfap", "sequential"):
        worst = 0.0
        for step in small_run.packs[packing][:-1]:
            loads = [sum(cm.pack_cost([e - s for _, s, e in p]) for p in step[r::D]) for r in range(D)]
            worst = max(worst, max(loads) / min(loads))
        spreads[packing] = worst
    assert spreads["wfap"] < 1.1 < spreads["sequential"]


def test_atac_wins_on_a_skewed_workload(small_run):
    best_other = max(c.throughput for k, c in small_run.combos.items() if k != "ATAC")
    assert small_run.combos["ATAC"].throughput >= 0.97 * best_other
    assert small_run.speedup("ATAC", "HF default") > 1.05


# ---------------------------------------------------------------------------- bad input
def test_inconsistent_cluster_sizes():
    with pytest.raises(ValueError, match="num_gpus=64 does not match"):
        _cluster(num_gpus=64)
    with pytest.raises(ValueError, match="pp_size=40 exceeds"):
        _cluster(pp_size=40)
    with pytest.raises(ValueError, match="tp_size=3 must divide"):
        _cluster(tp_size=3)
    with pytest.raises(ValueError, match="dp_size=0"):
        _cluster(dp_size=0)
    with pytest.raises(ValueError, match="hardware='TPU'"):
        _cluster(hardware="TPU")
    with pytest.raises(ValueError, match="model='3b'"):
        _cluster(model="3b")


def _profile(tmp_path, model="tiny", tp=1, kv=None):
    dims = ClusterConfig(model=model, max_tokens=64).dims
    cm = CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-9,
                   kv_bytes_per_token=kv if kv is not None else 2.0 * dims.num_kv_heads * dims.head_dim * 4)
    path = tmp_path / "profile.json"
    import dataclasses

    cm.save(path, model=dataclasses.asdict(dims), tp_size=tp)
    return str(path)


def test_profile_matching_and_mismatching_the_model(tmp_path):
    good = _profile(tmp_path)
    cl = ClusterConfig(model="tiny", profile=good, max_tokens=1024)
    assert cl.cost_model().linear_s_per_token == 1e-6
    with pytest.raises(ValueError, match="measured for another model"):
        ClusterConfig(model="7b", profile=good, max_tokens=1024)
    with pytest.raises(ValueError, match="measured with tp_size=2"):
        ClusterConfig(model="tiny", profile=_profile(tmp_path, tp=2), max_tokens=1024)
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        ClusterConfig(model="tiny", profile=_profile(tmp_path, kv=123.0), max_tokens=1024)
    with pytest.raises(ValueError, match="does not exist"):
        ClusterConfig(model="tiny", profile=str(tmp_path / "missing.json"), max_tokens=1024)


def test_bad_workload_files(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ValueError, match="non-empty JSON array"):
        lengths_from_json(empty)
    broken = tmp_path / "broken.json"
    broken.write_text("[1, 2,")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_workload(str(broken))
    bad = tmp_path / "bad.json"
    bad.write_text("[10, -3, 4]")
    with pytest.raises(ValueError, match="entry 1 is -3"):
        load_workload(str(bad))
    obj = tmp_path / "obj.json"
    obj.write_text('{"lengths": [1, 2]}')
    with pytest.raises(ValueError, match="must hold a JSON array"):
        load_workload(str(obj))
    with pytest.raises(ValueError, match="unknown workload 'zipf'"):
        load_workload("zipf")
    with pytest.raises(ValueError, match="does not exist"):
        load_workload(str(tmp_path / "nope.json"))


def test_json_and_dataset_workloads(tmp_path):
    path = tmp_path / "lens.json"
    path.write_text(json.dumps([5, 7, 9]))
    assert load_workload(str(path)).tolist() == [5, 7, 9]

    class FakeDataset:  # the two things lengths_from_dataset uses
        column_names = ["input_ids", "length"]

        def __getitem__(self, key):
            return {"input_ids": [[1, 2, 3], [4]], "length": [3, 1]}[key]

    assert lengths_from_dataset(FakeDataset(), "input_ids").tolist() == [3, 1]
    with pytest.raises(ValueError, match="no column 'tokens'"):
        lengths_from_dataset(FakeDataset(), "tokens")


def test_builtin_workloads_and_stream():
    for name in ("longtail", "sft", "uniform"):
        a = load_workload(name, num_samples=2000, seed=0)
        assert a.size == 2000 and a.min() >= 1 and (a == load_workload(name, num_samples=2000, seed=0)).all()
    lt = load_workload("longtail", num_samples=50_000)
    assert 0.003 < (lt > 32768).mean() < 0.02  # a long tail, like the wlbllm sample
    s = sample_stream(np.array([10, 20, 30]), 100, seed=0)
    assert s.sum() >= 100 and set(s.tolist()) <= {10, 20, 30}


def test_simulate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown combination"):
        simulate(_lengths(), _cluster(), combos=[("wfap", "ring")])
    with pytest.raises(ValueError, match="workload lengths"):
        simulate(np.array([], dtype=np.int64), _cluster())
    with pytest.raises(ValueError, match="num_steps=0"):
        simulate(_lengths(), _cluster(), num_steps=0)
    with pytest.raises(ValueError, match="windows='sliding'"):
        simulate(_lengths(), _cluster(), windows="sliding")


def test_simulator_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, numpy as np; from atac_hf.sim import ClusterConfig, simulate; "
            "simulate(np.array([300, 900, 4000] * 40), ClusterConfig(max_tokens=4096, cp_size=2, dp_size=2, "
            "model='1b'), num_steps=2, combos=[('wfap', 'atp')]); "
            "import atac_hf.sim.cli, atac_hf.sim.bench, atac_hf.sim.report, atac_hf.sim.plots; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)

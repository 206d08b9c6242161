"""Runnable vs what-if scenarios of `atac-hf bench`, the headline over runnable ones, and TP pricing."""

import argparse
import dataclasses
import json

import numpy as np
import pytest

from atac_hf.sim import ClusterConfig, simulate
from atac_hf.sim import bench as bench_mod
from atac_hf.sim.bench import Scenario
from atac_hf.sim.cli import add_parser
from atac_hf.sim.report import grid_table, headline, markdown_section, summarise_grid

NAMED = [("sequential", "zigzag"), ("wlb", "wlb_adaptive"), ("wfap", "atp")]


def _cl(**kw):
    base = dict(dp_size=2, pp_size=1, cp_size=2, num_micro_batches=2, max_tokens=8192, model="8b", hardware="H100")
    base.update(kw)
    return ClusterConfig(**base)


# ---------------------------------------------------------------------------- labels
@pytest.mark.parametrize("kw", [dict(), dict(cp_size=8), dict(tp_size=2, cp_size=4), dict(tp_size=8, cp_size=2),
                                dict(dp_size=1, cp_size=1, model="1b"), dict(tp_size=2, cp_size=8, dp_size=4)])
def test_dp_cp_tp_layouts_are_runnable(kw):
    cl = _cl(**kw)
    assert cl.runnable and cl.what_if_reasons() == ()


def test_pipeline_parallelism_is_a_what_if():
    cl = _cl(pp_size=4)
    assert not cl.runnable
    assert cl.what_if_reasons() == ("PP 4: HF has no pipeline parallelism",)
    # TP beyond the K/V heads: transformers' tp_plan shards K/V heads, it cannot replicate them
    many = _cl(model="1b", tp_size=16)  # 8 K/V heads
    assert not many.runnable and "TP 16 > 8 K/V heads" in many.what_if_reasons()[0]
    both = _cl(model="1b", tp_size=16, pp_size=2)
    assert len(both.what_if_reasons()) == 2


def test_model_states_that_do_not_fit_are_a_what_if():
    # 70B at TP 8 under DDP (FSDP x TP is refused): 16 bytes x 70.6B / 8 = 141 GB per GPU > 80 GB
    tp = _cl(model="70b", tp_size=8, cp_size=4)
    assert tp.model_state_bytes_per_gpu() == pytest.approx(141e9, rel=0.01)
    (reason,) = tp.what_if_reasons()
    assert "model states 141 GB per GPU (TP with DDP: FSDP x TP is refused) exceed the H100's 80 GB" == reason
    assert not _cl(model="70b", tp_size=8, cp_size=4, hardware="A800").runnable
    # the same model with FSDP2 over DP 4 x CP 8 (35 GB per GPU) runs; on one CP 2 group it does not
    assert _cl(model="70b", dp_size=4, cp_size=8).runnable
    assert "FSDP2 over DP x CP" in _cl(model="70b", dp_size=1, cp_size=2).what_if_reasons()[0]
    assert _cl(model="8b", tp_size=2, cp_size=8).runnable  # 64 GB: fits an 80 GB GPU
    assert not _cl(model="13b", tp_size=2, cp_size=8).runnable  # 104 GB does not
    assert _cl(model="13b", tp_size=2, cp_size=8, hardware="H200").runnable  # 141 GB GPUs


def test_scenario_labels_come_from_the_cluster():
    c = dict(model="1b", hardware="H100", max_tokens=8192, cp_size=2, pp_size=2, dp_size=2, num_micro_batches=2)
    assert not Scenario("mine-pp", c, "sft", 2).runnable
    assert Scenario("mine-tp", {**c, "pp_size": 1, "tp_size": 2}, "sft", 2).runnable
    grid = bench_mod.default_grid()
    for s in grid:
        assert s.runnable == (s.cluster["pp_size"] == 1), s.name
    by_name = {s.name: s for s in grid}
    assert not by_name[bench_mod.PAPER_SCENARIO].runnable and by_name[bench_mod.FEATURED_SCENARIO].runnable
    runnable = [s for s in grid if s.runnable and not s.extra]
    assert len(runnable) >= 8
    # what users run: one node CP 8 or TP x CP; 2 nodes with CP inside a node; TP x CP wider than a node
    cfgs = [s.config() for s in runnable]
    assert any(c.tp_size > 1 and c.tp_size * c.cp_size <= c.gpus_per_node for c in cfgs)
    assert any(c.tp_size > 1 and c.tp_size * c.cp_size > c.gpus_per_node for c in cfgs)
    assert any(c.cp_size == 8 and c.tp_size == 1 and c.world_size == 16 for c in cfgs)


# ---------------------------------------------------------------------------- summary
@pytest.fixture(scope="module")
def two_results():
    lengths = np.random.default_rng(0).integers(64, 6000, 2000)
    out = []
    for name, pp in (("run-pp1", 1), ("whatif-pp2", 2)):
        res = simulate(lengths, _cl(model="1b", pp_size=pp), num_steps=2, seed=1, combos=NAMED)
        res.name = name
        out.append(res)
    return out


def test_summary_is_over_runnable_scenarios_only(two_results):
    run, what_if = two_results
    s = summarise_grid([what_if, run])  # what-if first: the summary lists runnable rows first
    assert [r["scenario"] for r in s["scenarios"]] == ["run-pp1", "whatif-pp2"]
    assert [r["runnable"] for r in s["scenarios"]] == [True, False]
    assert s["num_scenarios"] == 1 and s["what_if_summary"]["num_scenarios"] == 1
    assert s["geomean_vs_hf"] == pytest.approx(run.speedup("ATAC", "HF default"), rel=1e-12)
    assert s["geomean_vs_wlb"] == pytest.approx(run.speedup("ATAC", "WLB-LLM"), rel=1e-12)
    assert s["what_if_summary"]["geomean_vs_hf"] == pytest.approx(what_if.speedup("ATAC", "HF default"), rel=1e-12)
    assert run.speedup("ATAC", "HF default") != what_if.speedup("ATAC", "HF default")  # not vacuous
    text = grid_table(s, markdown=True)
    assert "| whatif-pp2 | what-if |" in text and "| run-pp1 | yes |" in text
    assert "geometric mean, runnable (1)" in text and "geometric mean, what-if (1)" in text
    line = headline(s)
    assert line.startswith("Geometric mean over 1 runnable scenarios") and "1 what-if scenarios" in line
    md = markdown_section(s, [run], command="atac-hf bench", seconds=1.0)
    assert "what-if: PP 2: HF has no pipeline parallelism" in md
    d = run.to_dict()
    assert d["runnable"] is True and d["what_if_reasons"] == []
    assert what_if.to_dict()["what_if_reasons"] == ["PP 2: HF has no pipeline parallelism"]
    json.dumps(s, default=float)


def test_summary_with_no_runnable_scenario_says_so(two_results):
    s = summarise_grid([two_results[1]])
    assert s["num_scenarios"] == 0 and np.isnan(s["geomean_vs_hf"])
    assert headline(s).startswith("No runnable scenarios in this grid.")
    assert "geometric mean, runnable" not in grid_table(s)


def test_bench_reports_labels_and_runnable_headline(monkeypatch, tmp_path, capsys):
    c = dict(model="1b", hardware="H100", max_tokens=8192, cp_size=2, pp_size=2, dp_size=2, num_micro_batches=2)
    grid = [Scenario("tiny-pp2", c, "longtail", 2, combos=tuple(NAMED)),
            Scenario("tiny-tp2-cp2", {**c, "pp_size": 1, "tp_size": 2}, "longtail", 2, combos=tuple(NAMED))]
    monkeypatch.setattr(bench_mod, "default_grid", lambda workload_file=None: grid)
    p = argparse.ArgumentParser(prog="atac-hf")
    add_parser(p.add_subparsers(dest="command", required=True))
    out = tmp_path / "B.md"
    args = p.parse_args(["bench", "--workers", "1", "--output", str(out), "--json"])
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["scenario"]: r for r in summary["scenarios"]}
    assert rows["tiny-tp2-cp2"]["runnable"] and not rows["tiny-pp2"]["runnable"]
    assert summary["geomean_vs_hf"] == pytest.approx(rows["tiny-tp2-cp2"]["vs_hf"])
    text = out.read_text()
    assert "| tiny-pp2 |" in text and "what-if: PP 2" in text
    # the detailed table is of the runnable scenario
    assert "All combinations, scenario `tiny-tp2-cp2`" in text


# ---------------------------------------------------------------------------- TP pricing
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_divides_attention_weights_and_kv_bytes(tp):
    one, many = _cl(cp_size=4), _cl(cp_size=4, tp_size=tp)
    a, b = one.cost_model(), many.cost_model()
    assert b.attn_s_per_pair == pytest.approx(a.attn_s_per_pair / tp, rel=1e-12)
    assert b.kv_bytes_per_token == pytest.approx(a.kv_bytes_per_token / tp, rel=1e-12)  # local K/V heads
    compute = b.linear_s_per_token - many.tp_comm_s_per_token()
    assert compute == pytest.approx(a.linear_s_per_token / tp, rel=1e-12)
    # per-rank attention work of the same segments scales with 1 / TP (the per-call overhead does not)
    start, end = np.array([0, 0]), np.array([4096, 1500])
    work = lambda cm: cm.attention_cost(start, end).sum() - 2 * cm.segment_overhead_s
    assert b.segment_overhead_s == a.segment_overhead_s
    assert work(b) * tp == pytest.approx(work(a), rel=1e-9)


def test_tp_all_reduce_is_priced_and_grows_with_tokens():
    assert _cl().tp_comm_s_per_token() == 0.0
    cl = _cl(tp_size=2)
    per_token = cl.tp_comm_s_per_token()
    # 4 ring all-reduces of hidden x 2 bytes per token, each rank moving 2 (T - 1) / T of them, over NVLink
    assert per_token == pytest.approx(4 * 2 * 0.5 * 4096 * 2 / cl.hw.intra_node_bw, rel=1e-12)
    assert _cl(tp_size=4).tp_comm_s_per_token() == pytest.approx(per_token * 1.5, rel=1e-12)
    base = dataclasses.replace(cl, tp_size=1).cost_model()
    cm = cl.cost_model()
    extra = [cm.pack_cost([n]) - base.pack_cost([n]) / 2 for n in (1024, 4096)]  # beyond the halved compute
    segment = base.segment_overhead_s / 2  # the per-segment overhead is not divided by TP
    assert extra[0] - segment == pytest.approx(1024 * per_token, rel=1e-6)
    assert extra[1] - segment == pytest.approx(4096 * per_token, rel=1e-6)
    # a TP group wider than a node all-reduces over the network
    assert _cl(tp_size=2, gpus_per_node=1).tp_comm_s_per_token() > per_token


def test_tp_x_cp_wider_than_a_node_exchanges_kv_over_the_network():
    inside, across = _cl(tp_size=2, cp_size=4), _cl(tp_size=2, cp_size=8)
    hw = inside.hw
    assert inside.cost_model().link_bandwidth == hw.intra_node_bw and inside.cost_model().node_size is None
    cm = across.cost_model()
    # 16 GPUs per CP group: 4 CP ranks per 8-GPU node (TP innermost), the rest over the network
    assert cm.link_bandwidth == hw.inter_node_bw and cm.node_size == 4 and cm.intra_node_bandwidth == hw.intra_node_bw


def test_tp_lowers_block_time_but_not_by_the_full_factor():
    lengths = np.random.default_rng(2).integers(64, 6000, 1500)
    t1 = simulate(lengths, _cl(model="8b"), num_steps=2, seed=0, combos=[("wfap", "atp")])
    t2 = simulate(lengths, _cl(model="8b", tp_size=2), num_steps=2, seed=0, combos=[("wfap", "atp")])
    a, b = t1.combos["ATAC"], t2.combos["ATAC"]
    ratio = a.pack_time_s.sum() / b.pack_time_s.sum()
    assert 1.5 < ratio < 2.0  # TP 2 halves compute; the TP all-reduces and per-call overheads remain
    assert b.kv_bytes.mean() < a.kv_bytes.mean()


def test_simulate_cli_says_whether_the_layout_runs(capsys):
    p = argparse.ArgumentParser(prog="atac-hf")
    add_parser(p.add_subparsers(dest="command", required=True))
    common = ["simulate", "--workload", "sft", "--model", "1b", "--hardware", "H100", "--dp", "2", "--cp", "2",
              "--micro-batches", "2", "--max-tokens", "8K", "--steps", "1", "--combos", "named"]
    for extra, expect in ((["--pp", "2"], "(what-if: PP 2: HF has no pipeline parallelism)"),
                          (["--pp", "1", "--tp", "2"], "(runs with the atac-hf integration)")):
        args = p.parse_args(common + extra)
        assert args.func(args) == 0
        assert expect in capsys.readouterr().out

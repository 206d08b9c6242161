"""Robustness report: plans made with the cluster's cost model, timed by another one."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from atac_hf.sim import ClusterConfig, simulate
from atac_hf.sim.cli import add_parser
from atac_hf.sim.robustness import robustness_rows, robustness_table, run_robustness, scale_attention
from atac_hf.workloads import make_workload

COMBOS = [("sequential", "zigzag"), ("wfap", "atp")]


def _setup():
    lengths = make_workload("longtail", 3000, seed=1, max_len=30_000)
    cluster = ClusterConfig(model="1b", hardware="H100", max_tokens=32768, cp_size=4, pp_size=2, dp_size=2,
                            num_micro_batches=4)
    return lengths, cluster


def test_scale_attention_scales_only_attention_prices():
    _, cluster = _setup()
    cm = cluster.cost_model().replace(masked_attn_s_per_pair=3e-12)
    twice = scale_attention(cm, 2)
    assert twice.attn_s_per_pair == 2 * cm.attn_s_per_pair and twice.masked_attn_s_per_pair == 6e-12
    assert twice.linear_s_per_token == cm.linear_s_per_token and twice.segment_overhead_s == cm.segment_overhead_s
    lens = np.array([5000, 300, 20])
    pairs_s = cm.attention_pairs(np.zeros(3, np.int64), lens) * cm.attn_s_per_pair
    assert twice.doc_cost(lens) == pytest.approx(cm.doc_cost(lens) + pairs_s)  # only the pair price doubles
    for bad in (0, -1, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ValueError, match="attention price scale must be a finite number > 0"):
            scale_attention(cm, bad)


def test_eval_model_equal_to_planning_model_changes_nothing():
    lengths, cluster = _setup()
    plain = simulate(lengths, cluster, combos=COMBOS, num_steps=3)
    same = simulate(lengths, cluster, combos=COMBOS, num_steps=3, eval_cost_model=cluster.cost_model())
    for label in plain.combos:
        np.testing.assert_allclose(same.combos[label].step_time_s, plain.combos[label].step_time_s, rtol=1e-12)
        np.testing.assert_allclose(same.combos[label].lb_time_s, plain.combos[label].lb_time_s, rtol=1e-12)
    with pytest.raises(TypeError, match="eval_cost_model must be a CostModel"):
        simulate(lengths, cluster, combos=COMBOS, num_steps=1, eval_cost_model="H100")


def test_a_dearer_attention_times_the_same_plans_slower():
    lengths, cluster = _setup()
    runs = run_robustness(lengths, cluster, scales=(1.0, 2.0), combos=COMBOS, num_steps=3)
    one, two = (r.result for r in runs)
    for label in one.combos:
        a, b = one.combos[label], two.combos[label]
        # the plans are the same (same K/V moved, same packs) ...
        np.testing.assert_array_equal(a.kv_bytes, b.kv_bytes)
        assert one.packs[a.packing] == two.packs[b.packing]
        # ... and cost more when attention does, and so does the bound
        assert (b.step_time_s >= a.step_time_s).all() and b.time_s > a.time_s
        assert b.lb_time_s.sum() > a.lb_time_s.sum()
    rows = robustness_rows(runs)
    assert len(rows) == 2 * len(COMBOS) and {r["eval"] for r in rows} == {"attention x1", "attention x2"}
    atac = [r for r in rows if r["combo"] == "ATAC"]
    assert all(r["lb_ratio"] >= 0.99 and r["cp_imbalance_worst"] >= r["cp_imbalance"] for r in atac)
    table = robustness_table(rows, markdown=True)
    assert table.startswith("| timed by | combination | time/LB") and "attention x2" in table


def test_simulate_cli_robustness_report(tmp_path, capsys):
    lengths, cluster = _setup()
    profile = tmp_path / "p.json"
    scale_attention(cluster.cost_model(), 1.5).save(profile)
    p = argparse.ArgumentParser(prog="atac-hf")
    add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["simulate", "--workload", "sft", "--model", "1b", "--hardware", "H100", "--dp", "2",
                         "--pp", "1", "--cp", "2", "--micro-batches", "2", "--max-tokens", "16K", "--steps", "2",
                         "--combos", "named", "--eval-attn-scale", "0.5,2", "--eval-profile", str(profile), "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["eval"] for r in out["rows"]} == {"attention x0.5", "attention x2", f"profile {cluster.cost_model().name}x1.5attn"}
    for bad in ("0", "a,b", "1,-2", "inf"):
        with pytest.raises(SystemExit):
            p.parse_args(["simulate", "--eval-attn-scale", bad])


def test_1f1b_formula_timing_beside_the_schedule():
    lengths, cluster = _setup()
    # one stage: the formula is the schedule (a stage runs its micro-batches back to back)
    flat = ClusterConfig(**{**cluster.to_dict(), "pp_size": 1})
    res = simulate(lengths, flat, combos=COMBOS, num_steps=3)
    for combo in res.combos.values():
        np.testing.assert_allclose(combo.formula_step_s, combo.step_time_s, rtol=1e-12)
        np.testing.assert_allclose(combo.formula_lb_s, combo.lb_time_s, rtol=1e-12)
    # two stages: both timings report, and the formula's bound is its own (balanced) formula
    runs = run_robustness(lengths, cluster, scales=(1.0,), combos=COMBOS, num_steps=3)
    rows = robustness_rows(runs)
    assert all(np.isfinite(r["formula_lb_ratio"]) and r["formula_lb_ratio"] >= 0.99 for r in rows)
    assert all(r["delay_max"] >= 0 and r["delay_mean"] >= 0 for r in rows)
    assert "time/LB (1F1B formula)" in robustness_table(rows)


def test_window_stats_steady_and_time_weighted():
    from atac_hf.sim.robustness import time_weighted_imbalance, window_imbalance_stats

    lengths, cluster = _setup()
    res = simulate(lengths, cluster, combos=[("wfap", "atp")], num_steps=4)
    cm = cluster.cost_model()
    mean, worst = window_imbalance_stats(res, "wfap", cm)
    s_mean, s_worst = window_imbalance_stats(res, "wfap", cm, steady=True)
    assert 1.0 <= mean <= worst and 1.0 <= s_mean <= s_worst <= worst
    tw = time_weighted_imbalance(res, "wfap", cm)
    assert 1.0 <= tw <= worst


def test_end_of_stream_last_trains_the_same_samples():
    lengths, cluster = _setup()
    plain = simulate(lengths, cluster, combos=COMBOS, num_steps=3)
    told = simulate(lengths, cluster, combos=COMBOS, num_steps=3, end_of_stream="last")
    for packing in plain.packs:
        spans = lambda r: sorted((sid, s, e) for w in r.packs[packing] for p in w for sid, s, e in p)  # noqa: E731
        assert sum(e - s for _, s, e in spans(told)) == sum(e - s for _, s, e in spans(plain))
    assert set(told.combos) == set(plain.combos)
    with pytest.raises(ValueError, match=r"end_of_stream='end': legal values are 'flush'"):
        simulate(lengths, cluster, combos=COMBOS, num_steps=1, end_of_stream="end")


def test_an_evaluation_model_times_the_exchange_each_plan_runs():
    """A plan re-timed by another cost model keeps its K/V exchange: an all-to-all plan (what the
    runtime runs) is not priced as an all-gather. With an equal copy of the planning model the
    summaries are the planner's own."""
    from atac_hf.sharding import plan_shards
    from atac_hf.sim import ClusterConfig
    from atac_hf.sim.simulate import plan_summaries

    cluster = ClusterConfig(model="13b", hardware="H100", cp_size=4, tp_size=4, dp_size=2, max_tokens=65536)
    cm = cluster.cost_model()
    packs = [np.array([60000], np.int64), np.array([33000, 20000, 9000, 3000], np.int64)]
    assert {plan_shards(p, 4, "atp", cm).kv_exchange for p in packs} == {"all_to_all"}
    own = plan_summaries(packs, ["atp", "per_doc"], 4, cm, None)
    copy = plan_summaries(packs, ["atp", "per_doc"], 4, cm, None, cm.replace())
    for s in own:
        assert [p.block_s for p in copy[s]] == pytest.approx([p.block_s for p in own[s]], rel=1e-12)
        assert [p.kv_bytes for p in copy[s]] == pytest.approx([p.kv_bytes for p in own[s]], rel=1e-12)

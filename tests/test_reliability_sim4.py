"""Reliability, the simulator's commands: a combination over the per-rank token cap is a refused
row of `simulate` (text, JSON, robustness report) and a refused cell of `bench` (grid table,
summary, markdown, plots), never the whole run's failure and never a ratio computed from it;
an error (exit 2, naming the cap and its setting) only when no combination fits. `--combos`
refuses duplicated, empty, unknown and mis-cased entries before any work runs."""

from __future__ import annotations

import importlib
import json
import math
import pickle
import re

import numpy as np
import pytest

from atac_hf.cli import main
from atac_hf.sharding.api import CapExceededError
from atac_hf.sim import ClusterConfig, simulate
from atac_hf.sim import bench as bench_mod
from atac_hf.sim.bench import Scenario
from atac_hf.sim.combos import parse_combos
from atac_hf.sim.report import combo_table, grid_table, headline, summarise_grid
from atac_hf.sim.results import NoCombinationFitsError
from atac_hf.sim.robustness import robustness_rows, robustness_summary, robustness_table, run_robustness

simulate_mod = importlib.import_module("atac_hf.sim.simulate")  # the module (the package's name is the function)

#: 9-token documents at CP 8: per_doc puts 2 of each on rank 0 (1.8x the mean), over the default
#: cap ceil(8K / 8 x 1.25) = 1280; zigzag, contiguous and atp fit.
SHORT = [9] * 2000 + [40, 77, 13] * 200
SIM = ["--dp", "1", "--pp", "1", "--cp", "8", "--micro-batches", "2", "--max-tokens", "8K", "--steps", "2"]


@pytest.fixture
def short(tmp_path):
    p = tmp_path / "short.json"
    p.write_text(json.dumps(SHORT))
    return str(p)


def _cluster(**kw):
    return ClusterConfig(**{**dict(dp_size=1, pp_size=1, cp_size=8, num_micro_batches=2, max_tokens=8192,
                                   model="7b", hardware="A800"), **kw})


def _one_error_line(capsys, argv, match):
    rc = main(argv)
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip() and "it/s" not in ln and "scenario/s" not in ln]
    assert rc == 2, (argv, rc, cap.err[:500])
    assert len(lines) == 1 and lines[0].startswith(f"atac-hf {argv[0]}: error: "), cap.err[:800]
    assert "Traceback" not in cap.err
    assert re.search(match, lines[0]), (match, lines[0][:800])
    return lines[0]


def _refuse(monkeypatch, strategy):
    """Every plan of ``strategy`` over the cap (the simulator's planner, as the real one raises)."""
    real = simulate_mod.plan_shards

    def fake(lens, cp, s, cm, **kw):
        if s == strategy:
            raise CapExceededError(f"strategy {s!r} puts too many tokens on one rank (test)")
        return real(lens, cp, s, cm, **kw)

    monkeypatch.setattr(simulate_mod, "plan_shards", fake)


# ---------------------------------------------------------------- simulate: a baseline over the cap
def test_simulate_reports_a_baseline_over_the_cap_as_refused_rows_and_the_others(capsys, short):
    """Was: `atac-hf simulate` aborted on the first per_doc pack over the cap (exit 2, no table),
    even with --combos ATAC (the sample pack planned every sharding)."""
    assert main(["simulate", "--workload", short, *SIM]) == 0
    out = capsys.readouterr().out
    for packing in ("sequential", "bfd", "wlb", "wfap"):
        assert re.search(rf"^{packing}\+per_doc +refused +- ", out, re.M), out
        assert re.search(rf"^{packing}\+per_doc refused: over the per-rank token cap 1280 \(pack \d+ of \d+: "
                         r"strategy 'per_doc' puts \d+ tokens on one rank", out, re.M)
    assert re.search(r"^ATAC +[\d,]+ +1\.\d\dx", out, re.M) and re.search(r"^HF default +[\d,]+ +1\.00x", out, re.M)
    assert "ATAC: " in out and "x HF default" in out
    res = simulate(np.array(SHORT), _cluster(), num_steps=2, combos=[("wfap", "atp"), ("wfap", "per_doc")])
    assert list(res.combos) == ["ATAC"] and list(res.refused) == ["wfap+per_doc"]
    assert pickle.loads(pickle.dumps(res)).refused == res.refused
    assert "per_doc" in res.sample_pack["refused"] and "per_doc" not in res.sample_pack["rank_s"]
    assert main(["simulate", "--workload", short, *SIM, "--combos", "ATAC"]) == 0  # the sample pack no longer fails
    assert "refused" not in capsys.readouterr().out


def test_simulate_json_has_refused_rows_and_no_ratio_against_them(capsys, short):
    assert main(["simulate", "--workload", short, *SIM, "--combos", "ATAC,HF default,wfap+per_doc", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in d["combinations"]}
    assert list(rows) == ["ATAC", "HF default", "wfap+per_doc"]
    assert set(rows["wfap+per_doc"]) == {"label", "packing", "sharding", "refused"}
    assert rows["wfap+per_doc"]["refused"].startswith("over the per-rank token cap 1280 (pack ")
    assert "throughput_tok_s" in rows["ATAC"] and d["strongest_baseline"] == "HF default"
    assert set(d["speedup"]) == {"vs_hf_default", "vs_strongest"} and "speedup_omitted" not in d


def test_ratios_against_a_refused_hf_default_or_atac_are_omitted_and_said(monkeypatch, capsys, short):
    _refuse(monkeypatch, "zigzag")
    assert main(["simulate", "--workload", short, *SIM, "--combos", "named", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "vs_hf_default" not in d["speedup"] and "limit_vs_hf_default" not in d
    assert d["speedup_omitted"] == {"vs_hf_default": "HF default refused"}
    assert d["strongest_baseline"] == "WLB-LLM" and d["speedup"]["vs_strongest"] == d["speedup"]["vs_wlb_llm"]
    assert main(["simulate", "--workload", short, *SIM, "--combos", "named"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ATAC +[\d,]+ +- ", out, re.M)  # no "vs HF" column without HF default
    assert "no ratio over HF default (HF default refused)" in out
    res = simulate(np.array(SHORT), _cluster(), num_steps=2, combos=[("wfap", "atp"), ("sequential", "zigzag")])
    assert list(res.refused) == ["HF default"] and math.isnan(res.speedup_or_nan("ATAC", "HF default"))
    with pytest.raises(ValueError, match=r"no speedup of 'ATAC' over 'HF default': 'HF default' was refused"):
        res.speedup("ATAC", "HF default")

    _refuse(monkeypatch, "atp")
    assert main(["simulate", "--workload", short, *SIM, "--combos", "named", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "speedup" not in d and d["speedup_omitted"] == {"all": "ATAC refused"}
    assert main(["simulate", "--workload", short, *SIM, "--combos", "named"]) == 0
    assert "ATAC refused: no speedup computed" in capsys.readouterr().out


def test_simulate_errors_only_when_no_combination_fits(capsys, short):
    line = _one_error_line(capsys, ["simulate", "--workload", short, *SIM, "--combos", "sequential+per_doc"],
                           r"no combination fits the per-rank token cap of 1280 tokens \(ceil\(max_tokens 8192 / "
                           r"cp_size 8 x rank_token_slack 1\.25\): set max_tokens_per_rank \(--max-tokens-per-rank\) "
                           r"or raise cp_size \(--cp\)\); 1 of 1 refused, first sequential\+per_doc")
    assert "strategy 'per_doc' puts" in line
    _one_error_line(capsys, ["simulate", "--workload", short, *SIM, "--combos", "named", "--max-tokens-per-rank",
                             "100"], r"per-rank token cap of 100 tokens \(set by max_tokens_per_rank \(--max-tokens-"
                                     r"per-rank\): raise it, or raise cp_size \(--cp\)\); 3 of 3 refused")
    _one_error_line(capsys, ["simulate", "--workload", short, *SIM, "--combos", "named", "--max-tokens-per-rank", "100",
                             "--json"], r"no combination fits")
    assert capsys.readouterr().out == ""  # the JSON run prints nothing
    with pytest.raises(NoCombinationFitsError) as e:
        simulate(np.array(SHORT), _cluster(max_tokens_per_rank=100), num_steps=2, combos=[("wfap", "atp")])
    assert isinstance(e.value, ValueError) and list(e.value.refused) == ["ATAC"]
    back = pickle.loads(pickle.dumps(e.value))  # bench's worker processes send results back pickled
    assert str(back) == str(e.value) and back.refused == e.value.refused


def test_an_explicit_cap_that_fits_runs_and_bad_caps_are_refused(capsys, short):
    assert main(["simulate", "--workload", short, *SIM, "--combos", "ATAC,wfap+per_doc", "--max-tokens-per-rank",
                 "2K", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in d["combinations"]] == ["ATAC", "wfap+per_doc"]
    assert d["cluster"]["max_tokens_per_rank"] == 2048
    for bad in ("0", str(2**40)):
        _one_error_line(capsys, ["simulate", "--workload", short, *SIM, "--max-tokens-per-rank", bad],
                        r"--max-tokens-per-rank=\d+ must be from 1 to \d+ \(or omit it")
    for bad in (0, True, 2.5, 2**70):
        with pytest.raises(ValueError, match=r"ClusterConfig\.max_tokens_per_rank=.* must be an int from 1"):
            _cluster(max_tokens_per_rank=bad)
    assert _cluster(cp_size=1, max_tokens_per_rank=5000).rank_token_cap() == 5000  # applies at cp 1 too
    with pytest.raises(NoCombinationFitsError, match=r"tokens on the one rank of cp_size=1"):
        simulate(np.array([4000] * 20), _cluster(cp_size=1, max_tokens_per_rank=3000), num_steps=1,
                 combos=[("wfap", "atp")])


def test_plan_summaries_refusals_and_wlb_adaptive_without_a_fitting_per_doc():
    from atac_hf.sharding import plan_shards
    from atac_hf.sim.simulate import plan_summaries

    cm = _cluster().cost_model()
    packs = [np.array([9] * 300), np.array([3000, 9, 9]), np.array([300] * 8)]
    with pytest.raises(CapExceededError):  # no refused dict: the planner's error, as before
        plan_summaries(packs, ["per_doc"], 8, cm, 400)
    why: dict = {}
    out = plan_summaries(packs, ["zigzag", "per_doc", "wlb_adaptive"], 8, cm, 400, refused=why)
    assert set(out) == {"zigzag", "wlb_adaptive"} and list(why) == ["per_doc"]
    assert why["per_doc"].startswith("pack 1 of 3: strategy 'per_doc' puts")
    for lens, s in zip(packs, out["wlb_adaptive"]):  # planned itself, as plan_shards plans it
        assert s.block_s == plan_shards(lens, 8, "wlb_adaptive", cm, max_tokens_per_rank=400).block_time_s


def test_robustness_report_has_refused_rows(capsys, short):
    runs = run_robustness(np.array(SHORT), _cluster(), scales=(1.0, 2.0), combos=[("wfap", "atp"), ("wfap", "per_doc")],
                          num_steps=2)
    rows = robustness_rows(runs)
    assert [r["combo"] for r in rows] == ["ATAC", "wfap+per_doc"] * 2
    assert rows[1]["refused"].startswith("over the per-rank token cap")
    table = robustness_table(rows)
    assert re.search(r"attention x2 +wfap\+per_doc +refused +- ", table)
    assert table.count("wfap+per_doc refused: over the per-rank token cap") == 1
    assert [s["scenarios"] for s in robustness_summary([{**r, "scenario": "a"} for r in rows])] == [1, 1]
    assert main(["simulate", "--workload", short, *SIM, "--combos", "ATAC,wfap+per_doc", "--eval-attn-scale",
                 "1"]) == 0
    assert "wfap+per_doc refused: " in capsys.readouterr().out


# ---------------------------------------------------------------- bench: a refused cell, not a crashed grid
def _grid(short_path):
    c = dict(model="1b", hardware="H100", max_tokens=8192, cp_size=8, pp_size=1, dp_size=1, num_micro_batches=2)
    return lambda workload_file=None: [
        Scenario("short-docs", c, short_path, 2),
        Scenario("all-refused", c, short_path, 2, combos=(("sequential", "per_doc"), ("wfap", "per_doc"))),
        Scenario("tiny-sft", {**c, "cp_size": 2}, "sft", 2),
    ]


def test_bench_reports_refused_cells_and_writes_its_report_and_plots(monkeypatch, tmp_path, capsys, short):
    """Was: the first scenario with a per_doc pack over the cap failed the whole grid (exit 2)."""
    monkeypatch.setattr(bench_mod, "default_grid", _grid(short))
    out = tmp_path / "B.md"
    assert main(["bench", "--workers", "1", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^short-docs .* bfd\+per_doc, sequential\+per_doc, wfap\+per_doc, wlb\+per_doc$", printed, re.M)
    assert re.search(r"^all-refused +yes( +-){9} +sequential\+per_doc, wfap\+per_doc$", printed, re.M)
    assert "nan" not in printed.lower()
    assert "In 2 of them some combination was refused" in printed
    text = out.read_text()
    assert "| all-refused | yes | - |" in text and "refused (over the per-rank cap)" in text
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    pytest.importorskip("matplotlib")
    assert pngs == ["sim_pack_time_cdf.png", "sim_rank_load.png", "sim_speedup.png"]
    assert main(["bench", "--workers", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    by = {r["scenario"]: r for r in summary["scenarios"]}
    assert set(by["all-refused"]["refused"]) == {"sequential+per_doc", "wfap+per_doc"}
    assert math.isnan(by["all-refused"]["vs_hf"]) and by["all-refused"]["best"] == "-"
    assert summary["num_scenarios"] == 3 and summary["num_refused"] == 2
    assert summary["geomean_vs_hf"] == pytest.approx(math.exp(np.mean(np.log(
        [by["short-docs"]["vs_hf"], by["tiny-sft"]["vs_hf"]]))))  # the refused cell is left out, not a NaN mean
    assert summary["worst_atac_lb"] == max(by["short-docs"]["atac_lb"], by["tiny-sft"]["atac_lb"])


def test_bench_robustness_grid_with_a_refused_scenario(monkeypatch, capsys, short):
    monkeypatch.setattr(bench_mod, "default_grid", _grid(short))
    assert main(["bench", "--workers", "1", "--scenarios", "all-refused,short-docs", "--eval-attn-scale", "1"]) == 0
    out = capsys.readouterr().out
    assert "all-refused: wfap+per_doc refused: " in out and "short-docs: wlb+per_doc refused: " in out


def test_report_helpers_never_compute_from_a_refused_combination(monkeypatch):
    from atac_hf.sim.plots import have_matplotlib, plot_speedups

    _refuse(monkeypatch, "zigzag")
    res = simulate(np.array(SHORT), _cluster(), num_steps=2, combos=[("wfap", "atp"), ("sequential", "zigzag"),
                                                                     ("wlb", "wlb_adaptive")])
    table = combo_table(res, markdown=True)
    assert "| HF default | refused | - |" in table and "\n\n- HF default refused: over the per-rank token cap" in table
    s = summarise_grid([res])
    row = s["scenarios"][0]
    assert math.isnan(row["vs_hf"]) and math.isnan(row["limit"]) and row["vs_wlb"] > 0
    text = grid_table(s)
    assert re.search(r"yes +refused +refused +1\.\d{3} +\d\.\d\dx", text)
    assert "n/a (refused)x HF default" not in headline(s) and "n/a (refused) HF default" in headline(s)
    if have_matplotlib():
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            plot_speedups(s, f"{d}/s.png")


# ---------------------------------------------------------------- --combos
@pytest.fixture
def never_loads(monkeypatch):
    import atac_hf.workloads as wl

    def loaded(*a, **k):
        raise AssertionError("simulate loaded the workload before checking --combos")

    monkeypatch.setattr(wl, "load_workload", loaded)


FORM = r"--combos takes 'all', 'named' or comma-separated entries.*packings \[.*\], shardings \[.*\]$"


@pytest.mark.parametrize("spec, match", [
    ("wfap+atp,wfap+atp", r"--combos entry 'wfap\+atp' \(number 2 of 'wfap\+atp,wfap\+atp'\) duplicates an earlier "
                          r"entry; "),
    ("ATAC,wfap+atp", r"entry 'wfap\+atp' \(number 2 .*\) duplicates an earlier entry \(as 'ATAC' before; both are "
                      r"wfap\+atp\)"),
    ("HF default, sequential + zigzag", r"entry 'sequential \+ zigzag' .* duplicates .*as 'HF default' before"),
    ("", r"--combos '' is empty; "),
    ("   ", r"--combos ' +' is empty; "),
    ("wfap+atp,", r"--combos 'wfap\+atp,': entry 2 is empty \(a stray comma\?\)"),
    ("wfap+atp,,bfd+atp", r"entry 2 is empty"),
    ("wfap+nope", r"--combos entry 'wfap\+nope' \(number 1 of 'wfap\+nope'\): unknown sharding 'nope'; "),
    ("bogus+nope", r"unknown packing 'bogus' and unknown sharding 'nope'"),
    ("WFAP+ATP", r"unknown packing 'WFAP' and unknown sharding 'ATP' \(did you mean 'wfap\+atp'\?\)"),
    ("atac", r"entry 'atac' \(number 1 of 'atac'\) is neither a combination name nor packing\+sharding \(did you "
             r"mean 'ATAC'\?\)"),
    ("hf  default", r"\(did you mean 'HF default'\?\)"),
    ("All", r"\(did you mean 'all'\?\)"),
    ("all,wfap+atp", r"entry 'all' \(number 1 .*\) must be the whole value"),
    ("wfap", r"--combos entry 'wfap' \(number 1 of 'wfap'\) is neither a combination name nor packing\+sharding; "),
])
def test_bad_combos_are_refused_before_any_work(capsys, never_loads, spec, match):
    line = _one_error_line(capsys, ["simulate", "--combos", spec, *SIM], match)
    assert re.search(FORM, line), line
    with pytest.raises(ValueError, match=match):
        parse_combos(spec)


def test_good_combos_forms():
    assert parse_combos("all") is None and parse_combos(" all ") is None
    assert parse_combos("named") == [("sequential", "zigzag"), ("wlb", "wlb_adaptive"), ("wfap", "atp")]
    assert parse_combos(" wfap + atp , HF default,bfd+per_doc ") == [("wfap", "atp"), ("sequential", "zigzag"),
                                                                    ("bfd", "per_doc")]
    with pytest.raises(ValueError) as e:  # a long value is cut short in the message
        parse_combos("x" * 500 + "+y")
    assert len(str(e.value)) < 1000


def test_simulate_api_refuses_duplicated_and_unknown_combinations():
    with pytest.raises(ValueError, match=r"combination \('wfap', 'atp'\) \(ATAC\) is given twice in combos"):
        simulate(np.array(SHORT), _cluster(), num_steps=1, combos=[("wfap", "atp"), ("bfd", "atp"), ("wfap", "atp")])
    with pytest.raises(ValueError, match=r"unknown combination \('wfap', 'ATP'\); packings"):
        simulate(np.array(SHORT), _cluster(), num_steps=1, combos=[("wfap", "ATP")])
    with pytest.raises(ValueError, match="combos is empty"):
        simulate(np.array(SHORT), _cluster(), num_steps=1, combos=[])

"""`simulate` / `bench` command-line functions and the markdown report."""

import argparse
import json
import os
import re

import pytest

from atac_hf.sim import bench as bench_mod
from atac_hf.sim.bench import Scenario
from atac_hf._argtypes import parse_tokens
from atac_hf.cost.cli import add_parser as add_calibrate_parser
from atac_hf.sim.cli import add_parser
from atac_hf.sim.report import SECTION_HEADING, write_section


def _parser():
    p = argparse.ArgumentParser(prog="atac-hf")
    sub = p.add_subparsers(dest="command", required=True)
    add_parser(sub)
    add_parser(sub)  # idempotent: the main CLI may list this module under several names
    add_calibrate_parser(sub)
    return p


def _run(argv):
    args = _parser().parse_args(argv)
    return args.func(args)


def test_parser_has_three_commands():
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"simulate", "bench", "calibrate"} <= set(sub.choices)
    assert parse_tokens("128K") == 131072 and parse_tokens("4096") == 4096
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'lots' is not a token count \(e\.g\. 32768 or 32K\)$"):
        parse_tokens("lots")


def test_simulate_json(capsys, tmp_path):
    wl = tmp_path / "lens.json"
    wl.write_text(json.dumps([300, 5000, 1200, 800, 7000, 64, 2500, 4096] * 60))
    rc = _run(["simulate", "--workload", str(wl), "--dp", "2", "--pp", "2", "--cp", "2", "--micro-batches", "2",
               "--max-tokens", "8K", "--model", "1b", "--hardware", "H100", "--steps", "3", "--combos", "named",
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["label"] for r in out["combinations"]} == {"HF default", "WLB-LLM", "ATAC"}
    assert out["cluster"]["cp_size"] == 2 and out["workload"] == "lens"
    assert out["speedup"]["vs_hf_default"] > 0


def test_simulate_table_and_hf_config(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
                               "num_hidden_layers": 4, "intermediate_size": 1376, "vocab_size": 1000}))
    rc = _run(["simulate", "--workload", "sft", "--dp", "2", "--pp", "1", "--cp", "2", "--micro-batches", "2",
               "--max-tokens", "4096", "--model", str(cfg), "--steps", "2", "--combos", "wfap+atp,HF default"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "ATAC" in text and "HF default" in text and "h512x4" in text


def test_simulate_bad_settings():
    with pytest.raises(ValueError, match="num_gpus=7 does not match"):
        _run(["simulate", "--num-gpus", "7", "--steps", "1"])
    with pytest.raises(ValueError, match="--combos entry 'wfap'"):
        _run(["simulate", "--combos", "wfap", "--dp", "1", "--pp", "1", "--cp", "1", "--max-tokens", "4K"])
    with pytest.raises(ValueError, match="--model 'gpt9'"):
        _run(["simulate", "--model", "gpt9"])


def test_simulate_takes_the_size_spellings_of_plan_and_atac_config():
    """`atac-hf plan --cp-size`, `calibrate --tp-size` and ATACConfig(cp_size=...) spell the sizes so; simulate's
    --cp / --dp / --pp / --tp refused --cp-size as an unknown argument."""
    short = _parser().parse_args(["simulate", "--dp", "2", "--pp", "1", "--cp", "4", "--tp", "2"])
    long = _parser().parse_args(["simulate", "--dp-size", "2", "--pp-size", "1", "--cp-size", "4", "--tp-size", "2"])
    assert (long.dp, long.pp, long.cp, long.tp) == (short.dp, short.pp, short.cp, short.tp) == (2, 1, 4, 2)


def test_every_command_takes_the_other_commands_spelling_of_a_profile_and_of_lengths():
    """pack said --cost-profile and --lengths, plan and simulate --profile and plan --doc-lengths: each now takes
    the other spelling too (the same setting)."""
    from atac_hf.cli import build_parser

    parse = build_parser().parse_args
    for command, canonical, alias, dest, rest in (
            ("pack", "--cost-profile", "--profile", "cost_profile", ["--workload", "sft", "--max-tokens", "4K"]),
            ("plan", "--profile", "--cost-profile", "profile", ["--doc-lengths", "5,6", "--cp-size", "2"]),
            ("simulate", "--profile", "--cost-profile", "profile", []),
            ("bench", "--profile", "--cost-profile", "profile", []),
            ("plan", "--doc-lengths", "--lengths", "doc_lengths", ["--cp-size", "2"])):
        a = parse([command, canonical, "p.json", *rest])
        b = parse([command, alias, "p.json", *rest])
        assert getattr(a, dest) == getattr(b, dest) == "p.json", (command, alias)


def _tiny_grid(workload_file=None):
    c = dict(model="1b", hardware="H100", max_tokens=8192, cp_size=2, pp_size=2, dp_size=2, num_micro_batches=2)
    return [Scenario("tiny-a", c, "longtail", 3), Scenario("tiny-b", {**c, "cp_size": 4, "pp_size": 1}, "sft", 3)]


def test_bench_writes_only_its_section(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench_mod, "default_grid", _tiny_grid)
    out = tmp_path / "docs" / "BENCHMARKS.md"
    rc = _run(["bench", "--output", str(out), "--workers", "1"])
    assert rc == 0
    text = out.read_text()
    assert text.startswith("# Benchmarks") and SECTION_HEADING in text
    assert f"Reproduce: `atac-hf bench --output {out}`" in text
    assert "tiny-a" in text and "geometric mean" in text
    printed = capsys.readouterr().out
    assert "geometric mean" in printed
    # someone else's section survives a rerun; ours is replaced, not duplicated
    out.write_text(text + "\n## Real runs\n\nkept\n")
    _run(["bench", "--output", str(out), "--workers", "2", "--json"])
    again = out.read_text()
    assert again.count(SECTION_HEADING) == 1 and "## Real runs\n\nkept" in again
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(summary["scenarios"]) == 2 and summary["geomean_vs_hf"] > 0


def test_write_section_keeps_other_sections(tmp_path):
    path = tmp_path / "B.md"
    path.write_text("# Benchmarks\n\n## Real runs\n\nA\n\n" + SECTION_HEADING + "\n\nold\n\n## Later\n\nB\n")
    write_section(str(path), SECTION_HEADING + "\n\nnew\n")
    text = path.read_text()
    assert "old" not in text and "new" in text and "## Real runs\n\nA" in text and "## Later\n\nB" in text


def test_bench_unknown_scenario(monkeypatch):
    monkeypatch.setattr(bench_mod, "default_grid", _tiny_grid)
    with pytest.raises(ValueError, match="--scenarios: unknown"):
        _run(["bench", "--scenarios", "nope", "--no-write"])


def test_default_grid_covers_the_brief():
    grid = bench_mod.default_grid()
    cl = [s.cluster for s in grid]
    assert {c["max_tokens"] for c in cl} == {32768, 65536, 131072}
    assert {c["cp_size"] for c in cl} == {2, 4, 8}
    assert {c["pp_size"] for c in cl} == {1, 4}
    assert all(c["dp_size"] > 1 for c in cl)
    assert len({c["model"] for c in cl}) >= 4
    assert {"longtail", "sft", "uniform"} <= {s.workload for s in grid}
    if os.path.exists(bench_mod.wlbllm_path()):
        assert grid[0].name == bench_mod.PAPER_SCENARIO and grid[0].workload == bench_mod.wlbllm_path()


def test_bench_scenario_with_a_profile_runs_the_profiles_model(tmp_path):
    import dataclasses

    from atac_hf.cost import MODEL_PRESETS, CostModel

    dims = MODEL_PRESETS["tiny"]
    path = tmp_path / "p.json"
    CostModel(linear_s_per_token=2e-6, attn_s_per_pair=1e-9, tile=1,
              kv_bytes_per_token=2.0 * dims.num_kv_heads * dims.head_dim * 4).save(
        path, model=dataclasses.asdict(dims), tp_size=1)
    sc = Scenario("p", dict(model="70b", hardware="H100", max_tokens=8192, cp_size=2, pp_size=2, dp_size=2,
                            num_micro_batches=2, tp_size=8), "sft", 2)
    cfg = sc.config(str(path))
    assert cfg.dims == dims and cfg.tp_size == 1 and cfg.cost_model().linear_s_per_token == 2e-6
    res = bench_mod.run_scenario(sc, profile=str(path), combos=[("wfap", "atp"), ("sequential", "zigzag")])
    assert res.combos["ATAC"].throughput > 0


def test_bench_robustness_report_over_the_grid(monkeypatch, capsys):
    """`atac-hf bench --eval-attn-scale`: every scenario planned with its own model and timed at
    each attention price; a table with the scenario, and one summary per evaluation model."""
    monkeypatch.setattr(bench_mod, "default_grid", _tiny_grid)
    assert _run(["bench", "--eval-attn-scale", "0.5,2", "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = [s.name for s in _tiny_grid()]
    assert {r["scenario"] for r in out["rows"]} == set(names)
    assert {r["eval"] for r in out["rows"]} == {"attention x0.5", "attention x2"}
    by = {(r["scenario"], r["eval"], r["combo"]): r for r in out["rows"]}
    for s in out["summary"]:
        atac = [by[(n, s["eval"], "ATAC")]["lb_ratio"] for n in names]
        assert s["scenarios"] == 2 and s["atac_lb_worst"] == max(atac) and min(atac) <= s["atac_lb_geomean"] <= max(atac)
        assert 0 <= s["ahead_of_all"] <= 2
    assert _run(["bench", "--eval-attn-scale", "2", "--workers", "2", "--scenarios", names[0]]) == 0
    printed = capsys.readouterr().out
    assert names[0] in printed and names[1] not in printed and "attention x2: ATAC/LB geomean" in printed


def test_bench_robustness_refusals(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_mod, "default_grid", _tiny_grid)
    out = tmp_path / "B.md"
    with pytest.raises(ValueError, match="drop --output or the --eval options"):
        _run(["bench", "--eval-attn-scale", "2", "--output", str(out)])
    assert not out.exists()  # refused: nothing written
    with pytest.raises(SystemExit):  # argparse: not a list of numbers > 0
        _run(["bench", "--eval-attn-scale", "0,x"])
    with pytest.raises(ValueError, match="needs an evaluation model"):
        bench_mod.run_robustness_grid(_tiny_grid())
    with pytest.raises(ValueError, match="attention price scale must be a finite number > 0"):
        bench_mod.run_robustness_grid(_tiny_grid(), scales=(float("nan"),))
    with pytest.raises((ValueError, OSError), match="nope.json"):
        _run(["bench", "--eval-profile", str(tmp_path / "nope.json"), "--workers", "1"])


def test_bench_reproduce_line_carries_every_option_that_changes_the_report():
    """The report's "Reproduce:" command reruns the same run: the scenarios, seed, profile,
    workload file and plots folder it was made with (not --workers, which changes neither)."""
    from atac_hf.sim.cli import bench_command

    args = _parser().parse_args(["bench", "--output", "docs/B.md", "--workers", "3"])
    assert bench_command(args) == "atac-hf bench --output docs/B.md"
    args = _parser().parse_args(["bench", "--output", "my docs/B.md", "--scenarios", "tiny-a,tiny-b", "--seed", "4",
                                 "--workload-file", "w.json", "--profile", "p.json", "--plots-dir", "plots"])
    assert bench_command(args) == ("atac-hf bench --output 'my docs/B.md' --workload-file w.json --plots-dir plots "
                                   "--profile p.json --scenarios tiny-a,tiny-b --seed 4")


def _paper_grid(side_options):
    def grid(workload_file=None):
        c = dict(model="1b", hardware="H100", max_tokens=8192, cp_size=2, pp_size=1, dp_size=2, num_micro_batches=2)
        return [Scenario(bench_mod.PAPER_SCENARIO, c, "longtail", 3),
                Scenario(bench_mod.PAPER_SPLIT, c, "longtail", 3, side_options,
                         (("sequential", "zigzag"), ("wfap", "atp")), extra=True)]
    return grid


def test_bench_paper_line_says_when_the_balance_split_side_run_split_nothing(monkeypatch, capsys):
    """Red-team 16: the side run's sentence gave its (unchanged) figures as the effect of balance
    splits where, on a short stream, no sample became overdue and nothing was split."""
    monkeypatch.setattr(bench_mod, "default_grid", _paper_grid({"balance_split": True}))
    assert _run(["bench", "--no-write", "--workers", "1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Paper-like"))
    assert re.search(r"split no sample in this \d+-step run \(they split only heavy samples held back past "
                     r"their deadline\): ATAC is unchanged\.$", line), line
    # packs that differ from the paper scenario's: the side run's figures are reported
    monkeypatch.setattr(bench_mod, "default_grid", _paper_grid({"price_band": (0.25, 4.0)}))
    assert _run(["bench", "--no-write", "--workers", "1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Paper-like"))
    assert "of the attention work (a split document loses the attention across the cut), ATAC is" in line


def test_cluster_describe_names_the_pack_size_and_micro_batches_exactly():
    """Red-team 16: 100,000-token packs were described as 97K, and one micro-batch as "1 micro-batches"."""
    from atac_hf.sim import ClusterConfig

    one = ClusterConfig(model="8b", hardware="H100", cp_size=2, max_tokens=100_000, num_micro_batches=1).describe()
    assert one.endswith("1 micro-batch, 100,000-token packs")
    four = ClusterConfig(model="8b", hardware="H100", cp_size=2, max_tokens=32768, num_micro_batches=4).describe()
    assert four.endswith("4 micro-batches, 32K-token packs")


def test_plan_table_labels_kv_in_mib():
    """Red-team 16: the K/V column divides by 2**20 and was labelled MB."""
    import contextlib
    import io

    from atac_hf.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["plan", "--doc-lengths", "6000,500,300", "--cp-size", "2"])
    assert "KV MiB" in buf.getvalue() and "KV MB" not in buf.getvalue()

"""The first hour of a new user (issue 17): what a fresh script meets first.

``import atac_hf`` registers ``atac_cp``; a custom collator is refused at construction;
the Trainer runs on CPU without ``use_cpu``; ``atac-hf bench`` writes only where told and
says which workload it used; ``simulate`` explains its columns; calibrate reports progress.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_MODEL = textwrap.dedent("""
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=128)
    """)


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------- item 1: registration on import
@pytest.mark.parametrize("order", ["atac_hf first", "transformers first"])
def test_import_atac_hf_registers_atac_cp(order):
    first = ("import atac_hf\n"
             "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'import atac_hf imported torch'\n"
             "import transformers\n") if order == "atac_hf first" else \
            ("import transformers, transformers.modeling_utils\nimport atac_hf\n")
    code = "import sys\n" + first + _MODEL + textwrap.dedent("""
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation="atac_cp")
        assert m.config._attn_implementation == "atac_cp", m.config._attn_implementation
        import atac_hf._attention_hook as hook
        assert hook._FINDER not in sys.meta_path, "the hook removes itself once it fired"
        import transformers.modeling_utils as mu
        assert type(mu.__loader__).__name__ != "_RegisteringLoader", "the module keeps its own loader"
        print("ok")
        """)
    r = _py(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_without_the_hook_transformers_refuses_atac_cp():
    """Not vacuous: with the hook taken out, plain transformers does not know the name."""
    code = "import atac_hf, atac_hf._attention_hook as h\nh.remove_hook()\n" + _MODEL + textwrap.dedent("""
        try:
            AutoModelForCausalLM.from_config(cfg, attn_implementation="atac_cp")
        except Exception as e:
            print("refused", type(e).__name__)
        else:
            print("accepted")
        """)
    r = _py(code)
    assert r.returncode == 0 and "refused" in r.stdout, (r.stdout, r.stderr[-2000:])


# ---------------------------------------------------------------------------- item 2: the collator check
def _tiny_trainer(tmp_path, **kwargs):
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=64,
                                                               max_position_embeddings=256), dtype=torch.float32)
    ds = datasets.Dataset.from_dict({"input_ids": [[i % 60 + 1 for i in range(n)] for n in (40, 7, 90, 25)]})
    args = kwargs.pop("args", None) or TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                                          max_steps=2, logging_steps=1, disable_tqdm=True)
    return ATACTrainer(model=model, args=args, train_dataset=ds,
                       atac_config=ATACConfig(cp_size=1, max_tokens=128, cost_preset="default"), **kwargs)


def _word_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 63, **{f"w{i}": i for i in range(1, 63)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]")


def _concatenating(features):
    import torch

    ids = torch.tensor([[t for f in features for t in f["input_ids"]]])
    return {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(ids.shape[1])[None]}


def _broken(features):
    raise KeyError("text")


@pytest.mark.parametrize("collator, match", [
    ("lm", r"data_collator=DataCollatorForLanguageModeling pads its rows .*position_ids"),
    (_concatenating, r"data_collator=_concatenating gave 1 document\(s\) .* for 2 samples .*its own document"),
    (_broken, r"data_collator=_broken raised KeyError: 'text'.*'input_ids' \(1, S\), 'labels' \(1, S\)"),
    (lambda f: {"input_ids": [1, 2]}, r"returned no 'labels'.*DataCollatorWithFlattening"),
])
def test_a_collator_that_does_not_pack_is_refused_at_construction(tmp_path, collator, match):
    if collator == "lm":
        from transformers import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(_word_tokenizer(), mlm=False)
    with pytest.raises(ValueError, match=match):
        _tiny_trainer(tmp_path, data_collator=collator)


def test_a_flattening_collator_is_accepted_and_trains(tmp_path):
    from transformers import DataCollatorWithFlattening

    trainer = _tiny_trainer(tmp_path, data_collator=DataCollatorWithFlattening())
    out = trainer.train()
    assert out.global_step == 2 and out.training_loss > 0


def test_without_padding_no_documents_found_names_the_keys(tmp_path):
    import torch

    def one_row(features):  # one row, labels, but no way to find the documents
        ids = torch.tensor([[t for f in features for t in f["input_ids"]]])
        return {"input_ids": ids, "labels": ids.clone()}

    with pytest.raises(ValueError, match=r"data_collator=.*one_row: cannot find the documents .*keys \['input_ids', "
                                         r"'labels'\]"):
        _tiny_trainer(tmp_path, data_collator=one_row)


# ---------------------------------------------------------------------------- items 3, 9: Trainer defaults and figures
def test_batch_size_warning_only_for_a_size_the_user_set(tmp_path):
    import warnings

    from transformers import TrainingArguments

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _tiny_trainer(tmp_path)  # TrainingArguments' default batch size: not the user's choice
    assert not [w for w in seen if "is ignored by ATACTrainer" in str(w.message)]
    assert trainer.args.ddp_find_unused_parameters is False, "dense model: no find_unused_parameters warning"
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=4,
                             ddp_find_unused_parameters=True)
    with pytest.warns(UserWarning, match=r"per_device_train_batch_size=4 is ignored by ATACTrainer.*max_tokens"):
        trainer = _tiny_trainer(tmp_path, args=args)
    assert trainer.args.ddp_find_unused_parameters is True, "the user's own setting stays"


def test_train_samples_per_second_counts_the_documents_trained(tmp_path):
    from atac_hf.attention import doc_lengths_from_batch
    from atac_hf.integrations import ATACTrainer

    docs = []
    original = ATACTrainer._prepare_context_parallel_inputs

    def counting(self, model, inputs):
        if model.training:
            docs.append(len(doc_lengths_from_batch(inputs)))
        return original(self, model, inputs)

    trainer = _tiny_trainer(tmp_path)
    trainer._prepare_context_parallel_inputs = counting.__get__(trainer)
    metrics = trainer.train().metrics
    assert len(docs) == 2 and sum(docs) >= 2
    # Trainer's own figure would be 2 steps x per_device_train_batch_size 8 = 16 samples
    assert metrics["train_samples_per_second"] * metrics["train_runtime"] == pytest.approx(sum(docs), rel=0.05)


@pytest.mark.slow
def test_readme_trainer_snippet_runs_on_cpu_without_use_cpu(tmp_path):
    """``accelerate launch`` on a CPU machine, the README's snippet as written (no use_cpu)."""
    import json
    import os

    sys.path.insert(0, os.path.dirname(__file__))
    from _launch import accelerate_launch

    proc = accelerate_launch("configs/cpu_cp2.yaml", ROOT / "tests" / "_readme_trainer.py", tmp_path, timeout=600)
    text = proc.stdout + proc.stderr
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert res["world_size"] == 2 and res["use_cpu"] is True and res["steps"] == 3
    # Accelerate's cached mesh (and the trainer's cp_group) kept the destroyed gloo group's threads
    # alive until interpreter teardown (a SIGABRT after the run, seen on CI); the exit handler drops
    # them, so the threads end once the user's own objects go (the example's main() returning)
    assert res["gloo_threads_before"] > 0 and res["released"] is True and res["gloo_threads_after"] == 0
    assert text.count("use_cpu=True") == 1, "one log line, from rank 0"
    assert "is ignored by ATACTrainer" not in text, "the user never set a batch size"
    assert "find_unused_parameters=True" not in text


# ---------------------------------------------------------------------------- items 5, 6, 10, 11: bench / simulate
def _cli(argv):
    import argparse

    from atac_hf.sim.cli import add_parser

    p = argparse.ArgumentParser(prog="atac-hf")
    add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


@pytest.fixture
def tiny_grid(monkeypatch):
    from atac_hf.sim import bench
    from atac_hf.sim.bench import Scenario

    c = dict(model="1b", hardware="H100", max_tokens=8192, cp_size=2, pp_size=2, dp_size=2, num_micro_batches=2)
    monkeypatch.setattr(bench, "default_grid", lambda workload_file=None: [Scenario("tiny-a", c, "longtail", 3)])


def test_bench_without_output_writes_nothing(tiny_grid, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _cli(["bench", "--workers", "1"]) == 0
    assert list(tmp_path.iterdir()) == [], "no --output: print only"
    out = capsys.readouterr().out
    assert out.startswith("workload longtail (built-in mix, 200,000 lengths drawn with seed 1): 200,000 samples, ")
    assert "Columns: tok/s = " in out and "/LB = time over" in out and "mb imb = " in out and "delay = " in out


def test_bench_output_file_gets_the_section_and_the_plots_beside_it(tiny_grid, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert _cli(["bench", "--workers", "1", "--output", "report/R.md"]) == 0
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "R.md", "sim_pack_time_cdf.png", "sim_rank_load.png", "sim_speedup.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"], "nothing beside the working folder"
    text = (tmp_path / "report" / "R.md").read_text()
    assert "Reproduce: `atac-hf bench --output report/R.md`" in text and "](sim_speedup.png)" in text
    assert "Columns: tok/s = " in text
    # --plots-dir: the plots there, linked from the report relative to its folder
    assert _cli(["bench", "--workers", "1", "--output", "report/R.md", "--plots-dir", "img"]) == 0
    assert {p.name for p in (tmp_path / "img").iterdir()} == {"sim_pack_time_cdf.png", "sim_rank_load.png",
                                                              "sim_speedup.png"}
    assert "](../img/sim_speedup.png)" in (tmp_path / "report" / "R.md").read_text()


def test_bench_says_when_matplotlib_is_missing(tiny_grid, tmp_path, monkeypatch, capsys):
    from atac_hf.sim import plots

    monkeypatch.setattr(plots, "have_matplotlib", lambda: False)
    assert _cli(["bench", "--workers", "1", "--output", str(tmp_path / "R.md")]) == 0
    out = capsys.readouterr().out
    assert out.count("no plots: matplotlib is not installed") == 1 and "[dev] extra" in out
    assert [p.name for p in tmp_path.iterdir()] == ["R.md"]


def test_bench_plots_dir_needs_an_output(tiny_grid):
    with pytest.raises(ValueError, match=r"--plots-dir 'x' needs --output FILE.md"):
        _cli(["bench", "--plots-dir", "x"])


def test_simulate_names_its_workload_first_and_explains_its_columns(tmp_path, capsys):
    import json

    wl = tmp_path / "lens.json"
    wl.write_text(json.dumps([300, 5000, 1200, 800, 7000, 64, 2500, 4096] * 60))
    args = ["simulate", "--workload", str(wl), "--dp", "2", "--pp", "2", "--cp", "2", "--micro-batches", "2",
            "--max-tokens", "8K", "--model", "1b", "--hardware", "H100", "--steps", "2", "--combos", "named"]
    assert _cli(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"workload lens ({wl}): 480 samples, 1,257,600 tokens, longest 7,000"
    assert any(ln.startswith("Columns: ") and "/LB = " in ln and "mb imb = " in ln and "delay = " in ln
               for ln in lines)
    assert _cli(args + ["--json"]) == 0
    info = json.loads(capsys.readouterr().out)["workload_info"]
    assert info["num_samples"] == 480 and info["tokens"] == 1257600 and info["name"] == "lens"


def test_rank_load_plot_data_holds_kv_traffic_per_strategy():
    import numpy as np

    from atac_hf.sim.cluster import ClusterConfig
    from atac_hf.sim.simulate import simulate
    from atac_hf.workloads import make_workload

    cluster = ClusterConfig(dp_size=2, pp_size=1, cp_size=4, num_micro_batches=2, max_tokens=16384, model="1b",
                            hardware="H100")
    res = simulate(make_workload("longtail", 2000, seed=0), cluster, num_steps=2, seed=0,
                   combos=[("sequential", s) for s in ("zigzag", "per_doc", "atp")])
    sp = res.sample_pack
    assert set(sp["kv_bytes"]) == set(sp["rank_s"]) == set(sp["block_s"])
    assert all(np.isfinite(v) and v >= 0 for v in sp["kv_bytes"].values())
    assert sp["kv_bytes"]["atp"] <= sp["kv_bytes"]["per_doc"], "ATP never moves more K/V than per-document"


# ---------------------------------------------------------------------------- item 7: calibrate in bounded time
def test_fit_to_budget_halves_max_len_until_the_estimate_fits():
    from atac_hf.cost.calibration_grid import estimate_seconds, fit_to_budget, measurement_grid

    make = lambda ml: measurement_grid(False, False, ml)  # noqa: E731
    rates = (2e-6, 8e-8)  # s per linear token, s per attention pair: a CPU core
    full = estimate_seconds(make(65536), *rates)
    assert full > 3600 > estimate_seconds(make(16384), *rates), "64K documents: over an hour on one core"
    got, grid, est = fit_to_budget(make, 65536, 600.0, *rates)
    assert got == 16384 and est <= 600 and est == estimate_seconds(grid, *rates)
    assert max(c[0] for ch in grid["chunks"] for c in ch) == 16384
    assert fit_to_budget(make, 65536, None, *rates)[0] == 65536 == fit_to_budget(make, 65536, 0, *rates)[0]
    assert fit_to_budget(make, 65536, 1e-3, *rates)[0] is None, "not even the base grid fits: base grid"


def test_calibrate_says_its_estimate_and_keeps_to_the_budget(tmp_path):
    pytest.importorskip("torch")
    from atac_hf.cost.calibrate import calibrate

    said = []
    res = calibrate("tiny", device="cpu", quick=True, grid={"repeats": 1}, max_len=8192, budget_s=0.5,
                    progress=said.append)
    assert any("max_len=8192 would take about" in m and "budget of 0.5 s" in m for m in said), said
    assert any("measurements x 2 rounds: estimated" in m for m in said), said
    assert res.capped_from == 8192 and res.longest_document == 2048
    assert res.metadata()["max_len_capped_from"] == 8192 and "capped at 2048 tokens" in res.summary()

"""Thirty-fourth mutation pass: survivors of mutants planted by hand in red-team 22's fixes.

Killed here, in process (no process group): ``check_step_model`` called by ``prediction_step`` (a model replaced
after construction is refused at ``evaluate()`` too), against the model recorded at construction (not the
one ``trainer.model`` holds at the step), with its training flag (only ``training_step`` asks for Accelerate's
DDP wrapper), and ``ATACTrainer._atac_base`` recorded as the unwrapped model (a PEFT model given at
construction runs); ``kv_element_bytes``' ``min(width, 2)`` under autocast (1-byte weights stay 1), its 2 for a
model without parameters, ``model_kv_bytes_per_token``'s default of one K/V head per attention head, and fp16
autocast counted as half in ``ATACTrainer`` and ``ATACAccelerator``; ``model_or_preset`` (a folder is no
config.json), ``model_arg``'s lower-cased presets and its refusal of a JSON non-object, ``profile_model``'s
flag in its refusals (``plan --profile``, ``pack --cost-profile``) and ``plan --hardware`` with a config.json;
``load_workload``'s dataset hint only for an existing file (any case of its extension) and naming its
setting; ``check-model --config``'s refusals of a folder without a config.json (named as given) and of a JSON
non-object; ``token_count``'s 18-digit bound, ``ATAC_MIN_CHUNK=none`` and a ``str`` subclass as a token count.
"""

from __future__ import annotations

import argparse
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from test_mutants_pass30 import _bare_trainer  # the bare ATACTrainer (no process group, no Trainer.__init__)
from test_redteam20 import _stock_model

CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


# ---------------------------------------------------------------------------- check_step_model in ATACTrainer
def test_a_peft_model_given_at_construction_evaluates_and_a_replaced_model_is_refused_at_evaluate(tmp_path):
    """Kills: ``ATACTrainer._atac_base = self.model`` (the PEFT wrapper, not its base: every step refused);
    ``prediction_step`` without ``check_step_model``; ``check_step_model``'s ``built`` read off ``trainer.model``
    at the step (an evaluation runs ``trainer.model`` itself, so a replaced one matched itself)."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer

    rng = np.random.default_rng(0)
    ds = Dataset.from_dict({"input_ids": [rng.integers(1, 64, n).tolist() for n in (30, 50, 20, 40)]})
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True)
    peft = get_peft_model(_stock_model(), LoraConfig(r=2, target_modules=["q_proj"]))
    t = ATACTrainer(model=peft, args=args, train_dataset=ds, eval_dataset=ds,
                    atac_config=ATACConfig(cp_size=1, max_tokens=128))
    assert t._atac_base is peft.get_base_model()
    assert np.isfinite(t.evaluate()["eval_loss"])  # the PEFT model it was built with runs
    t.model = _stock_model()
    with pytest.raises(ValueError, match=r"this step runs a LlamaForCausalLM .*\(was trainer.model replaced after "
                                         r"construction"):
        t.evaluate()


@pytest.fixture
def unprepared(monkeypatch):
    """A bare ATACTrainer at 2 processes whose model Accelerate holds no DDP wrapper of; Trainer's own steps
    stubbed (they return "ran")."""
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "training_step", lambda self, *a, **k: "ran")
    monkeypatch.setattr(Trainer, "prediction_step", lambda self, *a, **k: "ran")
    t = _bare_trainer(1)
    t.args, t.accelerator = SimpleNamespace(world_size=2), SimpleNamespace(_models=[])
    return t


def test_training_step_asks_for_the_ddp_wrapper_and_prediction_step_does_not(unprepared):
    """Kills ``check_step_model(..., training=False)`` in ``training_step`` (an unprepared model trained at 2
    processes without its gradients summed) and ``training=True`` in ``prediction_step`` (an evaluation, which
    sums no gradients, refused)."""
    t = unprepared
    with pytest.raises(RuntimeError, match=r"train\(\) runs a TinyLM that Accelerate did not prepare"):
        t.training_step(t.model, {})
    assert t.prediction_step(t.model, {}, prediction_loss_only=True) == "ran"


# ---------------------------------------------------------------------------- kv_bytes
def test_autocast_narrows_wider_weights_to_2_bytes_but_never_widens_and_no_parameters_count_2():
    """Kills ``2 if autocast_half`` for ``min(width, 2)`` (1-byte float8 weights counted 2 under autocast)
    and ``width = 4`` for a model without parameters (2)."""
    from atac_hf.integrations.kv_bytes import kv_element_bytes

    fp8 = torch.nn.Linear(4, 4).to(torch.float8_e4m3fn)
    assert (kv_element_bytes(fp8), kv_element_bytes(fp8, True)) == (1, 1)
    assert (kv_element_bytes(torch.nn.Module()), kv_element_bytes(torch.nn.Module(), True)) == (2, 2)


def test_a_config_without_num_key_value_heads_has_one_kv_head_per_attention_head():
    """Kills ``num_key_value_heads ... or 1`` (multi-head attention, e.g. GPT-2's config, priced as MQA)."""
    from transformers import GPT2Config

    from atac_hf.integrations.kv_bytes import model_kv_bytes_per_token

    m = torch.nn.Linear(2, 2)  # fp32
    m.config = GPT2Config(n_layer=2, n_head=4, n_embd=32)
    assert model_kv_bytes_per_token(m) == 2 * 4 * (8 + 8) * 4  # layers x kv heads x (k + v) x fp32
    assert model_kv_bytes_per_token(m, True) == 2 * 4 * (8 + 8) * 2


def test_the_trainer_counts_fp16_autocast_as_half(tmp_path):
    """Kills ``half = bool(self.args.bf16)`` in ``ATACTrainer.__init__`` (fp16 autocast exchanges 2-byte K/V)."""
    from datasets import Dataset
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer
    from atac_hf.integrations.kv_bytes import model_kv_bytes_per_token

    m = _stock_model()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, fp16=True, report_to=[], max_steps=1)
    t = ATACTrainer(model=m, args=args, train_dataset=Dataset.from_dict({"input_ids": [[1, 2, 3]]}),
                    atac_config=ATACConfig(cp_size=1, max_tokens=64))
    assert t.atac_sharder.kv_bytes_per_token == model_kv_bytes_per_token(m) / 2
    assert t.atac_sharder.cost_model.kv_bytes_per_token == t.atac_sharder.kv_bytes_per_token / m.config.num_hidden_layers


def test_the_accelerator_counts_fp16_autocast_as_half():
    """Kills ``half = str(self.mixed_precision) == "bf16"`` in ``ATACAccelerator._setup_model``."""
    from accelerate.state import AcceleratorState

    from atac_hf import ATACAccelerator, ATACConfig
    from atac_hf.integrations.kv_bytes import model_kv_bytes_per_token

    m = _stock_model()
    AcceleratorState._reset_state()  # (Accelerate keeps one mixed precision per process)
    try:
        acc = ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True, mixed_precision="fp16")
        m = acc.prepare(m)
        assert acc.sharder.kv_bytes_per_token == model_kv_bytes_per_token(m) / 2
        assert acc.sharder.cost_model.kv_bytes_per_token == acc.sharder.kv_bytes_per_token / m.config.num_hidden_layers
        acc.end_training()
    finally:
        AcceleratorState._reset_state()


# ---------------------------------------------------------------------------- _argtypes and the plan / pack CLIs
def test_model_or_preset_reads_a_file_only_and_model_arg_lower_cases_presets_and_wants_an_object(tmp_path):
    """Kills ``model_or_preset``'s ``os.path.exists`` for ``os.path.isfile`` (a folder read as a config.json,
    not named against the presets), ``model_arg``'s case-sensitive preset check and its ``return spec`` (not
    lower-cased), and the dropped refusal of a JSON non-object."""
    from atac_hf._argtypes import model_arg, model_or_preset

    assert model_or_preset(str(tmp_path)) == str(tmp_path)  # CostModel.from_model names the presets
    assert model_arg("8B") == "8b" and model_arg("Tiny") == "tiny"
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"must hold a JSON object \(an HF config.json\), got list"):
        model_arg(str(path))
    with pytest.raises(ValueError, match=r"must hold a JSON object"):
        model_or_preset(str(path))
    path.write_text(json.dumps(CONFIG))
    from atac_hf.cost import ModelDims

    assert model_or_preset(str(path)) == ModelDims.from_hf_config(CONFIG)  # (read, since red-team 53, to its ModelDims)


@pytest.mark.parametrize("argv, flag", [(["plan", "--doc-lengths", "9,5", "--cp-size", "2", "--profile"], "--profile"),
                                        (["pack", "--workload", "uniform", "--num-samples", "10", "--max-tokens", "64",
                                          "--cost-profile"], "--cost-profile")])
def test_a_bad_profile_is_refused_naming_its_flag(argv, flag, tmp_path, capsys):
    """Kills ``profile_model``'s bare re-raise (the refusal not naming the flag) and the flag swapped in
    ``atac-hf plan`` (``--cost-profile``) or ``atac-hf pack`` (``--profile``)."""
    from atac_hf.cli import main

    assert main([*argv, str(tmp_path / "missing.json")]) == 2
    assert re.search(rf"does not exist \(check the cost profile path setting\) \(check {flag}\)$",
                     capsys.readouterr().err.strip())


def test_plan_prices_a_config_json_on_the_hardware_given(tmp_path, capsys):
    """Kills ``CostModel.from_model(model_or_preset(args.model), "H100")`` in ``atac-hf plan`` (``--hardware``
    ignored with a config.json)."""
    from atac_hf.cli import main
    from atac_hf.cost import CostModel
    from atac_hf.sharding import plan_shards

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    lengths = [9000, 600, 400, 240]
    got = {}
    for hw in ("A800", "H100"):
        assert main(["plan", "--doc-lengths", ",".join(map(str, lengths)), "--cp-size", "2", "--strategy", "atp",
                     "--model", str(path), "--hardware", hw, "--json"]) == 0
        got[hw] = json.loads(capsys.readouterr().out)["block_time_ms"]
        want = plan_shards(lengths, 2, "atp", CostModel.from_model(CONFIG, hw)).block_time_s * 1e3
        assert got[hw] == pytest.approx(want, rel=1e-3)
    assert got["A800"] != pytest.approx(got["H100"], rel=1e-3)


# ---------------------------------------------------------------------------- load_workload's dataset hint
def test_the_dataset_hint_is_for_an_existing_file_of_any_case_and_names_its_setting(tmp_path):
    """Kills the hint without ``os.path.isfile`` (a missing ``.jsonl`` called a dataset instead of an unknown
    workload), without ``.lower()`` (``DATA.JSONL`` read as a lengths file), and naming ``--workload`` whatever
    the setting."""
    from atac_hf.workloads import load_workload

    with pytest.raises(ValueError, match=r"unknown workload .*missing.jsonl.*\(check --workload\)"):
        load_workload(str(tmp_path / "missing.jsonl"))
    path = tmp_path / "DATA.JSONL"
    path.write_text('{"text": "a b"}\n')
    with pytest.raises(ValueError, match=r"is a dataset, not a lengths file .* read a column of it with "
                                         rf"dataset:{re.escape(str(path))}:<column> .*\(check --workload-file\)$"):
        load_workload(str(path), setting="--workload-file")


# ---------------------------------------------------------------------------- check-model --config
def test_check_model_names_a_folder_without_config_json_as_given_and_wants_an_object(tmp_path):
    """Kills ``os.path.isdir(args.config)`` alone (or ``or``) choosing the folder's config.json even where there is
    none (the refusal then names a path the user never gave), and the dropped ``isinstance(d, dict)`` (a JSON
    number or list failed with a TypeError, not the refusal)."""
    from atac_hf.integrations.check_cli import _items

    args = argparse.Namespace(config=str(tmp_path))
    with pytest.raises(ValueError, match=rf"^--config {re.escape(repr(str(tmp_path)))} is not a file; pass the path"):
        _items(args)
    assert args.config == str(tmp_path)
    for text in ("5", '["model_type"]', '"model_type: llama"'):
        path = tmp_path / "config.json"
        path.write_text(text)
        with pytest.raises(ValueError, match=r"has no 'model_type': pass a transformers config.json"):
            _items(argparse.Namespace(config=str(tmp_path)))


# ---------------------------------------------------------------------------- token counts
def test_a_token_count_has_at_most_18_digits():
    """Kills ``[0-9]+`` and ``[0-9]{1,17}`` for ``[0-9]{1,18}`` in ``token_count``."""
    from atac_hf.integrations.config_files import token_count

    assert token_count("9" * 18, "max_tokens", "s") == int("9" * 18)
    assert token_count("1" * 18 + "K", "max_tokens", "s") == int("1" * 18) * 1024
    for bad in ("1" * 19, "1" * 19 + "k", "9" * 5000):
        with pytest.raises(ValueError, match=r"is not a token count: write ASCII digits"):
            token_count(bad, "max_tokens", "s")


def test_atac_min_chunk_none_is_unset_and_a_str_subclass_is_a_token_count():
    """Kills ``_parse_env``'s ``None`` for ``max_tokens_per_rank`` only (``ATAC_MIN_CHUNK=none`` refused) and
    ``type(v) is str`` for ``isinstance(v, str)`` in ``ATACConfig.__post_init__`` (``numpy.str_("16K")``)."""
    from atac_hf import ATACConfig

    for text in ("none", "None", "null", ""):
        assert ATACConfig.from_env({"ATAC_MIN_CHUNK": text}).min_chunk is None
    cfg = ATACConfig(max_tokens=np.str_("16K"), min_chunk=np.str_("1k"))
    assert (cfg.max_tokens, cfg.min_chunk) == (16384, 1024) and type(cfg.max_tokens) is int

"""``atac-hf plan`` and ``atac-hf pack`` take ``--model`` as an HF ``config.json`` too, as ``simulate`` and
``calibrate`` do (red-team 22: they took presets only, so ``plan`` could not show the plan training makes for
the user's own model without a calibration first)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, pack_lengths
from atac_hf.sharding import plan_shards

CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def _cli(*argv):
    proc = subprocess.run([sys.executable, "-m", "atac_hf.cli", *map(str, argv)], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


def test_plan_prices_the_model_of_a_config_json(config):
    lengths = [9000, 600, 400, 240]
    rc, out, err = _cli("plan", "--doc-lengths", ",".join(map(str, lengths)), "--cp-size", 2, "--strategy", "atp",
                        "--model", config, "--json")
    assert rc == 0, err
    got = json.loads(out)
    plan = plan_shards(lengths, 2, "atp", CostModel.from_model(CONFIG, "H100"))
    assert got["rank_tokens"] == [int(s[:, 2].sum() - s[:, 1].sum()) for s in plan.segments]
    assert got["block_time_ms"] == pytest.approx(plan.block_time_s * 1e3, rel=1e-3)
    preset = json.loads(_cli("plan", "--doc-lengths", ",".join(map(str, lengths)), "--cp-size", 2, "--strategy",
                             "atp", "--json")[1])
    assert preset["block_time_ms"] != got["block_time_ms"]  # the 8b preset prices another model


def test_pack_prices_the_model_of_a_config_json(config, tmp_path):
    lengths = [300, 2000, 50, 700, 1200, 90, 640, 1500, 30]
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(lengths))
    rc, out, err = _cli("pack", "--lengths", path, "--max-tokens", 2048, "--packs-per-window", 4, "--model", config,
                        "--json")
    assert rc == 0, err
    want = pack_lengths(lengths, PackingConfig(max_tokens=2048, packs_per_window=4), CostModel.from_model(CONFIG))
    assert json.loads(out)["packs"] == [[list(s) for s in p] for p in want.packs]


@pytest.mark.parametrize("command", ["plan", "pack"])
def test_an_unknown_model_names_the_presets(command, tmp_path):
    argv = (["--doc-lengths", "9,5", "--cp-size", 2] if command == "plan" else
            ["--workload", "uniform", "--num-samples", 10, "--max-tokens", 64])
    rc, _, err = _cli(command, *argv, "--model", tmp_path / "gpt9.json")
    assert rc == 2 and "unknown model preset" in err and "'8b'" in err


def test_a_dataset_file_given_as_a_workload_points_to_the_dataset_spelling(tmp_path):
    from atac_hf.workloads import load_workload

    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a b"}\n')
    with pytest.raises(ValueError, match=r"is a dataset, not a lengths file .* read a column of it with "
                                         rf"dataset:{path}:<column> .*\(check --workload\)"):
        load_workload(str(path))
    with pytest.raises(ValueError, match=r"is a dataset"):
        load_workload(str(tmp_path))  # a dataset folder (load_from_disk)


def test_check_model_takes_a_checkpoint_folder(config, tmp_path):
    import argparse

    from atac_hf.integrations.check_cli import _items

    args = argparse.Namespace(config=str(config.parent))
    assert _items(args) == [{"family": "llama", "config": CONFIG}] and args.config == str(config)
    with pytest.raises(ValueError, match=r"is not a file; pass the path of a config.json"):
        _items(argparse.Namespace(config=str(tmp_path)))  # a folder without one

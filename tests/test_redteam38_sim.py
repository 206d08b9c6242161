"""Red-team 38: the user's own data, model and profile on the simulator's command line.

* ``bench --profile``: a profile whose ``metadata`` is malformed (an unknown or missing
  ``metadata.model`` field, a ``tp_size`` that is not an int) is refused naming the profile, the
  field, the legal values and ``--profile``, not with a bare ``TypeError`` from ``ModelDims``.
* ``dataset:<path>`` naming a local data file that does not exist is refused at once, not looked
  up on the Hub (with network retries: 20 s and more offline).
* ``--model`` given a composite (vision-language) config.json reads its ``text_config``.
"""

from __future__ import annotations

import json

import pytest

from atac_hf.cli import main
from atac_hf.cost import CostModel, ModelDims
from atac_hf.sim.bench import default_grid
from atac_hf.workloads import lengths_from_dataset, load_workload

_DIMS = {"hidden_size": 4096, "num_layers": 32, "num_heads": 32, "num_kv_heads": 32, "head_dim": 128,
         "intermediate_size": 11008, "vocab_size": 32000, "sliding_window": None}
_SCENARIO = "7b-32K-cp2-pp1-wlbllm"


def _profile(tmp_path, name: str, **metadata) -> str:
    path = tmp_path / name
    CostModel(linear_s_per_token=2e-6, attn_s_per_pair=2e-10, kv_bytes_per_token=16384.0).save(
        str(path), **{"model": dict(_DIMS), "tp_size": 1, **metadata})
    return str(path)


def _scenario():
    return next(s for s in default_grid(None) if s.name == _SCENARIO)


@pytest.mark.parametrize("metadata, match", [
    ({"model": {**_DIMS, "rope_theta": 10000}}, r"metadata\.model with unknown fields \['rope_theta'\]; legal fields"),
    ({"model": {k: v for k, v in _DIMS.items() if k != "num_layers"}}, r"metadata\.model with no \['num_layers'\]"),
    ({"model": "7b"}, r"metadata\.model='7b', not an object of ModelDims fields"),
    ({"model": {**_DIMS, "hidden_size": -5}}, r"bad metadata\.model: ModelDims\.hidden_size"),
    ({"tp_size": "x"}, r"metadata\.tp_size='x'; legal values: an int >= 1"),
    ({"tp_size": 2.7}, r"metadata\.tp_size=2\.7; legal values: an int >= 1"),
    ({"tp_size": [2]}, r"metadata\.tp_size=\[2\]; legal values"),
])
def test_bench_profile_bad_metadata_is_named(tmp_path, metadata, match):
    path = _profile(tmp_path, "p.json", **metadata)
    with pytest.raises(ValueError, match=match) as e:
        _scenario().config(path)
    assert "--profile" in str(e.value) and "p.json" in str(e.value)


def test_bench_profile_bad_metadata_cli_leaves_output(tmp_path, capsys):
    path = _profile(tmp_path, "p.json", model={**_DIMS, "rope_theta": 1})
    out = tmp_path / "BENCH.md"
    out.write_text("# keep\n")
    rc = main(["bench", "--profile", path, "--scenarios", _SCENARIO, "--workers", "1", "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "TypeError" not in err and "rope_theta" in err and "--profile" in err
    assert out.read_text() == "# keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["BENCH.md", "p.json"]


def test_bench_profile_good_metadata_still_runs_its_model(tmp_path):
    cfg = _scenario().config(_profile(tmp_path, "p.json"))
    assert cfg.dims == ModelDims(**_DIMS) and cfg.tp_size == 1


@pytest.mark.parametrize("name", ["missing.parquet", "sub/missing.jsonl:length", "./nope_dir"])
def test_dataset_missing_local_path_is_refused_at_once(tmp_path, monkeypatch, name):
    import datasets

    def hub(*a, **k):
        raise AssertionError("looked up on the Hub (offline: retries for 20 s and more)")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", hub)
    with pytest.raises(ValueError, match=r"does not exist: give an existing folder .*check --workload"):
        load_workload(f"dataset:{name}")


def test_dataset_existing_local_file_still_reads(tmp_path, monkeypatch):
    path = tmp_path / "d.jsonl"
    path.write_text('{"length": 100}\n{"length": 200}\n')
    assert lengths_from_dataset(str(path)).tolist() == [100, 200]
    monkeypatch.setenv("HOME", str(tmp_path))  # dataset:~/d.jsonl: no shell expands the ~ after "dataset:"
    assert load_workload("dataset:~/d.jsonl").tolist() == [100, 200]


_TEXT = {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 4, "num_key_value_heads": 4,
         "intermediate_size": 8192, "vocab_size": 32000}


def test_composite_config_reads_its_text_config(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "not-a-known-type", "text_config": _TEXT,
                                "vision_config": {"hidden_size": 1152, "num_attention_heads": 16}}))
    assert ModelDims.from_hf_config(json.loads(path.read_text())) == ModelDims.from_hf_config(_TEXT)
    rc = main(["simulate", "--model", str(path), "--dp", "2", "--pp", "1", "--cp", "2", "--max-tokens", "8K",
               "--steps", "1", "--micro-batches", "2", "--combos", "ATAC", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    model = json.loads(out.out)["cluster"]["model"]
    assert model["hidden_size"] == 2048 and model["num_layers"] == 4 and model["num_kv_heads"] == 4

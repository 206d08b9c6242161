"""Red-team 38 follow-ups (repro_4 ... repro_7).

* ``pack --lengths`` of only zero lengths printed ``mean nan ... padding nan%``: the summary now
  says there are no packs (``--json`` keeps its ``null`` metrics).
* ``pack --cost-profile`` / ``plan --profile`` ignored an explicit ``--model`` the profile was not
  measured for: refused, naming both; ``--model`` omitted uses the profile's model.
* Messages that named settings the CLI lacks: ``simulate`` with a sample over the fragment limit
  (said ``overlength='truncate'``), a lengths file that is not JSON (``.npy``, ``.csv``).
* ``ClusterConfig.model_state_bytes_per_gpu`` counted an LM head beside a tied embedding.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from atac_hf.cli import build_parser, main
from atac_hf.cost import MODEL_PRESETS, CostModel, ModelDims
from atac_hf.sim.cluster import STATE_BYTES_PER_PARAM, ClusterConfig

# repro_4 -------------------------------------------------------------------------------------


def test_pack_all_zero_lengths_summary_says_no_packs(tmp_path, capsys):
    path = tmp_path / "zeros.json"
    path.write_text("[0, 0, 0]")
    assert main(["pack", "--lengths", str(path), "--max-tokens", "64K"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    assert "no packs: every sample is empty (zero-length skipped 3)" in out
    assert main(["pack", "--lengths", str(path), "--max-tokens", "64K", "--json"]) == 0  # JSON: unchanged, null
    data = json.loads(capsys.readouterr().out)
    assert data["packs"] == [] and data["metrics"]["padding"] is None and data["metrics"]["zero_length_skipped"] == 3


def test_pack_summary_with_packs_is_unchanged(tmp_path, capsys):
    path = tmp_path / "some.json"
    path.write_text("[0, 100, 300]")
    assert main(["pack", "--lengths", str(path), "--max-tokens", "1K"]) == 0
    out = capsys.readouterr().out
    assert "no packs" not in out and "padding " in out and "nan" not in out.lower()


# repro_5 -------------------------------------------------------------------------------------


def _profile(tmp_path, model: str = "7b") -> str:
    dims = MODEL_PRESETS[model]
    path = tmp_path / f"profile_{model}.json"
    CostModel(linear_s_per_token=2e-6, attn_s_per_pair=2e-10, kv_bytes_per_token=16384.0, name="measured").save(
        str(path), model=dataclasses.asdict(dims), tp_size=1)  # as `atac-hf calibrate` writes metadata.model
    return str(path)


_PACK = ["pack", "--workload", "sft", "--num-samples", "200", "--max-tokens", "32K"]
_PLAN = ["plan", "--doc-lengths", "30000,2000", "--cp-size", "4", "--strategy", "atp"]


@pytest.mark.parametrize("argv, flag", [(_PACK, "--cost-profile"), (_PLAN, "--profile")])
def test_explicit_model_other_than_the_profiles_is_refused(tmp_path, capsys, argv, flag):
    path = _profile(tmp_path)
    assert main([*argv, flag, path, "--model", "70b"]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert captured.out == ""  # refused before anything is printed
    assert "--model '70b' (h8192x80) is not the model" in err
    assert f"{flag} '{path}' was measured for (h4096x32;" in err
    assert "hidden_size: profile 4096 vs model 8192" in err and "omit --model" in err


@pytest.mark.parametrize("argv, flag", [(_PACK, "--cost-profile"), (_PLAN, "--profile")])
def test_profile_without_or_with_its_own_model_runs(tmp_path, capsys, argv, flag):
    path = _profile(tmp_path)
    for extra in ([], ["--model", "7b"], ["--model", "7B"]):
        assert main([*argv, flag, path, *extra]) == 0
        out = capsys.readouterr().out
        assert "cost model measured" in out


@pytest.mark.parametrize("argv, flag", [(_PACK, "--cost-profile"), (_PLAN, "--profile")])
def test_model_default_is_none_and_8b_without_a_profile(tmp_path, capsys, argv, flag):
    args = build_parser().parse_args(argv)
    assert args.model is None
    assert main(argv) == 0
    assert "cost model 8b@H100" in capsys.readouterr().out
    assert main([*argv, "--model", "nope", flag, _profile(tmp_path)]) == 2  # a bad --model is still named
    assert "unknown model preset 'nope'" in capsys.readouterr().err


def test_model_help_names_the_profile_rule(capsys):
    for argv in (["pack", "--help"], ["plan", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert "default 8b; with --" in text and "must be the one it was measured for" in text


# repro_6 -------------------------------------------------------------------------------------


def test_simulate_fragment_limit_names_simulate_flags(tmp_path, capsys):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps([100, 2**31 + 5]))
    rc = main(["simulate", "--workload", str(path), "--steps", "1", "--max-tokens", "32K", "--dp", "2", "--pp", "1",
               "--cp", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "overlength=" not in err
    assert "lengths[1] = 2147483653 tokens" in err and "more than the 16384 a sample may have" in err
    assert "raise max_tokens (--max-tokens) to at least 131073" in err and "(--workload)" in err
    assert "--dp, --micro-batches" not in err  # at 16384 fragments more packs per step would not help
    rc = main(["simulate", "--workload", str(path), "--steps", "1", "--max-tokens", "32K", "--dp", "1",
               "--micro-batches", "2", "--pp", "1", "--cp", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "more than the 2048 a sample may have" in err and "(--dp, --micro-batches)" in err


@pytest.mark.parametrize("name, raw", [("a.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '<i8'}"),
                                       ("a.csv", b"length\n100\n200\n")])
def test_pack_lengths_not_json_says_what_it_reads(tmp_path, capsys, name, raw):
    path = tmp_path / name
    path.write_bytes(raw)
    assert main(["pack", "--lengths", str(path), "--max-tokens", "64K"]) == 2
    err = capsys.readouterr().err
    assert "is not valid JSON" in err and "(check --lengths)" in err
    assert "--lengths reads a JSON array of ints (a .json file, or gzip-compressed .json.gz)" in err
    assert "`atac-hf simulate --workload dataset:FILE:COLUMN`" in err and "parquet/csv/jsonl" in err


def test_simulate_workload_not_json_names_dataset_spec(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("100 200\n")
    assert main(["simulate", "--workload", str(path), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "is not valid JSON" in err and "--workload reads a JSON array of ints" in err
    assert "parquet/csv/jsonl/arrow file as dataset:FILE:COLUMN" in err and "`atac-hf simulate" not in err


# repro_7 -------------------------------------------------------------------------------------

_GEMMA_LIKE = {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 18, "num_key_value_heads": 8,
               "intermediate_size": 11008, "vocab_size": 262144}


def test_tied_embeddings_count_one_matrix_and_can_fit():
    untied = ClusterConfig(model=_GEMMA_LIKE, hardware="H100")
    tied = ClusterConfig(model={**_GEMMA_LIKE, "tie_word_embeddings": True}, hardware="H100")
    assert tied.dims.tie_word_embeddings and not untied.dims.tie_word_embeddings
    lm_head = STATE_BYTES_PER_PARAM * 262144 * 4096
    assert untied.model_state_bytes_per_gpu() - tied.model_state_bytes_per_gpu() == lm_head
    assert untied.model_state_bytes_per_gpu() > 80e9 >= tied.model_state_bytes_per_gpu()  # the case matters
    assert any("model states" in r for r in untied.what_if_reasons())
    assert tied.what_if_reasons() == () and tied.runnable
    explicit_false = ClusterConfig(model={**_GEMMA_LIKE, "tie_word_embeddings": False}, hardware="H100")
    assert explicit_false.model_state_bytes_per_gpu() == untied.model_state_bytes_per_gpu()


def test_presets_stay_untied_and_their_memory_unchanged():
    for name, dims in MODEL_PRESETS.items():
        assert dims.tie_word_embeddings is False, name
        d = ClusterConfig(model=name)
        params = d.dims.num_layers * d.dims.params_per_layer + 2 * d.dims.vocab_size * d.dims.hidden_size
        assert d.model_state_bytes_per_gpu() == STATE_BYTES_PER_PARAM * params


def test_tied_embeddings_read_from_hf_configs():
    assert ModelDims.from_hf_config({**_GEMMA_LIKE, "tie_word_embeddings": True}).tie_word_embeddings is True
    assert ModelDims.from_hf_config(_GEMMA_LIKE).tie_word_embeddings is False  # not given: the larger estimate
    composite = {"model_type": "x", "tie_word_embeddings": True, "text_config": dict(_GEMMA_LIKE)}
    assert ModelDims.from_hf_config(composite).tie_word_embeddings is True  # the composite's flag
    inner = {"text_config": {**_GEMMA_LIKE, "tie_word_embeddings": False}, "tie_word_embeddings": True}
    assert ModelDims.from_hf_config(inner).tie_word_embeddings is False  # the text config's own flag first
    with pytest.raises(ValueError, match=r"the config's tie_word_embeddings='yes' is not a bool"):
        ModelDims.from_hf_config({**_GEMMA_LIKE, "tie_word_embeddings": "yes"})
    with pytest.raises(ValueError, match=r"ModelDims\.tie_word_embeddings must be a bool, got 1"):
        ModelDims(**{**dataclasses.asdict(MODEL_PRESETS["tiny"]), "tie_word_embeddings": 1})


def test_tied_dims_round_trip_through_profile_metadata(tmp_path):
    from atac_hf.sim.bench import _profile_dims
    from atac_hf.cost.profile import profile_metadata, profile_model_mismatch

    dims = ModelDims.from_hf_config({**_GEMMA_LIKE, "tie_word_embeddings": True})
    path = tmp_path / "tied.json"
    CostModel(linear_s_per_token=2e-6, attn_s_per_pair=2e-10, kv_bytes_per_token=16384.0).save(
        str(path), model=dataclasses.asdict(dims), tp_size=1)
    meta = profile_metadata(str(path))
    assert meta["model"]["tie_word_embeddings"] is True
    back = _profile_dims(str(path), meta["model"])
    assert back == dims and profile_model_mismatch(meta, dims) is None
    old = {k: v for k, v in meta["model"].items() if k != "tie_word_embeddings"}  # a profile from before the field
    assert _profile_dims(str(path), old) == dataclasses.replace(dims, tie_word_embeddings=False)
    assert ClusterConfig(model=dims).to_dict()["model"]["tie_word_embeddings"] is True

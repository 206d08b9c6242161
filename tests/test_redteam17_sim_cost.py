"""Red-team 17: the cost model, the simulator, the workloads and their CLI flags refuse hostile
arguments at the call, naming the value, the legal values and the setting."""

from __future__ import annotations

import argparse
import math
import os
import re
import warnings

import numpy as np
import pytest

from atac_hf import workloads as W
from atac_hf._argtypes import parse_float, parse_int, parse_tokens
from atac_hf.cli import main
from atac_hf.cost import CostModel, ModelDims, default_cost_model
from atac_hf.packing.validate import InputTypeError
from atac_hf.sim import ClusterConfig, balanced_step_time, forward_only, one_f_one_b, simulate
from atac_hf.sim.results import UnknownComboError

CM = default_cost_model()
HF = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
L = [100, 300, 2000, 50]
ATAC = [("wfap", "atp")]


@pytest.fixture(scope="module")
def cluster():
    return ClusterConfig(cp_size=2, max_tokens=4096, model="tiny")


@pytest.fixture(scope="module")
def atac_only(cluster):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(L, cluster, combos=ATAC, num_steps=1)


# ---------------------------------------------------------------- cost model
def test_hf_config_sizes_must_be_positive_ints_named_by_field():
    """red-team 17: a zero head count was a ZeroDivisionError, True layers read as 1 layer."""
    for field, bad in (("num_attention_heads", 0), ("num_hidden_layers", True), ("hidden_size", -64),
                       ("num_key_value_heads", -2), ("head_dim", 2.5), ("intermediate_size", "big"),
                       ("vocab_size", -1), ("head_dim", True)):
        with pytest.raises(ValueError, match=rf"the config's {field}={bad!r} is not a positive int .*model config"):
            ModelDims.from_hf_config({**HF, field: bad})
    with pytest.raises(ValueError, match=r"num_attention_heads=0 is not a positive int"):
        CostModel.from_model({**HF, "num_attention_heads": 0})
    # legal configs read as before: absent optional fields take their defaults
    dims = ModelDims.from_hf_config({**HF, "num_key_value_heads": None, "head_dim": 0})  # 0: unset (GLM-5)
    assert (dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.num_layers) == (4, 4, 16, 2)


def test_costmodel_replace_names_the_legal_fields():
    """red-team 17: replace(nope=1) was dataclasses' raw TypeError."""
    with pytest.raises(TypeError, match=r"unknown fields \['nope'\]; legal fields: \[.*'attn_s_per_pair'.*'tile'"):
        CM.replace(nope=1)
    assert CM.replace(tile=64).tile == 64


def test_doc_and_pack_cost_refuse_non_int_and_negative_lengths():
    """red-team 17: doc_cost([1.5]) was priced as 1 token; pack_cost of a negative length was 0."""
    with pytest.raises(TypeError, match=r"doc_cost lengths must be ints \(token counts\), got dtype float64 \(e\.g\. 1\.5\)"):
        CM.doc_cost([1.5])
    with pytest.raises(TypeError, match=r"got dtype bool"):
        CM.pack_cost([True])
    with pytest.raises(ValueError, match=r"pack_cost lengths\[1\] = -5 is negative: .*>= 0"):
        CM.pack_cost([3, -5])
    assert CM.doc_cost([]).shape == (0,)
    assert CM.doc_cost([5, 70]).tolist() == CM.segment_cost([0, 0], [5, 70]).tolist()
    assert CM.pack_cost(np.array([5, 70], np.int32)) == float(CM.segment_cost([0, 0], [5, 70]).sum())


def test_comm_cost_refuses_bad_cp_size_and_token_counts():
    """red-team 17: cp_size 0 or 2.5 and NaN token counts were priced."""
    for bad in (0, -2):
        with pytest.raises(ValueError, match=rf"cp_size={bad} is too small: cp_size must be an int >= 1"):
            CM.comm_cost([100], bad)
    for bad in (2.5, True, None):
        with pytest.raises(TypeError, match=rf"cp_size={bad!r} is not an int: cp_size must be an int >= 1"):
            CM.comm_cost([100], bad)
    with pytest.raises(ValueError, match=r"cp_size=0 is too small"):
        CM.a2a_comm_cost([100], 0)
    for bad in ([float("nan")], [1.0, float("inf")]):
        with pytest.raises(ValueError, match=rf"kv_tokens holds {bad[-1]}: kv_tokens must be finite token counts"):
            CM.comm_cost(bad, 2)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"kv_tokens={bad}: kv_tokens must be finite token counts"):
            CM.comm_cost(bad, 2)
    # legal calls as before: the scalar fast path and the array path agree, CP 1 costs nothing
    assert float(CM.comm_cost(100, 2)) == float(CM.comm_cost([100], 2)[0]) > 0
    assert CM.comm_cost(0, 2) == 0.0 and CM.comm_cost([100], 1).tolist() == [0.0]
    assert float(CM.comm_cost(100, np.int64(4))) == float(CM.comm_cost([100], 4)[0])


def test_a2a_pair_cost_refuses_what_is_not_a_square_matrix():
    """red-team 17: a2a_pair_cost(None) was an IndexError."""
    for bad in (None, [1, 2], [[1, 2, 3], [4, 5, 6]]):
        with pytest.raises(ValueError, match=r"a2a_pair_cost rows=.* must be a \(C, C\) array"):
            CM.a2a_pair_cost(bad)
    assert CM.a2a_pair_cost([[0, 10], [10, 0]]) > 0


def test_profile_path_errors_name_the_users_path(tmp_path):
    """red-team 17: from_profile(None) was os.fspath's TypeError; save() errors named its temp file."""
    with pytest.raises(TypeError, match=r"cost profile path must be a str or os\.PathLike .*got NoneType None"):
        CostModel.from_profile(None)
    missing = tmp_path / "no_such_dir" / "p.json"
    with pytest.raises(FileNotFoundError, match=rf"cannot save the cost profile to '{missing}': its folder .* does "
                                                "not exist; create it first"):
        CM.save(missing)
    with pytest.raises(IsADirectoryError, match=rf"cannot save the cost profile to '{tmp_path}': it is a directory; "
                                                "give a file name"):
        CM.save(tmp_path)
    assert os.listdir(tmp_path) == []  # nothing written, no temp file left
    CM.save(tmp_path / "ok.json")
    assert CostModel.from_profile(tmp_path / "ok.json") == CM


# ---------------------------------------------------------------- simulator
def test_simulate_refuses_bad_seeds(cluster):
    """red-team 17: simulate's seed is checked like the packers' (seed=True ran as seed 1)."""
    for bad in (1.5, None, True):
        with pytest.raises(InputTypeError, match=rf"seed={bad!r} is not an int: seed must be an int >= 0 \(set seed\)"):
            simulate(L, cluster, combos=ATAC, num_steps=1, seed=bad)
    with pytest.raises(ValueError, match=r"seed=-1 is invalid: it must be an int in \[0, 2\*\*63\) \(set seed\)"):
        simulate(L, cluster, combos=ATAC, num_steps=1, seed=-1)


def test_simulate_packing_options_are_checked(cluster):
    """red-team 17: reserved keys were 'got multiple values', unknown ones 'unexpected keyword'."""
    with pytest.raises(ValueError, match=r"packing_options sets \['max_tokens'\], which the simulator sets itself.*"
                                         r"legal packing_options keys: \[.*'max_defer'"):
        simulate(L, cluster, combos=ATAC, num_steps=1, packing_options={"max_tokens": 10})
    with pytest.raises(ValueError, match=r"packing_options has unknown keys 'nope': legal keys .*'overlength'"):
        simulate(L, cluster, combos=ATAC, num_steps=1, packing_options={"nope": 1})
    with pytest.raises(InputTypeError, match=r"packing_options='abc' is not a dict"):
        simulate(L, cluster, combos=ATAC, num_steps=1, packing_options="abc")
    with pytest.raises(ValueError, match=r"max_defer"):  # a bad value: PackingConfig's refusal, before any work
        simulate(L, cluster, combos=ATAC, num_steps=1, packing_options={"max_defer": -1})


def test_simulate_takes_packing_plus_sharding_labels(cluster, atac_only):
    """red-team 17: combos=['wfap+atp'] was 'unknown combination ('w', 'f', ...)'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(L, cluster, combos=["wfap+atp"], num_steps=1)
    assert list(res.combos) == ["ATAC"] and res.combos["ATAC"].throughput == atac_only.combos["ATAC"].throughput
    with pytest.raises(ValueError, match=r"is given twice in combos"):
        simulate(L, cluster, combos=["ATAC", ("wfap", "atp")], num_steps=1)
    with pytest.raises(ValueError, match=r"unknown sharding 'nope'"):
        simulate(L, cluster, combos=["wfap+nope"], num_steps=1)
    with pytest.raises(ValueError, match=r"combos entry 5 is neither a \(packing, sharding\) pair nor a name"):
        simulate(L, cluster, combos=[5], num_steps=1)
    with pytest.raises(ValueError, match=r"combos entry 'named' must be one combination"):
        simulate(L, cluster, combos=["named"], num_steps=1)


def test_simulate_refuses_a_progress_without_update(cluster):
    """red-team 17: progress=5 was an AttributeError after the first packer ran."""
    with pytest.raises(InputTypeError, match=r"progress=5 has no update\(n\) method"):
        simulate(L, cluster, combos=ATAC, num_steps=1, progress=5)


def test_simulate_names_bad_lengths_at_the_users_position(cluster):
    """red-team 17: a bad length was named at its position in the shuffled stream; uint64 2**64-1 as -1."""
    with pytest.raises(ValueError, match=r"lengths\[0\] = 4611686018427387904 is too long"):
        simulate([2**62, 5], cluster, combos=ATAC, num_steps=1)
    with pytest.raises(ValueError, match=r"lengths\[0\] = 18446744073709551615 is too long"):
        simulate(np.array([2**64 - 1, 5], dtype=np.uint64), cluster, combos=ATAC, num_steps=1)
    with pytest.raises(ValueError, match=r"lengths\[2\] = 0: workload lengths must be a non-empty 1-D array of "
                                         r"ints >= 1"):
        simulate([5, 7, 0], cluster, combos=ATAC, num_steps=1)
    with pytest.raises(InputTypeError, match=r"lengths\[1\] = 2\.5 is not an int"):
        simulate([5, 2.5], cluster, combos=ATAC, num_steps=1)


def test_simresult_labels_and_strongest_baseline(atac_only):
    """red-team 17: speedup of an unknown label was a bare KeyError, strongest_baseline 'max() arg is empty'."""
    with pytest.raises(UnknownComboError, match=r"no combination 'nope' in this result: legal labels \['ATAC'\]"):
        atac_only.speedup("nope", "ATAC")
    with pytest.raises(KeyError):  # still a KeyError, as documented before
        atac_only.speedup("ATAC", "HF default")
    assert atac_only.speedup("wfap+atp", "ATAC") == 1.0
    assert math.isnan(atac_only.speedup_or_nan("ATAC", "HF default"))
    with pytest.raises(ValueError, match=r"no baseline in this result: only \['ATAC'\] ran .*simulate another "
                                         r"combination beside 'ATAC'"):
        atac_only.strongest_baseline()


def test_schedules_refuse_non_finite_times(cluster):
    """red-team 17: NaN times were 'AssertionError: 1F1B schedule deadlocked (internal error)'."""
    with pytest.raises(ValueError, match=r"finite and >= 0 seconds: fwd_PM holds nan"):
        one_f_one_b([[float("nan")]], [[1.0]])
    with pytest.raises(ValueError, match=r"finite and >= 0 seconds: bwd_PM holds -1\.0"):
        one_f_one_b([[1.0]], [[-1.0]])
    with pytest.raises(ValueError, match=r"finite and >= 0 seconds: fwd_PM holds inf"):
        forward_only([[float("inf")]])
    with pytest.raises(ValueError, match=r"p2p_M holds nan"):
        one_f_one_b([[1.0]], [[1.0]], float("nan"))
    assert one_f_one_b([[1.0]], [[2.0]]).makespan == 3.0


def test_balanced_step_time_checks_its_arguments(cluster):
    """red-team 17: num_micro_batches 0, -3, 2.5 and timing='nope' were accepted, NaN work deadlocked."""
    good = balanced_step_time(cluster, 1.0, 100, 1)
    with pytest.raises(ValueError, match=r"work_s=nan is invalid: work_s must be a finite number of seconds >= 0"):
        balanced_step_time(cluster, float("nan"), 100, 1)
    with pytest.raises(ValueError, match=r"tokens=-1 is invalid"):
        balanced_step_time(cluster, 1.0, -1, 1)
    for bad in (0, -3):
        with pytest.raises(ValueError, match=rf"num_micro_batches={bad} is invalid: num_micro_batches must be an int >= 1"):
            balanced_step_time(cluster, 1.0, 100, bad)
    with pytest.raises(InputTypeError, match=r"num_micro_batches=2\.5 is not an int"):
        balanced_step_time(cluster, 1.0, 100, 2.5)
    with pytest.raises(ValueError, match=r"timing='nope' is invalid: legal values are 'schedule' and 'formula'"):
        balanced_step_time(cluster, 1.0, 100, 1, timing="nope")
    with pytest.raises(InputTypeError, match=r"cluster='x' is not a ClusterConfig"):
        balanced_step_time("x", 1.0, 100, 1)
    with pytest.raises(ValueError, match=r"phi=1\.5 is invalid"):
        balanced_step_time(cluster, 1.0, 100, 1, phi=1.5)
    assert balanced_step_time(cluster, 1.0, 100, np.int64(1)) == good


# ---------------------------------------------------------------- workloads
def test_workload_seeds_are_checked():
    """red-team 17: seed=1.5 drew seed 1's lengths, seed=True seed 1's, -1 and None numpy's errors."""
    for bad in (1.5, None, True):
        with pytest.raises(InputTypeError, match=rf"seed={bad!r} is not an int: seed must be an int >= 0 \(set seed\)"):
            W.load_workload("longtail", num_samples=3, seed=bad)
    with pytest.raises(ValueError, match=r"seed=-1 is invalid"):
        W.make_workload("sft", 3, seed=-1)
    with pytest.raises(ValueError, match=r"seed=-1 is invalid"):
        W.load_workload("wlbllm", seed=-1)
    assert (W.make_workload("sft", 3, seed=np.int64(1)) == W.make_workload("sft", 3, seed=1)).all()


def test_builtin_generators_check_their_arguments():
    """red-team 17: max_len=-1 drew lengths of -1, max_len=0 zeros, None samples one length."""
    for f in (W.longtail_lengths, W.sft_lengths, W.uniform_lengths):
        for bad in (0, -1):
            with pytest.raises(ValueError, match=rf"max_len={bad} is invalid: max_len must be an int from 1 to"):
                f(5, max_len=bad)
        with pytest.raises(ValueError, match=r"num_samples=-1 is invalid: num_samples must be an int from 0 to"):
            f(-1)
        with pytest.raises(InputTypeError, match=r"num_samples=None is not an int"):
            f(None)
        with pytest.raises(InputTypeError, match=r"max_len=2\.5 is not an int"):
            f(5, max_len=2.5)
        assert len(f(4, seed=3)) == 4 and (f(4, seed=3) == f(4, seed=3)).all()


def test_describe_lengths_refuses_bad_lengths():
    """red-team 17: negative and fractional lengths were described."""
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1 is negative"):
        W.describe_lengths([-1, 5])
    with pytest.raises(InputTypeError, match=r"lengths\[0\] = 1\.5 is not an int"):
        W.describe_lengths([1.5, 2.0])
    assert W.describe_lengths([1, 5])["tokens"] == 6


def test_sample_stream_refuses_zeros_and_bad_token_counts():
    """red-team 17: sample_stream([0, 0], 10) never ended (memory grew); 2.5 tokens were accepted."""
    with pytest.raises(ValueError, match=r"every one of the 2 lengths is 0: sample_stream needs a sample of >= 1 token"):
        W.sample_stream(np.array([0, 0]), 10)
    assert W.sample_stream(np.array([0, 3]), 10).sum() >= 10  # zeros among others are cycled past, as before
    with pytest.raises(ValueError, match=r"num_tokens=0 is invalid: num_tokens must be an int >= 1"):
        W.sample_stream(np.array([1, 2, 3]), 0)
    with pytest.raises(InputTypeError, match=r"num_tokens=2\.5 is not an int"):
        W.sample_stream(np.array([1, 2, 3]), 2.5)
    with pytest.raises(ValueError, match=r"seed=-1 is invalid"):
        W.sample_stream(np.array([1, 2, 3]), 5, seed=-1)
    out = W.sample_stream(np.array([1, 2, 3]), 10, seed=4)
    assert out.sum() >= 10 and (out == W.sample_stream([1, 2, 3], 10, seed=4)).all()


# ---------------------------------------------------------------- CLI flags
def test_int_and_token_flags_take_ascii_digits_only():
    """red-team 17: argparse's int took '٢' (Arabic-Indic two) for --cp and the like."""
    assert parse_int("8") == 8 and parse_int(" -3 ") == -3 and parse_tokens("32K") == 32768
    for bad in ("\u0662", "1\u0660", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"is not an int \(ASCII digits, e\.g\. 8\)"):
            parse_int(bad)
    with pytest.raises(argparse.ArgumentTypeError, match=r"is not a token count"):
        parse_tokens("1\u0660\u0660")
    assert parse_float("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match="'\u0660\\.5' is not a number \\(ASCII digits"):
        parse_float("\u0660.5")


@pytest.mark.parametrize("argv, flag", [
    (["simulate", "--cp", "\u0662"], "--cp"), (["simulate", "--seed", "\u0663"], "--seed"),
    (["simulate", "--eval-attn-scale", "\u0661,2"], "--eval-attn-scale"),
    (["simulate", "--efficiency", "\u0660.5"], "--efficiency"), (["bench", "--workers", "\u0662"], "--workers"),
    (["calibrate", "--tp-size", "\u0662"], "--tp-size"), (["calibrate", "--seed", "\u0662"], "--seed"),
])
def test_sim_and_calibrate_flags_refuse_non_ascii_digits(argv, flag, capsys):
    """red-team 17: the simulate, bench and calibrate int flags refuse non-ASCII digits."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    # (argparse names a flag with its aliases: "argument --cp/--cp-size: ")
    assert e.value.code == 2 and re.search(rf"argument {flag}(/--[a-z-]+)*: ", capsys.readouterr().err)


def test_simulate_cli_seed_range_is_packs(capsys):
    """red-team 17: simulate --seed 2**64 ran while pack refuses seeds >= 2**63."""
    assert main(["simulate", "--steps", "1", "--dp", "1", "--pp", "1", "--cp", "2", "--max-tokens", "4K",
                 "--combos", "named", "--seed", str(2**63)]) == 2
    assert "--seed=9223372036854775808 must be from 0 to 9223372036854775807" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["simulate", "bench"])
def test_eval_attn_scale_refuses_a_repeated_ratio(cmd, capsys):
    """A repeated --eval-attn-scale ratio (1,1 or 1,1.0) reported the same run twice; it is refused, naming
    the flag."""
    with pytest.raises(SystemExit) as e:
        main([cmd, "--eval-attn-scale", "1,1.0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --eval-attn-scale: '1,1.0' repeats a ratio" in err

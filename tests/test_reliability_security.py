"""Reliability: loading configs, profiles and states never executes code, and paths are
validated with clear errors (issue #6, item 6)."""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _reliability  # noqa: E402
from _reliability import count  # noqa: E402

from atac_hf.cost import CostModel, default_cost_model
from atac_hf.integrations import ATACConfig
from atac_hf.workloads import load_lengths

PACKAGE = Path(__file__).resolve().parents[1] / "atac_hf"


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    _reliability.flush(__name__)


class _Exploit:  # what a pickle payload would run
    def __reduce__(self):
        return (os.system, ("touch /nonexistent-atac-pwned",))


@pytest.mark.parametrize("payload", [
    "cp_size: !!python/object/apply:os.system ['echo pwned > {marker}']\n",
    "!!python/object/new:os.system ['echo pwned > {marker}']\n",
    "atac:\n  debug: !!python/name:os.system\n",
    "cp_size: !!python/object:builtins.int {{}}\n",
])
def test_yaml_with_python_tags_is_refused_and_runs_nothing(tmp_path, payload):
    marker = tmp_path / "pwned"
    cfg = tmp_path / "atac.yaml"
    cfg.write_text(payload.format(marker=marker))
    for load in (lambda: ATACConfig.from_yaml(cfg), lambda: ATACConfig.from_sources(cfg, environ={}),
                 lambda: ATACConfig.from_sources(environ={"ATAC_CONFIG": str(cfg)})):
        with pytest.raises(ValueError, match="is not valid YAML"):
            load()
        count("security.code_refused")
    assert not marker.exists(), "a YAML tag executed code"


def test_binary_and_pickled_files_are_refused(tmp_path):
    blob = pickle.dumps(_Exploit())
    for name in ("atac.yaml", "atac.json"):
        path = tmp_path / name
        path.write_bytes(blob)
        with pytest.raises(ValueError, match="is not valid (YAML|JSON)"):
            ATACConfig.from_yaml(path)
        count("security.code_refused")
    prof = tmp_path / "profile.json"
    prof.write_bytes(blob)
    with pytest.raises(ValueError, match="is not valid JSON"):
        CostModel.from_profile(prof)
    lens = tmp_path / "lengths.json"
    lens.write_bytes(blob)
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_lengths(lens)
    count("security.code_refused", 2)
    assert not os.path.exists("/nonexistent-atac-pwned")


def test_profiles_and_configs_with_unknown_fields_are_refused(tmp_path):
    good = default_cost_model().to_dict(device="cpu")
    cases = [
        ({**good, "cost_model": {**good["cost_model"], "__class__": "os.system"}}, "unknown fields \\['__class__'\\]"),
        ({**good, "cost_model": {**good["cost_model"], "linear_s_per_tokn": 1.0}}, "unknown fields"),
        ({**good, "on_load": "rm -rf /"}, "unknown top-level keys \\['on_load'\\]"),
        ({**good, "format": "pickle"}, "has format 'pickle'"),
        ({**good, "cost_model": {**good["cost_model"], "tile": "128"}}, "CostModel.tile must be an int"),
        ([1, 2, 3], "must be a JSON object"),
    ]
    for i, (data, match) in enumerate(cases):
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=match):
            CostModel.from_profile(path)
        count("security.unknown_fields_refused")
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(good))
    assert CostModel.from_profile(ok) == default_cost_model()
    cfg = tmp_path / "atac.json"
    cfg.write_text(json.dumps({"cp_size": 2, "cp_sise": 3}))
    with pytest.raises(ValueError, match=r"unknown ATAC config keys \['cp_sise'\]"):
        ATACConfig.from_yaml(cfg)
    cfg.write_text(json.dumps({"packing_options": {"max_deferr": 3}}))
    with pytest.raises(ValueError, match=r"unknown packing config keys \['max_deferr'\]"):
        ATACConfig.from_yaml(cfg)
    count("security.unknown_fields_refused", 2)


def test_paths_from_configs_are_validated(tmp_path):
    missing, folder = tmp_path / "nope.json", tmp_path / "adir.json"
    folder.mkdir()
    for bad in (missing, folder):
        with pytest.raises(ValueError, match="does not exist or is not a file"):
            ATACConfig(cost_profile=str(bad))
        with pytest.raises(ValueError, match="does not exist or is not a file"):
            ATACConfig.from_yaml(bad)
        with pytest.raises(ValueError, match="does not exist or is not a file"):
            ATACConfig.from_sources(environ={"ATAC_CONFIG": str(bad)})
        with pytest.raises(ValueError, match="does not exist|is a directory"):
            CostModel.from_profile(bad)
        with pytest.raises(ValueError, match="does not exist|is a directory"):
            load_lengths(bad)
        count("security.paths_checked", 5)
    cfg = tmp_path / "atac.yaml"
    cfg.write_text("cost_profile: profiles/missing.json\n")  # relative: resolved against the config's folder
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "profiles" / "missing.json"))):
        ATACConfig.from_yaml(cfg)
    with pytest.raises(TypeError, match="cost_profile must be a path"):
        ATACConfig(cost_profile=123)
    count("security.paths_checked", 2)


def test_collective_timeout_setting_is_validated():
    assert ATACConfig.from_env({"ATAC_COLLECTIVE_TIMEOUT_S": "7.5"}).collective_timeout_s == 7.5
    assert ATACConfig.from_env({"ATAC_COLLECTIVE_TIMEOUT_S": "none"}).collective_timeout_s is None
    for bad in (0, -1, True, "5", float("inf"), float("nan")):
        with pytest.raises(ValueError, match="collective_timeout_s=.* must be None or a number of seconds > 0"):
            ATACConfig(collective_timeout_s=bad)
    with pytest.raises(ValueError, match="ATAC_COLLECTIVE_TIMEOUT_S='soon' is not a number of seconds"):
        ATACConfig.from_env({"ATAC_COLLECTIVE_TIMEOUT_S": "soon"})
    count("security.settings_checked", 8)


def test_the_package_never_unpickles_or_evaluates():
    """Static guard: no pickle/marshal/shelve, no torch.load, no unsafe yaml, no eval/exec in atac_hf."""
    # eval/exec as builtins only: a method of that name (torch's Module.eval()) evaluates no code
    banned = re.compile(r"\bimport pickle\b|\bpickle\.|\bmarshal\.|\bshelve\.|\btorch\.load\(|yaml\.load\(|"
                        r"yaml\.unsafe_load|yaml\.full_load|(?<!\.)\beval\(|(?<!\.)\bexec\(|\bbuiltins\.(eval|exec)\(|"
                        r"__import__\(")
    assert all(banned.search(x) for x in ("eval(s)", "x = exec(code)", "builtins.eval(s)", "builtins.__import__('os')",
                                          "yaml.load(f)"))
    assert not banned.search("model.eval()")
    hits = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}" for p in sorted(PACKAGE.rglob("*.py"))
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if banned.search(line)]
    assert not hits, hits
    count("security.files_scanned", len(list(PACKAGE.rglob("*.py"))))


# ---------------------------------------------------------------------------- bounded loading (issue 13, item 2)
def _laughs(levels: int = 9) -> str:
    """Billion laughs: 9 levels of 9 aliases each stand for 9**9 (387M) strings in ~400 bytes."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    lines.append(f"cost_preset: [{', '.join([f'*l{levels - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _hostile_configs(tmp_path) -> list[tuple[Path, str]]:
    from atac_hf.integrations.config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH

    cases = [
        ("laughs.yaml", _laughs(), "YAML aliases are not allowed"),
        ("one_alias.yaml", "packing_options: &o {overlength: split}\natac_extra: *o\n", "aliases are not allowed"),
        ("comments.yaml", "# " + "x" * 1000 + "\n", None),  # written below at over the cap
        ("deep_block.yaml", "".join("  " * i + f"k{i}:\n" for i in range(MAX_CONFIG_DEPTH + 4)) + "  " * 30 + "x: 1\n",
         "nesting deeper than"),
        ("deep_flow.yaml", "cp_size: " + "[" * 5000 + "]" * 5000 + "\n", "not valid YAML"),
        ("deep.json", '{"cp_size": ' + "[" * 5000 + "]" * 5000 + "}", "nests 5001 levels deep|nesting 5001 levels"),
        ("mixed_keys.yaml", "cp_size: 2\n1: 3\n", r"non-string keys \[1\]"),
        ("nested_keys.yaml", "packing_options: {1: 2, max_defer: 3}\n", r"non-string keys \[1\]"),
        ("bool_key.yaml", "true: 1\n", r"non-string keys \[True\]"),
        ("null_key.yaml", "~: 1\n", r"non-string keys \[None\]"),
    ]
    out = []
    for name, text, match in cases:
        path = tmp_path / name
        if name == "comments.yaml":  # the 200 MB file of comments, cut to just over the cap
            text = text * (MAX_CONFIG_BYTES // len(text) + 1)
            match = f"more than {MAX_CONFIG_BYTES}"
        path.write_text(text)
        out.append((path, match))
    return out


def test_hostile_config_files_are_refused_without_expanding_them(tmp_path):
    """Aliases (billion laughs), files over the size cap, deep nesting, non-string keys: each a
    ValueError naming the file, from every entry point, with a short message."""
    for path, match in _hostile_configs(tmp_path):
        for load in (lambda: ATACConfig.from_yaml(path), lambda: ATACConfig.from_sources(path, environ={}),
                     lambda: ATACConfig.from_sources(environ={"ATAC_CONFIG": str(path)})):
            with pytest.raises(ValueError, match=match) as info:
                load()
            assert str(path) in str(info.value) and len(str(info.value)) < 1000, (path.name, str(info.value)[:300])
            count("security.hostile_config_refused")


def test_devices_pipes_and_directories_are_never_read_as_configs(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it would block until a writer came
    for bad in ("/dev/zero", "/dev/urandom", str(fifo), str(tmp_path)):
        with pytest.raises(ValueError, match="does not exist or is not a file"):
            ATACConfig.from_yaml(bad)
        with pytest.raises(ValueError, match="does not exist or is not a file"):
            ATACConfig(cost_profile=bad)
        count("security.paths_checked", 2)
    for bad in ("/dev/zero", str(fifo)):  # the JSON loaders (profiles, lengths) refuse them too
        with pytest.raises(ValueError, match="not a regular file"):
            CostModel.from_profile(bad)
        with pytest.raises(ValueError, match="not a regular file"):
            load_lengths(bad)
        count("security.paths_checked", 2)


def test_error_messages_never_print_huge_values(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("cost_preset: [" + ", ".join(["1"] * 10_000) + "]\n")  # 30 KB: under the size cap
    with pytest.raises(ValueError, match=r"unknown cost_preset \[1, 1, 1, 1, 1, 1, 1, 1, \.\.\.\]") as info:
        ATACConfig.from_yaml(big)
    assert len(str(info.value)) < 400
    cases = [
        (dict(cost_preset="x" * 10**6), r"unknown cost_preset 'x+\.\.\.x+'"),
        (dict(sharding_strategy=["ring"] * 10**5), r"unknown sharding_strategy \['ring', .*\.\.\.\]"),
        (dict(sharding_strategy={"a": 1}), r"unknown sharding_strategy \{'a': 1\}"),  # unhashable: no TypeError
        (dict(cp_size=10**5000), r"cp_size=<int> must be an int >= 1"),  # no 4300-digit repr error either
        (dict(packing_options={1: 2, "a": 3}), r"packing_options keys must be strings"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match) as info:
            ATACConfig(**kwargs)
        assert len(str(info.value)) < 400, str(info.value)[:400]
        count("security.settings_checked")
    env = [({"ATAC_CP_SIZE": "9" * 5000}, "ATAC_CP_SIZE='9+\\.\\.\\.9+' is not an integer"),
           ({"ATAC_PACKING_OPTIONS": "[" * 100_000}, "ATAC_PACKING_OPTIONS must be a JSON object"),
           ({"ATAC_DEBUG": "y" * 10**5}, "ATAC_DEBUG='y+\\.\\.\\.y+' is not a boolean")]
    for environ, match in env:
        with pytest.raises(ValueError, match=match) as info:
            ATACConfig.from_env(environ)
        assert len(str(info.value)) < 400
        count("security.settings_checked")


def test_numbers_out_of_range_are_refused():
    from atac_hf.sharding import MAX_CP_SIZE

    for bad in (2**70, MAX_CP_SIZE + 1, 10**7, 0, True, 2.0):
        with pytest.raises(ValueError, match="cp_size=.* must be an int >= 1 and <= 4096"):
            ATACConfig(cp_size=bad)
    assert ATACConfig(cp_size=MAX_CP_SIZE).cp_size == MAX_CP_SIZE
    import numpy as np

    cfg = ATACConfig(cp_size=np.int64(2), max_tokens=np.int32(64), collective_timeout_s=np.float32(5.0))
    assert (type(cfg.cp_size), type(cfg.max_tokens), type(cfg.collective_timeout_s)) == (int, int, float)
    for bad in (1e300, 1e-320, 0.5, 86_401, 2**70):
        with pytest.raises(ValueError, match=r"collective_timeout_s=.* must be None or a number of seconds > 0, "
                                             r"from 1 to 86400"):
            ATACConfig(collective_timeout_s=bad)
    for raw in ("1e-320", "1e300", "1e400", "0.001"):
        with pytest.raises(ValueError, match="collective_timeout_s=.* from 1 to 86400"):
            ATACConfig.from_env({"ATAC_COLLECTIVE_TIMEOUT_S": raw})
    assert ATACConfig(collective_timeout_s=1).collective_timeout_s == 1.0
    assert ATACConfig(collective_timeout_s=86_400).collective_timeout_s == 86_400.0
    for name in ("max_tokens_per_rank", "min_chunk", "window_size"):
        with pytest.raises(ValueError, match=f"{name}=.* must be None or an int >= 1 and <= 2\\*\\*62"):
            ATACConfig(**{name: 2**70})
    for name in ("shuffle", "debug"):
        with pytest.raises(TypeError, match=f"{name}=1 must be True or False"):
            ATACConfig(**{name: 1})
    count("security.settings_checked", 24)


def test_cost_models_refuse_bools_absurd_prices_and_zero_profiles(tmp_path):
    good = default_cost_model()
    for field in ("linear_s_per_token", "attn_s_per_pair", "segment_overhead_s", "kv_bytes_per_token",
                  "link_latency_s", "link_bandwidth", "tile", "mask_block", "sliding_window",
                  "masked_attn_s_per_pair", "masked_segment_overhead_s"):
        for bad in (True, np_bool(), float("inf"), 1e300, -1, "1"):
            with pytest.raises(ValueError, match=f"CostModel.{field} must be"):
                good.replace(**{field: bad})
            count("security.settings_checked")
    for kwargs, match in ((dict(efficiency=True), "efficiency must be in"), (dict(attn_efficiency=float("nan")),
                           "attn_efficiency must be in"), (dict(tp_size=True), "tp_size must be an int"),
                          (dict(dtype_bytes=2.5), "dtype_bytes must be an int"), (dict(tile=True), "CostModel.tile")):
        with pytest.raises(ValueError, match=match):
            CostModel.from_model("8b", "H100", **kwargs)
        count("security.settings_checked")
    zero = good.replace(linear_s_per_token=0.0, attn_s_per_pair=0.0, segment_overhead_s=0.0)
    assert not zero.prices_compute  # allowed as an object (costing communication alone) ...
    path = tmp_path / "zero.json"
    zero.save(path)
    with pytest.raises(ValueError, match="prices all work at 0 s"):  # ... but never loaded as a profile
        CostModel.from_profile(path)
    from atac_hf.sharding import plan_shards

    with pytest.raises(ValueError, match="prices all work at 0 s"):  # ... nor planned with
        plan_shards([100, 8], 2, cost_model=zero)
    count("security.settings_checked", 2)


@pytest.mark.parametrize("strategy", ["wfap", "sequential", "bfd", "wlb"])
def test_packers_refuse_cost_models_that_price_whole_documents_at_zero(strategy):
    # pack_lengths raised a bare ZeroDivisionError (found by the nineteenth mutation pass's review):
    # every packer's unit is a reference document's cost per token
    from atac_hf.packing import PackedIterableDataset, PackingConfig, StreamPacker, WFAPBatchSampler, pack_lengths

    good = default_cost_model()
    zero = good.replace(linear_s_per_token=0.0, attn_s_per_pair=0.0, segment_overhead_s=0.0)
    chunks_only = zero.replace(masked_attn_s_per_pair=1e-12)  # priced work, but no whole document costs anything
    cfg = PackingConfig(max_tokens=10, packs_per_window=2, strategy=strategy)
    for model, match in ((zero, r"prices all work at 0 s.*check the packer's cost_model"),
                         (chunks_only, r"prices a whole document of 10 tokens \(reference_doc_tokens\) at 0\.0 s.*"
                                       r"linear_s_per_token, attn_s_per_pair or segment_overhead_s must be > 0")):
        for build in (lambda: pack_lengths([6, 6, 6], cfg, model), lambda: StreamPacker(cfg, model),
                      lambda: WFAPBatchSampler([6, 6, 6], cfg, cost_model=model),  # at construction, not at
                      lambda: PackedIterableDataset([{"input_ids": [1] * 6}] * 3, cfg, cost_model=model)):  # the 1st pack
            with pytest.raises(ValueError, match=match):
                build()
    # a sliding window makes whole documents past it masked work, which chunks_only prices: accepted
    windowed = chunks_only.replace(sliding_window=4)
    assert sum(len(p) for p in pack_lengths([6, 6, 6], cfg, windowed).packs) == 3


def np_bool():
    import numpy as np

    return np.bool_(True)

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
    banned = re.compile(r"\bimport pickle\b|\bpickle\.|\bmarshal\.|\bshelve\.|\btorch\.load\(|yaml\.load\(|"
                        r"yaml\.unsafe_load|yaml\.full_load|\beval\(|\bexec\(|__import__\(")
    hits = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}" for p in sorted(PACKAGE.rglob("*.py"))
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if banned.search(line)]
    assert not hits, hits
    count("security.files_scanned", len(list(PACKAGE.rglob("*.py"))))

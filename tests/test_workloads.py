"""Workload sources: the shipped wlbllm sample, length files (plain and gzip), and bounded,
clear JSON loading."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from atac_hf import _io
from atac_hf.workloads import SAMPLES, load_lengths, load_workload, sample_path, workload_name


def test_shipped_wlbllm_sample_has_its_documented_shape():
    a = load_workload("wlbllm")
    assert a.size == 99_519 and int(a.sum()) == 394_273_078
    assert int(np.median(a)) == 3227 and int(a.max()) == 124_913
    assert os.path.exists(sample_path("wlbllm")) and workload_name("wlbllm") == "wlbllm"
    readme = os.path.join(os.path.dirname(sample_path("wlbllm")), "README.md")
    assert "Apache" in open(readme, encoding="utf-8").read()  # the source and licence are credited


def test_length_files_plain_and_gzip(tmp_path):
    plain, packed = tmp_path / "l.json", tmp_path / "l.json.gz"
    plain.write_text("[3, 0, 5]")
    with gzip.open(packed, "wt") as f:
        json.dump([3, 0, 5], f)
    assert load_lengths(plain).tolist() == load_lengths(packed).tolist() == [3, 0, 5]
    assert load_workload(str(packed)).tolist() == [3, 5]  # zeros dropped
    assert workload_name(str(packed)) == "l"


def test_unknown_workload_names_every_kind_of_source():
    with pytest.raises(ValueError, match=r"unknown workload 'nope'.*built-ins.*shipped samples \['wlbllm'\]"):
        load_workload("nope")
    with pytest.raises(ValueError, match="unknown length sample"):
        sample_path("nope")
    assert set(SAMPLES) == {"wlbllm"}


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_load_json_refuses_devices_at_once():
    with pytest.raises(ValueError, match="not a regular file.*check --lengths"):
        load_lengths("/dev/zero")


def test_load_json_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        _io.load_json(fifo, "lengths file", "--lengths")  # never blocks waiting for a writer


def test_load_json_bounds_size_and_depth(tmp_path, monkeypatch):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nests 100000 levels deep, more than 32"):
        _io.load_json(deep, "cost profile", "cost_profile")
    big = tmp_path / "big.json"
    big.write_text("[" + ",".join(["1"] * 1000) + "]")
    monkeypatch.setattr(_io, "MAX_JSON_BYTES", 100)
    with pytest.raises(ValueError, match="more than 100 bytes.*MAX_JSON_BYTES"):
        _io.load_json(big, "lengths file", "--lengths")
    gz = tmp_path / "bomb.json.gz"
    with gzip.open(gz, "wt") as f:  # small on disk, large once decompressed
        f.write("[" + "0," * 10_000 + "0]")
    with pytest.raises(ValueError, match="more than 100 bytes"):
        _io.load_json(gz, "lengths file", "--lengths")


def test_load_json_depth_ignores_brackets_inside_strings(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"metadata": {"note": "[" * 100 + '\\"' + "{" * 50}, "x": [[1]]}))
    assert _io.load_json(p, "cost profile", "cost_profile")["x"] == [[1]]


def test_load_json_errors_name_the_setting(tmp_path):
    with pytest.raises(ValueError, match="does not exist.*check --lengths"):
        load_lengths(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="is a directory"):
        load_lengths(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_lengths(bad)
    gzbad = tmp_path / "bad.json.gz"
    gzbad.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="cannot be read"):
        load_lengths(gzbad)

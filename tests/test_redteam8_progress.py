"""Red-team 8, progress and stale state: ``pack_lengths(progress=...)``, ``atac-hf pack --progress``,
and the warning of a ``PackedIterableDataset`` whose state lives in a DataLoader worker."""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import re
import warnings

import numpy as np
import pytest

from atac_hf.packing import PackingConfig, PackResult, cli, pack_lengths
from atac_hf.packing import stream as stream_mod
from atac_hf.workloads import make_workload

pytestmark = pytest.mark.filterwarnings("ignore:.*longer than max_tokens:UserWarning")  # split samples: expected

BAR = re.compile(r"pack_lengths: .*\d+/\d+ \[")  # tqdm's "desc: 100%|...| n/total [elapsed..."


def _lengths(n: int = 3000) -> np.ndarray:
    return make_workload("longtail", n, seed=3)


def _same(a: PackResult, b: PackResult) -> None:
    assert a.packs == b.packs and a.deferred == b.deferred
    assert a.pack_window == b.pack_window and a.arrival == b.arrival
    assert json.dumps(a.metrics, sort_keys=True) == json.dumps(b.metrics, sort_keys=True)


# ---------------------------------------------------------------- pack_lengths(progress=...)
def test_pack_lengths_silent_by_default(capfd):
    pack_lengths(_lengths(), max_tokens=16384, packs_per_window=8)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_pack_lengths_progress_bar_on_stderr(capsys):
    lengths = _lengths()
    pack_lengths(lengths, max_tokens=16384, packs_per_window=8, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    assert BAR.search(err), err[-300:]
    assert f"{lengths.size}/{lengths.size}" in err  # the bar counts every sample


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("strategy", ["wfap", "bfd"])
def test_pack_lengths_progress_changes_nothing(capsys, window, strategy):
    lengths = _lengths()
    config = PackingConfig(max_tokens=16384, packs_per_window=8, strategy=strategy)
    plain = pack_lengths(lengths, config, window=window)
    assert len(plain.packs) > 8 and len(set(plain.pack_window)) > 2  # not a trivial case
    assert plain.deferred or strategy != "wfap"
    _same(plain, pack_lengths(lengths, config, window=window, progress=True))
    _same(plain, pack_lengths(lengths, config, window=window, progress=False))
    # progress is not a packing setting: by-name settings still go over the config, or make one
    _same(plain, pack_lengths(lengths, max_tokens=16384, packs_per_window=8, strategy=strategy, window=window,
                              progress=True))
    _same(plain, pack_lengths(lengths, PackingConfig(max_tokens=16384, packs_per_window=3, strategy=strategy),
                              window=window, progress=np.bool_(True), packs_per_window=8))
    capsys.readouterr()


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 1.0])
def test_pack_lengths_progress_must_be_bool(bad):
    with pytest.raises(TypeError, match=r"pack_lengths: progress=.* must be True or False \(set progress"):
        pack_lengths([10, 20], max_tokens=64, progress=bad)


def test_pack_lengths_unknown_setting_still_named():
    with pytest.raises(TypeError, match=r"unknown packing setting\(s\) \['progres'\]"):
        pack_lengths([10, 20], max_tokens=64, progres=True)


def test_pack_result_import_paths():
    from atac_hf import packing
    from atac_hf.packing.result import PackResult as moved

    assert stream_mod.PackResult is moved is packing.PackResult is PackResult
    assert "PackResult" in stream_mod.__all__ and "PackResult" in packing.__all__


# ---------------------------------------------------------------- atac-hf pack --progress
def _run_pack(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="atac-hf")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pack", *argv])
    return args.func(args)


_ARGS = ["--workload", "longtail", "--num-samples", "3000", "--max-tokens", "16384", "--packs-per-window", "8",
         "--json"]


def _json_out(text: str) -> dict:
    out = json.loads(text)
    out["metrics"].pop("planner_seconds")
    return out


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_cli_no_bar_off_a_terminal(capsys, flag):
    assert _run_pack(_ARGS + flag) == 0
    out, err = capsys.readouterr()
    assert err == "" and _json_out(out)["packs"]


def test_cli_progress_flag_forces_the_bar(capsys):
    assert _run_pack(_ARGS + ["--no-progress"]) == 0
    plain = _json_out(capsys.readouterr().out)
    assert _run_pack(_ARGS + ["--progress"]) == 0
    out, err = capsys.readouterr()
    assert BAR.search(err) and "3000/3000" in err
    assert _json_out(out) == plain  # stdout unchanged: one JSON object, the same packs


def test_cli_bar_by_default_on_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_stderr_is_tty", lambda: True)
    assert _run_pack(_ARGS) == 0
    assert BAR.search(capsys.readouterr().err)
    assert _run_pack(_ARGS + ["--no-progress"]) == 0  # the flag wins over the terminal
    assert capsys.readouterr().err == ""


def test_cli_summary_unchanged_by_the_bar(capsys):
    args = ["--workload", "longtail", "--num-samples", "2000", "--max-tokens", "16384"]
    assert _run_pack(args + ["--no-progress"]) == 0
    plain = capsys.readouterr().out
    assert _run_pack(args + ["--progress"]) == 0
    out = capsys.readouterr().out
    seconds = re.compile(r"planned in [\d.]+ s")
    assert seconds.sub("", out) == seconds.sub("", plain) and "packs in" in out


# ---------------------------------------------------------------- PackedIterableDataset in a worker
def _stream_dataset():
    from atac_hf.packing.data.iterable import PackedIterableDataset

    rng = np.random.default_rng(0)
    src = [{"input_ids": list(range(1, 2 + int(n)))} for n in rng.integers(1, 12, size=400)]
    return PackedIterableDataset(src, PackingConfig(max_tokens=32, packs_per_window=4))


def _read(ds, num_workers: int, rows: int) -> list:
    from torch.utils.data import DataLoader

    it = iter(DataLoader(ds, batch_size=None, num_workers=num_workers))
    try:
        return [next(it) for _ in range(rows)]
    finally:
        del it  # shuts the worker down


def test_worker_state_warns_in_the_main_process():
    ds = _stream_dataset()
    assert len(_read(ds, 1, 30)) == 30
    with pytest.warns(UserWarning, match=r"DataLoader worker process yielded \d+ rows.*consumed=0, num_rows=0.*"
                                         r"would repeat them.*num_workers=0"):
        state = ds.state_dict()
    assert state["consumed"] == 0 and state["num_rows"] == 0  # the stale state the warning is about
    # a copy is as stale, and keeps its counter in shared memory
    dup = copy.deepcopy(ds)
    assert dup._worker_rows.is_shared()
    with pytest.warns(UserWarning, match="worker process"):
        dup.state_dict()
    # loading a state, or iterating here, makes this process' state the one to save again
    ds.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ds.state_dict() == state


def test_no_warning_without_workers():
    ds, ref = _stream_dataset(), _stream_dataset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = _read(ds, 0, 30)
        state = ds.state_dict()
    assert state["num_rows"] == 30 and state["consumed"] > 0
    direct = list(itertools.islice(iter(ref), 30))
    assert [r["spans"] for r in rows] == [r["spans"] for r in direct]
    assert json.dumps(state, sort_keys=True) == json.dumps(ref.state_dict(), sort_keys=True)  # same format


def test_iterating_here_after_a_worker_clears_the_warning():
    ds = _stream_dataset()
    _read(ds, 1, 5)
    it = iter(ds)
    next(it)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ds.state_dict()["num_rows"] == 1


def test_every_top_level_name_resolves_and_the_streaming_dataset_is_exported():
    """The README names ``PackedIterableDataset`` beside the top-level data pieces (red-team 28)."""
    import atac_hf
    from atac_hf.packing import PackedIterableDataset

    for name in atac_hf.__all__:
        assert getattr(atac_hf, name) is not None, name
    assert "PackedIterableDataset" in atac_hf.__all__
    assert atac_hf.PackedIterableDataset is PackedIterableDataset

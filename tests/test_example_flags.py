"""``examples/accelerate_loop.py --max_tokens``: a flag given wins; without it the config file's or
``ATAC_MAX_TOKENS`` value is used (red-team 48: its 1024 default was passed as an override and beat both),
and 1024 only where neither sets one. Stopped at the accelerator's construction: no training runs."""

from __future__ import annotations

import os
import sys

import pytest

import atac_hf.integrations.accelerate as acc_mod

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import accelerate_loop  # noqa: E402


class _Stop(Exception):
    pass


@pytest.fixture
def seen(monkeypatch):
    got = {}

    def fake(config, **kwargs):
        got["max_tokens"] = config.max_tokens
        raise _Stop

    monkeypatch.setattr(acc_mod, "ATACAccelerator", fake)
    for k in ("ATAC_CONFIG", "ATAC_MAX_TOKENS"):
        monkeypatch.delenv(k, raising=False)
    return got


def _max_tokens(seen, *argv):
    with pytest.raises(_Stop):
        accelerate_loop.main(["--cp_size", "1", *argv])
    return seen["max_tokens"]


def test_without_flag_file_or_env_the_demo_default(seen):
    assert _max_tokens(seen) == 1024


def test_config_file_value_is_kept_without_the_flag(seen, tmp_path):
    cfg = tmp_path / "atac.yaml"
    cfg.write_text("max_tokens: 2048\n")
    assert _max_tokens(seen, "--atac_config", str(cfg)) == 2048
    assert _max_tokens(seen, "--atac_config", str(cfg), "--max_tokens", "512") == 512


def test_env_value_is_kept_without_the_flag(seen, monkeypatch):
    monkeypatch.setenv("ATAC_MAX_TOKENS", "4096")
    assert _max_tokens(seen) == 4096
    assert _max_tokens(seen, "--max_tokens", "768") == 768

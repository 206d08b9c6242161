"""scripts/planner_campaign.py: the random campaign over ATP's promises runs, and its checks hold on
the packs this stop's planner fixes were found with (each broke one before its fix)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from atac_hf.cost import CostModel

_SPEC = importlib.util.spec_from_file_location(
    "planner_campaign", Path(__file__).resolve().parents[1] / "scripts" / "planner_campaign.py")
campaign = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(campaign)


def test_a_short_campaign_runs_and_reports(capsys):
    assert campaign.main(["--seed", "1", "--cases", "40", "--show", "0"]) == 0
    assert "40 packs," in capsys.readouterr().out


def test_the_fixed_cases_keep_every_promise():
    capped = CostModel(linear_s_per_token=0.00174, attn_s_per_pair=0.000166, tile=128, kv_bytes_per_token=6869.0,
                       link_bandwidth=1.43e9, link_latency_s=0.0)
    assert campaign.check(np.array([16, 3, 11, 13, 26, 9]), 4, capped, 4, None, 21) == []
    assert campaign.check(np.array([1, 12]), 8, CostModel.from_model("7b", "A800"), 1, None, None) == []

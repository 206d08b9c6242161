"""`atac-hf calibrate --quick`: runs, writes a profile the planners and the simulator accept."""

import argparse
import json

import numpy as np
import pytest

from atac_hf.cost.calibrate import fit_coefficients
from atac_hf.cost import CostModel
from atac_hf.sharding import plan_shards
from atac_hf.sim import ClusterConfig
from atac_hf.cost.cli import add_parser

torch = pytest.importorskip("torch")


def test_fit_coefficients_recovers_a_linear_law():
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 100, size=(20, 3))
    y = X @ np.array([2.0, 0.5, 3.0])
    assert fit_coefficients(X, y) == pytest.approx([2.0, 0.5, 3.0])
    # a coefficient that would come out negative is clamped to 0 and the rest refit
    y2 = X[:, :2] @ np.array([2.0, 0.5]) - 1e-3 * X[:, 2]
    coef = fit_coefficients(X, y2)
    assert coef[2] == 0.0 and (coef >= 0).all()
    with pytest.raises(ValueError, match="rows >= columns"):
        fit_coefficients(X[:2], y[:2])


def test_calibrate_quick_writes_a_loadable_profile(tmp_path, capsys):
    """The quick run end to end: structure, finiteness and non-negativity of what it measured
    and fitted, the profile's round trip, and that the planners and the simulator accept it.
    Real timings on a shared machine are noisy, so nothing here asserts on the fitted values
    (test_calibration_recovers_a_synthetic_law checks the fit on deterministic timings)."""
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    add_parser(sub)
    out = tmp_path / "profile.json"
    args = p.parse_args(["calibrate", "--quick", "--device", "cpu", "--output", str(out), "--json"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["hidden_size"] == 256 and report["tp_size"] == 1
    assert report["backend"] == "sdpa" and {h["kind"] for h in report["heldout"]} == {"pack", "shard"}
    assert len(report["heldout"]) >= 3
    for h in report["heldout"]:
        assert h["measured_s"] > 0 and np.isfinite(h["predicted_s"]) and h["predicted_s"] >= 0
        assert h["rel_err"] == pytest.approx((h["predicted_s"] - h["measured_s"]) / h["measured_s"])
    assert report["heldout_max_rel_err"] == pytest.approx(max(abs(h["rel_err"]) for h in report["heldout"]))

    cm = CostModel.from_profile(out)
    assert cm.tile == 1
    fitted = [cm.linear_s_per_token, cm.attn_s_per_pair, cm.segment_overhead_s, cm.masked_segment_overhead_s]
    assert all(np.isfinite(c) and c >= 0 for c in fitted)
    assert cm.linear_s_per_token + cm.attn_s_per_pair > 0, "a profile that prices nothing"
    # the grid measured chunks: on CPU the sdpa backend runs big ones as an unmasked prefix
    # kernel merged with a causal one (the same price per pair, no row blocks), with their own
    # price per call
    assert cm.masked_segment_overhead_s is not None and cm.masked_attn_s_per_pair is None and cm.mask_block == 0
    # round trip: saving the loaded profile and loading it again gives the same model
    again = tmp_path / "again.json"
    cm.save(again)
    assert CostModel.from_profile(again).to_dict() == cm.to_dict()
    # the planners and the simulator accept it
    plan = plan_shards([300, 1200, 90], 2, "atp", cm)
    assert np.isfinite(plan.block_time_s) and plan.block_time_s > 0
    assert plan.rank_num_tokens().sum() == 1590
    cl = ClusterConfig(model="tiny", profile=str(out), max_tokens=2048, cp_size=2, dp_size=2)
    assert cl.cost_model().attn_s_per_pair == cm.attn_s_per_pair
    with pytest.raises(ValueError, match="measured for another model"):
        ClusterConfig(model="8b", profile=str(out), max_tokens=2048)


def test_calibration_recovers_a_synthetic_law(monkeypatch):
    """The measure-and-fit pipeline on the quick grid, with every kernel replaced by a fake
    that advances a fake clock by a known law: the fitted profile is that law."""
    from atac_hf.cost import calibrate as cal
    from atac_hf.cost.calibration_grid import measurement_grid

    law = CostModel(linear_s_per_token=3e-6, attn_s_per_pair=2e-9, segment_overhead_s=4e-5,
                    masked_segment_overhead_s=7e-5, tile=1)
    attn_tok = 5e-7  # attention's per-query-token part: the fit folds it into the linear price
    now = [0.0]

    def attention_s(segments):
        s, e = np.array([x[1] for x in segments]), np.array([x[2] for x in segments])
        return float(law.attention_cost(s, e).sum() + attn_tok * (e - s).sum())

    class Tick:
        def __init__(self, seconds):
            self.seconds = seconds

        def float(self):
            return self

        def sum(self):
            return self

        def backward(self):
            now[0] += self.seconds

    class FakeBlock:
        kv_heads = 2

        def __init__(self, *args, **kwargs):
            pass

        def input(self, n):
            return n

        def layer(self, n, lengths):
            tokens = law.linear_s_per_token * n
            return Tick(tokens if lengths is None else tokens + attention_s([(int(L), 0, int(L)) for L in lengths]))

        def attention_only(self, segments):
            return lambda: Tick(attention_s(segments)).backward()

    monkeypatch.setattr(cal, "_Block", FakeBlock)
    monkeypatch.setattr(cal, "probe_rates", lambda *a: (1e-6, 1e-9))
    res = cal._measure_and_fit(cal._resolve_dims("tiny"), 1, "cpu", False, lambda: now[0],
                               lambda ml: measurement_grid(True, False, ml), None, None, 0, "sdpa", None)
    cm = res.cost_model
    assert now[0] > 0 and len(res.attention) >= 4 and any(s > 0 for segs, _ in res.attention for _, s, _ in segs)
    assert cm.linear_s_per_token == pytest.approx(law.linear_s_per_token + attn_tok, rel=1e-6)
    assert cm.attn_s_per_pair == pytest.approx(law.attn_s_per_pair, rel=1e-6)
    assert cm.segment_overhead_s == pytest.approx(law.segment_overhead_s, rel=1e-6)
    assert cm.masked_segment_overhead_s == pytest.approx(law.masked_segment_overhead_s, rel=1e-6)
    assert res.heldout and max(abs(h["rel_err"]) for h in res.heldout) < 1e-6


def test_calibrate_native_varlen_backend_fits_one_pair_price():
    from atac_hf.cost.calibrate import calibrate

    grid = dict(linear=[64, 128], attention=[[96], [64, 32], [16] * 4], chunks=[[(96, 48, 96)]], heldout=[[40, 20]],
                heldout_shards=[[(80, 40, 80), (10, 0, 10)]], repeats=1)
    res = calibrate("tiny", device="cpu", backend="varlen_reference", grid=grid)
    cm = res.cost_model
    assert res.backend == "varlen_reference" and cm.mask_block == 0
    assert cm.masked_attn_s_per_pair is None and cm.masked_segment_overhead_s is None
    assert len(res.attention) == 4 and len(res.heldout) == 2 and "varlen_reference" in res.summary()


def test_calibrate_masked_blocks_get_their_own_price_per_pair(monkeypatch):
    """Where the sdpa backend runs chunks as masked row blocks (off CPU, or without the CPU
    merge), their pairs get their own price and the profile records the row block."""
    from atac_hf.attention import backends
    from atac_hf.cost.calibrate import calibrate

    monkeypatch.setattr(backends, "prefix_merge_available", lambda device: False)
    grid = dict(linear=[64, 128], attention=[[96], [64, 32], [16] * 4], repeats=1,
                chunks=[[(300, 100, 300)], [(64, 32, 64)] * 4, [(200, 20, 120)]], heldout=[[40, 20]], heldout_shards=[])
    cm = calibrate("tiny", device="cpu", grid=grid).cost_model
    assert cm.mask_block == backends.QUERY_BLOCK and cm.masked_attn_s_per_pair is not None
    assert cm.masked_segment_overhead_s is not None


def test_calibrate_bad_settings():
    from atac_hf.cost.calibrate import calibrate

    with pytest.raises(ValueError, match=r"calibration backend 'flex' is not supported; legal values: \['sdpa'"):
        calibrate("tiny", quick=True, device="cpu", backend="flex")
    with pytest.raises(ValueError, match="tp_size=3"):
        calibrate("tiny", tp_size=3, quick=True, device="cpu")
    with pytest.raises(ValueError, match="calibration model 'huge'"):
        calibrate("huge", quick=True, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            calibrate("tiny", quick=True, device="cuda")
    with pytest.raises(ValueError, match=r"max_len=0 must be a positive token count"):
        calibrate("tiny", quick=True, device="cpu", max_len=0)


def test_grid_max_len_extends_to_the_run_s_longest_document():
    from atac_hf.cost.calibrate import _grid

    base = _grid(quick=False, cuda=False)
    assert _grid(quick=False, cuda=False, max_len=1000) == base  # already covered: nothing added
    g = _grid(quick=False, cuda=False, max_len=12000)
    docs = lambda grid: {L for ls in grid["attention"] for L in ls} | {c[0] for ch in grid["chunks"] for c in ch}
    added = [ls for ls in g["attention"] if ls not in base["attention"]]
    assert added == [[8192], [12000]]  # doubling from the grid's longest document (4K), capped at max_len
    assert [(12000, 6000, 12000)] in g["chunks"] and [(12000, 3000, 9000)] in g["chunks"]
    assert g["heldout_shards"][-1][0] == (12000, 0, 3000) and len(g["heldout_shards"]) == len(base["heldout_shards"]) + 1
    assert max(docs(g)) == 12000 and g["linear"] == base["linear"]


def test_calibrate_max_len_reaches_the_profile_and_the_cli():
    from atac_hf.cost.calibrate import calibrate

    grid = dict(linear=[64, 128], attention=[[96], [64, 32], [16] * 4], chunks=[[(96, 48, 96)]], heldout=[[40, 20]],
                heldout_shards=[], repeats=1)
    res = calibrate("tiny", device="cpu", backend="varlen_reference", grid=grid)
    assert res.longest_document == 96 and res.metadata()["longest_document"] == 96
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="command", required=True))
    assert p.parse_args(["calibrate", "--max-len", "16K"]).max_len == 16384
    assert p.parse_args(["calibrate"]).max_len is None

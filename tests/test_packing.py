"""Packing planners: exact tiny cases (hand-checked), resume, metrics, every user error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, StreamPacker, pack_costs, pack_lengths, recount_metrics
from atac_hf.packing.metrics import window_imbalance

# cost = tokens: every strategy decision is easy to follow by hand
LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)
# cost(L) = L + L (L + 1) / 2 (exact causal pairs): cost(1) = 2, cost(5) = 20, cost(6) = 27
QUAD = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1)


def cfg(**kw) -> PackingConfig:
    kw.setdefault("max_tokens", 10)
    kw.setdefault("packs_per_window", 2)
    return PackingConfig(**kw)


# ---------------------------------------------------------------------------- exact cases
def test_sequential_next_fit_in_data_order():
    p = StreamPacker(cfg(max_tokens=6, strategy="sequential"), LINEAR)
    # 3 | 4 2 | (5, 1 carried: next-fit never goes back)
    assert p.add_window(range(5), [3, 4, 2, 5, 1]) == [[(0, 0, 3)], [(1, 0, 4), (2, 0, 2)]]
    assert p.pending_ids == [3, 4]
    assert p.flush() == [[(3, 0, 5), (4, 0, 1)]]
    assert p.pending_ids == []


def test_bfd_best_fit_decreasing():
    p = StreamPacker(cfg(max_tokens=6, packs_per_window=3, strategy="bfd"), LINEAR)
    # 5 -> A (room 1); 4 -> B (2); 3 -> C (3); 2 -> B (best fit, room 2); 2 -> C
    assert p.add_window(range(5), [5, 4, 3, 2, 2]) == [[(0, 0, 5)], [(1, 0, 4), (3, 0, 2)], [(2, 0, 3), (4, 0, 2)]]


def test_wlb_outlier_queue_and_least_workload():
    p = StreamPacker(cfg(max_tokens=8, strategy="wlb", wlb_thresholds=(4,)), LINEAR)
    # queue [5]: not full (needs 2), 5 waits; 2 -> pack 0, 1 -> pack 1 (least workload)
    assert p.add_window([0, 1, 2], [5, 1, 2]) == [[(2, 0, 2)], [(1, 0, 1)]]
    assert p.pending_ids == [0]
    # queue [5, 6] is full: one per pack, 6 to pack 0, 5 to pack 1; then longest first to the
    # least loaded pack: 3 -> pack 1 (5 < 6), 2 -> pack 0; 1 fits nowhere (both at 8): carried
    assert p.add_window([3, 4, 5, 6], [6, 3, 2, 1]) == [[(3, 0, 6), (5, 0, 2)], [(0, 0, 5), (4, 0, 3)]]
    assert p.pending_ids == [6]
    assert p.metrics["delay_max"] == 1


def test_wfap_variable_token_counts_balance_cost():
    # cost(5) = 20 = cost of ten 1-token samples: WFAP leaves the 5 alone (5 tokens) rather
    # than topping it up to the cap, which would make it the straggler (cost 30 vs 20).
    c = cfg(reference_doc_tokens=1)
    p = StreamPacker(c, QUAD)
    packs = p.add_window(range(16), [5] + [1] * 15)
    assert packs == [[(0, 0, 5)], [(i, 0, 1) for i in range(1, 11)]]
    assert window_imbalance(pack_costs(packs, QUAD)) == pytest.approx(1.0)
    assert p.pending_ids == list(range(11, 16))
    bfd = StreamPacker(PackingConfig(**{**c.to_dict(), "strategy": "bfd"}), QUAD).add_window(range(16), [5] + [1] * 15)
    assert window_imbalance(pack_costs(bfd, QUAD)) == pytest.approx(30 / 25)


def test_wfap_defers_heavy_samples_until_a_group_is_balanced():
    # heavy: cost(6) = 27 > 1.05 x cost of a pack of ten 1-token samples (20)
    p = StreamPacker(cfg(reference_doc_tokens=1, max_defer=4), QUAD)
    w0 = p.add_window(range(0, 5), [6, 1, 1, 1, 1])
    assert all(s[0] != 0 for pack in w0 for s in pack)  # held back
    w1 = p.add_window(range(5, 10), [6, 1, 1, 1, 1])
    assert all(s[0] not in (0, 5) for pack in w1 for s in pack)  # one eligible heavy: no group yet
    w2 = p.add_window(range(10, 12), [1, 1])
    anchors = sorted(s[0] for pack in w2 for s in pack if s[2] - s[1] == 6)
    assert anchors == [0, 5]
    assert [sum(1 for s in pack if s[2] - s[1] == 6) for pack in w2] == [1, 1]  # one anchor per pack
    assert p.metrics["delay_max"] == 2


def test_wfap_balance_split_of_overdue_heavy_sample():
    p = StreamPacker(cfg(reference_doc_tokens=1, max_defer=1, min_fragment=1, balance_split=True), QUAD)
    p.add_window(range(0, 3), [6, 1, 1])
    packs = p.add_window([3, 4], [1, 1])
    spans = sorted(s for pack in packs for s in pack if s[0] == 0)
    assert spans == [(0, 0, 3), (0, 3, 6)]  # overdue, alone it would unbalance: split in two light halves
    assert p.metrics["num_split"] == 1


def test_wfap_without_balance_split_releases_the_overdue_anchor():
    p = StreamPacker(cfg(reference_doc_tokens=1, max_defer=1, min_fragment=1, balance_split=False), QUAD)
    p.add_window(range(0, 3), [6, 1, 1])
    packs = p.add_window([3, 4], [1, 1])
    assert (0, 0, 6) in [s for pack in packs for s in pack]
    assert p.metrics["num_split"] == 0


def test_fidelity_by_default_no_sample_that_fits_is_cut():
    # the balance-split case above with the default config: the overdue heavy 6 fits the cap,
    # so it stays whole (balance_split is opt-in)
    assert PackingConfig(max_tokens=10, packs_per_window=2).balance_split is False
    p = StreamPacker(cfg(reference_doc_tokens=1, max_defer=1, min_fragment=1), QUAD)
    p.add_window(range(0, 3), [6, 1, 1])
    packs = p.add_window([3, 4], [1, 1]) + p.flush()
    assert (0, 0, 6) in [s for pack in packs for s in pack]
    assert p.metrics["num_split"] == 0


@pytest.mark.parametrize("strategy", ["wfap", "sequential", "bfd", "wlb"])
def test_overlength_split_truncate(strategy):
    res = pack_lengths([25, 3], cfg(strategy=strategy, packs_per_window=4), LINEAR)
    spans = sorted(s for pack in res.packs for s in pack if s[0] == 0)
    assert spans == [(0, 0, 10), (0, 10, 20), (0, 20, 25)]  # fewest fragments: full-cap ones, then the rest
    assert res.metrics["num_split"] == 1 and res.metrics["fragmentation"] == pytest.approx(0.5)
    res = pack_lengths([25, 3], cfg(strategy=strategy, overlength="truncate"), LINEAR)
    assert sorted(s for pack in res.packs for s in pack) == [(0, 0, 10), (1, 0, 3)]
    assert res.metrics["truncated_tokens"] == 15


def test_zero_length_samples_are_skipped_and_counted():
    res = pack_lengths([0, 4, 0, 3], cfg(), LINEAR)
    assert sorted(s for pack in res.packs for s in pack) == [(1, 0, 4), (3, 0, 3)]
    assert res.metrics["zero_length_skipped"] == 2 and res.metrics["num_samples"] == 2


def test_overdue_sample_is_split_over_pack_ends():
    # sequential keeps 6+ 4 in order; the 7 waits; when overdue it fits nowhere whole and is
    # split over the two packs' free ends
    p = StreamPacker(cfg(strategy="sequential", max_defer=0, min_fragment=2), LINEAR)
    packs = p.add_window(range(3), [6, 6, 7])
    assert sorted(s for pack in packs for s in pack if s[0] == 2) == [(2, 0, 4), (2, 4, 7)]
    assert p.metrics["num_split"] == 1 and p.metrics["delay_max"] == 0


def test_pack_lengths_result_and_deferred():
    res = pack_lengths([5, 1, 2, 6, 3, 2, 1], cfg(max_tokens=8, strategy="wlb", wlb_thresholds=(4,)), LINEAR,
                       window=3)
    assert sorted(s for pack in res.packs for s in pack) == [(0, 0, 5), (1, 0, 1), (2, 0, 2), (3, 0, 6),
                                                             (4, 0, 3), (5, 0, 2), (6, 0, 1)]
    assert (0, 1) in res.deferred  # the 5 waited one window for its queue to fill
    assert len(res.pack_window) == len(res.packs)
    assert sum(len(w) for w in res.windows()) == len(res.packs)


# ---------------------------------------------------------------------------- metrics
def test_metrics_recount_matches_running_metrics():
    lengths = np.random.default_rng(0).integers(0, 40, 300)
    c = cfg(max_tokens=32, packs_per_window=4, max_defer=3)
    res = pack_lengths(lengths, c, QUAD)
    again = recount_metrics(res.windows(), lengths, max_tokens=32, cost_model=QUAD, arrival=res.arrival)
    for k, v in res.metrics.items():
        if k != "num_overdue":
            assert again[k] == pytest.approx(v), k


def test_metrics_values_by_hand():
    windows = [[[(0, 0, 4)], [(1, 0, 2), (2, 0, 2)]], [], [[(3, 0, 3)]]]
    m = recount_metrics(windows, [4, 2, 2, 5], max_tokens=4, cost_model=LINEAR, arrival=[0, 0, 0, 1])
    assert m["num_windows"] == 2 and m["num_packs"] == 3 and m["tokens"] == 11
    assert m["imbalance_mean"] == pytest.approx(1.0) and m["padding"] == pytest.approx(1 - 11 / 12)
    assert m["truncated_tokens"] == 2 and m["delay_max"] == 1 and m["num_deferred"] == 1
    assert m["est_time_s"] == pytest.approx(4 + 3)


# ---------------------------------------------------------------------------- resume
@pytest.mark.parametrize("strategy", ["wfap", "sequential", "bfd", "wlb"])
def test_resume_round_trip_through_json(strategy):
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 90, 400).tolist()
    c = PackingConfig(max_tokens=64, packs_per_window=3, strategy=strategy, max_defer=3, reference_doc_tokens=4)
    windows = [(list(range(i, i + 20)), lengths[i:i + 20]) for i in range(0, 400, 20)]

    ref = StreamPacker(c, QUAD)
    expected = [ref.add_window(*w) for w in windows] + [ref.flush()]

    first = StreamPacker(c, QUAD)
    got = [first.add_window(*w) for w in windows[:7]]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = StreamPacker(c, QUAD)
    resumed.load_state_dict(state)
    got += [resumed.add_window(*w) for w in windows[7:]] + [resumed.flush()]
    assert got == expected
    assert resumed.metrics == ref.metrics
    seen = sorted(s for w in got for pack in w for s in pack)
    assert sum(e - s for _, s, e in seen) == sum(lengths)  # nothing lost or repeated


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw, exc, match", [
    ({"max_tokens": 0}, ValueError, r"max_tokens=0 is invalid.*int > 0"),
    ({"max_tokens": 1.5}, ValueError, r"max_tokens=1.5 is invalid"),
    ({"max_tokens": True}, ValueError, r"max_tokens=True is invalid"),
    ({"packs_per_window": 0}, ValueError, r"packs_per_window=0 is invalid.*>= 1"),
    ({"strategy": "ffd"}, ValueError, r"unknown packing strategy 'ffd'; legal values: \['wfap', 'sequential', 'bfd', 'wlb'\]"),
    ({"overlength": "drop"}, ValueError, r"unknown overlength policy 'drop'; legal values: \['split', 'truncate', 'error'\]"),
    ({"min_fragment": 0}, ValueError, r"min_fragment=0 is invalid.*\[1, max_tokens // 2 = 5\]"),
    ({"min_fragment": 6}, ValueError, r"min_fragment=6 is invalid"),
    ({"max_defer": -1}, ValueError, r"max_defer=-1 is invalid.*>= 0"),
    ({"balance_tolerance": 1.0}, ValueError, r"balance_tolerance=1.0 is invalid.*> 1"),
    ({"balance_tolerance": float("nan")}, ValueError, r"balance_tolerance=nan is invalid"),
    ({"wlb_thresholds": (8, 4)}, ValueError, r"wlb_thresholds=\(8, 4\) is invalid.*strictly increasing"),
    ({"wlb_thresholds": "8"}, TypeError, r"wlb_thresholds='8' must be None or a sequence of ints"),
    ({"local_search": 1}, TypeError, r"local_search=1 must be True or False"),
    ({"reference_doc_tokens": 0}, ValueError, r"reference_doc_tokens=0 must be an int >= 1"),
])
def test_config_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        cfg(**kw)


def test_config_constructors():
    c = PackingConfig.for_training(4096, dp_size=4, grad_accum=2, strategy="bfd")
    assert c.packs_per_window == 8 and c.window_tokens == 8 * 4096 and c.min_fragment == 128
    assert PackingConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert cfg(max_tokens=1).min_fragment == 1 and cfg().resolved_wlb_thresholds == (2, 5)
    assert PackingConfig.from_dict({"max_tokens": 8, "packs_per_window": 1, "wlb_thresholds": [2, 4]}).wlb_thresholds == (2, 4)
    with pytest.raises(ValueError, match=r"unknown packing config keys \['cap'\]; legal keys: \["):
        PackingConfig.from_dict({"max_tokens": 8, "packs_per_window": 1, "cap": 3})
    with pytest.raises(TypeError, match="a packing config must be a mapping, got list"):
        PackingConfig.from_dict([1, 2])
    with pytest.raises(ValueError, match="grad_accum=0 must be an int >= 1"):
        PackingConfig.for_training(4096, grad_accum=0)


@pytest.mark.parametrize("lengths, exc, match", [
    ([], ValueError, r"lengths is empty: nothing to pack"),
    ([3, 2.5], TypeError, r"lengths\[1\] = 2.5 is not an int: sample lengths must be integer token counts >= 0"),
    ([3, True], TypeError, r"lengths\[1\] = True is not an int"),
    ([3, -2], ValueError, r"lengths\[1\] = -2 is negative: sample lengths must be token counts >= 0"),
    ([[1, 2], [3, 4]], ValueError, r"lengths must be a flat sequence of ints, got shape \(2, 2\)"),
    ("123", TypeError, r"lengths must be a sequence of ints, got str"),
])
def test_pack_lengths_input_errors(lengths, exc, match):
    with pytest.raises(exc, match=match):
        pack_lengths(lengths, cfg(), LINEAR)


def test_pack_lengths_window_and_overlength_errors():
    with pytest.raises(ValueError, match=r"window=0 is invalid: it must be None \(size windows by tokens\) or an int >= 1"):
        pack_lengths([1, 2], cfg(), LINEAR, window=0)
    with pytest.raises(ValueError, match=r"sample 1 has 11 tokens, more than max_tokens=10, and overlength='error'; "
                                         r"set overlength to 'split' or 'truncate', or raise max_tokens"):
        pack_lengths([3, 11], cfg(overlength="error"), LINEAR)


def test_stream_packer_errors():
    with pytest.raises(TypeError, match="config must be a PackingConfig, got dict"):
        StreamPacker({"max_tokens": 4})
    with pytest.raises(TypeError, match="cost_model must be a CostModel or None, got str"):
        StreamPacker(cfg(), "7b")
    p = StreamPacker(cfg(strategy="sequential", max_defer=5), LINEAR)
    with pytest.raises(ValueError, match="got 2 sample_ids but 1 lengths"):
        p.add_window([0, 1], [3])
    with pytest.raises(ValueError, match="sample id 4 appears twice in one window"):
        p.add_window([4, 4], [3, 3])
    with pytest.raises(TypeError, match="sample_ids must be ints"):
        p.add_window(["a"], [3])
    with pytest.raises(ValueError, match=r"sample 7 has 12 tokens.*overlength='error'"):
        StreamPacker(cfg(overlength="error"), LINEAR).add_window([7], [12])
    p.add_window(range(4), [9, 9, 9, 1])  # sample 2 and 3 carried
    with pytest.raises(ValueError, match="sample id 3 is still pending in the packer"):
        p.add_window([3], [1])
    assert p.pending_ids == [2, 3]  # a failed call changes nothing


def test_load_state_dict_errors():
    p = StreamPacker(cfg(), LINEAR)
    with pytest.raises(ValueError, match="not a StreamPacker state"):
        p.load_state_dict({"format": "x"})
    state = StreamPacker(cfg(max_defer=3), LINEAR).state_dict()
    with pytest.raises(ValueError, match=r"saved with a different PackingConfig \(max_defer=3; this packer has max_defer=16\)"):
        p.load_state_dict(state)
    with pytest.raises(ValueError, match="saved with a different cost model"):
        p.load_state_dict(StreamPacker(cfg(), QUAD).state_dict())


def test_pack_costs_rejects_empty_pack():
    with pytest.raises(ValueError, match="a pack is empty"):
        pack_costs([[(0, 0, 3)], []], LINEAR)


def test_packing_modules_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; import atac_hf.packing, atac_hf.packing.cli, atac_hf.workloads; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_supply_tokens_and_tokens_wanted():
    c = cfg(reference_doc_tokens=1)  # heavy: cost > 21 (6+ tokens under QUAD)
    p = StreamPacker(c, QUAD)
    assert p.tokens_wanted == 20 and p.supply_tokens([5, 6, 0, 25]).tolist() == [5, 0, 0, 0]  # 25 -> 9,8,8: heavy
    assert StreamPacker(cfg(reference_doc_tokens=1, max_defer=0), QUAD).supply_tokens([6]).tolist() == [6]
    assert StreamPacker(cfg(reference_doc_tokens=1, overlength="truncate"), QUAD).supply_tokens([30]).tolist() == [0]
    wlb = StreamPacker(cfg(strategy="wlb", wlb_thresholds=(4,)), LINEAR)
    assert wlb.supply_tokens([3, 4, 12]).tolist() == [3, 0, 0]  # 12 -> 6, 6: queued
    wlb.add_window([0, 1, 2], [5, 2, 1])  # the 5 waits in its queue: not supply for the next window
    assert wlb.pending_ids == [0] and wlb.tokens_wanted == 20
    seq = StreamPacker(cfg(strategy="sequential", packs_per_window=1), LINEAR)
    seq.add_window([0, 1], [7, 6])
    assert seq.pending_tokens == 6 and seq.tokens_wanted == 10 - 6


def test_window_size_bounds_held_samples():
    p = StreamPacker(cfg(reference_doc_tokens=1), QUAD)  # heavy: 6+ tokens
    # 3 x packs_per_window = 6 heavy samples count 0, then each counts a full pack (10)
    assert p.window_size([6] * 100) == 8
    assert p.window_size([1] * 100) == 20 and p.window_size([1] * 5) == 5 and p.window_size([]) == 0
    assert StreamPacker(cfg(strategy="bfd"), LINEAR).window_size([6] * 100) == 4
    full = StreamPacker(cfg(strategy="sequential"), LINEAR)
    full.add_window(range(5), [10, 10, 10, 10, 10])  # three carried: 30 > 20 tokens
    assert full.window_size([1, 1]) == 0
    # a stream of only heavy samples is fed at the pace the packer releases them
    res = pack_lengths([6, 7, 8, 9] * 40, cfg(reference_doc_tokens=1, max_defer=4), QUAD)
    assert max(res.arrival) >= 20 and res.metrics["num_overdue"] == 0

"""Reliability: a refused ``load_state_dict`` changes nothing (issue 13, items 3 and 4).

For every stateful class of the data path - ``WFAPBatchSampler``, ``StreamPacker``,
``WindowPlanner``, ``PackedIterableDataset`` - a battery of corrupted states (missing or
mistyped fields, out-of-range counters, spans outside their sample, duplicated or dropped
items, token totals that do not add up) must each raise ``ValueError`` naming the field,
leave ``state_dict()`` byte-identical, and leave the object usable: afterwards it yields
exactly what an untouched twin yields. The intact state still loads.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import warnings
from collections import Counter

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _reliability  # noqa: E402
from _reliability import count  # noqa: E402

from atac_hf.packing import PackedIterableDataset, PackingConfig, StreamPacker, WFAPBatchSampler
from atac_hf.packing.data.window_planner import WindowPlanner


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    _reliability.flush(__name__)


@pytest.fixture(autouse=True)
def _quiet_overlength():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*longer than max_tokens")
        yield


def _canon(obj) -> str:
    return json.dumps(obj.state_dict(), sort_keys=True)


def _edit(state: dict, path: tuple, value=None, *, drop: bool = False, dup: bool = False) -> dict:
    """A deep copy of ``state`` with ``state[path]`` replaced, dropped, or (a list item) duplicated."""
    out = copy.deepcopy(state)
    box = out
    for key in path[:-1]:
        box = box[key]
    if drop:
        del box[path[-1]]
    elif dup:
        box.insert(path[-1], copy.deepcopy(box[path[-1]]))
    else:
        box[path[-1]] = value
    return out


def _refuse_all(obj, variants) -> int:
    """Each variant raises ValueError naming something, and changes nothing."""
    before = _canon(obj)
    failures = []
    for name, state, match in variants:
        try:
            obj.load_state_dict(state)
        except ValueError as e:
            if not re.search(match, str(e)):
                failures.append(f"{name}: message {str(e)[:200]!r} does not match {match!r}")
        except Exception as e:  # noqa: BLE001 - any other type is the bug this test looks for
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
        else:
            failures.append(f"{name}: accepted")
        if _canon(obj) != before:
            failures.append(f"{name}: the refused state changed the object")
            break
    assert not failures, "\n".join(failures)
    return len(variants)


# ---------------------------------------------------------------------------- WFAPBatchSampler
def test_sampler_refused_states_change_nothing():
    lengths = [5, 40, 3, 7, 16, 1, 12, 9, 30, 2] * 3
    config = PackingConfig(max_tokens=16, packs_per_window=4)

    def make():
        return WFAPBatchSampler(lengths, config, num_replicas=2, seed=3)

    s = make()
    s.set_epoch(2)
    it = iter(s)
    taken = [next(it) for _ in range(5)]
    good = json.loads(json.dumps(s.state_dict()))
    n = good["num_batches"]
    variants = [(f"{k}={v!r}", _edit(good, (k,), v), f"'{k}' = |{k}=|fingerprint|not a WFAP")
                for k, values in {"position": [-1, n + 1, 10**9, 2.5, "3", True, None],
                                  "seed": [-5, 2.5, "0", True, None, 2**64],
                                  "epoch": [-1, 1.5, "2", False, None],
                                  "num_batches": [n + 1, -1, "x", 2.0]}.items() for v in values]
    variants += [(f"drop {k}", _edit(good, (k,), drop=True), "missing|fingerprint|not a WFAP") for k in good]
    n7 = len(make()._epoch_plan(3, 7)[1]) - 1  # epoch 7's own batch count (an epoch's last window has the packs
    # its samples need, so epochs may differ: 26 or 28 here); only the position is wrong in this variant
    variants += [("epoch 7 and a bad position", {**good, "epoch": 7, "num_batches": n7, "position": 10**6}, "position"),
                 ("fingerprint", {**good, "fingerprint": "0" * 16}, "fingerprint"),
                 ("not a mapping", [1, 2], "not a WFAPBatchSampler state"), ("None", None, "not a WFAP")]
    refused = _refuse_all(s, variants)
    for bad in (-1, "3", 1.5, None):
        with pytest.raises((TypeError, ValueError), match="epoch"):
            s.set_epoch(bad)
    assert s.epoch == 2
    with pytest.raises(ValueError, match=r"seed=-5 is invalid: it must be an int in \[0, 2\*\*63\)"):
        WFAPBatchSampler(lengths, config, seed=-5)
    with pytest.raises(TypeError, match="seed='1' is not an int"):
        WFAPBatchSampler(lengths, config, seed="1")
    # still usable: continues exactly like a twin that loaded the intact state
    twin = make()
    twin.load_state_dict(good)
    rest = list(s)
    assert rest == list(twin)
    spans = Counter((i, t) for b in taken + rest for i, a, e in b for t in range(a, e))
    assert max(spans.values()) == 1 and len(spans) == sum(lengths)
    count("state.refused_unchanged", refused)


# ---------------------------------------------------------------------------- StreamPacker
def _packer_state():
    config = PackingConfig(max_tokens=16, packs_per_window=1, max_defer=3)
    p = StreamPacker(config)
    p.add_window([0, 1, 2, 3, 4], [5, 40, 3, 7, 12])
    good = json.loads(json.dumps(p.state_dict()))
    assert any(it[5] == 1 for it in good["pool"]) and any(it[5] == 0 for it in good["pool"]) and good["open"]
    return config, p, good


def test_stream_packer_refused_states_change_nothing():
    config, p, good = _packer_state()
    frag = next(k for k, it in enumerate(good["pool"]) if it[5] == 1)
    whole = next(k for k, it in enumerate(good["pool"]) if it[5] == 0)
    item = good["pool"][frag]
    variants = [(f"{k}={v!r}", _edit(good, (k,), v), rf"'{k}' = |{k}") for k, values in
                {"window": [-1, 1.5, "1", None, True], "seq": [-1, 2.5, True, 0, "5"]}.items() for v in values]
    variants += [(f"drop {k}", _edit(good, (k,), drop=True), "missing|not a StreamPacker") for k in good]
    variants += [
        ("dup whole item", _edit(good, ("pool", whole), dup=True), "appears 2 times"),
        ("dup fragment", _edit(good, ("pool", frag), dup=True), "overlap|tokens left"),
        ("drop fragment", _edit(good, ("pool", frag), drop=True), "tokens left but the pool holds"),
        ("end=10**9", _edit(good, ("pool", frag, 2), 10**9), "max_tokens=16"),
        ("start=end", _edit(good, ("pool", frag, 1), item[2]), "start < end"),
        ("negative start", _edit(good, ("pool", whole, 1), -1), "start < end"),
        ("arrival after window", _edit(good, ("pool", whole, 3), 99), "arrival"),
        ("frag 2", _edit(good, ("pool", whole, 5), 2), "frag 0 or 1"),
        ("seq beyond", _edit(good, ("pool", whole, 4), 99), "seq"),
        ("other sample's seq", _edit(good, ("pool", whole, 4), item[4]), "one sample, one seq"),
        ("fragment of a closed sample", _edit(good, ("pool", frag, 0), 77), "open split sample|one seq"),
        ("short item", _edit(good, ("pool", whole), [1, 0, 3]), "pool items must be"),
        ("float item", _edit(good, ("pool", whole, 2), 3.0), "pool items must be"),
        ("str item", _edit(good, ("pool", whole, 0), "2"), "pool items must be"),
        ("pool not a list", _edit(good, ("pool",), "x"), "'pool'"),
        ("drop open", _edit(good, ("open", 0), drop=True), "frag=1 but is not an open"),
        ("left + 1", _edit(good, ("open", 0, 1), good["open"][0][1] + 1), "tokens left"),
        ("left 0", _edit(good, ("open", 0, 1), 0), "tokens left >= 1"),
        ("delay -1", _edit(good, ("open", 0, 2), -1), "delay"),
        ("dup open", _edit(good, ("open", 0), dup=True), "open twice"),
        ("unknown open", _edit(good, ("open",), good["open"] + [[55, 3, 0]]), "tokens left but the pool holds 0"),
        ("metrics str", _edit(good, ("metrics", "tokens"), "x"), "'tokens'"),
        ("metrics negative", _edit(good, ("metrics", "num_packs"), -1), "'num_packs'"),
        ("metrics nan", _edit(good, ("metrics", "cost_sum"), float("nan")), "'cost_sum'"),
        ("metrics dropped", _edit(good, ("metrics", "delay_max"), drop=True), "missing"),
        ("metrics not a mapping", _edit(good, ("metrics",), [1]), "metrics"),
        ("other config", _edit(good, ("config", "max_tokens"), 32), "different PackingConfig"),
        ("other cost model", _edit(good, ("cost_model", "tile"), 7), "different cost model"),
    ]
    refused = _refuse_all(p, variants)
    twin = StreamPacker(config)
    twin.load_state_dict(good)
    assert p.add_window([5, 6], [9, 2]) == twin.add_window([5, 6], [9, 2])
    assert p.flush() == twin.flush() and _canon(p) == _canon(twin)
    count("state.refused_unchanged", refused)


# ---------------------------------------------------------------------------- WindowPlanner
def _planner(config):
    return WindowPlanner(config, None, window_size=None, num_replicas=3, even_batches=True)


def test_window_planner_refused_states_change_nothing():
    config = PackingConfig(max_tokens=16, packs_per_window=3)
    w = _planner(config)
    w.add([0, 1, 2, 3], [5, 40, 3, 7])
    w.add([4, 5], [16, 2])
    good = json.loads(json.dumps(w.state_dict()))
    assert good["reserve"], "the test needs a reserve"
    variants = [(f"{k}={v!r}", _edit(good, (k,), v), rf"'{k}'|replica loads") for k, values in
                {"prev_empty": ["x", 1, None], "num_batches": [-1, 1.5, "2", True],
                 "loads": [[0.0], [0.0, 1.0, float("nan")], [0.0, -1.0, 1.0], ["x", 0, 0], "x"]}.items()
                for v in values]
    variants += [(f"drop {k}", _edit(good, (k,), drop=True), "missing|'packer'") for k in good]
    variants += [
        ("empty reserve pack", _edit(good, ("reserve",), [[]]), "non-empty list"),
        ("reversed span", _edit(good, ("reserve", 0, 0), [0, 5, 3]), "0 <= start < end"),
        ("dup reserve pack", _edit(good, ("reserve", 0), dup=True), "twice"),
        ("reserve over cap", _edit(good, ("reserve",), [[[9, 0, 17]]]), "more than max_tokens=16"),
        ("reserve span of floats", _edit(good, ("reserve", 0, 0), [0, 0.0, 3]), "span"),
        ("reserve not a list", _edit(good, ("reserve",), {"a": 1}), "'reserve'"),
        ("bad packer", _edit(good, ("packer", "window"), -3), "'window'"),
        ("packer not a mapping", _edit(good, ("packer",), [1]), "'packer'"),
        ("not a mapping", [1], "expected a mapping"),
    ]
    refused = _refuse_all(w, variants)
    twin = _planner(config)
    twin.load_state_dict(good)
    assert w.add([6, 7], [11, 4], last=True) == twin.add([6, 7], [11, 4], last=True)
    assert _canon(w) == _canon(twin)
    count("state.refused_unchanged", refused)


# ---------------------------------------------------------------------------- PackedIterableDataset
def _stream_state():
    config = PackingConfig(max_tokens=16, packs_per_window=2, max_defer=3, reference_doc_tokens=4)
    lengths = [5, 40, 3, 7, 12, 16, 2, 30, 9, 1, 11, 4] * 12
    rows = [{"input_ids": list(range(100 * i, 100 * i + n)), "labels": list(range(100 * i + 1, 100 * i + n + 1))}
            for i, n in enumerate(lengths)]
    make = lambda: PackedIterableDataset(rows, config, num_replicas=2)  # noqa: E731
    for k in range(1, 40):  # the first row count whose state holds every kind of entry
        ds = make()
        it = iter(ds)
        taken = [next(it) for _ in range(k)]
        good = json.loads(json.dumps(ds.state_dict()))
        if good["pending"] and good["lookahead"] and good["planner"]["packer"]["pool"] and good["planner"]["reserve"]:
            return make, ds, it, taken, good, rows
    raise AssertionError("no state with pending packs, look-ahead, pool and reserve")


def test_iterable_refused_states_change_nothing():
    make, ds, it, taken, good, rows = _stream_state()
    data_sids = [d[0] for d in good["data"]]
    pend_sid = good["pending"][0][0][0]
    k_pend = data_sids.index(pend_sid)
    pool = good["planner"]["packer"]["pool"]
    k_rem = next(k for k, (sid, _n) in enumerate(good["remaining"]) if sid == pend_sid)
    variants = [(f"{k}={v!r}", _edit(good, (k,), v), rf"'{k}'") for k, values in
                {"consumed": ["3", 2.5, True, -1, None], "num_rows": [-1, 1.5, "7"],
                 "num_empty_skipped": [-1, 10**9, 0.0], "exhausted": ["x", 1, None]}.items() for v in values]
    variants += [(f"drop {k}", _edit(good, (k,), drop=True), "missing|fingerprint|not a PackedIterable")
                 for k in good]
    variants += [
        ("pending span of an unknown sample", _edit(good, ("pending", 0, 0, 0), 10**6), "not in 'data'|sample"),
        ("remaining + 1", _edit(good, ("remaining", k_rem, 1), good["remaining"][k_rem][1] + 1), "'remaining' says"),
        ("remaining - 1", _edit(good, ("remaining", k_rem, 1), good["remaining"][k_rem][1] - 1), "'remaining' says"),
        ("remaining 0", _edit(good, ("remaining", k_rem, 1), 0), "remaining"),
        ("dropped data", _edit(good, ("data", k_pend), drop=True), "disagree"),
        ("dropped data and remaining", _edit(_edit(good, ("data", k_pend), drop=True), ("remaining", k_rem),
                                             drop=True), "not in 'data'"),
        ("truncated data", _edit(good, ("data", k_pend), [pend_sid, rows[pend_sid]["input_ids"][:1],
                                                           rows[pend_sid]["labels"][:1]]), "truncated|'remaining'"),
        ("dropped pool", _edit(good, ("planner", "packer", "pool"), []), "'remaining' says|tokens left"),
        ("dup pool item", _edit(good, ("planner", "packer", "pool", 0), dup=True), "twice|appears|overlap"),
        ("dup pending pack", _edit(good, ("pending", 0), dup=True), "repeats tokens|'remaining' says"),
        ("dup reserve into pending", _edit(good, ("pending",), good["pending"] + good["planner"]["reserve"]),
         "repeats tokens"),
        ("dup look-ahead", _edit(good, ("lookahead", 0), dup=True), "'lookahead'"),
        ("look-ahead not in data", _edit(good, ("lookahead",), good["lookahead"] + [10**5]), "lookahead"),
        ("end=10**9", _edit(good, ("pending", 0, 0, 2), 10**9), "max_tokens|span|truncated"),
        ("pool end=10**9", _edit(good, ("planner", "packer", "pool", 0, 2), 10**9), "max_tokens"),
        ("str ids", _edit(good, ("data", 0, 1), "123"), "input_ids"),
        ("float ids", _edit(good, ("data", 0, 1), [1.5] * len(good["data"][0][1])), "input_ids"),
        ("bool ids", _edit(good, ("data", 0, 1), [True] * len(good["data"][0][1])), "input_ids"),
        ("huge ids", _edit(good, ("data", 0, 1), [2**70] * len(good["data"][0][1])), "input_ids"),
        ("short labels", _edit(good, ("data", 0, 2), [1]), "labels"),
        ("data not a list", _edit(good, ("data",), {"0": 1}), "'data'"),
        ("pending not a list", _edit(good, ("pending",), 3), "'pending'"),
        ("pending pack over cap", _edit(good, ("pending", 0), good["pending"][0] * 9), "max_tokens|repeats"),
        ("reserve dropped", _edit(good, ("planner", "reserve"), drop=True), "'reserve'"),
        ("v1 format", _edit(good, ("format",), "atac-hf/packed-iterable/v1"), "earlier versions"),
    ]
    refused = _refuse_all(ds, variants)
    twin = make()
    twin.load_state_dict(good)
    rest = list(it)
    assert rest == list(twin)
    tokens = Counter(t for row in taken + rest for t in row["input_ids"])
    assert max(tokens.values()) == 1 and len(tokens) == sum(len(r["input_ids"]) for r in rows)
    count("state.refused_unchanged", refused)


# ---------------------------------------------------------------------------- resume equals the uninterrupted run
def test_stream_packer_json_resume_at_every_window_equals_the_uninterrupted_run():
    """Split samples with more fragments than packs_per_window (the backlog), WFAP's balance
    split, deferral, every strategy: resuming from the JSON state at any window boundary gives
    exactly the packs of the run that was never interrupted."""
    import numpy as np

    from atac_hf.cost import CostModel

    quad = CostModel(linear_s_per_token=0.01, attn_s_per_pair=1.0, tile=1)
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(40):
        cap = int(rng.choice([2, 4, 16]))
        config = PackingConfig(max_tokens=cap, packs_per_window=int(rng.integers(1, 4)),
                               strategy=str(rng.choice(["wfap", "sequential", "bfd", "wlb"])),
                               max_defer=int(rng.choice([0, 1, 3])), balance_split=bool(rng.integers(0, 2)),
                               reference_doc_tokens=int(rng.choice([1, 2])), min_fragment=1)
        windows = [(list(range(10 * w, 10 * w + k)), rng.integers(0, 6 * cap, size=k).tolist())
                   for w, k in enumerate(rng.integers(0, 6, size=5))]

        def run(cut):
            p, out = StreamPacker(config, quad), []
            for w, window in enumerate(windows + [None]):
                if w == cut:
                    q = StreamPacker(config, quad)
                    q.load_state_dict(json.loads(json.dumps(p.state_dict())))
                    p = q
                if window is not None:
                    out.append(p.add_window(*window))
            return out + p.flush_windows()

        ref = run(None)
        for cut in range(len(windows) + 1):
            assert run(cut) == ref, f"{config}: resume at window {cut} differs"
            checked += 1
    count("state.resumes_equal_uninterrupted", checked)

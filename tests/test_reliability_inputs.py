"""Reliability: one validator per concept, bounded numbers, no silent splits (issue 13,
items 5, 6 and 8; issue 17, item 8).

* Sample lengths: every entry point (``pack_lengths``, ``StreamPacker.add_window``,
  ``WFAPBatchSampler``, ``plan_packs``) refuses the same malformed lengths with the same
  exception type and message (``TypeError`` for wrong types, ``ValueError`` for bad values),
  and a refused window changes nothing.
* Token ids: ``PackedIterableDataset`` and ``PackedDataCollator`` refuse text, floats,
  bools, nested lists and ids beyond int64, naming the sample and the field.
* Huge or degenerate numbers are refused at once (nothing hangs, wraps or overflows).
* ``PackingConfig`` takes numpy numbers for numeric fields (stored as Python numbers) and
  refuses bools for them.
* A sample longer than ``max_tokens`` split under ``overlength="split"`` warns once per packer.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _reliability  # noqa: E402
from _reliability import count  # noqa: E402

from atac_hf.packing import PackedDataCollator, PackedIterableDataset, PackingConfig, StreamPacker
from atac_hf.packing import WFAPBatchSampler, pack_lengths
from atac_hf.packing.data.window_planner import plan_packs
from atac_hf.packing.validate import InputTypeError, check_lengths, check_token_ids


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    _reliability.flush(__name__)


CFG = PackingConfig(max_tokens=16, packs_per_window=2)

BAD_LENGTHS = [
    ([3, 2.5], TypeError, r"lengths\[1\] = 2.5 is not an int"),
    ([3, True], TypeError, r"lengths\[1\] = True is not an int"),
    ([np.bool_(True)], TypeError, r"lengths\[0\] = np.True_ is not an int|lengths\[0\] = True"),
    (["3"], TypeError, r"lengths\[0\] = '3' is not an int"),
    ("345", TypeError, r"lengths must be a sequence of ints, got str '345'"),
    (b"345", TypeError, r"lengths must be a sequence of ints, got bytes"),
    (5, TypeError, r"lengths must be a sequence of ints, got int 5"),
    (None, TypeError, r"lengths must be a sequence of ints, got NoneType"),
    ({"a": 3}, TypeError, r"lengths must be a sequence of ints, got dict"),
    ([[1, 2], [3, 4]], TypeError, r"lengths must be a flat sequence of ints, got shape \(2, 2\)"),
    ([[1, 2], [3]], TypeError, r"lengths must be a flat sequence of ints, got a ragged nested sequence"),
    ([3, [4]], TypeError, r"lengths must be a flat sequence of ints"),
    (np.zeros((2, 2), dtype=np.int64), TypeError, r"flat sequence of ints, got shape \(2, 2\)"),
    ([float("inf")], TypeError, r"lengths\[0\] = inf is not an int"),
    ([float("nan")], TypeError, r"lengths\[0\] = nan is not an int"),
    ([None, 3], TypeError, r"lengths\[0\] = None is not an int"),
    (np.array([1.0, 2.0]), TypeError, r"lengths\[0\] = 1.0 is not an int.*dtype float64"),
    (np.array([True]), TypeError, r"lengths\[0\] = True is not an int"),
    (np.array(["3"]), TypeError, r"lengths\[0\] = '3' is not an int"),
    ([3, -1], ValueError, r"lengths\[1\] = -1 is negative"),
    (np.array([-4], dtype=np.int8), ValueError, r"lengths\[0\] = -4 is negative"),
    ([2**70], ValueError, r"lengths\[0\] = 1180591620717411303424 is too long: .*<= 1099511627776 \(2\*\*40\)"),
    ([2**63 - 1], ValueError, r"lengths\[0\] = 9223372036854775807 is too long"),
    ([2**40 + 1], ValueError, r"is too long"),
    (np.array([2**64 - 1], dtype=np.uint64), ValueError, r"lengths\[0\] = 18446744073709551615 is too long"),
    ([-(2**70)], ValueError, r"too long|negative"),
]


def _entry_points():
    """Each takes lengths and reaches the one validator."""
    return {
        "pack_lengths": lambda lengths: pack_lengths(lengths, CFG),
        "StreamPacker.add_window": lambda lengths: StreamPacker(CFG).add_window([0], lengths),  # lengths first
        "WFAPBatchSampler": lambda lengths: WFAPBatchSampler(lengths, CFG),
        "plan_packs": lambda lengths: plan_packs(lengths, CFG),
        "check_lengths": check_lengths,
    }


@pytest.mark.parametrize("lengths, exc, match", BAD_LENGTHS, ids=[repr(c[0])[:30] for c in BAD_LENGTHS])
def test_every_entry_point_refuses_bad_lengths_alike(lengths, exc, match):
    messages = {}
    for name, call in _entry_points().items():
        with pytest.raises(exc, match=match) as info:
            call(lengths)
        if exc is TypeError:
            assert isinstance(info.value, InputTypeError), f"{name}: {type(info.value).__name__}"
        messages[name] = str(info.value)
        count("inputs.bad_lengths_refused")
    assert len(set(messages.values())) == 1, f"entry points word the same mistake differently: {messages}"


def test_refused_window_changes_nothing_and_lengths_of_every_int_type_work():
    p = StreamPacker(CFG)
    p.add_window([0, 1, 2], [5, 40, 3])
    before = json.dumps(p.state_dict(), sort_keys=True)
    for lengths, _exc, _match in BAD_LENGTHS:
        try:
            p.add_window([10], lengths)
        except (TypeError, ValueError):
            pass
        assert json.dumps(p.state_dict(), sort_keys=True) == before
    with pytest.raises(InputTypeError, match=r"sample_ids must be ints.*sample_ids\[0\] = 'a' is not an int"):
        p.add_window(["a"], [3])
    with pytest.raises(TypeError, match=r"sample_ids\[0\] = True is not an int"):
        p.add_window([True], [3])
    assert json.dumps(p.state_dict(), sort_keys=True) == before
    for dtype in (np.int8, np.uint8, np.int16, np.uint32, np.int64, np.uint64):
        arr = np.array([5, 40, 3], dtype=dtype)
        assert check_lengths(arr).tolist() == [5, 40, 3] and check_lengths(arr).dtype == np.int64
        assert len(WFAPBatchSampler(arr, CFG)) == len(WFAPBatchSampler([5, 40, 3], CFG))
    assert check_lengths((n for n in (1, 2))).tolist() == [1, 2] and check_lengths([]).size == 0
    assert check_lengths([np.int32(4), 5]).tolist() == [4, 5]
    count("inputs.lengths_dtypes_accepted", 6)


# ---------------------------------------------------------------------------- token ids
BAD_SAMPLES = [
    ({"input_ids": "123"}, TypeError, r"source sample 2: input_ids must be a 1-D sequence of ints, got the str"),
    ({"input_ids": b"12"}, TypeError, r"source sample 2: input_ids must be a 1-D sequence of ints"),
    ({"input_ids": [1.0, 2.0]}, TypeError, r"source sample 2: input_ids must hold ints.*input_ids\[0\] = 1.0"),
    ({"input_ids": [1, 2.7]}, TypeError, r"source sample 2: input_ids must hold ints.*input_ids\[1\] = 2.7"),
    ({"input_ids": [True, False]}, TypeError, r"source sample 2: input_ids must hold ints.*= True"),
    ({"input_ids": np.array([1.5])}, TypeError, r"source sample 2: input_ids must hold ints.*dtype float64"),
    ({"input_ids": None}, TypeError, r"source sample 2: input_ids must be a 1-D sequence of ints, got NoneType"),
    ({"input_ids": 7}, TypeError, r"source sample 2: input_ids must be a 1-D sequence of ints, got int"),
    ({"input_ids": [[1, 2], [3]]}, TypeError, r"source sample 2: input_ids must be a 1-D sequence.*ragged"),
    ({"input_ids": [[1, 2], [3, 4]]}, TypeError, r"source sample 2: input_ids must be a 1-D sequence.*\(2, 2\)"),
    ({"input_ids": [1, "2"]}, TypeError, r"source sample 2: input_ids must hold ints.*input_ids\[1\] = '2'"),
    ({"input_ids": [2**70]}, ValueError, r"source sample 2: input_ids must hold ints.*out of range"),
    ({"input_ids": np.array([2**64 - 1], dtype=np.uint64)}, ValueError, r"source sample 2: input_ids.*out of range"),
    ({"input_ids": [3, -1]}, ValueError, r"source sample 2: input_ids has negative entries"),
    ({"input_ids": [1, 2], "labels": [1.5, 2]}, TypeError, r"source sample 2: labels must hold ints"),
    ({"input_ids": [1, 2], "labels": "ab"}, TypeError, r"source sample 2: labels must be a 1-D sequence"),
    ({"input_ids": [1, 2], "labels": [1]}, ValueError, r"source sample 2: labels has 1 entries but input_ids has 2"),
    ({"input_ids": [1, 2], "labels": [1, 2, 3]}, ValueError, r"source sample 2: labels has 3 entries"),
    ({"text": "hi"}, ValueError, r"source sample 2 has no 'input_ids'; found: \['text'\]"),
    ("just text", ValueError, r"source sample 2 has no 'input_ids'; found: str"),
]


@pytest.mark.parametrize("sample, exc, match", BAD_SAMPLES, ids=[repr(c[0])[:30] for c in BAD_SAMPLES])
def test_iterable_dataset_names_the_sample_and_the_field(sample, exc, match):
    source = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, sample, {"input_ids": [6]}]
    with pytest.raises(exc, match=match):
        list(PackedIterableDataset(source, CFG))
    count("inputs.bad_samples_refused")


def test_one_token_validator_for_the_stream_and_the_collator():
    """The collator words the same mistakes with the same validator (``feature k`` for ``source sample k``)."""
    for value, field in (("123", "input_ids"), ([1.5], "input_ids"), ([True], "input_ids"), ([2**70], "input_ids"),
                         ([[1], [2, 3]], "input_ids"), ([-3], "input_ids"), ([0.5], "labels")):
        with pytest.raises((TypeError, ValueError)) as a:
            check_token_ids(value, where="source sample 0", field=field)
        feature = {"input_ids": value} if field == "input_ids" else {"input_ids": [1], "labels": value}
        with pytest.raises(type(a.value)) as b:
            PackedDataCollator()([feature])
        assert str(b.value) == str(a.value).replace("source sample 0", "feature 0")
        count("inputs.same_message_stream_and_collator")
    ok = check_token_ids(np.array([[1, 2, 3]], dtype=np.int32), where="feature 0", field="input_ids")
    assert ok.tolist() == [1, 2, 3] and ok.dtype == np.int64
    assert check_token_ids([-100, 5], where="feature 0", field="labels").tolist() == [-100, 5]


# ---------------------------------------------------------------------------- huge numbers, config types
@pytest.mark.parametrize("kw, match", [
    (dict(max_tokens=2**70), r"max_tokens=1180591620717411303424 is invalid: it must be an int > 0 and <= "),
    (dict(max_tokens=2**40 + 1), r"max_tokens=1099511627777 is invalid"),
    (dict(max_tokens=np.uint64(2**64 - 1)), r"max_tokens=.*18446744073709551615.* is invalid"),
    (dict(packs_per_window=2**70), r"packs_per_window=1180591620717411303424 is invalid: .*<= 65536"),
    (dict(packs_per_window=2**16 + 1), r"packs_per_window=65537 is invalid"),
    (dict(packs_per_window=1e30), r"packs_per_window=1e\+30 is invalid"),
    (dict(packs_per_window=float("inf")), r"packs_per_window=inf is invalid"),
    (dict(max_defer=2**70), r"max_defer=1180591620717411303424 is invalid"),
    (dict(reference_doc_tokens=2**70), r"reference_doc_tokens=1180591620717411303424 must be an int >= 1 and <="),
    (dict(wlb_thresholds=(2**70,)), r"wlb_thresholds=\(1180591620717411303424,\) is invalid"),
    (dict(wlb_thresholds=tuple(range(1, 100))), r"at most 64"),
    (dict(balance_tolerance=1e300), r"balance_tolerance=1e\+300 is invalid"),
    (dict(balance_tolerance=float("inf")), r"balance_tolerance=inf is invalid"),
    (dict(balance_tolerance=True), r"balance_tolerance=True is invalid"),
    (dict(balance_tolerance=np.bool_(True)), r"balance_tolerance=.*True_? is invalid"),
    (dict(max_tokens=np.bool_(True)), r"max_tokens=.*True_? is invalid"),
    (dict(packs_per_window=True), r"packs_per_window=True is invalid"),
    (dict(min_fragment=True), r"min_fragment=True is invalid"),
    (dict(max_defer=False), r"max_defer=False is invalid"),
    (dict(reference_doc_tokens=True), r"reference_doc_tokens=True must be an int"),
    (dict(wlb_thresholds=(True, 4)), r"wlb_thresholds=\(True, 4\) is invalid"),
    (dict(max_tokens=16.0), r"max_tokens=16.0 is invalid"),
    (dict(balance_tolerance=np.float32("nan")), r"balance_tolerance=.*nan\)? is invalid"),
])
def test_huge_degenerate_and_bool_numbers_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        PackingConfig(**{"max_tokens": 16, "packs_per_window": 2, **kw})
    count("inputs.bad_config_numbers_refused")


def test_numpy_numbers_are_accepted_and_stored_as_python_numbers():
    c = PackingConfig(max_tokens=np.int64(16), packs_per_window=np.int32(4), balance_tolerance=np.float32(1.1),
                      max_defer=np.uint8(3), min_fragment=np.int16(2), reference_doc_tokens=np.int64(64),
                      wlb_thresholds=np.array([4, 8]), split_overdue=np.bool_(False))
    d = c.to_dict()
    json.dumps(d)  # JSON, no numpy scalars left
    assert type(c.max_tokens) is int and type(c.balance_tolerance) is float and type(c.split_overdue) is bool
    assert c.balance_tolerance == pytest.approx(1.1) and c.wlb_thresholds == (4, 8)
    assert PackingConfig.from_dict(d) == c
    assert PackingConfig(max_tokens=16, packs_per_window=2, balance_tolerance=np.float64(2)).balance_tolerance == 2.0
    assert PackingConfig(max_tokens=16, packs_per_window=2, balance_tolerance=3).balance_tolerance == 3.0


def test_huge_numbers_elsewhere_are_refused():
    for call, exc, match in [
        (lambda: WFAPBatchSampler([3], CFG, num_replicas=2**70), ValueError, r"num_replicas=1180591620717411303424"),
        (lambda: WFAPBatchSampler([3], CFG, num_replicas=True), ValueError, r"num_replicas=True"),
        (lambda: WFAPBatchSampler([3], CFG, window_size=2**70), ValueError, r"window_size=1180591620717411303424"),
        (lambda: WFAPBatchSampler([3], CFG, window_size=True), ValueError, r"window_size=True"),
        (lambda: WFAPBatchSampler([3], CFG, seed=2**64), ValueError, r"seed=18446744073709551616 is invalid"),
        (lambda: WFAPBatchSampler([3], CFG, seed=-5), ValueError, r"seed=-5 is invalid: it must be an int in"),
        (lambda: WFAPBatchSampler([3], CFG, seed=1.5), TypeError, r"seed=1.5 is not an int"),
        (lambda: WFAPBatchSampler([3], CFG, shuffle="yes"), TypeError, r"shuffle='yes' must be True or False"),
        (lambda: WFAPBatchSampler([3], CFG, even_batches=None), TypeError, r"even_batches=None must be True or"),
        (lambda: PackedIterableDataset([], CFG, num_replicas=2**70), ValueError, r"num_replicas="),
        (lambda: plan_packs([3, 4], CFG, order=[0, 0]), ValueError,
         r"order=\[0, 0\] is invalid: it must be a permutation"),
        (lambda: plan_packs([3, 4], CFG, order=[0, 1.5]), TypeError, r"order\[1\] = 1.5 is not an int"),
        (lambda: pack_lengths([3], CFG, window=2**70 + 0.5), ValueError, r"window="),
    ]:
        with pytest.raises(exc, match=match):
            call()
        count("inputs.bad_arguments_refused")
    # the largest legal values plan at once (nothing loops per token or per unit of the cap)
    big = PackingConfig(max_tokens=2**40, packs_per_window=2)
    assert [len(p) for p in pack_lengths([2**40, 2**40 - 1, 5], big).packs] and \
        pack_lengths([2**40], PackingConfig(max_tokens=2**39, packs_per_window=2)).metrics["num_split"] == 1
    spans, offsets = plan_packs([2**40] * 3, big, num_replicas=2)
    assert (len(offsets) - 1) % 2 == 0 and int((spans[:, 2] - spans[:, 1]).sum()) == 3 * 2**40


# ---------------------------------------------------------------------------- overlength warning
def test_overlength_split_warns_once_per_packer_with_counts_and_the_setting():
    config = PackingConfig(max_tokens=16, packs_per_window=2)
    p = StreamPacker(config)
    with pytest.warns(UserWarning, match=r"2 sample\(s\) of this window are longer than max_tokens=16 \(the longest "
                                         r"has 40 tokens\).*overlength='split'.*overlength='error'.*'truncate'"):
        p.add_window([0, 1, 2], [40, 3, 17])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p.add_window([3], [50])  # once per packer
        p.flush()
        StreamPacker(PackingConfig(max_tokens=16, packs_per_window=2, overlength="truncate")).add_window([0], [40])
        StreamPacker(config).add_window([0, 1], [16, 3])  # nothing over the cap
    assert p.metrics["num_split"] == 3
    with pytest.raises(ValueError, match="overlength='error'"):
        StreamPacker(PackingConfig(max_tokens=16, packs_per_window=2, overlength="error")).add_window([0], [40])
    with pytest.warns(UserWarning, match="longer than max_tokens=16") as rec:
        pack_lengths([40, 3, 90, 2, 17] * 20, config)
    assert len([w for w in rec if "longer than max_tokens" in str(w.message)]) == 1
    count("inputs.overlength_warnings", 2)


def test_a_sample_with_thousands_of_fragments_keeps_the_planners_pool_small_and_resumes_exactly():
    """A split sample's fragments beyond packs_per_window wait outside the planner's pool (its
    work grows with the pool: 2,048 fragments took 48 s when all were in it); the pool the
    planner sees stays bounded, every token is placed once, and a JSON resume mid-way gives
    the same packs. Too many fragments are refused up front."""
    config = PackingConfig(max_tokens=4, packs_per_window=2, strategy="wfap")
    lengths = [3, 4 * 1500 + 3, 2, 5, 4 * 700]
    seen = []

    def run(resume_at=None):
        p = StreamPacker(config)
        planner = p._planner
        p._planner = lambda pool, ctx: (seen.append(len(pool)), planner(pool, ctx))[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = p.add_window(range(5), lengths)
        windows = 0
        while p.pending_tokens:
            if windows == resume_at:
                q = StreamPacker(config)
                q.load_state_dict(json.loads(json.dumps(p.state_dict())))
                q._planner, p = p._planner, q
            out += p.add_window([], [])
            windows += 1
        return out

    packs = run()
    bound = 2 * config.packs_per_window + len(lengths)  # two split samples show packs_per_window fragments each
    assert max(seen) <= bound, f"the planner saw pools of {max(seen)} items"
    spans = sorted(s for pack in packs for s in pack)
    covered = {(i, t) for i, a, e in spans for t in range(a, e)}
    assert len(covered) == sum(lengths) == sum(e - a for _i, a, e in spans)
    assert run(resume_at=400) == packs and run(resume_at=1) == packs
    with pytest.raises(ValueError, match=r"sample 0 has 8196 tokens: split at max_tokens=4 that is 2049 fragments, "
                                         r"more than the 2048 a sample may have"):
        StreamPacker(config).add_window([0], [4 * 2048 + 4])
    with pytest.raises(ValueError, match=r"274877906944 fragments, more than the 16384"):
        pack_lengths([2**40], PackingConfig(max_tokens=4, packs_per_window=64))
    count("inputs.fragment_backlog_runs", 3)


def test_span_dataset_stream_source_and_window_size_refuse_malformed_arguments():
    from atac_hf.packing import SpanDataset

    ds = SpanDataset([{"input_ids": [1, 2, 3, 4]}])
    for key, exc, match in [((0, 3, 1), ValueError, r"span \(0, 3, 1\) must have 0 <= start <= end"),
                            ((0, -1, 2), ValueError, r"0 <= start <= end"),
                            ((0, "1", 2), TypeError, r"span of ints, got \(0, '1', 2\)"),
                            ((0, 1.5, 2), TypeError, r"span of ints"), ("a", TypeError, r"an int or a \(sample")]:
        with pytest.raises(exc, match=match):
            ds[key]
        count("inputs.bad_arguments_refused")
    assert ds[(0, 1, 3)] == {"input_ids": [2, 3]}
    for source in ("abc", {"input_ids": [1]}, 5, None):
        with pytest.raises(TypeError, match="source must be a re-iterable of samples"):
            PackedIterableDataset(source, CFG)
        count("inputs.bad_arguments_refused")
    with pytest.raises(TypeError, match="even_batches='no' must be True or False"):
        PackedIterableDataset([], CFG, even_batches="no")
    p = StreamPacker(CFG)
    for lengths, exc in (([2.5], TypeError), (["3"], TypeError), ([-1], ValueError), ([2**70], ValueError)):
        with pytest.raises(exc, match=r"lengths\[0\]"):
            p.window_size(lengths)
        with pytest.raises(exc, match=r"lengths\[0\]"):
            p.supply_tokens(lengths)
        count("inputs.bad_arguments_refused", 2)

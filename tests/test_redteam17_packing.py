"""Red-team 17: hostile arguments to the packing helpers are refused at the call with a message
naming the value, the legal values and the setting (PackingConfig constructors, pack_costs,
recount_metrics, SpanDataset, PackedIterableDataset.state_dict, unordered lengths)."""

import numpy as np
import pytest

from atac_hf import PackingConfig, default_cost_model
from atac_hf.packing import PackedIterableDataset, SpanDataset, StreamPacker, pack_costs, pack_lengths, recount_metrics
from atac_hf.packing.validate import InputTypeError

CM = default_cost_model()
CFG = PackingConfig(max_tokens=16, packs_per_window=2)


# ---------------------------------------------------------------------------- PackingConfig constructors
def test_for_training_refuses_packs_per_window_and_unknown_options():
    """red-team 17: for_training's options: packs_per_window is derived, unknown keys list the legal ones."""
    with pytest.raises(TypeError, match=r"for_training: packs_per_window=5 cannot be set here.*dp_size \* grad_accum"):
        PackingConfig.for_training(16, packs_per_window=5)
    with pytest.raises(TypeError, match=r"unknown packing setting\(s\) \['nope'\]; legal: \['dp_size', 'grad_accum', "
                                        r"'strategy'.*'band_placement'\]"):
        PackingConfig.for_training(16, nope=1)
    c = PackingConfig.for_training(16, dp_size=2, grad_accum=3, strategy="bfd")
    assert (c.packs_per_window, c.strategy) == (6, "bfd")


def test_from_dict_names_the_missing_required_keys():
    """red-team 17: from_dict without a required key names it and the required ones."""
    with pytest.raises(ValueError, match=r"missing the required key\(s\) \['packs_per_window'\].*'max_tokens' and "
                                         r"'packs_per_window'"):
        PackingConfig.from_dict({"max_tokens": 16})
    with pytest.raises(ValueError, match=r"missing the required key\(s\) \['max_tokens', 'packs_per_window'\]"):
        PackingConfig.from_dict({})
    assert PackingConfig.from_dict(CFG.to_dict()) == CFG


# ---------------------------------------------------------------------------- pack_costs
@pytest.mark.parametrize("packs, exc, match", [
    ([[(0, 5, 0)]], ValueError, r"packs\[0\]\[0\] = \(0, 5, 0\) is not a span: .*0 <= start < end"),
    ([[(0, 3, 3)]], ValueError, r"packs\[0\]\[0\] = \(0, 3, 3\) is not a span"),
    ([[(0, 0, 2)], [(1, 0, 4), (0, -3, 5)]], ValueError, r"packs\[1\]\[1\] = \(0, -3, 5\) is not a span"),
    ([[(0, 0, 2**40 + 1)]], ValueError, r"is not a span: .*end <= 2\*\*40"),
    ([[(0, 0, 2**70)]], ValueError, r"packs\[0\]\[0\] = .* is out of range"),
    ([[(0, 0, 5.5)]], InputTypeError, r"packs\[0\]\[0\] = \(0, 0, 5\.5\) is not a span: a span is \(sample, start, "
                                      r"end\) ints"),
    ([[(0, 0, True)]], InputTypeError, r"packs\[0\]\[0\] = \(0, 0, True\) is not a span"),
    ([[(0, 0)]], InputTypeError, r"packs\[0\]\[0\] = \(0, 0\) is not a span"),
    ([[{0, 1, 5}]], InputTypeError, r"packs\[0\]\[0\] = \{0, 1, 5\} is not a span"),
    ([[(0, 0, 2)], 7], InputTypeError, r"packs\[1\] = 7 is not a pack"),
    ([np.array([[0, 0, 2.5]])], InputTypeError, r"packs\[0\]\[0\] = .* is not a span"),
    ([np.array([[0, 4, 2]])], ValueError, r"packs\[0\]\[0\] = \(0, 4, 2\) is not a span"),
    (None, InputTypeError, r"packs=None is not a list of packs"),
    ("abc", InputTypeError, r"packs='abc' is not a list of packs"),
    ([[(0, 0, 3)], []], ValueError, r"a pack is empty \(packs\[1\]\)"),
])
def test_pack_costs_refuses_malformed_packs(packs, exc, match):
    """red-team 17: pack_costs checks every span (3 ints, 0 <= start < end) instead of pricing garbage."""
    with pytest.raises(exc, match=match):
        pack_costs(packs, CM)


def test_pack_costs_refuses_a_missing_cost_model_and_keeps_legal_results():
    """red-team 17: cost_model=None is named; legal packs (tuples, lists, int arrays) cost as before."""
    with pytest.raises(TypeError, match=r"pack_costs: cost_model=None is not a CostModel.*default_cost_model"):
        pack_costs([[(0, 0, 5)]], None)
    packs = [[(0, 0, 5), (1, 2, 9)], [[2, 0, 3]]]
    want = np.array([CM.doc_cost(np.array([5, 7])).sum(), CM.doc_cost(np.array([3])).sum()])
    assert np.allclose(pack_costs(packs, CM), want)
    assert np.allclose(pack_costs([np.array(p, dtype=np.int32) for p in packs], CM), want)
    assert np.allclose(pack_costs([[(np.int64(0), 0, 5), (1, np.uint8(2), 9)], [(2, 0, 3)]], CM), want)
    assert pack_costs([], CM).shape == (0,)


# ---------------------------------------------------------------------------- recount_metrics
def _recount(windows, lengths, **kw):
    return recount_metrics(windows, lengths, **{"max_tokens": 16, "cost_model": CM, **kw})


@pytest.mark.parametrize("max_tokens", [0, -1, 2**41, 1.5, True, "16"])
def test_recount_metrics_refuses_a_bad_max_tokens(max_tokens):
    """red-team 17: recount_metrics' max_tokens must be an int in [1, 2**40] (was ZeroDivisionError at 0)."""
    with pytest.raises(ValueError, match=rf"recount_metrics: max_tokens={max_tokens!r} is invalid: it must be an int "
                                         r"> 0 .*set max_tokens"):
        _recount([[[(0, 0, 5)]]], [5], max_tokens=max_tokens)


@pytest.mark.parametrize("windows, lengths, match", [
    ([[[(0, 0, 50)]]], [5], r"sample 0: a span ends at token 50, past its 5 tokens"),
    ([[[(0, 0, 5)], [(0, 0, 5)]]], [5], r"sample 0: two spans hold the same tokens"),
    ([[[(0, 0, 3)]], [[(0, 2, 5)]]], [5], r"sample 0: two spans hold the same tokens"),
    ([[[(7, 0, 5)]]], [5], r"the packs hold sample 7 but lengths has no entry for it \(lengths holds 1 samples\)"),
    ([[[(-1, 0, 5)]]], [5], r"the packs hold sample -1 but lengths has no entry"),
    ([[[(0, 0, 5)], [(1, 0, 2)]]], {0: 5}, r"the packs hold sample 1 but lengths has no entry for it \(lengths holds "
                                           r"ids 0\.\.0\)"),
])
def test_recount_metrics_refuses_spans_its_lengths_cannot_hold(windows, lengths, match):
    """red-team 17: spans past a sample's length, a sample packed twice, unknown ids are refused."""
    with pytest.raises(ValueError, match="recount_metrics: " + match):
        _recount(windows, lengths)


def test_recount_metrics_refuses_bad_arguments():
    """red-team 17: cost_model, lengths, arrival, zero_length_skipped and windows are checked."""
    with pytest.raises(TypeError, match=r"recount_metrics: cost_model=None is not a CostModel"):
        _recount([[[(0, 0, 5)]]], [5], cost_model=None)
    with pytest.raises(InputTypeError, match=r"lengths\[0\] = 5\.0 is not an int"):
        _recount([[[(0, 0, 5)]]], [5.0])
    with pytest.raises(InputTypeError, match=r"lengths\['a'\] = 5: lengths must map sample ids \(ints\) to ints"):
        _recount([[[(0, 0, 5)]]], {"a": 5})
    with pytest.raises(ValueError, match=r"lengths\[0\] = -5 is out of range"):
        _recount([[[(0, 0, 5)]]], {0: -5})
    with pytest.raises(ValueError, match=r"sample 0 is in window 0 but arrival\[0\] = 2"):
        _recount([[[(0, 0, 5)]]], [5], arrival=[2])
    with pytest.raises(ValueError, match=r"the packs hold sample 0 but arrival has no entry"):
        _recount([[[(0, 0, 5)]]], [5], arrival=[])
    with pytest.raises(InputTypeError, match=r"arrival=\{0\} must be None, a list of window indices"):
        _recount([[[(0, 0, 5)]]], [5], arrival={0})
    with pytest.raises(ValueError, match=r"zero_length_skipped=-1 must be None or an int >= 0"):
        _recount([[[(0, 0, 5)]]], [5], zero_length_skipped=-1)
    with pytest.raises(InputTypeError, match=r"windows=None must be a list of windows"):
        _recount(None, [5])
    with pytest.raises(ValueError, match=r"windows\[1\]\[0\]\[0\] = \(0, 4, 2\) is not a span"):
        _recount([[], [[(0, 4, 2)]]], [5])


def test_recount_metrics_legal_inputs_unchanged():
    """red-team 17: mappings, arrays and empty packs still recount (and match the packer's own count)."""
    m = _recount([[[(0, 0, 4)], [(1, 0, 2), (2, 0, 2)]], [], [[(3, 0, 3)]]], {0: 4, 1: 2, 2: 2, 3: 5, 4: 0},
                 max_tokens=4, arrival={0: 0, 1: 0, 2: 0, 3: 1})
    assert (m["tokens"], m["truncated_tokens"], m["delay_max"], m["zero_length_skipped"]) == (11, 2, 1, 1)
    lengths = np.random.default_rng(3).integers(0, 40, 120)
    res = pack_lengths(lengths, CFG, CM)
    again = recount_metrics(res.windows(), lengths, max_tokens=16, cost_model=CM, arrival=np.array(res.arrival))
    for k, v in res.metrics.items():
        if k != "num_overdue":
            assert again[k] == pytest.approx(v), k


# ---------------------------------------------------------------------------- SpanDataset
ROWS = [{"input_ids": [1, 2, 3, 4], "labels": [1, 2, 3, 4]}, {"input_ids": [9, 9], "labels": [9, 9]}]


@pytest.mark.parametrize("columns, exc, match", [
    ("input_ids", InputTypeError, r"columns='input_ids' must be a sequence of column names.*\('input_ids',\)"),
    (None, InputTypeError, r"columns=None must be a sequence of column names"),
    (("input_ids", 3), InputTypeError, r"columns=\('input_ids', 3\) must be a sequence of column names"),
    (("nope",), ValueError, r"columns=\('nope',\) must include 'input_ids'.*default: \['input_ids', 'labels'"),
])
def test_span_dataset_refuses_bad_columns(columns, exc, match):
    """red-team 17: SpanDataset's columns: a str, None or no input_ids made every span {}."""
    with pytest.raises(exc, match="SpanDataset: " + match):
        SpanDataset(ROWS, columns=columns)


def test_span_dataset_names_unknown_columns_with_the_legal_ones():
    """red-team 17: a column the rows (or the datasets.Dataset) lack is named with the columns they have."""
    with pytest.raises(ValueError, match=r"SpanDataset\[\(0, 1, 3\)\]: the sample has no 'nope' column; its columns: "
                                         r"\['input_ids', 'labels'\]"):
        SpanDataset(ROWS, columns=("input_ids", "nope"))[(0, 1, 3)]
    datasets = pytest.importorskip("datasets")
    with pytest.raises(ValueError, match=r"SpanDataset: columns \['nope'\] are not columns of the dataset; its "
                                         r"columns: \['input_ids', 'labels'\]"):
        SpanDataset(datasets.Dataset.from_list(ROWS), columns=("input_ids", "nope"))
    # optional token columns the rows lack stay allowed (the default names six)
    assert SpanDataset(ROWS, columns=("input_ids", "completion_mask"))[(0, 1, 3)] == {"input_ids": [2, 3]}


@pytest.mark.parametrize("key, exc, match", [
    ((-1, 0, 2), IndexError, r"sample -1 \(index \(-1, 0, 2\)\) is out of range: legal sample ids 0\.\.1 \(a negative"),
    (-1, IndexError, r"sample -1 \(index -1\) is out of range: legal sample ids 0\.\.1"),
    (5, IndexError, r"sample 5 \(index 5\) is out of range: legal sample ids 0\.\.1"),
    ((2, 0, 1), IndexError, r"sample 2 \(index \(2, 0, 1\)\) is out of range"),
    ((0, 0, 9), ValueError, r"span \(0, 0, 9\) ends past the sample's 4 tokens: spans must have 0 <= start <= end <= "),
])
def test_span_dataset_refuses_out_of_range_keys(key, exc, match):
    """red-team 17: negative ids no longer wrap, ends past the sample are not clipped."""
    ds = SpanDataset(ROWS)
    with pytest.raises(exc, match="SpanDataset" + ".*" + match):
        ds[key]
    with pytest.raises(exc, match=match):
        ds.__getitems__([0, key])


def test_span_dataset_checks_datasets_rows_and_keeps_legal_reads():
    """red-team 17: the batched datasets path refuses the same keys; legal spans read as before."""
    datasets = pytest.importorskip("datasets")
    ds = SpanDataset(datasets.Dataset.from_list(ROWS))
    with pytest.raises(ValueError, match=r"span \(1, 0, 3\) ends past the sample's 2 tokens"):
        ds.__getitems__([(1, 0, 3)])
    with pytest.raises(IndexError, match=r"sample -1 \(index -1\) is out of range"):
        ds.__getitems__([-1])
    assert ds.__getitems__([(0, 1, 3), 1, (1, 2, 2)]) == [
        {"input_ids": [2, 3], "labels": [2, 3]}, ROWS[1], {"input_ids": [], "labels": []}]
    assert ds[(0, 0, 4)] == ROWS[0] and SpanDataset([{"input_ids": [[5, 6, 7]]}])[(0, 1, 3)] == {"input_ids": [[6, 7]]}


# ---------------------------------------------------------------------------- PackedIterableDataset.state_dict
@pytest.mark.parametrize("num_rows", [1.5, True, "1", 1.0])
def test_iterable_state_dict_refuses_a_non_int_num_rows(num_rows):
    """red-team 17: state_dict(num_rows=1.5 / True / '1') was stored as 1."""
    it = PackedIterableDataset([{"input_ids": [1] * n} for n in [5, 9, 3, 12, 7, 4, 8, 2, 6, 11]], CFG)
    rows = list(it)
    with pytest.raises(InputTypeError, match=rf"num_rows={num_rows!r} is invalid: it must be None or an int"):
        it.state_dict(num_rows)
    assert it.state_dict(np.int64(len(rows)))["num_rows"] == len(rows) == it.state_dict()["num_rows"]


# ---------------------------------------------------------------------------- unordered lengths
@pytest.mark.parametrize("lengths", [{9, 3, 5}, frozenset({9, 3}), {3: 1, 4: 2}.keys(), {3: 1}.values(),
                                     {3: 1}.items()])
def test_pack_lengths_refuses_unordered_containers(lengths):
    """red-team 17: a set's order is arbitrary, and sample ids are positions in lengths."""
    with pytest.raises(InputTypeError, match=rf"lengths must be a flat sequence of ints, got the "
                                             rf"{type(lengths).__name__} .*which is not a sequence.*pass a list"):
        pack_lengths(lengths, CFG)
    with pytest.raises(InputTypeError, match=r"which is not a sequence"):
        StreamPacker(CFG).add_window([0, 1, 2][:len(lengths)], lengths)


def test_unordered_sample_ids_refused_and_ordered_inputs_work():
    """red-team 17: sample_ids given as a set are refused; lists, tuples, ranges and arrays still pack."""
    with pytest.raises(InputTypeError, match=r"sample_ids must be a flat sequence of ints, got the set \{0, 1\}"):
        StreamPacker(CFG).add_window({0, 1}, [3, 4])
    for lengths in ([3, 4, 9], (3, 4, 9), range(3, 6), np.array([3, 4, 9], dtype=np.uint16)):
        assert sum(e - s for p in pack_lengths(lengths, CFG).packs for _, s, e in p) == sum(int(x) for x in lengths)

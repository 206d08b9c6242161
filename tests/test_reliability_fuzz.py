"""Reliability: random and hostile inputs through the packer, the collator, the planner and
``shard_batch`` (issue #6, item 3).

Each case either works exactly (checked against an independent expectation) or raises the
documented ``ValueError``/``TypeError``; an internal exception (IndexError, KeyError,
AssertionError, ZeroDivisionError, numpy errors) or a wrong shape fails the test. Case counts
go to :mod:`_reliability` (printed at the end of the module; docs/RELIABILITY.md reports them).

``shard_batch`` with ``cp_size > 1`` runs here for every rank in one process, with the
process-group check stubbed out (``debug=False``: no collective); the same cases against a
real gloo group run in ``test_reliability_dist.py``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
import _reliability  # noqa: E402
from _reliability import COST, FAST, count  # noqa: E402

from atac_hf.attention import build_shift_labels, doc_lengths_from_batch, emulate_cp_attention, shard_batch
from atac_hf.packing import PackedDataCollator, PackingConfig, StreamPacker
from atac_hf.sharding import STRATEGIES, plan_shards



@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    _reliability.flush(__name__)


# ============================================================================ planner
def _check_segments(plan, lengths: list[int]) -> None:
    """Every token of every document on exactly one rank, by segment arithmetic (O(segments),
    so documents of 10**9 tokens are checked too)."""
    assert len(plan.segments) == plan.cp_size
    per_doc: dict[int, list[tuple[int, int]]] = {}
    for r, seg in enumerate(plan.segments):
        assert seg.ndim == 2 and seg.shape[1] == 3 and seg.dtype == np.int64
        offs = plan.doc_offsets[seg[:, 0]] + seg[:, 1]
        assert np.all(np.diff(offs) > 0), f"rank {r}: segments not in row order"
        for d, s, e in seg.tolist():
            assert 0 <= s < e <= lengths[d]
            per_doc.setdefault(d, []).append((s, e))
    assert sorted(per_doc) == list(range(len(lengths)))
    for d, spans in per_doc.items():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == lengths[d]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), f"document {d}: gap or overlap"
    held = plan.rank_num_tokens()
    assert held.shape == (plan.cp_size,) and int(held.sum()) == sum(lengths)
    assert set(plan.sharded_docs.tolist()) <= set(plan.gathered_docs.tolist())


@st.composite
def shard_cases(draw):
    kind = draw(st.sampled_from(["tiny", "mixed", "huge", "ones", "single"]))
    if kind == "tiny":
        lengths = draw(st.lists(st.integers(1, 4), min_size=1, max_size=40))
    elif kind == "mixed":
        lengths = draw(st.lists(st.integers(1, 3000), min_size=1, max_size=30))
    elif kind == "huge":  # a document far over any per-rank share, among 1-token documents
        lengths = [draw(st.integers(10**5, 10**9))] + draw(st.lists(st.integers(1, 3), max_size=10))
    elif kind == "ones":
        lengths = [1] * draw(st.integers(1, 300))
    else:
        lengths = [draw(st.integers(1, 500))]
    lengths = draw(st.permutations(lengths))
    cp = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16, 64, 100]))
    strategy = draw(st.sampled_from(sorted(STRATEGIES)))
    need = math.ceil(sum(lengths) / cp)
    cap = draw(st.one_of(st.none(), st.integers(max(1, need - 2), need + 40)))
    return list(lengths), cp, strategy, cap, draw(st.sampled_from([1, 1, 2, 8])), draw(st.sampled_from([None, 0, 1, 3]))


@settings(max_examples=400, **FAST)
@given(shard_cases())
def test_planner_fuzz_every_token_once_and_caps(case):
    lengths, cp, strategy, cap, min_chunk, max_anchors = case
    need = math.ceil(sum(lengths) / cp)
    count("planner.cases")
    try:
        plan = plan_shards(lengths, cp, strategy, max_tokens_per_rank=cap, min_chunk=min_chunk,
                           max_anchors=max_anchors)
    except ValueError as e:
        # the only legal refusal: a cap this strategy cannot respect (atp: one no placement can)
        assert cap is not None and "max_tokens_per_rank" in str(e), e
        assert strategy != "atp" or cap < need, f"atp refused a feasible cap: {e}"
        count("planner.refused_cap")
        return
    assert plan.cp_size == cp and plan.num_tokens == sum(lengths)
    _check_segments(plan, lengths)
    if cap is not None:
        assert int(plan.rank_num_tokens().max()) <= cap
    if sum(lengths) >= cp:  # every rank a token, whatever the strategy (issue 13, item 10)
        assert int(plan.rank_num_tokens().min()) >= 1, f"{strategy} left a rank empty"
    again = plan_shards(lengths, cp, strategy, max_tokens_per_rank=cap, min_chunk=min_chunk, max_anchors=max_anchors)
    assert again.digest == plan.digest, "planners must be deterministic (every rank plans alone)"
    if sum(lengths) <= 20_000:  # per-token views: the runtime's bookkeeping for every rank
        plan.validate()
        for r in range(cp):
            layout = plan.local_layout(r)
            assert layout.n_local == int(plan.rank_num_tokens()[r])
            layout.varlen_layout()
            layout.varlen_layout(sliding_window=3)
        count("planner.layouts", cp)


def test_atp_respects_every_feasible_cap():
    """Regression: atp raised ValueError on caps a contiguous split respects (its fallback was
    per_doc, which piles 1-token documents onto rank 0). Cases found by the fuzzer."""
    cases = [([41, 5, 38, 27, 7, 2, 14, 5, 90], 16, 17, 8), ([1, 2, 1, 3, 1, 1, 1, 1, 4], 8, 3, 1), ([4, 1], 16, 1, 2),
             ([1] * 10 + [37], 4, 12, 1)]
    for lengths, cp, cap, min_chunk in cases:
        assert cap >= math.ceil(sum(lengths) / cp)
        plan = plan_shards(lengths, cp, "atp", max_tokens_per_rank=cap, min_chunk=min_chunk)
        plan.validate()
        assert int(plan.rank_num_tokens().max()) <= cap
        assert set(plan.sharded_docs.tolist()) == set(plan.gathered_docs.tolist())
    with pytest.raises(ValueError, match="over max_tokens_per_rank=2"):
        plan_shards([4, 3], 3, "atp", max_tokens_per_rank=2)  # 7 tokens over 3 ranks need a cap of 3


CAP_MSG = r"max_tokens_per_rank must be >= 1 or None \(an int\)"
CHUNK_MSG = r"min_chunk must be >= 1 \(an int\)"


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(doc_lengths=[3, 4], cp_size=2, max_tokens_per_rank="5"), ValueError, CAP_MSG),
    (dict(doc_lengths=[3, 4], cp_size=2, max_tokens_per_rank=2.5), ValueError, CAP_MSG),
    (dict(doc_lengths=[3, 4], cp_size=2, max_tokens_per_rank=True), ValueError, CAP_MSG),
    (dict(doc_lengths=[3, 4], cp_size=2, max_tokens_per_rank=0), ValueError, CAP_MSG),
    (dict(doc_lengths=[3, 4], cp_size=2, min_chunk=None), ValueError, CHUNK_MSG),
    (dict(doc_lengths=[3, 4], cp_size=2, min_chunk=0), ValueError, CHUNK_MSG),
    (dict(doc_lengths=[30, 4], cp_size=2, max_anchors=-1), ValueError, "max_anchors must be an int >= 0"),
    (dict(doc_lengths=[30, 4], cp_size=2, max_anchors=1.5), ValueError, "max_anchors must be an int >= 0"),
    (dict(doc_lengths=[30, 4], cp_size=2, max_anchors="x"), ValueError, "max_anchors must be an int >= 0"),
    (dict(doc_lengths=[3, 4], cp_size=2, cost_model="H100"), TypeError, "cost_model must be a CostModel"),
    (dict(doc_lengths=[[1, 2], [3]], cp_size=2), ValueError, "flat 1-D sequence"),
    (dict(doc_lengths=[[1, 2], [3, 4]], cp_size=2), ValueError, "non-empty 1-D"),
    (dict(doc_lengths=[], cp_size=2), ValueError, "non-empty 1-D"),
    (dict(doc_lengths="abc", cp_size=2), ValueError, "non-empty 1-D"),
    (dict(doc_lengths=[0, 3], cp_size=2), ValueError, "document 0 has length 0"),
    (dict(doc_lengths=[3, -1], cp_size=2), ValueError, "document 1 has length -1"),
    (dict(doc_lengths=[3.5], cp_size=2), ValueError, "must be integers"),
    (dict(doc_lengths=[float("nan")], cp_size=2), ValueError, "must be integers"),
    (dict(doc_lengths=[None, 2], cp_size=2), ValueError, "must be integers"),
    (dict(doc_lengths=[2**62, 2**62], cp_size=2), ValueError, "2\\*\\*62 or more"),
    (dict(doc_lengths=[3], cp_size=0), ValueError, "cp_size must be an int >= 1"),
    (dict(doc_lengths=[3], cp_size=2.0), ValueError, "cp_size must be an int >= 1"),
    (dict(doc_lengths=[3], cp_size=True), ValueError, "cp_size must be an int >= 1"),
    (dict(doc_lengths=[3], cp_size=2, strategy=None), ValueError, "unknown sharding strategy"),
    (dict(doc_lengths=[3], cp_size=2, strategy="ring"), ValueError, "unknown sharding strategy"),
    # issue 13: bools are not lengths, cp_size and caps have upper bounds, zero-price models
    (dict(doc_lengths=[True, 2], cp_size=2), ValueError, r"doc_lengths\[0\] is the bool True"),
    (dict(doc_lengths=(3, np.True_), cp_size=2), ValueError, r"doc_lengths\[1\] is the bool (np\.)?True"),
    (dict(doc_lengths=np.array([True, False]), cp_size=2), ValueError, "bool array"),
    (dict(doc_lengths=[2**70], cp_size=2), ValueError, "must be integers"),
    (dict(doc_lengths=np.array([2**64 - 1], dtype=np.uint64), cp_size=2), ValueError, "2\\*\\*62 or more"),
    (dict(doc_lengths=[3], cp_size=10**7), ValueError, r"cp_size must be an int >= 1 and <= 4096"),
    (dict(doc_lengths=[3], cp_size=2**70), ValueError, r"cp_size must be an int >= 1 and <= 4096"),
    (dict(doc_lengths=[3], cp_size=np.bool_(True)), ValueError, "cp_size must be an int >= 1"),
    (dict(doc_lengths=[10**9] * 10**5, cp_size=64), ValueError, r"up to 12800000 segments, more than 1048576"),
    (dict(doc_lengths=[1] * (2**20 + 1), cp_size=2), ValueError, r"more than 1048576 \(MAX_PLAN_SEGMENTS\)"),
    (dict(doc_lengths=[3], cp_size=2, max_tokens_per_rank=2**70), ValueError, CAP_MSG),
    (dict(doc_lengths=[3], cp_size=2, min_chunk=2**70), ValueError, CHUNK_MSG),
    (dict(doc_lengths=[3, 4], cp_size=2, cost_model=COST.replace(linear_s_per_token=0.0, attn_s_per_pair=0.0,
                                                                 segment_overhead_s=0.0)),
     ValueError, "prices all work at 0 s"),
])
def test_planner_hostile_arguments(kwargs, exc, match):
    count("planner.hostile")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning on the way either
        with pytest.raises(exc, match=match):
            plan_shards(**kwargs)


# ============================================================================ packer
@st.composite
def packer_cases(draw):
    cap = draw(st.sampled_from([1, 2, 3, 7, 16, 64, 500]))
    limit = max(1, cap // 2)
    config = PackingConfig(
        max_tokens=cap,
        packs_per_window=draw(st.integers(1, 5)),
        strategy=draw(st.sampled_from(["wfap", "sequential", "bfd", "wlb"])),
        overlength=draw(st.sampled_from(["split", "truncate"])),
        min_fragment=draw(st.one_of(st.none(), st.integers(1, limit))),
        max_defer=draw(st.sampled_from([0, 1, 2, 16])),
        split_overdue=draw(st.booleans()),
        local_search=draw(st.booleans()),
        balance_split=draw(st.booleans()),
        defer_heavy=draw(st.booleans()),
        balance_tolerance=draw(st.sampled_from([1.0001, 1.05, 3.0])),
        wlb_thresholds=draw(st.sampled_from([None, (), (1,), tuple(sorted({max(1, cap // 3), cap}))])),
        reference_doc_tokens=draw(st.sampled_from([1, 16, 2048])),
    )
    # empty samples, 1-token samples, samples far over the cap (<= 25 fragments), ordinary ones
    one = st.one_of(st.just(0), st.just(1), st.integers(2, 3 * cap), st.integers(cap, 25 * cap))
    windows = draw(st.lists(st.lists(one, max_size=12), min_size=1, max_size=8))
    stop = draw(st.integers(0, len(windows)))
    return config, windows, stop


def _feed(packer: StreamPacker, windows, start_id: int = 0, first: int = 0):
    out, sid = [], start_id
    for lens in windows[first:]:
        out.append(packer.add_window(list(range(sid, sid + len(lens))), lens))
        sid += len(lens)
    return out + packer.flush_windows()


@settings(max_examples=150, **FAST)
@given(packer_cases())
def test_stream_packer_fuzz_exact_cover_and_json_resume(case):
    """Hostile streams (empty windows, 0- and 1-token samples, samples 25x the cap) through every
    strategy and option; a JSON round trip of the state at a random window changes nothing."""
    config, windows, stop = case
    cap = config.max_tokens
    lengths = [n for w in windows for n in w]
    ref = _feed(StreamPacker(config, COST), windows)
    count("packer.cases")
    count("packer.samples", len(lengths))
    # exact cover: each sample once, or its fragments tile it (truncate: its first `cap` tokens)
    spans: dict[int, list[tuple[int, int]]] = {}
    for window in ref:
        assert len(window) <= config.packs_per_window
        for pack in window:
            assert pack and sum(e - s for _, s, e in pack) <= cap
            for sid, s, e in pack:
                spans.setdefault(sid, []).append((s, e))
    for sid, n in enumerate(lengths):
        want = min(n, cap) if config.overlength == "truncate" else n
        got = sorted(spans.pop(sid, []))
        if want == 0:
            assert not got
            continue
        assert got[0][0] == 0 and got[-1][1] == want and all(a[1] == b[0] for a, b in zip(got, got[1:])), (sid, got)
    assert not spans
    # kill after `stop` windows, resume from the JSON state in a fresh packer
    first = StreamPacker(config, COST)
    done = [first.add_window(list(range(sum(map(len, windows[:i])), sum(map(len, windows[:i + 1])))), windows[i])
            for i in range(stop)]
    state = json.loads(json.dumps(first.state_dict()))
    second = StreamPacker(config, COST)
    second.load_state_dict(state)
    rest = _feed(second, windows, start_id=sum(map(len, windows[:stop])), first=stop)
    assert done + rest == ref
    count("packer.resumes")


PACKER_HOSTILE = [
    (dict(lengths=[1.5, 2]), TypeError, "is not an int"),
    (dict(lengths=[True, 2]), TypeError, "is not an int"),
    (dict(lengths=[None]), TypeError, "is not an int"),
    (dict(lengths=["3"]), TypeError, "is not an int"),
    (dict(lengths=[3, -1]), ValueError, "is negative"),
    (dict(lengths=[[1, 2], [3]]), ValueError, "flat sequence"),
    (dict(lengths=[[1, 2], [3, 4]]), ValueError, "flat sequence"),
    (dict(lengths="abc"), TypeError, "must be a sequence of ints"),
    (dict(lengths={"a": 1}), TypeError, "must be a sequence of ints"),
    (dict(lengths=np.array([1.0, 2.0])), TypeError, "is not an int"),
    (dict(lengths=[3, 4], ids=[0]), ValueError, "got 1 sample_ids but 2 lengths"),
    (dict(lengths=[3, 4], ids=[5, 5]), ValueError, "appears twice"),
    (dict(lengths=[3, 4], ids=[0.5, 1]), TypeError, "sample_ids must be ints"),
    (dict(lengths=[40], overlength="error"), ValueError, "overlength='error'"),
]


@pytest.mark.parametrize("case, exc, match", PACKER_HOSTILE)
def test_stream_packer_hostile_windows_change_nothing(case, exc, match):
    config = PackingConfig(max_tokens=16, packs_per_window=2, strategy="sequential",
                           overlength=case.get("overlength", "split"))
    packer = StreamPacker(config, COST)
    packer.add_window([100, 101, 102], [16, 16, 16])  # sample 102 does not fit: it is carried
    assert packer.pending_ids == [102]
    before = json.dumps(packer.state_dict())
    lengths = case["lengths"]
    ids = case.get("ids", list(range(len(lengths))) if hasattr(lengths, "__len__") else [0])
    count("packer.hostile")
    with pytest.raises(exc, match=match):
        packer.add_window(ids, lengths)
    assert json.dumps(packer.state_dict()) == before, "a refused window must leave the packer unchanged"
    with pytest.raises(ValueError, match="still pending"):
        packer.add_window([102], [5])  # an id still held from an earlier window


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(max_tokens=0), ValueError, "max_tokens=0 is invalid"),
    (dict(max_tokens=2.5), ValueError, "max_tokens=2.5 is invalid"),
    (dict(max_tokens=True), ValueError, "max_tokens=True is invalid"),
    (dict(max_tokens="8"), ValueError, "max_tokens='8' is invalid"),
    (dict(packs_per_window=0), ValueError, "packs_per_window=0 is invalid"),
    (dict(strategy="ffd"), ValueError, "unknown packing strategy"),
    (dict(overlength="drop"), ValueError, "unknown overlength policy"),
    (dict(min_fragment=9), ValueError, "min_fragment=9 is invalid"),
    (dict(min_fragment=0), ValueError, "min_fragment=0 is invalid"),
    (dict(max_defer=-1), ValueError, "max_defer=-1 is invalid"),
    (dict(balance_tolerance=1.0), ValueError, "balance_tolerance=1.0 is invalid"),
    (dict(balance_tolerance=float("nan")), ValueError, "balance_tolerance=nan is invalid"),
    (dict(balance_tolerance="2"), ValueError, "balance_tolerance='2' is invalid"),
    (dict(wlb_thresholds=(3, 2)), ValueError, "strictly increasing"),
    (dict(wlb_thresholds="ab"), TypeError, "wlb_thresholds='ab' must be None or a sequence"),
    (dict(split_overdue="yes"), TypeError, "split_overdue='yes' must be True or False"),
    (dict(reference_doc_tokens=0), ValueError, "reference_doc_tokens=0 must be an int >= 1"),
])
def test_packing_config_hostile_values(kwargs, exc, match):
    count("packer.hostile")
    with pytest.raises(exc, match=match):
        PackingConfig(**{"max_tokens": 16, "packs_per_window": 2, **kwargs})


# ============================================================================ collator
@st.composite
def feature_lists(draw):
    feats, docs = [], []  # docs: expected (ids, labels) of every non-empty document, in order
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["plain", "plain", "packed"]))
        if kind == "plain":
            n = draw(st.sampled_from([0, 1, 1, 2, 7, 40]))
            ids = draw(st.lists(st.integers(0, 50_000), min_size=n, max_size=n))
            lab_kind = draw(st.sampled_from(["none", "copy", "all_ignored", "random"]))
            labels = {"none": None, "copy": list(ids), "all_ignored": [-100] * n,
                      "random": draw(st.lists(st.one_of(st.just(-100), st.integers(0, 9)), min_size=n,
                                              max_size=n))}[lab_kind]  # legal labels: token ids >= 0, or -100
            form = draw(st.sampled_from(["list", "np", "torch", "torch2d"]))
            conv = {"list": list, "np": np.asarray, "torch": lambda x: torch.tensor(x, dtype=torch.long),
                    "torch2d": lambda x: torch.tensor(x, dtype=torch.long).reshape(1, -1)}[form]
            f = {"input_ids": conv(ids)}
            if labels is not None or draw(st.booleans()):
                f["labels"] = None if labels is None else conv(labels)
            feats.append(f)
            if n:
                docs.append((ids, labels if labels is not None else ids))
        else:
            seq = draw(st.lists(st.sampled_from([0, 1, 2, 5, 30]), min_size=1, max_size=6))
            n = sum(seq)
            ids = draw(st.lists(st.integers(0, 50_000), min_size=n, max_size=n))
            with_labels = draw(st.booleans())
            legal = st.one_of(st.just(-100), st.integers(0, 9))  # token ids >= 0, or -100 (no loss)
            labels = draw(st.lists(legal, min_size=n, max_size=n)) if with_labels else None
            f = {"input_ids": ids, "seq_lengths": seq, "attention_mask": [1] * n, "spans": [[0, 0, n]]}
            if with_labels:
                f["labels"] = labels
            feats.append(f)
            pos = 0
            for d in seq:
                if d:
                    docs.append((ids[pos:pos + d], (labels or ids)[pos:pos + d]))
                pos += d
    return feats, docs


@settings(max_examples=300, **FAST)
@given(feature_lists(), st.sampled_from(["pt", "np"]), st.booleans())
def test_collator_fuzz_exact_rows(case, return_tensors, shift):
    feats, docs = case
    collator = PackedDataCollator(return_tensors=return_tensors, return_shift_labels=shift)
    count("collator.cases")
    if not docs:
        with pytest.raises(ValueError, match="every document in the batch is empty"):
            collator(feats)
        return
    out = collator(feats)
    out = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in out.items()}
    S = sum(len(i) for i, _ in docs)
    lengths = [len(i) for i, _ in docs]
    for key in ("input_ids", "labels", "position_ids"):
        assert out[key].shape == (1, S) and out[key].dtype == np.int64, key
    assert out["input_ids"][0].tolist() == [t for i, _ in docs for t in i]
    want_labels = [(-100 if j == 0 else t) for _, lab in docs for j, t in enumerate(lab)]
    assert out["labels"][0].tolist() == want_labels
    assert out["position_ids"][0].tolist() == [j for n in lengths for j in range(n)]
    assert out["seq_lengths"].tolist() == lengths and min(lengths) > 0
    assert out["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    assert out["cu_seqlens"].dtype == np.int32 and out["max_seqlen"] == max(lengths)
    if shift:
        assert out["shift_labels"].shape == (1, S)
        assert out["shift_labels"][0].tolist() == want_labels[1:] + [-100]
    else:
        assert "shift_labels" not in out
    assert set(out) <= {"input_ids", "labels", "position_ids", "seq_lengths", "cu_seqlens", "max_seqlen",
                        "shift_labels"}, "stray keys (attention_mask, spans) must not reach the model"


@pytest.mark.parametrize("features, exc, match", [
    ([{}], ValueError, "feature 0 has no 'input_ids'"),
    ([{"input_ids": [1, 2], "labels": [1]}], ValueError, "labels has 1 entries but input_ids has 2"),
    ([{"input_ids": [[1, 2], [3]]}], ValueError, "input_ids must be a 1-D sequence of ints"),
    ([{"input_ids": [[1, 2], [3, 4]]}], ValueError, "input_ids must be a 1-D sequence of ints"),
    ([{"input_ids": [1.0, 2.0]}], ValueError, "input_ids must hold ints"),
    ([{"input_ids": [True, False]}], ValueError, "input_ids must hold ints"),
    ([{"input_ids": None}], ValueError, "input_ids must be a 1-D sequence"),
    ([{"input_ids": "abc"}], ValueError, "input_ids must be a 1-D sequence"),
    ([{"input_ids": [2**64, 1]}], ValueError, "input_ids must hold ints"),
    ([{"input_ids": [1, 2, 3], "seq_lengths": [4, -1]}], ValueError, "seq_lengths has negative entries"),
    ([{"input_ids": [1, 2, 3], "seq_lengths": [1, 1]}], ValueError, "seq_lengths sum to 2 but input_ids has 3"),
    ([{"input_ids": [1, 2, 3], "seq_lengths": [1.5, 1.5]}], ValueError, "seq_lengths must hold ints"),
    ([{"input_ids": [1, 2, 3], "labels": [1.5, 2, 3]}], ValueError, "labels must hold ints"),
    ([{"input_ids": [1]}, {"input_ids": [2], "labels": [[1, 2], [3]]}], ValueError, "feature 1: labels must be a 1-D"),
    ([], ValueError, "every document in the batch is empty"),
    ([{"input_ids": []}, {"input_ids": [], "seq_lengths": [0]}], ValueError, "every document in the batch is empty"),
    ({"input_ids": [1]}, TypeError, "expects a list of features"),
    ("abc", TypeError, "feature 0 is a str"),
    ([[1, 2, 3]], TypeError, "feature 0 is a list"),
])
def test_collator_hostile_features(features, exc, match):
    count("collator.hostile")
    with pytest.raises(exc, match=match):
        PackedDataCollator()(features)


# ============================================================================ shard_batch
@st.composite
def batches(draw):
    B = draw(st.sampled_from([1, 1, 2, 3]))
    S = draw(st.sampled_from([1, 2, 3, 7, 40, 300]))
    rows = []
    for _ in range(B):
        docs, left = [], S
        while left:
            d = min(left, draw(st.sampled_from([1, 1, 2, 5, 40, 1000])))
            docs.append(d)
            left -= d
        rows.append(docs)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    ids = torch.randint(0, 1000, (B, S), generator=g)
    pos = torch.cat([torch.cat([torch.arange(n) for n in r])[None] for r in rows])
    labels = ids.clone()
    labels[pos == 0] = -100
    mode = draw(st.sampled_from(["plain", "all_ignored", "no_labels", "shifted_positions", "random_positions",
                                 "reversed_positions", "list_positions", "cu_seqlens", "mask", "num_items",
                                 "no_positions", "only_seq_lengths"]))
    batch = {"input_ids": ids}
    if mode == "all_ignored":
        labels[:] = -100
    if mode != "no_labels":
        batch["labels"] = labels
    if mode == "shifted_positions":  # positions that do not start at 0 (still +1 within documents)
        pos = pos + 3
    elif mode == "random_positions":  # restart anywhere
        pos = torch.randint(0, 3, (B, S), generator=g)
    elif mode == "reversed_positions":
        pos = pos.flip(1)
    if mode not in ("no_positions", "only_seq_lengths"):
        batch["position_ids"] = pos.tolist() if mode == "list_positions" else pos
    if mode in ("plain", "only_seq_lengths", "no_labels", "all_ignored") or draw(st.booleans()):
        batch["seq_lengths"] = rows if B > 1 else rows[0]
    if mode == "cu_seqlens":
        batch.pop("seq_lengths", None)
        batch["cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum([d for r in rows for d in r])]),
                                           dtype=torch.int32)
    if mode == "mask":
        batch["attention_mask"] = torch.ones(B, S, dtype=torch.long)
    if mode == "num_items":
        batch["num_items_in_batch"] = 7
    cp = draw(st.sampled_from([1, 2, 3, 4, 8, 64]))
    strategy = draw(st.sampled_from(sorted(STRATEGIES)))
    return batch, rows, mode, cp, strategy


def _consistent_positions(batch, rows) -> bool:
    pos = batch.get("position_ids")
    if pos is None:
        return True
    pos = torch.as_tensor(pos).reshape(-1)
    starts = torch.zeros_like(pos, dtype=torch.bool)
    starts[np.cumsum([0] + [d for r in rows for d in r])[:-1]] = True
    S = len(batch["input_ids"][0])
    restart = torch.ones_like(starts)
    restart[1:] = pos[1:] - pos[:-1] != 1
    restart[::S] = True
    return bool(torch.equal(starts, restart))


@settings(max_examples=300, **FAST)
@given(batches())
def test_shard_batch_fuzz_every_rank(case):
    import atac_hf.attention.shard as shard_mod

    with pytest.MonkeyPatch.context() as mp:  # cp_size > 1: every rank in this process, no group
        mp.setattr(shard_mod, "_check_group", lambda plan, rank, group: None)
        _shard_case(*case)


def _shard_case(batch, rows, mode, cp, strategy):
    count("shard_batch.cases")
    B, S = batch["input_ids"].shape
    has_docs = any(k in batch for k in ("seq_lengths", "cu_seqlens", "position_ids"))
    if not has_docs:
        with pytest.raises(ValueError, match="cannot find the documents"):
            doc_lengths_from_batch(batch)
        return
    lengths_known = "seq_lengths" in batch or "cu_seqlens" in batch
    if lengths_known and not _consistent_positions(batch, rows):
        with pytest.raises(ValueError, match="position_ids disagree|crosses into this row"):
            doc_lengths_from_batch(batch)
        count("shard_batch.refused_positions")
        return
    lengths = doc_lengths_from_batch(batch)
    if lengths_known:
        assert lengths.tolist() == [d for r in rows for d in r]
    plan = plan_shards(lengths, cp, strategy)
    if cp > 1 and int(plan.rank_num_tokens().min()) == 0:  # cp_size beyond the pack (or an idle rank)
        for rank in range(cp):  # every rank refuses alike (none would wait in a collective)
            with pytest.raises(ValueError, match="without tokens"):
                shard_batch(batch, plan, rank, None)
        count("shard_batch.refused_empty_rank")
        return
    full_ids = batch["input_ids"].reshape(-1)
    pos_full = (torch.as_tensor(batch["position_ids"]).reshape(-1) if "position_ids" in batch
                else torch.cat([torch.arange(n) for n in lengths]))
    shift_full = build_shift_labels(batch["labels"], lengths).reshape(-1) if "labels" in batch else None
    seen = torch.zeros(B * S, dtype=torch.long)
    items = set()
    for rank in range(cp):
        local = shard_batch(batch, plan, rank, None)
        n = int(plan.rank_num_tokens()[rank])
        idx = torch.as_tensor(plan.rank_token_indices(rank))
        seen[idx] += 1
        assert local["input_ids"].shape == (1, n) and torch.equal(local["input_ids"][0], full_ids[idx])
        assert local["position_ids"].shape == (1, n) and torch.equal(local["position_ids"][0], pos_full[idx])
        assert local["use_cache"] is False and local["atac_shard"].layout.n_local == n
        assert not set(local) & {"seq_lengths", "cu_seqlens", "attention_mask", "max_seqlen"}
        if shift_full is not None:
            assert torch.equal(local["shift_labels"][0], shift_full[idx])
            assert torch.equal(local["labels"][0], batch["labels"].reshape(-1)[idx])
            items.add(local["num_items_in_batch"])
        else:
            assert "shift_labels" not in local and "num_items_in_batch" not in local
    assert bool((seen == 1).all()), "every token on exactly one rank"
    if shift_full is not None:
        want = 7 if mode == "num_items" else int((shift_full != -100).sum())
        assert items == {want}, "every rank divides by the same global target count"
    count("shard_batch.rank_calls", cp)


def test_shard_batch_cp1_needs_no_group_and_cp2_needs_one():
    batch = {"input_ids": torch.tensor([[5, 6, 7]]), "position_ids": torch.tensor([[0, 1, 0]])}
    local = shard_batch(batch, plan_shards([2, 1], 1), 0)
    assert torch.equal(local["input_ids"], batch["input_ids"])
    with pytest.raises(ValueError, match="needs an initialized torch.distributed process group"):
        shard_batch(batch, plan_shards([2, 1], 2), 0)
    with pytest.raises(ValueError, match="rank 2 is outside the CP group of size 2"):
        shard_batch(batch, plan_shards([2, 1], 2), 2)
    with pytest.raises(ValueError, match="differ from the plan's"):
        shard_batch(batch, plan_shards([1, 2], 1), 0)
    with pytest.raises(ValueError, match="the plan covers 4 tokens but the batch has 1 x 3"):
        shard_batch(batch, plan_shards([4], 1), 0)
    with pytest.raises(ValueError, match="attention_mask has padding"):
        shard_batch({**batch, "attention_mask": torch.tensor([[1, 1, 0]])}, plan_shards([2, 1], 1), 0)
    count("shard_batch.hostile", 5)


@settings(max_examples=300, **FAST)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=6), st.sampled_from([2, 3, 4, 5, 8, 16, 33]),
       st.sampled_from(sorted(STRATEGIES)), st.sampled_from([1, 2, 4, 128]), st.booleans())
def test_every_rank_gets_a_token_when_the_pack_has_enough(lengths, cp, strategy, min_chunk, tight_cap):
    """Issue 13, item 10: a pack of at least cp_size tokens gives every rank a token, for every
    strategy, inside the planner (short documents that atp keeps whole, per_doc's one-token
    documents on rank 0, ...); a smaller pack leaves the plan as it is and shard_batch refuses
    it on every rank alike. Caps stay respected; every token once."""
    count("planner.fill_cases")
    n = sum(lengths)
    cap = math.ceil(n / cp) + 1 if tight_cap else None
    try:
        plan = plan_shards(lengths, cp, strategy, COST, max_tokens_per_rank=cap, min_chunk=min_chunk)
    except ValueError as e:
        assert strategy != "atp" and "max_tokens_per_rank" in str(e), e
        return
    _check_segments(plan, lengths)
    plan.validate()
    held = plan.rank_num_tokens()
    if n >= cp:
        assert int(held.min()) >= 1, (strategy, lengths, cp, held.tolist())
        count("planner.filled_plans")
    if cap is not None:
        assert int(held.max()) <= cap
    assert plan.strategy == strategy
    for r in range(cp):
        plan.local_layout(r)


@pytest.mark.usefixtures("no_contiguous_candidate")
def test_filled_plans_are_hand_checked():
    """``plan_shards([3], 2, "atp")`` left rank 1 empty; each empty rank now takes the second
    half of the fullest rank's tokens (a cut document is gathered). (ATP's contiguous candidate,
    [0, 1) | [1, 3) at the same block time, would leave no rank empty: it is off here.)"""
    plan = plan_shards([3], 2, "atp", COST)
    assert [s.tolist() for s in plan.segments] == [[[0, 0, 2]], [[0, 2, 3]]]
    assert plan.gathered_docs.tolist() == [0]
    plan = plan_shards([1, 1, 1], 3, "per_doc", COST)  # all on rank 0 before: whole documents move
    assert plan.rank_num_tokens().tolist() == [1, 1, 1]
    assert sorted(int(s[0, 0]) for s in plan.segments) == [0, 1, 2]
    plan = plan_shards([1], 2, "atp", COST)  # fewer tokens than ranks: unchanged, shard_batch refuses
    assert plan.rank_num_tokens().tolist() == [1, 0]
    count("planner.hand_checked", 3)


def test_shard_batch_refuses_wrong_types_with_clear_errors():
    batch = {"input_ids": torch.tensor([[5, 6, 7]]), "position_ids": torch.tensor([[0, 1, 0]]),
             "labels": torch.tensor([[5, 6, 7]])}
    plan = plan_shards([2, 1], 1)
    for bad in ({"cp_size": 1}, "plan", None, plan.segments):
        with pytest.raises(TypeError, match="plan must be a ShardPlan"):
            shard_batch(batch, bad, 0)
    with pytest.raises(TypeError, match="batch must be a mapping"):
        shard_batch([batch], plan, 0)
    for key, value in (("labels", torch.tensor([[5, 6]])), ("labels", torch.tensor([[5, 6, 7, 8]])),
                       ("shift_labels", torch.tensor([[5]])), ("labels", torch.tensor([[5], [6], [7]]))):
        with pytest.raises(ValueError, match=rf"'{key}' has shape .* but input_ids has shape \(1, 3\) \(3 tokens\)"):
            shard_batch({**batch, key: value}, plan, 0)
    with pytest.raises(TypeError, match="'labels' must be a tensor"):
        shard_batch({**batch, "labels": [[5, 6, 7]]}, plan, 0)
    count("shard_batch.hostile", 10)


@settings(max_examples=40, **FAST)
@given(st.lists(st.sampled_from([1, 1, 2, 3, 9, 40, 130]), min_size=1, max_size=7),
       st.sampled_from([1, 2, 3, 4, 8, 64]), st.sampled_from(sorted(STRATEGIES)),
       st.one_of(st.none(), st.integers(1, 20)), st.sampled_from(["sdpa", "varlen_reference"]))
def test_cp_attention_fuzz_equals_one_rank(lengths, cp, strategy, window, backend):
    """The runtime's bookkeeping for every rank of random plans (empty ranks, 1-token documents,
    cp_size above the token count, sliding windows): fp64 output equal to the one-rank result."""
    N = sum(lengths)
    g = torch.Generator().manual_seed(N * 131 + cp)
    q = torch.randn(4, N, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, N, 8, dtype=torch.float64, generator=g)
    v = torch.randn(2, N, 8, dtype=torch.float64, generator=g)
    ref = emulate_cp_attention(q, k, v, plan_shards(lengths, 1), window=window)
    out = emulate_cp_attention(q, k, v, plan_shards(lengths, cp, strategy), window=window, backend=backend)
    assert out.shape == (N, 4, 8)
    assert (out - ref).abs().max().item() <= 1e-10
    count("attention.emulated_cases")

"""Reliability: exactly-once data (issue #6, item 1) and checkpoint-state hygiene.

Over one epoch every token of every sample is trained on exactly once (a split sample's
fragments tile it; ``overlength="truncate"`` keeps exactly its first ``max_tokens``), with
deferral, DP sharding through Accelerate's own ``BatchSamplerShard`` / ``IterableDatasetShard``,
gradient accumulation, and a kill at a random optimizer step followed by a resume from the
JSON state in fresh objects (a new process would hold nothing else).

Every token of the dataset is a distinct integer (sample ``i``'s tokens are a range of their
own), so counting the ``input_ids`` of the collated rows that reach the "model" checks
exactly-once end to end: sampler, shard, DataLoader, SpanDataset slicing and collator.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, IterableDatasetShard
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(__file__))
import _reliability  # noqa: E402
from _reliability import COST, FAST, count  # noqa: E402

from atac_hf.packing import PackedDataCollator, PackedIterableDataset, PackingConfig, SpanDataset, StreamPacker
from atac_hf.packing import SampleCutWarning, WFAPBatchSampler



@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    _reliability.flush(__name__)


@st.composite
def runs(draw):
    cap = draw(st.sampled_from([1, 2, 3, 8, 16, 32, 100]))
    n = draw(st.integers(1, 150 if cap >= 8 else 30))  # tiny caps make a row per token or two
    lengths = draw(st.lists(st.one_of(st.just(0), st.just(1), st.integers(min(2, cap), cap), st.integers(cap, 6 * cap)),
                            min_size=n, max_size=n))
    if not any(lengths):
        lengths[0] = 1
    replicas = draw(st.integers(1, 4))
    grad_accum = draw(st.integers(1, 3))
    config = PackingConfig(
        max_tokens=cap,
        packs_per_window=replicas * grad_accum,  # one window per optimizer step
        strategy=draw(st.sampled_from(["wfap", "wfap", "sequential", "bfd", "wlb"])),
        overlength=draw(st.sampled_from(["split", "split", "truncate", "truncate"])),
        max_defer=draw(st.sampled_from([0, 1, 3, 16])),
        reference_doc_tokens=draw(st.sampled_from([1, 16])),  # 1: many samples count as heavy (deferred)
    )
    return dict(lengths=lengths, config=config, replicas=replicas, grad_accum=grad_accum,
                shuffle=draw(st.booleans()), seed=draw(st.integers(0, 99)), labels=draw(st.booleans()),
                window_size=draw(st.sampled_from([None, None, 3])), kill=draw(st.floats(0, 1)))


def _dataset(lengths, with_labels: bool):
    """Sample i holds tokens start_i .. start_i + len_i - 1: every token of the dataset is distinct."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = []
    for i, n in enumerate(lengths):
        ids = list(range(int(starts[i]), int(starts[i]) + n))
        rows.append({"input_ids": ids, "labels": [t + 1 for t in ids]} if with_labels else {"input_ids": ids})
    return rows, starts


def _dealable(lengths, config, replicas: int) -> bool:
    """A pass can be dealt to ``replicas`` in equal batch counts, every token once, iff it has
    at least ``replicas`` kept tokens (and, with one token per pack, a multiple of them)."""
    cap = config.max_tokens
    kept = sum(min(n, cap) if config.overlength == "truncate" else n for n in lengths)
    return replicas == 1 or (kept >= replicas and (cap > 1 or kept % replicas == 0))


def _no_even_batches_warning(caught) -> None:
    # a SampleCutWarning says a pass was evened out by cutting a sample (checked elsewhere), not left uneven
    msgs = [str(w.message) for w in caught
            if "even_batches" in str(w.message) and not issubclass(w.category, SampleCutWarning)]
    assert not msgs, f"a pass was left uneven (Accelerate would repeat batches): {msgs}"


def _expected_tokens(lengths, starts, config) -> Counter:
    keep = [min(n, config.max_tokens) if config.overlength == "truncate" else n for n in lengths]
    return Counter(t for i, n in enumerate(keep) for t in range(int(starts[i]), int(starts[i]) + n))


def _check_row(batch: dict, with_labels: bool) -> list[int]:
    """A collated row is well-formed: documents are runs of consecutive tokens of one sample,
    positions restart per document, labels are the sample's (or the tokens) with -100 at starts."""
    ids = batch["input_ids"][0].tolist()
    pos = batch["position_ids"][0].tolist()
    labels = batch["labels"][0].tolist()
    off = 0
    for n in batch["seq_lengths"].tolist():
        doc = ids[off:off + n]
        assert doc == list(range(doc[0], doc[0] + n)), "a document is one contiguous run of one sample"
        assert pos[off:off + n] == list(range(n))
        want = [t + 1 for t in doc] if with_labels else doc
        assert labels[off] == -100 and labels[off + 1:off + n] == want[1:]
        off += n
    assert off == len(ids)
    return ids


def _steps(iters, grad_accum: int):
    """Optimizer steps: each replica takes up to ``grad_accum`` micro-batches (the last step may be short)."""
    while True:
        step = [[b for _, b in zip(range(grad_accum), it)] for it in iters]
        if not any(step):
            return
        yield step


@settings(max_examples=60, **FAST)
@given(runs())
def test_exactly_once_sampler_dp_shard_grad_accum_kill_resume(run):
    lengths, config, R, GA = run["lengths"], run["config"], run["replicas"], run["grad_accum"]
    rows, starts = _dataset(lengths, run["labels"])
    kwargs = dict(window_size=run["window_size"], num_replicas=R, shuffle=run["shuffle"], seed=run["seed"],
                  cost_model=COST)

    def loaders(state=None):  # one sampler per replica process, as under accelerate launch
        out, samplers = [], []
        for r in range(R):
            sampler = WFAPBatchSampler(lengths, config, **kwargs)
            sampler.set_epoch(1)
            if state is not None:
                sampler.load_state_dict(state)
            shard = BatchSamplerShard(sampler, num_processes=R, process_index=r, split_batches=False, even_batches=True)
            out.append(iter(DataLoader(SpanDataset(rows), batch_sampler=shard, collate_fn=PackedDataCollator())))
            samplers.append(sampler)
        return out, samplers

    if not _dealable(lengths, config, R):  # cannot be dealt exactly once: refused up front, never repeated
        with pytest.raises(ValueError, match=f"cannot be dealt to num_replicas={R}"):
            WFAPBatchSampler(lengths, config, **kwargs)
        count("exactly_once.undealable_passes_refused")
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iters, samplers = loaders()
        num_batches = len(samplers[0])
    _no_even_batches_warning(caught)
    assert num_batches % R == 0
    steps_per_epoch = -(-(num_batches // R) // GA)
    kill = min(int(run["kill"] * (steps_per_epoch + 1)), steps_per_epoch)  # the end included
    seen: Counter = Counter()
    for k, step in enumerate(_steps(iters, GA)):
        if k == kill:
            break
        for batch in (b for rep in step for b in rep):
            seen.update(_check_row(batch, run["labels"]))
    # kill: only the JSON state survives; global batches consumed = kill steps x GA x R
    state = json.loads(json.dumps(samplers[0].state_dict(position=min(kill * GA * R, num_batches))))
    del iters, samplers
    iters, _ = loaders(state)
    for step in _steps(iters, GA):
        for batch in (b for rep in step for b in rep):
            seen.update(_check_row(batch, run["labels"]))
    want = _expected_tokens(lengths, starts, config)
    count("exactly_once.sampler_runs")
    count("exactly_once.samples", sum(1 for n in lengths if n))
    count("exactly_once.tokens", sum(want.values()))
    assert seen == want, f"lost {sum((want - seen).values())} tokens, repeated {sum((seen - want).values())}"


@st.composite
def stream_runs(draw):
    run = draw(runs())
    run["stop"] = draw(st.integers(0, 12))
    return run


@settings(max_examples=40, **FAST)
@given(stream_runs())
def test_exactly_once_streaming_dp_shard_kill_resume(run):
    """The streaming packer behind Accelerate's IterableDatasetShard, killed after ``stop`` steps."""
    lengths, config, R, GA = run["lengths"], run["config"], run["replicas"], run["grad_accum"]
    rows, starts = _dataset(lengths, run["labels"])
    kwargs = dict(window_size=run["window_size"], num_replicas=R, cost_model=COST)

    def shards(state=None):
        out, datasets = [], []
        for r in range(R):
            ds = PackedIterableDataset(rows, config, **kwargs)
            if state is not None:
                ds.load_state_dict(state)
            shard = IterableDatasetShard(ds, batch_size=1, num_processes=R, process_index=r, split_batches=False)
            out.append(iter(DataLoader(shard, batch_size=1, collate_fn=PackedDataCollator())))
            datasets.append(ds)
        return out, datasets

    if not _dealable(lengths, config, R):  # a stream learns it at its end: the pass raises, never repeats
        ds = PackedIterableDataset(rows, config, **kwargs)
        with pytest.raises(ValueError, match=f"cannot be dealt to num_replicas={R}"):
            list(ds)
        count("exactly_once.undealable_passes_refused")
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iters, datasets = shards()
        seen: Counter = Counter()
        k = -1
        for k, step in enumerate(_steps(iters, GA)):
            if k == run["stop"]:
                break
            for batch in (b for rep in step for b in rep):
                seen.update(_check_row(batch, run["labels"]))
        killed = k == run["stop"]
        # killed mid-stream, or after the last step (a state saved at the end must resume with nothing left)
        state = datasets[0].state_dict(num_rows=k * GA * R) if killed else datasets[0].state_dict()
        state = json.loads(json.dumps(state))
        del iters, datasets
        iters, _ = shards(state)
        for step in _steps(iters, GA):
            for batch in (b for rep in step for b in rep):
                seen.update(_check_row(batch, run["labels"]))
    _no_even_batches_warning(caught)
    want = _expected_tokens(lengths, starts, config)
    count("exactly_once.stream_runs")
    count("exactly_once.samples", sum(1 for n in lengths if n))
    count("exactly_once.tokens", sum(want.values()))
    count("exactly_once.stream_resumes", int(killed))
    assert seen == want, f"lost {sum((want - seen).values())} tokens, repeated {sum((seen - want).values())}"


def test_even_batches_cuts_below_min_fragment_rather_than_repeat_batches():
    """Regression: when the last window's packs could be neither split (at a document boundary,
    or >= min_fragment) nor merged, Accelerate repeated batches: samples trained twice."""
    from atac_hf.packing.data.window_planner import plan_packs

    cases = [([40], PackingConfig(max_tokens=32, packs_per_window=2, overlength="truncate"), 2, 32),
             ([20], PackingConfig(max_tokens=64, packs_per_window=2), 2, 20),
             ([30, 30, 30], PackingConfig(max_tokens=32, packs_per_window=3, strategy="sequential"), 2, 90),
             ([5], PackingConfig(max_tokens=64, packs_per_window=3), 3, 5)]
    for lengths, config, replicas, tokens in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", SampleCutWarning)  # these passes can only be evened out by a cut
            spans, offsets = plan_packs(lengths, config, num_replicas=replicas)
        assert (len(offsets) - 1) % replicas == 0
        covered = Counter((int(i), t) for i, s, e in spans.tolist() for t in range(s, e))
        assert max(covered.values()) == 1 and len(covered) == tokens
    with pytest.raises(ValueError, match=r"num_replicas=2 .*fewer tokens \(1\) than replicas"):
        plan_packs([1], PackingConfig(max_tokens=8, packs_per_window=2), num_replicas=2)  # 1 token, 2 replicas
    count("exactly_once.even_out_regressions", len(cases))


def test_state_saved_at_the_end_of_the_epoch_resumes_with_nothing_left():
    """Regression: a sampler (or stream) state saved after the last batch of an epoch replayed the
    whole epoch on resume (every sample trained twice)."""
    config = PackingConfig(max_tokens=16, packs_per_window=2)
    lengths = [5, 40, 3, 7, 16, 1]
    sampler = WFAPBatchSampler(lengths, config, seed=0)
    epoch = list(sampler)
    resumed = WFAPBatchSampler(lengths, config, seed=0)
    resumed.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert list(resumed) == []
    assert list(resumed) == epoch  # the next pass of the same epoch starts over, as before
    resumed.set_epoch(1)
    assert len(list(resumed)) == len(resumed)
    rows = [{"input_ids": list(range(n))} for n in lengths]
    stream = PackedIterableDataset(rows, config)
    full = list(stream)
    again = PackedIterableDataset(rows, config)
    again.load_state_dict(json.loads(json.dumps(stream.state_dict())))
    assert list(again) == [] and list(again) == full
    count("exactly_once.end_of_epoch_resumes", 2)


# ---------------------------------------------------------------------------- corrupt checkpoint states
def _states():
    cfg = PackingConfig(max_tokens=16, packs_per_window=2)
    packer = StreamPacker(cfg)
    packer.add_window([0, 1, 2], [5, 40, 3])
    sampler = WFAPBatchSampler([5, 40, 3, 7], cfg, seed=0)
    list(sampler)
    rows = [{"input_ids": [1] * n} for n in (5, 40, 3, 7)]
    stream = PackedIterableDataset(rows, cfg)
    next(iter(stream))
    return [(lambda: StreamPacker(cfg), packer.state_dict()),
            (lambda: WFAPBatchSampler([5, 40, 3, 7], cfg, seed=0), sampler.state_dict()),
            (lambda: PackedIterableDataset(rows, cfg), stream.state_dict())]


def test_truncated_or_edited_states_raise_valueerror_and_change_nothing():
    """Regression: a state missing a field raised KeyError (or AttributeError / a bare int()
    message), and a StreamPacker accepted pool items of the wrong shape."""
    bad = 0
    for make, state in _states():
        state = json.loads(json.dumps(state))
        variants = [{k: v for k, v in state.items() if k != key} for key in state if key not in ("lookahead",
                                                                                                  "num_batches")]
        variants += [{**state, key: junk} for key in state if key not in ("format", "fingerprint", "lookahead",
                                                                          "num_batches")
                     for junk in (None, "x")]
        for v in variants:
            obj = make()
            with pytest.raises(ValueError):
                obj.load_state_dict(v)
            bad += 1
        fresh = make()
        fresh.load_state_dict(state)  # the intact state still loads
    packer_state = json.loads(json.dumps(_states()[0][1]))
    for pool in ([[1, 2]], [[0, 5, 5, 0, 0, 0]], "x"):
        with pytest.raises(ValueError, match="malformed StreamPacker state"):
            StreamPacker(PackingConfig(max_tokens=16, packs_per_window=2)).load_state_dict({**packer_state,
                                                                                            "pool": pool})
        bad += 1
    count("state.corrupt_states_refused", bad)


# ---------------------------------------------------------------------------- exactly-once, the planner alone
@st.composite
def passes(draw):
    cap = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 32]))
    n = draw(st.integers(1, 40))
    lengths = draw(st.lists(st.one_of(st.just(0), st.just(1), st.integers(1, cap), st.integers(cap, 4 * cap)),
                            min_size=n, max_size=n))
    if not any(lengths):
        lengths[0] = 1
    replicas, grad_accum = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    config = PackingConfig(
        max_tokens=cap, packs_per_window=replicas * grad_accum,
        strategy=draw(st.sampled_from(["wfap", "sequential", "bfd", "wlb"])),
        overlength=draw(st.sampled_from(["split", "truncate"])),
        max_defer=draw(st.sampled_from([0, 1, 3])),
        reference_doc_tokens=draw(st.sampled_from([1, 16])),
        balance_split=draw(st.booleans()),
    )
    return dict(lengths=lengths, config=config, replicas=replicas,
                window_size=draw(st.sampled_from([None, 1, 2, 3, 7])))


def _assert_dealt_exactly_once(packs, lengths, config, replicas):
    assert len(packs) % replicas == 0, f"{len(packs)} packs for {replicas} replicas: Accelerate would repeat some"
    covered: Counter = Counter()
    for pack in packs:
        assert pack and sum(e - s for _, s, e in pack) <= config.max_tokens
        covered.update((int(i), t) for i, s, e in pack for t in range(s, e))
    keep = [min(n, config.max_tokens) if config.overlength == "truncate" else n for n in lengths]
    want = Counter((i, t) for i, n in enumerate(keep) for t in range(n))
    assert covered == want, f"lost {sum((want - covered).values())}, repeated {sum((covered - want).values())}"


@settings(max_examples=400, **FAST)
@given(passes())
def test_every_dealable_pass_is_dealt_exactly_once_and_every_other_raises(run):
    """Random lengths x strategies x overlength policies x caps (1 included) x replicas x GA x
    window sizes: the pass is dealt to the replicas in equal batch counts with every kept token
    exactly once, or (fewer tokens than replicas; with max_tokens=1 a count that does not divide)
    it raises ValueError - never a warning and a repeated batch."""
    from atac_hf.packing.data.window_planner import plan_packs

    lengths, config, R = run["lengths"], run["config"], run["replicas"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not _dealable(lengths, config, R):
            with pytest.raises(ValueError, match=f"cannot be dealt to num_replicas={R}"):
                plan_packs(lengths, config, num_replicas=R, cost_model=COST, window_size=run["window_size"])
            count("exactly_once.planner_passes_refused")
            return
        spans, offsets = plan_packs(lengths, config, num_replicas=R, cost_model=COST, window_size=run["window_size"])
    _no_even_batches_warning(caught)
    packs = [[tuple(x) for x in spans[offsets[b]:offsets[b + 1]].tolist()] for b in range(len(offsets) - 1)]
    _assert_dealt_exactly_once(packs, lengths, config, R)
    count("exactly_once.planner_passes")


@settings(max_examples=120, **FAST)
@given(passes())
def test_every_dealable_stream_is_dealt_exactly_once(run):
    """The same for PackedIterableDataset (which learns that the pass ends only when its
    source does): the rows it yields are the pass's packs."""
    lengths, config, R = run["lengths"], run["config"], run["replicas"]
    rows, _ = _dataset(lengths, False)
    ds = PackedIterableDataset(rows, config, num_replicas=R, cost_model=COST, window_size=run["window_size"])
    if not _dealable(lengths, config, R):
        with pytest.raises(ValueError, match=f"cannot be dealt to num_replicas={R}"):
            list(ds)
        count("exactly_once.stream_passes_refused")
        return
    packs = [[tuple(sp) for sp in row["spans"]] for row in ds]
    _assert_dealt_exactly_once(packs, lengths, config, R)
    count("exactly_once.stream_passes")


def test_campaign_cases_of_issue_13_are_dealt_exactly_once_or_refused():
    """Regressions (issue 13, item 1): a tiny last window after full ones (the last window alone
    cannot make the count a multiple of the replicas: its reserve of earlier packs is re-cut with
    it); truncation + wlb at cap 16 with 3 replicas; cap 1 with 3 tokens and 2 replicas (cannot be
    dealt: raises, before anything was yielded for the sampler)."""
    from atac_hf.packing.data.window_planner import plan_packs

    cases = [([33, 33, 1, 32, 32, 1, 2], PackingConfig(max_tokens=32, packs_per_window=6, overlength="truncate",
                                                       max_defer=3), 3, 3),
             ([1, 3, 3, 2, 1, 2, 2, 3, 2, 2, 2, 1], PackingConfig(max_tokens=1, packs_per_window=6, strategy="wlb",
                                                                  overlength="truncate"), 3, 3),
             ([20, 5, 17, 40, 3, 9, 16, 1, 13], PackingConfig(max_tokens=16, packs_per_window=3, strategy="wlb",
                                                              overlength="truncate"), 3, None),
             ([2, 2], PackingConfig(max_tokens=2, packs_per_window=3), 3, None)]
    for lengths, config, R, window in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", SampleCutWarning)  # [2, 2] on 3 replicas: only by a cut
            spans, offsets = plan_packs(lengths, config, num_replicas=R, window_size=window)
        packs = [[tuple(x) for x in spans[offsets[b]:offsets[b + 1]].tolist()] for b in range(len(offsets) - 1)]
        _assert_dealt_exactly_once(packs, lengths, config, R)
        stream = [[tuple(sp) for sp in row["spans"]]
                  for row in PackedIterableDataset([{"input_ids": [1] * n} for n in lengths], config,
                                                   num_replicas=R, window_size=window)]
        _assert_dealt_exactly_once(stream, lengths, config, R)
    one = PackingConfig(max_tokens=1, packs_per_window=2)
    for make in (lambda: plan_packs([3], one, num_replicas=2), lambda: WFAPBatchSampler([3], one, num_replicas=2),
                 lambda: list(PackedIterableDataset([{"input_ids": [1, 2, 3]}], one, num_replicas=2))):
        with pytest.raises(ValueError, match=r"cannot be dealt to num_replicas=2 .*3 tokens.*max_tokens=1"):
            make()
    assert len(plan_packs([3], one, num_replicas=2, even_batches=False)[1]) - 1 == 3  # opted out: as planned
    count("exactly_once.campaign_regressions", len(cases) + 3)

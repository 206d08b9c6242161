"""Twenty-ninth pass (issue 20): tests that kill the survivors of the mutants on the last stop's changed lines:
``local_search``'s swap cap, ``plan_atp``'s level search and per_doc route limit, ``DocumentTargets``,
``document_start_positions``, ``light_batch_digest``, ``count_targets`` and BatchSharder's every-batch check.
See docs/TESTING.md "Twenty-ninth pass"."""

from __future__ import annotations

from atac_hf.packing.planners.wfap_place import local_search
from test_mutants_shard_twins import GROUP, _batch, world  # noqa: F401  (world: the fixture)


def test_local_search_swap_keeps_the_cheap_pack_under_the_cap():
    """A swap that would lengthen the lowest pack past the cap is not taken (its ``pt[q] + dl <= C``).
    Here: tails 4 (5 tokens) and 1 (4 tokens) would swap to lower the pair's score, but pack 1 would hold 9 > 8."""
    L = [4, 4, 2, 1, 5]
    c = [[7.0], [3.0], [3.0], [8.0], [5.0]]
    tail_of = [[2, 3, 4], [0, 1]]
    pc, pt = [[16.0], [10.0]], [8, 8]
    args = [pc, pt, tail_of, [[], []], L, c, 8]
    local_search(*args)
    assert max(pt) <= 8, pt
    assert tail_of == [[2, 3, 4], [0, 1]] and pt == [8, 8] and pc == [[16.0], [10.0]]


# ---------------------------------------------------------------------------- BatchSharder's every-batch check


def test_batch_sharder_checks_every_batch_at_cp2_without_debug(world):
    """BatchSharder runs check_same_batch at cp_size 2 when debug is off (debug compares full digests in
    shard_batch): CP ranks with other rows (same lengths) fail on both ranks, naming the every-batch check."""
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.sharder import BatchSharder

    a = _batch([[5, 6, 7, 8, 9, 10, 11, 12]], [[8]], labels=[[-100, 6, 7, 8, 9, 10, 11, 12]])
    b = _batch([[5, 6, 7, 8, 9, 10, 11, 13]], [[8]], labels=[[-100, 6, 7, 8, 9, 10, 11, 13]])
    w = world(2)

    def step(r, batches):
        return BatchSharder(ATACConfig(cp_size=2, max_tokens=64), cp_rank=r, cp_group=GROUP)(batches[r])

    got = w.run(lambda r: step(r, (a, b)))
    assert all(isinstance(e, RuntimeError) and "(Checked on every batch.)" in str(e) for e in got), got
    w = world(2)
    got = w.run(lambda r: step(r, (a, a)))
    assert not any(isinstance(e, BaseException) for e in got), got


# ---------------------------------------------------------------------------- plan_atp's per_doc candidate
def test_per_doc_candidate_keeps_the_atp_strategy_name():
    """One document of 5,262 tokens at CP 8: the per_doc candidate wins, and the plan is still named ``atp``
    (``finish_flat``'s strategy argument)."""
    import numpy as np

    from atac_hf.cost import default_cost_model
    from atac_hf.sharding import plan_shards

    plan = plan_shards(np.array([5262]), 8, "atp", default_cost_model())
    plan.validate()
    assert plan.strategy == "atp" and plan.gathered_docs.tolist() == [0]


def _per_doc_routes(monkeypatch, lengths, C):
    import numpy as np

    import atac_hf.sharding.atp as atp
    from atac_hf.cost import default_cost_model

    routes = []
    real = atp.finish_flat

    def spy(*a, **kw):
        if "route" in kw:  # only the per_doc candidate passes a route
            routes.append(kw["route"])
        return real(*a, **kw)

    monkeypatch.setattr(atp, "finish_flat", spy)
    monkeypatch.setattr(atp, "_per_doc_may_win", lambda *a, **k: True)  # always build the candidate
    atp.plan_atp(np.asarray(lengths, dtype=np.int64), C, default_cost_model())
    return routes


def test_per_doc_route_limit_boundary(monkeypatch):
    """PER_DOC_ROUTE_LIMIT (2**18) over split documents (length >= 2) x C x C, inclusive: at CP 64, 64 such
    documents are routed ("auto"), 65 (one of them of 2 tokens) are not; a 1-token document is not counted."""
    from atac_hf.sharding.atp import PER_DOC_ROUTE_LIMIT

    assert PER_DOC_ROUTE_LIMIT == 64 * 64 * 64
    assert _per_doc_routes(monkeypatch, [1000] * 64, 64) == ["auto"]
    assert _per_doc_routes(monkeypatch, [1000] * 64 + [2], 64) == [None]
    assert _per_doc_routes(monkeypatch, [1000] * 64 + [1], 64) == ["auto"]


# ---------------------------------------------------------------------------- plan_atp's level search
def _anchor_counts_tried(monkeypatch, lengths, C):
    import numpy as np

    import atac_hf.sharding.atp as atp
    from atac_hf.cost import default_cost_model
    from atac_hf.sharding import plan_shards

    counts = []
    real = atp._water_fill
    monkeypatch.setattr(atp, "_water_fill", lambda *a: counts.append(len(a[1])) or real(*a))
    plan = plan_shards(np.asarray(lengths, dtype=np.int64), C, "atp", default_cost_model())
    plan.validate()
    return counts, plan


def test_level_search_tries_exactly_level_search_limit_more_counts(monkeypatch):
    """Where no count past ATP's best anchor count levels the ranks, the search tries exactly
    LEVEL_SEARCH_LIMIT more (best + 1 ... best + 8), from a best of 0 anchors and from a best of 3."""
    import numpy as np

    from atac_hf.sharding.atp import LEVEL_SEARCH_LIMIT

    assert LEVEL_SEARCH_LIMIT == 8
    counts, plan = _anchor_counts_tried(monkeypatch, np.full(192, 300), 128)  # best: whole documents
    assert counts == list(range(1, 9)) and plan.imbalance > 1.005
    rng = np.random.default_rng(8)
    assert int(rng.choice([8, 16, 32, 64])) == 32 and int(rng.integers(16, 128)) == 52
    lengths = np.concatenate([rng.integers(50, 300, 52), rng.integers(5000, 20000, int(rng.integers(1, 4)))])
    assert lengths[-3:].tolist() == [10899, 16360, 14250]
    counts, plan = _anchor_counts_tried(monkeypatch, lengths, 32)  # best: 3 anchors (the 3 long documents)
    assert counts == [3] + list(range(4, 12)) and plan.imbalance > 1.005


# ---------------------------------------------------------------------------- DocumentTargets, document_start_positions
def test_document_start_positions_none_where_the_lengths_cannot_be_read():
    """A batch whose documents cannot be found (here ``seq_lengths`` that is not a sequence: TypeError inside,
    or lengths that do not fill the row: ValueError) gives None, and count_targets falls back to labels[..., 1:]."""
    import torch

    from atac_hf.integrations.sharder import count_targets
    from atac_hf.integrations.targets import document_start_positions

    ids = torch.arange(4)[None]
    labels = torch.tensor([[5, 6, 7, 8]])
    assert document_start_positions({"input_ids": ids, "seq_lengths": object()}) is None
    assert document_start_positions({"input_ids": ids, "seq_lengths": [[1, 2]]}) is None
    assert count_targets({"input_ids": ids, "labels": labels, "seq_lengths": object()}) == 3
    assert document_start_positions({"input_ids": ids, "seq_lengths": [[1, 3]]}).tolist() == [0, 1]


def test_document_targets_unwraps_a_wrapped_collator():
    from atac_hf.integrations.targets import DocumentTargets
    from atac_hf.packing import PackedDataCollator

    inner = PackedDataCollator(separator_id=2)
    twice = DocumentTargets(DocumentTargets(inner))
    assert twice.collate is inner and twice.separator_id == 2


def test_document_targets_refuses_a_bool_separator():
    import pytest

    from atac_hf.integrations.targets import DocumentTargets
    from atac_hf.packing.validate import InputTypeError

    class Flagged:
        separator_id = True

        def __call__(self, features):
            return features

    with pytest.raises(InputTypeError, match=r"Flagged.separator_id=True is not an int"):
        DocumentTargets(Flagged())
    assert DocumentTargets(type("NumpySep", (Flagged,), {"separator_id": __import__("numpy").int64(7)})()).separator_id == 7


def _packed(labels_from_ids=True, **extra):
    """A packed batch of documents [5, 6, 7], [8, 9], [10] (positions restart per document)."""
    import torch

    b = {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 10]]), "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0]])}
    if labels_from_ids:
        b["labels"] = b["input_ids"].clone()
    b.update(extra)
    return b


def test_document_targets_leaves_a_batch_with_shift_labels_alone():
    """A collator's own shift_labels are the targets as given: neither they nor the labels are rewritten
    (with or without a separator token)."""
    import torch

    from atac_hf.integrations.targets import DocumentTargets

    own = torch.tensor([[6, 7, -100, 9, -100, -100]])  # targets that never cross a document

    class WithShift:
        def __init__(self, sep):
            self.separator_id = sep

        def __call__(self, features):
            return _packed(shift_labels=own.clone())

    for sep in (-100, 2):
        got = DocumentTargets(WithShift(sep))(None)
        assert got["labels"].tolist() == [[5, 6, 7, 8, 9, 10]] and got["shift_labels"].tolist() == own.tolist()


def test_document_targets_leaves_batches_it_cannot_read_alone():
    """No document positions (starts None), or labels shorter than the row (the last start past them): the
    batch comes back as the collator made it, for the sharder to refuse naming why."""
    import torch

    from atac_hf.integrations.targets import DocumentTargets

    bare = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "labels": torch.tensor([[5, 6, 7, 8]])}
    got = DocumentTargets(lambda f: {k: v.clone() for k, v in bare.items()})(None)
    assert sorted(got) == ["input_ids", "labels"] and got["labels"].tolist() == [[5, 6, 7, 8]]
    short = _packed(labels_from_ids=False, labels=torch.tensor([[5, 6, 7]]))  # starts 0, 3, 5: 3 is past
    got = DocumentTargets(lambda f: dict(short))(None)
    assert got["labels"].tolist() == [[5, 6, 7]] and "shift_labels" not in got
    short2 = _packed(labels_from_ids=False, labels=torch.tensor([[5, 6, 7, 8, 9]]))  # the last start (5) is past
    got = DocumentTargets(lambda f: dict(short2))(None)
    assert got["labels"].tolist() == [[5, 6, 7, 8, 9]]


def test_document_targets_masks_every_start_when_only_some_are_labelled():
    import torch

    from atac_hf.integrations.targets import DocumentTargets

    b = _packed()
    b["labels"][0, 0] = -100  # the first start already ignored, the others not
    got = DocumentTargets(lambda f: b)(None)
    assert got["labels"].tolist() == [[-100, 6, 7, -100, 9, -100]]
    assert torch.equal(got["input_ids"], torch.tensor([[5, 6, 7, 8, 9, 10]]))


def test_document_targets_never_writes_into_the_collators_tensors():
    """A collator whose labels are its input_ids tensor itself (not a copy): masking the start labels must
    not change the input ids (the labels are copied before -100 is written)."""
    from atac_hf.integrations.targets import DocumentTargets

    def same_tensor(features):
        b = _packed(labels_from_ids=False)
        b["labels"] = b["input_ids"]
        return b

    got = DocumentTargets(same_tensor)(None)
    assert got["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10]]
    assert got["labels"].tolist() == [[-100, 6, 7, -100, 9, -100]]


# ---------------------------------------------------------------------------- light_batch_digest
def test_light_batch_digest_by_hand():
    """sum over input_ids, labels, shift_labels (key i, weight 2i + 3) of position (from 1) x value, as 64-bit
    two's complement: 3 x (1 + 4 + 9) + 5 x (-100 + 4 + 9) + 7 x (2 + 6 - 300) = 42 - 435 - 2044 = -2437."""
    import torch

    from atac_hf.attention.batch_check import light_batch_digest

    b = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[-100, 2, 3]]),
         "shift_labels": torch.tensor([[2, 3, -100]])}
    assert light_batch_digest(b) == f"{2**64 - 2437:016x}" == "fffffffffffff67b"
    assert light_batch_digest({"input_ids": torch.tensor([[7]])}) == f"{21:016x}"  # the first position counts
    assert light_batch_digest({**b, "shift_labels": torch.tensor([[2, 4, -100]])}) != light_batch_digest(b)
    # other integer dtypes give the same checksum (int64 products)
    assert light_batch_digest({k: v.to(torch.int32) for k, v in b.items()}) == light_batch_digest(b)


# ---------------------------------------------------------------------------- count_targets
def test_count_targets_with_labels_shorter_than_the_row_falls_back():
    """Labels that end where the last document starts (start 5, 5 labels) cannot be read by start: counted as
    labels[..., 1:] (4), not indexed past their end; labels covering the row drop every start label (3 here)."""
    import torch

    from atac_hf.integrations.sharder import count_targets

    assert count_targets(_packed(labels_from_ids=False, labels=torch.tensor([[5, 6, 7, 8, 9]]))) == 4
    assert count_targets(_packed()) == 3

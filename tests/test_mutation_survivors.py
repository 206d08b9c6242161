"""Tests that kill the mutants which survived the rest of the suite (issue 20).

Each section names the mutant it kills; docs/TESTING.md lists them with the command that
plants them. Expected values are hand-checked or built independently of the code under
test (never with the function being checked).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch

from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, StreamPacker, pack_lengths

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

# cost = tokens: the token rules decide everything
LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


def _bfd(max_tokens: int, packs_per_window: int, **kw) -> PackingConfig:
    return PackingConfig(max_tokens=max_tokens, packs_per_window=packs_per_window, strategy="bfd", **kw)


# ---------------------------------------------------------------------------- plan_bfd
# Mutants: first-fit decreasing (the first open pack that fits), worst fit (the pack with the
# most room), ignoring the overdue-first order. Each case below gives another answer under them.

def test_bfd_takes_the_tightest_pack_not_the_first():
    # data order 3, 1, 5, 3 (ids 0..3), cap 7, 2 packs. Longest first: 5 (id 2) -> A (room 2);
    # 3 (id 0) -> A? no (2 < 3): opens B (room 4); 3 (id 3) -> B (room 1); 1 (id 1): A has room 2,
    # B room 1: best fit B (room 0). First fit and worst fit would put it in A: [[5, 1], [3, 3]].
    p = StreamPacker(_bfd(7, 2), LINEAR)
    assert p.add_window(range(4), [3, 1, 5, 3]) == [[(2, 0, 5)], [(0, 0, 3), (1, 0, 1), (3, 0, 3)]]
    assert p.pending_ids == []


def test_bfd_tightest_pack_is_a_middle_one():
    # data order 3, 5, 1, 3, 3 (ids 0..4), cap 7, 3 packs. Longest first (ties in data order):
    # 5 (id 1) -> A (room 2); 3 (id 0) -> B (4); 3 (id 3) -> B (1); 3 (id 4): only a new pack
    # fits -> C (4); 1 (id 2): rooms A 2, B 1, C 4 -> B. First fit puts the 1 in A, worst fit in C.
    p = StreamPacker(_bfd(7, 3), LINEAR)
    assert p.add_window(range(5), [3, 5, 1, 3, 3]) == [[(1, 0, 5)], [(0, 0, 3), (2, 0, 1), (3, 0, 3)], [(4, 0, 3)]]
    # cap 8, 3 packs, 6, 4, 3, 1: 6 -> A (2); 4 -> B (4); 3 -> B (1); 1: rooms A 2, B 1 -> B.
    # First fit: [[6, 1], [4, 3]].
    q = StreamPacker(_bfd(8, 3), LINEAR)
    assert q.add_window(range(4), [6, 4, 3, 1]) == [[(0, 0, 6)], [(1, 0, 4), (2, 0, 3), (3, 0, 1)]]


def test_bfd_equal_rooms_go_to_the_older_pack():
    # cap 6, 2 packs: 4 (id 0) -> A (2); 4 (id 1) -> B (2); 2 (id 2): A and B both have room 2:
    # the lower pack index wins.
    p = StreamPacker(_bfd(6, 2), LINEAR)
    assert p.add_window(range(3), [4, 4, 2]) == [[(0, 0, 4), (2, 0, 2)], [(1, 0, 4)]]


def test_bfd_through_pack_lengths():
    # the first case again, through the whole-array API (one window of 4 samples, then flush)
    res = pack_lengths([3, 1, 5, 3], _bfd(7, 2), LINEAR, window=4)
    assert res.packs == [[(2, 0, 5)], [(0, 0, 3), (1, 0, 1), (3, 0, 3)]]
    assert res.deferred == []
    # two windows: 5, 3, 3, 1 | 4, 2, 2 into cap 7, 2 packs. Window 0: [[5], [3, 3, 1]] (best fit
    # for the 1). Window 1: 4 -> A (3), 2 -> A (1), 2 -> B (5): [[4, 2], [2]].
    res = pack_lengths([5, 3, 3, 1, 4, 2, 2], _bfd(7, 2), LINEAR, window=4)
    assert res.packs == [[(0, 0, 5)], [(1, 0, 3), (2, 0, 3), (3, 0, 1)], [(4, 0, 4), (5, 0, 2)], [(6, 0, 2)]]
    assert res.pack_window == [0, 0, 1, 1]


def test_bfd_places_overdue_samples_first():
    # max_defer 1, cap 5, one pack per window. Window 0: 5, 2, 2 -> [5] and [2, 2]: the fuller
    # [5] is emitted, the 2s are carried (due in window 1).
    p = StreamPacker(_bfd(5, 1, max_defer=1, split_overdue=False), LINEAR)
    assert p.add_window([0, 1, 2], [5, 2, 2]) == [[(0, 0, 5)]]
    assert p.pending_ids == [1, 2]
    # Window 1 adds 4 and 1. Due first: 2 -> A (3), 2 -> A (1), 4 -> B (1), 1 -> A (tie with B:
    # the older pack): A = [2, 2, 1] holds the due items and is emitted, 4 waits. Longest first
    # regardless of due dates: 4 -> A, 2 -> B, 2 -> B, 1 -> A: the due pack B = [2, 2] is
    # emitted and the 1 is carried too.
    assert p.add_window([3, 4], [4, 1]) == [[(1, 0, 2), (2, 0, 2), (4, 0, 1)]]
    assert p.pending_ids == [3]


def test_bfd_emits_the_fullest_pack():
    # cap 6, one pack: 5 -> A (room 1), 3 -> B (3), 3 -> B (0): B holds 6 tokens, A 5: B is
    # emitted (not the first pack opened), the 5 waits for a window that fills its hole.
    p = StreamPacker(_bfd(6, 1), LINEAR)
    assert p.add_window(range(3), [5, 3, 3]) == [[(1, 0, 3), (2, 0, 3)]]
    assert p.pending_ids == [0]


def test_bfd_keeps_the_due_pack_even_when_another_is_fuller():
    # max_defer 1, cap 5, one pack. Window 0: 5 and 2: [5] is the fuller pack, the 2 waits.
    p = StreamPacker(_bfd(5, 1, max_defer=1, split_overdue=False), LINEAR)
    assert p.add_window([0, 1], [5, 2]) == [[(0, 0, 5)]]
    # Window 1 adds a 4: the due 2 -> A (room 3), 4 -> B (1). B holds more tokens, but A holds
    # the due item: A is emitted, the 4 waits (fullest first would emit [4] and leave the due 2).
    assert p.add_window([2], [4]) == [[(1, 0, 2)]]
    assert p.pending_ids == [2]


# Fragments (start > 0) in the pool: a span's tokens are end - start, never end + start.
def test_fragments_count_their_own_tokens_sequential_bfd_wlb():
    # 23 into cap 10: pieces 10, 10, 3 = (0, 0, 10), (0, 10, 20), (0, 20, 23)
    seq = StreamPacker(PackingConfig(max_tokens=10, packs_per_window=4, strategy="sequential", min_fragment=1), LINEAR)
    with pytest.warns(UserWarning, match="split into fragments"):
        got = seq.add_window([0, 1], [23, 3])
    # next fit: 10 | 10 | 3 (the last piece) + 3 = 6 tokens in the third pack
    assert got == [[(0, 0, 10)], [(0, 10, 20)], [(0, 20, 23), (1, 0, 3)]]
    bfd = StreamPacker(_bfd(10, 3, min_fragment=1), LINEAR)
    with pytest.warns(UserWarning, match="split into fragments"):
        got = bfd.add_window([0, 1, 2], [23, 4, 3])
    # longest first: 10 -> A, 10 -> B, 4 -> C (6), then the 3-token piece (sample 0 first) -> C (3),
    # 3 -> C (0)
    assert got == [[(0, 0, 10)], [(0, 10, 20)], [(0, 20, 23), (1, 0, 4), (2, 0, 3)]]
    # wlb, threshold 9: the queue [(0, 0, 10), (1, 0, 10)] is full (2 packs) and released one per
    # pack; the 3-token piece (0, 10, 13) is below the threshold, free, and fits nowhere: carried
    wlb = StreamPacker(PackingConfig(max_tokens=10, packs_per_window=2, strategy="wlb", wlb_thresholds=(9,),
                                     min_fragment=1), LINEAR)
    with pytest.warns(UserWarning, match="split into fragments"):
        got = wlb.add_window([0, 1], [13, 10])
    assert got == [[(0, 0, 10)], [(1, 0, 10)]]
    assert wlb.pending_ids == [0] and wlb.pending_tokens == 3


def test_wlb_held_fragments_count_their_own_tokens():
    # thresholds (3, 8), 2 packs: 13 -> pieces (0, 0, 10) (queue >= 8) and (0, 10, 13) (queue
    # [3, 8)); neither queue is full, so both wait; the two 1-token samples fill the packs. The
    # next window needs its whole capacity of new tokens: 2 x 10 - (13 pending - 13 held) = 20.
    p = StreamPacker(PackingConfig(max_tokens=10, packs_per_window=2, strategy="wlb", wlb_thresholds=(3, 8),
                                   min_fragment=1), LINEAR)
    with pytest.warns(UserWarning, match="split into fragments"):
        assert p.add_window([0, 1, 2], [13, 1, 1]) == [[(1, 0, 1)], [(2, 0, 1)]]
    assert p.pending_tokens == 13 and p.tokens_wanted == 20


def test_sequential_follows_data_order_not_sample_ids():
    # ids 7, 3, 5 arrive in that order: next fit in arrival order, 4 + 2 | 3 (by id it would be 2 + 3 | 4)
    p = StreamPacker(PackingConfig(max_tokens=6, packs_per_window=2, strategy="sequential"), LINEAR)
    assert p.add_window([7, 3, 5], [4, 2, 3]) == [[(7, 0, 4), (3, 0, 2)], [(5, 0, 3)]]


def _wlb(max_tokens: int, packs_per_window: int, thresholds: tuple) -> StreamPacker:
    return StreamPacker(PackingConfig(max_tokens=max_tokens, packs_per_window=packs_per_window, strategy="wlb",
                                      wlb_thresholds=thresholds), LINEAR)


def test_wlb_fills_a_pack_exactly_to_the_cap():
    # cap 6, 2 packs, no outliers (threshold 5): longest first to the least loaded pack that fits:
    # 4 -> A; 3 -> B; 3 -> B (3 < 4; 3 + 3 = 6 fits exactly); 2 -> A (4 + 2 = 6 exactly)
    assert _wlb(6, 2, (5,)).add_window(range(4), [4, 2, 3, 3]) == [[(0, 0, 4), (1, 0, 2)], [(2, 0, 3), (3, 0, 3)]]


def test_wlb_least_workload_pack_filled_exactly():
    # cost = tokens + causal pairs (cost(4) = 14, cost(2) = 5), cap 6, 2 packs: 4 -> A (14);
    # 2 -> B (5); 2 -> B (10); 2 -> B: the least loaded (10 < 14) and 4 + 2 = 6 fits exactly.
    # Refusing the exact fit would send it to the pack with the fewest tokens, A (4 + 2).
    quad = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1)
    p = StreamPacker(PackingConfig(max_tokens=6, packs_per_window=2, strategy="wlb", wlb_thresholds=(5,)), quad)
    assert p.add_window(range(4), [4, 2, 2, 2]) == [[(0, 0, 4)], [(1, 0, 2), (2, 0, 2), (3, 0, 2)]]


def test_wlb_a_sample_that_fits_nowhere_does_not_stop_the_rest():
    # cap 6, one pack: 5 -> A; 4 fits nowhere (carried); 1 still goes to A
    p = _wlb(6, 1, (6,))
    assert p.add_window(range(3), [5, 4, 1]) == [[(0, 0, 5), (2, 0, 1)]]
    assert p.pending_ids == [1]


def test_wlb_places_an_overdue_queued_outlier_before_the_rest():
    # threshold 4, 2 packs, cap 6, max_defer 1. Window 0: the 5 waits in its queue (one of the two
    # it needs); the 1s take the packs. Window 1: the 5 is due: it is placed first (A), then the
    # 3s: B (3 < 5), B (3 + 3 = 6). Placed after them, it would find room 3 in each pack: left out.
    p = StreamPacker(PackingConfig(max_tokens=6, packs_per_window=2, strategy="wlb", wlb_thresholds=(4,),
                                   max_defer=1, split_overdue=False), LINEAR)
    assert p.add_window([0, 1, 2], [5, 1, 1]) == [[(1, 0, 1)], [(2, 0, 1)]]
    assert p.pending_ids == [0]
    assert p.add_window([3, 4], [3, 3]) == [[(0, 0, 5)], [(3, 0, 3), (4, 0, 3)]]
    assert p.pending_ids == []


def test_wlb_released_outliers_go_to_the_least_loaded_pack():
    # thresholds (3, 6), cap 12, 2 packs: queue [3, 6) = [3, 4] and queue >= 6 = [6, 7] are both
    # full and released, the lower threshold first, heaviest first: 4 -> A, 3 -> B; then 7 -> B
    # (3 < 4), 6 -> A. By pack index instead of load: 4, 3 -> A; 7 -> B; 6 fits nowhere.
    p = _wlb(12, 2, (3, 6))
    assert p.add_window(range(4), [6, 7, 3, 4]) == [[(0, 0, 6), (3, 0, 4)], [(1, 0, 7), (2, 0, 3)]]
    assert p.pending_ids == []


# ---------------------------------------------------------------------------- build_shift_labels via shard_batch
# Mutant: build_shift_labels without the -100 at each document's last token. Batches from our
# collator carry -100 at document starts, so the shift across a boundary is -100 anyway; user
# labels without it must still never cross a document.
IGNORE = -100
SHIFT_ROWS = [[7, 1, 5, 3], [9, 2, 5]]  # B = 2, S = 16 (32 tokens): a 1-token document, a row boundary
LOSS_ROWS = [[40, 3, 1, 20], [30, 1, 24, 9]]  # B = 2, S = 64


def _expected_shift(rows: list[list[int]], labels_flat: list[int]) -> list[int]:
    """shift[t] = labels[t + 1] inside a document, -100 at its last token: written out per
    document from the row layout, independently of build_shift_labels."""
    out, t = [], 0
    for row in rows:
        for n in row:
            out += [labels_flat[t + i + 1] for i in range(n - 1)] + [IGNORE]
            t += n
    return out


def _user_label_batch(rows, labels_from_ids: bool, seed: int) -> dict:
    b = _dist.make_batch(rows, seed)
    B, S = b["input_ids"].shape
    # user labels: no -100 at document starts (a real target at every token)
    labels = b["input_ids"].clone() if labels_from_ids else torch.arange(1, B * S + 1).view(B, S)
    return {**b, "labels": labels}


def test_user_labels_shift_within_documents_cp1():
    """In one process (what a mutation run sees): shard_batch at cp_size 1 and
    build_shift_labels itself, on user labels without -100 at document starts."""
    from atac_hf.attention import build_shift_labels, shard_batch
    from atac_hf.sharding import plan_shards

    batch = _user_label_batch(SHIFT_ROWS, labels_from_ids=False, seed=0)
    labels_flat = batch["labels"].reshape(-1).tolist()
    want = _expected_shift(SHIFT_ROWS, labels_flat)
    # by hand for row 0 (documents 7, 1, 5, 3; labels 1..16): 2..7, -100 | -100 | 10..13, -100 | 15, 16, -100
    assert want[:16] == [2, 3, 4, 5, 6, 7, -100, -100, 10, 11, 12, 13, -100, 15, 16, -100]
    lengths = np.array([n for r in SHIFT_ROWS for n in r])
    assert build_shift_labels(batch["labels"], lengths).reshape(-1).tolist() == want
    local = shard_batch(batch, plan_shards(lengths, 1), 0)
    assert local["shift_labels"][0].tolist() == want
    assert local["num_items_in_batch"] == 32 - 7


def _per_document_reference(model, batch, rows):
    """Single-device loss (sum over documents of the next-token loss inside the document,
    over the number of targets) and its gradients, each document run on its own."""
    model.zero_grad(set_to_none=True)
    ids, labels = batch["input_ids"].reshape(-1), batch["labels"].reshape(-1)
    total, count, t = 0.0, 0, 0
    for row in rows:
        for n in row:
            if n > 1:
                logits = model(input_ids=ids[None, t:t + n], use_cache=False).logits[0]
                total = total + torch.nn.functional.cross_entropy(logits[:-1].double(), labels[t + 1:t + n],
                                                                  reduction="sum")
                count += n - 1
            t += n
    loss = total / count
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), count, grads


def shift_labels_worker(rank: int, world: int, out_path: str) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F

    from atac_hf.attention import doc_lengths_from_batch, shard_batch
    from atac_hf.sharding import STRATEGIES, plan_shards

    report = {"strategies": [], "doc_ends_not_last": [0] * world, "loss_cases": 0}
    # 1. contents: each rank's shift_labels are the independent expectation at its tokens
    batch = _user_label_batch(SHIFT_ROWS, labels_from_ids=False, seed=0)
    labels_flat = batch["labels"].reshape(-1).tolist()
    want = torch.tensor(_expected_shift(SHIFT_ROWS, labels_flat))
    ends = set(np.cumsum([n for r in SHIFT_ROWS for n in r]) - 1)
    lengths = doc_lengths_from_batch(batch)
    for strategy in sorted(STRATEGIES):
        plan = plan_shards(lengths, world, strategy)
        local = shard_batch(batch, plan, rank)
        idx = torch.as_tensor(plan.rank_token_indices(rank))
        assert torch.equal(local["shift_labels"][0], want[idx]), (strategy, rank)
        assert torch.equal(local["labels"][0], batch["labels"].reshape(-1)[idx])
        assert local["num_items_in_batch"] == 32 - 7, "32 tokens, 7 documents: 25 targets"
        held = [None] * world
        dist.all_gather_object(held, sorted(idx.tolist()))
        assert sorted(t for h in held for t in h) == list(range(32)), "every token on exactly one rank"
        report["strategies"].append(strategy)
        for r in range(world):  # guard: the mutant changes exactly these labels
            report["doc_ends_not_last"][r] += sum(1 for t in held[r] if t in ends and t != 31)
    # 2. end to end: the CP loss and gradients equal the single-device per-document ones
    batch = _user_label_batch(LOSS_ROWS, labels_from_ids=True, seed=1)
    model = _dist.tiny_model("llama", torch.float64)
    _dist.set_attn(model, "sdpa")
    ref_loss, ref_count, ref_grads = _per_document_reference(model, batch, LOSS_ROWS)
    lengths = doc_lengths_from_batch(batch)
    _dist.set_attn(model, "atac_cp")
    for strategy in ("atp", "zigzag", "per_doc"):
        plan = plan_shards(lengths, world, strategy)
        model.zero_grad(set_to_none=True)
        local = shard_batch(batch, plan, rank)
        assert local["num_items_in_batch"] == ref_count
        out = model(**local)
        # Transformers computes its loss from logits.float(): backward the fp64 loss of the same
        # shift_labels (this rank's sum over the global count) for fp64 gradients
        loss64 = F.cross_entropy(out.logits[0], local["shift_labels"][0], reduction="sum") / local["num_items_in_batch"]
        loss64.backward()
        loss, loss64 = out.loss.detach().clone(), loss64.detach().clone()
        for t in (loss, loss64):
            dist.all_reduce(t)
        assert _dist.rel_err(loss64, ref_loss) <= 1e-10, (strategy, float(loss64), float(ref_loss))
        assert _dist.rel_err(loss, ref_loss) <= 1e-6, (strategy, float(loss), float(ref_loss))  # HF: fp32 loss
        for name, p in model.named_parameters():
            g = p.grad.detach().clone()
            dist.all_reduce(g)
            assert _dist.rel_err(g, ref_grads[name]) <= 1e-10, (strategy, name)
        report["loss_cases"] += 1
        report[f"gathered:{strategy}"] = len(plan.gathered_docs)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(report, f)


@pytest.mark.slow
def test_user_labels_never_cross_a_document_through_shard_batch_at_2_ranks(tmp_path):
    out = tmp_path / "report.json"
    _dist.spawn(shift_labels_worker, 2, str(out), timeout_s=300)
    report = json.loads(out.read_text())
    from atac_hf.sharding import STRATEGIES

    assert report["strategies"] == sorted(STRATEGIES)
    # 6 document ends before the last token, per strategy; each rank held some of them
    assert sum(report["doc_ends_not_last"]) == 6 * len(STRATEGIES) and min(report["doc_ends_not_last"]) > 0
    assert report["loss_cases"] == 3 and report["gathered:zigzag"] > 0, "the K/V gather ran"


# ---------------------------------------------------------------------------- ATACTrainer resume
# Mutants: ATACTrainer skipping the restore of the sampler state; the saved position without
# the GA or the DP factor. The run resumes one step into epoch 1 (GA 2, DP 2), in a trainer
# whose data seed differs from the checkpoint's.
@pytest.fixture(scope="module")
def resume_results(tmp_path_factory):
    from _launch import ROOT, torchrun

    d = tmp_path_factory.mktemp("atac_resume")
    torchrun(2, ROOT / "tests" / "_resume_worker.py", d / "out", timeout=600)
    return [json.loads((d / f"out.rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["even", "uneven"])
def test_resume_across_an_epoch_boundary_with_ga_and_dp(resume_results, scenario):
    ga, dp = 2, 2
    for rank, results in enumerate(resume_results):
        r = results[scenario]
        assert r["dp_size"] == dp
        per_replica = r["num_batches"] // dp  # the loader deals the epoch's packs round-robin
        steps_per_epoch = -(-per_replica // ga)  # Trainer: the last step may hold fewer micro-batches
        assert r["max_steps"] == 2 * steps_per_epoch and r["kill"] == steps_per_epoch + 1
        assert (per_replica % ga == 0) == (scenario == "even"), "the scenario is what it is named for"
        assert len(r["full_digests"]) == 2 * per_replica, "the uninterrupted run saw both epochs"
        # the saved state: epoch 1, the run's seed, one step of GA x DP packs taken
        saved = r["saved"]
        assert (saved["epoch"], saved["seed"], saved["position"]) == (1, 0, 1 * ga * dp)
        assert saved["num_batches"] == r["num_batches"]
        # restored from the checkpoint (epoch and seed), not from the resumed trainer (data seed 5);
        # Trainer skips the trained batches itself, so the sampler restarts the epoch at 0
        assert (r["restored"]["epoch"], r["restored"]["seed"], r["restored"]["position"]) == (1, 0, 0)
        assert r["resumed_seen"] and all(s == [1, 0] for s in r["resumed_seen"])
        # the batches after the checkpoint are those of the uninterrupted run
        before = per_replica + ga
        assert r["resumed_digests"] == r["full_digests"][before:], f"rank {rank}"
        assert r["full_seen"][:per_replica] == [[0, 0]] * per_replica
        assert r["full_seen"][per_replica:] == [[1, 0]] * per_replica
        # not vacuous: the epochs' orders differ, and so would another seed's
        assert r["full_digests"][:per_replica] != r["full_digests"][per_replica:]
        assert r["resumed_steps"] == r["max_steps"]
        np.testing.assert_allclose(r["resumed_loss"], r["full_loss"], rtol=1e-6)
    assert resume_results[0][scenario]["full_digests"] != resume_results[1][scenario]["full_digests"], \
        "the two replicas train on different packs"


# ---------------------------------------------------------------------------- shard_batch input forms
# mutmut survivors in attention/shard.py: the forms of position_ids and labels no other test passed.
def test_shard_batch_position_ids_as_flat_tensor_or_list():
    from atac_hf.attention import doc_lengths_from_batch, shard_batch
    from atac_hf.sharding import plan_shards

    b = _dist.make_batch([[3, 1, 4]], seed=0)  # one row of 8 tokens
    plan = plan_shards([3, 1, 4], 1)
    want = [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert shard_batch(b, plan, 0)["position_ids"].tolist() == want
    for pos in (b["position_ids"].reshape(-1), b["position_ids"].tolist(), b["position_ids"][0].tolist()):
        out = shard_batch({**b, "position_ids": pos}, plan, 0)
        assert isinstance(out["position_ids"], torch.Tensor) and out["position_ids"].tolist() == want
        assert doc_lengths_from_batch({"input_ids": b["input_ids"], "position_ids": pos}).tolist() == [3, 1, 4]
    # 1-D rows: one row, its documents found from the position restarts
    ids = torch.zeros(7, dtype=torch.long)
    assert doc_lengths_from_batch({"input_ids": ids, "position_ids": torch.tensor([0, 1, 2, 0, 1, 2, 3])}).tolist() == [3, 4]
    assert doc_lengths_from_batch({"input_ids": [5] * 7, "position_ids": [0, 1, 0, 1, 2, 3, 4]}).tolist() == [2, 5]


def test_shard_batch_refuses_labels_of_another_shape_with_the_same_token_count():
    from atac_hf.attention import shard_batch
    from atac_hf.sharding import plan_shards

    b = _dist.make_batch([[3, 5], [6, 2]], seed=0)  # (2, 8)
    plan = plan_shards([3, 5, 6, 2], 1)
    for key in ("labels", "shift_labels"):
        with pytest.raises(ValueError, match=rf"'{key}' has shape \(1, 16\) \(16 tokens\) but input_ids has shape "
                                             r"\(2, 8\) \(16 tokens\)"):
            shard_batch({**b, key: b["labels"].reshape(1, 16)}, plan, 0)
    flat = shard_batch({**b, "labels": b["labels"].reshape(-1)}, plan, 0)  # 1-D with one label per token: taken
    assert torch.equal(flat["labels"][0], b["labels"].reshape(-1))

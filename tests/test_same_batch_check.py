"""Red-team 18: CP ranks holding different batches are refused on every batch, not only in debug mode.

A streaming dataset shuffled without a seed (``IterableDataset.shuffle(buffer_size=...)``) draws another
order in each process: the CP ranks of one replica packed different streams and trained silently on
mismatched shards (same lengths), or waited on each other's collectives forever (other lengths).
``BatchSharder`` now compares the plan digest and a cheap checksum of the rows over the CP group (one
32-byte all-gather) on every batch. Thread ranks over a fake ``torch.distributed`` (as the shard twins)."""

from __future__ import annotations

import torch

from atac_hf.attention.batch_check import check_same_batch, light_batch_digest
from atac_hf.sharding import plan_shards
from test_mutants_shard_twins import GROUP, _batch, _ok, world  # noqa: F401  (world: the fixture)


def test_light_digest_tells_rows_apart_and_matches_equal_ones():
    a = _batch([[5, 6, 7, 8]], [[4]], labels=[[-100, 6, 7, 8]])
    same = {k: v.clone() for k, v in a.items()}
    swapped = _batch([[6, 5, 7, 8]], [[4]], labels=[[-100, 6, 7, 8]])  # the same multiset of ids, reordered
    relabelled = _batch([[5, 6, 7, 8]], [[4]], labels=[[-100, -100, 7, 8]])
    assert light_batch_digest(a) == light_batch_digest(same)
    assert len({light_batch_digest(b) for b in (a, swapped, relabelled)}) == 3
    assert light_batch_digest({}) == "0" * 16 and len(light_batch_digest(a)) == 16
    big = {"input_ids": torch.full((1, 8), 2**62)}  # int64 products wrap: a checksum, never an error
    assert len(light_batch_digest(big)) == 16


def test_check_same_batch_refuses_other_rows_and_other_plans_on_every_rank(world):
    b = _batch([[5, 6, 7, 8]], [[4]])
    other = _batch([[5, 6, 7, 9]], [[4]])
    plan = plan_shards([4], 2)
    w = world(2)
    assert _ok(w.run(lambda r: check_same_batch(plan, b, GROUP))) == [None, None] and w.gathers == 2
    got = world(2).run(lambda r: check_same_batch(plan, (b, other)[r], GROUP))
    for e in got:
        assert isinstance(e, RuntimeError), got
        text = str(e)
        assert text.startswith("the CP ranks hold different batches with the same document lengths"), text
        assert text.endswith("(Checked on every batch.) A common cause: data shuffled differently in each process, "
                             "e.g. a datasets IterableDataset.shuffle() without a seed: pass shuffle(seed=...)"), text
    two = _batch([[5, 6, 7, 8]], [[2, 2]])
    got = world(2).run(lambda r: check_same_batch((plan, plan_shards([2, 2], 2))[r], (b, two)[r], GROUP))
    assert all(isinstance(e, RuntimeError) and str(e).startswith("the CP ranks hold different shard plans")
               and "shuffle(seed=...)" in str(e) for e in got), got


def test_check_same_batch_passes_a_failed_peer_through(world):
    got = world(2, fail=True).run(lambda r: check_same_batch(plan_shards([4], 2), _batch([[1, 2, 3, 4]], [[4]]), GROUP))
    assert all(isinstance(e, RuntimeError) and "shuffle(seed" not in str(e) for e in got), got
    assert all(str(e).startswith(f"atac_cp: the batch check (every batch) over the CP group failed on rank {r} of 2: "
                                 "another CP rank crashed") for r, e in enumerate(got)), got

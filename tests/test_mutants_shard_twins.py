"""In-process twins of ``atac_hf/attention/shard.py``'s multi-process paths (issue 20).

mutmut traces only in-process tests, and ``check_plan_digest``, ``batch_digest``, ``unshard``,
``_check_group``, the empty-rank refusal and the debug digest of ``shard_batch`` ran only inside
gloo process groups (slow tests), so mutmut could not judge them. Here they run in one process:
a fake ``torch.distributed`` (``FakeWorld``) stands in for a process group of ``size`` ranks, each
rank a thread, with an ``all_gather_single`` that checks its buffers as the real collective does
(same dtype and device, output ``size`` times the input) and exchanges them through a barrier
(with a timeout: a collective that a rank skips breaks it after 30 s instead of hanging).
``ShardContext``'s attention records and ``shard_batch``'s refusals are checked here too, every
message whole (a changed word, index or slice in a message is caught).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import atac_hf.attention.collectives as collectives_mod
import atac_hf.attention.compat as compat_mod
import atac_hf.attention.shard as shard_mod
from atac_hf.attention import ShardContext, shard_batch, unshard
from atac_hf.attention.shard import batch_digest, check_plan_digest
from atac_hf.sharding import plan_shards

GROUP = object()  # the CP group handle the tests pass; FakeWorld refuses any other


class FakeWorld:
    """The parts of ``torch.distributed`` shard.py uses, for a world of ``size`` thread ranks."""

    def __init__(self, size: int, *, initialized: bool = True, available: bool = True, fail: bool = False):
        self.size = size
        self.initialized, self.available, self.fail = initialized, available, fail
        self.barrier = threading.Barrier(size, timeout=30)
        self.slots: dict = {}  # (the rank's n-th collective, rank) -> its input
        self.lock = threading.Lock()
        self.tls = threading.local()
        self.gathers = 0

    # ---- torch.distributed
    def _group(self, group):
        assert group is GROUP, f"the collective was called with group={group!r}, not the CP group"

    def is_available(self):
        return self.available

    def is_initialized(self):
        return self.initialized

    def get_world_size(self, group=None):
        self._group(group)
        return self.size

    def get_rank(self, group=None):
        self._group(group)
        return getattr(self.tls, "rank", 0)

    def get_backend(self, group=None):
        self._group(group)
        return "gloo"

    def all_gather_single(self, out, inp, group=None, async_op=False):
        self._group(group)
        if self.fail:
            raise RuntimeError("Connection closed by peer")
        if out.dtype != inp.dtype or out.device != inp.device:
            raise RuntimeError(f"all_gather: dtype/device mismatch {out.dtype} {inp.dtype}")
        if out.numel() != self.size * inp.numel() or not out.is_contiguous():
            raise RuntimeError(f"all_gather: output of {out.numel()} for {self.size} x {inp.numel()}")
        r = self.get_rank(group)
        call = self.tls.calls = getattr(self.tls, "calls", 0) + 1
        self.slots[(call, r)] = inp.detach().clone().reshape(-1)
        self.barrier.wait()
        out.view(-1).copy_(torch.cat([self.slots[(call, q)] for q in range(self.size)]))
        with self.lock:
            self.gathers += 1

    # ---- running every rank
    def run(self, fn):
        """``fn(rank)`` on every rank, each in its own thread; the results, or the exceptions, by rank."""
        results: list = [None] * self.size

        def body(r):
            self.tls.rank = r
            try:
                results[r] = fn(r)
            except BaseException as e:  # noqa: BLE001 - handed back to the test
                results[r] = e

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a rank is stuck"
        return results


@pytest.fixture
def world(monkeypatch):
    def make(size: int, **kw) -> FakeWorld:
        w = FakeWorld(size, **kw)
        monkeypatch.setattr(shard_mod, "dist", w)
        monkeypatch.setattr(collectives_mod, "dist", w)
        monkeypatch.setattr(compat_mod, "all_gather_single", w.all_gather_single)
        return w

    return make


def _ok(results):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def _batch(ids: list[list[int]], lengths: list[list[int]], labels=None) -> dict:
    pos = [[i for n in row for i in range(n)] for row in lengths]
    b = {"input_ids": torch.tensor(ids), "position_ids": torch.tensor(pos)}
    if labels is not None:
        b["labels"] = torch.tensor(labels)
    return b


# ---------------------------------------------------------------------------- ShardContext
def _ctx(**kw) -> ShardContext:
    base = dict(plan=SimpleNamespace(cp_size=1, gathered_docs=np.array([], dtype=np.int64)), rank=0,
                layout=SimpleNamespace(rank=0))
    return ShardContext(**{**base, **kw})


def test_shard_context_refusals_whole_messages():
    with pytest.raises(ValueError) as e:
        _ctx(backend="triton")
    assert str(e.value) == ("unknown attention backend 'triton'; legal values: ['auto', 'flash', 'flex', 'sdpa', "
                            "'varlen', 'varlen_reference'] (set backend=)")
    with pytest.raises(ValueError) as e:
        _ctx(rank=0, layout=SimpleNamespace(rank=1))
    assert str(e.value) == "layout is for rank 1, context for rank 0"
    for b in ("sdpa", "flash", "flex", "varlen", "varlen_reference", "auto"):
        assert _ctx(backend=b).backend == b


def test_shard_context_defaults_and_fields():
    c = _ctx()
    assert c.group is None and c.backend == "sdpa" and c.debug is False and c.cache == {}
    assert _ctx().cache is not c.cache  # one cache per context
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.rank = 1


def test_shard_context_records_each_attention_module_once_per_forward():
    c = _ctx()
    assert c.reached_modules() == []
    a, b = torch.nn.Identity(), torch.nn.Identity()
    assert c.record_attention(a) is None
    c.record_attention(b)
    c.record_attention(a)  # a re-run under checkpointing counts once
    got = c.reached_modules()
    assert isinstance(got, list) and len(got) == 2 and got[0] is a and got[1] is b
    got.append("x")  # a copy: the records are not changed through it
    assert len(c.reached_modules()) == 2
    assert c.begin_forward() is None
    assert c.reached_modules() == []
    c.record_attention(b)
    assert len(c.reached_modules()) == 1 and c.reached_modules()[0] is b
    # records are per context
    assert _ctx().reached_modules() == []


def test_needs_gather_only_with_gathered_documents_at_cp_size_2_or_more():
    one = np.array([0], dtype=np.int64)
    none = np.array([], dtype=np.int64)
    assert _ctx(plan=SimpleNamespace(cp_size=2, gathered_docs=one)).needs_gather is True
    assert _ctx(plan=SimpleNamespace(cp_size=2, gathered_docs=none)).needs_gather is False
    assert _ctx(plan=SimpleNamespace(cp_size=1, gathered_docs=one)).needs_gather is False
    assert _ctx(plan=SimpleNamespace(cp_size=3, gathered_docs=np.array([0, 2]))).needs_gather is True


# ---------------------------------------------------------------------------- shard_batch's refusals
def test_shard_batch_type_refusals_whole_messages():
    b = _batch([[5, 6, 7]], [[3]])
    plan = plan_shards([3], 1)
    with pytest.raises(TypeError) as e:
        shard_batch(b, [3], 0)
    assert str(e.value) == ("plan must be a ShardPlan (from plan_shards(doc_lengths_from_batch(batch), cp_size)), "
                            "got list")
    with pytest.raises(TypeError) as e:
        shard_batch([b], plan, 0)
    assert str(e.value) == ("batch must be a mapping of tensors (input_ids, labels, position_ids, ...), got list")
    with pytest.raises(TypeError) as e:
        shard_batch({**b, "labels": [[1, 2, 3]]}, plan, 0)
    assert str(e.value) == "'labels' must be a tensor like input_ids, got list"
    with pytest.raises(TypeError) as e:
        shard_batch({**b, "shift_labels": np.zeros((1, 3))}, plan, 0)
    assert str(e.value) == "'shift_labels' must be a tensor like input_ids, got ndarray"


def test_shard_batch_rank_refusals_whole_messages():
    b = _batch([[5, 6, 7]], [[3]])
    plan = plan_shards([3], 1)
    for rank, shown in ((1, "1"), (-1, "-1"), (True, "True"), (False, "False"), (0.0, "0.0"), ("0", "'0'"),
                        (None, "None")):
        with pytest.raises(ValueError) as e:
            shard_batch(b, plan, rank)
        assert str(e.value) == f"rank {shown} is outside the CP group of size 1 (legal: 0..0)"
    out = shard_batch(b, plan, np.int64(0))  # numpy ints are ranks
    assert type(out["atac_shard"].rank) is int and out["atac_shard"].rank == 0


def test_shard_batch_input_refusals_whole_messages():
    b = _batch([[5, 6, 7, 8]], [[3, 1]])
    plan = plan_shards([3, 1], 1)
    with pytest.raises(ValueError) as e:
        shard_batch({"position_ids": b["position_ids"]}, plan, 0)
    assert str(e.value) == "the batch needs 'input_ids' (B, S)"
    with pytest.raises(ValueError) as e:
        shard_batch({**b, "input_ids": [[5, 6, 7, 8]]}, plan, 0)
    assert str(e.value) == "'input_ids' must be a (B, S) tensor, got list of shape ()"
    with pytest.raises(ValueError) as e:
        shard_batch({**b, "input_ids": torch.zeros(1, 1, 4, dtype=torch.long)}, plan, 0)
    assert str(e.value) == "'input_ids' must be a (B, S) tensor, got Tensor of shape (1, 1, 4)"
    with pytest.raises(ValueError) as e:
        shard_batch(b, plan_shards([3, 2], 1), 0)
    assert str(e.value) == ("the plan covers 5 tokens but the batch has 1 x 4 = 4: build the plan from "
                            "doc_lengths_from_batch(batch)")
    with pytest.raises(ValueError) as e:
        shard_batch(b, plan_shards([2, 2], 1), 0)
    assert str(e.value) == ("the batch's document lengths [3, 1] differ from the plan's [2, 2]: build the plan "
                            "from doc_lengths_from_batch(batch)")
    with pytest.raises(ValueError) as e:
        shard_batch({**b, "labels": torch.zeros(1, 5, dtype=torch.long)}, plan, 0)
    assert str(e.value) == ("'labels' has shape (1, 5) (5 tokens) but input_ids has shape (1, 4) (4 tokens): "
                            "labels must have one entry per input token")
    with pytest.raises(ValueError) as e:
        shard_batch({**b, "shift_labels": torch.zeros(4, 1, dtype=torch.long)}, plan, 0)
    assert str(e.value) == ("'shift_labels' has shape (4, 1) (4 tokens) but input_ids has shape (1, 4) (4 tokens): "
                            "shift_labels must have one entry per input token")
    with pytest.raises(ValueError) as e:
        shard_batch({**b, "attention_mask": torch.tensor([[1, 1, 1, 0]])}, plan, 0)
    assert str(e.value) == ("attention_mask has padding (zeros): packed rows must not rely on it; make padding its "
                            "own document (labels -100) or drop it")
    # an all-ones mask (a list too) is dropped
    for m in (torch.ones(1, 4, dtype=torch.long), [[1, 1, 1, 1]], torch.ones(1, 4, dtype=torch.bool)):
        assert "attention_mask" not in shard_batch({**b, "attention_mask": m}, plan, 0)
    # labels with one entry per token in another dimension count: a (4,) or (1, 1, 4) is taken as the row
    for lab in (torch.tensor([1, 2, 3, 4]), torch.tensor([[[1, 2, 3, 4]]])):
        assert shard_batch({**b, "labels": lab}, plan, 0)["labels"].tolist() == [[1, 2, 3, 4]]


def test_shard_batch_lengths_message_shortens_beyond_12_documents():
    ids = [[1] * 13]
    twelve = _batch([[1] * 12], [[1] * 12])
    with pytest.raises(ValueError) as e:
        shard_batch(twelve, plan_shards([2] * 6, 1), 0)
    assert str(e.value) == ("the batch's document lengths [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] differ from the "
                            "plan's [2, 2, 2, 2, 2, 2]: build the plan from doc_lengths_from_batch(batch)")
    thirteen = _batch(ids, [[1] * 13])
    with pytest.raises(ValueError) as e:
        shard_batch(thirteen, plan_shards([1] * 11 + [2], 1), 0)
    assert str(e.value) == ("the batch's document lengths [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]... (13 documents) "
                            "differ from the plan's [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]: build the plan from "
                            "doc_lengths_from_batch(batch)")


def test_shard_batch_cp1_output_keys_and_values():
    b = _batch([[5, 6, 7, 8], [9, 10, 11, 12]], [[3, 1], [4]], labels=[[-100, 6, 7, -100], [-100, 10, 11, 12]])
    b.update(num_items_in_batch=torch.tensor(77), extra=torch.tensor([1, 2]), seq_lengths=[[3, 1], [4]],
             cu_seqlens=torch.tensor([0, 3, 4, 8]), max_seqlen=4)
    plan = plan_shards([3, 1, 4], 1)
    out = shard_batch(b, plan, 0, group=None, backend="flex", debug=True)
    assert sorted(out) == ["atac_shard", "extra", "input_ids", "labels", "num_items_in_batch", "position_ids",
                           "shift_labels", "use_cache"]
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert out["labels"].tolist() == [[-100, 6, 7, -100, -100, 10, 11, 12]]
    assert out["shift_labels"].tolist() == [[6, 7, -100, -100, 10, 11, 12, -100]]
    assert out["num_items_in_batch"] is b["num_items_in_batch"]
    assert out["extra"] is b["extra"] and out["use_cache"] is False
    ctx = out["atac_shard"]
    assert (ctx.plan, ctx.rank, ctx.group, ctx.backend, ctx.debug) == (plan, 0, None, "flex", True)
    assert ctx.layout.rank == 0 and ctx.layout.n_local == 8
    # counted when not given: every label but the -100 ones
    b2 = {k: v for k, v in b.items() if k != "num_items_in_batch"}
    n = shard_batch(b2, plan, 0)["num_items_in_batch"]
    assert type(n) is int and n == 5


# ---------------------------------------------------------------------------- _check_group
def test_check_group_refusals_whole_messages(world):
    b = _batch([[5, 6, 7, 8]], [[4]])
    plan = plan_shards([4], 2)
    msg = ("cp_size=2 needs an initialized torch.distributed process group (init_process_group) and the CP "
           "group as group=")
    for kw in ({"initialized": False}, {"available": False}, {"initialized": False, "available": False}):
        world(2, **kw)
        with pytest.raises(ValueError) as e:
            shard_batch(b, plan, 0, GROUP)
        assert str(e.value) == msg
    world(2)
    with pytest.raises(ValueError) as e:
        shard_batch(b, plan_shards([4], 4), 0, GROUP)
    assert str(e.value) == ("the process group has 2 ranks but the plan is for cp_size=4: pass the CP group as "
                            "group= (or plan with cp_size equal to its size)")
    with pytest.raises(ValueError) as e:
        shard_batch(b, plan, 1, GROUP)  # this thread is rank 0
    assert str(e.value) == "rank=1 but this process is rank 0 of the CP group: pass rank=dist.get_rank(group)"
    # a cp_size-1 plan never looks at the process group
    world(2, initialized=False)
    assert shard_batch(b, plan_shards([4], 1), 0, GROUP)["input_ids"].tolist() == [[5, 6, 7, 8]]


def test_shard_batch_refuses_a_plan_with_empty_ranks_on_every_rank(world):
    b = _batch([[42]], [[1]])
    w = world(2)
    got = w.run(lambda r: shard_batch(b, plan_shards([1], 2), r, GROUP))
    for e in got:
        assert isinstance(e, ValueError)
    rest = ("transformers models cannot run on 0 tokens; plan_shards gives every rank a token when the pack has "
            ">= cp_size tokens: pack more tokens (drop samples shorter than cp_size) or lower cp_size")
    assert [str(e) for e in got] == [
        "the plan leaves rank(s) [1] without tokens (1 tokens over cp_size=2, strategy 'atp'): " + rest,
        "the plan leaves rank(s) [1] without tokens (1 tokens over cp_size=2, strategy 'atp'): " + rest]
    w = world(10)
    plan = plan_shards([1], 10, strategy="contiguous")
    assert plan.rank_num_tokens().tolist() == [0] * 9 + [1]
    with pytest.raises(ValueError) as e:
        shard_batch(b, plan, 0, GROUP)  # nine empty ranks: the first eight named
    assert str(e.value) == ("the plan leaves rank(s) [0, 1, 2, 3, 4, 5, 6, 7] without tokens (1 tokens over "
                            "cp_size=10, strategy 'contiguous'): " + rest)
    # every rank holding a token passes
    w = world(2)
    b2 = _batch([[42, 43]], [[2]])
    outs = _ok(w.run(lambda r: shard_batch(b2, plan_shards([2], 2), r, GROUP)))
    assert sorted(o["input_ids"].item() for o in outs) == [42, 43]


# ---------------------------------------------------------------------------- shard_batch at cp_size 2 and 3
def test_shard_batch_at_two_ranks_contents(world):
    b = _batch([[5, 6, 7, 8], [9, 10, 11, 12]], [[3, 1], [4]], labels=[[-100, 6, 7, -100], [-100, 10, 11, 12]])
    b["inputs_embeds"] = torch.arange(16, dtype=torch.float32).view(2, 4, 2)
    plan = plan_shards([3, 1, 4], 2, strategy="contiguous")
    assert [plan.rank_token_indices(r).tolist() for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    w = world(2)
    outs = _ok(w.run(lambda r: shard_batch(b, plan, r, GROUP, debug=True)))
    assert w.gathers == 2  # the debug digest: one collective a rank
    o0, o1 = outs
    assert o0["input_ids"].tolist() == [[5, 6, 7, 8]] and o1["input_ids"].tolist() == [[9, 10, 11, 12]]
    assert o0["position_ids"].tolist() == [[0, 1, 2, 0]] and o1["position_ids"].tolist() == [[0, 1, 2, 3]]
    assert o0["shift_labels"].tolist() == [[6, 7, -100, -100]] and o1["shift_labels"].tolist() == [[10, 11, 12, -100]]
    assert o0["labels"].tolist() == [[-100, 6, 7, -100]] and o1["labels"].tolist() == [[-100, 10, 11, 12]]
    assert o0["num_items_in_batch"] == 5 and o1["num_items_in_batch"] == 5  # the global count on every rank
    assert o0["inputs_embeds"].tolist() == [[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]]
    assert o1["inputs_embeds"].tolist() == [[[8.0, 9.0], [10.0, 11.0], [12.0, 13.0], [14.0, 15.0]]]
    for r, o in enumerate(outs):
        c = o["atac_shard"]
        assert (c.rank, c.group, c.debug, c.layout.rank, c.needs_gather) == (r, GROUP, True, r, True)
    # without position_ids: built per document from the lengths, then taken
    nopos = {"input_ids": b["input_ids"], "seq_lengths": [[3, 1], [4]]}
    outs = _ok(w.run(lambda r: shard_batch(nopos, plan, r, GROUP)))
    assert [o["position_ids"].tolist() for o in outs] == [[[0, 1, 2, 0]], [[0, 1, 2, 3]]]
    assert "labels" not in outs[0] and "num_items_in_batch" not in outs[0]


def test_shard_batch_zigzag_positions_without_position_ids(world):
    b = {"input_ids": torch.tensor([[10, 11, 12, 13, 14, 15]]), "seq_lengths": [[6]]}
    plan = plan_shards([6], 3, strategy="contiguous")
    w = world(3)
    outs = _ok(w.run(lambda r: shard_batch(b, plan, r, GROUP)))
    assert [o["input_ids"].tolist() for o in outs] == [[[10, 11]], [[12, 13]], [[14, 15]]]
    assert [o["position_ids"].tolist() for o in outs] == [[[0, 1]], [[2, 3]], [[4, 5]]]
    z = plan_shards([4, 2], 2, strategy="zigzag")
    idx = [z.rank_token_indices(r).tolist() for r in (0, 1)]
    bz = {"input_ids": torch.tensor([[10, 11, 12, 13, 14, 15]]), "seq_lengths": [[4, 2]]}
    outs = _ok(world(2).run(lambda r: shard_batch(bz, z, r, GROUP)))
    pos = [0, 1, 2, 3, 0, 1]
    for r in (0, 1):
        assert outs[r]["input_ids"].tolist() == [[10 + i for i in idx[r]]]
        assert outs[r]["position_ids"].tolist() == [[pos[i] for i in idx[r]]]


@pytest.mark.usefixtures("no_contiguous_candidate")
def test_debug_refuses_different_plans_and_batches_on_every_rank(world):
    b = _batch([[5, 6, 7, 8]], [[4]])
    p_atp, p_contig = plan_shards([4], 2), plan_shards([4], 2, strategy="contiguous")
    assert p_atp.digest != p_contig.digest
    w = world(2)
    got = w.run(lambda r: shard_batch(b, (p_atp, p_contig)[r], r, GROUP, debug=True))
    msg = (f"the CP ranks hold different shard plans (rank 0: {p_atp.digest}, rank 1: {p_contig.digest}); every "
           "rank must plan the same pack with the same strategy, cost model and options")
    assert [type(e) for e in got] == [RuntimeError, RuntimeError] and [str(e) for e in got] == [msg, msg]
    # same plan, another batch with the same lengths
    other = _batch([[5, 6, 7, 9]], [[4]])
    d0, d1 = batch_digest(b), batch_digest(other)
    got = world(2).run(lambda r: shard_batch((b, other)[r], p_atp, r, GROUP, debug=True))
    msg = (f"the CP ranks hold different batches with the same document lengths (batch digests rank 0: {d0}, "
           f"rank 1: {d1}); every rank of a CP group must get the same full batch: check the DataLoader sharding "
           "(the CP and TP ranks of one DP replica share its batches) and the seeds")
    assert [type(e) for e in got] == [RuntimeError, RuntimeError] and [str(e) for e in got] == [msg, msg]
    # without debug: no collective, the mismatch is not looked for
    w = world(2)
    _ok(w.run(lambda r: shard_batch((b, other)[r], p_atp, r, GROUP)))
    assert w.gathers == 0


# ---------------------------------------------------------------------------- check_plan_digest
def _stub(digest: str):
    return SimpleNamespace(digest=digest)


def test_check_plan_digest_pads_and_cuts_to_16_characters(world):
    w = world(3)
    # equal: no error, one collective per rank
    assert _ok(w.run(lambda r: check_plan_digest(_stub("abc"), GROUP, content="xy"))) == [None] * 3
    assert w.gathers == 3
    # short digests are padded with '-', long ones cut at 16 characters
    got = world(3).run(lambda r: check_plan_digest(_stub(("abc", "abcd", "0123456789abcdefZZ")[r]), GROUP))
    msg = ("the CP ranks hold different shard plans (rank 0: abc-------------, rank 1: abcd------------, rank 2: "
           "0123456789abcdef); every rank must plan the same pack with the same strategy, cost model and options")
    assert [str(e) for e in got] == [msg] * 3 and all(isinstance(e, RuntimeError) for e in got)
    # past the 16th character digests and contents are not compared
    _ok(world(2).run(lambda r: check_plan_digest(_stub("0123456789abcdef" + "XY"[r]), GROUP,
                                                 content="fedcba9876543210" + "XY"[r])))
    got = world(2).run(lambda r: check_plan_digest(_stub("same"), GROUP, content=("ab", None)[r]))
    msg = ("the CP ranks hold different batches with the same document lengths (batch digests rank 0: "
           "ab--------------, rank 1: ----------------); every rank of a CP group must get the same full batch: "
           "check the DataLoader sharding (the CP and TP ranks of one DP replica share its batches) and the seeds")
    assert [str(e) for e in got] == [msg] * 2
    # the plan digest is checked first
    got = world(2).run(lambda r: check_plan_digest(_stub("p" + str(r)), GROUP, content="c" + str(r)))
    assert str(got[0]).startswith("the CP ranks hold different shard plans (rank 0: p0--------------, rank 1: "
                                  "p1--------------);")
    # the group's kind named (the TP group of a CP rank: red-team 35)
    got = world(2).run(lambda r: check_plan_digest(_stub("same"), GROUP, content=("ab", None)[r], ranks="TP"))
    assert str(got[0]).startswith("the TP ranks hold different batches with the same document lengths (batch "
                                  "digests rank 0: ab--------------, rank 1: ----------------); every rank of a TP "
                                  "group must get the same full batch"), str(got[0])
    # an empty string pads like None; a '-' padded content equals its short form
    _ok(world(2).run(lambda r: check_plan_digest(_stub("d"), GROUP, content=("", None)[r])))
    _ok(world(2).run(lambda r: check_plan_digest(_stub("d-"), GROUP, content=("ab", "ab--")[r])))


def test_check_plan_digest_one_rank_and_a_failed_peer(world):
    assert _ok(world(1).run(lambda r: check_plan_digest(_stub("x"), GROUP, content="y"))) == [None]
    got = world(2, fail=True).run(lambda r: check_plan_digest(_stub("x"), GROUP))
    for r, e in enumerate(got):
        assert isinstance(e, RuntimeError) and isinstance(e.__cause__, RuntimeError)
        assert str(e.__cause__) == "Connection closed by peer"
        assert str(e) == (
            f"atac_cp: the plan digest check (debug) over the CP group failed on rank {r} of 2: another CP rank "
            "crashed, raised or is stuck (look for the first error in the other ranks' logs), and the process "
            "group's timeout ran out or its connection closed. The timeout is the process group's: "
            "init_process_group(timeout=) / new_group(timeout=), TrainingArguments(ddp_timeout=), accelerate "
            "InitProcessGroupKwargs(timeout=). Cause: Connection closed by peer")


# ---------------------------------------------------------------------------- batch_digest
def _reference_digest(batch: dict) -> str:
    """The documented format spelled out: per key, ``key:-`` if absent, else ``key:size:`` and int64 bytes."""
    h = hashlib.sha1()
    for key in ("input_ids", "labels", "shift_labels", "position_ids"):
        if batch.get(key) is None:
            h.update(key.encode() + b":-")
        else:
            v = batch[key]
            a = np.array(v.tolist() if isinstance(v, torch.Tensor) else v, dtype=np.int64).ravel()
            h.update(key.encode() + b":" + str(a.size).encode() + b":" + a.tobytes())
    return h.hexdigest()[:16]


def test_batch_digest_by_hand():
    assert batch_digest({}) == _reference_digest({})
    assert batch_digest({}) == hashlib.sha1(b"input_ids:-labels:-shift_labels:-position_ids:-").hexdigest()[:16]
    b = {"input_ids": torch.tensor([[1, 2], [3, 4]]), "labels": [[-100, 2], [3, -100]]}
    want = hashlib.sha1(b"input_ids:4:" + np.array([1, 2, 3, 4], dtype=np.int64).tobytes() + b"labels:4:"
                        + np.array([-100, 2, 3, -100], dtype=np.int64).tobytes()
                        + b"shift_labels:-position_ids:-").hexdigest()[:16]
    assert batch_digest(b) == want == _reference_digest(b)
    d = batch_digest(b)
    assert isinstance(d, str) and len(d) == 16


def test_batch_digest_reads_the_four_keys_in_any_form():
    ids = torch.tensor([[1, 2, 3, 4]])
    base = {"input_ids": ids, "labels": ids.clone(), "shift_labels": ids.clone(), "position_ids": ids.clone()}
    d = batch_digest(base)
    assert d == _reference_digest(base)
    # the same values as int32 tensors, lists, numpy, other shapes of the same row order: the same digest
    assert batch_digest({k: v.int() for k, v in base.items()}) == d
    assert batch_digest({k: v.tolist() for k, v in base.items()}) == d
    assert batch_digest({k: v.numpy().reshape(2, 2) for k, v in base.items()}) == d
    # any of the four keys changed, dropped or None: another digest; other keys ignored
    for key in base:
        changed = {**base, key: torch.tensor([[1, 2, 3, 5]])}
        assert batch_digest(changed) != d and batch_digest(changed) == _reference_digest(changed)
        assert batch_digest({k: v for k, v in base.items() if k != key}) != d
        assert batch_digest({**base, key: None}) == batch_digest({k: v for k, v in base.items() if k != key})
    assert batch_digest({**base, "attention_mask": torch.zeros(1, 4)}) == d
    # a missing key before a present one still lets the later keys count
    nolab = {"input_ids": ids, "shift_labels": ids}
    assert batch_digest(nolab) != batch_digest({"input_ids": ids, "shift_labels": ids + 1})
    assert batch_digest(nolab) == _reference_digest(nolab)
    # values moved between keys, or split differently, differ
    assert batch_digest({"input_ids": ids}) != batch_digest({"labels": ids})
    assert batch_digest({"input_ids": [1, 2], "labels": [3]}) != batch_digest({"input_ids": [1], "labels": [2, 3]})
    # a non-contiguous view hashes its values
    t = torch.tensor([[1, 3], [2, 4]]).t()
    assert batch_digest({"input_ids": t}) == batch_digest({"input_ids": torch.tensor([[1, 2], [3, 4]])})
    g = torch.tensor([[1.0, 2.0]], requires_grad=True)  # tensors that need grad are read detached
    assert batch_digest({"input_ids": g}) == batch_digest({"input_ids": [[1, 2]]})


# ---------------------------------------------------------------------------- unshard
def test_unshard_one_rank_returns_a_copy():
    plan = plan_shards([3], 1)
    local = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], requires_grad=True)
    out = unshard(local, plan, 0)
    assert out.tolist() == local.tolist() and out.shape == (1, 3, 2)
    assert not out.requires_grad and out.data_ptr() != local.data_ptr()
    out[0, 0, 0] = 9.0
    assert local[0, 0, 0].item() == 1.0


def test_unshard_gathers_every_rank_back_in_row_order(world):
    lengths = [5, 2, 1]
    plan = plan_shards(lengths, 3, strategy="zigzag")
    idx = [plan.rank_token_indices(r).tolist() for r in range(3)]
    counts = plan.rank_num_tokens().tolist()
    assert sorted(sum(idx, [])) == list(range(8)) and len(set(counts)) > 1  # ranks of unequal size
    full = torch.tensor([10, 11, 12, 13, 14, 15, 16, 17])
    w = world(3)
    outs = _ok(w.run(lambda r: unshard(full[idx[r]].unsqueeze(0), plan, r, GROUP)))
    assert w.gathers == 3
    for o in outs:
        assert o.dtype == torch.int64 and o.shape == (1, 8) and o.tolist() == [[10, 11, 12, 13, 14, 15, 16, 17]]
    # trailing dimensions and float dtypes; a tensor that needs grad comes back detached
    feat = torch.arange(16, dtype=torch.float16).view(8, 2)
    outs = _ok(world(3).run(lambda r: unshard(feat[idx[r]].unsqueeze(0).requires_grad_(False), plan, r, GROUP)))
    for o in outs:
        assert o.dtype == torch.float16 and o.shape == (1, 8, 2) and torch.equal(o[0], feat)
    g = torch.arange(8, dtype=torch.float32)
    outs = _ok(world(3).run(lambda r: unshard(g[idx[r]].unsqueeze(0).clone().requires_grad_(True), plan, r,
                                              GROUP)))
    for o in outs:
        assert not o.requires_grad and o.tolist() == [list(map(float, range(8)))]


def test_unshard_with_contiguous_ranks_of_unequal_size(world):
    plan = plan_shards([3, 2], 2, strategy="per_doc")
    idx = [plan.rank_token_indices(r).tolist() for r in range(2)]
    full = torch.tensor([[1, -1], [2, -2], [3, -3], [4, -4], [5, -5]], dtype=torch.int32)
    outs = _ok(world(2).run(lambda r: unshard(full[idx[r]].unsqueeze(0), plan, r, GROUP)))
    for o in outs:
        assert o.dtype == torch.int32 and o.tolist() == [full.tolist()]


# ---------------------------------------------------------------------------- survivors of the run on these twins
def test_shard_batch_rank_equal_to_cp_size_is_refused_before_the_group_check(world):
    b = _batch([[5, 6, 7, 8]], [[4]])
    world(2)
    with pytest.raises(ValueError) as e:
        shard_batch(b, plan_shards([4], 2), 2, GROUP)
    assert str(e.value) == "rank 2 is outside the CP group of size 2 (legal: 0..1)"


def test_shard_batch_drops_num_items_without_labels():
    b = _batch([[5, 6, 7, 8]], [[3, 1]])
    out = shard_batch({**b, "num_items_in_batch": 9}, plan_shards([3, 1], 1), 0)
    assert sorted(out) == ["atac_shard", "input_ids", "position_ids", "use_cache"]


def test_shard_batch_keeps_the_given_positions_of_a_fragment():
    """A fragment of a split sample keeps its own positions (they need not start at 0): never rebuilt."""
    b = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "position_ids": torch.tensor([[4, 5, 6, 0]])}
    plan = plan_shards([3, 1], 1)
    assert shard_batch(b, plan, 0)["position_ids"].tolist() == [[4, 5, 6, 0]]
    assert shard_batch({**b, "seq_lengths": [[3, 1]]}, plan, 0)["position_ids"].tolist() == [[4, 5, 6, 0]]


def test_shard_batch_position_ids_of_two_rows_in_another_shape():
    b = _batch([[5, 6, 7, 8], [9, 10, 11, 12]], [[3, 1], [4]])
    plan = plan_shards([3, 1, 4], 1)
    out = shard_batch({**b, "position_ids": b["position_ids"].reshape(1, 2, 4)}, plan, 0)  # rows (B, S) inside
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    with pytest.raises(ValueError) as e:  # flat positions only for one row
        shard_batch({**b, "position_ids": b["position_ids"].reshape(-1)}, plan, 0)
    assert str(e.value) == "'position_ids' has shape (1, 8), expected (2, 4) like input_ids"


def test_rows_of_another_rank_are_refused_whole_message():
    from atac_hf.attention import doc_lengths_from_batch

    with pytest.raises(ValueError) as e:
        doc_lengths_from_batch({"input_ids": torch.zeros(1, 1, 4, dtype=torch.long), "seq_lengths": [[4]]})
    assert str(e.value) == "packed rows must be (B, S) tensors, got shape (1, 1, 4)"
    with pytest.raises(ValueError) as e:
        doc_lengths_from_batch({"input_ids": torch.zeros(1, 4, dtype=torch.long), "position_ids": 3})
    assert str(e.value) == "'position_ids' has shape (), expected (1, 4) like input_ids"


def test_position_ids_that_need_grad_are_read_detached():
    from atac_hf.attention import doc_lengths_from_batch

    pos = torch.tensor([[0.0, 1.0, 2.0, 0.0]], requires_grad=True)
    got = doc_lengths_from_batch({"input_ids": torch.zeros(1, 4, dtype=torch.long), "position_ids": pos})
    assert got.dtype == np.int64 and got.tolist() == [3, 1]


# Device placement without a GPU: tensors on the "meta" device (shapes, no data) stand in for CUDA ones.
# Whatever shard_batch and unshard build must be on the device of their input (a CPU tensor beside a
# CUDA one fails in the model); a CPU copy of a meta tensor fails ("Cannot copy out of meta tensor").
def test_rows_shape_of_a_tensor_is_read_without_numpy():
    from atac_hf.attention import doc_lengths_from_batch

    ids = torch.empty(1, 4, dtype=torch.long, device="meta")  # np.asarray of it fails, as of a CUDA tensor
    assert doc_lengths_from_batch({"input_ids": ids, "seq_lengths": [[3, 1]]}).tolist() == [3, 1]


def test_shard_batch_builds_its_tensors_on_the_device_of_input_ids():
    ids = torch.empty(2, 4, dtype=torch.long, device="meta")
    labels = torch.empty(2, 4, dtype=torch.long, device="meta")
    plan = plan_shards([3, 1, 4], 1)
    base = {"input_ids": ids, "seq_lengths": [[3, 1], [4]], "labels": labels, "num_items_in_batch": 5}
    for extra in ({}, {"position_ids": [[0, 1, 2, 0], [0, 1, 2, 3]]}):
        out = shard_batch({**base, **extra}, plan, 0)
        for k in ("input_ids", "position_ids", "labels", "shift_labels"):
            assert out[k].device.type == "meta" and out[k].shape == (1, 8), k
        assert out["position_ids"].dtype == torch.int64


def test_unshard_builds_its_buffers_on_the_device_of_the_input(world):
    plan = plan_shards([5, 2, 1], 3, strategy="zigzag")
    counts = plan.rank_num_tokens().tolist()
    outs = _ok(world(3).run(lambda r: unshard(torch.empty(1, counts[r], 2, device="meta"), plan, r, GROUP)))
    for o in outs:
        assert o.device.type == "meta" and o.shape == (1, 8, 2) and o.dtype == torch.float32

"""Forty-eighth mutation pass (docs/TESTING.md): ``packing/data/window_planner.py``,
``attention/cpu_kernels.py``, ``attention/collectives.py``, ``attention/relay.py``,
``packing/data/cache_files.py`` and ``integrations/config_files.py``, mutated for the first time.

What a user relies on and no test pinned before: the CPU kernels called directly against a
float64 explicit-score reference (GQA, the causal offset of a chunk, windows, soft-capping, sinks
and their gradients, low-precision inputs, sinks in another dtype); the K/V all-gather and its
backward over a 2-rank stand-in for ``torch.distributed`` (the group, the device, the failure
messages); the relay's context across nested modules and checkpointing; the planner's pack costs,
fingerprints and ``replica_order``; the config reader's boundaries and whole messages; the pack
cache files (nested directories, fingerprints, temporary file, foreign files).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

from atac_hf.attention import cpu_kernels as ck  # noqa: E402


# ------------------------------------------------------------------------------ cpu_kernels
def _naive(q, k, v, p0, lo, window, scale, softcap=None, sinks=None):
    """Explicit-score attention in float64: queries at positions [p0, p0 + Lq), keys at [lo, lo + Lk),
    head h reads key/value head h // (H // K)."""
    H, Lq, _ = q.shape
    K, Lk, _ = k.shape
    q, k, v = q.double(), k.double().repeat_interleave(H // K, 0), v.double().repeat_interleave(H // K, 0)
    s = q @ k.transpose(1, 2) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    p = torch.arange(p0, p0 + Lq)[:, None]
    j = torch.arange(lo, lo + Lk)[None, :]
    m = j <= p
    if window is not None:
        m &= j > p - window
    s = s.masked_fill(~m, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double()[:, None, None].expand(H, Lq, 1)], -1)
    pr = torch.softmax(s, -1)
    if sinks is not None:
        pr = pr[..., :-1]
    return pr @ v


def _leaves(H, K, Lq, Lk, D=8, seed=0, dtype=torch.float64, with_sinks=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(H, Lq, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    k, v = (torch.randn(K, Lk, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for _ in range(2))
    sinks = (2 * torch.randn(H, generator=g, dtype=torch.float64)).to(dtype).requires_grad_() if with_sinks else None
    gout = torch.randn(H, Lq, D, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, sinks, gout


def _grads(out, leaves, gout):
    live = [t for t in leaves if t is not None]
    return torch.autograd.grad(out, live, gout)


def _compare(got_fn, leaves, gout, want_fn, tol):
    got = got_fn()
    want = want_fn()
    assert got.dtype == leaves[0].dtype
    assert _dist.rel_err(got, want) <= tol
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), _grads(got, leaves, gout), _grads(want, leaves, gout.double())):
        assert a.dtype == b.dtype or a.dtype == leaves[0].dtype, name
        assert _dist.rel_err(a, b) <= tol, name


needs_flash = pytest.mark.skipif(not ck.prefix_merge_available("cpu"), reason="no CPU flash kernel")


@needs_flash
@pytest.mark.parametrize("H,K,with_sinks", [(4, 2, True), (4, 4, False), (6, 3, False), (2, 1, True)])
def test_the_prefix_chunk_kernel_equals_explicit_scores_with_its_gradients(H, K, with_sinks, one_thread):
    """A chunk's queries at the last Lq of n_pre + Lq keys: the unmasked prefix merged with the causal
    square, with and without sinks, with GQA; every gradient (the sinks' too)."""
    n_pre, Lq = 13, 9
    q, k, v, sinks, gout = _leaves(H, K, Lq, n_pre + Lq, seed=H + K, with_sinks=with_sinks)
    _compare(lambda: ck._prefix_chunk(q, k, v, n_pre, 0.37, sinks), (q, k, v, sinks), gout,
             lambda: _naive(q, k, v, n_pre, 0, None, 0.37, sinks=sinks), 1e-10)


@needs_flash
@pytest.mark.parametrize("H,K", [(4, 2), (3, 3)])
@pytest.mark.parametrize("masked", [False, True])
def test_the_sink_flash_kernel_equals_explicit_scores_with_its_gradients(H, K, masked, one_thread):
    """Plain causal (no mask, Lq == Lk) and an explicit bool mask (a chunk at positions [p0, p0 + Lq) over
    keys from lo, windowed): output, dq, dk, dv and the sinks' gradient."""
    if masked:
        p0, lo, Lq, window = 20, 6, 7, 9
        Lk = p0 + Lq - lo
        p = torch.arange(p0, p0 + Lq)[:, None]
        j = torch.arange(lo, lo + Lk)[None, :]
        mask = (j <= p) & (j > p - window)
    else:
        p0, lo, Lq, window, mask = 0, 0, 11, None, None
        Lk = Lq
    q, k, v, sinks, gout = _leaves(H, K, Lq, Lk, seed=7 * H + K)
    _compare(lambda: ck._sink_flash(q, k, v, mask, 0.41, sinks), (q, k, v, sinks), gout,
             lambda: _naive(q, k, v, p0, lo, window, 0.41, sinks=sinks), 1e-10)


@pytest.mark.parametrize("H,K", [(4, 2), (2, 2)])
@pytest.mark.parametrize("window,softcap,with_sinks", [(None, 1.5, False), (5, 2.0, True), (None, None, True),
                                                        (4, None, False)])
def test_the_explicit_score_block_equals_the_reference(H, K, window, softcap, with_sinks, one_thread):
    """``_math_block``: queries at [p0, p0 + Lq) over keys at [lo, lo + Lk), windowed, soft-capped,
    with sinks joining the softmax; forward and gradients."""
    p0, lo, Lq = 9, 3, 6
    Lk = p0 + Lq - lo
    q, k, v, sinks, gout = _leaves(H, K, Lq, Lk, seed=H + (window or 0), with_sinks=with_sinks)
    _compare(lambda: ck._math_block(q, k, v, p0, lo, window, 0.5, softcap, sinks), (q, k, v, sinks), gout,
             lambda: _naive(q, k, v, p0, lo, window, 0.5, softcap=softcap, sinks=sinks), 1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_explicit_score_block_computes_in_fp32_and_returns_the_inputs_dtype(dtype, one_thread):
    """Low-precision inputs: scores and softmax in fp32 at least (the error is the output's rounding,
    not the scores'), the result in the input dtype."""
    q, k, v, sinks, _ = _leaves(4, 2, 6, 10, D=16, seed=3, dtype=dtype)
    out = ck._math_block(q, k, v, 4, 0, None, 0.25, 30.0, sinks)
    want = _naive(q, k, v, 4, 0, None, 0.25, softcap=30.0, sinks=sinks)
    assert out.dtype == dtype
    assert _dist.rel_err(out, want) <= (2e-6 if dtype == torch.float32 else 8e-3)


# ------------------------------------------------------------------------------ window_planner
from atac_hf.cost import default_cost_model  # noqa: E402
from atac_hf.packing import PackingConfig  # noqa: E402
from atac_hf.packing.data.sampler import WFAPBatchSampler  # noqa: E402
from atac_hf.packing.data.window_planner import WindowPlanner, plan_packs, replica_order  # noqa: E402


def test_a_packs_cost_is_its_documents_cost_also_for_fragments_that_start_late():
    """``pack_cost`` (what the end's re-cut compares) agrees with the vectorised ``pack_costs`` and with
    the cost model on the spans' lengths, for fragments that start inside their sample."""
    planner = WindowPlanner(PackingConfig(max_tokens=64, packs_per_window=2), None, window_size=None,
                            num_replicas=2, even_batches=True)
    pack = [(0, 40, 64), (3, 0, 9), (7, 100, 131)]
    want = float(default_cost_model().doc_cost([24, 9, 31]).sum())
    assert planner.pack_cost(pack) == pytest.approx(want, rel=1e-12)
    assert planner.pack_costs([pack, pack[:1]]) == pytest.approx([want, planner.pack_cost(pack[:1])], rel=1e-12)


def test_the_sampler_fingerprint_tells_apart_long_datasets_that_differ_in_one_middle_sample():
    """The fingerprint covers every length (not an abbreviated print of the array): a state saved over one
    dataset is refused by a sampler over another that differs only in its 1500th sample."""
    cfg = PackingConfig(max_tokens=256, packs_per_window=4)
    a = np.full(3000, 17, dtype=np.int64)
    b = a.copy()
    b[1500] = 18
    sa, sb = WFAPBatchSampler(a, cfg), WFAPBatchSampler(b, cfg)
    assert sa.fingerprint != sb.fingerprint
    assert WFAPBatchSampler(a.copy(), cfg).fingerprint == sa.fingerprint
    with pytest.raises(ValueError, match="fingerprint"):
        sb.load_state_dict(sa.state_dict())


def test_the_fingerprint_does_not_depend_on_the_order_of_a_mappings_keys():
    """Equal settings given in another key order are the same settings: a saved state still resumes."""
    from atac_hf.packing.data.window_planner import _fingerprint

    assert _fingerprint(config={"a": 1, "b": [2, 3]}, x=1) == _fingerprint(x=1, config={"b": [2, 3], "a": 1})
    assert _fingerprint(config={"a": 1}) != _fingerprint(config={"a": 2})


# ------------------------------------------------------------------------------ relay
import functools  # noqa: E402
import inspect  # noqa: E402

from torch.utils.checkpoint import checkpoint  # noqa: E402

from atac_hf.attention.relay import _remove_relay, active_context, install_relay  # noqa: E402
from test_kwargs_relay import _ctx as _shard_ctx  # noqa: E402


class _Layer(torch.nn.Module):
    """A decoder layer that calls its attention without the keywords, through transformers'
    ``_gradient_checkpointing_func`` when one is set (``GradientCheckpointingLayer``)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3, dtype=torch.float64)
        self.seen = []

    def _attn(self, x, *, scale):
        self.seen.append(active_context())
        return self.lin(x) * scale

    def forward(self, x, **kwargs):
        func = getattr(self, "_gradient_checkpointing_func", None)
        return func(self._attn, x, scale=3.0) if func is not None else self._attn(x, scale=3.0)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Layer(), _Layer()

    def forward(self, x, inner=None, **kwargs):
        y = self.a(x)  # the keywords dropped
        return self.b(y, **({} if inner is None else {"atac_shard": inner}))


def test_a_checkpointed_layer_recomputes_under_the_context_of_its_forward():
    m = _Model()
    original = m.a._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)
    assert install_relay(m) == 3
    ctx = _shard_ctx()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    out = m(x, atac_shard=ctx)
    assert m.a.seen == [ctx] and active_context() is None
    wrapped = m.a._gradient_checkpointing_func
    torch.testing.assert_close(out, m.b.lin(m.a.lin(x) * 3) * 3)  # the keywords reach the checkpointed function
    out.sum().backward()  # recomputes m.a's attention outside any forward
    assert m.a.seen == [ctx, ctx], "the recomputation must see the forward's context"
    assert inspect.unwrap(wrapped) is original  # tools that unwrap find transformers' function
    m(x, atac_shard=ctx)
    assert m.a._gradient_checkpointing_func is wrapped, "wrapped once, not again at every call"
    m.a.seen.clear()
    out = m(x)  # no context: the checkpoint runs as it is, keywords and all
    assert m.a.seen == [None]
    torch.testing.assert_close(out, m.b.lin(m.a.lin(x) * 3) * 3)
    _remove_relay(m)


def test_an_inner_module_given_its_own_context_sees_it_and_the_outer_one_comes_back():
    m = _Model()
    install_relay(m)
    outer, inner = _shard_ctx(), _shard_ctx()
    m(torch.ones(3, dtype=torch.float64), atac_shard=outer, inner=inner)
    assert m.a.seen == [outer] and m.b.seen == [inner]
    assert active_context() is None
    m(torch.ones(3, dtype=torch.float64), inner=inner)  # only the inner layer has one
    assert m.a.seen == [outer, None] and m.b.seen == [inner, inner]
    assert active_context() is None
    _remove_relay(m)


# ------------------------------------------------------------------------------ collectives
import gc  # noqa: E402
import types  # noqa: E402

import atac_hf.attention.collectives as coll  # noqa: E402
from atac_hf.attention.collectives import KVGather, attach, group_device, peer_failure  # noqa: E402


class _Work:
    def __init__(self, fail=None):
        self.fail, self.waits = fail, 0

    def wait(self):
        self.waits += 1
        if self.fail:
            raise RuntimeError(self.fail)


class _TwoRanks:
    """Rank 0 of a 2-rank CP group in one process: the peer's rows are ``10 x`` ours in the gather, and
    its gradient contribution to our rows ``100 x`` the upstream gradient of its own copy."""

    ReduceOp = types.SimpleNamespace(SUM="sum")

    def __init__(self, *, fail_wait=None, fail_scatter=None, rank_fails=False, initialized=True, available=True):
        self.group = object()  # the CP group the tests pass; every call must get it
        self.work = _Work(fail_wait)
        self.fail_scatter, self.rank_fails = fail_scatter, rank_fails
        self.initialized, self.available = initialized, available
        self.scatters = []

    def is_available(self):
        return self.available

    def is_initialized(self):
        return self.initialized

    def _check(self, group):
        assert group is self.group, f"called with group={group!r}, not the CP group"

    def get_world_size(self, group=None):
        self._check(group)
        return 2

    def get_rank(self, group=None):
        self._check(group)
        if self.rank_fails:
            raise RuntimeError("the group is gone")
        return 0

    def get_backend(self, group=None):
        return "gloo"

    def all_gather_single(self, out, inp, group=None, async_op=False):
        self._check(group)
        assert out.device == inp.device
        assert async_op and out.shape[0] == 2 * inp.shape[0] and out.dtype == inp.dtype
        out[: inp.shape[0]] = inp
        out[inp.shape[0]:] = 10 * inp
        return self.work

    def reduce_scatter_single(self, out, inp, op=None, group=None):
        self._check(group)
        if self.fail_scatter:
            raise RuntimeError(self.fail_scatter)
        assert out.device == inp.device
        assert op == "sum" and inp.shape[0] == 2 * out.shape[0] and inp.is_contiguous()
        self.scatters.append(inp.clone())
        R = out.shape[0]
        out.copy_(inp[:R] + 100 * inp[:R])  # our copy's gradient plus the peer's (100 x) for our rows


@pytest.fixture
def two_ranks(monkeypatch):
    def make(**kw):
        w = _TwoRanks(**kw)
        monkeypatch.setattr(coll, "dist", w)
        monkeypatch.setattr(coll, "all_gather_single", w.all_gather_single)
        monkeypatch.setattr(coll, "reduce_scatter_single", w.reduce_scatter_single)
        return w

    return make


def test_the_gather_returns_every_ranks_rows_and_sums_their_gradients_back_to_the_owner(two_ranks):
    w = two_ranks()
    x = torch.arange(6, dtype=torch.float64).reshape(3, 2).requires_grad_()
    g = KVGather(x * 1, w.group)
    out = g.wait()
    assert out.shape == (6, 2) and w.work.waits == 1
    torch.testing.assert_close(out, torch.cat([x.detach(), 10 * x.detach()]))
    up = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    out.backward(up)
    assert len(w.scatters) == 1
    torch.testing.assert_close(w.scatters[0], up)
    torch.testing.assert_close(x.grad, 101 * up[:3])
    with pytest.raises(RuntimeError, match=r"^KVGather\.wait\(\) called twice: each exchange is waited for exactly once$"):
        g.wait()
    del g
    assert w.work.waits == 1  # waited already: not again when it is dropped


def test_a_gather_dropped_unwaited_is_waited_for_and_a_failed_peer_there_is_swallowed(two_ranks):
    w = two_ranks()
    g = KVGather(torch.ones(2, 3), w.group)
    del g
    assert w.work.waits == 1
    w = two_ranks(fail_wait="Connection closed by peer")
    g = KVGather(torch.ones(2, 3), w.group)
    del g  # no exception escapes __del__
    assert w.work.waits == 1


def test_a_failed_peer_is_named_in_the_forward_and_the_backward(two_ranks):
    w = two_ranks(fail_wait="Connection closed by peer")
    g = KVGather(torch.ones(2, 3), w.group)
    with pytest.raises(RuntimeError) as e:
        g.wait()
    msg = str(e.value)
    assert msg.startswith("atac_cp: the forward K/V all-gather over the CP group failed on rank 0 of 2: another CP rank "
                          "crashed, raised or is stuck")
    assert msg.endswith("accelerate InitProcessGroupKwargs(timeout=). Cause: Connection closed by peer")
    assert "init_process_group(timeout=) / new_group(timeout=), TrainingArguments(ddp_timeout=)" in msg
    assert isinstance(e.value.__cause__, RuntimeError)
    w = two_ranks(fail_scatter="timed out")
    x = torch.ones(2, 3, requires_grad=True)
    out = KVGather(x * 1, w.group).wait()
    with pytest.raises(RuntimeError, match=r"^atac_cp: the backward K/V reduce-scatter over the CP group failed on "
                                           r"rank 0 of 2: .*Cause: timed out$"):
        out.sum().backward()


def test_a_failure_message_without_a_usable_group_says_this_rank(two_ranks):
    w = two_ranks(rank_fails=True)
    err = peer_failure("forward K/V all-gather", w.group, RuntimeError("x"))
    assert "failed on this rank: another" in str(err) and str(err).endswith("Cause: x")


@pytest.mark.parametrize("available,initialized", [(False, True), (True, False)])
def test_a_gather_without_a_process_group_is_refused(two_ranks, available, initialized, monkeypatch):
    w = two_ranks(available=available, initialized=initialized)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(RuntimeError, match=r"^the plan all-gathers K/V but torch.distributed is not initialized; call "
                                           r"torch.distributed.init_process_group before the forward pass \(or use "
                                           r"cp_size=1\)$"):
        KVGather(torch.ones(2, 3), w.group)
    gc.collect()
    assert not unraisable, "the refused, half-built exchange must be dropped quietly"


def test_attach_keeps_an_unused_buffer_in_the_graph_with_a_zero_gradient():
    out = torch.randn(3, dtype=torch.float64, requires_grad=True)
    dep = torch.randn(2, 4, dtype=torch.float32, requires_grad=True)
    y = attach(out * 2, dep)
    torch.testing.assert_close(y, out.detach() * 2)
    y.sum().backward()
    torch.testing.assert_close(out.grad, torch.full((3,), 2.0, dtype=torch.float64))
    assert dep.grad is not None and dep.grad.shape == (2, 4) and dep.grad.dtype == torch.float32
    assert not dep.grad.any()
    plain = torch.ones(2)
    assert attach(plain, torch.ones(1)) is plain  # nothing to keep
    with torch.no_grad():
        assert attach(plain, dep) is plain


def test_control_tensors_of_a_gloo_group_live_on_the_cpu(two_ranks):
    w = two_ranks()
    assert group_device(w.group) == torch.device("cpu")


def test_the_gathered_buffer_and_every_gradient_stay_on_the_rows_device(two_ranks):
    """(``meta`` stands for an accelerator here: no buffer may fall back to the CPU.)"""
    w = two_ranks()
    x = torch.ones(3, 2, device="meta", requires_grad=True)
    out = KVGather(x * 1, w.group).wait()
    assert out.device.type == "meta" and out.shape == (6, 2)
    dep = torch.ones(4, dtype=torch.float64, device="meta", requires_grad=True)
    attach(out, dep).backward(torch.ones(6, 2, device="meta"))
    assert x.grad.device.type == "meta" and x.grad.shape == (3, 2)
    assert dep.grad.device.type == "meta" and dep.grad.dtype == torch.float64


# ------------------------------------------------------------------------------ config_files
from atac_hf.integrations.config_files import read_config_file  # noqa: E402


def test_a_json_config_with_a_key_given_twice_names_that_key_cut_to_40_characters(tmp_path):
    p = tmp_path / "atac.json"
    p.write_text('{"cp_size": 2, "max_tokens": 8, "max_tokens": 16}')
    with pytest.raises(ValueError) as e:
        read_config_file(p)
    assert str(e.value) == (f"ATAC config file {str(p)!r} is not valid JSON: the key 'max_tokens' appears twice in one "
                            "object: keep one")
    key = "k" * 39 + "XYZ"
    p.write_text('{"a": 1, "%s": 2, "%s": 3}' % (key, key))
    with pytest.raises(ValueError, match=r"the key 'k{39}X' appears twice in one object: keep one$"):
        read_config_file(p)


@pytest.mark.parametrize("text,want", [
    ("cp_size: 2\nopts:\n  x: 1\n  x: 2\n", "the key 'x' appears twice in one mapping (line 4, column 3): keep one"),
    ("a: &anc 1\nb:\n  - *anc\n", "found the alias *anc (line 3, column 5): YAML aliases are not allowed in an ATAC config"),
    ("a: " + "[" * 17 + "]" * 17 + "\n",
     "nesting deeper than 16 levels (line 1, column 19; atac_hf.integrations.config.MAX_CONFIG_DEPTH)"),
])
def test_a_refused_yaml_config_says_where_in_the_file(tmp_path, text, want):
    p = tmp_path / "atac.yaml"
    p.write_text(text)
    with pytest.raises(ValueError) as e:
        read_config_file(p)
    assert str(e.value) == f"ATAC config file {str(p)!r} is not valid YAML: {want}"


def test_paths_in_messages_are_whole_up_to_400_characters_then_keep_both_ends():
    from atac_hf.integrations.config_files import path_repr

    whole = "/" + "a" * 397  # its repr: 400 characters
    assert path_repr(whole) == repr(whole)
    long = "/" + "b" * 250 + "c" * 147 + "/end.yaml"
    text = repr(long)
    cut = path_repr(long)
    assert len(text) > 400 and len(cut) == 400
    assert cut == text[:200] + "..." + text[-197:]
    assert cut.startswith("'/bbb") and cut.endswith("/end.yaml'")


def test_error_texts_are_whole_up_to_300_characters_then_cut():
    from atac_hf.integrations.config_files import short_text

    assert short_text(ValueError("x" * 300)) == "x" * 300
    assert short_text(ValueError("x" * 301)) == "x" * 300 + "..."
    assert short_text(ValueError("abcdef"), limit=3) == "abc..."


WHERE = "(check --atac_config / ATAC_CONFIG)"


def _refusal(path, exc=ValueError):
    with pytest.raises(exc) as e:
        read_config_file(path)
    return str(e.value)


def test_yaml_duplicates_are_found_per_mapping_among_keys_only(tmp_path):
    """Equal values, and equal keys in different mappings (a list of mappings, nested ones), are not
    duplicates; a key given twice is, also after a nested mapping and a 40-character cut."""
    p = tmp_path / "atac.yaml"
    p.write_text("a: 1\nb: 1\nc: a\nruns:\n  - {a: 1, b: 1}\n  - {a: 2, b: a}\nnested: {a: {a: 1}}\n")
    assert read_config_file(p) == {"a": 1, "b": 1, "c": "a", "runs": [{"a": 1, "b": 1}, {"a": 2, "b": "a"}],
                                   "nested": {"a": {"a": 1}}}
    key = "k" * 39 + "XYZ"
    p.write_text(f"{key}: 1\nn: {{x: 1}}\n{key}: 2\n")
    assert _refusal(p).endswith(f"the key 'k{'k' * 38}X' appears twice in one mapping (line 3, column 1): keep one")
    anchor = "a" * 39 + "XYZ"
    p.write_text(f"x: &{anchor} 1\ny: *{anchor}\n")
    assert f"found the alias *{'a' * 39}X (line 2, column 4)" in _refusal(p)


def test_yaml_nesting_is_counted_per_open_collection(tmp_path):
    p = tmp_path / "atac.yaml"
    p.write_text("a: " + "[" * 15 + "]" * 15 + "\n" + "".join(f"k{i}: [[1]]\n" for i in range(20)))
    assert len(read_config_file(p)) == 21  # 16 levels deep at most, and closed collections give their level back
    p.write_text("a: [[], " + "[" * 15 + "]" * 15 + "]\n")  # 17 deep after a closed sibling
    assert "nesting deeper than 16 levels" in _refusal(p)


def test_json_nesting_of_16_is_read_and_17_refused(tmp_path):
    p = tmp_path / "atac.json"
    p.write_text('{"a": ' + "[" * 15 + "]" * 15 + "}")
    assert read_config_file(p) == {"a": json.loads("[" * 15 + "]" * 15)}
    p.write_text('{"a": ' + "[" * 16 + "]" * 16 + "}")
    assert _refusal(p) == (f"ATAC config file {str(p)!r} is not valid JSON: nesting 17 levels deep, more than 16")


def test_a_config_file_of_exactly_64_kib_is_read_whole_and_one_byte_more_is_refused(tmp_path):
    p = tmp_path / "atac.yaml"
    tail = "\nmax_tokens: 16384"
    p.write_text("#" * (65536 - len(tail)) + tail)  # no newline at the end: the last byte is the value's
    assert p.stat().st_size == 65536 and read_config_file(p) == {"max_tokens": 16384}
    p.write_text("#" * (65537 - len(tail)) + tail)
    assert _refusal(p) == (f"ATAC config file {str(p)!r} has 65537 bytes, more than 65536 "
                           f"(atac_hf.integrations.config.MAX_CONFIG_BYTES): not a config {WHERE}")


def test_a_file_that_grew_past_the_limit_after_its_stat_is_refused(tmp_path, monkeypatch):
    import atac_hf.integrations.config_files as cf

    p = tmp_path / "atac.yaml"
    p.write_text("a: 1\n" + "#" * 70000)
    real = os.stat
    small = os.stat_result((*real(p)[:6], 10, *real(p)[7:]))  # the size when it was stat'ed
    monkeypatch.setattr(cf.os, "stat", lambda path, *a, **k: small if os.fspath(path) == str(p) else real(path, *a, **k))
    assert _refusal(p) == f"ATAC config file {str(p)!r} has more than 65536 bytes {WHERE}"


def test_a_config_file_that_cannot_be_opened_gives_the_systems_reason(tmp_path, monkeypatch):
    import atac_hf.integrations.config_files as cf

    p = tmp_path / "atac.yaml"
    p.write_text("a: 1\n")

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cf, "open", denied, raising=False)
    assert _refusal(p) == f"ATAC config file {str(p)!r} cannot be read: Permission denied {WHERE}"


class _BytesPath:
    def __fspath__(self):
        return b"/tmp/atac.yaml"


def test_config_paths_that_are_not_text_or_do_not_exist_are_refused_whole(tmp_path):
    assert _refusal(b"/tmp/atac.yaml", TypeError) == \
        f"ATAC config file must be a path (str or os.PathLike), got bytes {WHERE}"
    assert _refusal(_BytesPath(), TypeError) == \
        f"ATAC config file must be a path (str or os.PathLike), got _BytesPath {WHERE}"
    missing = str(tmp_path / "no.yaml")
    assert _refusal(missing) == (f"ATAC config file {missing!r} does not exist or is not a file (a directory, device "
                                 f"or pipe) {WHERE}")


def test_a_config_that_is_not_a_mapping_or_has_non_string_keys_is_refused_whole(tmp_path):
    p = tmp_path / "atac.yaml"
    p.write_text("- a\n- b\n")
    assert _refusal(p) == (f"ATAC config file {str(p)!r} must hold a mapping of settings (optionally under 'atac:'), "
                           "got list")
    p.write_text("a:\n  1: x\n")
    assert _refusal(p) == (f"ATAC config file {str(p)!r} has non-string keys [1]: keys are setting names (quote "
                           "them, e.g. '1': ...)")


def test_only_a_relative_text_cost_profile_is_taken_relative_to_the_config(tmp_path):
    p = tmp_path / "atac.yaml"
    for value, want in [("prof.json", str(tmp_path / "prof.json")), ("", ""), (5, 5), ("/abs/p.json", "/abs/p.json")]:
        p.write_text(f"cost_profile: {value!r}\n" if isinstance(value, str) else f"cost_profile: {value}\n")
        assert read_config_file(p) == {"cost_profile": want}


# ------------------------------------------------------------------------------ cache_files
from test_pack_dataset_cache import CAP, _rows, _source  # noqa: E402


def test_a_cache_file_in_missing_nested_directories_is_written_and_keeps_its_fingerprint(tmp_path):
    """The directories are made; the rows written and the rows read back carry the call's fingerprint (the
    same on every call, so ``datasets``' own caches of later maps over them are reused)."""
    from atac_hf import pack_dataset

    src, path = _source(40), tmp_path / "a" / "b" / "packed.arrow"
    first = pack_dataset(src, max_tokens=CAP, progress=False, cache_file_name=str(path))
    again = pack_dataset(src, max_tokens=CAP, progress=False, cache_file_name=str(path))  # loaded
    assert path.is_file() and again.cache_files == first.cache_files
    assert first._fingerprint == again._fingerprint
    assert pack_dataset(src, max_tokens=CAP, progress=False, keep_in_memory=True)._fingerprint == first._fingerprint
    assert _rows(again) == _rows(first)


def test_an_arrow_file_not_written_by_pack_dataset_is_replaced_not_reused(tmp_path):
    import pyarrow as pa

    from atac_hf import pack_dataset

    path = tmp_path / "packed.arrow"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, pa.schema([("x", pa.int64())])) as w:
        w.write_batch(pa.record_batch([pa.array([1, 2])], names=["x"]))
    src = _source(30)
    packed = pack_dataset(src, max_tokens=CAP, progress=False, cache_file_name=str(path))
    assert "spans" in packed.column_names and _rows(packed) == _rows(pack_dataset(src, max_tokens=CAP,
                                                                                 progress=False))


def test_the_rows_are_written_to_a_temporary_file_beside_the_target_then_renamed(tmp_path):
    import datasets as hf_datasets
    import pyarrow as pa

    from atac_hf.packing.data.cache_files import load_cache, write_cache

    path = tmp_path / "out" / "rows.arrow"
    seen = []
    schema = pa.schema([("x", pa.int64())], metadata={b"k": b"v"})

    def batches():
        seen.append(sorted(p.name for p in path.parent.iterdir()))
        yield pa.record_batch([pa.array([1, 2, 3])], schema=schema)

    ds = write_cache(hf_datasets, path, schema, batches(), "f" * 16)
    assert len(seen[0]) == 1 and seen[0][0].startswith("tmp-rows.arrow-")  # beside it, named after it
    assert [p.name for p in path.parent.iterdir()] == ["rows.arrow"]
    assert ds["x"] == [1, 2, 3] and ds._fingerprint == "f" * 16
    assert load_cache(hf_datasets, path, "f" * 16)._fingerprint == "f" * 16
    assert load_cache(hf_datasets, path, "e" * 16) is None


def test_dataset_dict_cache_name_refusals_are_whole(tmp_path):
    import datasets as hf_datasets

    from atac_hf.packing.data.cache_files import split_cache_names

    dd = hf_datasets.DatasetDict({"train": _source(5, 1), "test": _source(5, 2)})
    with pytest.raises(ValueError) as e:
        split_cache_names(dd, "x.arrow")
    assert str(e.value) == ("pack_dataset: cache_file_name='x.arrow' is one path, but a DatasetDict has splits "
                            "['train', 'test']: give a mapping {split: path}, or None")
    with pytest.raises(ValueError) as e:
        split_cache_names(dd, {"train": "a.arrow", "test": "./a.arrow"})
    assert str(e.value) == ("pack_dataset: cache_file_name gives two splits the same path; give each split its own "
                            "file")


@pytest.mark.parametrize("q_dtype,sink_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.float32)])
def test_sinks_in_another_dtype_than_the_queries_are_taken_in_the_compute_dtype(q_dtype, sink_dtype, one_thread):
    """GPT-OSS keeps its sinks in fp32 under a bf16 model; every kernel that takes sinks returns the
    queries' dtype and gives the sinks a gradient in their own dtype."""
    q, k, v, _, gout = _leaves(4, 2, 6, 6, D=16, seed=5, dtype=q_dtype)
    sinks = torch.linspace(-1, 1, 4, dtype=sink_dtype).requires_grad_()
    cases = [(lambda: ck._math_block(q, k, v, 0, 0, None, 0.25, None, sinks), 0)]
    if ck.prefix_merge_available("cpu"):
        cases += [(lambda: ck._sink_flash(q, k, v, None, 0.25, sinks), 0),
                  (lambda: ck._prefix_chunk(q[:, 2:], k, v, 2, 0.25, sinks), 2)]
    for kernel, p0 in cases:
        out = kernel()
        want = _naive(q[:, p0:], k, v, p0, 0, None, 0.25, sinks=sinks)
        assert out.dtype == q_dtype and _dist.rel_err(out, want) <= (1e-5 if q_dtype == torch.float32 else 2e-2)
        (ds,) = torch.autograd.grad(out, sinks, gout[:, p0:])
        assert ds.dtype == sink_dtype and torch.isfinite(ds).all()


@pytest.mark.parametrize("backend,cuda,want", [("nccl", True, torch.device("cuda", 1)),
                                               ("NCCL", True, torch.device("cuda", 1)),
                                               ("cpu:gloo,cuda:nccl", True, torch.device("cuda", 1)),
                                               ("gloo", True, torch.device("cpu")),
                                               ("nccl", False, torch.device("cpu"))])
def test_control_tensors_live_on_the_current_cuda_device_under_nccl_only(two_ranks, monkeypatch, backend, cuda, want):
    w = two_ranks()
    monkeypatch.setattr(w, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert group_device(w.group) == want


def test_a_module_whose_forward_has_no_signature_is_not_hooked():
    m = torch.nn.Module()
    m.forward = max  # a builtin without an introspectable signature
    assert install_relay(m) == 0


def test_a_path_whose_repr_is_401_characters_is_cut():
    from atac_hf.integrations.config_files import path_repr

    p = "/" + "d" * 398
    assert len(repr(p)) == 401 and path_repr(p) == repr(p)[:200] + "..." + repr(p)[-197:]


def test_counts_refuse_bools_floats_and_small_ints_with_whole_messages():
    from atac_hf.integrations.config_files import check_count
    from atac_hf.packing.validate import InputTypeError

    assert check_count(np.int64(3), "n", "steps") == 3 and type(check_count(np.int64(3), "n", "steps")) is int
    assert check_count(-7, "n", "steps", low=None) == -7
    with pytest.raises(ValueError) as e:
        check_count(0, "cp_size", "ranks per context-parallel group")
    assert type(e.value) is ValueError
    assert str(e.value) == "cp_size=0 is invalid: it must be an int >= 1 (ranks per context-parallel group)"
    for bad in (True, np.bool_(False), 2.0, "2"):
        with pytest.raises(InputTypeError) as e:
            check_count(bad, "cp_size", "ranks", low=None)
        assert str(e.value) == f"cp_size={bad!r} is invalid: it must be an int (ranks)"


def test_device_types_are_read_and_anything_else_refused_whole():
    from atac_hf.integrations.config_files import device_type
    from atac_hf.packing.validate import InputTypeError

    assert device_type("cuda:1") == "cuda" and device_type(torch.device("cpu")) == "cpu"
    tail = (" is not a device: pass a device type such as 'cpu' or 'cuda', a device string such as 'cuda:0', or a "
            "torch.device (e.g. accelerator.device)")
    with pytest.raises(ValueError) as e:
        device_type("gpu0")
    assert type(e.value) is ValueError and str(e.value) == "device_type='gpu0'" + tail
    with pytest.raises(InputTypeError) as e:
        device_type(0)
    assert str(e.value) == "device_type=0" + tail


def test_a_sampler_fingerprint_is_the_one_earlier_states_were_saved_with():
    """States saved by this release resume under the next only while the fingerprint's recipe is kept
    (sha256 over the sorted settings, JSON, the lengths' bytes; 16 hex digits)."""
    s = WFAPBatchSampler(np.full(50, 7), PackingConfig(max_tokens=64, packs_per_window=4))
    assert s.fingerprint == "d3ada9f9c06b2b8d"


def test_numpy_settings_are_fingerprinted_and_a_wrong_cost_model_is_named():
    cfg = PackingConfig(max_tokens=np.int64(64), packs_per_window=np.int64(4))
    s = WFAPBatchSampler(np.full(50, 7), cfg, window_size=np.int64(8))
    assert len(s.fingerprint) == 16
    with pytest.raises(TypeError) as e:
        WFAPBatchSampler(np.full(5, 7), PackingConfig(max_tokens=64, packs_per_window=4), cost_model="x")
    assert str(e.value) == "cost_model must be a CostModel or None, got str"


def test_plan_packs_refusals_name_the_sample_and_the_legal_indices():
    cfg = PackingConfig(max_tokens=8, packs_per_window=2)
    with pytest.raises(ValueError) as e:
        plan_packs([3, 4, 5], cfg, order=[0, 1, 1])
    assert str(e.value) == ("order=[0, 1, 1] is invalid: it must be a permutation of the 3 sample indices 0..2 "
                            "(set order)")
    with pytest.raises(ValueError) as e:
        plan_packs([3, 4, 5, 9], PackingConfig(max_tokens=8, packs_per_window=2, overlength="error"))
    assert str(e.value) == ("sample 3 has 9 tokens, more than max_tokens=8, and overlength='error'; set overlength to "
                            "'split' or 'truncate', or raise max_tokens")


def test_replica_order_hand_checked_with_three_replicas_and_costs_below_one():
    """Slot k goes to replica (first_slot + k) % R, also for R = 3 (where k and -k differ); LPT over
    costs below one unit (a pack's cost has no floor) still balances: 0.5 + 0.2 against 0.4 + 0.3."""
    # LPT: r0 {10, 1}, r1 {7, 2}, r2 {6, 5}; slots r0, r1, r2, r0, r1, r2
    assert replica_order([5.0, 10.0, 2.0, 6.0, 1.0, 7.0], 3) == [1, 5, 3, 4, 2, 0]
    # first slot 1: slots r1, r2, r0, r1, r2, r0
    assert replica_order([5.0, 10.0, 2.0, 6.0, 1.0, 7.0], 3, first_slot=1) == [5, 3, 1, 2, 0, 4]
    assert replica_order([0.5, 0.4, 0.3, 0.2], 2) == [0, 1, 3, 2]
    # three packs a replica, each replica's heaviest first: r0 {6, 3, 2}, r1 {5, 4, 1}
    assert replica_order([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 2) == [0, 1, 3, 2, 4, 5]

"""The ``atac_cp`` attention function in one process: registration, user-facing errors,
cp_size=1 equivalence with stock sdpa on packed rows, and the collective on a 1-rank group."""

from __future__ import annotations

import os
import sys
import tempfile
import types
import warnings

import pytest
import torch
import torch.distributed as dist

import atac_hf.attention as A
from atac_hf.attention import ShardContext, atac_cp_attention, check_model_supported, shard_batch
from atac_hf.attention.collectives import KVGather
from atac_hf.sharding import plan_shards

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread


def _ctx(lengths=(5, 3), backend="sdpa"):
    plan = plan_shards(list(lengths), 1)
    batch = _dist.make_batch([list(lengths)], seed=0)
    return shard_batch(batch, plan, 0, backend=backend)["atac_shard"]


def _call(ctx=None, n=8, dropout=0.0, module=None, **kw):
    q = torch.randn(1, 4, n, 16)
    k = torch.randn(1, 2, n, 16)
    module = module or types.SimpleNamespace(is_causal=True, config=_dist.tiny_config("llama"))
    if ctx is not None:
        kw["atac_shard"] = ctx
    return atac_cp_attention(module, q, k, k, None, dropout=dropout, scaling=None, **kw)


# ---------------------------------------------------------------------------- registration
def test_registered_and_idempotent():
    from transformers import AttentionInterface

    assert AttentionInterface().get("atac_cp") is atac_cp_attention
    assert A.register_attention() == "atac_cp"
    assert AttentionInterface().get("atac_cp") is atac_cp_attention
    assert AttentionInterface().get("sdpa") is not atac_cp_attention  # built-ins untouched


def test_register_refuses_taken_names():
    with pytest.raises(ValueError, match="'sdpa' is already registered"):
        A.register_attention("sdpa")


# ---------------------------------------------------------------------------- errors
def test_call_without_context():
    with pytest.raises(ValueError, match="kwarg 'atac_shard' is missing"):
        _call()
    with pytest.raises(TypeError, match="must be a ShardContext"):
        _call(ctx="plan")


def test_unsupported_settings():
    ctx = _ctx()
    with pytest.raises(NotImplementedError, match=r"attention dropout \(0.1, config.attention_dropout\)"):
        _call(ctx, dropout=0.1)
    with pytest.raises(ValueError, match=r"softcap \(attention logit soft-capping\) must be a finite number > 0"):
        _call(ctx, softcap=0.0)  # soft-capping itself runs: tests/test_attention_sinks.py
    with pytest.raises(ValueError, match=r"s_aux \(attention sinks\) must be a tensor of one logit per query head"):
        _call(ctx, s_aux=torch.zeros(3))  # sinks themselves run: tests/test_attention_sinks.py
    enc = types.SimpleNamespace(is_causal=False, config=_dist.tiny_config("llama"))
    with pytest.raises(NotImplementedError, match="non-causal"):
        _call(ctx, module=enc)
    with pytest.raises(ValueError, match="sliding_window must be None or an int >= 1"):
        _call(ctx, sliding_window=0)


@pytest.mark.parametrize("name, value, what", [
    ("is_causal", False, "non-causal attention"),
    ("position_bias", torch.zeros(1, 4, 8, 8), r"passes position_bias= \(a relative position bias"),
    ("indices", torch.zeros(1, 8, 2, dtype=torch.long), r"passes indices= \(sparse attention over top-k"),
    ("block_indices", torch.zeros(1, 2, dtype=torch.long), r"passes block_indices= \(block-sparse"),
    ("sinks", torch.zeros(4), r"passes sinks= \(attention sinks under a name"),
])
def test_score_changing_keywords_are_refused_not_ignored(name, value, what):
    """Keywords transformers families pass to their attention that change the scores in a way atac_cp does
    not implement: ignoring them would compute another attention silently (None is fine: not used)."""
    ctx = _ctx()
    with pytest.raises(NotImplementedError, match=what):
        _call(ctx, **{name: value})
    _call(ctx, **{name: None if name != "is_causal" else True})


def test_attention_mask_is_ignored_with_a_warning():
    ctx = _ctx()
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    module = types.SimpleNamespace(is_causal=True, config=_dist.tiny_config("llama"))
    with pytest.warns(UserWarning, match="ignores attention_mask"):
        atac_cp_attention(module, q, k, k, torch.ones(1, 1, 8, 8, dtype=torch.bool), atac_shard=ctx)


def test_shape_mismatch_names_rank_and_plan():
    ctx = _ctx()
    with pytest.raises(ValueError, match=r"rank 0 expects one local row of 8 tokens .* same plan"):
        _call(ctx, n=9)


def test_unknown_backend():
    plan = plan_shards([4], 1)
    with pytest.raises(ValueError, match=r"unknown attention backend 'cuda'; legal values: \['auto', 'flash', 'flex', 'sdpa', 'varlen', 'varlen_reference'\]"):
        ShardContext(plan=plan, rank=0, layout=plan.local_layout(0), backend="cuda")


@pytest.mark.parametrize("params", [
    {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
    {"rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "longrope"}}},
    {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
])
def test_position_dependent_rope_refused(params):
    with pytest.raises(ValueError, match=r"rope type '(dynamic|longrope)' .* depends on the largest position"):
        check_model_supported(types.SimpleNamespace(**params))


def test_static_rope_accepted():
    for name in ("llama", "qwen3_sw", "mistral_sw"):
        check_model_supported(_dist.tiny_config(name))
    check_model_supported(types.SimpleNamespace(rope_parameters={"rope_type": "yarn", "factor": 4.0}))
    check_model_supported(types.SimpleNamespace())


def test_dynamic_rope_model_refused_at_first_call():
    cfg = _dist.tiny_config("llama")
    cfg.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="atac_cp")
    batch = _dist.make_batch([[5, 7]], seed=0)
    local = shard_batch(batch, plan_shards([5, 7], 1), 0)
    with pytest.raises(ValueError, match="rope type 'dynamic'"):
        model(**local)


# ---------------------------------------------------------------------------- cp_size 1 vs stock sdpa
@pytest.mark.parametrize("name,dtype", [("llama", torch.float64), ("mistral_sw", torch.float64),
                                        ("qwen3_sw", torch.float32)])
def test_cp1_equals_stock_sdpa_packed(name, dtype):
    """cp_size=1: plain exact document-masked attention; B=2 rows become one local row."""
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    rows = [[30, 1, 2, 40, 27], [1, 50, 3, 1, 45]]
    batch = _dist.make_batch(rows, seed=3)
    model = _dist.tiny_model(name, dtype)
    ref = _dist.reference_run(model, batch)
    lengths = [n for r in rows for n in r]
    for strategy in ("atp", "per_doc"):  # per_doc: every document "gathered" (no collective at cp 1)
        plan = plan_shards(lengths, 1, strategy)
        for backend in ("sdpa", "varlen_reference"):
            _dist.set_attn(model, "atac_cp")
            model.zero_grad(set_to_none=True)
            local = shard_batch(batch, plan, 0, backend=backend)
            out = model(**local)
            out.loss.backward()
            assert _dist.rel_err(out.logits[0], ref["logits"]) <= tol
            assert _dist.rel_err(out.loss, ref["loss"]) <= max(tol, 1e-6)  # HF loss is fp32
            for n, p in model.named_parameters():
                assert _dist.rel_err(p.grad, ref["grads"][n]) <= tol, n
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(**shard_batch(batch, plan, 0, backend="flex"))
        assert _dist.rel_err(out.logits[0], ref["logits"]) <= tol


def test_compiled_model_reuses_its_graphs_across_pack_layouts():
    """torch.compile over a model on atac_cp: the attention runs as Python (``torch.compiler.disable``),
    so packs of one row length with other document layouts reuse the compiled graphs. Traced, dynamo
    guarded on each batch's plan and cache and recompiled at every new layout until its recompile limit
    (about 10 s a layer on CPU with inductor). The compiled model still equals the eager one."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = _dist.tiny_model("llama", torch.float64, attn="atac_cp")
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    frames = []
    for i, rows in enumerate([[40, 30, 30], [10, 90], [100], [25, 25, 25, 25], [1, 1, 97, 1]]):
        local = shard_batch(_dist.make_batch([rows], seed=i), plan_shards(rows, 1), 0)
        out = compiled(**local)
        assert _dist.rel_err(out.logits, model(**local).logits) <= 1e-12
        frames.append(counter.frame_count)
    torch._dynamo.reset()
    # the second pack may recompile once: its target count (an int) becomes dynamic, as in stock models
    assert frames[0] > 0 and frames[1:] == frames[1:2] * (len(frames) - 1), frames


# ---------------------------------------------------------------------------- collective, 1-rank group
@pytest.fixture
def one_rank_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    fd, path = tempfile.mkstemp(prefix="atac_gloo1_")
    os.close(fd)
    os.unlink(path)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        if os.path.exists(path):
            os.unlink(path)


def test_kv_gather_waits_once_and_is_differentiable(one_rank_group):
    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    g = KVGather(x * 2)
    assert not g.waited
    out = g.wait()
    assert g.waited
    torch.testing.assert_close(out, x.detach() * 2)
    with pytest.raises(RuntimeError, match=r"wait\(\) called twice"):
        g.wait()
    (out * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 6.0))


def test_kv_gather_needs_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        KVGather(torch.zeros(2, 1, 1))

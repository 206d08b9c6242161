"""Attention sinks (``s_aux``: GPT-OSS, Granite-SWA, Flint): one extra logit per head in every
query's softmax, with a zero value; and attention logit soft-capping (``softcap``: Gemma 2). ``atac_cp`` applies them on the ``sdpa`` backend as the plain
attention times ``sigmoid(lse - sink)``; these tests check that against a float64 reference that
concatenates the sink column (as the eager implementations do), forward and every gradient, the
sinks' own included, and through a GPT-OSS model at 2 and 4 gloo ranks against one device."""

from __future__ import annotations

import json
import os
import sys
import types
from collections import defaultdict

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

from atac_hf.attention import backends as kernels  # noqa: E402
from atac_hf.attention.reference import reference_attention  # noqa: E402
from atac_hf.attention.runtime import atac_cp_attention, emulate_cp_attention  # noqa: E402
from atac_hf.cost import default_cost_model  # noqa: E402
from atac_hf.sharding import plan_shards  # noqa: E402

CASES = [
    # lengths, cp, strategy, window, heads, kv heads, exchange
    ([40, 7, 90, 3], 2, "atp", None, 4, 2, None),
    ([300, 20, 700], 4, "per_doc", 64, 4, 1, None),
    ([900, 33], 3, "atp", None, 6, 3, "all_to_all"),
    ([500, 120, 1, 1, 80], 4, "zigzag", 37, 2, 2, "all_gather"),
    ([650, 64, 9], 2, "contiguous", None, 4, 4, None),
]


def _inputs(lengths, H, K, seed, dtype=torch.float64, D=8):
    g = torch.Generator().manual_seed(seed)
    N = sum(lengths)
    q, k, v = (torch.randn(n, N, D, generator=g, dtype=dtype).requires_grad_() for n in (H, K, K))
    sinks = (2 * torch.randn(H, generator=g, dtype=dtype)).requires_grad_()
    return q, k, v, sinks


def _check(lengths, C, strategy, window, H, K, exchange, seed=0, tol=1e-10, softcap=None, with_sinks=True):
    q, k, v, sinks = _inputs(lengths, H, K, seed)
    sinks = sinks if with_sinks else None
    plan = plan_shards(np.array(lengths), C, strategy, default_cost_model(), kv_exchange=exchange)
    out = emulate_cp_attention(q, k, v, plan, window=window, sinks=sinks, softcap=softcap)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=out.dtype)
    out.backward(g)
    ref, grads = reference_attention(q, k, v, lengths, window=window, grad_out_NHD=g, sinks=sinks, softcap=softcap)
    plain, _ = reference_attention(q, k, v, lengths, window=window)
    assert _dist.rel_err(ref, plain) > 1e-2, "the sinks / soft-capping must change the output for the test to bite"
    assert _dist.rel_err(out, ref) <= tol
    leaves = (q, k, v) + ((sinks,) if with_sinks else ())
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (t.grad for t in leaves), grads):
        assert _dist.rel_err(got, want) <= tol, name
    return plan


@pytest.mark.parametrize("case", CASES, ids=[f"{c[2]}-cp{c[1]}-w{c[3]}" for c in CASES])
def test_sinks_under_cp_equal_the_reference(case):
    plan = _check(*case)
    assert len(plan.gathered_docs) > 0  # a split document: the sinks meet gathered keys too


@pytest.mark.parametrize("case", CASES[:4], ids=[f"{c[2]}-cp{c[1]}-w{c[3]}" for c in CASES[:4]])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_softcap_under_cp_equals_the_reference(case, with_sinks, monkeypatch):
    """Gemma 2's logit soft-capping (scores ``cap * tanh(s / cap)``; a cap of 1.5 on these
    unit-scale scores bends most of them), alone and with sinks; small score blocks."""
    monkeypatch.setattr(kernels, "SINK_BLOCK_ELEMENTS", 6 * 300)
    _check(*case, softcap=1.5, with_sinks=with_sinks, seed=11)


def test_sinks_exact_on_every_kernel_path(monkeypatch):
    """CPU: the chunk kernel (prefix merged with the square, the sinks a third part: every
    chunk) and masked row blocks (QUERY_BLOCK rows) through the flash kernel's log-sum-exp.
    Elsewhere (GPU): the explicit-score path with the sink column in the softmax, here cut into
    many checkpointed blocks."""
    monkeypatch.setattr(kernels, "MERGE_MIN_PAIRS", 1)
    _check([400, 30, 90], 2, "atp", None, 4, 2, None, seed=3)
    monkeypatch.setattr(kernels, "MERGE_MIN_PAIRS", 1 << 40)
    monkeypatch.setattr(kernels, "QUERY_BLOCK", 16)
    _check([400, 30, 90], 2, "per_doc", 25, 4, 2, "all_to_all", seed=4)
    _check([400, 30, 90], 4, "atp", None, 4, 1, None, seed=5)
    calls = []
    real = kernels._attend_math
    monkeypatch.setattr(kernels, "_attend_math", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(kernels, "prefix_merge_available", lambda device: False)
    monkeypatch.setattr(kernels, "SINK_BLOCK_ELEMENTS", 4 * 50)
    _check([400, 30, 90], 2, "per_doc", 25, 4, 2, "all_to_all", seed=6)
    _check([400, 30, 90], 4, "atp", None, 4, 1, None, seed=7)
    assert calls, "the explicit-score path must have run"


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_sinks_low_precision_within_its_tolerance(dtype, tol):
    lengths = [3000, 200, 17]
    q, k, v, sinks = _inputs(lengths, 4, 2, 0, dtype=dtype, D=16)
    plan = plan_shards(np.array(lengths), 2, "atp")
    out = emulate_cp_attention(q, k, v, plan, sinks=sinks.float())  # sinks stay fp32 (GPT-OSS keeps them so)
    out.float().sum().backward()
    ref, _ = reference_attention(q, k, v, lengths, sinks=sinks)
    assert out.dtype == dtype and _dist.rel_err(out, ref) <= tol
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_very_negative_sinks_leave_plain_attention():
    lengths = [60, 5, 31]
    q, k, v, _ = _inputs(lengths, 4, 2, 1)
    plan = plan_shards(np.array(lengths), 2, "atp")
    plain = emulate_cp_attention(q, k, v, plan)
    assert _dist.rel_err(emulate_cp_attention(q, k, v, plan, sinks=torch.full((4,), -1e4, dtype=q.dtype)),
                         plain) <= 1e-12


# ---------------------------------------------------------------------------- runtime refusals
def _ctx(backend="sdpa", n=8):
    from atac_hf.attention import shard_batch

    batch = _dist.make_batch([[n]], seed=0)
    local = shard_batch(batch, plan_shards([n], 1, "atp"), 0, backend=backend)
    return local["atac_shard"]


def _call(ctx, **kw):
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    module = types.SimpleNamespace(is_causal=True, config=_dist.tiny_config("llama"))
    return atac_cp_attention(module, q, k, k, None, atac_shard=ctx, **kw)


def test_sinks_need_the_sdpa_backend():
    with pytest.raises(NotImplementedError, match=r"uses attention sinks \(s_aux\), which attention_backend="
                                                  r"'varlen_reference' does not apply; legal values with attention "
                                                  r"sinks: \['sdpa', 'auto'\] \(set attention_backend='sdpa' in "
                                                  r"ATACConfig\)"):
        _call(_ctx("varlen_reference"), s_aux=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="attention sinks and soft-capping need a backend of"):
        emulate_cp_attention(torch.zeros(4, 8, 16), torch.zeros(2, 8, 16), torch.zeros(2, 8, 16),
                             plan_shards([8], 1, "atp"), backend="varlen_reference", sinks=torch.zeros(4))
    out, _ = _call(_ctx("auto"), s_aux=torch.zeros(4))  # auto runs sdpa for them
    assert out.shape == (1, 8, 4, 16)


def test_softcap_needs_the_sdpa_backend_and_a_positive_cap():
    with pytest.raises(NotImplementedError, match=r"uses logit soft-capping \(softcap\), which "
                                                  r"attention_backend='varlen_reference' does not apply"):
        _call(_ctx("varlen_reference"), softcap=30.0)
    for bad in (0.0, -1.0, float("inf"), float("nan"), True, "30"):
        with pytest.raises(ValueError, match=r"softcap \(attention logit soft-capping\) must be a finite number > 0"):
            _call(_ctx(), softcap=bad)
    out, _ = _call(_ctx("auto"), softcap=30.0)
    assert out.shape == (1, 8, 4, 16)
    with pytest.raises(ValueError, match=r"must be a finite number > 0 or None, got inf"):
        emulate_cp_attention(torch.zeros(4, 8, 16), torch.zeros(2, 8, 16), torch.zeros(2, 8, 16),
                             plan_shards([8], 1, "atp"), softcap=float("inf"))


@pytest.mark.parametrize("window", [None, 5, 300])
def test_score_blocks_read_within_the_budget(window):
    """Rows per explicit-score block: heads x rows x the keys a block reads stay within the budget
    (a window's blocks read window - 1 + rows keys, not the segment's), at least one row."""
    H, budget = 8, kernels.SINK_BLOCK_ELEMENTS
    for ds, de, lo in ((0, 40000, 0), (30000, 40000, 0), (39990, 40000, 0), (0, 10, 0)):
        lo = lo if window is None else max(0, ds - window + 1)
        r = kernels._score_block_rows(H, ds, de, lo, window, "cpu")
        assert 1 <= r <= de - ds
        keys = de - lo if window is None else min(window - 1 + r, de - lo)
        assert H * r * keys <= budget or r == 1
        if r < de - ds:  # one more row would pass the budget
            keys1 = de - lo if window is None else min(window + r, de - lo)
            assert H * (r + 1) * keys1 > budget


def test_sinks_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"s_aux \(attention sinks\) must be a tensor of one logit per query head "
                                         r"\(4\), got \(3,\)"):
        _call(_ctx(), s_aux=torch.zeros(3))
    with pytest.raises(ValueError, match=r"one logit per query head \(4\), got list"):
        _call(_ctx(), s_aux=[0.0] * 4)


# ---------------------------------------------------------------------------- GPT-OSS at 2 and 4 ranks
def _gpt_oss(dtype):
    from transformers import AutoModelForCausalLM, GptOssConfig

    import atac_hf.attention  # noqa: F401  (registers atac_cp)

    cfg = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=_dist.VOCAB, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                       max_position_embeddings=131072, attention_dropout=0.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=dtype,
                                             experts_implementation="eager")
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.copy_(2 * torch.randn_like(m.sinks))
    return model.train()


def sinks_worker(rank: int, world: int, out_path: str) -> None:
    import test_attention_dist as td

    from atac_hf.attention import doc_lengths_from_batch

    stats: dict = defaultdict(float)
    for dtype in (torch.float64, torch.float32):
        model = _gpt_oss(dtype)
        for pi, rows in enumerate(([[150, 30, 1, 2, 20, 1, 7]], _dist.uneven_rows(np.random.default_rng(world), 230))):
            batch = _dist.make_batch(rows, seed=pi)
            # eager: transformers' packed-row masks from position_ids do not reach GPT-OSS's eager attention
            ref = _dist.per_document_reference(model, batch, "eager") if rank == 0 else None
            lengths = doc_lengths_from_batch(batch)
            for strategy in ("atp", "per_doc", "zigzag"):
                plan = plan_shards(lengths, world, strategy)
                stats["gathered"] += int(len(plan.gathered_docs) > 0)
                got = td._cp_run(model, batch, plan, rank, "sdpa")
                if rank == 0:
                    assert any(n.endswith("sinks") for n in ref["grads"]), "the sinks must train"
                    td._compare(ref, got, batch, dtype, f"world={world} gpt_oss {dtype} pack {pi} {strategy}", stats)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(stats, f)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_gpt_oss_cp_training_equals_single_device(world, tmp_path):
    out = tmp_path / "stats.json"
    _dist.spawn(sinks_worker, world, str(out), timeout_s=600)
    stats = json.loads(out.read_text())
    assert stats["cases"] == 2 * 2 * 3 and stats["gathered"] > 0


def test_prepare_model_refuses_sinks_or_softcap_with_another_backend_up_front():
    from transformers import AutoModelForCausalLM, Gemma2Config

    from atac_hf import ATACConfig
    from atac_hf.integrations.sharder import prepare_model

    model = _gpt_oss(torch.float32)
    with pytest.raises(NotImplementedError, match=r"GptOssForCausalLM uses attention sinks \(s_aux\), which "
                                                  r"attention_backend='varlen_reference' does not apply; legal values "
                                                  r"for it: \['sdpa', 'auto'\]"):
        prepare_model(model, ATACConfig(attention_backend="varlen_reference"))
    assert model.config._attn_implementation == "eager"  # refused: nothing changed
    prepare_model(model, ATACConfig(attention_backend="sdpa"))
    assert model.config._attn_implementation == "atac_cp"
    gemma = AutoModelForCausalLM.from_config(Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                          num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                                          vocab_size=64), attn_implementation="eager")
    with pytest.raises(NotImplementedError, match=r"logit soft-capping \(attn_logit_softcapping=50.0\)"):
        prepare_model(gemma, ATACConfig(attention_backend="varlen_reference"))

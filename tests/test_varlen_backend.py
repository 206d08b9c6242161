"""The ``varlen`` backend (torch's ``varlen_attn``) on CPU: its bookkeeping and its argument
translation, fed to CPU stand-ins of torch's kernel (``tests/_torch_varlen.py``, one per
signature generation), against full-row attention and the ``varlen_reference`` backend,
forward and backward, every strategy, GQA, sliding windows, anchors split over ranks;
the refusals of what an installed torch cannot do; ``attention_backend='auto'``.
The real kernel runs only on CUDA (``tests/test_attention_backends.py``, GPU tests)."""

from __future__ import annotations

import os
import sys
import types
import warnings

import numpy as np
import pytest
import torch

from atac_hf.attention import backends, emulate_cp_attention, varlen, varlen_attention_reference
from atac_hf.attention.compat import VarlenAttn, torch_varlen_attn
from atac_hf.integrations.config import ATACConfig
from atac_hf.sharding import STRATEGIES, plan_shards

sys.path.insert(0, os.path.dirname(__file__))
import _torch_varlen as tv  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield
    torch.set_num_threads(n)


def _use(monkeypatch, generation: str, **kw) -> None:
    """Make backend ``varlen`` call the stand-in of torch ``generation``'s varlen_attn."""
    fn = VarlenAttn.from_function(tv.GENERATIONS[generation], torch_version=generation,
                                  **{"cuda_only": False, "dtypes": None, **kw})
    monkeypatch.setattr(varlen, "torch_varlen_attn", lambda: fn)
    tv.CALLS.clear()


def _packs():
    rng = np.random.default_rng(11)
    packs = [[150, 30, 1, 2, 20, 1, 7], [41, 55, 63, 93], [1, 1, 1], [3, 120, 1, 2, 5]]
    lens = np.concatenate([[rng.integers(60, 160)], rng.integers(1, 25, 6)])
    rng.shuffle(lens)
    packs.append([int(x) for x in lens])
    return packs


def _qkv(lens, H=4, K=2, D=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(h, sum(lens), D, generator=g, dtype=dtype).requires_grad_() for h in (H, K, K)]


def _full_reference(q, k, v, lens, window, scaling):
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]))
    return varlen_attention_reference(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), cu, cu,
                                      window=window, scaling=scaling)


# ---------------------------------------------------------------------------- the stand-in itself
def test_stand_in_kernel_hand_cases():
    """The emulated kernel is bottom-right aligned and windows as flash's (left, right)."""
    v = torch.tensor([[[1.0]], [[2.0]], [[3.0]]], dtype=torch.float64)
    k = torch.zeros_like(v)
    q = torch.zeros(2, 1, 1, dtype=torch.float64)
    cu = lambda *a: torch.tensor(a)  # noqa: E731
    out = tv.flash_forward(q, k, v, cu(0, 2), cu(0, 3), 2, 3, True, None, -1, -1)  # Lq 2 < Lk 3
    assert out[:, 0, 0].tolist() == pytest.approx([1.5, 2.0])
    q3 = torch.zeros(3, 1, 1, dtype=torch.float64)
    out = tv.flash_forward(q3, k, v, cu(0, 3), cu(0, 3), 3, 3, False, None, 1, 0)  # window (1, 0): 2 keys
    assert out[:, 0, 0].tolist() == pytest.approx([1.0, 1.5, 2.5])
    out = tv.flash_forward(q3, k, v, cu(0, 3), cu(0, 3), 3, 3, False, None, 0, 0)  # window (0, 0): itself
    assert out[:, 0, 0].tolist() == pytest.approx([1.0, 2.0, 3.0])
    out = tv.flash_forward(q3, k, v, cu(0, 3), cu(0, 3), 3, 3, False, None, 5, 0)  # left >= max_k: causal
    assert out[:, 0, 0].tolist() == pytest.approx([1.0, 1.5, 2.0])


def test_stand_in_kernel_matches_reference_with_gqa_and_windows():
    g = torch.Generator().manual_seed(1)
    lq, lk = [5, 1, 9, 3], [5, 4, 12, 3]  # chunks: fewer queries than keys
    q = torch.randn(sum(lq), 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(sum(lk), 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    cq, ck = (torch.tensor(np.concatenate([[0], np.cumsum(x)])) for x in (lq, lk))
    for window in (None, 1, 3, 100):
        left = -1 if window is None else window - 1
        got = tv.flash_forward(q, k, v, cq, ck, max(lq), max(lk), window is None, 0.3, left, 0)
        ref = varlen_attention_reference(q, k, v, cq, ck, window=window, scaling=0.3)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------- emulated CP
@pytest.mark.parametrize("generation", ["2.13", "2.10"])
@pytest.mark.parametrize("window", [None, 1, 5, 16])
def test_varlen_backend_equals_full_attention_fwd_bwd(generation, window, monkeypatch):
    _use(monkeypatch, generation)
    seen_gather = seen_split = 0
    for pi, lens in enumerate(_packs()):
        q, k, v = _qkv(lens, seed=pi)
        ref = _full_reference(q, k, v, lens, window, 0.25)
        gout = torch.randn_like(ref)
        ref_grads = torch.autograd.grad(ref, (q, k, v), gout)
        for C in (1, 2, 3, 4):
            for strategy in STRATEGIES:
                plan = plan_shards(lens, C, strategy)
                seen_gather += C > 1 and len(plan.gathered_docs) > 0
                seen_split += len(plan.sharded_docs) > 0
                out = emulate_cp_attention(q, k, v, plan, backend="varlen", scaling=0.25, window=window)
                torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
                for g, rg in zip(torch.autograd.grad(out, (q, k, v), gout), ref_grads):
                    torch.testing.assert_close(g, rg, rtol=0, atol=1e-12)
                with torch.no_grad():
                    vr = emulate_cp_attention(q, k, v, plan, backend="varlen_reference", scaling=0.25, window=window)
                torch.testing.assert_close(out.detach(), vr, rtol=0, atol=1e-12)
    assert seen_gather > 15 and seen_split > 15
    assert tv.CALLS  # the stand-in ran
    if generation == "2.13":  # native GQA and the window as flash's (left, right)
        assert all(c["enable_gqa"] and c["kv_heads"] == 2 for c in tv.CALLS)
        want = (-1, 0) if window is None else (window - 1, 0)
        assert {c["window_size"] for c in tv.CALLS} <= {want, (-1, 0)} and any(c["window_size"] == want
                                                                              for c in tv.CALLS)
    else:  # no enable_gqa: K/V heads repeated to the 4 query heads
        assert all(c["kv_heads"] == 4 for c in tv.CALLS)
    assert all(c["scale"] == 0.25 for c in tv.CALLS)


@pytest.mark.parametrize("exchange", ["all_gather", "all_to_all"])
def test_varlen_backend_under_both_kv_exchanges(exchange, monkeypatch):
    """The gathered part reads the exchange's buffer (all-gather or all-to-all layout)."""
    _use(monkeypatch, "2.13")
    seen = 0
    for pi, lens in enumerate(_packs()[:2]):
        q, k, v = _qkv(lens, seed=pi)
        for window in (None, 5):
            ref = _full_reference(q, k, v, lens, window, None)
            gout = torch.randn_like(ref)
            ref_grads = torch.autograd.grad(ref, (q, k, v), gout)
            for C in (2, 4):
                plan = plan_shards(lens, C, "atp", kv_exchange=exchange)
                if len(plan.gathered_docs):
                    assert plan.kv_exchange == exchange
                    seen += 1
                out = emulate_cp_attention(q, k, v, plan, backend="varlen", window=window)
                torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
                for g, rg in zip(torch.autograd.grad(out, (q, k, v), gout), ref_grads):
                    torch.testing.assert_close(g, rg, rtol=0, atol=1e-12)
    assert seen >= 4


def test_varlen_backend_bf16_matches_reference_backend(monkeypatch):
    """In bf16 (the dtype it runs in on GPU) the stand-in path and varlen_reference agree to rounding."""
    _use(monkeypatch, "2.13")
    lens = [150, 30, 1, 2, 20, 1, 7]
    q, k, v = (t.detach().to(torch.bfloat16) for t in _qkv(lens, D=16))
    for window in (None, 16):
        plan = plan_shards(lens, 3, "atp")
        out = emulate_cp_attention(q, k, v, plan, backend="varlen", window=window)
        ref = emulate_cp_attention(q.double(), k.double(), v.double(), plan, backend="varlen_reference", window=window)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-2)


def test_torch_2_9_signature_runs_causal_and_refuses_what_it_cannot(monkeypatch):
    _use(monkeypatch, "2.9")
    lens = [150, 30, 1, 2, 20, 1, 7]
    q, k, v = _qkv(lens)
    plan = plan_shards(lens, 2, "atp")
    for window in (None, 150):  # a window covering every key run is plain causal: exact
        out = emulate_cp_attention(q, k, v, plan, backend="varlen", window=window)
        torch.testing.assert_close(out, _full_reference(q, k, v, lens, window, None), rtol=0, atol=1e-12)
    assert all(c["is_causal"] and c["kv_heads"] == 4 for c in tv.CALLS)
    with pytest.raises(NotImplementedError, match=r"torch 2\.9's varlen_attn has no window_size=.*sliding_window=16"
                                                  r".*attention_backend='flex', 'sdpa'"):
        emulate_cp_attention(q, k, v, plan, backend="varlen", window=16)
    with pytest.raises(NotImplementedError, match=r"torch 2\.9's varlen_attn has no scale=.*0\.25.*head_dim \*\* -0\.5"
                                                  r".*attention_backend='sdpa'"):
        emulate_cp_attention(q, k, v, plan, backend="varlen", scaling=0.25)


def test_varlen_attn_refuses_cpu_and_float32():
    lens = [10, 30]
    q, k, v = (t.detach() for t in _qkv(lens))
    if torch_varlen_attn() is not None and not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"'varlen' runs torch's flash kernels on CUDA only.*'cpu'.*"
                                             r"attention_backend='sdpa'"):
            emulate_cp_attention(q, k, v, plan_shards(lens, 2, "atp"), backend="varlen")
    fn = VarlenAttn.from_function(tv.varlen_attn_2_13, cuda_only=False)  # the real kernels' dtypes
    cu = torch.tensor([0, 10], dtype=torch.int32)
    with pytest.raises(TypeError, match=r"takes \['torch.float16', 'torch.bfloat16'\] inputs.*got torch.float64"
                                        r".*attention_backend='sdpa'"):
        x = torch.zeros(10, 1, 8, dtype=torch.float64)
        fn(x, x, x, cu, cu, 10, 10)


def test_signature_probe():
    fn = torch_varlen_attn()
    if fn is not None and "window_size" in __import__("inspect").signature(fn.fn).parameters:
        assert fn.takes_window and fn.takes_scale
    for gen, want in {"2.13": (False, True, True, True), "2.10": (False, True, True, False),
                      "2.9": (True, False, False, False)}.items():
        f = VarlenAttn.from_function(tv.GENERATIONS[gen])
        assert (f.takes_is_causal, f.takes_scale, f.takes_window, f.takes_gqa) == want
    with pytest.raises(NotImplementedError, match=r"neither is_causal= nor window_size=.*attention_backend='sdpa'"):
        VarlenAttn.from_function(lambda q, k, v, cu_q, cu_k, max_q, max_k: q, torch_version="2.0")


def test_attend_segment_varlen_equals_reference(monkeypatch):
    _use(monkeypatch, "2.10")
    g = torch.Generator().manual_seed(5)
    q = torch.randn(4, 20, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 50, 8, generator=g, dtype=torch.float64) for _ in range(2))
    for window in (None, 7):
        lo = 0 if window is None else 30 - window + 1
        got = backends.attend_segment("varlen", q, k[:, lo:], v[:, lo:], 30, 50, lo, window=window)
        ref = backends.attend_segment("varlen_reference", q, k[:, lo:], v[:, lo:], 30, 50, lo, window=window)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-13)


def test_cp1_whole_documents_need_no_row_gather():
    """At cp_size 1 every document is whole and local: no index copies of Q/K/V (the
    cp_size-1 overhead against plain varlen attention is bookkeeping only)."""
    plan = plan_shards([150, 30, 1, 2, 20], 1, "atp")
    for window in (None, 8):
        (local, gathered), inv = varlen._varlen_tables(plan.local_layout(0), window, "cpu", {})
        assert gathered is None and inv is None and local[0] is None and local[1] is None


# ---------------------------------------------------------------------------- auto
@pytest.fixture
def _flash_cache():
    varlen.flash_attn_installed.cache_clear()
    yield
    varlen.flash_attn_installed.cache_clear()


def test_auto_backend(monkeypatch, _flash_cache):
    assert backends.auto_backend("cpu") == "sdpa" and backends.resolve_backend("auto", "cpu") == "sdpa"
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # flash-attn absent
    for gen, want in (("2.13", "varlen"), ("2.10", "varlen"), ("2.9", "sdpa")):
        _use(monkeypatch, gen)
        assert backends.auto_backend("cuda") == want, gen
        assert backends.auto_backend("cuda", torch.bfloat16) == want
        assert backends.auto_backend("cuda", torch.float32) == "sdpa"  # the flash kernels take no fp32
        assert backends.auto_backend("cuda", torch.bfloat16, 128) == want
        assert backends.auto_backend("cuda", torch.bfloat16, 60) == backends.auto_backend("cuda", None, 512) == "sdpa"
    monkeypatch.setattr(varlen, "torch_varlen_attn", lambda: None)  # torch < 2.9
    assert backends.auto_backend("cuda") == "sdpa"
    varlen.flash_attn_installed.cache_clear()
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    assert backends.auto_backend("cuda", torch.float16) == "flash"
    assert backends.resolve_backend("auto", "cuda", torch.float32) == "sdpa"
    with pytest.raises(ValueError, match=r"unknown attention backend 'nope'; legal values: \['auto', .*'varlen'"):
        backends.resolve_backend("nope", "cpu")


def test_auto_dispatches_per_call(monkeypatch):
    """``auto`` decides per call from the inputs' device and dtype (so autocast's bf16 inputs
    would run the flash kernels); on CPU it is the sdpa backend, exactly."""
    lens = [150, 30, 1, 2, 20, 1, 7]
    q, k, v = _qkv(lens)
    plan = plan_shards(lens, 3, "atp")
    caches = [{} for _ in range(3)]
    out = emulate_cp_attention(q, k, v, plan, backend="auto", window=5, caches=caches)
    ref = emulate_cp_attention(q, k, v, plan, backend="sdpa", window=5)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert all(c[("auto", "cpu", torch.float64, 8)] == "sdpa" for c in caches)
    seen = []
    monkeypatch.setattr(backends, "auto_backend",
                        lambda dev, dt, hd: seen.append((str(dev), dt, hd)) or "varlen_reference")
    out = emulate_cp_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), plan, backend="auto")
    assert seen and all(s == ("cpu", torch.bfloat16, 8) for s in seen) and out.dtype == torch.bfloat16


def test_config_default_is_auto_and_varlen_checks(monkeypatch):
    cfg = ATACConfig()
    assert cfg.attention_backend == "auto" and cfg.resolved_attention_backend("cpu") == "sdpa"
    cfg.check_runtime("cpu")
    assert ATACConfig(attention_backend="sdpa").resolved_attention_backend("cuda") == "sdpa"
    with pytest.raises(ValueError, match=r"attention_backend='varlen' runs on CUDA only.*'cpu'.*'sdpa'"):
        ATACConfig(attention_backend="varlen").check_runtime("cpu")
    monkeypatch.setattr(varlen, "torch_varlen_attn", lambda: None)
    with pytest.raises(ValueError, match=r"'varlen' needs torch.nn.attention.varlen.varlen_attn \(torch >= 2.9\)"):
        ATACConfig(attention_backend="varlen").check_runtime("cuda")

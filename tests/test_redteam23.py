"""Red-team 23: ``ATACAccelerator`` loops with more than one module (a teacher, a reference model, a value
head, an EMA copy, PEFT after ``prepare``), CP 2 against CP 1 in float64.

Found silently wrong and now refused or exact:
- a teacher or reference model left on ``sdpa`` run on a CP shard (its split documents saw only this
  rank's part): refused by :mod:`atac_hf.attention.stock_guard`;
- the prepared model's own module trained after ``unwrap_model`` freed its DDP wrapper, or beside another
  prepared model's forward: refused by the forward check, which now watches the wrapped module too;
- a value head: ``prepare`` refused every non-transformers module, and the routes users then took skipped
  its gradient sum; a module of torch's per-token layers now passes through ``prepare`` (exact).
Also: the sharder's id and position checks keep the tightest of the models prepared (a bare
``IndexError`` before), the probe of ``check_model`` no longer silences ``UncheckedModelWarning`` for
the class it probed, ``fp8`` mixed precision prices K/V at 2 bytes, and ``plan`` / ``pack --model`` take
a checkpoint folder.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

from atac_hf.attention.stock_guard import guard_stock_attention, is_guarded
from atac_hf.integrations.forward_check import PreparedForwardCheck
from atac_hf.integrations.plain_modules import runs_no_attention

sys.path.insert(0, os.path.dirname(__file__))
from _launch import torchrun_json  # noqa: E402
from test_unprepared_module import Wrapper  # noqa: E402


def _llama(attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).double().eval()


def _shard(cp_size: int):
    return SimpleNamespace(plan=SimpleNamespace(cp_size=cp_size))


# ---------------------------------------------------------------------------- stock attention on a shard
def test_a_stock_attention_given_a_cp_shard_is_refused_and_otherwise_unchanged():
    from transformers import AttentionInterface

    guard_stock_attention()
    guard_stock_attention()  # idempotent: one wrapper each
    mapping = AttentionInterface._global_mapping
    assert all(is_guarded(fn) and not is_guarded(fn._atac_guarded) for name, fn in mapping.items() if name != "atac_cp")
    assert not is_guarded(mapping["atac_cp"])
    model = _llama("sdpa")
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(5), torch.arange(7)]).unsqueeze(0)
    with torch.no_grad():
        plain = model(input_ids=ids, position_ids=pos).logits
        assert torch.equal(model(input_ids=ids, position_ids=pos, atac_shard=_shard(1)).logits, plain)  # whole pack
        with pytest.raises(ValueError, match=r"LlamaAttention runs attn_implementation='sdpa' on a pack sharded over 2 "
                                             r"CP ranks.*attn_implementation='atac_cp'.*prepare_model\(model, "
                                             r"atac_config\)"):
            model(input_ids=ids, position_ids=pos, atac_shard=_shard(2))
    model.set_attn_implementation("eager")  # a modeling file's own eager function: not in the registry
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos, atac_shard=_shard(2))  # (not covered: documented)


def test_a_function_registered_after_the_guard_is_wrapped_at_the_next_shard():
    from transformers import AttentionInterface

    calls = []

    def mine(module, q, k, v, mask, **kw):
        calls.append(1)
        return q, None

    AttentionInterface.register("rt23_mine", mine)
    try:
        guard_stock_attention()
        fn = AttentionInterface._global_mapping["rt23_mine"]
        assert is_guarded(fn) and fn._atac_guarded is mine
        fn(None, 1, 2, 3, None, atac_shard=_shard(1))
        with pytest.raises(ValueError, match="attn_implementation='rt23_mine'"):
            fn(None, 1, 2, 3, None, atac_shard=_shard(4))
        assert calls == [1]
    finally:
        AttentionInterface._global_mapping.pop("rt23_mine", None)


def test_a_stock_attention_is_refused_for_a_plan_whose_cp_size_is_a_numpy_integer():
    """A hand-built ShardPlan may hold ``cp_size=np.int64(2)`` (validate and shard_batch take it); the guard
    checked ``isinstance(cp_size, int)`` and let a stock attention run on such a shard (white-box review 50)."""
    import numpy as np

    from atac_hf.sharding import ShardPlan, plan_shards

    guard_stock_attention()
    p = plan_shards([5, 7], 2, "per_doc")
    plan = ShardPlan(doc_lengths=p.doc_lengths, cp_size=np.int64(2), strategy="hand", segments=p.segments,
                     gathered_docs=p.gathered_docs, rank_compute_s=p.rank_compute_s)
    plan.validate()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), pytest.raises(ValueError, match="on a pack sharded over 2 CP ranks"):
        _llama("sdpa")(input_ids=ids, position_ids=torch.arange(6)[None], atac_shard=SimpleNamespace(plan=plan))


# ---------------------------------------------------------------------------- the forward check
def test_the_wrapped_module_outside_its_wrapper_is_refused_also_after_the_wrapper_is_freed():
    import gc

    check = PreparedForwardCheck()
    inner, other = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    wrapper, wrapper2 = Wrapper(inner), Wrapper(other)
    check.watch([wrapper, wrapper2])
    x = torch.ones(2, 3)
    check.on_shard()
    wrapper2(x)  # another prepared model's forward (a reference model) ...
    inner(x)  # ... does not vouch for this one
    with pytest.raises(ValueError, match=r"a model that accelerator\.prepare wrapped \(Linear, in Wrapper\) ran a forward "
                                         r"with autograd on only outside the wrapper"):
        check.before_backward()
    check.on_shard()
    wrapper(x)
    check.before_backward()
    with torch.no_grad():
        inner(x)  # an evaluation of the unwrapped module: fine
    check.on_shard()
    wrapper(x)
    check.before_backward()
    del wrapper, wrapper2
    gc.collect()
    assert len(check._watched) == 0
    check.on_shard()
    inner(x)  # the wrapper is gone (model = accelerator.unwrap_model(model)): still refused
    with pytest.raises(ValueError, match="outside the wrapper"):
        check.before_backward()
    check.on_shard()
    with pytest.raises(ValueError, match=r"no model returned by accelerator\.prepare \(Wrapper\)"):
        check.before_backward()  # and a loss with no prepared forward at all, as before


def test_copies_of_watched_modules_are_not_watched_and_pickle():
    check = PreparedForwardCheck()
    inner = torch.nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    check.watch([wrapper])
    ema, ema_wrapper = copy.deepcopy(inner), copy.deepcopy(wrapper)  # EMA copies: no copy of the check
    x = torch.ones(2, 3)
    ema(x)
    ema_wrapper(x)
    assert (check.num_bypassed, check.num_forwards) == (0, 0)
    buf = io.BytesIO()
    torch.save(inner, buf)  # a whole-module save: the hooks pickle as no-ops
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    loaded(x)
    assert torch.equal(loaded.weight, inner.weight) and check.num_bypassed == 0
    inner(x)
    assert check.num_bypassed == 1


# ---------------------------------------------------------------------------- modules beside the model
def test_modules_of_per_token_layers_pass_through_prepare_and_others_are_refused():
    nn = torch.nn
    assert runs_no_attention(nn.Linear(4, 1))
    assert runs_no_attention(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.1), nn.Linear(8, 1)))
    assert not runs_no_attention(nn.MultiheadAttention(4, 2))
    assert not runs_no_attention(nn.Sequential(nn.Linear(4, 4), nn.Conv1d(4, 4, 3)))

    class Pool(nn.Linear):  # a class of its own may mix tokens in forward: not passed through
        def forward(self, x):
            return super().forward(x.mean(dim=1, keepdim=True))

    assert not runs_no_attention(Pool(4, 1))
    assert not runs_no_attention(_llama())

    class PolicyWithValue(nn.Module):
        def __init__(self, lm, with_config):
            super().__init__()
            self.lm, self.v = lm, nn.Linear(32, 1)
            if with_config:
                self.config = lm.config

    for with_config in (False, True):
        wrapper = PolicyWithValue(_llama(), with_config)
        with pytest.raises(ValueError, match=r"PolicyWithValue holds a transformers model \(LlamaForCausalLM\) but is "
                                             r"not one.*accelerator\.prepare\(model, head, optimizer\)"):
            runs_no_attention(wrapper)
        assert wrapper.lm.config._attn_implementation == "sdpa"  # nothing changed


def test_prepare_passes_a_value_head_and_keeps_the_tightest_token_limits():
    from accelerate.state import AcceleratorState

    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.accelerate import ATACAccelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    AcceleratorState._reset_state(True)
    try:
        acc = ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True)
        policy = _llama("sdpa")
        big = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
        head = torch.nn.Linear(32, 1)
        policy, head = acc.prepare(policy, head)
        assert type(head) is torch.nn.Linear and policy.config._attn_implementation == "atac_cp"
        acc.prepare(big)  # a reference model with a larger vocabulary, shorter positions, prepared last
        assert acc.sharder.token_limits == (64, 64)
        batch = {"input_ids": torch.tensor([[1, 2, 63, 3]]), "labels": torch.tensor([[1, 2, 63, 3]]),
                 "position_ids": torch.tensor([[0, 1, 2, 3]])}
        acc.shard(batch)
        bad = {**batch, "input_ids": torch.tensor([[1, 2, 300, 3]])}
        with pytest.raises(ValueError, match=r"input_ids\[0, 2\] is 300, outside the model's input embedding table "
                                             r"of 64"):
            acc.shard(bad)
    finally:
        AcceleratorState._reset_state(True)


def test_fp8_mixed_precision_prices_kv_at_two_bytes(monkeypatch):
    from accelerate.state import AcceleratorState

    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.accelerate import ATACAccelerator
    from atac_hf.integrations.kv_bytes import HALF_AUTOCAST, model_kv_bytes_per_token

    assert "fp8" in HALF_AUTOCAST  # Accelerate's fp8 autocasts to bf16
    AcceleratorState._reset_state(True)
    try:
        acc = ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True)
        monkeypatch.setattr(ATACAccelerator, "mixed_precision", property(lambda self: "fp8"))
        model = acc.prepare(_llama("sdpa").float())
        assert acc.sharder.kv_bytes_per_token == model_kv_bytes_per_token(model, True) == \
            model_kv_bytes_per_token(model, False) / 2
    finally:
        AcceleratorState._reset_state(True)


def test_the_probe_does_not_silence_the_unchecked_warning_of_its_class():
    from atac_hf import check_model
    from atac_hf.attention import runtime

    from atac_hf.attention import model_check

    saved = set(runtime._WARNED)
    runtime._WARNED.clear()
    cached = dict(model_check._CACHE)
    model_check._CACHE.clear()  # the probe runs here, whatever verdicts earlier tests cached
    try:
        assert check_model(_llama("sdpa")).exact  # probes tiny copies of LlamaForCausalLM
        unchecked = _llama("sdpa")
        unchecked.set_attn_implementation("atac_cp")
        from atac_hf import plan_shards, shard_batch

        batch = {"input_ids": torch.tensor([[1, 2, 3]]), "position_ids": torch.tensor([[0, 1, 2]])}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with torch.no_grad():
                unchecked(**shard_batch(batch, plan_shards([3], 1), 0, None))
        assert any(issubclass(w.category, runtime.UncheckedModelWarning) for w in seen)
    finally:
        runtime._WARNED.clear()
        runtime._WARNED.update(saved)
        model_check._CACHE.update(cached)


def test_plan_and_pack_take_a_checkpoint_folder_as_model(tmp_path):
    from atac_hf._argtypes import model_arg, model_or_preset

    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
           "num_hidden_layers": 4, "intermediate_size": 512, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from atac_hf.cost import ModelDims

    dims = ModelDims.from_hf_config(cfg)  # (--model reads a config.json to its ModelDims since red-team 53)
    assert model_or_preset(str(tmp_path)) == model_arg(str(tmp_path)) == model_arg(str(tmp_path / "config.json")) == dims
    empty = tmp_path / "empty"
    empty.mkdir()
    assert model_or_preset(str(empty)) == str(empty)  # no config.json: left to the preset check (refused there)


# ---------------------------------------------------------------------------- CP 2 against CP 1
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {w: torchrun_json(w, "_redteam23_worker.py", tmp_path_factory.mktemp(f"rt23_{w}")) for w in (1, 2)}


@pytest.mark.slow
def test_a_teacher_on_sdpa_is_refused_at_cp2_on_every_rank(runs):
    assert runs[1]["teacher_sdpa"] is None  # CP 1: the rank holds the whole pack
    assert runs[2]["teacher_sdpa_ranks"] == 2 and "on a pack sharded over 2 CP ranks" in runs[2]["teacher_sdpa"]


@pytest.mark.slow
@pytest.mark.parametrize("key", ["kd_grad_norms", "head_grad_norms"])
def test_distillation_and_a_value_head_train_as_on_one_process(runs, key):
    one, two = runs[1][key], runs[2][key]
    assert len(one) == len(two) == 3
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(one, two)), (one, two)
    if key == "kd_grad_norms":
        assert math.isclose(runs[1]["kd_param_sum"], runs[2]["kd_param_sum"], rel_tol=1e-12)


@pytest.mark.slow
def test_the_unwrapped_module_after_its_wrapper_was_freed_is_refused_before_any_change(runs):
    assert runs[1]["unwrapped"] is None  # CP 1: no check (nothing to sum over CP ranks)
    assert runs[2]["unwrapped_ranks"] == 2 and "outside the wrapper" in runs[2]["unwrapped"]
    assert runs[2]["unwrapped_grads"] == 0 and runs[2]["unwrapped_changed"] == 0.0

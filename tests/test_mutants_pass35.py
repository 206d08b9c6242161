"""Thirty-fifth mutation pass: survivors of mutants planted by hand in red-team 23's fixes.

Killed here, in process (no process group): the stock-attention guard passing every argument on (the shard
keyword included) under the wrapped function's name, leaving ``atac_cp_attention`` registered under another name
and non-callable entries alone, and installed by ``shard_batch`` only at ``cp_size > 1``;
``PreparedForwardCheck``'s depth of nested wrappers, its ``max(0, ...)`` after a pre-hook that raised, its
``always_call`` exit after a forward that raised, a wrapper entered under ``no_grad`` (counted as inside it,
never as a forward), one count per bypassing forward of a module two wrappers share, and its hooks run outside
``torch.compile``; ``PER_TOKEN_LAYERS`` exactly (no per-token layer dropped, no token-mixing one added), a
compiled head looked through and a transformers model nested deeper than a child found; ``BatchSharder.bind_model``
keeping the tighter position limit in either order (or either one alone) and each tighter token limit whichever
model was prepared first (a ``None`` left out, two ``None`` kept), and ``ATACAccelerator`` passing the model's
learned position limit; ``check_architecture`` restoring ``_WARNED`` exactly (entries shown before kept, those
of the probe dropped, also when the probe raises); ``fp16`` in ``HALF_AUTOCAST`` and ``ATACTrainer``'s
``accelerator.mixed_precision`` (fp8 from the launch config) pricing K/V at 2 bytes.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_unprepared_module import Wrapper  # noqa: E402

from atac_hf.attention.stock_guard import guard_stock_attention, is_guarded  # noqa: E402
from atac_hf.integrations.forward_check import PreparedForwardCheck  # noqa: E402
from atac_hf.integrations.plain_modules import PER_TOKEN_LAYERS, runs_no_attention  # noqa: E402

nn = torch.nn


def _shard(cp_size: int):
    return SimpleNamespace(plan=SimpleNamespace(cp_size=cp_size))


@pytest.fixture
def registry():
    """transformers' global attention registry; the names a test adds are removed after it."""
    from transformers import AttentionInterface

    mapping = AttentionInterface._global_mapping
    before = set(mapping)
    yield mapping
    for name in set(mapping) - before:
        mapping.pop(name, None)


# ---------------------------------------------------------------------------- the stock-attention guard
def test_the_guard_passes_every_argument_on_under_the_wrapped_name(registry):
    # kills: ctx = kwargs.pop(atac_shard) (the wrapped function lost the keyword); fn(module, *args) without
    # **kwargs; no functools.wraps (the guard named "guarded", no __wrapped__)
    seen = []

    def p35_recording(module, q, k, v, mask, **kwargs):
        """A user's own attention."""
        seen.append((module, q, k, v, mask, kwargs))
        return q, None

    registry["p35_recording"] = p35_recording
    guard_stock_attention()
    fn = registry["p35_recording"]
    assert is_guarded(fn) and fn._atac_guarded is p35_recording
    assert (fn.__name__, fn.__doc__, fn.__wrapped__) == ("p35_recording", "A user's own attention.", p35_recording)
    ctx, mod = _shard(1), nn.Identity()
    assert fn(mod, 1, 2, 3, None, atac_shard=ctx, scaling=0.5, dropout=0.0) == (1, None)
    assert seen == [(mod, 1, 2, 3, None, {"atac_shard": ctx, "scaling": 0.5, "dropout": 0.0})]


def test_the_atac_function_under_another_name_and_non_callables_are_left_alone(registry):
    # kills: the `__name__ == "atac_cp_attention"` clause dropped (the atac attention registered under another
    # name was guarded: refused on every CP shard); `not callable(fn)` dropped (a non-function wrapped)
    from atac_hf.attention import register_attention
    from atac_hf.attention.runtime import atac_cp_attention

    register_attention("p35_atac")
    registry["p35_not_a_function"] = "eager"
    guard_stock_attention()
    assert registry["p35_atac"] is atac_cp_attention and not is_guarded(registry["p35_atac"])
    assert registry["p35_not_a_function"] == "eager"
    assert is_guarded(registry["sdpa"])


def test_shard_batch_installs_the_guard_only_over_more_than_one_rank(registry, monkeypatch):
    # kills: `if plan.cp_size > 1` -> `> 2` or `>= 1`, and the guard_stock_attention() call removed
    import atac_hf.attention.shard as shard_mod
    from atac_hf import plan_shards, shard_batch

    monkeypatch.setattr(shard_mod, "_check_group", lambda *a: None)  # a CP 2 shard without a process group

    def p35_later(module, q, k, v, mask, **kwargs):
        return q, None

    batch = {"input_ids": torch.tensor([[1, 2, 3, 4, 5, 6]]), "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2]])}
    registry["p35_later"] = p35_later  # registered after any earlier guard
    shard_batch(batch, plan_shards([3, 3], 1), 0, None)
    assert registry["p35_later"] is p35_later  # CP 1: the rank holds the whole pack
    out = shard_batch(batch, plan_shards([3, 3], 2), 0, None)
    assert is_guarded(registry["p35_later"]) and registry["p35_later"]._atac_guarded is p35_later
    with pytest.raises(ValueError, match="attn_implementation='p35_later' on a pack sharded over 2 CP ranks"):
        registry["p35_later"](None, 1, 2, 3, None, atac_shard=out["atac_shard"])


# ---------------------------------------------------------------------------- the forward check
def test_a_module_called_inside_a_nested_wrapper_is_not_a_bypass():
    # kills: `self._in_wrapper += 1` -> `= 1` (leaving the inner wrapper ended the outer one)
    a, b = nn.Linear(3, 1), nn.Linear(3, 1)
    wa, wb = Wrapper(a), Wrapper(b)

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.wa, self.b = wa, b

        def forward(self, x):
            return self.wa(x) + self.b(x)  # b directly, inside the outer wrapper

    outer = Wrapper(Both())
    check = PreparedForwardCheck()
    check.watch([wa, wb, outer])
    check.on_shard()
    outer(torch.ones(2, 3))
    assert (check.num_bypassed, check._in_wrapper) == (0, 0)
    check.before_backward()


def test_a_pre_hook_that_raised_before_the_check_does_not_hide_the_next_bypass():
    # kills: `max(0, self._in_wrapper - 1)` -> `self._in_wrapper - 1` (the always-called exit without an entry
    # left -1, truthy: every later forward of the module counted as inside its wrapper)
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)

    def refuse(module, args):
        raise RuntimeError("p35: a user's pre-hook refused")

    wrapper.register_forward_pre_hook(refuse)  # runs before the check's own
    check = PreparedForwardCheck()
    check.watch([wrapper])
    x = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="p35"):
        wrapper(x)
    assert check._in_wrapper == 0
    check.on_shard()
    inner(x)
    assert check.num_bypassed == 1
    with pytest.raises(ValueError, match="outside the wrapper"):
        check.before_backward()


def test_a_forward_that_raised_inside_the_wrapper_does_not_hide_the_next_bypass():
    # kills: register_forward_hook(..., always_call=True) -> without always_call (the exit skipped: the check
    # stayed "inside a wrapper" for good)
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    check = PreparedForwardCheck()
    check.watch([wrapper])
    with pytest.raises(RuntimeError):
        wrapper(torch.ones(2, 4))  # wrong width
    assert check._in_wrapper == 0
    with torch.no_grad():
        inner(torch.ones(2, 3))  # an evaluation: not a bypass
    inner(torch.ones(2, 3))
    assert check.num_bypassed == 1


def test_a_wrapper_entered_under_no_grad_is_not_a_forward_but_is_inside():
    # kills: _enter's `if torch.is_grad_enabled()` dropped (an evaluation vouched for an unprepared loss), and
    # `_in_wrapper += 1` moved under it (a wrapper that enables grad inside an evaluation was a bypass)
    inner, unwatched = nn.Linear(3, 1), nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    check = PreparedForwardCheck()
    check.watch([wrapper])
    x = torch.ones(2, 3)
    check.on_shard()
    with torch.no_grad():
        wrapper(x)
    unwatched(x)  # the loss of a module prepare did not return (and does not watch)
    assert check.num_forwards == 0
    with pytest.raises(ValueError, match=r"no model returned by accelerator\.prepare \(Wrapper\)"):
        check.before_backward()

    class GradWrapper(Wrapper):
        def forward(self, x):
            with torch.enable_grad():
                return self.module(x)

    inner2 = nn.Linear(3, 1)
    check2 = PreparedForwardCheck()
    wrapper2 = GradWrapper(inner2)
    check2.watch([wrapper2])
    with torch.no_grad():
        wrapper2(x)
    assert (check2.num_bypassed, check2.num_forwards) == (0, 0)


def test_a_module_two_wrappers_share_counts_each_bypassing_forward_once():
    # kills: `if inner not in self._inner` dropped (the module got one hook per wrapper: num_bypassed counted 2)
    inner = nn.Linear(3, 1)
    w1, w2 = Wrapper(inner), Wrapper(inner)
    check = PreparedForwardCheck()
    check.watch([w1])
    check.watch([w2])
    inner(torch.ones(2, 3))
    assert check.num_bypassed == 1
    assert len(inner._forward_pre_hooks) == 1


def test_the_hooks_run_as_python_under_torch_compile():
    # kills: @torch.compiler.disable removed from _Hook.__call__ (dynamo traced the counters and guarded on them)
    check = PreparedForwardCheck()
    compiling = []
    enter = check._enter

    def spy(module, args):
        compiling.append(torch.compiler.is_compiling())
        return enter(module, args)

    check._enter = spy  # (watch binds the instance attribute)
    inner = nn.Linear(3, 1)
    wrapper = Wrapper(inner)
    check.watch([wrapper])
    compiled = torch.compile(wrapper, backend="eager")
    x = torch.ones(2, 3)
    for _ in range(2):
        check.on_shard()
        compiled(x).sum().backward()
        check.before_backward()
    assert compiling == [False, False] and check.num_forwards == 2 and check.num_bypassed == 0


# ---------------------------------------------------------------------------- modules of per-token layers
def test_per_token_layers_are_exactly_these():
    # kills: any class dropped from PER_TOKEN_LAYERS, or a token-mixing one added
    assert set(PER_TOKEN_LAYERS) == {
        nn.Linear, nn.Identity, nn.Dropout, nn.LayerNorm, nn.RMSNorm, nn.Embedding, nn.ReLU, nn.GELU, nn.SiLU,
        nn.Tanh, nn.Sigmoid, nn.Softplus, nn.LeakyReLU, nn.ELU, nn.Mish, nn.Sequential, nn.ModuleList,
        nn.ModuleDict}
    per_token = [nn.Linear(4, 4), nn.Identity(), nn.Dropout(0.1), nn.LayerNorm(4), nn.RMSNorm(4), nn.Embedding(8, 4),
                 nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Tanh(), nn.Sigmoid(), nn.Softplus(), nn.LeakyReLU(), nn.ELU(),
                 nn.Mish(), nn.Sequential(nn.Linear(4, 4)), nn.ModuleList([nn.Linear(4, 4)]),
                 nn.ModuleDict({"v": nn.Linear(4, 1)})]
    for module in per_token:
        assert runs_no_attention(module), type(module).__name__
    mixing = [nn.Conv1d(4, 4, 3), nn.BatchNorm1d(4), nn.Softmax(dim=1), nn.AvgPool1d(2), nn.GRU(4, 4),
              nn.MultiheadAttention(4, 2), nn.Flatten(), nn.Sequential(nn.Linear(4, 4), nn.Softmax(dim=1))]
    for module in mixing:
        assert not runs_no_attention(module), type(module).__name__


def test_a_compiled_head_is_looked_through_and_a_nested_model_found():
    # kills: all(...) over `module.modules()` (the wrapper, not the head), `base = module` (no unwrapping), and the
    # transformers model searched among `base.children()` only
    from transformers import LlamaConfig, LlamaForCausalLM

    head = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    assert runs_no_attention(torch.compile(head))  # (compiled lazily: nothing runs)
    cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1)

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.parts = nn.ModuleDict({"lm": LlamaForCausalLM(cfg), "v": nn.Linear(8, 1)})

    with pytest.raises(ValueError, match=r"Policy holds a transformers model \(LlamaForCausalLM\) but is not one"):
        runs_no_attention(Policy())


# ---------------------------------------------------------------------------- bind_model
class _Vocab(nn.Module):
    """A model stand-in with an input table of ``ids`` rows and a head of ``labels`` outputs (None: absent)."""

    def __init__(self, ids, labels):
        super().__init__()
        self.emb = nn.Embedding(ids, 2) if ids else nn.Identity()
        self.head = nn.Linear(2, labels) if labels else None

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.head


def _sharder():
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.sharder import BatchSharder

    return BatchSharder(ATACConfig(cp_size=1, max_tokens=64))


def test_bind_model_keeps_the_tighter_position_limit_in_either_order():
    # kills: `also.position_limit[0] < position_limit[0]` -> `>`, `position_limit is None or` dropped (TypeError
    # with a model of computed positions prepared last), `also.position_limit is not None and` dropped (TypeError
    # with one prepared first), and the assignment of also.position_limit removed
    short, long = (16, "short table"), (48, "long table")
    cases = [(short, long, short), (long, short, short), (None, long, long), (long, None, long), (None, None, None)]
    for first, second, kept in cases:
        a, b = _sharder(), _sharder()
        a.bind_model(_Vocab(8, 8), first)
        b.bind_model(_Vocab(8, 8), second, also=a)
        assert b.position_limit == kept, (first, second)
    a = _sharder()
    a.bind_model(_Vocab(8, 8), long)
    a.bind_model(_Vocab(8, 8), short, also=None)
    assert a.position_limit == short  # without also: the model's own


def test_bind_model_keeps_each_tighter_token_limit_whichever_came_first():
    # kills: the token limits taken from zip(also, also) (the earlier model's only), `if n is not None` dropped
    # (min over None: TypeError), `default=None` -> `default=0` (an unknown limit refused every id), and
    # `also.token_limits is not None` dropped (zip(None): TypeError)
    cases = [((512, 512), (64, 80), (64, 80)), ((64, 80), (512, 512), (64, 80)), ((None, None), (64, 80), (64, 80)),
             ((64, None), (None, 80), (64, 80)), ((None, None), (None, None), (None, None))]
    for first, second, kept in cases:
        a, b = _sharder(), _sharder()
        a.bind_model(_Vocab(*first), None)
        b.bind_model(_Vocab(*second), None, also=a)
        assert b.token_limits == kept, (first, second)
    unbound, c = _sharder(), _sharder()  # a sharder never bound: nothing to tighten with
    c.bind_model(_Vocab(64, 80), None, also=unbound)
    assert (c.token_limits, c.position_limit) == ((64, 80), None)


def test_the_accelerator_binds_the_learned_position_limit_of_each_model(monkeypatch):
    # kills: `bind_model(model, learned_position_limit(model), ...)` -> `bind_model(model, None, ...)`
    from accelerate.state import AcceleratorState

    import atac_hf.integrations.accelerate as acc_mod
    from atac_hf.integrations import ATACConfig
    from transformers import LlamaConfig, LlamaForCausalLM

    limits = {}
    monkeypatch.setattr(acc_mod, "prepare_model", lambda model, config=None: model)  # (no probe: not its subject)
    monkeypatch.setattr(acc_mod, "learned_position_limit", lambda model: limits[id(model)])
    AcceleratorState._reset_state(True)
    try:
        acc = acc_mod.ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True)
        cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1)
        m1, m2 = LlamaForCausalLM(cfg), LlamaForCausalLM(cfg)
        limits[id(m1)], limits[id(m2)] = (40, "m1's table"), (24, "m2's table")
        acc.prepare(m1)
        assert acc.sharder.position_limit == (40, "m1's table")
        acc.prepare(m2)
        assert acc.sharder.position_limit == (24, "m2's table")
        batch = {"input_ids": torch.ones(1, 30, dtype=torch.long), "labels": torch.ones(1, 30, dtype=torch.long),
                 "position_ids": torch.arange(30).unsqueeze(0)}
        with pytest.raises(ValueError, match=r"a document of this pack has 30 tokens, but m2's table"):
            acc.shard(batch)
    finally:
        AcceleratorState._reset_state(True)


# ---------------------------------------------------------------------------- _WARNED around the probe
def test_the_probe_restores_the_shown_warnings_exactly_also_when_it_raises(monkeypatch):
    # kills: the restore removed, or against `warned = _WARNED` (no snapshot) or `warned = set()`, or made
    # `_WARNED.update(warned)` (the probe's classes stayed silenced), `.clear()` or `.difference_update(warned)`
    # (classes warned about before the probe warned again), or run only when the probe returns (`finally` ->
    # `else`: a probe that raised left its classes silenced). (test_redteam23's probe test runs no probe after the
    # other tests of its file: check_model's verdict for its config is cached by then)
    from atac_hf.attention import model_check, runtime
    from transformers import LlamaConfig, LlamaForCausalLM

    def probe(model_cls, tiny, **kwargs):
        runtime._WARNED.add("P35Probed (model_type 'llama')")  # what the probe's tiny copies record
        raise RuntimeError("p35: the probe failed")

    monkeypatch.setattr(model_check, "run_probe", probe)
    saved = set(runtime._WARNED)  # (the set model_check imported: changed in place)
    runtime._WARNED.clear()
    try:
        runtime._WARNED.add("P35Shown (model_type 'llama')")  # warned before the probe
        cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1)
        verdict = model_check.check_architecture(LlamaForCausalLM, cfg)
        assert not verdict.exact and "p35: the probe failed" in verdict.reason
        assert runtime._WARNED == {"P35Shown (model_type 'llama')"}
    finally:
        runtime._WARNED.clear()
        runtime._WARNED.update(saved)


# ---------------------------------------------------------------------------- K/V priced in the autocast dtype
def test_fp16_autocast_prices_kv_at_two_bytes_in_the_accelerator(monkeypatch):
    # kills: "fp16" or "fp8" dropped from HALF_AUTOCAST or "no" added; `half = str(self.mixed_precision) == "bf16"`
    # or `in ("bf16", "fp16")` in ATACAccelerator._setup_model; its cost model or kv_bytes_per_token without `half`
    from accelerate.state import AcceleratorState

    import atac_hf.integrations.accelerate as acc_mod
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.kv_bytes import HALF_AUTOCAST, model_kv_bytes_per_token
    from transformers import LlamaConfig, LlamaForCausalLM

    assert set(HALF_AUTOCAST) == {"bf16", "fp16", "fp8"}
    monkeypatch.setattr(acc_mod, "prepare_model", lambda model, config=None: model)
    AcceleratorState._reset_state(True)
    try:
        acc = acc_mod.ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True)
        cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1)
        model = LlamaForCausalLM(cfg)
        for mixed, width in (("fp16", 2), ("no", 4), ("fp8", 2), ("bf16", 2)):
            monkeypatch.setattr(acc_mod.ATACAccelerator, "mixed_precision", property(lambda self, m=mixed: m))
            acc.prepare(model)
            assert acc.sharder.kv_bytes_per_token == model_kv_bytes_per_token(model) * width / 4, mixed
            assert acc.sharder.cost_model.kv_bytes_per_token == acc.sharder.kv_bytes_per_token, mixed
    finally:
        AcceleratorState._reset_state(True)


def test_the_trainer_prices_kv_at_two_bytes_under_fp8_from_the_launch_config(tmp_path, monkeypatch):
    # kills: ATACTrainer's `half = bool(self.args.bf16 or self.args.fp16)` without `or accelerator.mixed_precision in
    # HALF_AUTOCAST` (`accelerate launch --mixed_precision fp8` sets neither flag: K/V were priced at 4 bytes)
    import accelerate
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    import atac_hf.integrations.trainer as trainer_mod
    from atac_hf import ATACConfig, ATACTrainer
    from atac_hf.integrations.kv_bytes import model_kv_bytes_per_token

    monkeypatch.setattr(trainer_mod, "prepare_model", lambda model, config=None: model)  # (no probe: not its subject)
    cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1)
    model = LlamaForCausalLM(cfg)  # fp32
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=1)
    with monkeypatch.context() as m:
        m.setattr(accelerate.Accelerator, "mixed_precision", property(lambda self: "fp8"))
        t = ATACTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": [[1, 2, 3]]}),
                        atac_config=ATACConfig(cp_size=1, max_tokens=64))
    assert not (args.bf16 or args.fp16)
    assert t.atac_sharder.kv_bytes_per_token == model_kv_bytes_per_token(model) / 2
    assert t.atac_sharder.cost_model.kv_bytes_per_token == t.atac_sharder.kv_bytes_per_token

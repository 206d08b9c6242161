"""Thirty-ninth mutation pass: survivors of mutants planted by hand in red-teams 29-30's changes.

Killed here, in process (no process group; a ``DistributedDataParallel`` built without ``__init__`` stands in for
DDP): :func:`head_refusal` on an object without an MRO, a name that only contains a head's suffix, and the
multiple-choice head; the head rule ahead of the encoder-decoder and attention-dropout rules, and
:func:`check_static`'s PEFT rule first, on the base model under a wrapper; the runtime guard counting each forward
afresh; ``_adapter_refusal``'s prompt-learning flag read as ``True`` only, adaption prompts by the prompt rule,
empty aLoRA tokens and ``layer_replication``, VeLoRA's dict default and its config object, every adapter of a model
read, three wrappers and ``_orig_mod`` looked through, the per-token list pinned; :class:`UnusedParameterCheck` on
DDP's own settings (``find_unused_parameters``, ``static_graph``), a ``before`` without its ``after``, one unused
parameter, the list cut at four, a gradient replaced by a new tensor; :meth:`PreparedForwardCheck.forwarded`;
``ATACAccelerator.prepare``'s kind check (every model before any change, heads as they are, AdaLoRA's regulariser
at 0 under CP) and ``backward``'s unused check (syncing steps only, read before the counts reset, checked after the
backward); ``ATACTrainer.__init__``'s kind check ahead of its loss check and ``training_step``'s unused check (CP
only, syncing steps only, the step's model, after the step, not over the step's own error, the trainer's fix);
``peft_configs`` / ``_peft_loss_weights`` / ``parameter_terms_off`` on wrapped models, bools, zeros and
non-numbers, every adapter and every weight named, sorted.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(__file__))

from atac_hf.attention.kind_rules import PER_TOKEN_PEFT_TYPES, head_refusal, peft_refusal  # noqa: E402
from atac_hf.attention.model_check import check_static, static_refusal  # noqa: E402
from atac_hf.integrations.forward_check import PreparedForwardCheck, UnusedParameterCheck  # noqa: E402

nn = torch.nn
UNUSED = r"trainable parameter\(s\) got no gradient in this backward"


def _llama_config(**over):
    from transformers import LlamaConfig

    kw = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0)
    return LlamaConfig(**{**kw, **over})


def _model(cls_name="LlamaForCausalLM", **over):
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, cls_name)(_llama_config(**over))


def _holder(configs, depth=1, via="module"):
    """A module carrying PEFT's ``peft_config`` dict under ``depth`` wrappers (``via``: DDP's ``module`` or
    torch.compile's ``_orig_mod``)."""
    inner = nn.Module()
    inner.peft_config = dict(configs)
    for _ in range(depth):
        outer = nn.Module()
        setattr(outer, via, inner)
        inner = outer
    return inner


def _lora(**kw):
    return SimpleNamespace(peft_type="LORA", **kw)


# ---------------------------------------------------------------------------- head_refusal / static order
def test_a_class_like_object_without_an_mro_is_read_by_its_own_name():
    # kills K02: the fallback `(model_cls,)` for an object without __mro__ made `()` (nothing read: passed)
    fake = SimpleNamespace(__name__="TaggerForTokenClassification")
    assert not hasattr(fake, "__mro__")
    exc, why = head_refusal(fake)
    assert exc is ValueError and why.startswith("is a TokenClassification head: it labels each token")


def test_a_head_suffix_counts_only_at_the_end_of_a_class_name():
    # kills K03: `name.endswith(suffix)` -> `suffix in name`: a causal LM mixing in a class whose name only
    # contains "ForSequenceClassification" was refused as a sequence classifier
    from transformers import LlamaForCausalLM

    class ForSequenceClassificationExportMixin:
        pass

    class ScoredForCausalLM(LlamaForCausalLM, ForSequenceClassificationExportMixin):
        pass

    assert head_refusal(ScoredForCausalLM) is None


def test_a_multiple_choice_head_is_refused():
    # kills K08: the "ForMultipleChoice" entry of HEAD_SUFFIXES dropped (the suite covers the other three heads)
    from transformers import RobertaForMultipleChoice

    exc, why = head_refusal(RobertaForMultipleChoice)
    assert exc is ValueError
    assert why.startswith("is a MultipleChoice head: it scores one choice per row, but a packed row holds several "
                          "documents; atac-hf trains causal LMs")


def test_the_head_rule_comes_before_the_encoder_decoder_and_dropout_rules():
    # kills M02 (head rule moved after the encoder-decoder rule: BART's classifier was named an encoder-decoder)
    # and M03 (moved to the end: a token classifier with attention dropout was told to set the dropout to 0,
    # after which it would be refused again for its head)
    from transformers import BartConfig, BartForSequenceClassification, LlamaForTokenClassification

    bart = BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32)
    assert bart.is_encoder_decoder
    exc, why = static_refusal(BartForSequenceClassification, bart)
    assert exc is ValueError and why.startswith("is a SequenceClassification head")
    exc, why = static_refusal(LlamaForTokenClassification, _llama_config(attention_dropout=0.1))
    assert exc is ValueError and why.startswith("is a TokenClassification head")
    from transformers import LlamaForCausalLM

    assert static_refusal(LlamaForCausalLM, _llama_config(attention_dropout=0.1))[1].startswith(
        "has attention dropout")  # (the dropout rule itself still runs)


def test_check_static_reads_the_base_model_under_a_wrapper_and_the_peft_rule_first():
    # kills M06: static_refusal(type(model), ...) (the wrapper's class: "Holder.forward takes no **kwargs", not its
    # head) and M04: the static rules before the PEFT rule (a prompt-tuned classifier named by its head; check_model
    # always named the adapter first)
    tagger = _model("LlamaForTokenClassification", num_labels=3)

    class Holder(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)

    with pytest.raises(ValueError, match=r"^LlamaForTokenClassification \(model_type 'llama'\) is a "
                                         r"TokenClassification head: it labels each token"):
        check_static(Holder(tagger))
    prompted = Holder(tagger)
    prompted.peft_config = {"p": SimpleNamespace(peft_type="PROMPT_TUNING", is_prompt_learning=True)}
    with pytest.raises(NotImplementedError, match=r"^LlamaForTokenClassification \(model_type 'llama'\) is wrapped "
                                                  r"by a PEFT PROMPT_TUNING adapter \('p'\)"):
        check_static(prompted)


def test_the_guard_counts_each_forward_afresh():
    # kills M14: ctx.begin_forward() dropped from the guard's pre-hook (an attention module recorded by an earlier
    # forward over the same shard context counted for a later forward in which no layer ran atac_cp)
    import numpy as np

    from atac_hf import check_model
    from atac_hf.attention import SHARD_KWARG
    from atac_hf.attention.shard import ShardContext
    from atac_hf.sharding import plan_shards

    model = _model()
    check_model(model)
    guard = model._atac_cp_guard
    plan = plan_shards(np.array([9, 7]), 1, "atp")
    ctx = ShardContext(plan=plan, rank=0, layout=plan.local_layout(0))
    ctx.record_attention(model.model.layers[0].self_attn)  # the earlier forward's only layer
    guard.after(model, (), {SHARD_KWARG: ctx}, None)  # (that forward: accepted)
    guard.before(model, (), {SHARD_KWARG: ctx})  # the next forward, whose layer does not run atac_cp
    assert ctx.reached_modules() == []
    with pytest.raises(ValueError, match=r"^LlamaForCausalLM ran under a shard context .* but no layer ran"):
        guard.after(model, (), {SHARD_KWARG: ctx}, None)


# ---------------------------------------------------------------------------- _adapter_refusal
def test_only_a_prompt_learning_flag_that_is_true_refuses():
    # kills K14: `is True` dropped (a truthy non-bool, e.g. a mock's attribute, read as prompt learning: a LoRA
    # refused with the virtual-token reason); PEFT's configs carry a bool
    assert peft_refusal(_holder({"a": _lora(is_prompt_learning=mock.MagicMock())})) is None
    assert "virtual tokens" in peft_refusal(_holder({"a": _lora(is_prompt_learning=True)}))[1]


def test_adaption_prompts_are_refused_with_the_prompt_reason():
    # kills K15: `or kind == "ADAPTION_PROMPT"` dropped from the prompt rule (PEFT's AdaptionPromptConfig is not
    # prompt learning by its flag: it fell through to the cross-token table's other wording); K18, that table's
    # ADAPTION_PROMPT entry dropped, is equivalent (the prompt rule answers first)
    peft = pytest.importorskip("peft")

    cfg = peft.AdaptionPromptConfig(task_type="CAUSAL_LM", adapter_len=2, adapter_layers=1)
    assert cfg.is_prompt_learning is False
    exc, why = peft_refusal(_holder({"ap": cfg}))
    assert exc is NotImplementedError
    assert why.startswith("is wrapped by a PEFT ADAPTION_PROMPT adapter ('ap'): its virtual tokens or key/value "
                          "prefixes are attended to by every query")


def test_empty_alora_tokens_and_an_empty_layer_replication_pass():
    # kills K28 (`if tokens:` -> `is not None`) and K30 (layer_replication `is not None`): an empty list
    # activates nothing and copies no layer, and PEFT's LoraConfig passes such lists on as given
    assert peft_refusal(_holder({"a": _lora(alora_invocation_tokens=[], layer_replication=[])})) is None
    assert peft_refusal(_holder({"a": _lora(alora_invocation_tokens=None, layer_replication=None)})) is None


def test_velora_refused_by_its_dict_default_and_its_config_object():
    # kills K31: the dict's default init_type made "random" (a dict without it is PEFT's default, the batch mean);
    # K33: the config-object form not read (init None: its "random" refused); K34: its default "random" (an object
    # without init_type passed); K36 (`== "batch_average"`) and K37 (None also passed): any init but "random"
    def why(velora):
        got = peft_refusal(_holder({"v": _lora(velora_config=velora)}))
        return None if got is None else got[1]

    assert "VeLoRA (init_type='batch_average')" in why({})
    assert why(SimpleNamespace(init_type="random")) is None
    assert "VeLoRA (init_type='batch_average')" in why(SimpleNamespace(init_type="batch_average"))
    assert "VeLoRA (init_type=None)" in why(SimpleNamespace())
    assert "VeLoRA (init_type='ema')" in why({"init_type": "ema"})
    assert why(None) is None


def test_every_adapter_of_a_model_is_read():
    # kills K38: only the first adapter of peft_config read (a Lily adapter added second passed)
    exc, why = peft_refusal(_holder({"first": _lora(), "second": SimpleNamespace(peft_type="LILY")}))
    assert exc is NotImplementedError and "PEFT LILY adapter ('second')" in why


def test_peft_configs_are_found_under_three_wrappers_and_under_orig_mod():
    # kills K39 (two levels looked through: DDP around a compiled PEFT model missed) and K41 (torch.compile's
    # _orig_mod not followed); K42: a `module` attribute that is not a module (a name) followed instead of _orig_mod
    lily = {"x": SimpleNamespace(peft_type="LILY")}
    assert peft_refusal(_holder(lily, depth=3)) is not None
    assert peft_refusal(_holder(lily, via="_orig_mod")) is not None
    compiled = _holder(lily, via="_orig_mod")
    compiled.__dict__["module"] = "backbone"  # (not a module: not a wrapper's)
    assert peft_refusal(compiled) is not None


def test_the_per_token_list_is_the_measured_one():
    # kills K24 (and any other widening): red-team 29 measured these types exact at cp_size 1 and 2; a type added
    # unmeasured (BONE here) would pass silently
    assert PER_TOKEN_PEFT_TYPES == {
        "LORA", "ADALORA", "ADAMSS", "BOFT", "IA3", "BEFT", "LOHA", "LOKR", "OFT", "LN_TUNING", "VERA", "FROD",
        "PVERA", "FOURIERFT", "GLORA", "HRA", "VBLORA", "UNILORA", "MISS", "RANDLORA", "ROAD",
        "TRAINABLE_TOKENS", "HIRA", "SHIRA", "C3A", "WAVEFT", "OSF", "DELORA", "GRALORA", "TINYLORA", "PSOFT",
        "PEANUT", "SHADOW", "SUPERTUNING", "DEFT"}
    assert peft_refusal(_holder({"b": SimpleNamespace(peft_type="BONE")})) is not None


# ---------------------------------------------------------------------------- UnusedParameterCheck
class FakeDDP(DDP):
    """A DistributedDataParallel without a process group: its settings as attributes, its forward the module's."""

    def __init__(self, module, find_unused_parameters=False, static_graph=False, ignore=()):
        nn.Module.__init__(self)
        self.module = module
        self.find_unused_parameters, self.static_graph = find_unused_parameters, static_graph
        self.parameters_to_ignore = set(ignore)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class Net(nn.Module):
    """``n`` linear layers; ``forward`` uses the first ``used`` of them."""

    def __init__(self, n=2, used=1):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(n)])
        self.used = used

    def forward(self, x, **kwargs):
        for layer in self.layers[:self.used]:
            x = layer(x)
        return SimpleNamespace(loss=x.pow(2).sum())


def test_ddp_that_finds_unused_parameters_or_has_a_static_graph_is_not_checked():
    # kills F02 (find_unused_parameters not read: a DDP that finds them itself refused) and F03 (static_graph not
    # read); F01's non-DDP wrapper is the suite's
    check = UnusedParameterCheck()
    x = torch.ones(1, 2)
    for kw in ({"find_unused_parameters": True}, {"static_graph": True}):
        w = FakeDDP(Net(), **kw)
        check.before([w])
        assert check._seen == []
        w(x).loss.backward()
        check.after()
    w = FakeDDP(Net())
    check.before([w])
    w(x).loss.backward()
    with pytest.raises(ValueError, match=rf"^2 {UNUSED} \(layers\.1\.weight, layers\.1\.bias\)"):
        check.after()


def test_a_wrapper_that_is_not_ddp_is_not_checked_whatever_its_settings():
    # kills F01: the isinstance(DDP) test dropped (a wrapper of another kind carrying DDP-like settings, e.g. one
    # built by a library of its own, was checked: DDP's bucket rule is DDP's)
    from test_unprepared_module import Wrapper

    w = Wrapper(Net())
    w.find_unused_parameters, w.static_graph = False, False
    check = UnusedParameterCheck()
    assert not check._watched(w)
    check.before([w])
    assert check._seen == []


def test_a_before_without_its_after_is_forgotten_at_the_next_before():
    # kills F06: `self._seen = []` dropped from before(): a backward refused before it ran (its after() never
    # called) left its notes, and the next step was refused for the old step's parameters
    check = UnusedParameterCheck()
    stale, fresh = FakeDDP(Net()), FakeDDP(Net(n=1))
    check.before([stale])  # (then the backward was refused by another check: no after())
    check.before([fresh])
    fresh(torch.ones(1, 2)).loss.backward()
    check.after()


def test_one_unused_parameter_is_refused():
    # kills F23: `if unused` -> `if len(unused) > 1` (a single parameter left out passed)
    inner = Net(n=1)
    inner.scale = nn.Parameter(torch.ones(()))
    check = UnusedParameterCheck()
    check.before([FakeDDP(inner)])
    inner(torch.ones(1, 2)).loss.backward()
    with pytest.raises(ValueError, match=rf"^1 {UNUSED} \(scale\) while DDP"):
        check.after()


@pytest.mark.parametrize("n,listed", [
    (3, r"^4 {} \(layers\.1\.weight, layers\.1\.bias, layers\.2\.weight, layers\.2\.bias\) while"),
    (4, r"^6 {} \(layers\.1\.weight, layers\.1\.bias, layers\.2\.weight, layers\.2\.bias and 2 more\) while")])
def test_the_message_lists_four_names_then_counts_the_rest(n, listed):
    # kills F13 (`> 4` -> `>= 4`: four names then " and 0 more"), F14 (`- 4` -> `- 3`: "and 3 more" of six),
    # F15/F16 (three or five names listed)
    inner = Net(n=n)
    check = UnusedParameterCheck()
    check.before([FakeDDP(inner)])
    inner(torch.ones(1, 2)).loss.backward()
    with pytest.raises(ValueError, match=listed.format(UNUSED)):
        check.after()


def test_a_gradient_replaced_by_a_new_tensor_of_the_same_version_counts_as_a_gradient():
    # kills F19: the stamp reduced to the gradient's version (a backward with create_graph=True writes a new
    # .grad tensor, version 0 like the one it replaced: read as no gradient)
    inner = Net(n=1)
    for p in inner.parameters():
        p.grad = torch.zeros_like(p)
    old = [p.grad for p in inner.parameters()]  # (held: a freed one's id could be the new one's; see TESTING.md)
    check = UnusedParameterCheck()
    check.before([FakeDDP(inner)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (create_graph's reference-cycle warning)
        inner(torch.ones(1, 2)).loss.backward(create_graph=True)
    assert all(p.grad is not g and p.grad._version == g._version == 0 for p, g in zip(inner.parameters(), old))
    check.after()
    for p in inner.parameters():
        p.grad = None  # (break create_graph's cycle)


def test_forwarded_lists_the_wrappers_that_ran_a_forward_with_autograd_through_themselves():
    # kills F20 (every watched wrapper listed: a prepared reference model's unused parameters refused) and F21 (the
    # forwards outside the wrapper read instead of through it)
    check = PreparedForwardCheck()
    a, b, c = FakeDDP(Net()), FakeDDP(Net()), FakeDDP(Net())
    check.watch([a, b, c])
    x = torch.ones(1, 2)
    assert check.forwarded() == []
    a(x)
    with torch.no_grad():
        b(x)  # an evaluation: no backward expected
    c.module(x)  # outside its wrapper only
    assert check.forwarded() == [a]


# ---------------------------------------------------------------------------- ATACAccelerator
def _bare_accelerator(monkeypatch, cp, *, kind_check=True):
    """An ATACAccelerator with no process group: Accelerate's prepare wraps each module in FakeDDP, its backward
    runs autograd's."""
    from test_mutants_pass30 import make_bare_accelerator

    setups = []
    acc = make_bare_accelerator(monkeypatch, cp, wrap=FakeDDP, backward=lambda self, loss, **kw: loss.backward(**kw),
                                setup=lambda m: setups.append(type(m).__name__), kind_check=kind_check)
    return acc, setups


def test_prepare_checks_every_models_kind_before_it_changes_any(monkeypatch):
    # kills A01 (no kind check in prepare: the causal LM passed first was switched before the token classifier
    # was refused) and A08 (the kind checked only under CP: at cp_size 1 likewise)
    acc, setups = _bare_accelerator(monkeypatch, 1)
    with pytest.raises(ValueError, match=r"^LlamaForTokenClassification \(model_type 'llama'\) is a "
                                         r"TokenClassification head"):
        acc.prepare(_model(), _model("LlamaForTokenClassification", num_labels=3))
    assert setups == []


def test_prepare_passes_a_value_head_without_checking_its_kind(monkeypatch):
    # kills A02: the kind check run over every module passed (a torch value head has no transformers config:
    # refused), not over the models prepare switches
    acc, setups = _bare_accelerator(monkeypatch, 1)
    model, head = acc.prepare(_model(), nn.Linear(16, 1))
    assert setups == ["LlamaForCausalLM"] and isinstance(head.module, nn.Linear)


def test_prepare_under_cp_checks_the_loss_with_adaloras_regulariser_at_0(monkeypatch):
    # kills A03: prepare's loss check without parameter_terms=True (AdaLoRA refused though exact in this loop)
    peft = pytest.importorskip("peft")
    import _dist

    model = peft.get_peft_model(_dist.tiny_model("llama", torch.float32), peft.AdaLoraConfig(
        task_type="CAUSAL_LM", init_r=2, target_r=1, target_modules=["q_proj", "v_proj"], total_step=10))
    assert model.peft_config["default"].orth_reg_weight == 0.5
    acc, setups = _bare_accelerator(monkeypatch, 2)
    acc.prepare(model)
    assert len(setups) == 1 and model.peft_config["default"].orth_reg_weight == 0.5


def test_backward_under_cp_refuses_an_unused_parameter_at_a_syncing_step_only(monkeypatch):
    # kills A05 (nothing noted), A06 (forwarded() read after before_backward() reset the counts: nothing noted),
    # A07 (no after()), A09 (after() before the backward: every parameter refused), A04 (checked at a step that
    # does not sync: DDP's no_sync reduces nothing there), F20 via the loop (a prepared reference model that ran
    # no forward is not checked)
    acc, _ = _bare_accelerator(monkeypatch, 2, kind_check=False)
    model, reference = acc.prepare(Net(n=2, used=1), Net(n=1))
    x = torch.ones(1, 2)
    with pytest.raises(ValueError, match=rf"^2 {UNUSED} \(layers\.1\.weight, layers\.1\.bias\).*Fix: ATACAccelerator"
                                         r"\(\.\.\., kwargs_handlers=\[DistributedDataParallelKwargs\("):
        acc.backward(model(x).loss)
    model.module.used = 2
    acc.backward(model(x).loss)  # every parameter reached; the reference model ran no forward
    model.module.used = 1
    acc.sync_gradients = False
    acc.backward(model(x).loss)  # an accumulation step: not checked
    acc.sync_gradients = True
    one, _ = _bare_accelerator(monkeypatch, 1, kind_check=False)
    m1 = one.prepare(Net(n=2, used=1))
    one.backward(m1(x).loss)  # cp_size 1: nothing watched


# ---------------------------------------------------------------------------- ATACTrainer.training_step
def _step_trainer(monkeypatch, cp, wrapper, *, sync=True, fail=False):
    from transformers import Trainer

    from atac_hf.integrations.trainer import ATACTrainer

    def step(self, model, inputs, *args, **kwargs):
        loss = model(torch.ones(1, 2)).loss
        if fail:
            raise RuntimeError("the step's own error")
        self.accelerator.backward(loss)
        return loss.detach()

    monkeypatch.setattr(Trainer, "training_step", step)
    t = ATACTrainer.__new__(ATACTrainer)
    t.atac_config, t.atac_tp_size, t.label_smoother = SimpleNamespace(cp_size=cp), 1, None
    t.model, t._atac_base, t.args = wrapper.module, wrapper.module, SimpleNamespace(world_size=cp)
    t.accelerator = SimpleNamespace(backward=lambda loss, **kw: loss.backward(**kw), _models=[wrapper],
                                    sync_gradients=sync)
    return t


def test_the_trainers_step_refuses_an_unused_parameter_under_cp_at_a_syncing_step(monkeypatch):
    # kills T04 (no after()), T06 (the accelerator's fix named, not TrainingArguments') and T07 (self.model, not
    # the step's DDP wrapper, noted: nothing watched)
    w = FakeDDP(Net(n=2, used=1))
    t = _step_trainer(monkeypatch, 2, w)
    with pytest.raises(ValueError, match=rf"^2 {UNUSED} \(layers\.1\.weight, layers\.1\.bias\).*Fix: "
                                         r"TrainingArguments\(ddp_find_unused_parameters=True\), or freeze"):
        t.training_step(w, {})
    w.module.used = 2
    t.training_step(w, {})


@pytest.mark.parametrize("cp,sync", [(1, True), (2, False)])
def test_the_trainers_step_checks_nothing_at_cp_size_1_or_a_step_that_does_not_sync(monkeypatch, cp, sync):
    # kills T02 (checked at cp_size 1) and T03 (checked at an accumulation step)
    w = FakeDDP(Net(n=2, used=1))
    _step_trainer(monkeypatch, cp, w, sync=sync).training_step(w, {})


def test_the_trainers_step_raises_its_own_error_not_the_unused_check(monkeypatch):
    # kills T05: after() in the `finally` (a step that failed before its backward was reported as parameters
    # without gradients, hiding its own error)
    w = FakeDDP(Net(n=1))
    t = _step_trainer(monkeypatch, 2, w, fail=True)
    with pytest.raises(RuntimeError, match="the step's own error"):
        t.training_step(w, {})
    assert not t._atac_training_step


# ---------------------------------------------------------------------------- PEFT loss weights
def test_loss_weights_are_read_through_wrappers_and_only_non_zero_numbers_named():
    # kills G02 (one level read: DDP around PEFT named nothing), G03 (_orig_mod not followed), G04 (bools named),
    # G05 (zeros named), G06 (non-numbers named), G08 (`in` -> `endswith`: a field that contains "loss_weight"
    # but does not end with it dropped), G09 (unsorted), G18 (the first adapter only)
    from atac_hf.integrations.trainer_guards import _peft_loss_weights

    cfg = SimpleNamespace(peft_type="X", z_loss_weight=0.25, kl_loss_weight=0.1, use_loss_weight=True,
                          aux_loss_weight=0, orth_reg_weight=None, name_loss_weight="0.5", loss_weight_scale=2)
    other = SimpleNamespace(peft_type="Y", orth_reg_weight=0.5)
    want = [("a", "kl_loss_weight", 0.1), ("a", "loss_weight_scale", 2), ("a", "z_loss_weight", 0.25),
            ("b", "orth_reg_weight", 0.5)]
    assert _peft_loss_weights(_holder({"a": cfg, "b": other}, depth=1)) == want
    assert _peft_loss_weights(_holder({"a": cfg, "b": other}, depth=3)) == want
    assert _peft_loss_weights(_holder({"a": cfg, "b": other}, via="_orig_mod")) == want


def test_parameter_terms_off_zeroes_numeric_weights_only_through_wrappers_and_puts_them_back():
    # kills G02/G03 for parameter_terms_off (a wrapped AdaLoRA's regulariser not set to 0) and G12 (`hasattr`: a
    # field that is not a number, e.g. None, set to 0.0 during the check)
    from atac_hf.integrations.trainer_guards import parameter_terms_off

    for depth, via in ((2, "module"), (1, "_orig_mod")):
        ada, odd = SimpleNamespace(orth_reg_weight=0.5), SimpleNamespace(orth_reg_weight=None)
        with parameter_terms_off(_holder({"a": ada, "o": odd}, depth=depth, via=via)):
            assert ada.orth_reg_weight == 0.0 and odd.orth_reg_weight is None
        assert ada.orth_reg_weight == 0.5 and odd.orth_reg_weight is None


def test_the_loss_refusal_names_every_loss_weight():
    # kills G17: only the first (adapter, weight) named in loss_scale_refusal's message
    from test_mutants_pass30 import TinyLM

    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    model = TinyLM("mean")
    model.peft_config = {"a": SimpleNamespace(kl_loss_weight=0.1), "b": SimpleNamespace(auxiliary_loss_weight=0.2)}
    why = loss_scale_refusal(model, False, 2)
    assert why.startswith("its loss ignores num_items_in_batch")
    assert why.endswith("; its PEFT adapter 'a' adds a loss term of its own (kl_loss_weight=0.1: set it to 0); its "
                        "PEFT adapter 'b' adds a loss term of its own (auxiliary_loss_weight=0.2: set it to 0)")


# ---------------------------------------------------------------------------- ATACTrainer.__init__
def test_the_trainer_names_a_heads_kind_before_its_loss_check(tmp_path):
    # kills T01: no kind check at the top of ATACTrainer.__init__ (a token classifier that declares
    # accepts_loss_kwargs=False was refused first by the loss check, "ignores num_items_in_batch", and a user who
    # fixed that hit the head rule after)
    import datasets
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer

    model = _model("LlamaForTokenClassification", num_labels=3)
    model.accepts_loss_kwargs = False
    ds = datasets.Dataset.from_dict({"input_ids": [[1 + i] * (5 + i) for i in range(8)],
                                     "labels": [[i % 3] * (5 + i) for i in range(8)]})
    args = TrainingArguments(str(tmp_path), max_steps=1, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match=r"^LlamaForTokenClassification \(model_type 'llama'\) is a "
                                         r"TokenClassification head: it labels each token"):
        ATACTrainer(model=model, args=args, train_dataset=ds, atac_config=ATACConfig(cp_size=1, max_tokens=64))
    assert model.config._attn_implementation != "atac_cp"


# ---------------------------------------------------------------------------- the pass's two findings, fixed
def test_a_router_flag_of_any_truthy_value_is_refused_per_call_and_in_the_config():
    # was (M10, left alive as the fix): `is True` let 1, np.True_ and torch.tensor(True) through the guard under CP,
    # though Mixtral adds its router loss for any truthy value (`if output_router_logits:`)
    import numpy as np
    from transformers import MixtralConfig

    from atac_hf.attention.model_check import _on, router_loss_refusal

    for on in (True, 1, np.bool_(True), torch.tensor(True), torch.tensor([1, 1])):
        assert _on(on)
    for off in (False, 0, None, np.bool_(False), torch.tensor(False)):
        assert not _on(off)
    assert "config.output_router_logits=True" in router_loss_refusal(MixtralConfig(output_router_logits=True))[1]
    cfg = SimpleNamespace(router_aux_loss_coef=0.5, output_router_logits=np.bool_(True))  # (a config of its own)
    assert "config.output_router_logits=True" in router_loss_refusal(cfg)[1]
    cfg.output_router_logits = np.bool_(False)
    assert router_loss_refusal(cfg) is None


def test_the_stamp_holds_the_gradient_itself_so_a_new_one_never_reads_as_the_old():
    # was: the stamp kept id(p.grad); a .grad replaced by a new tensor (create_graph=True) at the freed old one's
    # address, version 0 like it, read as "no gradient" (about 1 run in 3 of the helper's repro)
    import weakref

    from atac_hf.integrations.forward_check import _Stamp

    p = nn.Parameter(torch.zeros(2))
    p.grad = torch.zeros(2)
    stamp = _Stamp(p.grad)
    old = weakref.ref(p.grad)
    p.grad = torch.zeros(2)  # the old gradient dropped by the parameter: the stamp keeps it alive
    assert old() is not None and not stamp.unchanged(p)
    stamp = _Stamp(p.grad)
    assert stamp.unchanged(p)
    p.grad.add_(1.0)  # accumulated in place: a new version
    assert not stamp.unchanged(p)
    assert _Stamp(None).unchanged(nn.Parameter(torch.zeros(1)))

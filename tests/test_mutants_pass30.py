"""Thirtieth mutation pass (issue 20 habit): survivors of mutants planted by hand in red-team 20's code.

Killed here, in process (no process group): the loss probe's tolerances, mode and ``no_grad``
(``loss_shift_refusal``); the MoE route of ``loss_scale_refusal``; the ``compute_loss`` guard's owner name,
positional arguments, ``cp_size=1`` and stored ``compute_loss_func``; ``PreparedForwardCheck``'s
weak set and its state before any ``shard()``; and the wiring in ``ATACAccelerator.prepare/shard/backward``
and ``ATACTrainer._prepare_context_parallel_inputs/training_step/prediction_step`` that only the slow
2-process tests reached.
"""

from __future__ import annotations

import gc
import types
import weakref
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from test_redteam20 import _guarded_trainer  # the bare guarded trainer (a base class optional)

V = 8  # the fake model's vocabulary


class TinyLM(torch.nn.Module):
    """A causal-LM stand-in: ``mode`` 'ok' (trains ``shift_labels``, sums over ``num_items_in_batch``),
    'self_shift' (shifts ``labels`` itself), 'mean' (ignores ``num_items_in_batch`` and shifts itself) or
    'raise' (cannot run the checks). ``items_factor`` scales the loss where ``num_items_in_batch`` is given,
    ``shift_factor`` where ``shift_labels`` are ('prefix': logits for 5 positions); ``seen`` records
    (training, grad enabled) of each forward."""

    def __init__(self, mode: str = "ok", items_factor: float = 1.0, shift_factor: float = 1.0, config=None):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(V, 6, generator=g))
        self.head = torch.nn.Parameter(torch.randn(6, V, generator=g))
        self.mode, self.items_factor, self.shift_factor, self.seen = mode, items_factor, shift_factor, []
        if config is not None:
            self.config = config

    def forward(self, input_ids=None, labels=None, shift_labels=None, num_items_in_batch=None, use_cache=None, **kw):
        self.seen.append((self.training, torch.is_grad_enabled()))
        if self.mode == "raise":
            raise RuntimeError("needs pixel_values")
        logits = self.emb[input_ids] @ self.head
        if self.mode == "prefix":  # one more position than input_ids (a prepended soft token): no verdict
            return SimpleNamespace(loss=torch.tensor(9.0), logits=torch.cat([logits[:, :1], logits], dim=1))
        loss = None
        if labels is not None:
            own = self.mode in ("self_shift", "mean") or shift_labels is None
            lg, tg = (logits[:, :-1], labels[:, 1:]) if own else (logits, shift_labels)
            s = F.cross_entropy(lg.reshape(-1, V).float(), tg.reshape(-1), ignore_index=-100, reduction="sum")
            count = num_items_in_batch is not None and self.mode != "mean"
            loss = s / (num_items_in_batch if count else (tg != -100).sum())
            loss = loss * (self.items_factor if count else 1.0)
            loss = loss * (self.shift_factor if shift_labels is not None else 1.0)
        return SimpleNamespace(loss=loss, logits=logits)


# ---------------------------------------------------------------------------- loss_shift_refusal / loss_scale_refusal
def test_the_shift_check_refuses_a_loss_5_percent_off_and_accepts_one_half_a_percent_off():
    from atac_hf.integrations.trainer_guards import loss_scale_refusal, loss_shift_refusal

    assert loss_shift_refusal(TinyLM()) is None
    assert loss_shift_refusal(TinyLM(shift_factor=1.005)) is None  # within the 1% tolerance (bf16 noise)
    # red-team 25: 5% off plain cross-entropy (label smoothing, a z-loss) but read from shift_labels only: exact,
    # accepted after two more forwards (other targets: another loss; other labels: the same)
    model = TinyLM(shift_factor=1.05)
    assert loss_shift_refusal(model) is None and len(model.seen) == 3
    why = loss_shift_refusal(TinyLM("self_shift"))
    assert why.startswith("its loss does not train the targets given as shift_labels") and "changes with labels" in why
    assert loss_scale_refusal(TinyLM("self_shift"), stale=False, cp_size=2) == why
    assert loss_shift_refusal(TinyLM(shift_factor=float("nan"))) is None  # a non-finite check is no verdict
    assert loss_shift_refusal(TinyLM("prefix")) is None  # logits not one per token: the targets' rows are unknown


def test_under_cp_the_count_check_refuses_a_loss_5_percent_off_and_accepts_one_half_a_percent_off():
    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    assert loss_scale_refusal(TinyLM(items_factor=1.005), stale=False, cp_size=2) is None
    why = loss_scale_refusal(TinyLM(items_factor=1.05), stale=False, cp_size=2)
    assert why and why.startswith("its loss ignores num_items_in_batch") and "cp_size=2 times" in why
    assert loss_scale_refusal(TinyLM("mean"), stale=False, cp_size=2).startswith("its loss ignores num_items_in_batch")
    assert loss_scale_refusal(TinyLM("mean"), stale=False, cp_size=1) is None  # one device: its mean is the loss


def test_the_shift_check_runs_in_eval_mode_without_grad_and_restores_either_mode():
    from atac_hf.integrations.trainer_guards import loss_shift_refusal

    for training in (True, False):
        m = TinyLM().train(training)
        assert loss_shift_refusal(m) is None
        assert m.seen == [(False, False)]  # one forward, eval mode, no graph
        assert m.training is training


def test_an_moe_model_with_a_router_loss_is_left_to_its_own_refusal_under_cp():
    from transformers import MixtralConfig

    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    cfg = MixtralConfig(vocab_size=V, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=2, output_router_logits=True, router_aux_loss_coef=0.02)
    plain = TinyLM("mean")  # ignores the count and shifts labels itself: refused without a router loss
    routed = TinyLM("mean", config=cfg)
    assert loss_scale_refusal(plain, stale=False, cp_size=2).startswith("its loss ignores")
    assert loss_scale_refusal(routed, stale=False, cp_size=2) is None  # prepare_model refuses it, in its own words
    assert loss_scale_refusal(routed, stale=True, cp_size=2).startswith("its loss ignores")  # declared stale: shown
    assert loss_scale_refusal(TinyLM("self_shift", config=cfg), stale=True, cp_size=2) is None  # counts: no shift check
    assert loss_scale_refusal(TinyLM("self_shift"), stale=True, cp_size=2).startswith("its loss does not train")


# ---------------------------------------------------------------------------- the compute_loss guard
def _model(**inputs):
    return {"loss": torch.tensor(float(inputs.get("num_items_in_batch", 1.0))), "logits": torch.zeros(1)}


def test_the_refusal_names_the_class_that_overrides_compute_loss_and_positional_args_reach_it():
    from transformers import Trainer

    from atac_hf.integrations.trainer_guards import LossGuardMixin, install_loss_override_check

    class Bypass(LossGuardMixin, Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return model(**inputs)["loss"]

    class Leaf(Bypass):  # inherits the override
        pass

    t = _guarded_trainer(Leaf)
    install_loss_override_check(t, 2)
    with pytest.raises(ValueError, match=r"^Bypass\.compute_loss returned a loss without calling super"):
        t.compute_loss(_model, {})

    class Through(LossGuardMixin, Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch=num_items_in_batch)

    t = _guarded_trainer(Through)
    install_loss_override_check(t, 2)
    loss, outputs = t.compute_loss(_model, {}, True, num_items_in_batch=3.0)  # return_outputs given positionally
    assert float(loss) == 6.0 and "logits" in outputs


def test_without_cp_an_override_is_not_wrapped():
    from atac_hf.integrations.trainer_guards import install_loss_override_check

    t = _guarded_trainer()
    t.compute_loss = types.MethodType(lambda self, model, inputs, **kw: model(**inputs)["loss"], t)
    own = t.compute_loss
    install_loss_override_check(t, 1)
    assert vars(t)["compute_loss"] is own


def test_a_compute_loss_func_is_stored_and_used_through_the_guards_property():
    t = _guarded_trainer()

    def my_loss(outputs, labels, num_items_in_batch=None):
        return torch.tensor(7.0)

    t.compute_loss_func = my_loss
    assert t.compute_loss_func is my_loss
    loss = t.compute_loss(_model, {"labels": torch.zeros(1)}, num_items_in_batch=3.0)
    assert float(loss) == 14.0  # my_loss's value, scaled by the world size (cp_size=1 trains with it)


def test_super_compute_loss_counts_on_trainers_deepspeed_sp_path(monkeypatch):
    """Trainer.compute_loss returns there before it reads compute_loss_func: the mixin's own flag counts."""
    import transformers.trainer as hf_trainer
    from transformers import Trainer

    from atac_hf.integrations.trainer_guards import LossGuardMixin, install_loss_override_check

    monkeypatch.setattr(hf_trainer, "deepspeed_sp_compute_loss", lambda acc, model, inputs, ro, pc: torch.tensor(5.0))

    class Through(LossGuardMixin, Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    t = _guarded_trainer(Through)
    t.accelerator = SimpleNamespace(num_processes=2, parallelism_config=SimpleNamespace(sp_backend="deepspeed",
                                                                                          sp_enabled=True))
    t.model = SimpleNamespace(training=True)
    install_loss_override_check(t, 2)
    assert float(t.compute_loss(_model, {})) == 5.0


# ---------------------------------------------------------------------------- PreparedForwardCheck
class Wrapper(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_only_a_module_is_a_wrapper_and_a_watched_wrapper_can_be_freed():
    from atac_hf.integrations.forward_check import PreparedForwardCheck, is_wrapper

    assert not is_wrapper(SimpleNamespace(module=torch.nn.Linear(1, 1)))
    check = PreparedForwardCheck()
    wrapper = Wrapper(torch.nn.Linear(1, 1))
    check.watch([wrapper])
    ref = weakref.ref(wrapper)
    del wrapper
    gc.collect()
    assert ref() is None  # free_memory() still frees a prepared model


def test_before_any_shard_a_backward_without_a_wrapper_forward_is_refused_too():
    # red-team 25: DDP sums once per forward through it, shard() or not; the message names shard() where it ran
    from atac_hf.integrations.forward_check import PreparedForwardCheck

    check = PreparedForwardCheck()
    wrapper = Wrapper(torch.nn.Linear(1, 1))  # (held: the check holds it weakly)
    check.watch([wrapper])
    with pytest.raises(ValueError, match=r"no model returned by accelerator\.prepare \(Wrapper\) ran a forward with "
                                         r"autograd on since the last backward"):
        check.before_backward()  # no shard() yet, no forward
    wrapper(torch.ones(1, 1))
    check.before_backward()
    check.on_shard()
    with pytest.raises(ValueError, match=r"no model returned by accelerator\.prepare \(Wrapper\) ran a forward with "
                                         r"autograd on since the last accelerator\.shard\(batch\) and since"):
        check.before_backward()


# ---------------------------------------------------------------------------- ATACAccelerator wiring
def make_bare_accelerator(monkeypatch, cp: int, *, wrap, backward, setup, kind_check: bool = True):
    """An ATACAccelerator with no process group: Accelerate's ``prepare`` wraps each module in ``wrap``, its
    ``backward`` is ``backward(self, loss, **kw)``, ``_setup_model`` is ``setup``; ``kind_check=False``: the static
    rules patched out."""
    from accelerate import Accelerator

    from atac_hf.integrations.accelerate import ATACAccelerator
    from atac_hf.integrations.forward_check import PreparedForwardCheck, UnusedParameterCheck

    def prepare(self, *args, **kwargs):
        out = tuple(wrap(a) if isinstance(a, torch.nn.Module) else a for a in args)
        return out if len(out) > 1 else out[0]

    monkeypatch.setattr(Accelerator, "prepare", prepare)
    monkeypatch.setattr(Accelerator, "backward", backward)
    if not kind_check:
        monkeypatch.setattr("atac_hf.integrations.accelerate.check_static", lambda model: None)

    class Bare(ATACAccelerator):
        num_processes = cp
        gradient_accumulation_steps = 1
        sync_gradients = True

    acc = Bare.__new__(Bare)
    acc.atac_config, acc.tp_size, acc._models = SimpleNamespace(cp_size=cp), 1, []
    acc._forward_check = PreparedForwardCheck()
    acc._unused_check = UnusedParameterCheck()
    acc._setup_model = setup
    acc._switch_model = lambda model: None  # (prepare_model and the sharded probe: part of what ``setup`` stands for)
    return acc


def _bare_accelerator(monkeypatch, cp: int):
    """An ATACAccelerator with no process group: Accelerate's prepare wraps each module, its backward records."""
    calls = []
    # TinyLM has no transformers config: the static rules (run again by the mocked _setup_model's check_model)
    # would refuse it before the loss checks these tests are about
    acc = make_bare_accelerator(monkeypatch, cp, wrap=Wrapper,
                                backward=lambda self, loss, **kw: calls.append("backward"),
                                setup=lambda m: calls.append(("setup", m.mode)), kind_check=False)
    acc.sharder = lambda batch, num_items_in_batch=None: {**batch, "num_items_in_batch": num_items_in_batch}
    return acc, calls


def test_prepare_under_cp_checks_every_model_before_it_changes_any(monkeypatch):
    acc, calls = _bare_accelerator(monkeypatch, 2)
    with pytest.raises(ValueError, match=r"^TinyLM: its loss does not train the targets given as shift_labels"):
        acc.prepare(TinyLM(), TinyLM("self_shift"))
    with pytest.raises(ValueError, match=r"^TinyLM: its loss ignores num_items_in_batch"):
        acc.prepare(TinyLM("mean"))
    assert calls == []
    wrapped = acc.prepare(TinyLM("raise"))  # a check that cannot run refuses nothing
    assert isinstance(wrapped, Wrapper) and calls == [("setup", "raise")]
    one, _ = _bare_accelerator(monkeypatch, 1)
    one.prepare(TinyLM("self_shift"))  # rows are whole at cp_size=1


def test_prepare_probes_every_model_before_tp_sharding_any(monkeypatch):
    """Review of red-team 36: at tp_size > 1 a model's TP sharding cannot be put back, so every model of the call
    is switched and probed sharded before any is TP-sharded (a refused second model left the first sharded)."""
    acc, calls = _bare_accelerator(monkeypatch, 2)
    acc.tp_size = 2
    monkeypatch.setattr("atac_hf.integrations.accelerate.check_tp_prepare", lambda *a, **k: None)

    def switch(model):
        calls.append(("switch", model.mode))
        if getattr(model, "refused", False):
            raise NotImplementedError("refused by the sharded probe")

    acc._switch_model = switch
    bad = TinyLM()
    bad.refused = True
    with pytest.raises(NotImplementedError, match="sharded probe"):
        acc.prepare(TinyLM(), bad)
    assert calls == [("switch", "ok"), ("switch", "ok")]  # nothing TP-sharded
    calls.clear()
    acc.prepare(TinyLM(), TinyLM())
    assert calls == [("switch", "ok"), ("switch", "ok"), ("setup", "ok"), ("setup", "ok")]


def test_backward_under_cp_refuses_a_loss_from_the_unprepared_module_before_running_it(monkeypatch):
    acc, calls = _bare_accelerator(monkeypatch, 2)
    model = TinyLM()
    wrapped = acc.prepare(model)  # one model: prepare returns it alone
    batch = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "labels": torch.tensor([[1, 2, 3, 4]])}
    loss = model(**acc.shard(batch, num_items_in_batch=3)).loss
    with pytest.raises(ValueError, match=r"a model that accelerator\.prepare wrapped \(TinyLM, in Wrapper\) ran a forward "
                                         r"with autograd on only outside the wrapper"):  # (the module prepare wrapped)
        acc.backward(loss)
    assert "backward" not in calls  # refused before Accelerate's backward
    acc.backward(wrapped(**acc.shard(batch, num_items_in_batch=3)).loss)
    assert calls[-1] == "backward"
    acc.shard(batch, num_items_in_batch=3)  # the next micro-batch ...
    with pytest.raises(ValueError, match=r"a model that accelerator\.prepare wrapped"):
        acc.backward(model(**batch).loss)  # ... through the unprepared module again
    other = TinyLM()  # a module prepare never saw
    with pytest.raises(ValueError, match=r"no model returned by accelerator\.prepare \(Wrapper\) ran a forward"):
        acc.backward(other(**acc.shard(batch, num_items_in_batch=3)).loss)

    one, calls1 = _bare_accelerator(monkeypatch, 1)
    m1 = TinyLM()
    one.prepare(m1)
    one.backward(m1(**one.shard(batch, num_items_in_batch=3)).loss)  # cp_size=1: not checked
    assert calls1[-1] == "backward"


# ---------------------------------------------------------------------------- ATACTrainer wiring
def _bare_trainer(cp: int):
    from atac_hf.integrations.trainer import ATACTrainer

    t = ATACTrainer.__new__(ATACTrainer)
    t.atac_config, t.atac_tp_size, t.label_names, t._atac_warned_logits = SimpleNamespace(cp_size=cp), 1, None, False
    t.atac_sharder = lambda inputs, record: dict(inputs)
    t.label_smoother, t.model = None, TinyLM()
    t._atac_base = t.model  # (the model the steps must run: check_step_model)
    t.accelerator = SimpleNamespace(sync_gradients=True)  # (training_step notes the gradients of a syncing step)
    return t


def test_the_shards_own_count_is_the_packs_count_over_cp():
    got = _bare_trainer(2)._prepare_context_parallel_inputs(None, {"num_items_in_batch": 6})[1]
    assert got["num_items_in_batch"] == 3
    assert "num_items_in_batch" not in _bare_trainer(2)._prepare_context_parallel_inputs(None, {"input_ids": 1})[1]
    count = torch.tensor(6)  # a batch's own count (an int tensor) at cp_size=1: passed on as it is
    assert _bare_trainer(1)._prepare_context_parallel_inputs(None, {"num_items_in_batch": count})[1][
        "num_items_in_batch"] is count and int(count) == 6


def test_the_fallback_count_leaves_a_batchs_own_count_tensor_untouched():
    """A batch's own ``num_items_in_batch`` tensor is divided into a new value: an int tensor raised (in-place
    true division) and a float one was halved in the caller's batch too (found by this pass)."""
    for count in (torch.tensor(6), torch.tensor(6.0)):
        got = _bare_trainer(2)._prepare_context_parallel_inputs(None, {"num_items_in_batch": count})[1]
        assert float(got["num_items_in_batch"]) == 3.0 and float(count) == 6.0


@pytest.mark.parametrize("step", ["training_step", "prediction_step"])
def test_each_step_checks_a_compute_loss_set_on_the_instance(monkeypatch, step):
    from transformers import Trainer

    monkeypatch.setattr(Trainer, step, lambda self, *a, **kw: "ran")
    t = _bare_trainer(2)
    t.compute_loss = types.MethodType(lambda self, model, inputs, **kw: model(**inputs)["loss"], t)
    args = (t.model, {}) if step == "training_step" else (t.model, {}, True)
    assert getattr(t, step)(*args) == "ran"
    with pytest.raises(ValueError, match=r"ATACTrainer \(set on the instance\)\.compute_loss returned a loss"):
        t.compute_loss(_model, {})


# ---------------------------------------------------------------------------- check_training_args (moved)
def test_the_default_batch_sizes_are_no_choice_and_group_by_length_is_the_4x_spelling(tmp_path):
    import warnings

    from transformers import TrainingArguments

    from atac_hf.integrations.trainer_guards import check_training_args, sampling_strategy

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_training_args(args, SimpleNamespace(cp_size=1))  # TrainingArguments' own batch sizes: no warning
    assert sampling_strategy(SimpleNamespace(group_by_length=True)) == "group_by_length"
    assert sampling_strategy(SimpleNamespace(train_sampling_strategy="sequential")) == "sequential"

"""Thirty-first mutation pass: survivors of mutants planted by hand in red-team 21's guards.

Killed here, in process (no process group): ``check_late_loss_settings``' record of the model's loss function
(no probe at construction, a refusal repeated at every step, the base model's function under a wrapper, the
count check's tolerance and a check that cannot run) and NEFTune's alpha 0; ``stock_attention``'s sdpa first,
eager where the model has no sdpa, no switch where no stock kernel can be set, the switch back after an
exception, a wrapped model; ``DocumentTargets._check_rows`` on documents changed in length but not in count
or total, one-token documents, several rows, 2-D ``seq_lengths``, rows without ``seq_lengths``, a batch without
labels, a batch whose documents cannot be read; ``ATACAccelerator.count_items`` beyond float32's exact integers
and its world sum over ``cp_size x tp_size``; and the calls of ``check_late_loss_settings`` in
``ATACTrainer.__init__``, ``training_step`` and ``prediction_step``.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from test_mutants_pass30 import Wrapper, _bare_trainer  # a module wrapper (like DDP), the bare ATACTrainer
from test_redteam20 import _config, _self_shift_model, _stock_model

V = 8  # the stand-in's vocabulary


class LossFnLM(torch.nn.Module):
    """A causal-LM stand-in whose loss is ``self.loss_function`` (transformers' way: replaceable on the instance)."""

    def __init__(self):
        super().__init__()
        from transformers.loss.loss_utils import ForCausalLMLoss

        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(V, 6, generator=g))
        self.head = torch.nn.Parameter(torch.randn(6, V, generator=g))
        self.loss_function, self.seen = ForCausalLMLoss, []

    def forward(self, input_ids=None, labels=None, shift_labels=None, num_items_in_batch=None, use_cache=None, **kw):
        self.seen.append(tuple(input_ids.shape))
        logits = self.emb[input_ids] @ self.head
        loss = None if labels is None else self.loss_function(logits, labels, V, num_items_in_batch=num_items_in_batch,
                                                              shift_labels=shift_labels)
        return SimpleNamespace(loss=loss, logits=logits)


def _self_shift_loss(logits, labels, vocab_size, num_items_in_batch=None, **kwargs):
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab_size), labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction="sum") / num_items_in_batch


def _late(model):
    from atac_hf.integrations.trainer_guards import check_late_loss_settings

    t = SimpleNamespace(label_smoother=None, model=model, atac_tp_size=1)
    check_late_loss_settings(t, 2)  # construction: records the model's loss function
    return t


# ---------------------------------------------------------------------------- check_late_loss_settings
def test_construction_records_the_loss_function_unprobed_and_a_late_one_is_refused_at_every_step():
    from atac_hf.integrations.trainer_guards import check_late_loss_settings

    m = LossFnLM()
    t = _late(m)
    check_late_loss_settings(t, 2)
    assert m.seen == []  # recorded, never probed (loss_scale_refusal checked it at construction), nor when unchanged
    m.loss_function = _self_shift_loss
    for _ in range(2):  # refused at every step, not only the first (the record keeps the constructed one)
        with pytest.raises(ValueError, match=r"model.loss_function was replaced after ATACTrainer was built: its "
                                             r"loss does not train the targets given as shift_labels"):
            check_late_loss_settings(t, 2)


def test_a_late_loss_function_is_probed_as_at_construction():
    """Only a verdict refuses: a loss 0.5% off with a count (within the count check's rtol 1e-2, bf16 noise) and
    one the check cannot run pass; one that ignores the count is refused."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    from atac_hf.integrations.trainer_guards import check_late_loss_settings

    def half_a_percent_off(logits, labels, vocab_size, num_items_in_batch=None, **kw):
        loss = ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch, **kw)
        return loss * 1.005 if num_items_in_batch is not None else loss

    def needs_more_inputs(logits, labels, vocab_size, **kw):
        raise RuntimeError("needs pixel_values")

    def per_rank_mean(logits, labels, vocab_size, num_items_in_batch=None, **kw):
        return ForCausalLMLoss(logits, labels, vocab_size, **kw)

    m = LossFnLM()
    t = _late(m)
    for fn in (half_a_percent_off, needs_more_inputs):
        m.loss_function = fn
        check_late_loss_settings(t, 2)
    m.loss_function = per_rank_mean
    with pytest.raises(ValueError, match=r"model.loss_function was replaced after ATACTrainer was built: its loss "
                                         r"ignores num_items_in_batch"):
        check_late_loss_settings(t, 2)


def test_the_late_check_reads_the_base_models_loss_function_under_a_wrapper():
    from atac_hf.integrations.trainer_guards import check_late_loss_settings

    m = LossFnLM()
    t = _late(Wrapper(m))  # a wrapper that does not pass attribute reads on (as DDP)
    m.loss_function = _self_shift_loss
    with pytest.raises(ValueError, match=r"model.loss_function was replaced after ATACTrainer was built"):
        check_late_loss_settings(t, 2)


def test_neftune_alpha_zero_adds_no_noise_and_is_accepted_late_and_at_construction(tmp_path):
    from transformers import TrainingArguments

    from atac_hf.integrations.trainer_guards import check_late_loss_settings, check_training_args

    t = _late(LossFnLM())
    t.neftune_noise_alpha = 0.0  # Trainer activates NEFTune (it tests `is not None`), with a noise of 0
    check_late_loss_settings(t, 2)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], neftune_noise_alpha=0.0)
    check_training_args(args, SimpleNamespace(cp_size=2))


# ---------------------------------------------------------------------------- stock_attention
def test_stock_attention_switches_to_sdpa_and_back_also_after_an_exception():
    import atac_hf  # noqa: F401  (registers atac_cp)
    from atac_hf.integrations.trainer_guards import stock_attention

    m = _stock_model()
    m.set_attn_implementation("atac_cp")
    with stock_attention(m):
        assert m.config._attn_implementation == "sdpa"  # the model's default (eager only where there is no sdpa)
    assert m.config._attn_implementation == "atac_cp"
    with pytest.raises(RuntimeError, match="interrupted"):
        with stock_attention(m):
            raise RuntimeError("interrupted")
    assert m.config._attn_implementation == "atac_cp"
    plain = _stock_model()
    plain.set_attn_implementation("eager")
    with stock_attention(plain):  # not on atac_cp: left as it is
        assert plain.config._attn_implementation == "eager"
    assert plain.config._attn_implementation == "eager"


def test_a_model_without_sdpa_is_checked_on_eager():
    import atac_hf  # noqa: F401
    from atac_hf.integrations.trainer_guards import loss_scale_refusal, stock_attention

    m = _self_shift_model(supports_sdpa=False)  # no sdpa kernel; a loss that shifts labels itself
    m.set_attn_implementation("atac_cp")
    with stock_attention(m):
        assert m.config._attn_implementation == "eager"
    assert m.config._attn_implementation == "atac_cp"
    assert "does not train the targets given as shift_labels" in loss_scale_refusal(m, False, 2)
    assert m.config._attn_implementation == "atac_cp"


class Unswitchable:
    """On atac_cp, and no stock kernel can be set (sdpa: ImportError, eager: NotImplementedError)."""

    def __init__(self):
        self.config, self.tried = SimpleNamespace(_attn_implementation="atac_cp"), []

    def set_attn_implementation(self, impl):
        self.tried.append(impl)
        if impl == "sdpa":
            raise ImportError("no sdpa here")
        if impl == "eager":
            raise NotImplementedError("no eager here")
        self.config._attn_implementation = impl


def test_with_no_stock_attention_to_switch_to_the_check_runs_once_unswitched():
    from atac_hf.integrations.trainer_guards import stock_attention

    b = Unswitchable()
    ran = []
    with stock_attention(b):
        ran.append(b.config._attn_implementation)
    assert ran == ["atac_cp"] and b.tried == ["sdpa", "eager"]  # both tried, nothing to switch back


def test_a_wrapped_model_on_atac_cp_is_switched_and_checked():
    import atac_hf  # noqa: F401
    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    m = _self_shift_model()
    m.set_attn_implementation("atac_cp")
    assert "does not train the targets given as shift_labels" in loss_scale_refusal(Wrapper(m), False, 2)
    assert m.config._attn_implementation == "atac_cp"


# ---------------------------------------------------------------------------- DocumentTargets._check_rows
def _making(lengths):
    """A collator that makes documents of ``lengths`` of the rows' tokens (position_ids), whatever seq_lengths say."""

    def collate(features):
        ids = torch.tensor([[t for f in features for t in f["input_ids"]]])
        pos = torch.tensor([[p for n in lengths for p in range(n)]])
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": pos}

    return collate


def test_a_collator_that_changes_the_documents_but_not_their_count_or_total_is_refused():
    from atac_hf.integrations.targets import DocumentTargets

    row = {"input_ids": list(range(3, 13)), "seq_lengths": [4, 6]}
    with pytest.raises(ValueError, match=r"changed the documents of pre-packed rows: the rows hold documents of "
                                         r"\[4, 6\] tokens \(seq_lengths\), the collated batch \[5, 5\]"):
        DocumentTargets(_making([5, 5]))([row])
    assert DocumentTargets(_making([4, 6]))([row])["input_ids"].shape == (1, 10)


def test_one_token_documents_several_rows_2d_lengths_and_rows_without_lengths_are_accepted():
    from atac_hf.integrations.targets import DocumentTargets
    from atac_hf.packing import PackedDataCollator

    collate = DocumentTargets(PackedDataCollator())
    two = collate([{"input_ids": [3, 4, 5, 6], "seq_lengths": [1, 3]}, {"input_ids": [7, 8, 9], "seq_lengths": [3]}])
    assert two["seq_lengths"].tolist() == [1, 3, 3]
    assert collate([{"input_ids": [3, 4, 5], "seq_lengths": [[1, 2]]}])["seq_lengths"].tolist() == [1, 2]
    mixed = collate([{"input_ids": [3, 4, 5], "seq_lengths": [1, 2]}, {"input_ids": [6, 7], "seq_lengths": None}])
    assert mixed["seq_lengths"].tolist() == [1, 2, 2]  # not every row pre-packed: not checked


def test_a_batch_without_labels_is_checked_and_one_whose_documents_cannot_be_read_is_left_to_the_sharder():
    from transformers import DataCollatorWithFlattening

    from atac_hf.integrations.targets import DocumentTargets

    row = {"input_ids": list(range(3, 13)), "seq_lengths": [4, 6]}

    def no_labels(features):
        return {k: v for k, v in DataCollatorWithFlattening()(features).items() if k != "labels"}

    with pytest.raises(ValueError, match=r"function changed the documents of pre-packed rows: .*\[4, 6\]"):
        DocumentTargets(no_labels)([row])
    unreadable = {"input_ids": torch.tensor([list(range(3, 13))]), "seq_lengths": 10}  # (not a sequence: TypeError)
    assert DocumentTargets(lambda features: unreadable)([row]) is unreadable


# ---------------------------------------------------------------------------- ATACAccelerator.count_items
def _counting_accelerator(monkeypatch, per_rank, processes, cp, tp):
    """A bare ATACAccelerator whose ranks each count ``per_rank`` targets (summed over ``processes`` ranks)."""
    import torch.distributed as dist

    from atac_hf.integrations import accelerate as acc_mod

    reduced = []

    def all_reduce(t, *args, **kwargs):
        reduced.append(processes)
        t.mul_(processes)

    monkeypatch.setattr(acc_mod, "count_targets", lambda batches: per_rank)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)

    class Bare(acc_mod.ATACAccelerator):
        num_processes = processes
        device = torch.device("cpu")

    acc = Bare.__new__(Bare)
    acc.atac_config, acc.tp_size = SimpleNamespace(cp_size=cp), tp
    return acc, reduced


def test_count_items_sums_the_world_over_cp_times_tp_exactly_beyond_float32(monkeypatch):
    n = 2 ** 24 + 1  # one rank's targets (a step of 64 replicas x 8 micro-batches x 32k tokens is past 2**24)
    acc, reduced = _counting_accelerator(monkeypatch, n, processes=8, cp=2, tp=2)
    assert acc.count_items({}) == 2 * n  # 8 ranks, 2 replicas
    assert reduced == [8]
    acc, reduced = _counting_accelerator(monkeypatch, 5, processes=2, cp=2, tp=1)
    assert acc.count_items({}) == 5 and reduced == [2]  # one replica of 2 CP ranks: summed, over 2
    acc, reduced = _counting_accelerator(monkeypatch, n, processes=1, cp=1, tp=1)
    assert acc.count_items({}) == n and reduced == []  # one process: no collective


# ---------------------------------------------------------------------------- ATACTrainer wiring
@pytest.mark.parametrize("step", ["training_step", "prediction_step"])
def test_each_step_refuses_a_loss_setting_made_after_construction_before_trainers_step(monkeypatch, step):
    from transformers import Trainer
    from transformers.trainer_pt_utils import LabelSmoother

    ran = []
    monkeypatch.setattr(Trainer, step, lambda self, *a, **kw: ran.append(step) or "ran")
    t = _bare_trainer(2)
    args = (t.model, {}) if step == "training_step" else (t.model, {}, True)
    assert getattr(t, step)(*args) == "ran"
    t.label_smoother = LabelSmoother(epsilon=0.1)
    with pytest.raises(ValueError, match=r"label_smoother=LabelSmoother was set on the trainer with cp_size=2"):
        getattr(t, step)(*args)
    assert ran == [step]  # refused before Trainer's step (its forward and backward)


def test_construction_records_the_loss_settings(monkeypatch, tmp_path):
    from test_redteam13 import _args, _ds, _tiny

    import atac_hf.integrations.trainer as trainer_mod
    from atac_hf.integrations import ATACConfig, ATACTrainer

    calls = []
    real = trainer_mod.check_late_loss_settings
    monkeypatch.setattr(trainer_mod, "check_late_loss_settings",
                        lambda t, shards: calls.append(shards) or real(t, shards))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ATACTrainer(model=_tiny(), args=_args(tmp_path), train_dataset=_ds(),
                    atac_config=ATACConfig(cp_size=1, max_tokens=128))
    assert calls == [1]


# ---------------------------------------------------------------------------- the bug L13 found (fixed: != for is not)
class MethodLossLM(LossFnLM):
    """Its loss function is a method of its class (as a subclass overriding transformers' property writes it)."""

    def __init__(self):
        super().__init__()
        del self.loss_function  # reads now reach the class's method: a new bound method each time

    def loss_function(self, logits, labels, vocab_size, **kwargs):
        from transformers.loss.loss_utils import ForCausalLMLoss

        return ForCausalLMLoss(logits, labels, vocab_size, **kwargs)


def test_a_loss_function_defined_as_a_method_is_not_probed_at_every_step():
    from atac_hf.integrations.trainer_guards import check_late_loss_settings

    m = MethodLossLM()
    assert m.loss_function is not m.loss_function  # a new bound method at every read
    t = _late(m)
    for _ in range(3):
        check_late_loss_settings(t, 2)
    assert m.seen == []  # unchanged: never probed
    m.loss_function = _self_shift_loss  # replaced on the instance: still refused
    with pytest.raises(ValueError, match=r"model.loss_function was replaced after ATACTrainer was built"):
        check_late_loss_settings(t, 2)

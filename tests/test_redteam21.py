"""Red-team 21 (a white-box review of the integrations): what it confirmed trained silently wrong, each refused
or fixed now. Repros: 2 gloo ranks against one process; these tests check the guards in one process.

- A model loaded with ``attn_implementation="atac_cp"`` skipped the loss checks (its attention needs a shard
  context, so the 4-token checks failed and were taken as "no verdict"): a loss that ignores
  ``num_items_in_batch`` trained at twice the loss at CP 2. The checks now run on the stock attention and
  switch it back.
- ``compute_loss_func``, ``label_smoother`` and ``model.loss_function`` set after construction were never
  checked (each shifts a shard's labels): refused before the step.
- A streaming dataset with a collator that does not read ``seq_lengths`` (``DataCollatorWithFlattening``)
  made each packed row one document (its documents attended to each other): refused at the batch.
- ``ATACAccelerator.count_items`` built its count in the default dtype (bf16: 5001 targets counted 4992).
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_redteam20 import _self_shift_model, _stock_model, _user_loss_function  # noqa: E402


def test_the_loss_checks_run_on_a_model_loaded_with_atac_cp_and_leave_it_so():
    import atac_hf  # noqa: F401  (registers atac_cp)
    from atac_hf.integrations.trainer_guards import loss_scale_refusal

    shifting = _self_shift_model()
    shifting.set_attn_implementation("atac_cp")
    assert "does not train the targets given as shift_labels" in loss_scale_refusal(shifting, False, 2)
    assert shifting.config._attn_implementation == "atac_cp"
    stock = _stock_model()
    stock.set_attn_implementation("atac_cp")
    assert loss_scale_refusal(stock, False, 2) is None
    assert loss_scale_refusal(stock, True, 1) is None  # declared stale and loaded on atac_cp: shown to honour it
    assert stock.config._attn_implementation == "atac_cp"


def _late_trainer(model):
    t = SimpleNamespace(label_smoother=None, model=model, atac_tp_size=1)
    from atac_hf.integrations.trainer_guards import check_late_loss_settings

    check_late_loss_settings(t, 2)  # construction: records the model's loss function
    return t


def test_loss_settings_assigned_after_construction_are_refused_under_cp():
    from transformers.loss.loss_utils import ForCausalLMLoss
    from transformers.trainer_pt_utils import LabelSmoother

    from atac_hf.integrations.trainer_guards import check_late_loss_settings

    t = _late_trainer(_stock_model())
    check_late_loss_settings(t, 2)  # nothing changed
    t.__dict__["_atac_compute_loss_func"] = lambda outputs, labels, num_items_in_batch=None: outputs.loss
    with pytest.raises(ValueError, match=r"compute_loss_func='<lambda>' was set on the trainer with cp_size=2: .*"
                                         r"set it back to None"):
        check_late_loss_settings(t, 2)
    check_late_loss_settings(t, 1)  # no CP: the rows are whole
    del t.__dict__["_atac_compute_loss_func"]
    t.label_smoother = LabelSmoother(epsilon=0.1)
    with pytest.raises(ValueError, match=r"label_smoother=LabelSmoother was set on the trainer with cp_size=2"):
        check_late_loss_settings(t, 2)
    t.label_smoother = None
    t.neftune_noise_alpha = 5.0  # train() activates NEFTune from the trainer's attribute
    with pytest.raises(ValueError, match=r"neftune_noise_alpha=5.0 was set on the trainer with cp_size=2: .*sqrt\(2\)"):
        check_late_loss_settings(t, 2)
    t.neftune_noise_alpha = None
    t.model.loss_function = _user_loss_function  # shifts labels itself
    with pytest.raises(ValueError, match=r"model.loss_function was replaced after ATACTrainer was built: its loss "
                                         r"does not train the targets given as shift_labels"):
        check_late_loss_settings(t, 2)

    def honours_shift_labels(logits, labels, vocab_size, **kwargs):
        return ForCausalLMLoss(logits, labels, vocab_size, **kwargs)

    t.model.loss_function = honours_shift_labels  # replaced by one that trains shift_labels' targets: accepted
    check_late_loss_settings(t, 2)


def test_a_streaming_collator_that_merges_packed_rows_is_refused():
    from transformers import DataCollatorWithFlattening

    from atac_hf.integrations.targets import DocumentTargets
    from atac_hf.packing import PackedDataCollator

    row = {"input_ids": list(range(3, 13)), "seq_lengths": [4, 0, 6]}  # a streaming dataset's packed row
    with pytest.raises(ValueError, match=r"DataCollatorWithFlattening changed the documents of pre-packed rows: the "
                                         r"rows hold documents of \[4, 6\] tokens .*the collated batch \[10\].*"
                                         r"PackedDataCollator"):
        DocumentTargets(DataCollatorWithFlattening())([row])
    batch = DocumentTargets(PackedDataCollator())([row])  # the default collator reads seq_lengths: kept
    assert batch["input_ids"].shape[-1] == 10
    plain = DocumentTargets(DataCollatorWithFlattening())([{"input_ids": [3, 4, 5]}, {"input_ids": [6, 7]}])
    assert plain["input_ids"].shape[-1] == 5  # samples (no seq_lengths): not checked


def test_count_items_is_exact_under_a_low_precision_default_dtype():
    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.accelerate import ATACAccelerator

    acc = ATACAccelerator(ATACConfig(max_tokens=8192, cost_preset="default"))
    labels = torch.full((1, 5002), 7)
    labels[0, 0] = -100
    batch = {"input_ids": torch.ones(1, 5002, dtype=torch.long), "labels": labels,
             "position_ids": torch.arange(5002).unsqueeze(0)}
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        assert acc.count_items([batch]) == 5001
    finally:
        torch.set_default_dtype(old)

"""Red-team 18: the targets a packed batch is counted by are the targets its loss sums.

A label at a document start is never a target under ATP-CP (the loss never shifts across a
document), but Trainer and ``count_targets`` counted ``labels[..., 1:]``: a collator with a
separator token (``DataCollatorWithFlattening(separator_id=EOS)``, ``PackedDataCollator(separator_id=2)``)
or one that copies ``input_ids`` into ``labels`` trained on a loss divided by too many targets
(2.2% low in the red-team's run, at every cp_size), and the separator targets were dropped. Now
the separator is trained as the unsharded model's plain shift trains it, and start labels are
not counted. Also: ``dispatch_batches`` / ``split_batches`` with a map-style dataset in ATACTrainer
(each CP rank sharded another pack) are refused.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from atac_hf.attention import build_shift_labels, doc_lengths_from_batch, shard_batch
from atac_hf.integrations.sharder import count_targets
from atac_hf.integrations.targets import DocumentTargets
from atac_hf.packing import PackedDataCollator
from atac_hf.packing.validate import InputTypeError
from atac_hf.sharding import plan_shards

FEATURES = [{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]}, {"input_ids": [12]}, {"input_ids": [13, 14]}]
SEP = 2


def _plain_shift(labels: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(labels, -100)
    out[:, :-1] = labels[:, 1:]
    return out


class _CopyLabels:
    """A custom packed collator whose labels are the ids themselves (no -100 at document starts)."""

    def __call__(self, features):
        batch = PackedDataCollator()(features)
        batch["labels"] = batch["input_ids"].clone()
        return batch


def _hf_flattening(separator_id):
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening(separator_id=separator_id, return_tensors="pt")


def test_labels_copied_from_ids_are_counted_as_the_loss_sums_them():
    raw = _CopyLabels()(FEATURES)
    lengths = doc_lengths_from_batch(raw)
    want = int(build_shift_labels(raw["labels"], lengths).ne(-100).sum())
    assert want == 3 + 2 + 0 + 1
    assert int(raw["labels"][..., 1:].ne(-100).sum()) == 9  # what Trainer counted before: 3 start labels too
    assert count_targets(raw) == want  # count_items / shard's count, on a batch no loader touched
    batch = DocumentTargets(_CopyLabels())(FEATURES)
    assert batch["labels"].tolist() == [[-100, 6, 7, 8, -100, 10, 11, -100, -100, 14]]
    assert int(batch["labels"][..., 1:].ne(-100).sum()) == want  # Trainer's count of the loader's batch
    assert "shift_labels" not in batch
    local = shard_batch(batch, plan_shards(lengths, 1), 0)
    assert local["num_items_in_batch"] == want
    assert local["shift_labels"].tolist() == build_shift_labels(raw["labels"], lengths).tolist()


@pytest.mark.parametrize("which", ["atac", "hf"])
def test_a_separator_token_is_the_target_of_each_documents_last_token(which):
    collate = PackedDataCollator(separator_id=SEP) if which == "atac" else _hf_flattening(SEP)
    batch = DocumentTargets(collate)(FEATURES)
    ids = batch["input_ids"]
    assert batch["labels"].tolist() == [[SEP, 6, 7, 8, SEP, 10, 11, SEP, SEP, 14]]
    # the unsharded model's plain shift: every document's last token predicts the separator, but the row's last
    assert batch["shift_labels"].tolist() == [[6, 7, 8, SEP, 10, 11, SEP, SEP, 14, -100]]
    assert torch.equal(batch["shift_labels"], _plain_shift(batch["labels"]))
    n = 9
    assert count_targets(batch) == n and int(batch["shift_labels"].ne(-100).sum()) == n  # Trainer counts these
    local = shard_batch(batch, plan_shards(doc_lengths_from_batch(batch), 1), 0)
    assert local["shift_labels"].tolist() == batch["shift_labels"].tolist() and local["num_items_in_batch"] == n
    assert ids.shape == batch["shift_labels"].shape


def test_packed_collator_emits_the_separator_targets_itself():
    """Without a loader (ATACAccelerator.shard on the collator's own batch): the same shift_labels."""
    batch = PackedDataCollator(separator_id=SEP)(FEATURES)
    assert batch["shift_labels"].tolist() == [[6, 7, 8, SEP, 10, 11, SEP, SEP, 14, -100]]
    assert "shift_labels" not in PackedDataCollator()(FEATURES)  # the default is unchanged


def test_default_collator_batches_pass_through_unchanged():
    raw = PackedDataCollator()(FEATURES)
    got = DocumentTargets(PackedDataCollator())(FEATURES)
    assert sorted(got) == sorted(raw) and all(torch.equal(got[k], raw[k]) for k in raw if isinstance(raw[k], torch.Tensor))
    assert count_targets(raw) == int(raw["labels"][..., 1:].ne(-100).sum()) == 6


def test_document_targets_refuses_a_separator_that_is_not_an_int():
    class Odd(_CopyLabels):
        separator_id = "eos"

    with pytest.raises(InputTypeError, match=r"Odd.separator_id='eos' is not an int: it is the label of each "
                                             r"document start \(-100: none, or a token id such as EOS\)"):
        DocumentTargets(Odd())


def _trainer(tmp_path, collator, **arg_over):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, LlamaConfig, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").double()
    ref = copy.deepcopy(model)  # the reference, before the trainer selects atac_cp
    g = torch.Generator().manual_seed(0)
    lens = [30, 5, 14, 1, 20, 11, 9, 25]
    ds = Dataset.from_list([{"input_ids": torch.randint(3, 64, (n,), generator=g).tolist()} for n in lens])
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=1, logging_steps=1,
                             report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True, learning_rate=0.0,
                             **arg_over)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ATACTrainer(model=model, args=args, train_dataset=ds, data_collator=collator,
                           atac_config=ATACConfig(cp_size=1, max_tokens=64, shuffle=False)), ref


@pytest.mark.parametrize("which", ["hf-separator", "atac-separator", "copied-labels"])
def test_trainer_loss_equals_each_document_run_alone(tmp_path, which):
    """One step at cp 1 (fp64): the logged loss is the per-document reference's, whose targets are the
    plain shift of the collator's row where it has a separator token, and never cross a document else."""
    collator = {"hf-separator": lambda: _hf_flattening(SEP), "atac-separator": lambda: PackedDataCollator(separator_id=SEP),
                "copied-labels": _CopyLabels}[which]()
    tr, model = _trainer(tmp_path, collator)
    batch = next(iter(tr.get_train_dataloader()))
    ids, labels = batch["input_ids"], batch["labels"]
    lengths = doc_lengths_from_batch(batch)
    target = _plain_shift(labels) if which != "copied-labels" else build_shift_labels(labels, lengths)
    with torch.no_grad():
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist()
        logits = torch.cat([model(input_ids=ids[:, a:a + n]).logits for a, n in zip(starts, lengths.tolist())], dim=1)
        ref = torch.nn.functional.cross_entropy(logits[0], target[0], ignore_index=-100, reduction="sum")
        ref = float(ref / int(target.ne(-100).sum()))
    if which != "copied-labels":
        assert int((target == SEP).sum()) == len(lengths) - 1  # the separator targets are in the reference
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.train()
    logged = [h["loss"] for h in tr.state.log_history if "loss" in h][0]
    assert logged == pytest.approx(ref, rel=1e-6), (logged, ref)


@pytest.mark.parametrize("flag", ["dispatch_batches", "split_batches"])
def test_trainer_refuses_dispatching_or_splitting_map_style_packs(tmp_path, flag):
    with pytest.raises(ValueError, match=rf"accelerator_config.{flag}=True: ATACTrainer's WFAP sampler deals each DP "
                                         rf"replica its own packs.*Set {flag} to None or False"):
        _trainer(tmp_path, None, accelerator_config={flag: True})


@pytest.mark.slow
@pytest.mark.parametrize("which", ["hf", "atac"])
def test_cp2_separator_loss_equals_each_document_run_alone(tmp_path, which):
    """The same at CP 2 (2 gloo processes): the logged loss of the first step equals the one-device
    reference with the separator targets (Trainer logs in fp32: within 1e-6)."""
    import json

    from _launch import ROOT, torchrun

    out = tmp_path / "sep.json"
    torchrun(2, ROOT / "tests" / "_separator_worker.py", out, which)
    got = json.loads(out.read_text())
    assert got["separators"] == got["docs"] - 1 >= 2, got
    assert got["logged"] == pytest.approx(got["ref"], rel=1e-6), got

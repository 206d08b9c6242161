"""Every epoch of a Trainer run as long as the first: ``Trainer`` sizes every epoch, and a resume's
epoch and skip, by the first epoch's ``len``, while WFAP packs each epoch afresh and its pack count
moves with the shuffle (8, 10, 8 packs: 374 of 1,898 tokens of epoch 1 were never trained, and a
resume inside epoch 1 replayed other packs). ``fixed_epoch_length`` keeps the count: an epoch
whose packing comes out another length trains epoch 0's packs, whole windows reordered."""

from __future__ import annotations

import numpy as np
import pytest

from atac_hf import ATACConfig
from atac_hf.integrations.data import build_packed_dataloader
from atac_hf.packing import PackingConfig
from atac_hf.packing.data.sampler import WFAPBatchSampler

LENGTHS = np.random.default_rng(0).integers(1, 60, 300)
CONFIG = PackingConfig(max_tokens=64, packs_per_window=4)


def _coverage(batches, lengths):
    off = np.concatenate([[0], np.cumsum(lengths)])
    seen = np.zeros(int(off[-1]), dtype=np.int64)
    for batch in batches:
        for i, a, z in batch:
            seen[off[i] + a:off[i] + z] += 1
    return seen


def _epochs(sampler, n):
    out = []
    for e in range(n):
        sampler.set_epoch(e)
        out.append(list(sampler))
    return out


def test_packed_afresh_the_epochs_differ_in_length():
    # the premise: without the option the pack count moves from epoch to epoch
    sampler = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=2, seed=3)
    assert len({len(b) for b in _epochs(sampler, 6)}) > 1


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("replicas", [1, 2])
def test_fixed_epoch_length_gives_every_epoch_the_first_ones_length_and_every_token_once(shuffle, replicas):
    sampler = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=replicas, seed=3, shuffle=shuffle,
                               fixed_epoch_length=True)
    epochs = _epochs(sampler, 6)
    assert {len(b) for b in epochs} == {len(epochs[0])}
    for batches in epochs:
        assert (_coverage(batches, LENGTHS) == 1).all()
        assert len(sampler) == len(batches)
    plain = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=replicas, seed=3, shuffle=shuffle)
    assert list(plain) == epochs[0]  # epoch 0 is the same packing either way


def test_a_reordered_epoch_keeps_epoch_0s_windows_whole():
    sampler = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=2, seed=3, fixed_epoch_length=True)
    plain = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=2, seed=3)
    epochs, fresh = _epochs(sampler, 6), _epochs(plain, 6)
    w = CONFIG.packs_per_window
    first = {tuple(map(tuple, epochs[0][i:i + w])) for i in range(0, len(epochs[0]), w)}
    reordered = [e for e in range(1, 6) if len(fresh[e]) != len(fresh[0])]
    assert reordered  # some epoch packed to another length and was reordered
    for e in range(1, 6):
        if e in reordered:
            assert {tuple(map(tuple, epochs[e][i:i + w])) for i in range(0, len(epochs[e]), w)} == first
            assert epochs[e] != epochs[0]  # in a new order
        else:
            assert epochs[e] == fresh[e]  # packed afresh where the count already matches


def test_fixed_epoch_length_resumes_mid_epoch_and_is_part_of_the_state():
    sampler = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=2, seed=3, fixed_epoch_length=True)
    epochs = _epochs(sampler, 3)
    sampler.set_epoch(2)
    it = iter(sampler)
    taken = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    again = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=2, seed=3, fixed_epoch_length=True)
    again.load_state_dict(state)
    assert taken + list(again) == epochs[2]
    plain = WFAPBatchSampler(LENGTHS, CONFIG, num_replicas=2, seed=3)
    with pytest.raises(ValueError, match="fingerprint"):
        plain.load_state_dict(state)  # planned another way: refused
    with pytest.raises(TypeError, match="fixed_epoch_length"):
        WFAPBatchSampler(LENGTHS, CONFIG, fixed_epoch_length="yes")


def test_the_trainers_loader_has_a_fixed_epoch_length():
    data = [{"input_ids": list(range(1, 1 + int(n)))} for n in LENGTHS]
    loader, sampler = build_packed_dataloader(data, ATACConfig(max_tokens=64), num_replicas=2, grad_accum=2,
                                              seed=3, fixed_epoch_length=True)
    assert sampler.fixed_epoch_length and {len(b) for b in _epochs(sampler, 6)} == {len(loader)}


def test_atac_trainer_trains_every_sample_once_per_epoch_over_several_epochs(tmp_path):
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf.integrations import ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    lengths = np.random.default_rng(0).integers(1, 60, 60)  # packs afresh to 35, 34, 36 packs (seed 42)
    ds = datasets.Dataset.from_dict({"input_ids": [[1 + i % 60 for i in range(n)] for n in lengths]})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=16, num_layers=1, vocab_size=64,
                                                               max_position_embeddings=128), dtype=torch.float32)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], num_train_epochs=3,
                             gradient_accumulation_steps=2, seed=42, logging_steps=100, disable_tqdm=True,
                             save_strategy="no")
    trainer = ATACTrainer(model=model, args=args, train_dataset=ds,
                          atac_config=ATACConfig(cp_size=1, max_tokens=64, cost_preset="default"))
    collate, seen = trainer.data_collator, []

    def counting(features):
        seen.append(sum(len(f["input_ids"]) for f in features))
        return collate(features)

    trainer.data_collator = counting
    trainer.train()
    sampler = trainer.atac_sampler
    assert sampler.fixed_epoch_length and len(sampler) == 35
    assert trainer.state.global_step == 3 * 18
    assert len(seen) == 3 * 35 and sum(seen) == 3 * int(lengths.sum())  # every token once in each epoch
    trainer.accelerator.end_training()


def test_a_loader_kept_in_step_follows_set_epoch_and_a_loaded_state():
    sampler = WFAPBatchSampler(LENGTHS, CONFIG, seed=3)
    loader = type("Loader", (), {"iteration": 0})()
    sampler.keep_in_step(loader)
    sampler.set_epoch(3)
    assert loader.iteration == 3
    state = WFAPBatchSampler(LENGTHS, CONFIG, seed=3)
    state.set_epoch(2)
    sampler.load_state_dict(state.state_dict(position=4))
    assert loader.iteration == 2


def test_accelerate_loop_resumed_in_a_later_epoch_continues_there():
    """One DP replica: Accelerate's DataLoaderShard calls set_epoch(its own pass counter) at every
    pass, which reaches the sampler; a fresh loader after a resume in epoch 1 sent epoch 0."""
    from atac_hf import ATACAccelerator

    data = [{"input_ids": list(range(1, 1 + int(n)))} for n in LENGTHS]
    acc = ATACAccelerator(ATACConfig(max_tokens=64, cost_preset="default"))
    loader, sampler = acc.packed_dataloader(data, seed=3)
    sampler.set_epoch(1)
    full = [b["input_ids"].tolist() for b in loader]
    loader, sampler = acc.packed_dataloader(data, seed=3)  # a fresh run, resumed after 5 batches of epoch 1
    saved = WFAPBatchSampler(LENGTHS, acc.atac_config.packing_config(1), seed=3)
    saved.set_epoch(1)
    sampler.load_state_dict(saved.state_dict(position=5))
    sampler.set_epoch(1)  # the README loop's call: the same epoch keeps the position
    assert [b["input_ids"].tolist() for b in loader] == full[5:]
    acc.end_training()

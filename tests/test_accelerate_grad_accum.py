"""``ATACAccelerator.shard`` under gradient accumulation: with ``num_items_in_batch`` (the step's
count) every target of the step weighs the same, as Trainer; without it each micro-batch's mean
counts once, as a stock Accelerate loop (``loss`` then ``accumulate``). Before, the second gave
gradients ``gradient_accumulation_steps`` times too large (red-team 3: grad norm 0.5226 against
0.2613), with no warning. One process here; the CP x DP scaling is the same formula
(tests/test_fsdp2_cp.py runs it at several ranks)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

GA = 2


def _grads(model):
    return torch.cat([p.grad.detach().double().reshape(-1) for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("with_count", [False, True])
def test_accumulated_gradient_equals_the_stock_loops(with_count):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from atac_hf import ATACAccelerator, ATACConfig

    rng = np.random.default_rng(0)
    data = [{"input_ids": rng.integers(0, 128, int(n)).tolist()} for n in rng.integers(5, 90, 30)]
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(cfg, dtype=torch.float64, attn_implementation="sdpa")
    ref = copy.deepcopy(base)
    acc = ATACAccelerator(ATACConfig(max_tokens=256, cost_preset="default"), gradient_accumulation_steps=GA)
    try:
        model = copy.deepcopy(base)
        model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
        loader, _ = acc.packed_dataloader(data, seed=0)
        batches = [b for _, b in zip(range(GA), loader)]
        n = acc.count_items(batches) if with_count else None
        for b in batches:
            with acc.accumulate(model):
                acc.backward(model(**acc.shard(b, num_items_in_batch=n)).loss)
        got = _grads(model)
    finally:
        acc.end_training()
    counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    for b in batches:  # stock HF on the same packs (position_ids: document-masked sdpa)
        kw = {"num_items_in_batch": sum(counts)} if with_count else {}
        out = ref(input_ids=b["input_ids"], position_ids=b["position_ids"], labels=b["labels"], use_cache=False, **kw)
        (out.loss if with_count else out.loss / GA).backward()
    want = _grads(ref)
    assert counts[0] != counts[1], "micro-batches of different counts tell the two weightings apart"
    assert (got - want).abs().max().item() <= 1e-9 * want.abs().max().item()

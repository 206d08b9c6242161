"""Multi-process (gloo, CPU) equivalence of ATP-CP training with single-device training.

One process group per world size; inside it, every (model, dtype, packing, strategy,
backend) case compares logits (gathered back into row order), loss and every
parameter gradient (summed over ranks) with the single-process model on the full
packed batch (stock ``sdpa`` with packed-row detection from ``position_ids``).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

pytestmark = pytest.mark.slow

MODELS = ("llama", "qwen3_sw", "mistral_sw")
DTYPES = (torch.float64, torch.float32)
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
HF_LOSS_TOL_FP64 = 1e-6  # Transformers computes the loss from logits.float(): fp32 precision


def _packs(world: int) -> list[tuple[str, list[list[int]]]]:
    rng = np.random.default_rng(1000 + world)
    packs = [
        ("dominant", [[150, 30, 1, 2, 20, 1, 7]]),  # atp splits doc 0; 1-token docs, docs shorter than cp
        ("two_rows", [[70, 1, 3, 2, 34], [5, 1, 1, 60, 43]]),  # B=2: rows concatenated into one pack
        ("random", _dist.uneven_rows(rng, 230)),
        ("contiguous", [[40, 25, 60]]),  # atp takes one contiguous run a rank (fewest kernel calls)
    ]
    if world == 2:
        packs.append(("atp_local", [[40, 60, 1, 1, 3, 90, 12]]))  # atp gathers nothing: no collective
    else:
        packs.append(("idle_rank", [[41, 55, 63, 93]]))  # atp leaves rank 0 without gathered keys
    return packs


def _cp_run(model, batch, plan, rank, backend):
    from atac_hf.attention import backends as kernels
    from atac_hf.attention import shard_batch, unshard

    _dist.set_attn(model, "atac_cp")
    model.zero_grad(set_to_none=True)
    # "sdpa+merge": the sdpa backend with its CPU chunk kernel (unmasked prefix merged with a
    # causal square) on every chunk; these packs are below its size threshold otherwise.
    merge_threshold = kernels.MERGE_MIN_PAIRS
    if backend == "sdpa+merge":
        backend, kernels.MERGE_MIN_PAIRS = "sdpa", 1
    try:
        local = shard_batch(batch, plan, rank, backend=backend, debug=True)
        assert local["input_ids"].shape == (1, int(plan.rank_num_tokens()[rank]))
        out = model(**local)
        out.loss.backward()
    finally:
        kernels.MERGE_MIN_PAIRS = merge_threshold
    loss = out.loss.detach().clone()
    n = local["num_items_in_batch"]
    loss64 = F.cross_entropy(out.logits[0].detach().double(), local["shift_labels"][0], reduction="sum") / n
    for t in (loss, loss64):
        dist.all_reduce(t)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for _, p in model.named_parameters() if p.requires_grad])
    dist.all_reduce(flat)
    grads, off = {}, 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            grads[name] = flat[off:off + p.numel()].view_as(p)
            off += p.numel()
    assert len(grads) == len(names)
    logits = unshard(out.logits, plan, rank)[0]
    return {"logits": logits, "loss": loss, "loss64": loss64, "grads": grads}


def _compare(ref, got, batch, dtype, label, stats):
    from atac_hf.attention import build_shift_labels, doc_lengths_from_batch

    tol = TOL[dtype]
    B, S = batch["input_ids"].shape
    shift = build_shift_labels(batch["labels"], doc_lengths_from_batch(batch)).reshape(-1)
    ref64 = F.cross_entropy(ref["logits"].double(), shift, reduction="sum") / int((shift != -100).sum())
    errs = {
        "logits": _dist.rel_err(got["logits"], ref["logits"]),
        "loss_fp64_from_logits": _dist.rel_err(got["loss64"], ref64),
        "loss": _dist.rel_err(got["loss"], ref["loss"]),
        "grads": max(_dist.rel_err(got["grads"][n], g) for n, g in ref["grads"].items()),
    }
    assert set(ref["grads"]) <= set(got["grads"]), f"{label}: missing gradients"
    assert len(ref["grads"]) > 0
    for k, e in errs.items():
        lim = HF_LOSS_TOL_FP64 if (k == "loss" and dtype == torch.float64) else tol
        assert e <= lim, f"{label}: {k} relative error {e:.3g} > {lim:g}"
        key = f"{str(dtype).removeprefix('torch.')}/{k}"
        stats[key] = max(stats[key], e)
    stats["cases"] += 1


def _group_checks(rank: int, world: int) -> None:
    """shard_batch against the process group: debug digest mismatch, wrong rank, group size."""
    from atac_hf.attention import doc_lengths_from_batch, shard_batch
    from atac_hf.sharding import plan_shards

    b = _dist.make_batch([[40, 3, 1, 20]], seed=0)
    lengths = doc_lengths_from_batch(b)
    # debug mode: every rank must hold the same plan
    mine = plan_shards(lengths, 2, "atp" if rank == 0 else "zigzag")
    try:
        shard_batch(b, mine, rank, debug=True)
    except RuntimeError as e:
        msg = str(e)
        assert f"rank 0: {plan_shards(lengths, 2, 'atp').digest}" in msg, msg
        assert f"rank 1: {plan_shards(lengths, 2, 'zigzag').digest}" in msg, msg
        assert "different shard plans" in msg
    else:
        raise AssertionError("mismatched plans were not detected")
    same = plan_shards(lengths, 2, "atp")
    shard_batch(b, same, rank, debug=True)  # agrees: no error
    try:
        shard_batch(b, same, 1 - rank)
    except ValueError as e:
        assert f"rank={1 - rank} but this process is rank {rank}" in str(e)
    else:
        raise AssertionError("wrong rank not detected")
    try:
        shard_batch(b, plan_shards(lengths, 4, "atp"), rank)
    except ValueError as e:
        assert "the process group has 2 ranks but the plan is for cp_size=4" in str(e)
    else:
        raise AssertionError("group size mismatch not detected")


def equivalence_worker(rank: int, world: int, out_path: str) -> None:
    from atac_hf.attention import doc_lengths_from_batch
    from atac_hf.sharding import STRATEGIES, plan_shards

    if world == 2:
        _group_checks(rank, world)
    stats: dict = defaultdict(float)
    seen = defaultdict(int)
    for model_name in MODELS:
        for dtype in DTYPES:
            model = _dist.tiny_model(model_name, dtype)
            for pi, (pack_name, rows) in enumerate(_packs(world)):
                batch = _dist.make_batch(rows, seed=pi)
                ref = _dist.reference_run(model, batch) if rank == 0 else None
                lengths = doc_lengths_from_batch(batch)
                for strategy in STRATEGIES:
                    plan = plan_shards(lengths, world, strategy)
                    seen[f"sharded:{strategy}"] += int(len(plan.sharded_docs) > 0)
                    seen[f"gathered:{strategy}"] += int(len(plan.gathered_docs) > 0)
                    if strategy == "atp":
                        _check_pack_property(pack_name, plan, world)
                    backends = ["sdpa"]
                    if model_name != "llama" and dtype == torch.float64:
                        backends.append("varlen_reference")  # the flash bookkeeping, with real gathers
                    if model_name == "llama":
                        backends.append("sdpa+merge")  # unwindowed chunks: the CPU chunk kernel too
                    for backend in backends:
                        got = _cp_run(model, batch, plan, rank, backend)
                        if rank == 0:
                            _compare(ref, got, batch, dtype,
                                     f"world={world} {model_name} {dtype} {pack_name} {strategy} {backend}", stats)
    _extra_cases(rank, world, stats)
    if rank == 0:
        stats.update({k: v for k, v in seen.items()})
        with open(out_path, "w") as f:
            json.dump(stats, f, indent=1, sort_keys=True)


def _check_pack_property(pack_name, plan, world):
    """Guard against vacuous passes: the packs exercise what they are named for."""
    if pack_name == "dominant":
        assert len(plan.sharded_docs) > 0, "atp should split the dominant document"
    if pack_name == "contiguous":
        from atac_hf.sharding.baselines import contiguous_segments

        want = [np.asarray(x).tolist() for x in contiguous_segments(plan.doc_lengths, world)]
        assert [x.tolist() for x in plan.segments] == want, "atp should take the contiguous layout here"
        assert len(plan.gathered_docs) > 0
    if pack_name == "atp_local":
        assert len(plan.gathered_docs) == 0, "atp should keep every document whole here (no collective)"
    if pack_name == "idle_rank":
        assert len(plan.gathered_docs) > 0
        idle = [r for r in range(world) if not plan.local_layout(r).seg_gathered.any()]
        assert idle, "expected a rank that attends to no gathered key"


def _extra_cases(rank, world, stats):
    """Gradient checkpointing (both checkpoint flavours) and a PEFT LoRA model."""
    from peft import LoraConfig, get_peft_model

    from atac_hf.attention import doc_lengths_from_batch
    from atac_hf.sharding import plan_shards

    rows = [[150, 30, 1, 2, 20, 1, 7]]
    batch = _dist.make_batch(rows, seed=7)
    lengths = doc_lengths_from_batch(batch)
    for model_name, reentrant in (("llama", False), ("qwen3_sw", True), ("mistral_sw", False)):
        model = _dist.tiny_model(model_name, torch.float64)
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
        else:  # transformers < 5.18: the old name
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        calls = [0]
        attn = [m for n, m in model.named_modules() if n.endswith("self_attn")]
        for m in attn:
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        ref = _dist.reference_run(model, batch) if rank == 0 else None
        for strategy in ("atp", "per_doc"):
            plan = plan_shards(lengths, world, strategy)
            calls[0] = 0
            got = _cp_run(model, batch, plan, rank, "sdpa")
            assert calls[0] == 2 * len(attn), f"checkpointing should re-run attention in backward ({calls[0]} calls)"
            if rank == 0:
                _compare(ref, got, batch, torch.float64, f"world={world} {model_name} ckpt reentrant={reentrant} "
                         f"{strategy}", stats)
                stats["ckpt_cases"] += 1
    for dtype in DTYPES:
        base = _dist.tiny_model("mistral_sw", dtype)
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                   "o_proj"],
                                                init_lora_weights=False))
        ref = _dist.reference_run(model, batch) if rank == 0 else None
        if rank == 0:
            assert ref["grads"] and all("lora_" in n for n in ref["grads"]), "LoRA: only adapters train"
        for strategy in ("atp", "zigzag"):
            plan = plan_shards(lengths, world, strategy)
            got = _cp_run(model, batch, plan, rank, "sdpa")
            if rank == 0:
                _compare(ref, got, batch, dtype, f"world={world} LoRA {dtype} {strategy}", stats)
                stats["lora_cases"] += 1


@pytest.mark.parametrize("world", [2, 4])
def test_cp_training_equals_single_device(world, tmp_path):
    out = tmp_path / "stats.json"
    _dist.spawn(equivalence_worker, world, str(out), timeout_s=600)
    stats = json.loads(out.read_text())
    print(f"\nworld={world}: " + json.dumps(stats, sort_keys=True))
    num_strategies = 5
    assert stats["cases"] >= len(MODELS) * len(DTYPES) * 4 * num_strategies
    assert stats["ckpt_cases"] == 6 and stats["lora_cases"] == 4
    for s in ("atp", "contiguous", "zigzag", "per_doc", "wlb_adaptive"):
        assert stats[f"sharded:{s}"] > 0 and stats[f"gathered:{s}"] > 0, f"{s} never sharded/gathered"

"""Gloo workers and helpers of tests/test_redteam41_exactness.py (see its docstring)."""

from __future__ import annotations

import copy
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

TOL = 1e-10
HF_LOSS_TOL = 1e-6  # Transformers' loss: logits.float()
_FIELDS = ("doc_lengths", "cp_size", "strategy", "segments", "gathered_docs", "rank_compute_s", "comm_s",
           "block_time_s")


def _attn_heavy_cost():
    """A cost model where attention dominates: atp splits documents, and at C >= 3 over sub-groups."""
    from atac_hf.cost import CostModel

    return CostModel(linear_s_per_token=1e-6, attn_s_per_pair=1e-7, tile=1, kv_bytes_per_token=64.0)


def _plans(lengths, C, *, routed=True):
    """(name, plan): every strategy with each exchange, a sub-group plan (C >= 3) with each exchange and
    node-routed, and atp under an attention-heavy cost model."""
    from atac_hf.cost import default_cost_model
    from atac_hf.sharding import STRATEGIES, ShardPlan, plan_shards
    from atac_hf.sharding.subgroups import plan_subgroups

    out = [(f"{s}/{ex}", plan_shards(lengths, C, s, kv_exchange=ex))
           for s in STRATEGIES for ex in ("all_gather", "all_to_all")]
    out.append(("atp/attn_heavy", plan_shards(lengths, C, "atp", _attn_heavy_cost())))
    if C > 2:
        sub = plan_subgroups(np.asarray(lengths), C, default_cost_model(), anchor_share=0.25)
        if sub is not None:
            f = {k: getattr(sub, k) for k in _FIELDS}
            out += [("sub/all_gather", ShardPlan(**f, kv_exchange="all_gather")),
                    ("sub/all_to_all", ShardPlan(**f, kv_exchange="all_to_all"))]
            if routed:  # nodes of 2 ranks: at C = 3 and 5 the last node has one rank
                out.append(("sub/routed2", ShardPlan(**f, kv_exchange="all_to_all", kv_route_node=2)))
    return out


def _split_over_subgroup(plan) -> bool:
    """A document held by more than one rank but not by all of them."""
    holders: dict = {}
    for r in range(plan.cp_size):
        for d, s, e in plan.rank_segments(r):
            if e > s:
                holders.setdefault(int(d), set()).add(r)
    return any(1 < len(h) < plan.cp_size for h in holders.values())


# ---------------------------------------------------------------------------- slow: gloo groups
def _model(spec: str, dtype=torch.float64, **extra):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen3Config

    import atac_hf.attention  # noqa: F401  (registers atac_cp)

    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, vocab_size=_dist.VOCAB, max_position_embeddings=512, attention_dropout=0.0)
    common.update(extra)
    if spec == "llama_mqa":
        cfg = LlamaConfig(**common)
    elif spec.startswith("mistral_w"):  # every layer windowed
        cfg = MistralConfig(**common, sliding_window=int(spec.removeprefix("mistral_w")))
    elif spec == "qwen3_sw":  # layer 0 full, layer 1 window 3
        cfg = Qwen3Config(**{**common, "num_key_value_heads": 2}, head_dim=8, use_sliding_window=True,
                          sliding_window=3, max_window_layers=1)
    elif spec == "gpt2_odd":  # learned positions, head dim 15
        cfg = GPT2Config(vocab_size=_dist.VOCAB, n_embd=30, n_layer=2, n_head=2, n_positions=512, attn_pdrop=0.0,
                         resid_pdrop=0.0, embd_pdrop=0.0)
    else:
        raise ValueError(spec)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype).train()


def _labelled(rows, seed: int, mode: str, plan=None) -> dict:
    """make_batch's pack (-100 at each document start) with more labels ignored by ``mode``."""
    from atac_hf.attention import doc_lengths_from_batch

    b = _dist.make_batch(rows, seed)
    flat = b["labels"].view(-1)
    if mode == "all_ignored":
        flat[:] = -100
    elif mode == "doc_ends":  # each document's last token too
        pos = b["position_ids"].reshape(-1)
        flat[torch.cat([pos[1:] == 0, torch.tensor([True])])] = -100
    elif mode == "rank0_ignored":  # no target on rank 0's shard: label t + 1 is the target of token t
        starts = set(np.concatenate([[0], np.cumsum(doc_lengths_from_batch(b))[:-1]]).tolist())
        for t in plan.rank_token_indices(0).tolist():
            if t + 1 < flat.numel() and t + 1 not in starts:
                flat[t + 1] = -100
    return b


def _reference(model, batch) -> dict:
    """Each document alone through the stock sdpa model; the loss in fp64 (sum / targets) for the gradients,
    and in fp32 as Transformers computes it."""
    from atac_hf.attention import build_shift_labels, doc_lengths_from_batch

    _dist.set_attn(model, "sdpa")
    model.zero_grad(set_to_none=True)
    ids = batch["input_ids"].reshape(1, -1)
    offs = np.concatenate([[0], np.cumsum(doc_lengths_from_batch(batch))])
    logits = torch.cat([model(input_ids=ids[:, a:b], use_cache=False).logits[0] for a, b in zip(offs[:-1], offs[1:])])
    shift = build_shift_labels(batch["labels"], doc_lengths_from_batch(batch)).reshape(-1)
    n = int((shift != -100).sum())
    if torch.is_grad_enabled():
        (F.cross_entropy(logits.double(), shift, reduction="sum") / n).backward()
    return {"logits": logits.detach(), "loss": F.cross_entropy(logits.float(), shift, reduction="sum").detach() / n,
            "grads": {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}}


def _cp(model, batch, plan, rank, backend="sdpa", mode="train") -> dict:
    import torch.distributed as dist

    from atac_hf.attention import backends as kernels
    from atac_hf.attention import shard_batch, unshard

    _dist.set_attn(model, "atac_cp")
    model.zero_grad(set_to_none=True)
    merge = kernels.MERGE_MIN_PAIRS
    if backend == "sdpa+merge":  # every chunk through the CPU prefix + own-square merge kernel
        backend, kernels.MERGE_MIN_PAIRS = "sdpa", 1
    try:
        local = shard_batch(batch, plan, rank, backend=backend, debug=True)
        if mode == "train":
            out = model(**local)
            n = local["num_items_in_batch"]
            (F.cross_entropy(out.logits[0].double(), local["shift_labels"][0], reduction="sum") / n).backward()
        else:
            model.eval()
            with torch.inference_mode() if mode == "inference" else torch.no_grad():
                out = model(**local)
            model.train()
    finally:
        kernels.MERGE_MIN_PAIRS = merge
    loss = out.loss.detach().clone()
    dist.all_reduce(loss)
    grads = {}
    if mode == "train":
        params = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for _, p in params])
        dist.all_reduce(flat)
        off = 0
        for k, p in params:
            grads[k] = flat[off:off + p.numel()].view_as(p)
            off += p.numel()
    return {"logits": unshard(out.logits.clone(), plan, rank)[0], "loss": loss, "grads": grads}


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """max |a - b| / max(max |b|, floor); NaN where both are NaN at the same places counts as equal."""
    a, b = a.detach().double(), b.detach().double()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if nan_a.any() or nan_b.any():
        if not torch.equal(nan_a, nan_b):
            return float("inf")
        a, b = a[~nan_a], b[~nan_b]
    if not b.numel():
        return 0.0
    scale = max(b.abs().max().item(), floor)
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


def _errors(ref: dict, got: dict, mode: str) -> dict:
    errs = {"logits": _rel(got["logits"], ref["logits"]), "loss": _rel(got["loss"], ref["loss"])}
    if mode == "train":
        assert ref["grads"] and set(ref["grads"]) <= set(got["grads"]), "missing gradients"
        top = max((g.abs().max().item() for g in ref["grads"].values() if not torch.isnan(g).any()), default=0.0)
        errs["grads"] = max(_rel(got["grads"][k], g, 1e-5 * top) for k, g in ref["grads"].items())
    return errs


def _record(stats: dict, label: str, errs: dict) -> None:
    for k, e in errs.items():
        lim = HF_LOSS_TOL if k == "loss" else TOL
        if not e <= lim:
            stats["fail"].append(f"{label}: {k} {e:.3g} > {lim:g}")
        stats["max"][k] = max(stats["max"].get(k, 0.0), e)
    stats["cases"] += 1




def _packs(C: int) -> list[list[list[int]]]:
    return [[[C]], [[1] * C], [[C - 1, 1]], [[C + 1]], [[1, C - 1, C + 1, 2, 1]], [[1] * (3 * C)], [[2 * C + 1, 1, 1]],
            [[30, 7, 1, 2, 60]], [[25, 1, 3], [10, 10, 9]], [[150, 30, 1, 2, 20, 1, 7]], [[103, 66, 4, 92]]]


#: plans that every backend and the eval-mode forwards run (the others: sdpa, training)
_ALL_BACKENDS = ("atp/all_gather", "zigzag/all_to_all", "sub/all_to_all", "sub/routed2", "atp/attn_heavy")


def model_worker(rank: int, world: int, out_path: str) -> None:
    """Every model x edge pack x label mode x plan (x backend, x eval/inference forward) at CP ``world``,
    then gradient checkpointing and bf16 autocast (world 3)."""
    from atac_hf.attention import doc_lengths_from_batch

    stats: dict = {"max": {}, "fail": [], "cases": 0, "subgroup_plans": 0, "nan_cases": 0, "rank0_ignored": 0,
                   "ckpt_cases": 0, "bf16_cases": 0, "eval_cases": 0}
    specs = ("llama_mqa", "mistral_w1", "mistral_w2", "mistral_w1000", "qwen3_sw", "gpt2_odd") if world == 3 \
        else ("llama_mqa", "mistral_w1", "qwen3_sw")
    for spec in specs:
        model = _model(spec)
        for pi, rows in enumerate(_packs(world)):
            lengths = doc_lengths_from_batch(_dist.make_batch(rows, pi))
            plans = _plans(lengths, world)
            for mode in ("default", "doc_ends", "rank0_ignored", "all_ignored"):
                if mode in ("rank0_ignored", "all_ignored") and pi not in (1, 4, 9):
                    continue
                for name, plan in plans:
                    if mode == "rank0_ignored" and name not in _ALL_BACKENDS:
                        continue
                    batch = _labelled(rows, pi, mode, plan)
                    ref = _reference(model, batch) if rank == 0 else None
                    backends = ("sdpa", "sdpa+merge", "varlen_reference") if name in _ALL_BACKENDS else ("sdpa",)
                    for backend in backends:
                        runs = ("train", "eval", "inference") if backend == "sdpa" and name in _ALL_BACKENDS \
                            and mode == "default" else ("train",)
                        for run in runs:
                            got = _cp(model, batch, plan, rank, backend, run)
                            if rank == 0:
                                label = f"{spec} C={world} {rows} labels={mode} {name} {backend} {run}"
                                _record(stats, label, _errors(ref, got, run))
                                stats["eval_cases"] += run != "train"
                                stats["subgroup_plans"] += _split_over_subgroup(plan)
                                stats["nan_cases"] += bool(torch.isnan(got["loss"]).item())
                                stats["rank0_ignored"] += mode == "rank0_ignored"
    if world == 3:
        _ckpt_and_bf16(rank, world, stats)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(stats, f, indent=1, sort_keys=True)


def _ckpt_and_bf16(rank: int, world: int, stats: dict) -> None:
    from atac_hf.attention import doc_lengths_from_batch

    packs = [[[1, world - 1, world + 1, 2, 1]], [[150, 30, 1, 2, 20, 1, 7]], [[25, 1, 3], [10, 10, 9]]]
    for spec, reentrant in (("llama_mqa", False), ("mistral_w2", True), ("qwen3_sw", False), ("qwen3_sw", True)):
        model = _model(spec)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        for pi, rows in enumerate(packs):
            batch = _dist.make_batch(rows, pi)
            ref = _reference(model, batch) if rank == 0 else None
            for name, plan in _plans(doc_lengths_from_batch(batch), world):
                if name in ("atp/all_gather", "zigzag/all_to_all", "sub/routed2"):
                    got = _cp(model, batch, plan, rank)
                    if rank == 0:
                        _record(stats, f"{spec} ckpt reentrant={reentrant} {rows} {name}", _errors(ref, got, "train"))
                        stats["ckpt_cases"] += 1
    # bf16 autocast: the CP run's error against the fp64 model within twice the single-device autocast run's
    # (the low-precision rule of atac_hf/attention/tolerance.py, applied to logits and every gradient)
    for spec in ("llama_mqa", "mistral_w2"):
        m64 = _model(spec)
        m32 = copy.deepcopy(m64).float()
        for pi, rows in enumerate(packs):
            batch = _dist.make_batch(rows, pi)
            if rank == 0:
                ref = _reference(m64, batch)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    plain = _reference(m32, batch)
            for name, plan in _plans(doc_lengths_from_batch(batch), world):
                if name not in ("atp/all_gather", "zigzag/all_to_all", "sub/all_to_all"):
                    continue
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    got = _cp(m32, batch, plan, rank)
                if rank == 0:
                    for key in ("logits", *ref["grads"]):
                        want = ref["logits"] if key == "logits" else ref["grads"][key]
                        a = got["logits"] if key == "logits" else got["grads"][key]
                        b = plain["logits"] if key == "logits" else plain["grads"][key]
                        err, base = (_rel(x, want) for x in (a, b))
                        if not err <= 2 * base + 2 ** -8 / 64:
                            stats["fail"].append(f"bf16 {spec} {rows} {name} {key}: {err:.3g} > 2 x {base:.3g}")
                        stats["max"]["bf16_ratio"] = max(stats["max"].get("bf16_ratio", 0.0), err / max(base, 1e-30))
                    stats["bf16_cases"] += 1


def _fp64_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **_):
    """Transformers' ForCausalLMLoss with the logits upcast to fp64 instead of fp32."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = F.cross_entropy(logits.double().reshape(-1, vocab_size), shift_labels.reshape(-1).to(logits.device),
                           ignore_index=ignore_index, reduction="sum" if num_items_in_batch is not None else "mean")
    return loss / num_items_in_batch if num_items_in_batch is not None else loss


ACC_PACKS = [([[150, 30, 1, 2, 20, 1, 7]], "default"), ([[2]], "default"), ([[1, 1]], "default"),
             ([[2]], "all_ignored"), ([[3, 1, 1, 1, 1, 40]], "default"), ([[3, 1, 1, 1, 1, 40]], "all_ignored"),
             ([[1] * 12], "default"), ([[60, 2, 1, 50]], "rank0_ignored"), ([[103, 66, 4, 92]], "doc_ends")]


def accelerate_entry(rank: int, world: int, port: int, out_dir: str) -> None:
    """``ATACAccelerator`` at CP ``world`` (DDP over the CP ranks), fp64 loss: each pack's DDP-averaged gradient
    against each document alone on one device; packs of fewer tokens than ranks padded by the sharder; with and
    without gradient checkpointing."""
    _dist.launch_env(rank, world, port)
    res: dict = {"cases": [], "fail": []}
    try:
        from atac_hf.integrations import ATACAccelerator, ATACConfig
        from atac_hf.integrations.sharder import BatchSharder

        config = ATACConfig(cp_size=world, min_chunk=1, debug=True, max_tokens=256)
        acc = ATACAccelerator(config, cpu=True)
        for ckpt in (False, True):
            # GPT-2: no fp32 cast inside (Llama's RMSNorm computes in fp32: the loss scaled by the CP size, then
            # averaged by DDP, rounds there differently from one device, ~1e-7 on every gradient)
            base = _model("gpt2_odd")
            base.loss_function = _fp64_loss
            if ckpt:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            ref_model = copy.deepcopy(base)
            model = copy.deepcopy(base)
            model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
            acc.sharder = BatchSharder(config, cp_rank=acc.cp_rank, cp_group=acc.cp_group, device_type="cpu",
                                       cost_model=_attn_heavy_cost())  # splits documents, over sub-groups too
            for pi, (rows, mode) in enumerate(ACC_PACKS):
                from atac_hf.attention import doc_lengths_from_batch
                from atac_hf.sharding import plan_shards

                lengths = doc_lengths_from_batch(_dist.make_batch(rows, pi))
                plan = plan_shards(lengths, world, "atp", _attn_heavy_cost()) if sum(lengths) >= world else None
                batch = _labelled(rows, pi, mode, plan)
                local = acc.shard(dict(batch), num_items_in_batch=acc.count_items(dict(batch)))
                loss = model(**local).loss
                acc.backward(loss)
                total = float(acc.reduce_loss(loss))
                got = {k.removeprefix("module."): p.grad.detach().clone() for k, p in model.named_parameters()}
                opt.zero_grad(set_to_none=True)
                if rank == 0:
                    ref = _reference(ref_model, batch)
                    errs = _errors(ref, {"logits": ref["logits"], "loss": torch.tensor(total), "grads": got}, "train")
                    if torch.isnan(ref["loss"]):  # no target: stock 0 / 0; ATACAccelerator divides by max(count, 1)
                        errs["loss"] = 0.0 if total == 0.0 or total != total else float("inf")
                    res["cases"].append([ckpt, rows, mode, errs])
                    for k, e in errs.items():
                        if not e <= (HF_LOSS_TOL if k == "loss" else TOL):
                            res["fail"].append(f"ckpt={ckpt} {rows} {mode}: {k} {e:.3g}")
        acc.wait_for_everyone()
        acc.end_training()
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["setup_error"] = _dist.error_text(e)
    _dist.report_and_exit(os.path.join(out_dir, f"{rank}.json"), res)

"""Helpers for the attention tests: gloo process groups spawned from pytest, tiny models,
packed batches, and the single-device reference run.

Imported by the test files and, by name, by the spawned workers (keep it importable
from the tests directory: ``sys.path`` of the parent is passed to spawned children).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IGNORE = -100
VOCAB = 128


# ---------------------------------------------------------------------------- processes
def error_text(e: BaseException) -> str:
    """A worker's exception as its parent test reports it: type, message and the traceback's tail."""
    return f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"


def launch_env(rank: int, world: int, port: int) -> None:
    """The environment ``accelerate launch`` / torchrun give rank ``rank`` of ``world`` on this host (Accelerate's
    ``PartialState`` reads it), with no ``ATAC_*`` / ``PARALLELISM_CONFIG_*`` / ``ACCELERATE_*`` of the parent's;
    one thread."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key in [k for k in os.environ if k.startswith(("ATAC_", "PARALLELISM_CONFIG_", "ACCELERATE_"))]:
        del os.environ[key]
    torch.set_num_threads(1)


def report_and_exit(path: str, res: dict) -> None:
    """Write a worker's results to ``path`` (JSON) and end the process at once: ``os._exit`` skips
    the interpreter's teardown, where a gloo group can abort a process whose work is done."""
    with open(path, "w") as f:
        json.dump(res, f)
    os._exit(0)


def _entry(rank: int, fn, world: int, init_file: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    except BaseException:
        traceback.print_exc()
        raise
    dist.barrier()  # a teardown abort was seen once without it
    dist.destroy_process_group()
    # the work is done and reported: end the process without the interpreter's teardown, where gloo's
    # threads can still abort it ("terminate called without an active exception", SIGABRT, seen once in
    # a fresh-clone CI run after every collective had finished), as report_and_exit does
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn, world: int, *args, timeout_s: float = 300.0) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` gloo processes; re-raise the first failure.

    ``fn`` must be importable by name (a module-level function). Fails (and kills the
    workers) if they do not finish within ``timeout_s`` (a collective deadlock).
    """
    fd, init_file = tempfile.mkstemp(prefix="atac_gloo_")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it
    ctx = mp.spawn(_entry, args=(fn, world, init_file, args), nprocs=world, join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"{world} gloo workers did not finish in {timeout_s:.0f}s (collective deadlock?)")
    finally:
        if os.path.exists(init_file):
            os.unlink(init_file)


def join_or_kill(ctx, timeout_s: float) -> list[int]:
    """Wait up to ``timeout_s`` in total for every process of an ``mp.spawn(..., join=False)``
    context whose workers may fail on purpose (fault tests), then kill the ones still
    running. Returns their pids: a non-empty list means a rank hung."""
    deadline = time.monotonic() + timeout_s
    for p in ctx.processes:
        p.join(max(1.0, deadline - time.monotonic()))
    hung = [p.pid for p in ctx.processes if p.is_alive()]
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    return hung


# ---------------------------------------------------------------------------- models
def tiny_config(name: str):
    """Tiny configs: hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 128 (GQA on)."""
    from transformers import LlamaConfig, MistralConfig, Qwen3Config

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=1024, attention_dropout=0.0)
    if name == "llama":
        return LlamaConfig(**common)
    if name == "mistral_sw":  # every layer sliding, window 16
        return MistralConfig(**common, sliding_window=16)
    if name == "qwen3_sw":  # layer 0 full attention, layer 1 sliding window 16
        return Qwen3Config(**common, head_dim=16, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    raise ValueError(name)


def tiny_model(name: str, dtype: torch.dtype, attn: str = "sdpa", seed: int = 0):
    from transformers import AutoModelForCausalLM

    import atac_hf.attention  # noqa: F401  (registers atac_cp)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(tiny_config(name)), attn_implementation=attn, dtype=dtype)
    return model.train()


def set_attn(model, name: str) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(name)


# ---------------------------------------------------------------------------- batches
def make_batch(rows: list[list[int]], seed: int) -> dict:
    """A packed batch like DataCollatorWithFlattening's (labels -100 at each document start)."""
    g = torch.Generator().manual_seed(seed)
    S = sum(rows[0])
    assert all(sum(r) == S for r in rows), "rows must have equal token counts"
    ids = torch.randint(0, VOCAB, (len(rows), S), generator=g)
    pos = torch.cat([torch.cat([torch.arange(n) for n in r])[None] for r in rows])
    labels = ids.clone()
    labels[pos == 0] = IGNORE
    return {"input_ids": ids, "position_ids": pos, "labels": labels, "seq_lengths": [list(r) for r in rows]}


def uneven_rows(rng: np.random.Generator, total: int, num_rows: int = 1) -> list[list[int]]:
    """Rows of ``total`` tokens: one long document, 1-token and tiny documents, a few medium ones."""
    rows = []
    for _ in range(num_rows):
        long = int(rng.integers(total // 3, total // 2))
        docs = [long] + [1, 1, 2, 3] + list(rng.integers(1, 25, 4))
        rest = total - sum(docs)
        while rest > 0:
            n = int(min(rest, rng.integers(5, 40)))
            docs.append(n)
            rest -= n
        if rest < 0:
            docs[-1] += rest
        docs = [d for d in docs if d > 0]
        rng.shuffle(docs)
        rows.append([int(d) for d in docs])
    return rows


# ---------------------------------------------------------------------------- runs
def reference_run(model, batch: dict) -> dict:
    """Single-device reference: stock sdpa with packed-row detection from position_ids."""
    set_attn(model, "sdpa")
    model.zero_grad(set_to_none=True)
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"],
                use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    B, S = batch["input_ids"].shape
    return {"logits": out.logits.detach().reshape(B * S, -1), "loss": out.loss.detach(), "grads": grads}


def per_document_reference(model, batch: dict, attn: str) -> dict:
    """Each document run alone through the stock model with attention ``attn``, the loss over all of
    them in float32 (as transformers' loss computes it)."""
    import torch.nn.functional as F

    from atac_hf.attention import build_shift_labels, doc_lengths_from_batch

    set_attn(model, attn)
    model.zero_grad(set_to_none=True)
    ids = batch["input_ids"].reshape(1, -1)
    lengths = doc_lengths_from_batch(batch)
    offs = np.concatenate([[0], np.cumsum(lengths)])
    logits = torch.cat([model(input_ids=ids[:, a:b], use_cache=False).logits[0] for a, b in zip(offs[:-1], offs[1:])])
    shift = build_shift_labels(batch["labels"], lengths).reshape(-1)
    loss = F.cross_entropy(logits.float(), shift, reduction="sum") / int((shift != -100).sum())
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    return diff / scale if scale > 0 else diff

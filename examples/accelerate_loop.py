#!/usr/bin/env python
"""A plain Accelerate training loop with WFAP packing and ATP-CP (no Trainer).

    accelerate launch --config_file configs/cpu_cp2.yaml examples/accelerate_loop.py
    python examples/accelerate_loop.py --cp_size 1          # single-process reference

Embedded default: tiny Llama from a config, synthetic long-tail corpus, byte tokenizer.
Prints the pack's loss per optimizer step (identical for any cp_size) and the plan's balance.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--atac_config", default=None, help="the add-on's YAML (default: $ATAC_CONFIG)")
    p.add_argument("--cp_size", type=int, default=None, help="default: the launch config's parallelism_config_cp_size")
    p.add_argument("--max_tokens", type=int, default=None,
                   help="tokens per pack (default: the --atac_config file's or ATAC_MAX_TOKENS; 1024 without either)")
    p.add_argument("--max_steps", type=int, default=10)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--num_samples", type=int, default=300)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from transformers import AutoModelForCausalLM

    from atac_hf.integrations import ATACConfig
    from atac_hf.integrations.accelerate import ATACAccelerator
    from atac_hf.integrations.demo import ByteTokenizer, synthetic_corpus, tiny_llama_config

    max_tokens = args.max_tokens
    if max_tokens is None and not (args.atac_config or os.environ.get("ATAC_CONFIG")
                                   or os.environ.get("ATAC_MAX_TOKENS")):
        max_tokens = 1024  # the demo corpus's samples (a flag, a file or ATAC_MAX_TOKENS wins over it)
    config = ATACConfig.from_sources(args.atac_config, overrides={"cp_size": args.cp_size, "max_tokens": max_tokens})
    accelerator = ATACAccelerator(config, gradient_accumulation_steps=args.gradient_accumulation_steps)
    tok = ByteTokenizer()
    # a list of samples (a datasets.Dataset with an input_ids column works the same)
    train = [{"input_ids": tok.encode(t)} for t in synthetic_corpus(args.num_samples, seed=args.seed, max_len=3072)]

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(num_layers=2), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)          # selects attn_implementation="atac_cp"
    loader, sampler = accelerator.packed_dataloader(train, seed=args.seed)

    GA = args.gradient_accumulation_steps
    step, epoch = 0, 0
    model.train()
    while step < args.max_steps:
        sampler.set_epoch(epoch)  # new packs each epoch (packed_dataloader keeps the loader in step)
        it = iter(loader)
        while step < args.max_steps:
            batches = [b for _, b in zip(range(GA), it)]   # the step's packs (fewer at the epoch's end)
            if not batches:
                break
            n_items = accelerator.count_items(batches)                  # global target count of the step
            step_loss, stats = 0.0, []
            for i, batch in enumerate(batches):
                # gradients are synced on the step's last pack only: accelerator.accumulate() cannot tell
                # which that is here (the loader is read ahead to the step's end, and it would sync there)
                with contextlib.nullcontext() if i == len(batches) - 1 else accelerator.no_sync(model):
                    inputs = accelerator.shard(batch, num_items_in_batch=n_items)
                    loss = model(**inputs).loss
                    accelerator.backward(loss)   # DDP/FSDP mean over dp x cp == sum of the CP shares
                step_loss += accelerator.reduce_loss(loss).item()
                stats.append(accelerator.sharder.last_stats)
            optimizer.step()                     # one update per step, the epoch's last (shorter) one too
            optimizer.zero_grad()
            step += 1
            if accelerator.is_main_process:
                imb = sum(s.imbalance for s in stats) / len(stats)
                kv = sum(s.kv_mb for s in stats) / len(stats)
                print(f"step {step:3d} | loss {step_loss:.6f} | imbalance {imb:.3f} | kv_mb {kv:.3f} | tokens "
                      f"{sum(s.num_tokens for s in stats)} | packs {len(stats)}", flush=True)
        epoch += 1
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())

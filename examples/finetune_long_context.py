#!/usr/bin/env python
"""Fine-tune a causal LM on long, variable-length data with WFAP packing and ATP-CP.

Embedded default (no download: a tiny Llama built from a config, a synthetic long-tail corpus,
a byte-level tokenizer), 2 CPU processes, CP 2::

    accelerate launch --config_file configs/cpu_cp2.yaml examples/finetune_long_context.py
    accelerate launch --config_file configs/cpu_cp2.yaml examples/finetune_long_context.py --compare

Your own model and data (hub name, local folder, or JSON lines with a "text" column)::

    accelerate launch --config_file configs/gpu_fsdp2_cp4.yaml examples/finetune_long_context.py \\
        --model_name_or_path meta-llama/Llama-3.2-1B --dataset data.jsonl --max_tokens 32768 \\
        --peft lora --bf16 --gradient_checkpointing --atac_config configs/atac_gpu.yaml

Prints, per optimizer step (main process): loss, grad norm, the plan's estimated imbalance
(max/mean per-rank compute), K/V MB one rank receives, planner ms, and step wall time. With
``--compare`` the same run is repeated with a baseline sharding on the same packs, from the
same initial weights, and both are printed side by side (losses must agree: both are exact).
"""

from __future__ import annotations

import argparse
import copy
import inspect
import math
import os
import sys
import time

import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("model and data")
    g.add_argument("--model_name_or_path", default=None, help="hub id or local folder (default: embedded tiny Llama)")
    g.add_argument("--tokenizer", default=None, help="tokenizer id or folder (default: the model's); 'byte': the "
                                                      "built-in byte-level tokenizer")
    g.add_argument("--dataset", default=None, help="hub name, local folder, or .json/.jsonl file "
                                                    "(default: embedded synthetic corpus)")
    g.add_argument("--dataset_config", default=None)
    g.add_argument("--dataset_split", default="train")
    g.add_argument("--text_column", default="text", help="text column to tokenize (unless the data has input_ids)")
    g.add_argument("--max_length", type=int, default=None, help="truncate samples to this many tokens")
    g.add_argument("--num_samples", type=int, default=None,
                   help="training samples: the synthetic corpus's size (default 600); with --dataset, use only its "
                        "first N rows (default: every row)")
    g.add_argument("--eval_samples", type=int, default=0, help="hold out this many samples and evaluate at the end")
    g.add_argument("--peft", choices=("none", "lora"), default="none")
    g.add_argument("--lora_r", type=int, default=8)
    g.add_argument("--lora_alpha", type=int, default=16)
    g.add_argument("--lora_target_modules", default="q_proj,k_proj,v_proj,o_proj")
    g = p.add_argument_group("ATP-CP and WFAP (override --atac_config / ATAC_* variables)")
    g.add_argument("--atac_config", default=None, help="the add-on's YAML (default: $ATAC_CONFIG)")
    g.add_argument("--cp_size", type=int, default=None, help="default: the launch config's parallelism_config_cp_size")
    g.add_argument("--max_tokens", type=int, default=None, help="tokens per pack (micro-batch row); default: the "
                                                               "config's (configs/atac_cpu.yaml for the embedded "
                                                               "default on CPU: 2048)")
    g.add_argument("--packing_strategy", default=None)
    g.add_argument("--sharding_strategy", default=None)
    g.add_argument("--attention_backend", default=None)
    g.add_argument("--compare", nargs="?", const="zigzag", default=None, metavar="BASELINE",
                   help="also run this baseline sharding (default zigzag: torch/Accelerate's) on the same packs")
    g = p.add_argument_group("training")
    g.add_argument("--max_steps", type=int, default=30)
    g.add_argument("--learning_rate", type=float, default=2e-3)
    g.add_argument("--gradient_accumulation_steps", type=int, default=1)
    g.add_argument("--gradient_checkpointing", action="store_true")
    g.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--output_dir", default=None, help="default: a temporary folder; checkpoints only if given")
    g.add_argument("--save_steps", type=int, default=0)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- data
def load_dataset_and_tokenizer(args):
    try:
        import datasets
    except ImportError:  # the embedded corpus runs on lists of samples (a machine with torch and transformers only)
        datasets = None

    from atac_hf.integrations.demo import ByteTokenizer, synthetic_corpus

    name = args.tokenizer or args.model_name_or_path
    if name is None or name == "byte":
        tokenizer = ByteTokenizer()
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name)
    if args.dataset is None:
        texts = synthetic_corpus((600 if args.num_samples is None else args.num_samples) + args.eval_samples,
                                 seed=args.seed)
        if datasets is None:
            return _split_samples(args, [{"input_ids": _encode(tokenizer, t, args.max_length)} for t in texts]) + (
                tokenizer,)
        ds = datasets.Dataset.from_dict({"text": texts})
    elif datasets is None:
        raise ImportError(f"--dataset {args.dataset!r} needs the datasets package (pip install datasets); without "
                          "it only the embedded corpus (no --dataset) runs")
    elif os.path.isfile(args.dataset):
        ds = datasets.load_dataset("json", data_files=args.dataset, split="train")
    elif os.path.isdir(args.dataset) and os.path.isfile(os.path.join(args.dataset, "dataset_info.json")):
        ds = datasets.load_from_disk(args.dataset)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[args.dataset_split]
    else:
        ds = datasets.load_dataset(args.dataset, args.dataset_config, split=args.dataset_split)
    if args.dataset is not None and args.num_samples is not None and len(ds) > args.num_samples + args.eval_samples:
        if int(os.environ.get("RANK", "0")) == 0:  # once, not on every rank
            print(f"using the first {args.num_samples + args.eval_samples} of the dataset's {len(ds)} rows "
                  "(--num_samples + --eval_samples)", flush=True)
        ds = ds.select(range(args.num_samples + args.eval_samples))
    if "input_ids" not in ds.column_names:
        if args.text_column not in ds.column_names:
            raise ValueError(f"dataset {args.dataset!r} has neither 'input_ids' nor the text column "
                             f"{args.text_column!r}; columns found: {ds.column_names} (set --text_column)")

        def tokenize(batch):
            return {"input_ids": [_encode(tokenizer, text, args.max_length) for text in batch[args.text_column]]}

        ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names, desc="tokenizing")
    ds = ds.select_columns([c for c in ("input_ids", "labels") if c in ds.column_names])
    return _split_samples(args, ds) + (tokenizer,)


def _encode(tokenizer, text, max_length):
    """A text's token ids, ending in EOS (where the tokenizer has one), cut to ``max_length`` if set."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = list(tokenizer(text)["input_ids"])
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids[:max_length] if max_length else ids


def _split_samples(args, ds):
    """(train, evals): the last --eval_samples rows held out (a datasets.Dataset or a list of samples)."""
    if not args.eval_samples:
        return ds, None
    if not 0 < args.eval_samples < len(ds):
        raise ValueError(f"--eval_samples={args.eval_samples} must be from 1 to {len(ds) - 1}: the data hold "
                         f"{len(ds)} samples and training needs at least one; lower --eval_samples")
    cut = len(ds) - args.eval_samples
    if isinstance(ds, list):
        return ds[:cut], ds[cut:]
    return ds.select(range(cut)), ds.select(range(cut, len(ds)))


def build_model(args, tokenizer=None):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

    torch.manual_seed(args.seed)
    dtype = torch.float32
    if args.model_name_or_path is None:
        from atac_hf.integrations.demo import tiny_llama_config

        # the embedded model with --tokenizer of your own: an embedding table for that tokenizer's ids
        vocab = {"vocab_size": len(tokenizer)} if isinstance(tokenizer, PreTrainedTokenizerBase) else {}
        model = AutoModelForCausalLM.from_config(tiny_llama_config(**vocab), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=dtype)
    if args.peft == "lora":
        from peft import LoraConfig, get_peft_model

        targets = [t.strip() for t in args.lora_target_modules.split(",") if t.strip()]
        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, target_modules=targets,
                                                 lora_dropout=0.0, task_type="CAUSAL_LM"))
    return model


# ---------------------------------------------------------------------------- run
class StepPrinter:
    """Collects per-step logs (and wall time) and prints them on the main process."""

    def __init__(self, label: str, verbose: bool):
        from transformers import TrainerCallback

        printer = self

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                printer._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                printer._last_step_s = time.perf_counter() - printer._t0

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs and "train_loss" not in logs:
                    row = {"step": state.global_step, "loss": logs["loss"], "grad_norm": logs.get("grad_norm"),
                           "imbalance": logs.get("atac/imbalance"), "kv_mb": logs.get("atac/kv_mb"),
                           "planner_ms": logs.get("atac/planner_ms"), "step_s": printer._last_step_s}
                    printer.rows.append(row)
                    if printer.verbose and state.is_world_process_zero:
                        print(f"[{printer.label}] step {row['step']:3d} | loss {row['loss']:.4f} | grad_norm "
                              f"{row['grad_norm']:.3f} | imbalance {row['imbalance']:.3f} | kv_mb "
                              f"{row['kv_mb']:.3f} | planner_ms {row['planner_ms']:.2f} | step_s "
                              f"{row['step_s']:.2f}", flush=True)

        self.label, self.verbose, self.rows = label, verbose, []
        self._t0, self._last_step_s = 0.0, float("nan")
        self.callback = _CB()


def run(args, atac_config, model, train, evals, output_dir: str, label: str):
    from transformers import PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACTrainer

    # transformers renamed gradient_checkpointing to activation_checkpointing during 5.x (5.17 has only the old name)
    ckpt = "activation_checkpointing" if "activation_checkpointing" in inspect.signature(TrainingArguments).parameters \
        else "gradient_checkpointing"
    targs = TrainingArguments(
        output_dir=output_dir, max_steps=args.max_steps, learning_rate=args.learning_rate,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=1, per_device_eval_batch_size=1,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        **{ckpt: args.gradient_checkpointing}, bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(), logging_steps=1, report_to=[], seed=args.seed,
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        disable_tqdm=True, dataloader_num_workers=0, log_level="warning", ddp_find_unused_parameters=False,
    )
    printer = StepPrinter(label, verbose=True)
    trainer = ATACTrainer(model=model, args=targs, train_dataset=train, eval_dataset=evals,
                          atac_config=atac_config, callbacks=[printer.callback])
    trainer.remove_callback(PrinterCallback)  # StepPrinter prints the same logs, one line per step
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    eval_loss = trainer.evaluate()["eval_loss"] if evals is not None else None
    return printer.rows, wall, eval_loss, trainer


def main(argv=None) -> int:
    args = parse_args(argv)
    import transformers

    from atac_hf.integrations import ATACConfig
    from atac_hf.packing.data.dataset import dataset_lengths

    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # optional for the embedded corpus
        pass
    transformers.utils.logging.disable_progress_bar()

    overrides = {"cp_size": args.cp_size, "max_tokens": args.max_tokens, "packing_strategy": args.packing_strategy,
                 "sharding_strategy": args.sharding_strategy, "attention_backend": args.attention_backend}
    config_file = args.atac_config
    if config_file is None and not os.environ.get("ATAC_CONFIG") and args.model_name_or_path is None \
            and not torch.cuda.is_available():
        # the embedded default on CPU: the demo's settings, with a cost profile measured on a CPU
        config_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "atac_cpu.yaml")
    atac_config = ATACConfig.from_sources(config_file, overrides=overrides)
    train, evals, tokenizer = load_dataset_and_tokenizer(args)
    model = build_model(args, tokenizer)
    baseline_model = copy.deepcopy(model) if args.compare else None

    import tempfile

    out = args.output_dir or tempfile.mkdtemp(prefix="atac_finetune_")
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        print(f"atac config: {os.path.relpath(config_file) if config_file else '(ATAC_* / flags / defaults)'} | "
              f"cost model: {os.path.relpath(atac_config.cost_profile) if atac_config.cost_profile else atac_config.cost_preset}", flush=True)
        tp = int(os.environ.get("PARALLELISM_CONFIG_TP_SIZE", "1") or 1)  # the launch config's tp size
        mesh = f"dp {world // (atac_config.cp_size * tp)} x cp {atac_config.cp_size}" + (f" x tp {tp}" if tp > 1 else "")
        print(f"world {world} = {mesh} | packing "
              f"{atac_config.packing_strategy} (max_tokens {atac_config.max_tokens}) | sharding "
              f"{atac_config.sharding_strategy} | backend {atac_config.attention_backend} | "
              f"{len(train)} samples, {int(dataset_lengths(train).sum())} tokens", flush=True)
    rows, wall, eval_loss, trainer = run(args, atac_config, model, train, evals, out, atac_config.sharding_strategy)
    if rank0:
        _summary(atac_config.sharding_strategy, rows, wall, eval_loss)
    if args.compare:
        base_cfg = atac_config.replace(sharding_strategy=args.compare)
        base_out = os.path.join(out, f"baseline-{args.compare}")
        base_rows, base_wall, base_eval, _ = run(args, base_cfg, baseline_model, train, evals, base_out, args.compare)
        if rank0:
            _summary(args.compare, base_rows, base_wall, base_eval)
            _side_by_side(atac_config.sharding_strategy, rows, args.compare, base_rows)
    # End the processes together and destroy the process group: a gloo group left to the interpreter's
    # shutdown can abort the process (SIGABRT) after all the work is done
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


def _mean(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
    return sum(vals) / len(vals) if vals else float("nan")


def _summary(label, rows, wall, eval_loss):
    if not rows:
        return
    msg = (f"[{label}] {len(rows)} steps in {wall:.1f}s | loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} | "
           f"mean imbalance {_mean(rows, 'imbalance'):.3f} | mean kv_mb {_mean(rows, 'kv_mb'):.3f} | mean planner_ms "
           f"{_mean(rows, 'planner_ms'):.2f} | mean step_s (steps 2+) {_mean(rows[1:], 'step_s'):.3f}")
    if eval_loss is not None:
        msg += f" | eval_loss {eval_loss:.4f}"
    print(msg, flush=True)


def _side_by_side(a, rows_a, b, rows_b):
    print(f"\n{'step':>4} | {'loss ' + a:>14} {'loss ' + b:>14} | {'imb ' + a:>10} {'imb ' + b:>10} | "
          f"{'kv_mb ' + a:>11} {'kv_mb ' + b:>11} | {'step_s ' + a:>11} {'step_s ' + b:>11}")
    for ra, rb in zip(rows_a, rows_b):
        print(f"{ra['step']:>4} | {ra['loss']:>14.4f} {rb['loss']:>14.4f} | {ra['imbalance']:>10.3f} "
              f"{rb['imbalance']:>10.3f} | {ra['kv_mb']:>11.3f} {rb['kv_mb']:>11.3f} | {ra['step_s']:>11.3f} "
              f"{rb['step_s']:>11.3f}")
    n = min(len(rows_a), len(rows_b))
    dl = max((abs(rows_a[i]["loss"] - rows_b[i]["loss"]) for i in range(n)), default=float("nan"))
    print(f"mean  | imbalance {a} {_mean(rows_a, 'imbalance'):.3f} vs {b} {_mean(rows_b, 'imbalance'):.3f} | kv_mb "
          f"{_mean(rows_a, 'kv_mb'):.3f} vs {_mean(rows_b, 'kv_mb'):.3f} | step_s (steps 2+) "
          f"{_mean(rows_a[1:], 'step_s'):.3f} vs {_mean(rows_b[1:], 'step_s'):.3f} | max |loss diff| {dl:.2e}", flush=True)
    print("(imbalance and kv_mb are the planner's estimates for each pack; step_s is wall time, noisy on shared "
          "machines, and the first run also pays warm-up costs)", flush=True)


if __name__ == "__main__":
    sys.exit(main())

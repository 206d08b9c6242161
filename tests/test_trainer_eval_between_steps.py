"""ATACTrainer in one process (no wrapper keeps the model in train mode): a training step right after
an evaluation is still counted and logged as training (Trainer shards before its model.train())."""

from __future__ import annotations

import warnings

import torch


def _run(tmp_path, eval_steps):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, LlamaConfig, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(0)
    lens = [90, 5, 40, 1, 60, 33, 70, 12, 80, 25, 50, 8, 66, 44, 20, 3]
    ds = Dataset.from_list([{"input_ids": torch.randint(3, 64, (n,), generator=g).tolist()} for n in lens])
    extra = dict(eval_strategy="steps", eval_steps=eval_steps) if eval_steps else {}
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=5, per_device_train_batch_size=1, logging_steps=1,
                             report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
                             include_num_input_tokens_seen=True, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = ATACTrainer(model=model, args=args, train_dataset=ds, eval_dataset=ds if eval_steps else None,
                         atac_config=ATACConfig(cp_size=1, max_tokens=128))
        out = tr.train()
    rows = [h for h in tr.state.log_history if "loss" in h and "eval_loss" not in h]
    return rows, out.metrics, tr.state.num_input_tokens_seen


def test_steps_after_an_evaluation_are_counted_and_logged(tmp_path):
    rows, metrics, tokens = _run(tmp_path / "eval", eval_steps=2)
    ref_rows, ref_metrics, ref_tokens = _run(tmp_path / "plain", eval_steps=None)
    assert len(rows) == len(ref_rows) == 5
    assert all("atac/imbalance" in r and "atac/planner_ms" in r for r in rows), rows
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref_rows]
    docs = metrics["train_samples_per_second"] * metrics["train_runtime"]
    ref_docs = ref_metrics["train_samples_per_second"] * ref_metrics["train_runtime"]
    assert abs(docs - ref_docs) <= 0.02 * ref_docs, (docs, ref_docs)
    assert tokens == ref_tokens

"""The oldest transformers the GPU image has (5.17; pyproject: >= 5.0): found by a run of the suites
under transformers 5.17 / accelerate 1.15. Each test imitates the older API on the installed one."""

from __future__ import annotations

import pytest
import torch


def _trainer(tmp_path):
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    model = AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1), dtype=torch.float32)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True,
                             log_level="error", max_steps=4)
    data = [{"input_ids": list(range(1, 2 + i % 7))} for i in range(20)]
    return ATACTrainer(model=model, args=args, train_dataset=data, atac_config=ATACConfig(cp_size=1, max_tokens=64))


@pytest.mark.parametrize("initial", [None, 0, 2])
def test_finalize_training_reports_the_documents_trained_with_or_without_initial_global_step(
        tmp_path, monkeypatch, initial):
    """transformers < 5.19 has no ``_initial_global_step`` and reports ``num_train_samples`` as given: every
    ATACTrainer.train() failed at its end there (AttributeError), the README's first command included."""
    from transformers import Trainer

    got = {}
    monkeypatch.setattr(Trainer, "_finalize_training", lambda self, trial, n, *a, **k: got.setdefault("n", n))
    trainer = _trainer(tmp_path)
    trainer.state.global_step, trainer.state.max_steps, trainer._atac_docs_trained = 4, 4, 12
    if initial is None:
        trainer.__dict__.pop("_initial_global_step", None)
        monkeypatch.delattr(Trainer, "_initial_global_step", raising=False)
        assert not hasattr(trainer, "_initial_global_step")
    else:
        trainer._initial_global_step = initial
    trainer._finalize_training(None, 999, 0.0)
    run = 4 - (initial or 0)
    # Trainer >= 5.19 reports n x (steps run) / max_steps: 12 documents either way
    assert (got["n"] if initial is None else got["n"] * run / 4) == pytest.approx(12.0)


def test_tensor_parallelism_on_a_transformers_without_its_api_names_the_version():
    """transformers < 5.23 has tp_plan but not _resolve_parallel_plans / the 3-argument
    apply_tensor_parallelism: the refusal said the model was not a PreTrainedModel."""
    from transformers import LlamaForCausalLM

    from atac_hf.integrations.demo import tiny_llama_config
    from atac_hf.integrations.tensor_parallel import check_tp_model

    class Older(LlamaForCausalLM):
        @property
        def _resolve_parallel_plans(self):
            raise AttributeError("_resolve_parallel_plans")

    model = Older(tiny_llama_config(hidden_size=32, num_layers=1))
    with pytest.raises(ValueError, match=r"tp_size=2 needs transformers >= 5.23 \(its tensor-parallel API; installed "
                                         r"5\.\d+.*set tp_size=1"):
        check_tp_model(model, 2)


def test_the_example_runs_its_embedded_corpus_without_datasets(monkeypatch):
    """The GPU image has torch and transformers but no ``datasets``: the example (the README's first command)
    imported it unconditionally. Without it, the embedded corpus is tokenized into lists: the same samples."""
    import importlib.util
    import os
    import sys

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "finetune_long_context.py")
    spec = importlib.util.spec_from_file_location("finetune_long_context_compat", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parse_args(["--num_samples", "12", "--eval_samples", "3", "--max_length", "700"])
    train, evals, _ = example.load_dataset_and_tokenizer(args)
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    train2, evals2, _ = example.load_dataset_and_tokenizer(args)
    assert isinstance(train2, list) and [r["input_ids"] for r in train2] == train["input_ids"]
    assert [r["input_ids"] for r in evals2] == evals["input_ids"] and len(train2) == 12
    with pytest.raises(ImportError, match=r"--dataset 'x.json' needs the datasets package"):
        example.load_dataset_and_tokenizer(example.parse_args(["--dataset", "x.json"]))

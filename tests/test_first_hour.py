"""The first hour of a new user (issue 17): what a fresh script meets first.

``import atac_hf`` registers ``atac_cp``; a custom collator is refused at construction;
the Trainer runs on CPU without ``use_cpu``; ``atac-hf bench`` writes only where told and
says which workload it used; ``simulate`` explains its columns; calibrate reports progress.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_MODEL = textwrap.dedent("""
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=128)
    """)


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------- item 1: registration on import
@pytest.mark.parametrize("order", ["atac_hf first", "transformers first"])
def test_import_atac_hf_registers_atac_cp(order):
    first = ("import atac_hf\n"
             "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'import atac_hf imported torch'\n"
             "import transformers\n") if order == "atac_hf first" else \
            ("import transformers, transformers.modeling_utils\nimport atac_hf\n")
    code = "import sys\n" + first + _MODEL + textwrap.dedent("""
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation="atac_cp")
        assert m.config._attn_implementation == "atac_cp", m.config._attn_implementation
        import atac_hf._attention_hook as hook
        assert hook._FINDER not in sys.meta_path, "the hook removes itself once it fired"
        import transformers.modeling_utils as mu
        assert type(mu.__loader__).__name__ != "_RegisteringLoader", "the module keeps its own loader"
        print("ok")
        """)
    r = _py(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_without_the_hook_transformers_refuses_atac_cp():
    """Not vacuous: with the hook taken out, plain transformers does not know the name."""
    code = "import atac_hf, atac_hf._attention_hook as h\nh.remove_hook()\n" + _MODEL + textwrap.dedent("""
        try:
            AutoModelForCausalLM.from_config(cfg, attn_implementation="atac_cp")
        except Exception as e:
            print("refused", type(e).__name__)
        else:
            print("accepted")
        """)
    r = _py(code)
    assert r.returncode == 0 and "refused" in r.stdout, (r.stdout, r.stderr[-2000:])


# ---------------------------------------------------------------------------- item 2: the collator check
def _tiny_trainer(tmp_path, **kwargs):
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=64,
                                                               max_position_embeddings=256), dtype=torch.float32)
    ds = datasets.Dataset.from_dict({"input_ids": [[i % 60 + 1 for i in range(n)] for n in (40, 7, 90, 25)]})
    args = kwargs.pop("args", None) or TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                                          max_steps=2, logging_steps=1, disable_tqdm=True)
    return ATACTrainer(model=model, args=args, train_dataset=ds,
                       atac_config=ATACConfig(cp_size=1, max_tokens=128, cost_preset="default"), **kwargs)


def _word_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 63, **{f"w{i}": i for i in range(1, 63)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]")


def _concatenating(features):
    import torch

    ids = torch.tensor([[t for f in features for t in f["input_ids"]]])
    return {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(ids.shape[1])[None]}


def _broken(features):
    raise KeyError("text")


@pytest.mark.parametrize("collator, match", [
    ("lm", r"data_collator=DataCollatorForLanguageModeling pads its rows .*position_ids"),
    (_concatenating, r"data_collator=_concatenating gave 1 document\(s\) .* for 2 samples .*its own document"),
    (_broken, r"data_collator=_broken raised KeyError: 'text'.*'input_ids' \(1, S\), 'labels' \(1, S\)"),
    (lambda f: {"input_ids": [1, 2]}, r"returned no 'labels'.*DataCollatorWithFlattening"),
])
def test_a_collator_that_does_not_pack_is_refused_at_construction(tmp_path, collator, match):
    if collator == "lm":
        from transformers import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(_word_tokenizer(), mlm=False)
    with pytest.raises(ValueError, match=match):
        _tiny_trainer(tmp_path, data_collator=collator)


def test_a_flattening_collator_is_accepted_and_trains(tmp_path):
    from transformers import DataCollatorWithFlattening

    trainer = _tiny_trainer(tmp_path, data_collator=DataCollatorWithFlattening())
    out = trainer.train()
    assert out.global_step == 2 and out.training_loss > 0


def test_without_padding_no_documents_found_names_the_keys(tmp_path):
    import torch

    def one_row(features):  # one row, labels, but no way to find the documents
        ids = torch.tensor([[t for f in features for t in f["input_ids"]]])
        return {"input_ids": ids, "labels": ids.clone()}

    with pytest.raises(ValueError, match=r"data_collator=.*one_row: cannot find the documents .*keys \['input_ids', "
                                         r"'labels'\]"):
        _tiny_trainer(tmp_path, data_collator=one_row)


# ---------------------------------------------------------------------------- items 3, 9: Trainer defaults and figures
def test_batch_size_warning_only_for_a_size_the_user_set(tmp_path):
    import warnings

    from transformers import TrainingArguments

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _tiny_trainer(tmp_path)  # TrainingArguments' default batch size: not the user's choice
    assert not [w for w in seen if "is ignored by ATACTrainer" in str(w.message)]
    assert trainer.args.ddp_find_unused_parameters is False, "dense model: no find_unused_parameters warning"
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=4,
                             ddp_find_unused_parameters=True)
    with pytest.warns(UserWarning, match=r"per_device_train_batch_size=4 is ignored by ATACTrainer.*max_tokens"):
        trainer = _tiny_trainer(tmp_path, args=args)
    assert trainer.args.ddp_find_unused_parameters is True, "the user's own setting stays"


def test_train_samples_per_second_counts_the_documents_trained(tmp_path):
    from atac_hf.attention import doc_lengths_from_batch
    from atac_hf.integrations import ATACTrainer

    docs = []
    original = ATACTrainer._prepare_context_parallel_inputs

    def counting(self, model, inputs):
        if model.training:
            docs.append(len(doc_lengths_from_batch(inputs)))
        return original(self, model, inputs)

    trainer = _tiny_trainer(tmp_path)
    trainer._prepare_context_parallel_inputs = counting.__get__(trainer)
    metrics = trainer.train().metrics
    assert len(docs) == 2 and sum(docs) >= 2
    # Trainer's own figure would be 2 steps x per_device_train_batch_size 8 = 16 samples
    assert metrics["train_samples_per_second"] * metrics["train_runtime"] == pytest.approx(sum(docs), rel=0.05)


@pytest.mark.slow
def test_readme_trainer_snippet_runs_on_cpu_without_use_cpu(tmp_path):
    """``accelerate launch`` on a CPU machine, the README's snippet as written (no use_cpu)."""
    import json
    import os

    sys.path.insert(0, os.path.dirname(__file__))
    from _launch import accelerate_launch

    proc = accelerate_launch("configs/cpu_cp2.yaml", ROOT / "tests" / "_readme_trainer.py", tmp_path, timeout=600)
    text = proc.stdout + proc.stderr
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert res["world_size"] == 2 and res["use_cpu"] is True and res["steps"] == 3
    assert text.count("use_cpu=True") == 1, "one log line, from rank 0"
    assert "is ignored by ATACTrainer" not in text, "the user never set a batch size"
    assert "find_unused_parameters=True" not in text

"""Red-team 51: INTEGRATION's ``class ATACSFTTrainer(ATACTrainer, SFTTrainer)`` in ``evaluate()`` and ``predict()``
(docs/RELIABILITY.md, "Red-team 51"). TRL's ``prediction_step`` calls ``compute_loss`` itself, so ATACTrainer counts
the pack's targets and shards it there (``sharded_prediction_step``, red-team 49) and hands the count to TRL's loss.
TRL's loss divides its MoE router loss by ``current_gradient_accumulation_steps`` wherever a count is given (a
training rule): with the count now given in evaluation, ``evaluate()`` before ``train()`` failed on an MoE model
(``AttributeError: ... current_gradient_accumulation_steps``, the attribute is set by the training loop), and after
training the eval loss took the router loss divided by the run's gradient accumulation. An evaluation batch is its
own: the step now runs with 1 there. Multi-process runs of the same paths: ``test_redteam49_families.py``."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from _newcomer45_sft_worker import V, chat_rows  # noqa: E402


def _mixtral(seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig

    cfg = MixtralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=V + 2, max_position_embeddings=256, num_local_experts=4,
                        num_experts_per_tok=2, router_aux_loss_coef=0.5)  # (a large term: visible in the eval loss)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float64, experts_implementation="eager")


def _sft_trainer(tmp_path, model, ga: int = 2):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from atac_hf import ATACConfig, ATACTrainer

    class ATACSFTTrainer(ATACTrainer, SFTTrainer):  # docs/INTEGRATION.md, "TRL's SFTTrainer"
        pass

    vocab = {str(i): i for i in range(V)} | {"<pad>": V, "<eos>": V + 1}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="0")),
                                  pad_token="<pad>", eos_token="<eos>")
    args = SFTConfig(output_dir=str(tmp_path), max_length=None, gradient_accumulation_steps=ga,
                     per_device_train_batch_size=1, use_cpu=True, report_to=[], disable_tqdm=True,
                     save_strategy="no", log_level="error")
    return ATACSFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict(chat_rows(8)),
                          processing_class=tok, atac_config=ATACConfig(cp_size=1, max_tokens=128, shuffle=False))


def _labelled(rows: dict) -> dict:
    return {"input_ids": rows["input_ids"],
            "labels": [[t if m else -100 for t, m in zip(ids, mask)]
                       for ids, mask in zip(rows["input_ids"], rows["assistant_masks"])]}


def test_sft_eval_of_an_moe_model_takes_its_router_loss_once(tmp_path, one_thread):
    """``ATACSFTTrainer.evaluate()`` of a Mixtral (TRL adds its router loss: ``router_aux_loss_coef`` in the config)
    before ``train()``: was ``AttributeError`` (TRL read ``current_gradient_accumulation_steps``); mid-run (GA 2) its
    eval loss took half the router loss. Now both equal ``ATACTrainer``'s, whose loss is the model's own (the
    language-model loss plus the router loss, once per pack)."""
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer

    evals = datasets.Dataset.from_dict(chat_rows(5, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sft = _sft_trainer(tmp_path / "sft", _mixtral(), ga=2)
        assert sft.aux_loss_enabled  # (TRL switched config.output_router_logits on)
        before = sft.evaluate(evals)
        sft.current_gradient_accumulation_steps = 2  # as the training loop leaves it at GA 2
        during = sft.evaluate(evals)
        assert sft.current_gradient_accumulation_steps == 2  # (put back)

        model = _mixtral()
        model.config.output_router_logits = True  # the model's own loss adds the router loss (what TRL adds)
        plain = ATACTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "plain"), use_cpu=True,
                                                                report_to=[], disable_tqdm=True, log_level="error"),
                            train_dataset=datasets.Dataset.from_dict(_labelled(chat_rows(8))),
                            atac_config=ATACConfig(cp_size=1, max_tokens=128, shuffle=False))
        want = plain.evaluate(datasets.Dataset.from_dict(_labelled(chat_rows(5, seed=1))))["eval_loss"]
    assert before["eval_aux_loss"] > 1.0  # the router loss is there, weighted 0.5: about 1 of the ~5.2 eval loss
    assert during["eval_loss"] == before["eval_loss"]  # (was 0.5 lower: half the router loss)
    # TRL's loss comes from its fused LM head, the plain one from the model's logits: ~3e-6 apart (measured)
    assert before["eval_loss"] == pytest.approx(want, rel=1e-5, abs=0.0)


def test_router_loss_refusal_names_trls_setting():
    """Under CP, ``ATACSFTTrainer`` on an MoE model is refused at construction: TRL turned
    ``config.output_router_logits`` on after ATACTrainer's checks, so the refusal's "set
    config.output_router_logits = False" is undone by TRL; it names ``SFTConfig(router_aux_loss_coef=0.0)`` too
    (with it, Mixtral at CP 2 evaluated and trained as at CP 1: docs/RELIABILITY.md, "Red-team 51")."""
    from atac_hf.attention.model_check import router_loss_refusal

    model = _mixtral()
    model.config.output_router_logits = True  # what SFTTrainer.__init__ sets
    _, why = router_loss_refusal(model.config)
    assert "SFTConfig(router_aux_loss_coef=0.0)" in why

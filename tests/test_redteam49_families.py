"""Red-team 49: ``ATACTrainer``'s training paths with model families other than GPT-2, bf16, and TRL's
``SFTTrainer`` in evaluation (docs/RELIABILITY.md, "Red-team 49").

Red-team 44's recorded runs and one-device replay (``tests/_redteam44_worker.py``: each document alone, plain SGD
with Trainer's normalisation) with tiny random fp64 configs of Llama (GQA; llama3 RoPE scaling), Qwen2 (sliding
window on one layer), Qwen3 (qk-norm), Mistral (sliding window), Gemma2 (attention and final logit soft-capping,
alternating sliding layers, scaled tied embeddings; eager reference), Gemma3, Phi3, OLMo2, GPT-NeoX (partial rotary),
Qwen2-MoE and Mixtral (router loss off: refused under CP): parameters after every step, grad norms and eval losses
agree to fp64 round-off once transformers' own fp32 steps (RMSNorm, rotary, routers, eager softmax) are kept in
fp64 on both sides (``_redteam49_worker.Fp64Steps``; with them, ~1e-7). bf16 (``bf16=True``, CPU autocast): CP 2
and 3 against CP 1 on the same packs, within bf16's round-off. ``class ATACSFTTrainer(ATACTrainer, SFTTrainer)``
(INTEGRATION, "TRL's SFTTrainer") failed in every evaluation, at cp_size 1 too: TRL's ``prediction_step`` never
calls Trainer's, which counts the pack's targets and shards it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _launch import ROOT, clean_env, torchrun  # noqa: E402

TOL = 1e-12
LOGGED_LOSS_TOL = 1e-6  # Trainer logs the loss through float32
FAMILIES = ("llama", "llama3_rope", "qwen2_sw", "qwen3", "mistral_sw", "gemma2", "gemma3", "phi3", "olmo2", "gpt_neox",
            "qwen2_moe", "mixtral")
WORKER = ROOT / "tests" / "_redteam49_worker.py"


def _check(out_dir, family: str, name: str, world: int) -> None:
    import _redteam49_worker as w49

    e = w49.compare(str(out_dir), family, name, world)
    label = f"{family} {name} world={world}: " + ", ".join(f"{k} {v:.2g}" for k, v in e.items() if isinstance(v, float))
    print("\n" + label)
    assert e["steps"] >= 3 and e["moved"] > 1e-2, label
    assert e["params"] <= TOL and e["rank_spread"] <= TOL and e["grad_norm"] <= TOL, label
    assert e["loss"] <= LOGGED_LOSS_TOL, label
    if "eval" in e:
        assert e["eval_steps"][0] == e["eval_steps"][1] and e["eval_steps"][0] and e["eval"] <= TOL, label


@pytest.mark.slow  # ~20 s per family on the shared 2-core machine
@pytest.mark.parametrize("family", FAMILIES)
def test_atac_trainer_cp3_equals_one_device_per_family(family, tmp_path):
    torchrun(3, WORKER, tmp_path, 3, family, "full", timeout=600)
    _check(tmp_path, family, "full", 3)


@pytest.mark.slow
@pytest.mark.parametrize("family", ("gemma2", "qwen2_sw", "mixtral"))
def test_atac_trainer_cp2_prompt_masked_equals_one_device(family, tmp_path):
    torchrun(2, WORKER, tmp_path, 2, family, "prompt_masked", timeout=600)
    _check(tmp_path, family, "prompt_masked", 2)


@pytest.mark.slow
@pytest.mark.parametrize("family", ("llama", "gemma2"))
def test_bf16_cp2_matches_cp1_within_bf16_round_off(family, tmp_path):
    """``bf16=True`` (fp32 weights, CPU autocast): CP 2 trains the packs CP 1 trains, fp32 weights kept, and
    differs from it by bf16 round-off only: no more than the bf16 run differs from the same run in fp32."""
    env = clean_env(PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, str(WORKER), str(tmp_path / "one"), "1", family, "bf16", "fp32"], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=600)
    torchrun(2, WORKER, tmp_path / "two", 2, family, "bf16", timeout=600)
    load = lambda d, s: torch.load(tmp_path / d / f"{family}-{s}.0.pt", weights_only=False)  # noqa: E731
    one, two, fp32 = load("one", "bf16"), load("two", "bf16"), load("one", "fp32")
    assert [r["input_ids"].tolist() for r in one["recorded"]] == [r["input_ids"].tolist() for r in two["recorded"]]
    assert {v.dtype for v in two["final"].values()} == {torch.float32}

    def apart(a, b):  # largest difference relative to the training's own update of the tensor
        return max(float((a["final"][k] - b["final"][k]).abs().max() / (a["final"][k] - a["init"][k]).abs().max())
                   for k in a["final"])

    cp, precision = apart(one, two), apart(one, fp32)
    print(f"\n{family} bf16: CP 2 vs CP 1 {cp:.2g} of the update; bf16 vs fp32 at CP 1 {precision:.2g}")
    assert cp <= 2 * precision and cp < 0.05, (cp, precision)
    assert max(abs(a - b) / a for a, b in zip(one["loss"], two["loss"])) < 1e-3
    assert abs(one["eval"][-1][1] - two["eval"][-1][1]) / one["eval"][-1][1] < 1e-3


@pytest.mark.slow
def test_atac_sft_trainer_evaluates_at_cp1_and_cp2_alike(tmp_path):
    """INTEGRATION's ``ATACSFTTrainer`` evaluated before and after training: was ``ValueError: ... needs the
    per-batch shard context`` at cp_size 1 and 2 (TRL's prediction_step skips Trainer's CP hook). Now the eval
    loss and TRL's eval metrics at CP 2 equal CP 1's."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    (tmp_path / "cp1").mkdir()
    (tmp_path / "cp2").mkdir()
    proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "cp1" / "out.json"), "1", "sft"], cwd=ROOT,
                          env=clean_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torchrun(2, WORKER, tmp_path / "cp2" / "out.json", 2, "sft", timeout=600)
    one, two = (json.loads((tmp_path / d / "out.json").read_text()) for d in ("cp1", "cp2"))
    assert len(one) == len(two) == 2 and one[1]["eval_loss"] != one[0]["eval_loss"]  # evaluated, then trained
    for a, b in zip(one, two):
        assert abs(a["eval_loss"] - b["eval_loss"]) <= 1e-6 * a["eval_loss"], (a, b)
        assert abs(a["eval_entropy"] - b["eval_entropy"]) <= 1e-5 * a["eval_entropy"], (a, b)
        assert a["eval_mean_token_accuracy"] == b["eval_mean_token_accuracy"] and a["eval_num_tokens"] == \
            b["eval_num_tokens"], (a, b)


# ---------------------------------------------------------------------------- fast: one process, cp_size 1
def _eval_trainer(tmp_path, cls):
    from transformers import AutoModelForCausalLM, LlamaConfig, TrainingArguments

    from atac_hf.integrations import ATACConfig

    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(0, 64, (n,), generator=g).tolist()} for n in (30, 5, 14, 1, 20, 11, 9, 25)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=1, report_to=[], use_cpu=True,
                             disable_tqdm=True, log_level="error")
    return cls(model=model, args=args, train_dataset=rows, eval_dataset=rows,
               atac_config=ATACConfig(cp_size=1, max_tokens=48, min_chunk=1))


@pytest.mark.parametrize("wraps", [False, True], ids=["loss_only", "wraps_trainers"])
def test_another_trainers_prediction_step_gets_the_pack_sharded(tmp_path, one_thread, wraps):
    """A trainer after ATACTrainer in the MRO whose ``prediction_step`` calls ``compute_loss`` itself, as TRL's
    ``SFTTrainer`` does (INTEGRATION's ``class ATACSFTTrainer(ATACTrainer, SFTTrainer)``): its evaluation failed
    ("needs the per-batch shard context"); now its eval loss is ATACTrainer's, from the pack's target count. One
    that calls Trainer's in turn (``wraps``) gets the pack sharded once."""
    import warnings

    from transformers import Trainer

    from atac_hf.integrations import ATACTrainer

    calls = []

    class LossOnly(Trainer):  # TRL's SFTTrainer.prediction_step, in short
        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            if wraps:
                calls.append(int(inputs["input_ids"].shape[1]))
                return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            inputs = self._prepare_inputs(inputs)
            with torch.no_grad():
                loss = self.compute_loss(model, inputs, return_outputs=False)
            calls.append(int(inputs["input_ids"].shape[1]))
            return loss.detach(), None, None

    class Combined(ATACTrainer, LossOnly):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = _eval_trainer(tmp_path / "plain", ATACTrainer).evaluate()["eval_loss"]
        combined = _eval_trainer(tmp_path / "combined", Combined).evaluate()["eval_loss"]
    assert calls and combined == pytest.approx(plain, rel=1e-12, abs=0.0)

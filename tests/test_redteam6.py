"""Red-team 6: a new user's scripts across model families (docs/RELIABILITY.md, "Red-team 6").

Each test is the minimal repro of one finding of that pass, fixed in the package or the docs."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

import atac_hf  # noqa: E402
from atac_hf import ATACConfig  # noqa: E402


def _tiny_llama(**over):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **over)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


# ---------------------------------------------------------------------------- refusal messages
def test_dynamic_rope_refusal_does_not_send_a_cp1_user_to_cp_size_1(tmp_path):
    # was: "... or train with cp_size=1 and another attn_implementation", shown to a user already at
    # cp_size=1, whom ATACTrainer refuses all the same (a packed row's largest position is not each document's)
    from atac_hf import ATACTrainer

    model = _tiny_llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1)
    with pytest.raises(ValueError) as err:
        ATACTrainer(model=model, args=args, train_dataset=ds, atac_config=ATACConfig(cp_size=1, max_tokens=32))
    msg = str(err.value)
    assert "rope type 'dynamic'" in msg and "(default, linear, llama3, yarn)" in msg
    assert "train with cp_size=1" not in msg
    assert "without atac-hf" in msg and "refuses it at cp_size=1 too" in msg
    assert model.config._attn_implementation != "atac_cp"  # a refused operation changes nothing


def test_non_attention_mixing_refusal_says_cp_size_1_is_refused_too():
    # was: "train it without atac-hf context parallelism (cp_size 1, unpacked rows or its stock attention)",
    # read as "set cp_size=1" although check_model (ATACTrainer, ATACAccelerator) refuses it at every cp_size
    from atac_hf.attention.model_check import config_refusal

    cfg = transformers.LlamaConfig(num_hidden_layers=2)
    cfg.layer_types = ["full_attention", "linear_attention"]
    kind, reason = config_refusal(cfg)
    assert kind is NotImplementedError and "config.layer_types has ['linear_attention']" in reason
    assert "cp_size 1, unpacked rows" not in reason
    assert "its stock attention on unpacked rows" in reason and "refuse it at cp_size=1 too" in reason
    model = _tiny_llama()
    model.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(NotImplementedError, match=r"refuse it at cp_size=1 too"):
        atac_hf.check_model(model)


def test_docs_no_longer_list_soft_capping_among_the_refused_features():
    # INTEGRATION.md's "Limitations" said logit soft-capping was refused, while MODELS.md lists gemma2 exact
    # and the sdpa backend applies it (red-team 6 trained a soft-capped Gemma 2 at CP 1 and CP 2: equal losses)
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "INTEGRATION.md").read_text()
    assert "attention dropout, logit soft-capping and" not in text
    assert "logit soft-capping runs\n  exactly on the `sdpa` backend" in text



def test_launch_config_cp_size_mismatch_says_atacconfig_defaults_to_cp_size_1():
    # a user launched with configs/cpu_cp2.yaml and built ATACConfig(max_tokens=...) in code, reading INTEGRATION.md's
    # "Unset cp_size falls back to PARALLELISM_CONFIG_CP_SIZE": the error said "cp_size=1 (ATAC config)", a value
    # they never wrote. It now names ATACConfig's default and both fixes; the docs say where the fallback applies.
    from pathlib import Path

    from atac_hf.integrations.accelerate import build_parallelism_config

    launch = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_CP_SIZE": "2"}
    with pytest.raises(ValueError, match=r"cp_size=1 \(ATAC config\) disagrees with parallelism_config_cp_size=2 .*"
                                         r"ATACConfig\(cp_size=2, \.\.\.\) \(an ATACConfig built in code without "
                                         r"cp_size has cp_size=1; ATACConfig.from_sources\(overrides="):
        build_parallelism_config(ATACConfig(max_tokens=64), 2, environ=launch)
    assert build_parallelism_config(ATACConfig(cp_size=2, max_tokens=64), 2, environ=launch).cp_size == 2
    text = (Path(__file__).resolve().parents[1] / "docs" / "INTEGRATION.md").read_text()
    assert "`ATACConfig(...)` built in code has\n`cp_size=1` unless passed" in text

# ---------------------------------------------------------------------------- pack_dataset on a small dataset
def _short_samples(n: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return datasets.Dataset.from_dict({"input_ids": [list(range(1, int(k) + 1)) for k in rng.integers(10, 40, n)]})


@pytest.mark.parametrize("n, replicas", [(60, 1), (200, 1), (60, 4)])
def test_pack_dataset_packs_a_small_dataset_instead_of_one_sample_per_row(n, replicas):
    # was: the default WFAP window of 64 packs spread a dataset of fewer tokens over 64 packs (60 samples
    # of 1,472 tokens at a 256-token cap: 60 rows of one sample each, where 6 rows hold them)
    import math

    ds = _short_samples(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, metrics = atac_hf.pack_dataset(ds, max_tokens=256, progress=False, return_metrics=True,
                                            num_replicas=replicas)
    need = math.ceil(sum(len(x) for x in ds["input_ids"]) / 256)
    assert metrics["lower_bound_packs"] == need
    assert len(out) == metrics["num_packs"] <= need + replicas  # evened to a multiple of the replicas at most
    assert len(out) % replicas == 0
    assert max(sum(s) for s in out["seq_lengths"]) <= 256
    # every token once, each sample whole
    got = sorted(tuple(r[a:a + k]) for r, s in zip(out["input_ids"], out["seq_lengths"])
                 for a, k in zip([sum(s[:i]) for i in range(len(s))], s))
    assert got == sorted(tuple(x) for x in ds["input_ids"])
    assert metrics["imbalance_mean"] < 1.2


def test_pack_dataset_keeps_the_full_window_where_the_small_one_would_make_more_packs():
    # samples of up to 700 tokens at a 1,024 cap: a window of ceil(tokens / cap) = 42 packs cannot hold them
    # balanced (WFAP takes 2 windows: 84 packs), so the full window of 64 packs is planned, as before
    import numpy as np

    L = np.random.default_rng(0).integers(1, 700, 120)
    ds = datasets.Dataset.from_dict({"input_ids": [list(range(k)) for k in L]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = atac_hf.pack_dataset(ds, max_tokens=1024, progress=False)
    assert len(out) == 64


# ---------------------------------------------------------------------------- plain Trainer + pack_dataset
def test_plain_trainer_with_pack_dataset_rows_needs_remove_unused_columns_false(tmp_path):
    # INTEGRATION.md said only "feed them to PackedDataCollator with batch_size=1": with a plain Trainer's
    # default remove_unused_columns=True, seq_lengths was dropped and every row trained as one document
    # (its samples attending to each other), silently. The docs now say to set remove_unused_columns=False;
    # this is the documented recipe, and the pitfall it avoids.
    from pathlib import Path

    from atac_hf import PackedDataCollator

    text = (Path(__file__).resolve().parents[1] / "docs" / "INTEGRATION.md").read_text()
    assert "`TrainingArguments(remove_unused_columns=False)`" in text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packed = atac_hf.pack_dataset(_short_samples(40), max_tokens=128, progress=False)
    seen = {}

    class Spy(PackedDataCollator):
        def __call__(self, features):
            out = super().__call__(features)
            seen.setdefault(len(seen), out["seq_lengths"].tolist())
            return out

    for keep in (True, False):
        seen.clear()
        args = transformers.TrainingArguments(output_dir=str(tmp_path / str(keep)), report_to=[], use_cpu=True,
                                              per_device_train_batch_size=1, max_steps=1, save_strategy="no",
                                              remove_unused_columns=not keep, disable_tqdm=True)
        model = _tiny_llama()
        transformers.Trainer(model=model, args=args, train_dataset=packed, data_collator=Spy()).train()
        first = seen[0]
        if keep:
            assert len(first) > 1 and first in [list(s) for s in packed["seq_lengths"]]
        else:
            assert len(first) == 1  # the pitfall: the whole row one document


# ---------------------------------------------------------------------------- overlength warning names the settings
def test_overlength_warning_names_the_setting_of_each_entry_point():
    # was: "set overlength='error' ... or 'truncate'" with no word on where: an ATACTrainer user sets it through
    # ATACConfig(packing_options=...), which the warning now names (and the named setting works)
    from atac_hf.packing import PackingConfig
    from atac_hf.packing.stream import StreamPacker

    with pytest.warns(UserWarning, match=r"overlength='split'.*overlength='error'.*'truncate'.*"
                                         r"ATACConfig\(packing_options=\{'overlength': \.\.\.\}\).*"
                                         r"pack_dataset\(overlength=\.\.\.\).*atac-hf pack --overlength"):
        StreamPacker(PackingConfig(max_tokens=16, packs_per_window=2)).add_window([0, 1], [40, 3])
    cfg = ATACConfig(max_tokens=16, packing_options={"overlength": "truncate"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StreamPacker(cfg.packing_config(2)).add_window([0, 1], [40, 3])


# ---------------------------------------------------------------------------- generate after training
def test_generate_after_atac_trainer_names_the_switch_back_and_the_switch_works(tmp_path):
    # was: model.generate() right after ATACTrainer.train() failed with "call model(**atac_hf.shard_batch(...))",
    # which sends a user who only wants to sample from the trained model to the sharding API
    from atac_hf import ATACTrainer

    model = _tiny_llama()
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5, 6]] * 6})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1,
                                          save_strategy="no", disable_tqdm=True)
    trainer = ATACTrainer(model=model, args=args, train_dataset=ds, atac_config=ATACConfig(max_tokens=32))
    trainer.train()
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"After training \(ATACTrainer and ATACAccelerator leave the model on "
                                         r"'atac_cp'\), switch the attention back before generate\(\) or a plain "
                                         r"forward: model.set_attn_implementation\('sdpa'\)"):
        trainer.model.generate(input_ids=prompt, max_new_tokens=2, do_sample=False)
    trainer.model.set_attn_implementation("sdpa")
    out = trainer.model.generate(input_ids=prompt, max_new_tokens=2, do_sample=False)
    assert out.shape == (1, 5)
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "INTEGRATION.md").read_text()
    assert 'switch back: `model.set_attn_implementation("sdpa")`' in text

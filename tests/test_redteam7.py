"""Red-team 7: hostile inputs and model families a new user tries first (docs/RELIABILITY.md, "Red-team 7").

Each test is the minimal repro of one finding of that pass, fixed in the package."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

import atac_hf  # noqa: E402
from atac_hf import ATACConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _tiny(family: str, cls_name: str):
    from atac_hf.attention.model_probe import shrink_config

    tiny = shrink_config(transformers.AutoConfig.for_model(family))
    torch.manual_seed(0)
    return getattr(transformers, cls_name)._from_config(copy.deepcopy(tiny)).float()


def _args(tmp_path, **over):
    return transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1,
                                          save_strategy="no", disable_tqdm=True, **over)


# ---------------------------------------------------------------------------- Gemma 4 (MODELS.md: exact)
def test_heterogeneous_config_dims_are_read_layer_by_layer():
    # was: AmbiguousGlobalPerLayerAttributeError ('head_dim' is a per-layer attribute) from ModelDims.from_hf_config
    # and model_kv_bytes_per_token, so ATACTrainer and ATACAccelerator failed on every Gemma 4 model (after switching
    # the model to atac_cp)
    from atac_hf import CostModel, ModelDims
    from atac_hf.integrations.sharder import model_kv_bytes_per_token

    model = _tiny("gemma4_text", "Gemma4ForCausalLM")
    cfg = model.config
    layers = list(cfg.per_layer_config)
    assert len({c.head_dim for c in layers}) == 2  # the case: wider global layers
    dims = ModelDims.from_hf_config(cfg)
    assert dims.head_dim == round(sum(c.head_dim for c in layers) / len(layers))
    assert dims.num_layers == cfg.num_hidden_layers and dims.num_kv_heads == cfg.num_key_value_heads
    assert CostModel.from_model(cfg).linear_s_per_token > 0
    want = 2 * sum(c.num_key_value_heads * c.head_dim for c in layers) * 4  # fp32
    assert model_kv_bytes_per_token(model) == want


def test_list_valued_config_fields_are_read_as_their_layers_mean():
    # was: "TypeError: int() argument must be ... not 'list'" from ModelDims.from_hf_config on Gemma 3n's text config
    # (intermediate_size has one entry per layer), so ATACTrainer failed on Gemma3nForCausalLM (MODELS.md: exact)
    from atac_hf import ModelDims

    dims = ModelDims.from_hf_config({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3,
                                     "intermediate_size": [100, 200, 300], "num_key_value_heads": [2, 2, 4]})
    assert dims.intermediate_size == 200 and dims.num_kv_heads == 2  # the mean; the most common head count
    cfg = _tiny("gemma3n_text", "Gemma3nForCausalLM").config
    assert isinstance(cfg.intermediate_size, list)
    assert ModelDims.from_hf_config(cfg).intermediate_size == round(sum(cfg.intermediate_size) / len(cfg.intermediate_size))


@pytest.mark.parametrize("family,cls_name", [pytest.param("gemma4_text", "Gemma4ForCausalLM", marks=pytest.mark.slow),
                                             ("gemma4", "Gemma4ForConditionalGeneration"),
                                             pytest.param("gemma3n_text", "Gemma3nForCausalLM", marks=pytest.mark.slow)])
def test_gemma4_and_gemma3n_train_with_atac_trainer(tmp_path, family, cls_name):
    # was: Gemma4ForConditionalGeneration refused ("does not accept loss kwargs"), after the model had been switched
    # to atac_cp: transformers 5.25 declares accepts_loss_kwargs=False on it (a stale opt-out from #37208) although
    # its forward hands num_items_in_batch to self.loss_function; both classes then failed on their per-layer head_dim
    from atac_hf import ATACTrainer

    model = _tiny(family, cls_name)
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12]] * 2})
    trainer = ATACTrainer(model=model, args=_args(tmp_path, logging_steps=1), train_dataset=ds,
                          atac_config=ATACConfig(cp_size=1, max_tokens=16))
    assert trainer.model_accepts_loss_kwargs  # Trainer passes num_items_in_batch
    trainer.train()
    assert torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))


class _MeanLossLlama(transformers.LlamaForCausalLM):
    """A model that declares accepts_loss_kwargs=False and means it: its loss ignores num_items_in_batch."""

    accepts_loss_kwargs = False

    def forward(self, *args, num_items_in_batch=None, **kwargs):
        return super().forward(*args, **kwargs)


def test_a_loss_that_ignores_num_items_is_refused_before_any_change(tmp_path):
    from atac_hf import ATACTrainer
    from atac_hf.integrations._hf_compat import loss_num_items_refusal

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = _MeanLossLlama(cfg)
    model.train()
    assert "its loss ignores num_items_in_batch" in loss_num_items_refusal(model) and model.training  # mode restored
    assert loss_num_items_refusal(transformers.LlamaForCausalLM(cfg)) is None
    broken = _MeanLossLlama(cfg)
    broken.lm_head = None  # a model the check cannot run: said so, not "ignores"
    assert loss_num_items_refusal(broken).startswith("the check of its loss on a 4-token row failed (TypeError")
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4})
    with pytest.raises(ValueError, match=r"_MeanLossLlama declares accepts_loss_kwargs=False and its loss ignores "
                                         r"num_items_in_batch .*ATP-CP needs the loss as the target sum"):
        ATACTrainer(model=model, args=_args(tmp_path), train_dataset=ds, atac_config=ATACConfig(cp_size=1, max_tokens=32))
    assert model.config._attn_implementation != "atac_cp"  # a refused operation changes nothing


@pytest.mark.slow
def test_gemma4_cp2_equals_cp1_step_by_step(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from _launch import accelerate_launch, clean_env, run

    script = ROOT / "tests" / "_redteam7_trainer.py"
    run([sys.executable, script, 1, tmp_path / "cp1.json"], timeout=300, env=clean_env())
    accelerate_launch("configs/cpu_cp2.yaml", script, 2, tmp_path / "cp2.json", timeout=600)
    one, two = (json.loads((tmp_path / f"cp{c}.json").read_text()) for c in (1, 2))
    assert len(one) == len(two) == 4
    for (loss1, norm1), (loss2, norm2) in zip(one, two):
        assert abs(loss1 - loss2) <= 1e-5 * abs(loss1) and abs(norm1 - norm2) <= 1e-5 * abs(norm1)


# ---------------------------------------------------------------------------- labels
@pytest.mark.parametrize("bad", [-1, -101])
def test_negative_labels_other_than_minus_100_are_refused_before_the_loss(tmp_path, bad):
    # was: labels -1 (another library's ignore index) were packed and collated, then failed at the loss with a bare
    # "IndexError: Target -1 is out of bounds" (on CUDA a device-side assert); count_targets counted them as targets
    from atac_hf import ATACTrainer, pack_dataset

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "labels": [[-100, 2], [3, 4, bad]]})
    with pytest.raises(ValueError, match=rf"sample 1: labels\[2\] is {bad}; labels must hold ints \(-100 where no loss\), "
                                         r"never null, no other negative"):
        pack_dataset(ds, max_tokens=8, progress=False)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    trainer = ATACTrainer(model=transformers.LlamaForCausalLM(cfg), args=_args(tmp_path), train_dataset=ds,
                          atac_config=ATACConfig(cp_size=1, max_tokens=8))
    with pytest.raises(ValueError, match=rf"labels holds {bad}: labels must be token ids >= 0, or -100 where a token "
                                         r"gets no loss .* replace the other negative labels with -100"):
        trainer.train()
    # -100 anywhere stays legal
    assert pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[-100, -100]]}), max_tokens=8,
                        progress=False)["labels"] == [[-100, -100]]


def test_cost_model_from_a_vision_language_config_reads_its_text_config():
    # was: CostModel.from_model(model.config) of a VLM (Gemma 3, Qwen3-VL, LLaVA) raised "cannot read model
    # dimensions: the config has no hidden_size/num_attention_heads", its text config inside
    from atac_hf import CostModel, ModelDims

    for family in ("gemma3", "qwen3_vl", "llava"):
        cfg = transformers.AutoConfig.for_model(family)
        assert ModelDims.from_hf_config(cfg) == ModelDims.from_hf_config(cfg.get_text_config())
        assert CostModel.from_model(cfg).replace(name="-") == CostModel.from_model(cfg.get_text_config()).replace(name="-")
    # and a config without an int layer count (a detection model's) is that ValueError, not int(None)'s TypeError
    with pytest.raises(ValueError, match=r"cannot read model dimensions: .*num_hidden_layers ints \(got 64/4/None"):
        ModelDims.from_hf_config({"hidden_size": 64, "num_attention_heads": 4})


def test_an_empty_split_of_a_datasetdict_is_named_before_any_split_is_packed(tmp_path):
    """was: the splits before it were packed (and cached, for an on-disk source), then 'pack_dataset got
    an empty dataset (0 rows)' without the split's name."""
    import datasets

    train = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4}).map(lambda r: r, cache_file_name=str(
        tmp_path / "train.arrow"))
    dd = datasets.DatasetDict({"train": train, "test": datasets.Dataset.from_dict({"input_ids": []})})
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=r"split\(s\) \['test'\].*0 rows.*pack the others"):
        atac_hf.pack_dataset(dd, max_tokens=8, progress=False)
    assert sorted(os.listdir(tmp_path)) == before  # nothing packed, no cache file written


# ---------------------------------------------------------------------------- token ids outside the vocabulary
@pytest.mark.parametrize("key,value", [("input_ids", 64), ("input_ids", 1000), ("labels", 64), ("labels", 1000)])
def test_token_ids_outside_the_vocabulary_are_refused_before_the_model_runs(tmp_path, key, value):
    # was: the embedding or the loss failed with torch's bare "IndexError: index out of range in self" (on CUDA a
    # device-side assert that ends the process); ATACTrainer and ATACAccelerator's sharder now check the pack
    from atac_hf import ATACTrainer
    from atac_hf.integrations.sharder import BatchSharder, token_limits

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    assert token_limits(model) == (64, 64)

    class NoAccessor(torch.nn.Module):  # remote code without the accessors: nothing to check, no error
        def get_input_embeddings(self):
            raise NotImplementedError

    assert token_limits(NoAccessor()) == (None, None)
    rows = {"input_ids": [[1, 2, 3], [4, 5]], "labels": [[-100, 2, 3], [-100, 5]]}
    rows[key][1][1] = value
    ds = datasets.Dataset.from_dict(rows)
    trainer = ATACTrainer(model=model, args=_args(tmp_path), train_dataset=ds,
                          atac_config=ATACConfig(cp_size=1, max_tokens=8))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    what = "input embedding table" if key == "input_ids" else "LM head's outputs"
    with pytest.raises(ValueError, match=rf"{key}\[0, \d\] is {value}, outside the model's {what} of 64 \(legal: "
                                         rf"0..63.*resize_token_embeddings"):
        trainer.train()
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # no step was taken
    # an unbound sharder (no model) checks nothing; -100 labels and the last id stay legal
    sharder = BatchSharder(ATACConfig(cp_size=1, max_tokens=8))
    sharder.bind_model(model, None)
    ok = {"input_ids": torch.tensor([[63, 0, 5]]), "labels": torch.tensor([[-100, 63, 0]]),
          "position_ids": torch.tensor([[0, 1, 2]])}
    assert sharder(ok)["input_ids"].shape == (1, 3)


# ---------------------------------------------------------------------------- pack_lengths called as pack_dataset
def test_pack_lengths_takes_packing_settings_by_name():
    # was: pack_lengths(lengths, max_tokens=...) (as pack_dataset is called) failed with Python's bare
    # "unexpected keyword argument"; a PackingConfig was the only way
    from atac_hf import PackingConfig, pack_lengths

    lengths = [5, 3, 9, 2, 7, 1, 4]
    by_name = pack_lengths(lengths, max_tokens=10)
    assert by_name.packs == pack_lengths(lengths, PackingConfig(max_tokens=10, packs_per_window=64)).packs
    base = PackingConfig(max_tokens=10, packs_per_window=2, strategy="bfd")
    over = pack_lengths(lengths, base, max_tokens=12)  # settings go over the config
    assert over.packs == pack_lengths(lengths, PackingConfig(max_tokens=12, packs_per_window=2, strategy="bfd")).packs
    with pytest.raises(TypeError, match=r"pack_lengths needs a token cap: pack_lengths\(lengths, max_tokens=4096\)"):
        pack_lengths(lengths)
    with pytest.raises(TypeError, match=r"unknown packing setting\(s\) \['max_tok'\]; legal: \[.*'max_tokens'"):
        pack_lengths(lengths, max_tok=10)
    with pytest.raises(TypeError, match=r"config must be a PackingConfig or None, got int \(pass settings by name"):
        pack_lengths(lengths, 10)
    with pytest.raises(ValueError, match=r"max_tokens=0 is invalid"):
        pack_lengths(lengths, max_tokens=0)
    assert base.max_tokens == 10  # the given config is not changed

"""Settings and models that would train something other than one device does, refused (or warned
about) before the first step: MoE router losses under CP, a Trainer ``compute_loss_func`` under CP,
prompt-learning PEFT adapters, padded samples, a per-rank cap a full pack cannot meet, cost
profiles with missing or bad fields, a ``DatasetDict`` where one split is needed, windows smaller
than the packs they fill, and ``atac_cp`` on a model ``check_model`` never accepted. Found by a
red-team pass over the public API; each error names the value, what is legal and the setting."""

from __future__ import annotations

import json
import os
import sys
import types
import warnings

import numpy as np
import pytest
import torch

from atac_hf import ATACConfig, PackedDataCollator, check_model, plan_shards, shard_batch
from atac_hf.attention import runtime
from atac_hf.attention.model_check import peft_refusal, router_loss_refusal
from atac_hf.cost import CostModel, default_cost_model
from atac_hf.integrations.data import build_packed_dataloader, check_dataset_columns
from atac_hf.integrations.sharder import prepare_model

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402


def _mixtral(**kw):
    from transformers import MixtralConfig

    return MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, num_local_experts=4, num_experts_per_tok=2, **kw)


# ---------------------------------------------------------------------------- MoE router losses
def test_a_router_load_balancing_loss_is_refused_under_cp():
    refused = router_loss_refusal(_mixtral(output_router_logits=True, router_aux_loss_coef=0.02))
    assert refused is not None and refused[0] is NotImplementedError
    assert "output_router_logits=True" in refused[1] and "router_aux_loss_coef=0.02" in refused[1]
    assert "output_router_logits = False" in refused[1] and "cp_size=1" in refused[1]


@pytest.mark.parametrize("kw", [dict(output_router_logits=False), dict(output_router_logits=True, router_aux_loss_coef=0.0)])
def test_moe_without_a_weighted_router_loss_passes(kw):
    assert router_loss_refusal(_mixtral(**kw)) is None
    assert router_loss_refusal(_dist.tiny_config("llama")) is None


def test_prepare_model_refuses_the_router_loss_only_over_several_cp_ranks():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_mixtral(output_router_logits=True, router_aux_loss_coef=0.02))
    before = model.config._attn_implementation
    with pytest.raises(NotImplementedError, match="router load-balancing loss"):
        prepare_model(model, ATACConfig(cp_size=2))
    assert model.config._attn_implementation == before  # a refused operation changes nothing
    prepare_model(model, ATACConfig(cp_size=1))  # one rank sees the whole packed row: the stock loss
    assert model.config._attn_implementation == "atac_cp"


def test_the_atac_cp_attention_refuses_the_router_loss_at_its_first_call_over_several_ranks():
    module = types.SimpleNamespace(is_causal=True)
    cfg = _mixtral(output_router_logits=True, router_aux_loss_coef=0.02)
    with pytest.raises(NotImplementedError, match="router load-balancing loss"):
        runtime._check_config(module, cfg, 2)
    runtime._check_config(module, cfg, 1)


# ---------------------------------------------------------------------------- Trainer's compute_loss_func
def test_atac_trainer_refuses_a_compute_loss_func_under_cp():
    from atac_hf import ATACTrainer

    model = _dist.tiny_model("llama", torch.float32)
    before = model.config._attn_implementation

    def my_loss(outputs, labels, num_items_in_batch=None):
        return outputs.logits.sum()

    with pytest.raises(ValueError, match=r"compute_loss_func='my_loss' with cp_size=2.*drop compute_loss_func"):
        ATACTrainer(model=model, atac_config=ATACConfig(cp_size=2), compute_loss_func=my_loss)
    assert model.config._attn_implementation == before


# ---------------------------------------------------------------------------- PEFT prompt learning
@pytest.mark.parametrize("kind", ["prompt", "prefix"])
def test_check_model_refuses_prompt_learning_peft_adapters(kind):
    peft = pytest.importorskip("peft")
    cfg = {"prompt": peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
           "prefix": peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)}[kind]
    model = peft.get_peft_model(_dist.tiny_model("llama", torch.float32), cfg)
    with pytest.raises(NotImplementedError, match=r"PEFT (PROMPT|PREFIX)_TUNING adapter.*use a weight adapter"):
        check_model(model)


def test_check_model_accepts_weight_adapters():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_dist.tiny_model("llama", torch.float32),
                                peft.LoraConfig(task_type="CAUSAL_LM", r=2, target_modules=["q_proj", "v_proj"]))
    assert peft_refusal(model) is None
    assert check_model(model).exact


# ---------------------------------------------------------------------------- padded samples
def test_the_collator_refuses_padded_samples():
    feats = [{"input_ids": [11, 12, 13, 0, 0], "attention_mask": [1, 1, 1, 0, 0]}, {"input_ids": [21, 22]}]
    with pytest.raises(ValueError, match=r"feature 0: attention_mask has 2 of 5 entries not 1 \(padding\).*padding=False"):
        PackedDataCollator()(feats)
    with pytest.raises(ValueError, match="attention_mask has 2 entries for 3 input_ids"):
        PackedDataCollator()([{"input_ids": [1, 2, 3], "attention_mask": [1, 1]}])


@pytest.mark.parametrize("mask", [[1, 1, 1], [True] * 3, np.ones(3, np.int8), torch.ones(1, 3, dtype=torch.long),
                                  torch.ones(3, dtype=torch.bool)])
def test_the_collator_accepts_an_all_ones_attention_mask(mask):
    out = PackedDataCollator()([{"input_ids": [1, 2, 3], "attention_mask": mask}, {"input_ids": [4, 5]}])
    assert out["seq_lengths"].tolist() == [3, 2] and "attention_mask" not in out


# ---------------------------------------------------------------------------- per-rank cap
def test_a_per_rank_cap_that_a_full_pack_cannot_meet_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"max_tokens_per_rank=50 x cp_size=2 .* max_tokens=101 .* >= 51 .* <= 100"):
        ATACConfig(cp_size=2, max_tokens=101, max_tokens_per_rank=50)
    with pytest.raises(ValueError, match="set max_tokens_per_rank / ATAC_MAX_TOKENS_PER_RANK"):
        ATACConfig(cp_size=1, max_tokens=8, max_tokens_per_rank=7)
    assert ATACConfig(cp_size=2, max_tokens=101, max_tokens_per_rank=51).max_tokens_per_rank == 51


# ---------------------------------------------------------------------------- cost profiles
def _profile(tmp_path, name, **changes):
    d = default_cost_model().to_dict()
    for k, v in changes.items():
        if v is None:
            del d["cost_model"][k]
        else:
            d["cost_model"][k] = v
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def test_a_cost_profile_missing_a_required_field_names_the_file_and_the_field(tmp_path):
    path = _profile(tmp_path, "missing.json", linear_s_per_token=None)
    with pytest.raises(ValueError, match=r"missing.json has no \['linear_s_per_token'\]"):
        CostModel.from_profile(path)
    with pytest.raises(ValueError, match=r"missing.json has no .*\(set cost_profile / ATAC_COST_PROFILE\)"):
        ATACConfig(cost_profile=path)  # read at construction, not at the first batch


def test_a_cost_profile_with_a_bad_value_names_the_file(tmp_path):
    path = _profile(tmp_path, "bad.json", tile=0)
    with pytest.raises(ValueError, match=r"cost profile .*bad.json: CostModel.tile"):
        CostModel.from_profile(path)
    assert ATACConfig(cost_profile=_profile(tmp_path, "good.json")).cost_model() == default_cost_model()


# ---------------------------------------------------------------------------- DatasetDict
def test_a_dataset_dict_is_refused_naming_its_splits():
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]}),
                               "test": datasets.Dataset.from_dict({"input_ids": [[4, 5]]})})
    with pytest.raises(ValueError, match=r"DatasetDict of splits \['train', 'test'\].*dataset\['train'\]"):
        check_dataset_columns(dd)
    with pytest.raises(ValueError, match="DatasetDict of splits"):
        build_packed_dataloader(dd, ATACConfig())


# ---------------------------------------------------------------------------- small windows
def test_a_window_smaller_than_its_packs_warns():
    data = [{"input_ids": list(range(1, 2 + i % 7))} for i in range(40)]
    with pytest.warns(UserWarning, match=r"window_size=3 is smaller than the 8 packs each window fills"):
        build_packed_dataloader(data, ATACConfig(max_tokens=16, window_size=3), num_replicas=2, grad_accum=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_packed_dataloader(data, ATACConfig(max_tokens=16, window_size=8), num_replicas=2, grad_accum=4)
        build_packed_dataloader(data, ATACConfig(max_tokens=16), num_replicas=2, grad_accum=4)


# ---------------------------------------------------------------------------- unchecked models
def test_atac_cp_warns_once_on_a_model_check_model_has_not_accepted(monkeypatch):
    monkeypatch.setattr(runtime, "_CHECKED", {})
    monkeypatch.setattr(runtime, "_WARNED", set())
    model = _dist.tiny_model("llama", torch.float64, attn="atac_cp")
    batch = _dist.make_batch([[5, 7]], seed=0)
    plan = plan_shards([5, 7], 1)
    with pytest.warns(runtime.UncheckedModelWarning, match=r"without atac_hf.check_model\(model\)"):
        model(**shard_batch(batch, plan, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", runtime.UncheckedModelWarning)
        model(**shard_batch(batch, plan, 0))  # once per model class and type
        other = _dist.tiny_model("llama", torch.float64, attn="atac_cp")
        monkeypatch.setattr(runtime, "_WARNED", set())
        check_model(other)
        other(**shard_batch(batch, plan, 0))  # accepted: no warning


@pytest.mark.slow
def test_check_model_cli_reports_the_router_loss_as_refused_under_cp(tmp_path):
    import subprocess

    cfg = tmp_path / "config.json"
    cfg.write_text(_mixtral(output_router_logits=True, router_aux_loss_coef=0.02).to_json_string())
    r = subprocess.run([sys.executable, "-m", "atac_hf.cli", "check-model", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1, r.stderr[-2000:]
    assert "mixtral: refused (NotImplementedError)" in r.stdout
    assert "adds a router load-balancing loss (config.output_router_logits=True" in r.stdout  # the probe's 2 ranks


def test_a_missing_optional_kernel_is_one_error_line_of_the_cli(tmp_path, capsys):
    import importlib.util

    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn runs here: nothing is missing")
    from atac_hf.cli import main

    rc = main(["calibrate", "--quick", "--backend", "flash", "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("atac-hf calibrate: error: ImportError: backend='flash' needs flash-attn")
    assert not any(line.startswith("Traceback") for line in err)
    assert not (tmp_path / "p.json").exists()


def _stream():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for n in (5, 9, 3, 12, 7, 4):
                yield {"input_ids": list(range(1, n + 1))}

    return Stream()


def test_a_streaming_trainer_refuses_several_dataloader_workers(tmp_path):
    from transformers import TrainingArguments

    from atac_hf import ATACTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=2, dataloader_num_workers=2)
    with pytest.raises(ValueError, match=r"dataloader_num_workers=2 with a streaming dataset.*0 or 1"):
        ATACTrainer(model=_dist.tiny_model("llama", torch.float32), args=args, train_dataset=_stream(),
                    atac_config=ATACConfig(max_tokens=32))
    assert args.accelerator_config.dispatch_batches is None  # refused before the args changed


@pytest.mark.parametrize("workers, match", [
    (0, r"atac_stream.json not found .*exact inside the stream's first pass only"),
    (1, r"dataloader_num_workers=1: .*exact inside the stream's first pass only.*set dataloader_num_workers=0"),
])
def test_a_streaming_resume_that_cannot_be_exact_warns_so(tmp_path, workers, match):
    """Where the stream's position is not in the checkpoint (no ``atac_stream.json``, or the
    stream packed in a DataLoader worker), Trainer's replay is exact in the first pass only: the
    resume says so before anything is loaded (tests/test_stream_resume_passes.py runs both)."""
    from transformers import TrainingArguments

    from atac_hf import ATACTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=2,
                             dataloader_num_workers=workers)
    trainer = ATACTrainer(model=_dist.tiny_model("llama", torch.float32), args=args, train_dataset=_stream(),
                          atac_config=ATACConfig(max_tokens=32))
    (tmp_path / "checkpoint-1").mkdir()
    with pytest.warns(UserWarning, match=match):
        trainer._atac_stream_check_resume(str(tmp_path / "checkpoint-1"))
    assert trainer._atac_stream_restored is None
    trainer.accelerator.end_training()


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_local_data_file_workload_is_read_not_looked_up_on_the_hub(tmp_path, suffix):
    datasets = pytest.importorskip("datasets")
    from atac_hf.workloads import lengths_from_dataset, load_workload

    ds = datasets.Dataset.from_dict({"length": [5, 0, 7, 3], "input_ids": [[1] * 5, [], [2] * 7, [3] * 3]})
    path = tmp_path / f"lens{suffix}"
    ds.to_parquet(str(path)) if suffix == ".parquet" else ds.to_json(str(path))
    assert lengths_from_dataset(str(path)).tolist() == [5, 7, 3]
    assert lengths_from_dataset(str(path), column="input_ids").tolist() == [5, 7, 3]
    assert load_workload(f"dataset:{path}").tolist() == [5, 7, 3]


def test_planners_what_ifs_stay_valid_models_at_the_price_bound():
    """A legal price near MAX_PRICE_S (6e5 s a pair): ATP's 0.25x-4x check and WFAP's price band
    scale it past the bound; they cap it there instead of refusing a setting the user never made
    (red-team 3: "attn_s_per_pair must be ... at most 1e+06, got 1200000.0")."""
    from atac_hf.cost import default_cost_model
    from atac_hf.cost.model import MAX_PRICE_S, scale_attention_price
    from atac_hf.packing import PackingConfig, pack_lengths
    from atac_hf.sharding import plan_shards

    cm = default_cost_model().replace(attn_s_per_pair=6e5)
    plan = plan_shards([218, 49, 97, 291], 3, "atp", cm, max_tokens_per_rank=220, min_chunk=2)
    assert plan.rank_num_tokens().max() <= 220 and plan.rank_num_tokens().sum() == 655
    res = pack_lengths([100, 200, 300, 50], PackingConfig(max_tokens=400, packs_per_window=2, price_band=(0.5, 2.0)),
                       cm)
    assert sorted(e - s for p in res.packs for _, s, e in p) == [50, 100, 200, 300]
    m = default_cost_model().replace(masked_attn_s_per_pair=4e5)
    up = scale_attention_price(m, 4.0)
    assert (up.attn_s_per_pair, up.masked_attn_s_per_pair) == (m.attn_s_per_pair * 4.0, MAX_PRICE_S)
    assert scale_attention_price(m, 0.5).masked_attn_s_per_pair == 2e5


def test_eval_attention_scale_past_the_price_bound_names_the_flag():
    from atac_hf.cost import default_cost_model
    from atac_hf.sim.robustness import scale_attention

    cm = default_cost_model()
    with pytest.raises(ValueError, match=r"attention price scale 1e\+300 prices a pair at .* over the cost model's "
                                         r"1e\+06 s bound; legal scales for this model: up to .* \(set "
                                         r"--eval-attn-scale\)"):
        scale_attention(cm, 1e300)
    assert scale_attention(cm, 2.0).attn_s_per_pair == 2.0 * cm.attn_s_per_pair


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_layouts_refuse_a_window_that_is_not_a_positive_int(bad):
    """0 or -3 gave layouts whose segments had fewer keys than queries; 2.5 and True were used as
    numbers (red-team 3)."""
    from atac_hf.sharding import plan_shards

    plan = plan_shards([30, 9, 40], 2, "atp", kv_exchange="all_to_all")
    with pytest.raises(ValueError, match=r"window must be None or an int >= 1 .*, got "):
        plan.local_layout(0, bad)
    with pytest.raises(ValueError, match=r"sliding_window must be None or an int >= 1"):
        plan.local_layout(0).varlen_layout(bad)
    assert plan.local_layout(0, 8).n_local == plan.local_layout(0).n_local

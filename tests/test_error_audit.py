"""Error audit: user-facing refusals name the bad value and the setting to change, and a refused
operation changes nothing. Each case triggers the real raise (nothing here builds a message)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from atac_hf import (ATACConfig, CostModel, ModelDims, PackedDataCollator, PackingConfig, StreamPacker,
                     WFAPBatchSampler, default_cost_model, plan_shards, shard_batch)
from atac_hf.integrations import BatchSharder, build_parallelism_config
from atac_hf.packing.data import plan_packs
from atac_hf.sim.cluster import ClusterConfig

CFG = PackingConfig(max_tokens=8, packs_per_window=2)


def _dims(**kw):
    base = dict(hidden_size=64, num_heads=4, num_kv_heads=4, num_layers=2, head_dim=16, intermediate_size=128,
                vocab_size=100)
    return ModelDims(**{**base, **kw})


def _packer_state_with(cost_model):
    packer = StreamPacker(CFG, cost_model)
    packer.add_window(list(range(7)), [5, 5, 5, 5, 5, 3, 2])
    return packer.state_dict()


# --------------------------------------------------------------- messages this audit improved
IMPROVED = [
    # ATACConfig.packing_options: the PackingConfig refusal now names packing_options (was only the field)
    (lambda: ATACConfig(packing_options={"overlength": "bogus"}), ValueError, ["'bogus'", "packing_options"]),
    (lambda: ATACConfig(packing_options={"max_defer": True}), ValueError, ["max_defer=True", "packing_options"]),
    (lambda: ATACConfig(packing_options={"overlenght": "split"}), ValueError,
     ["'overlenght'", "packing_options", "ATAC_PACKING_OPTIONS"]),
    (lambda: ATACConfig(packing_options={"balance_tolerance": "1.1"}), ValueError,
     ["balance_tolerance='1.1'", "packing_options"]),
    # cost_profile of another type: the value and the setting (was only the type name)
    (lambda: ATACConfig(cost_profile=5), TypeError, ["int 5", "cost_profile", "ATAC_COST_PROFILE"]),
    # an unknown model preset: the setting (was only the legal names)
    (lambda: CostModel.from_model("lama-8b"), ValueError, ["'lama-8b'", "'8b'", "--model"]),
    # a negative separator other than -100 (was accepted: the loss then failed at the first step)
    (lambda: PackedDataCollator(separator_id=-5), ValueError, ["separator_id=-5", "-100", "set separator_id"]),
    # a cluster whose pack cap is below its CP size: the legal range and the settings
    (lambda: ClusterConfig(model=_dims(), max_tokens=2, cp_size=4), ValueError,
     ["max_tokens=2", ">= cp_size", "--max-tokens", "--cp"]),
    # plan_packs' order: the value (was only the legal form)
    (lambda: plan_packs([3, 4, 5], CFG, order=[0, 0, 1]), ValueError, ["order=[0, 0, 1]", "permutation", "set order"]),
]


@pytest.mark.parametrize("call,exc,fragments", IMPROVED)
def test_improved_messages_name_the_value_and_the_setting(call, exc, fragments):
    with pytest.raises(exc) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_packer_state_of_another_cost_model_names_the_field_and_changes_nothing():
    base = default_cost_model()
    other = dataclasses.replace(base, tile=64)
    state = _packer_state_with(other)
    packer = StreamPacker(CFG, base)
    packer.add_window([10], [1])
    before = json.dumps(packer.state_dict(), sort_keys=True)
    with pytest.raises(ValueError, match="saved with a different cost model") as info:
        packer.load_state_dict(state)
    assert "tile=64" in str(info.value) and "this packer: 128" in str(info.value)
    assert "cost_model" in str(info.value)
    assert json.dumps(packer.state_dict(), sort_keys=True) == before


def test_negative_separator_is_refused_and_minus_100_and_token_ids_still_work():
    row = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]
    assert PackedDataCollator()(row)["labels"].tolist() == [[-100, 2, 3, -100, 5]]
    assert PackedDataCollator(separator_id=7)(row)["labels"].tolist() == [[7, 2, 3, 7, 5]]
    for bad in (-1, -7, -101, -2**63):
        with pytest.raises(ValueError, match=rf"separator_id={bad} is invalid: it must be -100"):
            PackedDataCollator(separator_id=bad)


# --------------------------------------------------------------- user-facing refusals without a test before
UNTESTED = [
    (lambda: PackingConfig(max_tokens=8, packs_per_window=1, max_defer=-1), ValueError,
     ["max_defer=-1", ">= 0", "set max_defer"]),
    (lambda: PackingConfig(max_tokens=8, packs_per_window=1, local_search="yes"), TypeError,
     ["local_search='yes'", "True or False", "set local_search"]),
    (lambda: PackingConfig.for_training(max_tokens=8, dp_size=2.5), ValueError, ["dp_size=2.5", ">= 1"]),
    (lambda: WFAPBatchSampler([3, 4], CFG, shuffle="yes"), TypeError, ["shuffle='yes'", "set shuffle"]),
    (lambda: WFAPBatchSampler([3, 4], CFG).state_dict(position=-1), ValueError, ["position=-1", "[0, "]),
    (lambda: StreamPacker(CFG).add_window([0], [3], last="yes"), TypeError, ["last='yes'", "True or False"]),
    (lambda: plan_shards([4, 4], 2).rank_segments(5), ValueError, ["rank 5", "legal: 0..1"]),
    (lambda: BatchSharder(ATACConfig(cp_size=2), cp_rank=2), ValueError, ["cp_rank=2", "legal: 0..1"]),
    (lambda: build_parallelism_config(ATACConfig(), 0), ValueError, ["world_size", "got 0", ">= 1"]),
    (lambda: ATACConfig.from_sources(environ={"ATAC_DEBUG": "maybe"}), ValueError,
     ["ATAC_DEBUG='maybe'", "'true'"]),
    (lambda: CostModel.from_model("8b", inter_node="yes"), TypeError, ["inter_node", "'yes'", "True or False"]),
    (lambda: CostModel.from_model("8b", tp_size=3), ValueError, ["tp_size=3", "divide num_heads"]),
    (lambda: dataclasses.replace(CostModel.from_model("8b"), link_bandwidth=0), ValueError,
     ["CostModel.link_bandwidth", "got 0", "> 0"]),
    (lambda: _dims(hidden_size=0), ValueError, ["ModelDims.hidden_size", "got 0", "positive int"]),
    (lambda: ClusterConfig(model=_dims(), pp_size=3), ValueError, ["pp_size=3", "num_layers=2", "--pp"]),
    (lambda: shard_batch({"input_ids": torch.ones(1, 8, dtype=torch.long)}, plan_shards([8], 2), rank=3),
     ValueError, ["rank 3", "legal: 0..1"]),
    (lambda: shard_batch({"input_ids": torch.ones(1, 8, dtype=torch.long)}, plan_shards([8], 1), rank=0, debug="y"),
     ValueError, ["debug='y'", "True"]),
]


@pytest.mark.parametrize("call,exc,fragments", UNTESTED)
def test_untested_user_refusals_name_the_value_and_the_setting(call, exc, fragments):
    with pytest.raises(exc) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


# --------------------------------------------------------------- a refused operation changes nothing
def test_refused_calls_leave_their_objects_as_they_were():
    collator = PackedDataCollator()
    collator([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    stats = copy.deepcopy(vars(collator.stats))
    with pytest.raises(ValueError, match=r"feature 1: input_ids has negative entries \(input_ids\[1\] = -5\)"):
        collator([{"input_ids": [1, 2]}, {"input_ids": [1, -5]}])
    assert vars(collator.stats) == stats

    sampler = WFAPBatchSampler([3, 4, 5, 6, 7, 2, 1, 8], CFG, seed=0)
    for bad in (-1, 1.5, True):
        with pytest.raises((TypeError, ValueError), match=rf"epoch={bad!r}"):
            sampler.set_epoch(bad)
    assert sampler.epoch == 0

    state = _packer_state_with(None)
    packer = StreamPacker(CFG)
    packer.add_window([10], [1])
    for mutate in (lambda s: s["pool"].__setitem__(0, [s["pool"][0][0], 0, 99] + s["pool"][0][3:]),
                   lambda s: s.__setitem__("window", -1),
                   lambda s: s["metrics"].__setitem__("tokens", 1.5),
                   lambda s: s.__setitem__("open", [[0, 99, 0]])):
        bad = copy.deepcopy(state)
        mutate(bad)
        before = json.dumps(packer.state_dict(), sort_keys=True)
        with pytest.raises(ValueError, match="malformed"):
            packer.load_state_dict(bad)
        assert json.dumps(packer.state_dict(), sort_keys=True) == before

"""Fortieth mutation pass: survivors of mutants planted by hand in the last two work sessions' changes.

Killed here, in process: :func:`place_overdue` placing an overdue fragment over the packs' ends without displacing
anything, and (``max_defer=0``) cutting a sample that fits the cap only where all its pieces go now;
:func:`_make_room` choosing the pack where the fewest tokens leave though it costs more, and the cheapest among
equals; :func:`refuse_transform` ahead of the column checks of ``dataset_lengths`` and ``check_dataset_columns`` (a
transform that tokenizes text is named, not reported as a missing column) and naming a transform without
``__name__`` by its type; :func:`peft_configs` following a wrapper's ``module`` before its ``_orig_mod`` and
stopping at its bound; :func:`head_refusal` on an object without a name; a PEFT config without ``peft_type``
refused as an unknown type; :func:`router_loss_refusal` on a module without a config (the runtime guard under CP),
a per-call flag on a config with a coefficient and no field naming an expert, the config's flag with no coefficient
field, a zero integer coefficient, one non-zero coefficient among zeros, any field naming an expert, and a router in
a composite model's text config (Llama 4); and, its finding (fixed), a router in a nested sub-config (DBRX).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch

from atac_hf.attention.kind_rules import head_refusal, peft_configs, peft_refusal
from atac_hf.attention.model_check import router_loss_refusal
from atac_hf.packing.planners.window import place_overdue
from test_overdue_whole import _ctx  # noqa: E402

nn = torch.nn


# ---------------------------------------------------------------------------- place_overdue / _make_room
def test_an_overdue_fragment_that_goes_over_the_packs_ends_displaces_nothing():
    # kills W07: the eviction tried for fragments too before their pieces (`it[FRAG] == 0 and` dropped): a fragment
    # that fits over the ends of the packs carried a fresh sample to the next window instead
    packs = [[(1, 0, 8, 1, 1, 0)], [(2, 0, 8, 1, 2, 0)]]
    frag = (0, 10, 14, 0, 0, 1)
    carry, newly = place_overdue(packs, [frag], _ctx(min_fragment=1))
    assert carry == [] and newly == []
    assert packs == [[(1, 0, 8, 1, 1, 0), (0, 10, 12, 0, 0, 1)], [(2, 0, 8, 1, 2, 0), (0, 12, 14, 0, 0, 1)]]


def test_with_max_defer_0_a_sample_that_fits_the_cap_is_cut_only_where_all_of_it_goes():
    # kills W24: `(left and it[FRAG] == 0)` dropped: a whole 10 was cut into 3 + 3 now and a 4 carried on (late anyway)
    full = [[(1, 0, 7, 0, 1, 0)], [(2, 0, 7, 0, 2, 0)]]  # every item is overdue at max_defer=0: nothing may leave
    whole = (0, 0, 10, 0, 0, 0)
    packs = [list(p) for p in full]
    carry, newly = place_overdue(packs, [whole], _ctx(0, max_defer=0, min_fragment=1))
    assert carry == [whole] and newly == [] and packs == full


def test_make_room_takes_the_pack_where_fewest_tokens_leave_though_it_costs_more():
    # kills R07: the best key kept as (cost, freed, j) but compared as (freed, cost, j): pack 1 (6 tokens leave, cost
    # 6) was taken over pack 0 (5 leave, cost 10)
    packs = [[(1, 0, 5, 1, 1, 0), (2, 0, 5, 1, 2, 0)], [(3, 0, 6, 1, 3, 0)]]  # rooms 0 and 4
    overdue = (0, 0, 5, 0, 0, 0)
    carry, newly = place_overdue(packs, [overdue], _ctx())
    assert newly == [] and carry == [(1, 0, 5, 1, 1, 0)]
    assert packs == [[(2, 0, 5, 1, 2, 0), overdue], [(3, 0, 6, 1, 3, 0)]]


def test_make_room_takes_the_cheapest_pack_where_as_few_tokens_leave():
    # kills R09 (the stored key's cost negated) and R12 (negated where compared too: the dearest pack): both packs
    # free a 5, pack 1 is the cheaper
    packs = [[(1, 0, 5, 1, 1, 0), (2, 0, 1, 0, 2, 0)], [(3, 0, 5, 1, 3, 0)]]  # the 1 is overdue: it stays
    overdue = (0, 0, 6, 0, 0, 0)
    carry, newly = place_overdue(packs, [overdue], _ctx())
    assert newly == [] and carry == [(3, 0, 5, 1, 3, 0)]
    assert packs == [[(1, 0, 5, 1, 1, 0), (2, 0, 1, 0, 2, 0)], [overdue]]


# ---------------------------------------------------------------------------- refuse_transform
def _tokenize(batch):
    return {"input_ids": [[len(w) for w in t.split()] for t in batch["text"]]}


def test_a_tokenizing_transform_is_named_by_every_column_check_not_as_a_missing_column():
    # kills T11 (dataset_lengths: the refusal after the column check) and T14 (check_dataset_columns: after
    # _check_names): a transform that makes input_ids from text was reported as "no 'input_ids' column"
    from atac_hf.integrations.data import check_dataset_columns
    from atac_hf.packing.data.dataset import dataset_lengths

    ds = datasets.Dataset.from_dict({"text": ["a bb ccc", "dddd"]}).with_transform(_tokenize)
    with pytest.raises(ValueError, match=r"^the dataset has a transform set with .*\(_tokenize\)"):
        dataset_lengths(ds)
    with pytest.raises(ValueError, match=r"^eval_dataset has a transform set with .*\(_tokenize\)"):
        check_dataset_columns(ds, name="eval_dataset", streaming=True)


def test_a_transform_without_a_name_is_named_by_its_type():
    # kills T06: `getattr(fn, '__name__', type(fn).__name__)` -> a fixed '?' (a functools.partial has no __name__)
    from atac_hf.packing.data.arrow_source import refuse_transform

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2]]}).with_transform(functools.partial(_tokenize))
    with pytest.raises(ValueError, match=r"^train_dataset has a transform set with with_transform\(\) / "
                                         r"set_transform\(\) \(partial\): it runs"):
        refuse_transform(ds, "train_dataset")


# ---------------------------------------------------------------------------- kind_rules
def _holder(configs):
    inner = nn.Module()
    inner.peft_config = configs
    return inner


def test_peft_configs_follow_a_wrappers_module_before_its_orig_mod():
    # kills K02: `_orig_mod` read before `module` (unwrap_base_model's order, which the walk follows, reversed): the
    # adapters of the module a wrapper holds were missed where it also had an `_orig_mod` of another model
    cfg = SimpleNamespace(peft_type="PROMPT_TUNING", is_prompt_learning=True)
    wrapper = SimpleNamespace(module=_holder({"p": cfg}), _orig_mod=nn.Linear(1, 1))
    assert peft_configs(wrapper) == [("p", cfg)]
    assert peft_refusal(wrapper)[0] is NotImplementedError


def test_peft_configs_stop_after_eight_wrappers():
    # kills K06: `seen += 1` dropped (an endless chain of wrappers was walked without end; here until it raised)
    class Endless:
        made = 0

        def __getattr__(self, name):
            if name != "_orig_mod":
                raise AttributeError(name)
            Endless.made += 1
            if Endless.made > 50:
                raise RuntimeError("walked past the bound")
            return Endless()

    assert peft_configs(Endless()) == [] and Endless.made == 8


def test_a_nameless_object_is_no_head():
    # kills K09: `getattr(cls, "__name__", "")` -> `cls.__name__` (AttributeError on an object without a name)
    assert head_refusal(SimpleNamespace()) is None


def test_an_adapter_config_without_a_peft_type_is_refused():
    # kills K11: the missing peft_type read as "LORA" (accepted)
    exc, why = peft_refusal(_holder({"x": SimpleNamespace()}))
    assert exc is NotImplementedError
    assert why.startswith("is wrapped by a PEFT None adapter ('x'), a type atac-hf does not know to act on each token")
    assert "(it knows ADALORA, ADAMSS, BEFT, BOFT," in why


# ---------------------------------------------------------------------------- router_loss_refusal / the guard
def test_the_guard_under_cp_passes_a_router_flag_to_a_module_without_a_config():
    # kills G01 (`vars(cfg)` back: TypeError on None, commit 0e6e4b2's fix) and G02 (`module.config`: AttributeError)
    from atac_hf.attention import SHARD_KWARG
    from atac_hf.attention.model_check import _Guard
    from atac_hf.attention.shard import ShardContext
    from atac_hf.sharding import plan_shards

    assert router_loss_refusal(None, per_call=True) is None
    module = nn.Linear(2, 2)
    guard = _Guard(module, ())
    try:
        plan = plan_shards(np.array([9, 7]), 2, "atp")
        ctx = ShardContext(plan=plan, rank=0, layout=plan.local_layout(0))
        guard.before(module, (), {SHARD_KWARG: ctx, "output_router_logits": True})
    finally:
        guard.remove()


def test_a_per_call_flag_is_refused_where_a_coefficient_is_set_even_if_no_field_names_an_expert():
    # kills G03: `not coefs` dropped from the no-router rule (a config of its own with a router weight, its experts
    # under another name, passed the per-call flag)
    refused = router_loss_refusal(SimpleNamespace(router_aux_loss_coef=0.5), per_call=True)
    assert refused[0] is NotImplementedError
    assert refused[1].startswith("adds a router load-balancing loss (output_router_logits=True passed to the forward, "
                                 "router_aux_loss_coef=0.5)")


def test_the_configs_flag_with_no_coefficient_field_is_refused():
    # kills G04 (`per_call and` dropped: the config's flag on a config naming no expert and no coefficient passed)
    # and G11 (`or "no coefficient field"` dropped from the message)
    refused = router_loss_refusal(SimpleNamespace(output_router_logits=True))
    assert refused[1].startswith("adds a router load-balancing loss (config.output_router_logits=True, no coefficient "
                                 "field)")


def test_router_coefficients_any_non_zero_one_refuses_and_an_integer_zero_does_not():
    # kills G07 (`any` -> `all`: one zero weight among non-zero ones passed) and G08 (integers not read as weights:
    # an int 0 weight was refused as "no coefficient field")
    mixed = SimpleNamespace(output_router_logits=True, router_aux_loss_coef=0.0, router_z_loss_coef=0.001)
    assert "router_aux_loss_coef=0.0, router_z_loss_coef=0.001" in router_loss_refusal(mixed)[1]
    assert router_loss_refusal(SimpleNamespace(output_router_logits=True, router_aux_loss_coef=0)) is None


def test_a_per_call_flag_is_refused_where_any_field_names_an_expert():
    # kills G06: "expert" -> "experts" (a config naming its experts by expert_capacity only)
    refused = router_loss_refusal(SimpleNamespace(expert_capacity=64), per_call=True)
    assert "(output_router_logits=True passed to the forward, no coefficient field)" in refused[1]


def test_a_router_in_the_text_config_of_a_composite_model_is_refused():
    # kills G10: `_configs(config)` -> `[config]` (Llama 4's router weight and flag live in its text config only)
    from transformers import Llama4Config

    cfg = Llama4Config()
    text = cfg.get_text_config()
    assert not hasattr(cfg, "router_aux_loss_coef") and text.router_aux_loss_coef > 0
    assert "router_aux_loss_coef=0.001" in router_loss_refusal(cfg, per_call=True)[1]
    assert router_loss_refusal(cfg) is None  # the flag off
    text.output_router_logits = True
    assert "(config.output_router_logits=True, router_aux_loss_coef=0.001)" in router_loss_refusal(cfg)[1]


# The pass's finding (fixed): DBRX keeps its router loss weight and expert count in ffn_config, so the
# per-call rule read it as a model with no router and let output_router_logits=True through under CP.
def test_a_router_in_a_nested_sub_config_is_refused_per_call_dbrx():
    from transformers import DbrxConfig, MusicgenConfig

    cfg = DbrxConfig()
    refused = router_loss_refusal(cfg, per_call=True)
    assert refused is not None and "moe_loss_weight=0.01" in refused[1]
    cfg.ffn_config.moe_loss_weight = 0.0  # weighted 0: nothing is added to the loss
    assert router_loss_refusal(cfg, per_call=True) is None
    assert router_loss_refusal(MusicgenConfig(), per_call=True) is None  # several text configs: read, no crash


def test_a_config_with_several_text_configs_is_not_refused_as_position_dependent_rope():
    # the forty-first pass: get_text_config() raises on musicgen, and config_refusal read that as a RoPE refusal
    from transformers import MusicgenConfig

    from atac_hf.attention.model_check import config_refusal

    refused = config_refusal(MusicgenConfig())
    assert refused is None or "RoPE" not in refused[1]

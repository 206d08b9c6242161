"""Mutation pass 46 (docs/TESTING.md): the put-back of a refused call (``rollback.py``), the TP head rules
(``tp_heads.py``), the TP refusals and gradient sums of ``tensor_parallel.py``, the ``DatasetDict`` path of
``pack_dataset`` and ``dataset_metrics``. In-process: stand-in modules and configs, a stand-in for
``torch.distributed`` where a collective over 2 ranks is needed.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from atac_hf.integrations import tensor_parallel as tpm
from atac_hf.integrations import tp_heads
from atac_hf.integrations.rollback import refused_changes_nothing

NS = types.SimpleNamespace


def _llama(attn="eager", **kw):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    cfg.update(kw)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation=attn)


def _refuse(*a, body=lambda: None, exc=ValueError("refused"), **k):
    """Run ``body`` inside refused_changes_nothing, then raise ``exc``; returns the error raised."""
    with pytest.raises(type(exc)) as got:
        with refused_changes_nothing(*a, **k):
            body()
            raise exc
    return got.value


def _guarded(model) -> bool:
    from atac_hf.attention.model_check import _GUARD_ATTR

    return getattr(model, _GUARD_ATTR, None) is not None


# ---------------------------------------------------------------------------- rollback.py
def test_a_refusal_puts_back_attention_use_cache_guard_and_relay():
    from atac_hf.attention.model_check import check_model
    from atac_hf.attention.relay import relay_installed

    model, other = _llama(), _llama()
    assert model.config.use_cache is True

    def body():
        for m in (model, other):  # what prepare_model and Trainer do: another attention, the guard and relay
            m.set_attn_implementation("sdpa")
            check_model(m)
            m.config.use_cache = False

    err = _refuse((model, other), body=body)
    for m in (model, other):  # every model, not only the last one
        assert m.config._attn_implementation == "eager" and m.config.use_cache is True
        assert not _guarded(m) and not relay_installed(m)
        assert not any(x._forward_hooks or x._forward_pre_hooks for x in m.modules())
    assert not getattr(err, "__notes__", None)  # nothing failed to be put back


def test_a_guard_and_relay_present_before_the_call_stay():
    from atac_hf.attention.model_check import check_model
    from atac_hf.attention.relay import install_relay, relay_installed

    guarded, relayed = _llama(), _llama()
    check_model(guarded)  # guard + relay before the call
    install_relay(relayed)  # relay only
    _refuse((guarded, relayed), body=lambda: install_relay(guarded))
    assert _guarded(guarded) and relay_installed(guarded)
    assert relay_installed(relayed) and not _guarded(relayed)
    fresh = _llama()
    _refuse((fresh,), body=lambda: install_relay(fresh))  # a relay added by the call (no guard) goes
    assert not relay_installed(fresh)


def test_plain_modules_and_non_modules_are_handled_without_a_failed_put_back():
    plain = torch.nn.Linear(2, 2)  # no config at all
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)  # not a module: skipped
    err = _refuse((plain, opt), body=lambda: setattr(plain, "extra", 1))
    assert not getattr(err, "__notes__", None)


class _Stand(torch.nn.Module):
    """A module with a config of its own whose attention must not be switched when unchanged."""

    def __init__(self, **config):
        super().__init__()
        self.config = NS(**config)
        self.calls = []

    def set_attn_implementation(self, value):
        self.calls.append(value)
        self.config._attn_implementation = value


def test_unchanged_attention_and_a_config_without_one_are_left_alone():
    same = _Stand(_attn_implementation="sdpa", use_cache=True)
    none = _Stand(use_cache=True)  # no attention implementation to put back

    def body():
        none.config._attn_implementation = "atac_cp"

    err = _refuse((same, none), body=body)
    assert same.calls == [] and none.calls == [] and not getattr(err, "__notes__", None)
    bare = _Stand(_attn_implementation="sdpa")  # no use_cache before the call: one set by it is not replaced

    def set_cache():
        bare.config.use_cache = False

    _refuse((bare,), body=set_cache)
    assert getattr(bare.config, "use_cache", False) is False


def test_owner_attributes_put_back_and_new_ones_removed():
    owner = NS(sharder="old", plan="p")

    def body():
        owner.sharder, owner.plan, owner.added = "new", "q", 1

    err = _refuse(owner=owner, attrs=("sharder", "plan", "added"), body=body)
    assert (owner.sharder, owner.plan) == ("old", "p") and not hasattr(owner, "added")
    assert not getattr(err, "__notes__", None)
    owner = NS()
    _refuse(owner=owner, attrs=("sharder",))  # absent before and after: nothing to remove, no failure
    assert vars(owner) == {}


def test_any_exception_is_put_back_and_success_keeps_the_changes():
    args = NS(accelerator_config=NS(dispatch_batches=None), parallelism_config=None)
    owner = NS(sharder="old")

    def body():
        args.parallelism_config, args.accelerator_config.dispatch_batches, owner.sharder = "pc", False, "new"

    _refuse((), args, owner, ("sharder",), body=body, exc=KeyboardInterrupt())  # BaseException too
    assert args.parallelism_config is None and args.accelerator_config.dispatch_batches is None
    assert owner.sharder == "old"
    with refused_changes_nothing((), args, owner, ("sharder",)):
        body()
    assert args.parallelism_config == "pc" and args.accelerator_config.dispatch_batches is False
    assert owner.sharder == "new"


# ---------------------------------------------------------------------------- tp_heads.py
def _base(children: dict, **config) -> torch.nn.Module:
    base = torch.nn.Module()
    for name, module in children.items():
        base.add_module(name, module)
    base.config = NS(**config)
    return base


class _Block(torch.nn.Module):  # a class name without "Attention"
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(4, 4)


class MixerAttention(_Block):
    pass


@pytest.mark.parametrize("name, cls", [("attn", _Block), ("attention", _Block), ("mixer", MixerAttention),
                                       ("self_attn", _Block)])
def test_attention_blocks_found_by_class_or_name(name, cls):
    base = _base({name: cls(), "mlp": _Block()})
    assert tp_heads._head_split_of_plan(base, {f"{name}.q_proj": "colwise"}, 4) == 4  # module entries only
    assert tp_heads._head_split_of_plan(base, {f"{name}.q_proj": "colwise_gather_output"}, 4) == 1
    assert tp_heads._head_split_of_plan(base, {"mlp.q_proj": "colwise"}, 4) == 1  # not an attention block
    assert tp_heads._head_split_of_plan(base, {f"{name}.nothing": "colwise"}, 4) == 1  # no such module


def test_tp_head_split_of_a_module_without_a_plan_api_is_1():
    assert tp_heads.tp_head_split(torch.nn.Linear(2, 2), 2) == 1


def test_layer_heads_of_a_config_without_heads_are_0():
    assert tp_heads._layer_heads(NS()) == [(0, 0)]
    assert tp_heads._layer_heads(NS(num_attention_heads=None, num_key_value_heads=None)) == [(0, 0)]


def test_legal_tp_sizes_divide_the_ranks_per_cp_rank():
    assert tp_heads._legal_tp_sizes(4, 4, 4, 1) == [1, 2, 4]
    assert tp_heads._legal_tp_sizes(4, 4, 4, 2) == [1, 2]
    assert tp_heads._legal_tp_sizes(6, 3, None, 1) == [1, 3]  # no process group: the head divisors


def test_legal_tp_sizes_read_the_default_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        assert tp_heads._legal_tp_sizes(4, 4, None, 1) == [1]  # one process: only tp 1 runs
    finally:
        dist.destroy_process_group()


def _per_head(base, plan=None, heads=8, kv=2):
    return tp_heads._check_per_head_params(base, plan or {}, 2, heads, kv)


def test_per_head_params_of_per_layer_configs_are_refused():
    layers = [NS(num_attention_heads=8, num_key_value_heads=2, head_dim=4, hidden_size=24),
              NS(num_attention_heads=6, num_key_value_heads=3, head_dim=5, hidden_size=24)]
    cfg = NS(is_heterogeneous=True, per_layer_config=layers)
    for shape in [(3, 5), (6, 5), (8, 4), (2, 4), (7, 3, 5)]:  # each layer's, the last two dims of a 3-D one
        base = _base({"blk": _Block()}, is_heterogeneous=True, per_layer_config=layers)
        base.blk.register_parameter("scale", torch.nn.Parameter(torch.ones(shape)))
        with pytest.raises(ValueError, match=rf"tp_size=2: Module's parameter 'blk.scale' has a per-head shape "
                                             rf"\({', '.join(map(str, shape))}\) \(heads x head_dim\)"):
            _per_head(base)
        base.config = NS(get_text_config=lambda: cfg)  # a composite config: its text config is read
        with pytest.raises(ValueError, match="per-head shape"):
            _per_head(base)
    base = _base({"blk": _Block()}, is_heterogeneous=True, per_layer_config=layers)
    base.blk.register_parameter("scale", torch.nn.Parameter(torch.ones(4, 5)))  # no layer's shape
    _per_head(base)


def test_per_head_counts_fall_back_to_the_given_ones():
    base = _base({"blk": _Block()}, head_dim=4)  # a layer without head counts: the given ones
    base.blk.register_parameter("scale", torch.nn.Parameter(torch.ones(8, 4)))
    with pytest.raises(ValueError, match="per-head shape"):
        _per_head(base)
    base = _base({"blk": _Block()}, num_attention_heads=8, head_dim=4)  # no kv count: the given one
    base.blk.register_parameter("scale", torch.nn.Parameter(torch.ones(2, 4)))
    with pytest.raises(ValueError, match="per-head shape"):
        _per_head(base)
    base = _base({"blk": _Block()}, num_attention_heads=8, hidden_size=32)  # head_dim = hidden / heads
    base.blk.register_parameter("scale", torch.nn.Parameter(torch.ones(8, 4)))
    with pytest.raises(ValueError, match="per-head shape"):
        _per_head(base)


def test_per_head_rule_spares_planned_single_head_and_headless_params():
    base = _base({"layers": torch.nn.ModuleList([_Block()])}, num_attention_heads=8, num_key_value_heads=1,
                 head_dim=4)
    base.layers[0].q_proj.register_parameter("scale", torch.nn.Parameter(torch.ones(8, 4)))
    _per_head(base, {"layers.0.q_proj": "colwise"}, kv=1)  # its module is planned: split with it
    _per_head(base, {"layers.0.q_proj.scale": "colwise"}, kv=1)  # planned itself
    base.layers[0].q_proj.scale = torch.nn.Parameter(torch.ones(1, 4))  # one kv head (MQA): not per head
    _per_head(base, kv=1)
    _per_head(_base({"blk": _Block()}, num_attention_heads=0, hidden_size=16), heads=0, kv=0)  # no heads at all


# ---------------------------------------------------------------------------- tensor_parallel.py: refusals
class _Tied(torch.nn.Module):
    def __init__(self, pairs: int = 1):
        super().__init__()
        for i in range(pairs):
            emb = torch.nn.Embedding(4, 2)
            head = torch.nn.Linear(2, 4, bias=False)
            head.weight = emb.weight
            self.add_module(f"emb{i}", emb)
            self.add_module(f"head{i}", head)


def test_tied_weights_split_alike_or_unplanned_pass_and_others_are_refused():
    assert tpm._tied_aliases(_Tied(), {}) == {"head0.weight": "emb0.weight"}  # neither planned
    assert tpm._tied_aliases(_Tied(), {"emb0.weight": "embedding_rowwise", "head0.weight": "colwise"})  # both dim 0
    msg = (r"tied weights 'emb0.weight' \({o}\) and 'head0.weight' \({a}\) are split differently by _Tied's "
           r"tp_plan; untie them \(tie_word_embeddings=False\) or set tp_size=1$")
    for o, a in [("colwise", None), (None, "colwise"), ("my_style", "my_style"), ("rowwise", "my_style"),
                 ("my_style", "rowwise")]:  # one planned only; a style of unknown dim never matches
        with pytest.raises(ValueError, match=msg.format(o=o, a=a)):
            tpm._tied_aliases(_Tied(), {k: v for k, v in (("emb0.weight", o), ("head0.weight", a)) if v})
    with pytest.raises(ValueError, match="emb1.weight"):  # a later pair after an unplanned one
        tpm._tied_aliases(_Tied(2), {"emb1.weight": "colwise", "head1.weight": "rowwise"})


def test_a_stepped_optimizer_behind_a_wrapper_is_refused():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    wrapped = NS(optimizer=opt, state={})  # Accelerate's AcceleratedOptimizer keeps the state on .optimizer
    with pytest.raises(ValueError, match=r"^the optimizer has already stepped: with tp_size > 1 pass it to "
                                         r"prepare\(\) \(or to the Trainer\) before any optimizer.step\(\)"):
        tpm.check_optimizers_unstepped([None, wrapped], [model])
    tpm.check_optimizers_unstepped([wrapped], [torch.nn.Linear(2, 2)])  # another model's state: fine


def _six_heads():
    return _llama(attn="sdpa", hidden_size=48, num_attention_heads=6, num_key_value_heads=6)


@pytest.mark.parametrize("check", ["refusals", "prepare"])
def test_tp_refusals_list_the_sizes_of_the_given_world_and_cp(check):
    model = _six_heads()

    def run(tp, **kw):
        if check == "refusals":
            return tpm.check_tp_refusals(model, tp, **kw)
        return tpm.check_tp_prepare((model,), [model], tp, **kw)

    for kw, legal in [({"world_size": 6, "cp_size": 2}, "[1, 3]"), ({"world_size": 3}, "[1, 3]"),
                      ({"world_size": 4, "cp_size": 1}, "[1, 2]")]:
        with pytest.raises(ValueError, match=rf"tp_size=4 does not divide LlamaForCausalLM's num_attention_heads=6 "
                                             rf"\(each TP rank holds whole heads\); set tp_size to one of "
                                             rf"{legal.replace('[', '.').replace(']', '.')} "):
            run(4, **kw)


def test_tp_prepare_dropout_warning_and_head_refusal_in_full():
    model = _llama(attn="sdpa")
    model.model.add_module("drop0", torch.nn.Dropout(0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # p = 0: no warning
        tpm.check_tp_prepare((model,), [model], 2)
    model.model.add_module("drop1", torch.nn.Dropout(0.1))
    with pytest.warns(UserWarning) as got:
        tpm.check_tp_prepare((model,), [model], 2)
    assert str(got[0].message) == (
        "LlamaForCausalLM.model.drop1 drops out with p > 0 under tp_size=2: the TP ranks of a CP rank must draw the "
        "same dropout masks (they compute one hidden state), so seed every rank alike "
        "(accelerate.utils.set_seed(seed), not device_specific=True) or set the dropout to 0")
    head = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tpm.check_tp_prepare((model, head), [model], 2)
    assert str(err.value) == (
        "prepare() got Linear (no attention) beside the model with tp_size=2: under TP Accelerate prepares "
        "tensor-parallel models only (and would refuse it after the model was sharded); prepare the model alone "
        "(model, optimizer = accelerator.prepare(model, optimizer)), or train the head with tp_size=1 "
        "(parallelism_config) and cp_size / DP")


# ---------------------------------------------------------------------------- tensor_parallel.py: gradient sums
class _Group:
    """A stand-in process group of ``size`` ranks whose other ranks hold ``other`` x this rank's values."""

    def __init__(self, size: int, other: float):
        self.size, self.other = size, other


class _Dist:
    """The part of torch.distributed the sums use, over _Group stand-ins; records each all_reduce."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self):
        self.calls = []

    def get_world_size(self, group=None):
        return group.size

    def all_reduce(self, t, op=None, group=None):
        assert op == self.ReduceOp.SUM
        self.calls.append((group, t.dtype, t.numel(), type(t)))
        t.mul_(1 + group.other)


def test_all_reduce_sums_or_averages_each_dtype_in_one_call(monkeypatch):
    fake = _Dist()
    monkeypatch.setattr(tpm, "dist", fake)
    group = _Group(2, 3.0)
    grads = [torch.tensor([1.0, 2.0]), torch.ones(2, 2, dtype=torch.float64), torch.tensor([[3.0], [4.0]]),
             torch.tensor([5.0])]
    tpm._all_reduce(grads, group, average=False)
    assert [g.tolist() for g in grads] == [[4.0, 8.0], [[4.0, 4.0], [4.0, 4.0]], [[12.0], [16.0]], [20.0]]
    assert sorted((str(c[1]), c[2]) for c in fake.calls) == [("torch.float32", 5), ("torch.float64", 4)]
    tpm._all_reduce(grads, group, average=True)  # the mean over 2 ranks: (x + 3x) / 2
    assert [g.tolist() for g in grads] == [[8.0, 16.0], [[8.0, 8.0], [8.0, 8.0]], [[24.0], [32.0]], [40.0]]


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))  # per head: held apart, summed over TP
        self.v = torch.nn.Parameter(torch.tensor([1.0]))
        self.frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)
        self._atac_tp_partial_grads = ("w",)
        self._atac_tp_group = _Group(2, 1.0)  # the other TP rank: the same share
        tpm._hold_partial_grad(self.w)


def test_sync_sums_over_tp_then_averages_over_the_dp_cp_group(monkeypatch):
    fake = _Dist()
    monkeypatch.setattr(tpm, "dist", fake)
    m = _Model()
    (m.w * torch.tensor([3.0, 5.0])).sum().backward()
    (m.v * 2.0).sum().backward()
    dp = _Group(2, 3.0)  # the other DP rank: 3x this one's gradients
    tpm.sync_tp_gradients(m, dp)
    assert m.w.grad.tolist() == [12.0, 20.0]  # TP sum [6, 10], then the DP mean (x + 3x) / 2
    assert m.v.grad.tolist() == [4.0] and m.frozen.grad is None
    assert [c[0] for c in fake.calls] == [m._atac_tp_group, dp]
    fake.calls.clear()
    tpm.sync_tp_gradients(m, _Group(1, 0.0))  # a group of one rank: nothing to average
    tpm.sync_tp_gradients(m, None)
    assert fake.calls == [] and m.w.grad.tolist() == [12.0, 20.0]


def test_a_contribution_discarded_by_zero_grad_before_the_sync_is_dropped(monkeypatch):
    """Found by pass 46 (mutant 46 of sync_tp_gradients): a backward held its contribution, ``zero_grad()`` set
    ``.grad`` to None, and the next sync (another model's backward) made the discarded contribution the gradient.
    Without TP the gradient stays None."""
    fake = _Dist()
    monkeypatch.setattr(tpm, "dist", fake)
    m = _Model()
    (m.w * 4.0).sum().backward()
    m.zero_grad()  # set_to_none: that micro-batch is discarded
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad is None
    (m.w * 1.0).sum().backward()  # the next accumulation counts alone
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]


# ---------------------------------------------------------------------------- dataset_metrics, pack_dataset
def test_dataset_metrics_of_a_planned_pass():
    import numpy as np

    from atac_hf.packing import metrics
    from atac_hf.cost.model import default_cost_model

    lengths = np.array([0, 5, 12, 3, 1])
    spans = np.array([[1, 0, 5], [3, 0, 3], [2, 0, 8], [2, 8, 12], [4, 0, 1]])  # sample 2 split in two
    offsets = np.array([0, 2, 3, 5])
    cm = default_cost_model()
    got = metrics.dataset_metrics(lengths, spans, offsets, NS(max_tokens=8, packs_per_window=2), cm)
    costs = metrics.pack_costs([spans[0:2], spans[2:3], spans[3:5]], cm)
    ratios = [costs[0:2].max() / costs[0:2].mean(), 1.0]  # windows of 2 packs, the last one shorter
    assert got == {"num_samples": 4, "num_packs": 3, "tokens": 21, "lower_bound_packs": 3, "packs_vs_lower_bound": 1.0,
                   "padding": pytest.approx(1 - 21 / 24), "num_split": 1, "num_fragments": 2,
                   "fragment_lengths": {"min": 4.0, "p10": pytest.approx(4.4), "median": 6.0,
                                        "p90": pytest.approx(7.6), "max": 8.0},
                   "imbalance_mean": pytest.approx(np.mean(ratios)), "imbalance_worst": pytest.approx(max(ratios))}
    assert ratios[0] > 1.0
    empty = metrics.dataset_metrics(np.array([0]), np.zeros((0, 3), np.int64), np.array([0]),
                                    NS(max_tokens=8, packs_per_window=2), cm)
    assert (empty["num_packs"], empty["padding"], empty["packs_vs_lower_bound"]) == (0, 0.0, 1.0)
    assert (empty["imbalance_mean"], empty["imbalance_worst"]) == (1.0, 1.0)


def test_a_dataset_dict_is_packed_with_every_setting_and_its_refusals_name_the_fix(capsys):
    import datasets

    from atac_hf.packing.data.dataset import pack_dataset

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [list(range(1, 20)), [1, 2]]})})
    _, m = pack_dataset(dd, max_tokens=8, packs_per_window=2, overlength="truncate", return_metrics=True,
                        keep_in_memory=True, desc="Pk")
    assert m["train"]["num_split"] == 0 and m["train"]["tokens"] == 10  # truncated, not split
    assert "Pk train: planning" in capsys.readouterr().err  # each split's label
    dd["test"] = dd["train"].select([])
    with pytest.raises(ValueError, match=r"^pack_dataset: split\(s\) \['test'\] of the DatasetDict have 0 rows: "
                                         r"nothing to pack; pack the others \(DatasetDict\(\{k: v for k, v in "
                                         r"dd.items\(\) if len\(v\)\}\)\)$"):
        pack_dataset(dd, max_tokens=8, progress=False)


def test_source_refusals_and_warnings_in_full():
    import datasets

    from atac_hf.packing.data.dataset import pack_dataset

    with pytest.raises(ValueError, match=r"^the dataset has no 'input_ids' column; columns found: \['text'\]"):
        pack_dataset(datasets.Dataset.from_dict({"text": ["a"]}), max_tokens=8, progress=False)
    with pytest.raises(ValueError, match=r"^pack_dataset got an empty dataset \(0 rows\): nothing to pack$"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1]]}).select([]), max_tokens=8, progress=False)
    with pytest.raises(ValueError, match=r"^every one of the 2 samples of the dataset is empty \(0 input_ids\)$"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[], []]}), max_tokens=8, progress=False)
    with pytest.warns(UserWarning, match=r"^pack_dataset: skipped 1 zero-length samples$"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[], [1, 2]]}), max_tokens=8, progress=False)
    padded = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4]], "attention_mask": [[1, 0], [1, 1]]})
    with pytest.warns(UserWarning, match=r"PackedDataCollator / ATACTrainer refuse such rows; a collator that ignores "
                                         r"attention_mask would train on them. Tokenize without padding "
                                         r"\(padding=False\), or strip the padding \(keep the tokens where "
                                         r"attention_mask is 1\) before packing$"):
        pack_dataset(padded, max_tokens=8, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the padded row is not selected: no warning
        pack_dataset(padded.select([1]), max_tokens=8, progress=False)

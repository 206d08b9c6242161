"""Thirty-eighth mutation pass: survivors of mutants planted by hand in red-team 26/27's changes.

Killed here, in process: :func:`check_model_sharded` under a fake ``torch.distributed`` (the first
``min(cp_size, 4)`` CP ranks probe, on gloo groups made per architecture probed, with the timeout; a rank
outside the probe takes the others' verdict through a MIN all-reduce; the refusing rank keeps its measured error
and exception class; the verdict cached per class, config and cp_size; nothing at cp_size 1 even with a group;
the attention put back), the trainer's and the accelerator's call of it (its timeout and the attention from before
``prepare_model``); the probe's fallbacks (an embeddings-only class that calls its embedding itself, an ids-only
class with an in-place scale or that refuses a special id, a class that embeds twice when fed ids), its input
gradient comparison (a backward-only token shift), ``param_err``'s edge cases and ``plain_ids``' config walk;
the eval loader kept per kind (reused only with persistent workers, per named eval set, the test set apart).
"""

from __future__ import annotations

import datetime
import os
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(__file__))

from atac_hf.attention.model_check import ModelVerdict  # noqa: E402
from atac_hf.attention.probe_compare import param_err, plain_ids  # noqa: E402


def _tiny_llama(cls=LlamaForCausalLM, attn="eager", **kw):
    cfg = LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, **kw)
    torch.manual_seed(0)
    return cls._from_config(cfg, attn_implementation=attn, dtype=torch.float64)


# ---------------------------------------------------------------------------- check_model_sharded, fake dist
class _Group:
    def __init__(self, ranks):
        self.ranks = tuple(ranks)

    def __repr__(self):
        return f"_Group{self.ranks}"


class _FakeDist:
    """What check_model_sharded calls on torch.distributed, for one process of a world of CP groups."""

    def __init__(self, monkeypatch, *, cp_groups, mine, backend="gloo", others=(1,), verdict=None):
        import torch.distributed as dist

        import atac_hf.attention.model_check as mc
        import atac_hf.integrations.sharded_check as sc

        self.cp_groups, self.world = [tuple(g) for g in cp_groups], sum(len(g) for g in cp_groups)
        self.cp_group = _Group(self.cp_groups[mine])
        self.backend, self.others = backend, list(others)
        self.new_groups, self.reduces, self.probes, self.destroyed = [], [], [], []
        self.verdict = verdict or ModelVerdict("LlamaForCausalLM", "llama", True, "exact", max_error=1e-9)
        monkeypatch.setattr(sc, "_VERDICTS", {})
        for name in ("get_process_group_ranks", "get_world_size", "all_gather_object", "get_backend", "new_group",
                     "all_reduce", "destroy_process_group"):
            monkeypatch.setattr(dist, name, getattr(self, name))
        monkeypatch.setattr(mc, "check_architecture", self.check_architecture)

    def get_process_group_ranks(self, group):
        return list(group.ranks)

    def get_world_size(self, group=None):
        return self.world

    def all_gather_object(self, out, obj):
        assert obj == self.cp_group.ranks
        every = [g for g in self.cp_groups for _ in g]  # each process's own CP group
        out[:] = every

    def get_backend(self, group=None):
        return self.backend

    def new_group(self, ranks, backend=None, timeout=None):
        self.new_groups.append((tuple(ranks), backend, timeout))
        return _Group(ranks)

    def destroy_process_group(self, group=None):
        self.destroyed.append(group)

    def all_reduce(self, t, op=None, group=None):
        import torch.distributed as dist

        self.reduces.append((int(t.item()), op, group))
        vals = [int(t.item()), *self.others]
        t.fill_({dist.ReduceOp.MIN: min, dist.ReduceOp.MAX: max}.get(op, sum)(vals))

    def check_architecture(self, model_cls, config, *, rank=0, world=1, group=None, shrink=True):
        self.probes.append((model_cls, rank, world, group))
        return self.verdict


def test_at_cp_size_8_the_first_four_ranks_probe_on_a_gloo_group_of_their_own(monkeypatch):
    # kills: k = cp_size, k = min(cp_size, 3), the probe group of ranks[:k - 1], the timeout left out, the message's
    # rank count as cp_size
    from atac_hf.integrations.sharded_check import check_model_sharded

    fake = _FakeDist(monkeypatch, cp_groups=[range(8)], mine=0, backend="nccl")
    check_model_sharded(_tiny_llama(), 0, fake.cp_group, 8, timeout_s=45)
    ((_, rank, world, group),) = fake.probes
    assert (rank, world, group.ranks) == (0, 4, (0, 1, 2, 3))
    t = datetime.timedelta(seconds=45)
    assert fake.new_groups == [(tuple(range(8)), "gloo", t), ((0, 1, 2, 3), "gloo", t)]
    assert [(v, g.ranks) for v, _, g in fake.reduces] == [(1, tuple(range(8)))]  # agreement: over all 8
    assert [g.ranks for g in fake.destroyed] == [tuple(range(8)), (0, 1, 2, 3)]  # both twins destroyed after it
    fake = _FakeDist(monkeypatch, cp_groups=[range(8)], mine=0, others=(0,),
                     verdict=ModelVerdict("LlamaForCausalLM", "llama", False, "x", max_error=0.25))
    with pytest.raises(NotImplementedError, match=r"sharded over 4 CP ranks \(probe max relative error 2\.5e-01"):
        check_model_sharded(_tiny_llama(), 0, fake.cp_group, 8)
    assert fake.new_groups[-1] == ((0, 1, 2, 3), "gloo", None)
    assert [v for v, _, _ in fake.reduces] == [0]  # refused here: 0 goes into the MIN


@pytest.mark.parametrize("cp_rank", [4, 7])
def test_a_rank_outside_the_probe_takes_the_others_verdict(monkeypatch, cp_rank):
    # kills: cp_rank <= k, the MIN all-reduce as MAX or left out, a bystander's own verdict made "refused"
    import torch.distributed as dist

    from atac_hf.integrations.sharded_check import check_model_sharded

    fake = _FakeDist(monkeypatch, cp_groups=[range(8)], mine=0)
    check_model_sharded(_tiny_llama(), cp_rank, fake.cp_group, 8)  # every rank accepts: accepted
    assert fake.probes == [] and [(v, op) for v, op, _ in fake.reduces] == [(1, dist.ReduceOp.MIN)]
    fake = _FakeDist(monkeypatch, cp_groups=[range(8)], mine=0, others=(1, 0, 1))
    with pytest.raises(NotImplementedError, match=r"probe refused: refused on CP rank 0 \(see its error\)"):
        check_model_sharded(_tiny_llama(), cp_rank, fake.cp_group, 8)
    assert fake.probes == []


def test_the_refusing_rank_keeps_its_measured_error_and_exception_class(monkeypatch):
    # kills: the verdict replaced by "refused on CP rank 0" on a rank that refused itself, the exception class
    # dropped, the measured error's branch inverted, k > len(ranks) (a needless probe group at cp_size <= 4)
    from atac_hf.integrations.sharded_check import check_model_sharded

    refused = ModelVerdict("LlamaForCausalLM", "llama", False, "its own reason", max_error=None, error=ValueError)
    fake = _FakeDist(monkeypatch, cp_groups=[(0, 1)], mine=0, others=(0,), verdict=refused)
    with pytest.raises(ValueError, match=r"over 2 CP ranks \(probe refused: its own reason\)"):
        check_model_sharded(_tiny_llama(), 1, fake.cp_group, 2)
    assert fake.new_groups == [] and fake.probes[0][1:] == (1, 2, fake.cp_group)  # gloo: the CP group itself


def test_the_verdict_is_cached_per_class_config_and_cp_size_and_no_group_is_kept(monkeypatch):
    # kills: the verdict not cached, cached without cp_size, the gloo groups made at a cached verdict's call
    from atac_hf.integrations import sharded_check as sc

    fake = _FakeDist(monkeypatch, cp_groups=[(0, 1)], mine=0, backend="nccl")
    model = _tiny_llama()
    sc.check_model_sharded(model, 0, fake.cp_group, 2)
    sc.check_model_sharded(model, 0, fake.cp_group, 2)
    assert (len(fake.probes), len(fake.reduces), len(fake.new_groups)) == (1, 1, 1)
    sc._VERDICTS.clear()  # another architecture: a new twin (none is kept: a group held past destroy_process_group
    sc.check_model_sharded(model, 0, fake.cp_group, 2)  # keeps gloo threads alive at exit, test_first_hour)
    assert (len(fake.probes), len(fake.new_groups)) == (2, 2)
    assert not [v for v in vars(sc).values() if isinstance(v, dict) and any(
        isinstance(x, _Group) or (isinstance(x, tuple) and any(isinstance(y, _Group) for y in x)) for x in v.values())]
    sc.check_model_sharded(model, 0, fake.cp_group, 3)  # another cp_size: probed again
    assert len(fake.probes) == 3


def test_gloo_twins_of_every_cp_group_are_made_in_one_order_and_this_process_takes_its_own(monkeypatch):
    # kills: the backend test inverted, any group stored as this one's
    from atac_hf.integrations.sharded_check import check_model_sharded

    fake = _FakeDist(monkeypatch, cp_groups=[(2, 3), (0, 1)], mine=1, backend="nccl")
    check_model_sharded(_tiny_llama(), 0, fake.cp_group, 2)
    # (every process makes every group, in one order: sorted here, though a set of int tuples built from the one
    # gathered list iterates alike on every process too)
    assert sorted(r for r, _, _ in fake.new_groups) == [(0, 1), (2, 3)]
    assert fake.probes[0][3].ranks == (0, 1) and fake.reduces[0][2].ranks == (0, 1)
    fake = _FakeDist(monkeypatch, cp_groups=[(0, 1), (2, 3)], mine=0, backend="gloo")
    check_model_sharded(_tiny_llama(), 0, fake.cp_group, 2)
    assert fake.new_groups == [] and fake.probes[0][3] is fake.cp_group and fake.reduces[0][2] is fake.cp_group
    assert fake.destroyed == []  # the run's own CP group is not the probe's to destroy


def test_nothing_is_probed_at_cp_size_1_even_with_a_group(monkeypatch):
    # kills: cp_size < 1, `and` for `or`
    from atac_hf.integrations.sharded_check import check_model_sharded

    fake = _FakeDist(monkeypatch, cp_groups=[(0,)], mine=0)
    check_model_sharded(_tiny_llama(), 0, fake.cp_group, 1)
    assert (fake.probes, fake.reduces, fake.new_groups) == ([], [], [])


def test_a_refused_model_gets_its_attention_back(monkeypatch):
    from atac_hf.integrations.sharded_check import check_model_sharded

    refused = ModelVerdict("LlamaForCausalLM", "llama", False, "x", max_error=0.5)
    fake = _FakeDist(monkeypatch, cp_groups=[(0, 1)], mine=0, verdict=refused)
    model = _tiny_llama()
    with pytest.raises(NotImplementedError):
        check_model_sharded(model, 0, fake.cp_group, 2, restore="sdpa")
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(NotImplementedError):  # (cached verdict) no restore: left as it is
        check_model_sharded(model, 0, fake.cp_group, 2)
    assert model.config._attn_implementation == "sdpa"


# ---------------------------------------------------------------------------- the callers
def _spy(monkeypatch, module):
    calls = []

    def spy(model, cp_rank, cp_group, cp_size, **kw):
        calls.append((model.config._attn_implementation, cp_size, kw))

    monkeypatch.setattr(module, "check_model_sharded", spy)
    return calls


def test_the_trainer_and_the_accelerator_run_the_sharded_check_with_the_attention_from_before(monkeypatch, tmp_path):
    # kills: the call dropped, restore=None, the attention read after prepare_model, the timeout left out
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    import atac_hf.integrations.accelerate as acc_mod
    import atac_hf.integrations.trainer as tr_mod
    from atac_hf.integrations import ATACAccelerator, ATACConfig, ATACTrainer
    from _integration_worker import dataset, model

    config = ATACConfig(cp_size=1, max_tokens=1024, min_chunk=8, collective_timeout_s=77.0)
    calls = _spy(monkeypatch, tr_mod)
    AcceleratorState._reset_state(True)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", max_steps=1,
                             disable_tqdm=True, log_level="error")
    m = model()
    before = m.config._attn_implementation
    ATACTrainer(model=m, args=args, train_dataset=dataset(10, seed=1), atac_config=config)
    assert calls == [("atac_cp", 1, {"timeout_s": 77.0, "restore": before})] and before != "atac_cp"
    calls = _spy(monkeypatch, acc_mod)
    AcceleratorState._reset_state(True)
    m = model()
    ATACAccelerator(config, cpu=True).prepare(m)
    assert calls == [("atac_cp", 1, {"timeout_s": 77.0, "restore": before})]
    AcceleratorState._reset_state(True)


# ---------------------------------------------------------------------------- the probe's inputs and fallbacks
def _verdict(model):
    from atac_hf.attention.model_check import check_architecture

    return check_architecture(type(model), model.config)


class EmbedsOnlyLlama(LlamaForCausalLM):
    """Takes embeddings only, and calls its input embedding itself (a learned offset: token 0's embedding)."""

    def forward(self, inputs_embeds, position_ids=None, labels=None, **kwargs):
        zero = torch.zeros(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
        inputs_embeds = inputs_embeds + self.get_input_embeddings()(zero)
        return super().forward(inputs_embeds=inputs_embeds, position_ids=position_ids, labels=labels, **kwargs)


def test_an_embeddings_only_class_that_calls_its_embedding_is_probed_through_embeddings():
    # kills: no fallback to embeddings (except narrowed), via_ids left True after it, the tap kept on the
    # embedding when the probe embeds (it counted the model's own call)
    verdict = _verdict(_tiny_llama(EmbedsOnlyLlama))
    assert verdict.exact and verdict.max_error < 1e-12, verdict


class TwiceEmbedLlama(LlamaForCausalLM):
    """Fed ids, embeds them twice (the tap refuses: the probe falls back to embeddings after a backward ran)."""

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        if input_ids is not None:
            embed = self.get_input_embeddings()
            inputs_embeds = 0.5 * (embed(input_ids) + embed(input_ids))
        return super().forward(inputs_embeds=inputs_embeds, **kwargs)


def test_gradients_of_a_failed_ids_attempt_are_dropped_before_the_embeddings_one():
    # kills: the zero_grad before the fallback (the first document's parameter gradients counted twice)
    verdict = _verdict(_tiny_llama(TwiceEmbedLlama))
    assert verdict.exact and verdict.max_error < 1e-12, verdict


class InPlaceScaleIdsLlama(LlamaForCausalLM):
    """Ids only, and scales its embeddings in place (as some models do)."""

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        h = self.get_input_embeddings()(input_ids)
        h.mul_(2.0)
        return super().forward(inputs_embeds=h, position_ids=position_ids, labels=labels, **kwargs)


def test_the_tap_hands_the_model_a_copy_it_may_scale_in_place():
    # kills: the hook returning its leaf (in-place on a leaf that requires grad: "could not be probed")
    verdict = _verdict(_tiny_llama(InPlaceScaleIdsLlama))
    assert verdict.exact and verdict.max_error < 1e-12, verdict


def _probe_ids():
    # the probe's draw (run_probe: torch.Generator seeded 1, ids in [3, vocab) of the tiny copy's 128)
    from atac_hf.attention.model_probe import PROBE_DOC_LENGTHS

    g = torch.Generator().manual_seed(1)
    return torch.randint(3, 128, (1, sum(PROBE_DOC_LENGTHS)), generator=g)


class NoPadIdsLlama(LlamaForCausalLM):
    """Ids only; refuses its pad id in the input (as a multimodal model refuses placeholders without features)."""

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        if (input_ids == self.config.pad_token_id).any():
            raise ValueError("pad token in input_ids")
        return super().forward(input_ids=input_ids, position_ids=position_ids, labels=labels, **kwargs)


def test_the_probe_draws_no_special_token_id():
    # kills: plain_ids not applied to the probe's ids
    pad = int(_probe_ids()[0, 0])
    verdict = _verdict(_tiny_llama(NoPadIdsLlama, pad_token_id=pad))
    assert verdict.exact and verdict.max_error < 1e-12, verdict


class GradShiftLlama(LlamaForCausalLM):
    """A token shift in the backward only (the forward is the identity): only the input gradients cross documents."""

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        if input_ids is not None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        prev = F.pad(inputs_embeds, (0, 0, 1, 0))[:, :-1]
        return super().forward(inputs_embeds=inputs_embeds + (prev - prev.detach()), **kwargs)


def test_input_gradients_are_compared():
    # kills: the input gradients left out of the probe's error (logits and parameter gradients are exact here)
    verdict = _verdict(_tiny_llama(GradShiftLlama))
    assert not verdict.exact and verdict.max_error > 1e-3, verdict


# ---------------------------------------------------------------------------- param_err, plain_ids
def test_param_err_edge_cases():
    one = [torch.tensor([1.0, -2.0])]
    assert param_err(one, [torch.tensor([1.0, -2.0])]) == 0.0
    assert param_err(one, [torch.tensor([1.0, -2.0]), torch.zeros(1)]) == float("inf")  # a parameter missing
    assert param_err([torch.zeros(3)], [torch.zeros(2)]) == float("inf")  # a shape
    assert param_err([torch.tensor([float("nan"), 0.0])], [torch.tensor([1.0, 0.0])]) == float("inf")
    assert param_err([torch.tensor([0.5])], [torch.tensor([0.0])]) == 0.5  # all zero: the absolute difference
    # an empty parameter is skipped (and counts for nothing in the floor)
    assert param_err([torch.zeros(0), torch.tensor([2.0])], [torch.zeros(0), torch.tensor([1.0])]) == 1.0
    # the floor: 1e-3 of the largest gradient of any parameter
    big, small = torch.tensor([100.0]), torch.tensor([1e-6])
    assert param_err([big, small * 2], [big, small]) == pytest.approx(1e-6 / 0.1)
    assert param_err([big, torch.tensor([1.0])], [big, torch.tensor([0.5])]) == pytest.approx(1.0)  # above it


def test_plain_ids_walks_sub_configs_and_keys_of_token_ids_and_indices_only():
    ids = torch.arange(3, 16)[None]

    def special(d):
        out = plain_ids(ids, SimpleNamespace(to_dict=lambda: d), 16)
        return sorted(set(ids[0].tolist()) - set(out[0].tolist()))

    assert special({"text_config": {"pad_token_id": 7}}) == [7]  # a composite model's text config
    assert special({"stop_token_ids": [8, 9]}) == [8, 9]
    assert special({"image_token_index": 10}) == [10]
    assert special({"sep_token_id": 11, "layer_index": 12, "num_hidden_layers": 13, "kv_id": 14}) == [11]


# ---------------------------------------------------------------------------- eval loaders per kind
def _trainer(tmp_path, workers, persistent, eval_dataset):
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer
    from _integration_worker import dataset, model

    AcceleratorState._reset_state(True)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", max_steps=1,
                             disable_tqdm=True, log_level="error", dataloader_num_workers=workers,
                             dataloader_persistent_workers=persistent)
    return ATACTrainer(model=model(), args=args, train_dataset=dataset(10, seed=1), eval_dataset=eval_dataset,
                       atac_config=ATACConfig(cp_size=1, max_tokens=1024, min_chunk=8))


@pytest.mark.parametrize("workers,persistent", [(0, False), (0, True), (1, False)])
def test_an_eval_loader_is_made_again_without_persistent_workers(tmp_path, workers, persistent):
    # kills: reused without persistent workers, or with persistent_workers set but no workers (Trainer reuses
    # only with both)
    from _integration_worker import dataset

    t = _trainer(tmp_path, workers, persistent, dataset(6, seed=2))
    first = t.get_eval_dataloader()
    second = t.get_eval_dataloader()
    assert second is not first and first not in t.accelerator._dataloaders and second in t.accelerator._dataloaders


def test_persistent_eval_loaders_are_kept_per_named_eval_set_and_apart_from_the_test_set(tmp_path):
    # kills: one kind for every named eval set, the test set's loader in the eval kind, the same-dataset test
    # inverted
    from _integration_worker import dataset

    evals = {"a": dataset(6, seed=2), "b": dataset(5, seed=3)}
    t = _trainer(tmp_path, 1, True, evals)
    a, b = t.get_eval_dataloader("a"), t.get_eval_dataloader("b")
    test = t.get_test_dataloader(dataset(4, seed=4))
    assert a is not b and t.get_eval_dataloader("a") is a and t.get_eval_dataloader("b") is b
    assert test in t.accelerator._dataloaders and a in t.accelerator._dataloaders
    other = t.get_eval_dataloader(evals["b"])  # a dataset given directly: the "eval" kind
    assert other is not b and t.get_eval_dataloader(evals["b"]) is other and t.get_eval_dataloader("b") is b


def test_training_packs_are_recorded_for_the_logged_means_and_eval_packs_are_not(tmp_path):
    # kills: record=True (eval packs counted in the next training log's means), record=not training
    from _integration_worker import dataset

    t = _trainer(tmp_path, 0, False, dataset(6, seed=2))
    t.args.logging_steps = 1
    t.train()
    logged = [h for h in t.state.log_history if "loss" in h]
    assert logged and "atac/imbalance" in logged[0] and "atac/planner_ms" in logged[0], t.state.log_history
    assert t.atac_sharder.pop_summary() == {}
    t.evaluate()
    assert t.atac_sharder.pop_summary() == {}


def test_release_loader_stops_the_workers_of_an_iterator_held_elsewhere_and_forgets_it():
    # kills: the workers left to the iterator's __del__ (an exception's traceback, a user's loop may hold it), the
    # shut-down iterator kept on the loader (iterated again, a persistent-workers loader would _reset dead workers),
    # the accelerator's list filtered the wrong way
    from atac_hf.integrations._hf_compat import release_loader

    stopped = []
    iterator = SimpleNamespace(_shutdown_workers=lambda: stopped.append(True))
    loader, other = SimpleNamespace(_iterator=iterator), SimpleNamespace(_iterator=None)
    accelerator = SimpleNamespace(_dataloaders=[other, loader])
    release_loader(accelerator, loader)
    assert stopped == [True] and loader._iterator is None and accelerator._dataloaders == [other]
    release_loader(accelerator, loader)  # again: nothing to stop
    assert stopped == [True] and accelerator._dataloaders == [other]


class DetachedEmbedsLlama(LlamaForCausalLM):
    """Stops the gradient at its input embeddings (a frozen-embedding trick): the tap's leaf gets no .grad."""

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        if input_ids is not None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        return super().forward(inputs_embeds=inputs_embeds.detach(), **kwargs)


def test_an_input_embedding_without_a_gradient_compares_as_zeros():
    # kills: the tap's grad() returning None (the stock runs then fail: "could not be probed")
    verdict = _verdict(_tiny_llama(DetachedEmbedsLlama))
    assert verdict.exact and verdict.max_error < 1e-12, verdict


def test_the_tap_records_the_input_gradient_on_its_own_leaf():
    # kills P31 (left by the pass): the embedding's output recorded without detach(), so its .grad stays None and
    # the input gradients compare as zeros on both sides
    from atac_hf.attention.probe_compare import EmbeddingTap, logits_2d

    model = _tiny_llama()
    with EmbeddingTap(model) as tap:
        logits_2d(model(input_ids=torch.arange(3, 10)[None])).sum().backward()
    grad = tap.grad()
    assert grad.shape == (1, 7, 16) and float(grad.abs().sum()) > 0
    assert model.get_input_embeddings().weight.grad is None  # the tap's leaf stands in for the embedding's output

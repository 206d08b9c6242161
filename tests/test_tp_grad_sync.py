"""Red-team 35 (tensor parallel x CP): gradients summed over TP exactly once whatever the loop does, and TP
refusals that change nothing.

* Per-head parameters whose gradient on a TP rank covers its own heads (Qwen3's ``q_norm``/``k_norm``) were
  summed over TP in place at every sync: a loop accumulating by hand (two ``accelerator.backward`` calls
  with ``gradient_accumulation_steps=1``, or the first under ``no_sync``) counted the first micro-batch
  ``tp_size`` times (``k_norm`` gradient off by 1.02 relative), and a second model prepared on the same
  accelerator re-summed the first one's on its own backward (2.0x). Each backward's contribution is now held
  apart and summed once (``tensor_parallel._hold_partial_grad``).
* ``ATACAccelerator.prepare`` / ``ATACTrainer`` refused a model TP cannot split only after switching it to
  ``atac_cp`` (and adding hooks); ``load_best_model_at_end`` and ``save_state`` under TP failed late (mixed
  Tensor/DTensor, an invalid storage) after training or with an empty checkpoint folder left behind.

The in-process tests simulate a TP group of 2 where a collective is needed; the slow test runs 2 gloo
processes (tp 2) against one process in fp64.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest
import torch

from atac_hf.integrations import ATACConfig
from atac_hf.integrations import tensor_parallel as tpm

sys.path.insert(0, os.path.dirname(__file__))
from test_tp_cp_config import NEEDS_TP_API, _llama  # noqa: E402


class _Norm(torch.nn.Module):
    """A model with one per-head parameter registered as TP apply_tensor_parallel leaves it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        self._atac_tp_partial_grads = ("w",)
        self._atac_tp_group = None
        tpm._hold_partial_grad(self.w)


@pytest.fixture
def two_tp_ranks(monkeypatch):
    """_all_reduce as over 2 TP ranks holding the same gradient: a SUM doubles it (a mean keeps it)."""

    def fake(grads, group, *, average):
        for g in grads:
            if not average:
                g.mul_(2)

    monkeypatch.setattr(tpm, "_all_reduce", fake)


def test_partial_grads_summed_once_over_backwards_and_syncs(two_tp_ranks):
    m = _Norm()
    (m.w * torch.tensor([3.0, 5.0])).sum().backward()  # contribution 1: [3, 5]
    assert m.w.grad.tolist() == [3.0, 5.0], "this rank's share until the sync (its sum over TP held apart)"
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [6.0, 10.0]  # summed over the 2 ranks once
    tpm.sync_tp_gradients(m, None)  # a second sync (another model's backward): nothing new to sum
    assert m.w.grad.tolist() == [6.0, 10.0]
    (m.w * torch.tensor([1.0, 1.0])).sum().backward()  # a second micro-batch accumulated by hand
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [8.0, 12.0]  # 2 x ([3, 5] + [1, 1]); summing in place gave [14, 22]
    m.w.grad = None  # optimizer.zero_grad(): a new accumulation
    (m.w * torch.tensor([7.0, 0.0])).sum().backward()
    (m.w * torch.tensor([1.0, 1.0])).sum().backward()  # two backwards, one sync (gradient accumulation)
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [16.0, 2.0]


def test_a_parameter_frozen_at_sharding_or_copied_is_summed_in_place_then_hooked(two_tp_ranks):
    """Review of red-team 35's fix: a frozen per-head parameter crashed apply_tensor_parallel (a hook needs
    requires_grad) after the model was sharded; one unfrozen later, or a copy's (hooks are not copied), had no
    hook: its gradient, accumulated in .grad, is summed in place at its first sync, and it is hooked from then on."""
    m = _Norm.__new__(_Norm)
    torch.nn.Module.__init__(m)
    m.w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))  # not hooked (frozen when sharded, unfrozen since)
    m._atac_tp_partial_grads, m._atac_tp_group = ("w",), None
    (m.w * torch.tensor([3.0, 5.0])).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [6.0, 10.0] and m.w._atac_tp_hooked
    (m.w * 1.0).sum().backward()  # hooked now: held apart, summed once
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [8.0, 12.0]
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    m.v = frozen
    m._atac_tp_partial_grads = ("w", "v")
    tpm.sync_tp_gradients(m, None)  # a frozen one without a gradient: left alone, no hook (it needs requires_grad)
    assert frozen.grad is None and not getattr(frozen, "_atac_tp_hooked", False)


def test_autograd_grad_gets_the_ranks_share_and_holds_nothing(two_tp_ranks):
    """Review of red-team 35's fix: torch.autograd.grad also passes through the hook, which returned zeros and
    held the contribution for the next sync; only a backward that accumulates moves it now."""
    m = _Norm()
    (g,) = torch.autograd.grad((m.w * torch.tensor([3.0, 5.0])).sum(), [m.w])
    assert g.tolist() == [3.0, 5.0] and m.w.grad is None
    assert getattr(m.w, "_atac_tp_pending", None) is None
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]


def test_layer_heads_of_a_config_with_per_layer_attention():
    """Review of red-team 35's fix: a config with per-layer head counts (Dots3, EmbeddingGemma2) raised its own
    'ambiguous global attribute' error from check_tp_model; each layer's counts are read."""
    from types import SimpleNamespace

    from atac_hf.integrations.tp_heads import _layer_heads

    cfg = SimpleNamespace(is_heterogeneous=True, per_layer_config=[
        SimpleNamespace(num_attention_heads=8, num_key_value_heads=2), SimpleNamespace(num_attention_heads=4)])
    assert _layer_heads(cfg) == [(8, 2), (4, 4)]
    assert _layer_heads(SimpleNamespace(num_attention_heads=6, num_key_value_heads=None)) == [(6, 6)]


def test_held_contributions_of_a_zeroed_accumulation_are_dropped(two_tp_ranks):
    m = _Norm()
    (m.w * 4.0).sum().backward()
    m.w.grad = None  # zero_grad(set_to_none=True) without a sync: that micro-batch is discarded
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]


def test_held_contributions_of_an_accumulation_zeroed_in_place_are_dropped(two_tp_ranks):
    """zero_grad(set_to_none=False) between syncs (micro-batches discarded) kept the held contribution: it was
    summed into the next step (the hole stop 52 documented). A .grad changed or replaced since the last
    backward and all zeros starts a new accumulation; one changed otherwise keeps what is held."""
    m = _Norm()
    (m.w * 4.0).sum().backward()
    m.w.grad.zero_()  # zero_grad(set_to_none=False)
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]
    m.w.grad = torch.zeros(2)  # a fresh zero tensor, after the step
    (m.w * 3.0).sum().backward()
    (m.w * 1.0).sum().backward()  # .grad untouched in between (zeros left by the hook): accumulated
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [8.0, 8.0]
    m.w.grad.zero_()
    (m.w * 5.0).sum().backward()
    m.w.grad.add_(1.0)  # changed, not zeroed: the held contribution stays
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [13.0, 13.0]  # 1 + 2 x (5 + 1)


@NEEDS_TP_API
def test_accelerator_prepare_refuses_under_tp_before_changing_anything():
    from atac_hf.integrations.accelerate import ATACAccelerator

    acc = object.__new__(ATACAccelerator)  # the checks read only these
    acc.atac_config, acc.tp_size = ATACConfig(), 2
    bad = _llama(num_attention_heads=3, num_key_value_heads=3, hidden_size=48)
    hooks = len(bad._forward_hooks) + sum(len(m._forward_hooks) for m in bad.modules())
    with pytest.raises(ValueError, match=r"tp_size=2 does not divide LlamaForCausalLM's num_attention_heads=3"):
        acc.prepare(bad, torch.optim.SGD(bad.parameters(), lr=0.1))
    assert bad.config._attn_implementation != "atac_cp"
    assert sum(len(m._forward_hooks) for m in bad.modules()) + len(bad._forward_hooks) == hooks
    good, head = _llama(), torch.nn.Linear(32, 1)
    with pytest.raises(ValueError, match=r"prepare\(\) got Linear \(no attention\) beside the model with tp_size=2: "
                                         r"under TP Accelerate prepares tensor-parallel models only .*prepare the "
                                         r"model alone .*or train the head with tp_size=1 \(parallelism_config\)"):
        acc.prepare(good, head, torch.optim.SGD(list(good.parameters()) + list(head.parameters()), lr=0.1))
    assert good.config._attn_implementation != "atac_cp"


def test_accelerator_save_state_under_tp_is_refused_before_writing(tmp_path):
    from atac_hf.integrations.accelerate import ATACAccelerator

    acc = object.__new__(ATACAccelerator)
    acc.tp_size = 2
    with pytest.raises(ValueError, match=r"save_state with tp_size=2: .*not resumable from checkpoints; save the "
                                         r"weights with atac_hf.integrations.tensor_parallel.full_state_dict\(model\) "
                                         r".*set tp_size=1 \(parallelism_config\) to resume"):
        acc.save_state(str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt").exists()


def _trainer_args(tmp_path, **kw):
    from accelerate.parallelism_config import ParallelismConfig
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                             parallelism_config=ParallelismConfig(tp_size=2, cp_size=1), **kw)


@NEEDS_TP_API
def test_trainer_refuses_tp_settings_and_models_before_changing_anything(tmp_path):
    import datasets

    from atac_hf.integrations import ATACTrainer

    ds = datasets.Dataset.from_dict({"input_ids": [list(range(1, 9))] * 4})
    args = _trainer_args(tmp_path, save_strategy="steps", eval_strategy="steps", save_only_model=True,
                         load_best_model_at_end=True)
    model = _llama()
    with pytest.raises(ValueError, match=r"tp_size=2 with load_best_model_at_end=True: .*set "
                                         r"load_best_model_at_end=False .*or tp_size=1"):
        ATACTrainer(model=model, args=args, train_dataset=ds, eval_dataset=ds, atac_config=ATACConfig(max_tokens=16))
    assert model.config._attn_implementation != "atac_cp"
    bad = _llama(num_attention_heads=3, num_key_value_heads=3, hidden_size=48)
    args = _trainer_args(tmp_path, save_strategy="no")
    pc = args.parallelism_config
    with pytest.raises(ValueError, match=r"tp_size=2 does not divide LlamaForCausalLM's num_attention_heads=3"):
        ATACTrainer(model=bad, args=args, train_dataset=ds, atac_config=ATACConfig(max_tokens=16))
    assert bad.config._attn_implementation != "atac_cp" and args.parallelism_config is pc


# ---------------------------------------------------------------------------- 2 processes (slow)
def _qwen3(seed: int):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=1024,
                      tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float64)


BATCHES = ([[40, 30, 1, 20]], [[60, 31]])


def _reference(seed: int, batches: list, n: int) -> dict:
    """One process, stock sdpa on the packed rows' documents (position_ids restart), target sum / n."""
    from atac_hf.attention import build_shift_labels, doc_lengths_from_batch

    model = _qwen3(seed)
    model.set_attn_implementation("sdpa")
    for b in batches:
        logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits[0, :-1]
        lab = build_shift_labels(b["labels"], doc_lengths_from_batch(b)).reshape(-1)[:-1]
        (torch.nn.functional.cross_entropy(logits.float(), lab, reduction="sum") / n).backward()
    return {k: p.grad for k, p in model.named_parameters()}


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import _dist

    _dist.launch_env(rank, world, port)

    res: dict = {}
    try:
        from accelerate.parallelism_config import ParallelismConfig
        from torch.distributed.tensor import DTensor

        from atac_hf.integrations import ATACAccelerator

        acc = ATACAccelerator(ATACConfig(min_chunk=4), cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
        batches = [_dist.make_batch(rows, seed=i) for i, rows in enumerate(BATCHES)]
        n = acc.count_items(batches)

        def errors(model, ref):
            out = {}
            for k, p in model.named_parameters():
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                r = ref[k.removeprefix("module.")]
                out[k] = float((g - r).abs().max() / r.abs().max())
            return out

        # gradient accumulation by hand (gradient_accumulation_steps=1): two backwards, the first under no_sync
        a, b = _qwen3(0), _qwen3(1)
        oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
        a, oa = acc.prepare(a, oa)
        b, ob = acc.prepare(b, ob)  # a second model on the same accelerator (actor and critic)
        with acc.no_sync(a):
            acc.backward(a(**acc.shard(batches[0], num_items_in_batch=n)).loss)
        acc.backward(a(**acc.shard(batches[1], num_items_in_batch=n)).loss)
        acc.backward(b(**acc.shard(batches[0], num_items_in_batch=n)).loss)  # syncs every prepared model
        res["a"] = errors(a, _reference(0, batches, n))
        res["b"] = errors(b, _reference(1, batches[:1], n))
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        res["error"] = _dist.error_text(e)
    _dist.report_and_exit(os.path.join(out_dir, f"{rank}.json"), res)


@pytest.mark.slow
@NEEDS_TP_API
def test_tp2_manual_accumulation_and_two_models_equal_one_process():
    import torch.multiprocessing as mp

    import _dist
    from _launch import free_port

    out_dir = tempfile.mkdtemp(prefix="atac_tp_sync_")
    ctx = mp.spawn(_worker, args=(2, free_port(), out_dir), nprocs=2, join=False)
    assert not _dist.join_or_kill(ctx, 300), "a rank hung"
    for rank in range(2):
        res = json.loads(open(os.path.join(out_dir, f"{rank}.json")).read())
        assert "error" not in res, res["error"]
        for model in ("a", "b"):
            worst = max(res[model], key=res[model].get)
            assert res[model][worst] < 1e-10, (rank, model, worst, res[model][worst])
            assert any("k_norm" in k for k in res[model])


@NEEDS_TP_API
def test_dropout_under_tp_warns_to_seed_every_rank_alike():
    """Red-team 35: with set_seed(device_specific=True) the TP peers of a Phi with resid_pdrop 0.1 computed different
    hidden states (the losses agreed: the logits are gathered), silently."""
    import warnings

    from transformers import AutoModelForCausalLM, PhiConfig

    phi = AutoModelForCausalLM.from_config(PhiConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                     num_attention_heads=4, vocab_size=64, resid_pdrop=0.1))
    with pytest.warns(UserWarning, match=r"PhiForCausalLM\.model\.layers\.0\.resid_dropout drops out with p > 0 under "
                                         r"tp_size=2: .*seed every rank alike \(accelerate.utils.set_seed\(seed\), not "
                                         r"device_specific=True\) or set the dropout to 0"):
        tpm.check_tp_prepare((phi,), [phi], 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llama = _llama()
        tpm.check_tp_prepare((llama,), [llama], 2)


@NEEDS_TP_API
def test_a_stepped_optimizer_is_refused_before_anything_changes(tmp_path):
    """Review of red-team 35's fix: remap_optimizer_params refused an optimizer that had stepped only after the model
    was sharded (which cannot be put back)."""
    from atac_hf.integrations import ATACTrainer
    from atac_hf.integrations.accelerate import ATACAccelerator

    model = _llama()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()
    opt.zero_grad()
    acc = object.__new__(ATACAccelerator)
    acc.atac_config, acc.tp_size = ATACConfig(), 2
    stepped = r"the optimizer has already stepped: with tp_size > 1 pass it to prepare\(\) \(or to the Trainer\) before"
    with pytest.raises(ValueError, match=stepped):
        acc.prepare(model, opt)
    assert model.config._attn_implementation != "atac_cp"
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [list(range(1, 9))] * 4})
    with pytest.raises(ValueError, match=stepped):
        ATACTrainer(model=model, args=_trainer_args(tmp_path, save_strategy="no"), train_dataset=ds,
                    optimizers=(opt, None), atac_config=ATACConfig(max_tokens=16))
    assert model.config._attn_implementation != "atac_cp"

"""Worker for ``tests/test_redteam29_30_dist.py`` (under ``torchrun --nproc_per_node 2``, CP 2; OUT.json from
rank 0). ``MODE``: ``accelerate`` (``ATACAccelerator``) or ``trainer`` (``ATACTrainer``).

Each case records the error text it met (None: none) and, for AdaLoRA through the accelerator, the largest
relative error of the loss and of every trainable gradient against each document run alone through the
stock model in fp64 (the packed loss: the targets' cross-entropy sum over their count, plus AdaLoRA's
orthogonal regulariser once)."""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model as stock_llama  # noqa: E402

torch.set_num_threads(1)


def _error(fn) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - recorded for the parent test
        return f"{type(e).__name__}: {e}"
    return None


def _prompt_tuned():
    import peft

    return peft.get_peft_model(stock_llama(), peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))


def _adalora():
    import peft

    torch.manual_seed(0)
    model = peft.get_peft_model(stock_llama().double(), peft.AdaLoraConfig(
        task_type="CAUSAL_LM", init_r=2, target_r=1, total_step=10, target_modules=["q_proj", "v_proj"],
        lora_dropout=0.0))
    with torch.no_grad():  # lora_E starts at 0: every adapter gradient but E's would be 0
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return model


def _adalora_reference(ref, batch) -> tuple[float, dict]:
    """The packed loss of ``batch`` from each document alone through ``ref`` (sdpa), and its gradients."""
    ids, lengths = batch["input_ids"][0], [int(n) for n in torch.as_tensor(batch["seq_lengths"]).reshape(-1)]
    targets = sum(n - 1 for n in lengths)
    ce, reg = 0.0, None
    for doc in torch.split(ids, lengths):
        if len(doc) < 2:  # no target
            continue
        out = ref(input_ids=doc[None], labels=doc[None])
        doc_ce = F.cross_entropy(out.logits[0, :-1].double(), doc[1:], reduction="sum")
        reg = out.loss - doc_ce / (len(doc) - 1)  # the regulariser PEFT adds to the mean loss
        ce = ce + doc_ce
    loss = ce / targets + reg
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in ref.named_parameters() if p.requires_grad}


def _pooling_recipe(acc, batch, model_cls) -> dict:
    """docs/INTEGRATION.md's per-document mean pooling under CP against each document alone (fp64)."""
    torch.manual_seed(1)
    base = model_cls(stock_llama().config).double()
    ref = copy.deepcopy(base)
    w = torch.randn(base.config.hidden_size, dtype=torch.float64)
    pbase = acc.prepare(base)
    local = {k: v for k, v in acc.shard(batch).items() if k not in ("labels", "shift_labels", "num_items_in_batch")}
    # the recipe, as the docs give it
    plan, rank = acc.sharder.last_plan, acc.cp_rank
    lengths = torch.as_tensor(plan.doc_lengths)
    doc_of = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[plan.rank_token_indices(rank)]
    h = pbase(**local, output_hidden_states=True).hidden_states[-1][0]
    sums = torch.zeros(len(lengths), h.shape[-1], dtype=h.dtype).index_add(0, doc_of, h)
    sums = torch.distributed.nn.functional.all_reduce(sums, group=acc.cp_group)
    embeddings = sums / lengths[:, None]
    loss = (embeddings @ w).square().mean()
    acc.backward(loss)
    ids = batch["input_ids"][0]
    parts = torch.split(ids, [int(n) for n in lengths])
    ref_emb = torch.stack([ref(input_ids=d[None]).last_hidden_state[0].mean(0) for d in parts])
    ref_loss = (ref_emb @ w).square().mean()
    ref_loss.backward()
    got = dict(acc.unwrap_model(pbase).named_parameters())
    return {"pool_loss_err": abs(float(loss) - float(ref_loss)) / float(ref_loss),
            "pool_grad_err": max(float((got[n].grad - p.grad).norm() / p.grad.norm())
                                 for n, p in ref.named_parameters())}


def accelerate_cases() -> dict:
    from accelerate.state import AcceleratorState

    from atac_hf import ATACAccelerator, ATACConfig

    res: dict = {}
    acc = ATACAccelerator(ATACConfig(cp_size=2, max_tokens=256, min_chunk=4), cpu=True)
    res["prompt"] = _error(lambda: acc.prepare(_prompt_tuned()))

    model = _adalora()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pm, opt = acc.prepare(model, opt)
    loader, _ = acc.packed_dataloader(dataset(24, seed=3), seed=0)
    batch = next(iter(loader))
    loss = pm(**acc.shard(batch)).loss
    acc.backward(loss)
    ref_loss, ref_grads = _adalora_reference(ref, batch)
    got = dict(acc.unwrap_model(pm).named_parameters())
    res["adalora_loss_err"] = abs(float(acc.reduce_loss(loss)) - ref_loss) / abs(ref_loss)
    res["adalora_grad_err"] = max(float((got[n].grad - g).norm() / g.norm()) for n, g in ref_grads.items())
    res["adalora_grads"] = len(ref_grads)
    res["adalora_compared"] = sorted(n.split(".self_attn.")[1].rsplit(".", 1)[0] + "@" + n.split(".layers.")[1][0]
                                     for n in ref_grads)  # e.g. "q_proj.lora_A@0"
    res["adalora_trainable"] = sum(1 for p in acc.unwrap_model(pm).parameters() if p.requires_grad)

    from transformers import LlamaModel

    res.update(_pooling_recipe(acc, batch, LlamaModel))

    # a loss on an intermediate layer's hidden states: the last layer and the norm get no gradient
    base = LlamaModel(stock_llama().config)
    head = torch.nn.Linear(base.config.hidden_size, 1)
    opt = torch.optim.SGD([*base.parameters(), *head.parameters()], lr=0.1)
    pbase, phead, opt = acc.prepare(base, head, opt)
    local = acc.shard(batch)
    local = {k: v for k, v in local.items() if k not in ("labels", "shift_labels", "num_items_in_batch")}
    hidden = pbase(**local, output_hidden_states=True).hidden_states[1]
    res["unused"] = _error(lambda: acc.backward(phead(hidden).square().mean()))

    # the same loss in a micro-step under no_sync (DDP reduces nothing there), then one reaching every parameter
    base = LlamaModel(stock_llama().config)
    pbase, phead = acc.prepare(base, torch.nn.Linear(base.config.hidden_size, 1))

    def accumulate():
        with acc.no_sync(pbase):
            acc.backward(phead(pbase(**local, output_hidden_states=True).hidden_states[1]).square().mean())
        acc.backward(phead(pbase(**local).last_hidden_state).square().mean())

    res["unused_in_no_sync"] = _error(accumulate)

    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        router_aux_loss_coef=0.5, output_router_logits=False, max_position_embeddings=512,
                        attention_dropout=0.0)
    torch.manual_seed(0)
    moe = acc.prepare(MixtralForCausalLM(cfg))
    res["router_per_call"] = _error(lambda: moe(**acc.shard(batch), output_router_logits=True))
    acc.end_training()
    AcceleratorState._reset_state(True)
    return res


def trainer_cases(out_dir: str) -> dict:
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer

    def trainer(model, **kw):
        AcceleratorState._reset_state(True)  # a new trainer per case: new arguments, a new state
        args = TrainingArguments(output_dir=out_dir, max_steps=1, report_to=[], use_cpu=True, disable_tqdm=True,
                                 log_level="error", save_strategy="no", ddp_find_unused_parameters=False, **kw)
        return ATACTrainer(model=model, args=args, train_dataset=dataset(24, seed=3),
                           atac_config=ATACConfig(cp_size=2, max_tokens=256, min_chunk=4))

    res = {"prompt": _error(lambda: trainer(_prompt_tuned())), "adalora": _error(lambda: trainer(_adalora()))}
    model = stock_llama()
    model.unused = torch.nn.Linear(4, 4)  # trainable, never called by the forward
    t = trainer(model)
    res["unused"] = _error(t.train)
    t.accelerator.end_training()
    return res


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    res = accelerate_cases() if mode == "accelerate" else trainer_cases(out + ".run")
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()

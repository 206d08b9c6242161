"""Worker for ``tests/test_redteam26.py`` (under ``torchrun --nproc_per_node 2``; OUT.json from rank 0): model
classes of the user's own that are exact at cp_size 1 but not under CP, refused before training by the
exactness probe sharded over the CP ranks (``atac_hf.integrations.sharded_check``), with the model's attention
put back; a stock Llama is accepted. ``MODE``: ``accelerate`` (``ATACAccelerator.prepare``) or ``trainer``."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM
from transformers.models.llama import modeling_llama as ml

sys.path.insert(0, os.path.dirname(__file__))
from _integration_worker import dataset, model as stock_llama  # noqa: E402

torch.set_num_threads(1)


class _LocalArangeRotary(ml.LlamaRotaryEmbedding):
    """RoPE angles from the row's own length (nanoGPT's ``freqs_cis[:T]``): ``position_ids`` unused."""

    def forward(self, x, position_ids):
        return super().forward(x, torch.arange(x.shape[1], device=x.device)[None])


class LocalRopeLlama(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model.rotary_emb = _LocalArangeRotary(config=config)


class _ShiftLayer(ml.LlamaDecoderLayer):
    """An RWKV-like token shift before the layer, restarted at each document (``position_ids == 0``)."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.mix = torch.nn.Parameter(torch.full((config.hidden_size,), 0.5))

    def forward(self, hidden_states, *args, position_ids=None, **kwargs):
        prev = F.pad(hidden_states, (0, 0, 1, 0))[:, :-1] * (position_ids != 0)[..., None].to(hidden_states.dtype)
        return super().forward(hidden_states + self.mix * (prev - hidden_states), *args, position_ids=position_ids,
                               **kwargs)


class ResetShiftLlama(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model.layers = torch.nn.ModuleList(_ShiftLayer(config, i) for i in range(config.num_hidden_layers))
        self.post_init()


class _ZeroGateShiftLayer(ml.LlamaDecoderLayer):
    """A token shift across every token (documents too), behind a gate initialised to zero (ReZero style)."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.gate = torch.nn.Parameter(torch.zeros(config.hidden_size))

    def forward(self, hidden_states, *args, **kwargs):
        prev = F.pad(hidden_states, (0, 0, 1, 0))[:, :-1]
        return super().forward(hidden_states + self.gate * (prev - hidden_states), *args, **kwargs)


class ZeroGateShiftLlama(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model.layers = torch.nn.ModuleList(_ZeroGateShiftLayer(config, i) for i in range(config.num_hidden_layers))
        self.post_init()


class BigramLlama(LlamaForCausalLM):
    """Adds an embedding of the previous token id (across documents), read from input_ids only."""

    def __init__(self, config):
        super().__init__(config)
        self.bigram = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        if input_ids is not None:
            inputs_embeds = self.model.embed_tokens(input_ids) + self.bigram(F.pad(input_ids, (1, 0))[:, :-1])
        return super().forward(inputs_embeds=inputs_embeds, **kwargs)


class IdsOnlyLlama(LlamaForCausalLM):
    """A hand-written forward that takes token ids only (no inputs_embeds), as many remote-code classes do."""

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        return super().forward(input_ids=input_ids, position_ids=position_ids, labels=labels, **kwargs)


def custom(cls):
    base = stock_llama()
    return cls._from_config(base.config, attn_implementation="sdpa", dtype=torch.float64)


def outcome(fn, model) -> dict:
    try:
        fn(model)
        error = None
    except (ValueError, NotImplementedError) as e:
        error = f"{type(e).__name__}: {e}"
    return {"error": error, "attention": model.config._attn_implementation}


def twin_and_subset_groups(acc) -> dict:
    """The paths a CPU run does not take by itself: an NCCL CP group (the probe on gloo twins of the CP groups) and
    more CP ranks than the probe uses (the others take rank 0's verdict)."""
    from unittest import mock

    import torch.distributed as dist

    from atac_hf.integrations import sharded_check

    def check(cls, **patches):
        sharded_check._VERDICTS.clear()
        with mock.patch.multiple(sharded_check, **patches) if patches else mock.patch.object(dist, "get_backend",
                                                                                            lambda g=None: "nccl"):
            try:
                sharded_check.check_model_sharded(custom(cls), acc.cp_rank, acc.cp_group, 2)
                return None
            except NotImplementedError as e:
                return str(e)

    made = []
    new_group = dist.new_group

    def counting(*args, **kwargs):
        made.append(kwargs.get("backend"))
        return new_group(*args, **kwargs)

    from torch.distributed.distributed_c10d import _world

    groups_before = len(_world.pg_map)
    with mock.patch.object(dist, "new_group", counting):
        out = {"twin_rope": check(LocalRopeLlama), "twin_stock": check(LlamaForCausalLM)}
    out["twins_made"] = made
    out["groups_left"] = len(_world.pg_map) - groups_before  # each twin destroyed after its probe
    out["subset_zero_gate"] = check(ZeroGateShiftLlama, PROBE_RANKS=1)  # rank 0 probes alone and refuses
    if acc.cp_rank == 1:  # (rank 0 writes the results: rank 1 checks its own here)
        assert "refused on CP rank 0" in out["subset_zero_gate"], out["subset_zero_gate"]
    out["subset_rope"] = check(LocalRopeLlama, PROBE_RANKS=1)  # one rank holds every document whole: exact
    return out


def main(out_path: str, mode: str) -> None:
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    from atac_hf import check_model
    from atac_hf.integrations import ATACAccelerator, ATACConfig, ATACTrainer

    world = int(os.environ["WORLD_SIZE"])
    config = ATACConfig(cp_size=world, max_tokens=384, min_chunk=8)
    res: dict = {}
    for cls in (LocalRopeLlama, ResetShiftLlama):
        res[cls.__name__ + "_one_process"] = check_model(custom(cls)).exact  # in one process: shown exact
    if mode == "accelerate":
        acc = ATACAccelerator(config, cpu=True)
        for cls in (LocalRopeLlama, ResetShiftLlama):
            res[cls.__name__] = outcome(acc.prepare, custom(cls))
        res["stock"] = outcome(acc.prepare, stock_llama().double())
        res["twin"] = twin_and_subset_groups(acc)
        acc.end_training()
    else:
        def build(model):
            AcceleratorState._reset_state(True)  # (a new trainer per model: new arguments, a new state)
            args = TrainingArguments(output_dir=out_path + ".run", use_cpu=True, report_to=[], max_steps=1,
                                     per_device_train_batch_size=1, save_strategy="no", disable_tqdm=True,
                                     log_level="error", ddp_find_unused_parameters=False)
            ATACTrainer(model=model, args=args, train_dataset=dataset(40, seed=1), atac_config=config)

        for cls in (LocalRopeLlama, ResetShiftLlama):
            res[cls.__name__] = outcome(build, custom(cls))
        res["stock"] = outcome(build, stock_llama().double())
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

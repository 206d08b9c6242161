"""Families whose decoder layers call attention without the forward's **kwargs (StableLM, Nemotron):
the shard context is relayed to them by forward hooks (atac_hf.attention.relay), and CP training
equals the single-device reference, also under gradient checkpointing (the recomputation in
backward runs outside the model's forward)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

import _dist
from atac_hf.attention.relay import _remove_relay, active_context, install_relay, relay_installed
from atac_hf.sharding import plan_shards

RELAYED = ("stablelm", "nemotron")


def _model(family: str, dtype=torch.float64):
    from transformers import AutoModelForCausalLM, NemotronConfig, StableLmConfig

    import atac_hf.attention  # noqa: F401  (registers atac_cp)

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=_dist.VOCAB, max_position_embeddings=1024)
    cfg = StableLmConfig(**common, attention_dropout=0.0, hidden_dropout=0.0) if family == "stablelm" else \
        NemotronConfig(**common, attention_dropout=0.0, head_dim=16)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype).train()


def relay_worker(rank: int, world: int, out_path: str) -> None:
    import test_attention_dist as td

    import atac_hf
    from atac_hf.attention import doc_lengths_from_batch

    stats: dict = defaultdict(float)
    for family in RELAYED:
        model = _model(family)
        atac_hf.check_model(model)  # accepts it and installs the relay
        for checkpointing in (None, False, True):  # off; use_reentrant False / True
            if checkpointing is not None:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing})
            batch = _dist.make_batch([[150, 30, 1, 2, 20, 1, 7]], seed=1)  # the 150 is split over the ranks
            ref = _dist.per_document_reference(model, batch, "sdpa") if rank == 0 else None
            for strategy in ("atp", "zigzag"):
                plan = plan_shards(doc_lengths_from_batch(batch), world, strategy)
                stats["gathered"] += int(len(plan.gathered_docs) > 0)
                got = td._cp_run(model, batch, plan, rank, "sdpa")
                if rank == 0:
                    td._compare(ref, got, batch, torch.float64,
                                f"world={world} {family} {strategy} use_reentrant={checkpointing}", stats)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(stats, f)


@pytest.mark.parametrize("world", [2])
def test_relayed_families_cp_training_equals_single_device(world, tmp_path):
    out = tmp_path / "stats.json"
    _dist.spawn(relay_worker, world, str(out), timeout_s=600)
    stats = json.loads(out.read_text())
    assert stats["cases"] == len(RELAYED) * 3 * 2 and stats["gathered"] == stats["cases"]


@pytest.mark.slow
def test_relayed_families_at_four_ranks(tmp_path):
    test_relayed_families_cp_training_equals_single_device(4, tmp_path)


# ---------------------------------------------------------------------------- the hooks themselves
class _Inner(torch.nn.Module):
    def forward(self, x, **kwargs):
        self.seen = active_context()
        if kwargs.get("boom"):
            raise RuntimeError("boom")
        return x


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def forward(self, x, **kwargs):
        return self.inner(x, boom=kwargs.get("boom", False))  # drops atac_shard, like StableLM's layers


class _NoKwargs(torch.nn.Module):
    def forward(self, x):
        return x


def _ctx():
    from atac_hf.attention import shard_batch

    batch = _dist.make_batch([[5, 3]], seed=0)
    return shard_batch(batch, plan_shards([5, 3], 1), 0)["atac_shard"]


def test_relay_sets_the_context_for_the_call_and_restores_it():
    m = _Outer()
    assert install_relay(m) == 2 and relay_installed(m)
    assert install_relay(m) == 0  # idempotent
    ctx, other = _ctx(), _ctx()
    m(torch.ones(1), atac_shard=ctx)
    assert m.inner.seen is ctx and active_context() is None
    m(torch.ones(1))  # no context: none relayed
    assert m.inner.seen is None
    with pytest.raises(RuntimeError, match="boom"):
        m(torch.ones(1), atac_shard=other, boom=True)
    assert m.inner.seen is other and active_context() is None  # restored after the exception
    assert _remove_relay(m) == 2 and not relay_installed(m) and _remove_relay(m) == 0


def test_relay_skips_modules_without_kwargs_and_refuses_non_modules():
    assert install_relay(_NoKwargs()) == 0
    with pytest.raises(TypeError, match=r"install_relay needs a torch.nn.Module, got int"):
        install_relay(3)


@pytest.mark.parametrize("family", RELAYED)
def test_check_model_accepts_relayed_families(family):
    import atac_hf

    model = _model(family)
    verdict = atac_hf.check_model(model)
    assert verdict.exact and verdict.max_error <= 1e-12
    assert relay_installed(model) and relay_installed(model.model.layers[0])
    from atac_hf.attention.model_check import remove_guard

    assert remove_guard(model) and not relay_installed(model)

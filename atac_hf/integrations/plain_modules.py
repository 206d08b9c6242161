"""Modules other than a transformers model given to ``ATACAccelerator.prepare`` (a value head, a projection).

A module built only of torch's per-token layers (``nn.Linear``, norms over features, activations,
``nn.Sequential``, ...) computes each token of a shard on its own, so it is exact on a shard as it is:
``prepare`` hands it to Accelerate unchanged (DDP sums its gradients with the model's). Any other module
without a transformers config is refused as before (a class of its own may mix tokens in its ``forward``:
attention, pooling, convolutions; the refusal names ``accelerator.prepare_model(module)`` for one that
does not), and a module that holds a transformers model without being one is refused with the way to
prepare both.
"""

from __future__ import annotations

import torch

from .sharder import unwrap_base_model

__all__ = ["PER_TOKEN_LAYERS", "runs_no_attention"]

nn = torch.nn
#: torch.nn classes (exact types: a subclass may override ``forward``) that compute each token on its own
PER_TOKEN_LAYERS = (nn.Linear, nn.Identity, nn.Dropout, nn.LayerNorm, nn.RMSNorm, nn.Embedding, nn.ReLU, nn.GELU,
                    nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Softplus, nn.LeakyReLU, nn.ELU, nn.Mish, nn.Sequential,
                    nn.ModuleList, nn.ModuleDict)


def runs_no_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is built of :data:`PER_TOKEN_LAYERS` only (a value head, a projection): it runs on
    a shard's tokens one by one, so ``ATACAccelerator.prepare`` passes it to Accelerate unchanged.

    Raises:
        ValueError: a module that holds a transformers model without being one (nothing changed).
    """
    from transformers import PreTrainedModel

    base = unwrap_base_model(module)
    inner = next((m for m in base.modules() if isinstance(m, PreTrainedModel)), None)
    if inner is not None and not isinstance(base, PreTrainedModel):
        raise ValueError(
            f"{type(base).__name__} holds a transformers model ({type(inner).__name__}) but is not one: ATP-CP "
            "checks and shards transformers models themselves, so prepare the transformers model and your other modules separately, e.g. "
            "model, head, optimizer = accelerator.prepare(model, head, optimizer), and call them in turn "
            "(out = model(**accelerator.shard(batch), output_hidden_states=True); head(out.hidden_states[-1]))")
    return all(type(m) in PER_TOKEN_LAYERS for m in base.modules())

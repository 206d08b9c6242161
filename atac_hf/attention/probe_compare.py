"""What the model probe (:mod:`.model_probe`) feeds and compares: token ids free of special tokens, the input
embedding's output and gradient (whether the model was fed ids or embeddings), each document's stock run, and
the relative errors of logits, input gradients and every parameter's gradient.

Parameter gradients catch what logits and input gradients can miss on a freshly initialised copy: a
zero-initialised gate in front of a token-mixing branch leaves the logits exact but its own gradient wrong
(red-team 26: 13-25% at cp_size 1).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["EmbeddingTap", "logits_2d", "param_err", "param_grads", "plain_ids", "reference_runs", "rel_err"]

_UNDRAWN_IDS = 3  # the probe's token ids are drawn from [3, vocab)


def logits_2d(out: Any) -> torch.Tensor:
    """A model output's logits as (tokens, vocab)."""
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits.reshape(-1, logits.shape[-1])


def plain_ids(ids: torch.Tensor, config: Any, vocab: int) -> torch.Tensor:
    """``ids`` with every special token id of ``config`` (``image_token_id``, ``boi_token_index``, ``pad_token_id``,
    ...: a multimodal model expects features for some) replaced by the smallest plain id."""
    special: set[int] = set()

    def walk(d: Any) -> None:
        for k, v in (d.items() if isinstance(d, dict) else ()):
            if isinstance(v, dict):
                walk(v)
            elif isinstance(k, str) and "token" in k and k.endswith(("id", "ids", "index")):
                special.update(x for x in (v if isinstance(v, (list, tuple)) else [v])
                               if isinstance(x, int) and not isinstance(x, bool))
    walk(config.to_dict() if hasattr(config, "to_dict") else {})
    if not special & set(range(_UNDRAWN_IDS, vocab)):
        return ids
    plain = next((i for i in range(_UNDRAWN_IDS, vocab) if i not in special), _UNDRAWN_IDS)
    return torch.where(torch.isin(ids, torch.tensor(sorted(special))), torch.full_like(ids, plain), ids)


class EmbeddingTap:
    """Records the output of the model's input embedding (one call per forward) and its gradient: the input
    gradients compared, whether the model was fed token ids or embeddings."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.module, self.outputs = model.get_input_embeddings(), []

    def __enter__(self) -> "EmbeddingTap":
        self.handle = self.module.register_forward_hook(self._record)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()

    def _record(self, module: Any, args: Any, out: Any) -> Any:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"the input embedding returned {type(out).__name__}, not a tensor")
        out = out.detach().requires_grad_(True)  # a leaf: its .grad is the input gradient
        self.outputs.append(out)
        return out.clone()  # (some models scale the embeddings in place)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``ids``, recorded as the forward's input (a model fed embeddings: not tapped again)."""
        self.handle.remove()
        self.outputs.append(self.module(ids).detach().requires_grad_(True))
        return self.outputs[0].clone()

    def grad(self) -> torch.Tensor:
        if len(self.outputs) != 1:
            raise RuntimeError(f"the input embedding ran {len(self.outputs)} times in one forward, not once")
        g = self.outputs[0].grad
        return torch.zeros_like(self.outputs[0]) if g is None else g


def reference_runs(model: torch.nn.Module, ids: torch.Tensor, lengths: list[int], weight: torch.Tensor, vocab: int,
                   *, via_ids: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Logits, input gradients and parameter gradients of each document run alone through the stock model."""
    logits, grads, start = [], [], 0
    for length in lengths:
        doc = ids[:, start:start + length]
        with EmbeddingTap(model) as tap:
            inputs = {"input_ids": doc} if via_ids else {"inputs_embeds": tap.embed(doc)}
            logit = logits_2d(model(**inputs, use_cache=False))
            (logit[:, :vocab] * weight[start:start + length, : logit.shape[1]]).sum().backward()
        logits.append(logit.detach())
        grads.append(tap.grad()[0].detach())
        start += length
    return torch.cat(logits), torch.cat(grads), param_grads(model)


def param_grads(model: torch.nn.Module) -> list[torch.Tensor]:
    """A copy of every parameter's gradient, zeros where it has none (in ``model.parameters()`` order)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def param_err(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """Max over parameters of the gradient's relative error, each against its own largest entry (floored at 1e-3
    of the largest of any parameter: a nearly unused one measures round-off)."""
    if len(got) != len(ref):
        return float("inf")
    top = max((float(r.abs().max()) for r in ref if r.numel()), default=0.0)
    err = 0.0
    for a, b in zip(got, ref):
        if a.shape != b.shape:
            return float("inf")
        if not b.numel():
            continue
        diff = float((a.reshape(b.shape) - b).abs().max())
        if diff != diff:
            return float("inf")
        scale = max(float(b.abs().max()), 1e-3 * top)
        err = max(err, diff / scale if scale > 0 else diff)
    return err


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return float("inf")
    scale = b.abs().max().item() if b.numel() else 0.0
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    if diff != diff:  # nan
        return float("inf")
    return diff / scale if scale > 0 else diff

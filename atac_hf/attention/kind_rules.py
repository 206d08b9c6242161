"""Rules on the kind of model given to ATP-CP, read off its class and its PEFT adapters (no probe).

- **Task heads.** ATP-CP trains a causal LM's next-token loss on packed rows (each document's first
  label dropped, the labels shifted per document and sharded as next-token targets), or a base model
  whose per-token outputs feed a loss of the user's own. A head that classifies each token without a
  shift, or pools one output per row (sequence classification, question answering, multiple choice),
  would be trained silently wrong on packed rows (red-team 30: token classification 45% off at
  cp_size 1, 177% at cp_size 2): :func:`head_refusal` refuses it, by the class name of the model's
  class or any class it derives from (``*ForTokenClassification``, ...).
- **PEFT adapters.** An adapter that only changes weights acts on each token alone and is exact
  (red-team 29 measured every type of :data:`PER_TOKEN_PEFT_TYPES` at cp_size 1 and 2). Prompt learning adds virtual tokens or key/value
  prefixes; some others look across the tokens of a row (Lily's router averages over them, aLoRA's
  activation point is the row's last invocation, Poly routes by a per-row task id, VeLoRA's projection
  is a batch mean); and LoRA's ``layer_replication`` copies layers with a config of their own, where
  the attention cannot be selected. :func:`peft_refusal` accepts the types of
  :data:`PER_TOKEN_PEFT_TYPES` (with the settings above excluded) and refuses every other type, naming
  it: a PEFT release's new type is refused until it is shown per-token.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PER_TOKEN_PEFT_TYPES", "head_refusal", "peft_configs", "peft_refusal"]

_INSTEAD = ("train it without atac-hf: its stock attention on unpacked rows (atac-hf packs several documents "
            "into each row, so ATACTrainer and ATACAccelerator refuse it at cp_size=1 too)")
_CAUSAL = ("atac-hf trains causal LMs (AutoModelForCausalLM, next-token loss), or a base model (AutoModel) whose "
           "per-token hidden states feed a loss of your own in an ATACAccelerator loop (see docs/INTEGRATION.md)")

#: Class-name endings of task heads that cannot be trained on packed rows, and why.
HEAD_SUFFIXES = {
    "ForTokenClassification": ("labels each token without a shift, but packed rows carry next-token targets "
                               "(each document's first label dropped, the labels shifted per document and sharded "
                               "as next-token targets), so its loss and gradients would be silently wrong"),
    "ForSequenceClassification": ("pools one output per row, but a packed row holds several documents, "
                                  "each with its own label"),
    "ForQuestionAnswering": ("predicts one answer span per row (start/end positions over the row), but a packed "
                             "row holds several documents"),
    "ForMultipleChoice": "scores one choice per row, but a packed row holds several documents",
}

#: PEFT types whose adapters act on each token alone (weights, or per-token scales and routing), so
#: a packed or sharded row trains as its documents alone do (red-team 29: exact at cp_size 1 and 2).
PER_TOKEN_PEFT_TYPES = frozenset({
    "LORA", "ADALORA", "ADAMSS", "BOFT", "IA3", "BEFT", "LOHA", "LOKR", "OFT", "LN_TUNING", "VERA", "FROD",
    "PVERA", "FOURIERFT", "GLORA", "HRA", "VBLORA", "UNILORA", "MISS", "RANDLORA", "ROAD",
    "TRAINABLE_TOKENS", "HIRA", "SHIRA", "C3A", "WAVEFT", "OSF", "DELORA", "GRALORA", "TINYLORA", "PSOFT",
    "PEANUT", "SHADOW", "SUPERTUNING", "DEFT",
})

#: PEFT types refused with a reason of their own (prompt learning, by its config's flag, and adaption
#: prompts are refused before these, for their virtual tokens).
_CROSS_TOKEN = {
    "LILY": ("averages its router's probabilities over every token of the row (a packed row's documents "
             "together, and under CP a rank's shard only)"),
    "POLY": "routes every token of a row by the row's task_ids, one task per row, not per document",
    "XLORA": ("scales its adapters by a classifier run on a first pass of the whole model, which atac-hf has "
              "not shown exact on packed rows"),
}


def head_refusal(model_cls: type) -> tuple[type, str] | None:
    """``(ValueError, reason)`` for a task head of :data:`HEAD_SUFFIXES` (the class or one it derives
    from), else None."""
    for cls in getattr(model_cls, "__mro__", (model_cls,)):
        name = getattr(cls, "__name__", "")
        for suffix, why in HEAD_SUFFIXES.items():
            if name.endswith(suffix):
                via = "" if cls is model_cls else f" (it derives from {name})"
                return ValueError, f"is a {suffix[3:]} head{via}: it {why}; {_CAUSAL}, or {_INSTEAD}"
    return None


def _kind(cfg: Any) -> str:
    kind = getattr(cfg, "peft_type", None)
    return str(getattr(kind, "value", kind))


def _adapter_refusal(name: str, cfg: Any) -> str | None:
    """Why the adapter ``name`` (its config ``cfg``) cannot be sharded, or None."""
    kind = _kind(cfg)
    if getattr(cfg, "is_prompt_learning", False) is True or kind == "ADAPTION_PROMPT":
        return (f"is wrapped by a PEFT {kind} adapter ({name!r}): its virtual tokens or key/value prefixes are "
                "attended to by every query, outside the documents of the packed row, which the 'atac_cp' attention "
                "does not shard; use a weight adapter (LoRA, IA3, ...) or " + _INSTEAD)
    if kind in _CROSS_TOKEN:
        return (f"is wrapped by a PEFT {kind} adapter ({name!r}), which {_CROSS_TOKEN[kind]}: it would be trained "
                "silently wrong on packed rows; use a weight adapter (LoRA, IA3, ...) or " + _INSTEAD)
    if kind not in PER_TOKEN_PEFT_TYPES:
        return (f"is wrapped by a PEFT {kind} adapter ({name!r}), a type atac-hf does not know to act on each token "
                f"alone (it knows {', '.join(sorted(PER_TOKEN_PEFT_TYPES))}), so it is not shown exact on packed "
                "rows; use one of those or " + _INSTEAD)
    if kind == "LORA":
        tokens = getattr(cfg, "alora_invocation_tokens", None)
        if tokens:
            return (f"is wrapped by an activated LoRA (aLoRA) adapter ({name!r}, alora_invocation_tokens={tokens}): "
                    "PEFT switches it on from the last invocation found in the whole row's input_ids (under CP: a "
                    "rank's shard), not in each document, so it would be trained silently wrong on packed rows; "
                    "use a LoRA without alora_invocation_tokens or " + _INSTEAD)
        if getattr(cfg, "layer_replication", None):
            return (f"is wrapped by a LoRA adapter ({name!r}) with layer_replication={cfg.layer_replication}: "
                    "PEFT copies decoder layers with a config of their own, where the 'atac_cp' attention cannot be "
                    "selected; use a LoRA without layer_replication or " + _INSTEAD)
        velora = getattr(cfg, "velora_config", None)
        init = velora.get("init_type", "batch_average") if isinstance(velora, dict) else \
            getattr(velora, "init_type", None)
        if velora is not None and init != "random":
            return (f"is wrapped by a LoRA adapter ({name!r}) with VeLoRA (init_type={init!r}): its projection is "
                    "the mean over every token of a batch (a packed row's documents together, and under CP a "
                    "rank's shard only, so the ranks' projections differ); set velora_config.init_type='random' "
                    "or " + _INSTEAD)
    return None


def peft_configs(model: Any) -> list[tuple[str, Any]]:
    """``(adapter name, config)`` of every PEFT adapter on ``model``, looked for through DDP / compile
    wrappers down to PEFT's model (``[]``: none)."""
    seen = 0
    while model is not None and seen < 8:  # the wrappers unwrap_base_model looks through, down to PEFT's
        seen += 1
        configs = getattr(model, "peft_config", None)
        if isinstance(configs, dict):
            return list(configs.items())
        inner = getattr(model, "module", None)
        model = inner if isinstance(inner, torch.nn.Module) else getattr(model, "_orig_mod", None)
    return []


def peft_refusal(model: torch.nn.Module) -> tuple[type, str] | None:
    """``(NotImplementedError, reason)`` for a PEFT adapter that is not known to act on each token alone
    (see the module docstring), else None."""
    for name, cfg in peft_configs(model):
        why = _adapter_refusal(name, cfg)
        if why is not None:
            return NotImplementedError, why
    return None

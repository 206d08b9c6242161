"""Worker for ``tests/test_step_model.py``: ``ATACTrainer`` at CP 2 (under ``torchrun --nproc_per_node 2``;
OUT.json from rank 0) with the model wrapped by ``get_peft_model`` after construction (Trainer then trains
the old module without its DDP wrapper: refused before the first step), another model assigned to
``trainer.model`` (refused), and the PEFT model passed at construction (trains in step across the ranks)."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _redteam13_worker import make, per_rank_sum  # noqa: E402

torch.set_num_threads(1)


def _lora(m):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def main(out_path: str) -> None:
    from _integration_worker import model
    from atac_hf.integrations import ATACTrainer

    tmp = out_path + ".runs"
    res: dict = {}
    for name in ("peft_after", "replaced"):
        t = make(ATACTrainer, os.path.join(tmp, name))
        torch.manual_seed(1)
        t.model = _lora(t.model) if name == "peft_after" else model()
        before = per_rank_sum(t)
        try:
            t.train()
            res[name] = {"error": None}
        except (ValueError, RuntimeError) as e:
            res[name] = {"error": f"{type(e).__name__}: {e}", "before": before, "after": per_rank_sum(t)}
    torch.manual_seed(1)
    t = make(ATACTrainer, os.path.join(tmp, "peft_given"), m=_lora(model()))
    t.train()
    res["peft_given"] = {"sums": per_rank_sum(t)}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])

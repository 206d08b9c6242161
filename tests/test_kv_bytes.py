"""K/V bytes under bf16/fp16 autocast: the attention exchanges K/V in the autocast dtype, so ``atac/kv_mb`` and the
planners' exchange price use 2 bytes an element for fp32 weights under ``TrainingArguments(bf16=True)`` or
``Accelerator(mixed_precision="bf16")``, and the weights' own width without autocast.

Red-team 22 measured an ``ATACAccelerator`` loop at CP 2 (fp32 weights, ``mixed_precision="bf16"``): 0.128 MB of
bf16 K/V received against 0.256 MB reported; the planner priced 2 bytes an element in every fp32 run, where 4 moved.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_redteam20 import _stock_model  # noqa: E402


def test_the_width_is_the_autocast_dtype_over_wider_weights_else_the_weights_own():
    from atac_hf.integrations.kv_bytes import kv_element_bytes, model_kv_bytes_per_token

    m = _stock_model()  # fp32, 2 layers
    full = model_kv_bytes_per_token(m)
    assert (kv_element_bytes(m), kv_element_bytes(m, True)) == (4, 2)
    assert model_kv_bytes_per_token(m, True) == full / 2
    assert (kv_element_bytes(m.double()), kv_element_bytes(m, True)) == (8, 2)
    m.to(torch.bfloat16)
    assert (kv_element_bytes(m), kv_element_bytes(m, True)) == (2, 2)


@pytest.mark.parametrize("mixed", ["bf16", "no"])
def test_the_accelerator_reports_and_prices_the_exchanged_width(mixed):
    from atac_hf import ATACAccelerator, ATACConfig
    from atac_hf.integrations.kv_bytes import model_kv_bytes_per_token

    from accelerate.state import AcceleratorState

    m = _stock_model()
    AcceleratorState._reset_state()  # (Accelerate keeps one mixed precision per process)
    try:
        acc = ATACAccelerator(ATACConfig(cp_size=1, max_tokens=64), cpu=True, mixed_precision=mixed)
        m = acc.prepare(m)
        width = 2 if mixed == "bf16" else 4
        assert acc.sharder.kv_bytes_per_token == model_kv_bytes_per_token(m) * width / 4
        per_layer = acc.sharder.kv_bytes_per_token / m.config.num_hidden_layers  # the H100 preset prices one layer
        assert acc.sharder.cost_model.kv_bytes_per_token == per_layer
        acc.end_training()
    finally:
        AcceleratorState._reset_state()


@pytest.mark.parametrize("bf16", [True, False])
def test_the_trainer_reports_and_prices_the_exchanged_width(tmp_path, bf16):
    from datasets import Dataset
    from transformers import TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer
    from atac_hf.integrations.kv_bytes import model_kv_bytes_per_token

    m = _stock_model()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=bf16, report_to=[], max_steps=1)
    t = ATACTrainer(model=m, args=args, train_dataset=Dataset.from_dict({"input_ids": [[1, 2, 3]]}),
                    atac_config=ATACConfig(cp_size=1, max_tokens=64))
    width = 2 if bf16 else 4
    assert t.atac_sharder.kv_bytes_per_token == model_kv_bytes_per_token(m) * width / 4
    assert t.atac_sharder.cost_model.kv_bytes_per_token == t.atac_sharder.kv_bytes_per_token / m.config.num_hidden_layers

"""The examples run out of the box through ``accelerate launch`` with the CPU config.

* ``finetune_long_context.py`` (ATACTrainer) on the embedded default, 3 steps, CP 2.
* ``accelerate_loop.py`` (ATACAccelerator, plain loop): CP 2 gives the same loss per step as
  one process (with gradient accumulation; without it the Trainer tests cover DDP + CP).
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _launch import accelerate_launch, run  # noqa: E402

pytestmark = pytest.mark.slow
CPU_CONFIG = "configs/cpu_cp2.yaml"


def _losses(stdout: str, pattern: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, stdout)]


def test_finetune_example_accelerate_launch_cpu_cp2():
    proc = accelerate_launch(CPU_CONFIG, "examples/finetune_long_context.py", "--max_steps", "3",
                             "--num_samples", "200")
    out = proc.stdout
    assert "world 2 = dp 1 x cp 2" in out, out[-3000:]
    losses = _losses(out, r"\[atp\] step +\d+ \| loss ([0-9.]+)")
    assert len(losses) == 3 and all(np.isfinite(losses)), out[-3000:]
    assert re.search(r"\[atp\] 3 steps in [0-9.]+s \| loss .* mean imbalance [0-9.]+ \| mean kv_mb", out)


def test_accelerate_loop_cp2_matches_one_process():
    # gradient accumulation 2: the loss normaliser covers world size x accumulation steps
    args = ["--max_steps", "3", "--num_samples", "120", "--max_tokens", "768", "--gradient_accumulation_steps", "2"]
    cp2 = accelerate_launch(CPU_CONFIG, "examples/accelerate_loop.py", *args).stdout
    cp1 = run([sys.executable, "examples/accelerate_loop.py", "--cp_size", "1", *args]).stdout
    pattern = r"step +\d+ \| loss ([0-9.]+)"
    l1, l2 = _losses(cp1, pattern), _losses(cp2, pattern)
    assert len(l1) == len(l2) == 3, (cp1[-2000:], cp2[-2000:])
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    assert len(set(l1)) == 3

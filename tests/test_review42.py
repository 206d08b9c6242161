"""Review 42 (stop 53's change set): repros of what it found, each now fixed.

* TP per-head gradients: the check that drops the held contributions of a ``.grad`` zeroed since the last
  backward read a ``.grad`` the hook itself had put back to zeros, so any in-place op between micro-batches
  (``clip_grad_norm_`` every micro-step multiplies every gradient, by 1.0 under ``max_norm``) dropped the
  micro-batches before it. ``.grad`` now holds this rank's share until the sync.
* ``pack`` / ``plan`` with ``--model ""`` (an unset variable in a script) were refused (unknown preset ``''``);
  with ``--model``'s default now None it was taken for omitted and priced with 8b.
* ``StreamPacker.load_state_dict`` named the differing cost-model fields of this packer only: a field only the
  saved state has gave "a different cost model ()".
* ``--model`` on a composite config.json whose ``text_config`` lacks the dimensions: a refusal without a test.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from atac_hf import PackingConfig, StreamPacker, default_cost_model
from atac_hf.cli import main
from atac_hf.integrations import tensor_parallel as tpm

sys.path.insert(0, os.path.dirname(__file__))
from test_tp_grad_sync import _Norm, two_tp_ranks  # noqa: E402,F401  (the per-head parameter, 2 simulated TP ranks)


def test_clip_between_micro_batches_keeps_the_held_per_head_contribution(two_tp_ranks):
    m = _Norm()
    (m.w * 0.25).sum().backward()
    assert m.w.grad.tolist() == [0.25, 0.25]  # this rank's share until the sync
    torch.nn.utils.clip_grad_norm_(m.parameters(), 10.0)  # norm under max_norm: x1.0 in place
    (m.w * 0.5).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [1.5, 1.5]  # 2 x (0.25 + 0.5); was 2 x 0.5
    # zero_grad(set_to_none=False) between micro-batches still discards them, through an optimizer's foreach zero
    opt = torch.optim.SGD(m.parameters(), lr=0.1, foreach=True)
    opt.zero_grad(set_to_none=False)
    (m.w * 4.0).sum().backward()
    opt.zero_grad(set_to_none=False)
    (m.w * 1.0).sum().backward()
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]
    # a second sync, and set to None after the backward: nothing summed twice, nothing discarded comes back
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad.tolist() == [2.0, 2.0]
    (m.w * 3.0).sum().backward()
    m.w.grad = None
    tpm.sync_tp_gradients(m, None)
    assert m.w.grad is None and m.w._atac_tp_pending is None


@pytest.mark.parametrize("argv", [["pack", "--lengths", "{f}", "--max-tokens", "8", "--model", ""],
                                  ["plan", "--doc-lengths", "5,7,3", "--cp-size", "2", "--model", ""]])
def test_an_empty_model_is_refused_not_taken_for_omitted(tmp_path, capsys, argv):
    f = tmp_path / "l.json"
    f.write_text("[5, 7, 3]")
    assert main([a.format(f=f) for a in argv]) == 2
    assert "unknown model preset ''" in capsys.readouterr().err


def test_packer_state_with_a_cost_model_field_this_one_lacks_names_it():
    cfg = PackingConfig(max_tokens=8, packs_per_window=2)
    packer = StreamPacker(cfg, default_cost_model())
    packer.add_window([0, 1, 2], [5, 3, 2])
    state = packer.state_dict()
    state["cost_model"] = {**state["cost_model"], "new_field": 1.5}
    fresh = StreamPacker(cfg, default_cost_model())
    with pytest.raises(ValueError, match=r"different cost model \(new_field=1.5 \(this packer: .-.\)\)"):
        fresh.load_state_dict(state)


def test_composite_config_without_text_dimensions_is_refused_naming_the_presets(tmp_path):
    from atac_hf._argtypes import model_arg

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "no-such-vlm", "text_config": {"vocab_size": 100}}))
    with pytest.raises(ValueError, match=r"--model '.*config\.json': cannot read model dimensions: the config's "
                                         r"text_config has no hidden_size.*give --model a preset \['13b'.*or a config\.json"):
        model_arg(str(path))

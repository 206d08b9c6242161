"""Red-team 41: CP exactness on the inputs nobody planned for, against single-device references.

- CP sizes that are not powers of two (3, 5, 6), packs with fewer tokens than ranks or
  documents, documents of 1, 2, C-1, C+1 tokens, many 1-token documents, two rows per batch;
- labels: -100 on every target of one rank's shard, on every token of the pack (NaN on both
  sides, as the stock model), and at every document's last token too;
- sliding windows of 1, 2 and larger than the pack; one K/V head (MQA); an odd head dim (GPT-2,
  head dim 15); a model mixing full and windowed layers (Qwen3);
- every strategy x K/V exchange (all-gather, all-to-all), sub-group (hierarchical) plans, the
  node-routed all-to-all with nodes that do not divide the group, the sdpa (both CPU chunk
  kernels) and varlen_reference backends; eval-mode and ``inference_mode`` forwards; gradient
  checkpointing (both flavours); bf16 autocast; ``ATACAccelerator`` (DDP) at CP 3, packs
  shorter than the group padded by the sharder.

The default tests run every rank of a plan in one process (``emulate_cp_attention``) against
document-masked attention computed on the whole row; the slow ones run gloo groups of 3 and 5
processes against each document run alone through the stock model. Gradients: fp64 models, the
loss computed in fp64 from the logits on both sides (Transformers' own loss casts the logits to
fp32: compared separately, at 1e-6), each parameter's error relative to its largest entry,
floored at 1e-5 of the largest gradient (a gradient that is exactly zero in exact arithmetic,
q/k under a window of 1, is round-off of ~1e-19 on both sides).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402
from _redteam41_worker import _plans, _split_over_subgroup, accelerate_entry, model_worker  # noqa: E402


# ---------------------------------------------------------------------------- fast: one process
def _edge_packs(C: int) -> list[list[int]]:
    return [[C], [1] * C, [C - 1, 1], [C + 1], [1, C - 1, C + 1, 2, 1], [1] * (3 * C), [2 * C + 1, 1, 1],
            [30, 7, 1, 2, 60], [57], [103, 66, 4, 92]]


@pytest.mark.parametrize("C", [3, 5, 6])
def test_emulated_odd_cp_sizes_equal_whole_row_attention(C, one_thread):
    """Every plan of the edge packs, windows 1 / 2 / none / longer than the pack, MQA with an odd
    head dim and GQA: output and dq, dk, dv against document-masked attention on the whole row."""
    from atac_hf.attention.reference import reference_attention
    from atac_hf.attention.runtime import emulate_cp_attention

    checked = subgroup = 0
    for pi, lengths in enumerate(_edge_packs(C)):
        N = sum(lengths)
        shapes = (((4, 1, 5), None), ((4, 1, 5), 1), ((3, 3, 7), 2), ((4, 2, 8), 1000))
        for (H, K, D), window in shapes[pi % 2::2]:  # two of them a pack, in turn
            g = torch.Generator().manual_seed(100 * C + pi)
            q, k, v = (torch.randn(h, N, D, dtype=torch.float64, generator=g) for h in (H, K, K))
            gout = torch.randn(N, H, D, dtype=torch.float64, generator=g)
            ref, ref_grads = reference_attention(q, k, v, lengths, window=window, grad_out_NHD=gout)
            for name, plan in _plans(lengths, C, routed=window in (None, 1)):
                assert plan.rank_num_tokens().min() >= (1 if N >= C else 0), name
                subgroup += _split_over_subgroup(plan)
                qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                out = emulate_cp_attention(qq, kk, vv, plan, window=window)
                grads = torch.autograd.grad(out, (qq, kk, vv), gout)
                label = f"C={C} {lengths} H={H} K={K} D={D} window={window} {name}"
                torch.testing.assert_close(out, ref, rtol=0, atol=1e-12, msg=label)
                for got, want in zip(grads, ref_grads):
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=label)
                checked += 1
    assert checked > 200 and subgroup > 10, (checked, subgroup)


@pytest.mark.slow
@pytest.mark.parametrize("world", [3, 5])
def test_odd_cp_groups_train_exactly_on_edge_packs(world, tmp_path):
    out = tmp_path / "stats.json"
    _dist.spawn(model_worker, world, str(out), timeout_s=1500)
    stats = json.loads(out.read_text())
    print(f"\nworld={world}: " + json.dumps({k: v for k, v in stats.items() if k != "fail"}, sort_keys=True))
    assert not stats["fail"], "\n".join(stats["fail"][:20])
    assert stats["cases"] >= (3000 if world == 3 else 1500), stats["cases"]  # measured: 3650, 1902
    assert stats["subgroup_plans"] > 500 and stats["nan_cases"] > 100 and stats["rank0_ignored"] > 100
    if world == 3:
        assert stats["ckpt_cases"] == 32 and stats["bf16_cases"] == 16 and stats["eval_cases"] > 400


@pytest.mark.slow
def test_atac_accelerator_at_cp3_equals_single_device_on_tiny_and_unlabelled_packs():
    import tempfile

    import torch.multiprocessing as mp
    from _launch import free_port

    world = 3
    out_dir = tempfile.mkdtemp(prefix="atac_rt41_")
    ctx = mp.spawn(accelerate_entry, args=(world, free_port(), out_dir), nprocs=world, join=False)
    hung = _dist.join_or_kill(ctx, 900)
    assert not hung, f"ranks hung: {hung}"
    res = [json.loads(open(os.path.join(out_dir, f"{r}.json")).read()) for r in range(world)]
    for r in res:
        assert "setup_error" not in r, r["setup_error"]
    print("\n" + "\n".join(str(c) for c in res[0]["cases"]))
    assert not res[0]["fail"], "\n".join(res[0]["fail"])
    assert len(res[0]["cases"]) == 2 * 9

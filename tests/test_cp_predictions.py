"""``predict()`` and ``compute_metrics`` under context parallelism get what they get at ``cp_size=1``.

Each CP rank's model run yields its own tokens' logits; ``ATACTrainer`` gathers every per-token output back
into the pack's row order, with the pack's labels and loss, and keeps one copy per DP replica (every CP and TP
rank of a replica returns the same row). Each setting runs ``tests/_predictions_worker.py`` (gloo on CPU)
against the same script at CP 1 on the same DP size: ``evaluate()`` with ``compute_metrics``,
``preprocess_logits_for_metrics`` and ``include_for_metrics=["inputs"]``; ``predict()``'s logits, labels
and a tuple of per-token outputs (hidden states); the same through TRL's ``SFTTrainer`` after
``ATACTrainer`` (its own ``prediction_step``); the best checkpoint by a ``compute_metrics`` metric; and
outputs that cannot be put back in row order (refused on every rank, in words). Before, evaluation under CP
returned the loss only (``compute_metrics`` skipped, ``metric_for_best_model='accuracy'`` refused), and at
TP 2 every pack's predictions came twice (once per TP rank).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _launch import ROOT, accelerate_launch, torchrun  # noqa: E402

WORKER = ROOT / "tests" / "_predictions_worker.py"


def _read(path) -> tuple[dict, dict]:
    arrays = np.load(str(path)[: -len(".json")] + ".npz")
    return json.loads(path.read_text()), {k: arrays[k] for k in arrays.files}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{setting: (JSON, arrays)}: CP 1 and CP 2 at DP 1 and DP 2, and TP 2 at CP 1 and CP 2 (DP 1)."""
    out = {}
    d = tmp_path_factory.mktemp("cp_predictions")
    for name, nproc, cp in (("cp1", 1, 1), ("cp2", 2, 2), ("dp2_cp1", 2, 1), ("dp2_cp2", 4, 2)):
        torchrun(nproc, WORKER, d / f"{name}.json", cp, timeout=600)
        out[name] = _read(d / f"{name}.json")
    tp2 = d / "tp2.yaml"  # configs/cpu_tp2_cp2.yaml at CP 1 (2 processes)
    tp2.write_text((ROOT / "configs" / "cpu_tp2_cp2.yaml").read_text().replace("num_processes: 4", "num_processes: 2")
                   .replace("parallelism_config_cp_size: 2", "parallelism_config_cp_size: 1"))
    for name, config, cp in (("tp2_cp1", tp2, 1), ("tp2_cp2", ROOT / "configs" / "cpu_tp2_cp2.yaml", 2)):
        accelerate_launch(str(config), WORKER, d / f"{name}.json", cp, timeout=600)
        out[name] = _read(d / f"{name}.json")
    return out


def _same_predictions(got: tuple, ref: tuple, rtol: float) -> None:
    (g, ga), (r, ra) = got, ref
    ev, rev = g["evaluate"], r["evaluate"]
    # compute_metrics saw the same rows, targets, inputs and argmax predictions
    for k in ("eval_rows", "eval_targets", "eval_input_tokens", "eval_accuracy"):
        assert ev[k] == rev[k], k
    np.testing.assert_allclose(ev["eval_loss"], rev["eval_loss"], rtol=rtol)
    np.testing.assert_allclose(g["predict_metrics"]["test_loss"], r["predict_metrics"]["test_loss"], rtol=rtol)
    if "sft_evaluate" in r:  # TRL's SFTTrainer after ATACTrainer (its prediction_step returns the shard's labels)
        for k in ("eval_rows", "eval_targets", "eval_accuracy", "eval_mean_token_accuracy"):
            assert g["sft_evaluate"][k] == r["sft_evaluate"][k], k
        np.testing.assert_allclose(g["sft_evaluate"]["eval_loss"], r["sft_evaluate"]["eval_loss"], rtol=rtol)
    assert set(ga) == set(ra)
    for k in ra:
        assert ga[k].shape == ra[k].shape, k
        if k == "label_ids":
            np.testing.assert_array_equal(ga[k], ra[k])
        else:  # logits padded with -100 where a pack is shorter than the longest: in the same places
            np.testing.assert_allclose(ga[k], ra[k], rtol=rtol, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("setting,ref", [("cp2", "cp1"), ("dp2_cp2", "dp2_cp1"), ("tp2_cp2", "cp1"),
                                         ("tp2_cp1", "cp1")])
def test_predictions_and_metrics_under_cp_and_tp_equal_one_cp_rank(runs, setting, ref):
    got, want = runs[setting], runs[ref]
    assert got[0]["world"] == {"cp2": 2, "dp2_cp2": 4, "tp2_cp2": 4, "tp2_cp1": 2}[setting]
    _same_predictions(got, want, rtol=1e-5)
    assert got[1]["logits"].shape[0] == got[0]["evaluate"]["eval_rows"]  # one row per pack (TP: not twice)


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["cp1", "cp2", "dp2_cp1", "dp2_cp2", "tp2_cp1", "tp2_cp2"])
def test_predictions_by_sample_equal_each_sample_run_alone(runs, setting):
    """``predictions_by_sample`` puts each sample's logits back together in dataset order: a sample its packs kept
    whole has the logits of the model run on that sample alone (stock sdpa, one process), at every layout."""
    import torch
    from _integration_worker import dataset, model

    _, arrays = runs[setting]
    test_set, m = dataset(24, seed=2), model()
    m.eval()
    whole = arrays["whole"]
    assert whole.sum() >= 18  # (the two samples longer than max_tokens are split; even_batches may cut others)
    for i in range(len(test_set)):
        ids = torch.tensor(test_set[i]["input_ids"])[None]
        got = arrays[f"sample_{i:02d}"]
        assert got.shape == (ids.shape[1], 128), i  # every token of the sample, fragments joined
        if whole[i]:
            with torch.no_grad():
                want = m(input_ids=ids).logits[0].numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    labels = arrays["sample_labels_05"]  # a whole sample's labels: its tokens, the first one -100 (no context)
    if whole[5]:
        assert labels[0] == -100 and labels[1:].tolist() == test_set[5]["input_ids"][1:]


@pytest.mark.slow
@pytest.mark.parametrize("setting,ref", [("cp2", "cp1"), ("dp2_cp2", "dp2_cp1")])
def test_the_best_checkpoint_by_a_compute_metrics_metric_is_the_one_of_one_cp_rank(runs, setting, ref):
    got, want = runs[setting][0]["best"], runs[ref][0]["best"]
    assert got["accuracies"] == want["accuracies"] and len(got["accuracies"]) == 3
    assert got["checkpoint"] == want["checkpoint"] and got["metric"] == want["metric"]
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)


@pytest.mark.slow
def test_outputs_that_are_not_per_token_are_refused_on_every_cp_rank(runs):
    assert runs["cp1"][0]["refusals"] == {"scalar": [None], "rank0": [None], "replica0": [None]}  # at CP 1: passed on
    assert runs["dp2_cp1"][0]["refusals"] == {"scalar": [None] * 2, "rank0": [None] * 2, "replica0": [None] * 2}
    assert runs["cp2"][0]["refusals"]["replica0"] == [None, None]  # one replica: per-token on both ranks, taken
    for setting in ("cp2", "dp2_cp2"):
        got = runs[setting][0]["refusals"]
        for kind, messages in got.items():
            if (setting, kind) == ("cp2", "replica0"):
                continue
            assert len(messages) == runs[setting][0]["world"] and all(messages), (setting, kind)
            for m in messages:
                assert "only per-token outputs" in m and "ignore_keys=[...]" in m and "prediction_loss_only=True" in m
        assert "has shape ()" in got["scalar"][0]
        # the tensor is per-token on CP rank 0 only: rank 0 names the other rank, rank 1 its own output
        last = runs[setting][0]["world"] - 1  # (the highest rank refusing is named: CP rank 1 of the last replica)
        assert got["rank0"][0].startswith(f"a prediction output of rank {last} is not per-token (its error names it)")
        assert got["rank0"][1].startswith("prediction output 1 (") and ", 2): under context parallelism" in got["rank0"][1]
        if setting == "dp2_cp2":  # per-token on replica 0 (ranks 0, 1), not on replica 1: all four refuse, none waits
            assert [m.startswith("a prediction output of rank 3 is not") for m in got["replica0"]] == [1, 1, 0, 0]
            assert "has shape (1, 7, 2)" in got["replica0"][2] and "has shape (1, 7, 2)" in got["replica0"][3]
        assert runs[setting][0]["ignored"] == runs["cp1" if setting == "cp2" else "dp2_cp1"][0]["ignored"]


# ---------------------------------------------------------------------------- in one process
def test_the_replica_gather_with_one_replica_returns_each_rank_its_own_rows():
    """With one DP replica (no "dp" mesh axis) every CP and TP rank already holds the replica's row: nothing moves;
    a scalar becomes one row, as ``accelerator.gather`` makes it; nests keep their structure."""
    from types import SimpleNamespace

    import torch

    from atac_hf.integrations.predictions import replica_gather

    class Mesh:  # a CP x TP mesh: no "dp" axis
        def __getitem__(self, name):
            raise KeyError(name)

    g = replica_gather(SimpleNamespace(accelerator=SimpleNamespace(torch_device_mesh=Mesh())))
    rows = torch.arange(6.0).reshape(2, 3)
    got = g((rows, {"h": rows[:1]}, torch.tensor(7.0), "text"))
    assert torch.equal(got[0], rows) and torch.equal(got[1]["h"], rows[:1]) and got[3] == "text"
    assert got[2].shape == (1,) and float(got[2][0]) == 7.0


def test_predictions_by_sample_joins_fragments_in_dataset_order_and_refuses_what_it_cannot_split():
    """On a sampler's own packs (no model): rows built from the spans come back per sample (fragments joined in
    order, an empty sample empty, per-batch lists too); wrong inputs are refused in words, naming the fix."""
    from types import SimpleNamespace

    import torch

    from atac_hf.integrations import predictions_by_sample
    from atac_hf.packing import PackingConfig
    from atac_hf.packing.data.sampler import WFAPBatchSampler

    lengths = np.array([5, 0, 40, 3, 17, 9, 26])  # 40 > max_tokens: split into fragments
    sampler = WFAPBatchSampler(lengths, PackingConfig(max_tokens=16, packs_per_window=2), seed=0)
    spans, offsets = sampler._epoch_plan()
    packs = [spans[offsets[b]:offsets[b + 1]].tolist() for b in range(len(offsets) - 1)]
    # each token's value: sample * 1000 + position in the sample; rows padded with -100 to the longest pack
    width = max(sum(e - s for _, s, e in p) for p in packs)
    rows = np.full((len(packs), width, 2), -100)
    for b, p in enumerate(packs):
        vals = np.concatenate([i * 1000 + np.arange(s, e) for i, s, e in p])
        rows[b, :len(vals)] = np.stack([vals, -vals], 1)
    data = object()
    trainer = SimpleNamespace(_atac_eval_loaders={"test": (data, None, sampler)})
    for values in (rows, [rows[:2], rows[2:]], torch.as_tensor(rows)):  # (per-batch arrays: eval_do_concat_batches=False)
        got = predictions_by_sample(trainer, values)
        assert len(got) == len(lengths)
        for i, n in enumerate(lengths):
            assert got[i].shape == (n, 2)
            np.testing.assert_array_equal(got[i][:, 0], i * 1000 + np.arange(n))
    assert predictions_by_sample(trainer, rows, data)[2].shape == (40, 2)  # the dataset object itself

    with pytest.raises(ValueError, match=r"has no predict\(\) or evaluate\(\) loader of this object \(it holds: "
                                         r"test \(object\)\); call trainer.predict\(dataset\)"):
        predictions_by_sample(trainer, rows, object())
    with pytest.raises(TypeError, match=r"values is a tuple of 2 outputs; pass one of them, e.g. out.predictions\[0\]"):
        predictions_by_sample(trainer, (rows, rows))
    # the default is the loader used last (inside compute_metrics: the evaluation running), not always predict()'s
    other = WFAPBatchSampler(np.array([3, 3]), PackingConfig(max_tokens=16, packs_per_window=2), seed=0)
    both = SimpleNamespace(_atac_eval_loaders={"test": (data, None, sampler), "eval": (object(), None, other)})
    assert [x.shape for x in predictions_by_sample(both, np.zeros((1, 6)))] == [(3,), (3,)]
    assert len(predictions_by_sample(both, rows, data)) == len(lengths)
    with pytest.raises(ValueError, match="no predict"):
        predictions_by_sample(SimpleNamespace(), rows)
    with pytest.raises(ValueError, match=rf"values have {len(packs) - 1} rows but the loader of the last predict\(\) "
                                         rf"or evaluate\(\) had {len(packs)} packs"):
        predictions_by_sample(trainer, rows[1:])
    with pytest.raises(ValueError, match=r"row 0 has shape \(3, 2\), shorter than its pack's"):
        predictions_by_sample(trainer, rows[:, :3])
    with pytest.raises(TypeError, match="values must be an array of rows"):
        predictions_by_sample(trainer, {"logits": rows})
    streamed = SimpleNamespace(_atac_eval_loaders={"test": (data, None, None)})
    with pytest.raises(ValueError, match="a streaming dataset is packed window by window"):
        predictions_by_sample(streamed, rows)

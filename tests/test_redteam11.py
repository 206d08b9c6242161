"""Red-team 11 (a new user's scripts against the documented API): what it found, pinned.

- Samples stored as ``(1, n)`` rows (what ``tokenizer(..., return_tensors="pt")`` gives per sample)
  were counted as 1 token by ``dataset_lengths`` while the collator, as documented, flattens them to
  n: the sampler then packed every sample into one row, past ``max_tokens``, without a word.
- A dataset with 0 rows (a filter that kept none) failed inside numpy ("need at least one array to
  concatenate"), one built empty from a dict or with text in ``input_ids`` inside Arrow.
- CLI messages: ``pack --max-tokens 64K`` was refused where ``simulate`` takes it; ``simulate --tp``,
  ``--num-gpus`` and ``--pp`` refusals named ClusterConfig's fields only; ``pack --window 0``
  suggested None, which a flag cannot pass; a bad ``--cost-profile`` / ``--lengths`` /
  ``--profile`` file was refused without naming the flag.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from atac_hf.cli import main  # noqa: E402
from atac_hf.packing import PackingConfig  # noqa: E402
from atac_hf.packing.data.dataset import dataset_lengths  # noqa: E402
from atac_hf.packing.data.sampler import SpanDataset, WFAPBatchSampler  # noqa: E402
from atac_hf.packing.validate import InputTypeError, one_row  # noqa: E402

LENS = [50, 60, 40, 30, 55]


def _ids(n, seed):
    return np.random.default_rng(seed).integers(1, 999, n).tolist()


def _row_datasets():
    """The same five samples as (1, n) rows in every container a user may hand over."""
    import torch

    rows = [[_ids(n, i)] for i, n in enumerate(LENS)]
    arrow = datasets.Dataset.from_dict({"input_ids": rows})
    # several Arrow chunks, then a row selection (offsets into sliced chunks)
    parts = [datasets.Dataset.from_dict({"input_ids": rows[:2]}), datasets.Dataset.from_dict({"input_ids": rows[2:]})]
    chunked = datasets.concatenate_datasets(parts)
    return {
        "arrow": (arrow, LENS),
        "arrow, 2 chunks": (chunked, LENS),
        "arrow, selected": (chunked.select([4, 0, 2]), [LENS[4], LENS[0], LENS[2]]),
        "arrow, torch format": (arrow.with_format("torch"), LENS),
        "list of (1, n) tensors": ([{"input_ids": torch.tensor(r)} for r in rows], LENS),
        "list of (1, n) arrays": ([{"input_ids": np.array(r)} for r in rows], LENS),
        "list of [[ids]]": ([{"input_ids": r} for r in rows], LENS),
        "list of [array]": ([{"input_ids": [np.array(r[0])]} for r in rows], LENS),
    }


@pytest.mark.parametrize("name", list(_row_datasets()))
def test_one_row_samples_count_their_tokens(name):
    ds, want = _row_datasets()[name]
    assert dataset_lengths(ds).tolist() == want
    # the sampler keeps every pack under the cap (it packed all five into one 235-token pack)
    sampler = WFAPBatchSampler.from_dataset(ds, PackingConfig(max_tokens=64, packs_per_window=2), shuffle=False)
    packs = list(sampler)  # each a list of (sample, start, end) spans
    assert packs and all(sum(e - s for _, s, e in p) <= 64 for p in packs)
    assert sorted((i, s, e) for p in packs for i, s, e in p) == [(i, 0, n) for i, n in enumerate(want)]


@pytest.mark.parametrize("name", list(_row_datasets()))
def test_one_row_samples_split_into_their_tokens(name):
    """Over the cap, a (1, n) sample is split into fragments: each span of it is its tokens [s, e) (the view
    cut the outer axis before: a first fragment of the whole row, later ones empty)."""
    ds, want = _row_datasets()[name]
    flat = [np.asarray(dataset_row[0] if isinstance(dataset_row, list) else dataset_row).reshape(-1).tolist()
            for dataset_row in (ds[i]["input_ids"] for i in range(len(want)))]
    sampler = WFAPBatchSampler.from_dataset(ds, PackingConfig(max_tokens=24, packs_per_window=2), shuffle=False)
    view = SpanDataset(ds)
    got = {i: [] for i in range(len(want))}
    for pack in sampler:
        assert sum(e - s for _, s, e in pack) <= 24
        for i, s, e in pack:
            piece = view[(i, s, e)]["input_ids"]
            assert one_row(piece)  # still a row, as the sample was: the collator flattens it
            ids = np.asarray(piece[0] if isinstance(piece, list) else piece).reshape(-1).tolist()
            assert ids == flat[i][s:e]
            got[i].append((s, ids))
    assert {i: [t for _, ids in sorted(v) for t in ids] for i, v in got.items()} == dict(enumerate(flat))


def test_flat_samples_empty_rows_and_empty_one_row_samples():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [], [4], None]})
    assert dataset_lengths(ds).tolist() == [3, 0, 1, 0]
    assert dataset_lengths([{"input_ids": [7]}, {"input_ids": np.arange(4)}, {"input_ids": [[1, 2], ]}]).tolist() \
        == [1, 4, 2]
    one_row_empty = datasets.Dataset.from_dict({"input_ids": [[[1, 2]], [[]], [], None, [None]]})
    assert dataset_lengths(one_row_empty).tolist() == [2, 0, 0, 0, 0]


def test_sample_of_several_rows_is_refused_naming_it():
    ds = datasets.Dataset.from_dict({"input_ids": [[[1, 2, 3]], [[1, 2], [3, 4]]]})
    with pytest.raises(InputTypeError, match=r"^sample 1: input_ids holds 2 rows of ids .*one sample per row"):
        dataset_lengths(ds)


@pytest.mark.parametrize("make", [
    lambda: datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]}).filter(lambda x: False),
    lambda: datasets.Dataset.from_dict({"input_ids": []}),
])
def test_empty_dataset_is_refused_in_words(make):
    ds = make()
    assert dataset_lengths(ds).tolist() == []
    with pytest.raises(ValueError, match=r"^the dataset has 0 samples \(empty, or a filter kept none\): nothing to pack"):
        WFAPBatchSampler.from_dataset(ds, PackingConfig(max_tokens=64, packs_per_window=2))


@pytest.mark.parametrize("ids, arrow_type", [(["1 2 3", "4 5"], "string"), ([[[["1"]]]], "list<item: list")])
def test_text_ids_are_refused_in_words(ids, arrow_type):
    ds = datasets.Dataset.from_dict({"input_ids": ids})
    with pytest.raises(InputTypeError, match=rf"^input_ids must be a list column of int token ids, got Arrow type "
                                             rf"{arrow_type}.*tokenize the text first"):
        dataset_lengths(ds)


def test_trainer_packs_one_row_samples_under_the_cap(tmp_path):
    """The user script that found it: ATACTrainer on (1, n) rows ran one 235-token forward at max_tokens=64."""
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from atac_hf import ATACConfig, ATACTrainer

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256))
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(int(kw["input_ids"].shape[-1])), with_kwargs=True)
    lens = LENS + [150]  # and one over the cap: split into 64 + 64 + 22 tokens
    ds = datasets.Dataset.from_dict({"input_ids": [[_ids(n, i)] for i, n in enumerate(lens)]})
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, report_to=[], use_cpu=True,
                             disable_tqdm=True, save_strategy="no")
    ATACTrainer(model=model, args=args, train_dataset=ds,
                atac_config=ATACConfig(max_tokens=64, cost_preset="default")).train()
    assert max(seen) <= 64 and sum(seen) == sum(lens)  # one 235-token forward before


# ----------------------------------------------------------------------------------------------- CLI
def _cli(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr()


def test_pack_and_plan_take_token_suffixes(tmp_path, capsys):
    code, out = _cli(["pack", "--workload", "longtail", "--num-samples", "300", "--max-tokens", "8K", "--json"],
                     capsys)
    assert code == 0
    packs = json.loads(out.out)["packs"]
    assert max(sum(e - s for _, s, e in p) for p in packs) <= 8192
    assert max(sum(e - s for _, s, e in p) for p in packs) > 4096
    code, out = _cli(["plan", "--doc-lengths", "100,200,3000", "--cp-size", "2", "--max-tokens-per-rank", "2K",
                      "--strategy", "atp", "--json"], capsys)
    assert code == 0 and json.loads(out.out.splitlines()[0])["strategy"] == "atp"


@pytest.mark.parametrize("argv, message", [
    (["pack", "--workload", "longtail", "--max-tokens", "8K", "--window", "0"],
     r"--window=0 is invalid: it must be an int >= 1 \(new samples per window\), or omit --window"),
    (["simulate", "--tp", "3"], r"tp_size=3 must divide .*; legal: \[1, 2, 4, 8, 16, 32\] \(set tp_size / --tp\)"),
    (["simulate", "--num-gpus", "4"], r"num_gpus=4 does not match .* or set num_gpus / --num-gpus to 128"),
    (["simulate", "--pp", "64", "--model", "8b"], r"pp_size=64 exceeds .*; set pp_size / --pp to at most 32"),
])
def test_cli_refusals_name_the_flag(argv, message, capsys):
    code, out = _cli(argv, capsys)
    assert code != 0 and "Traceback" not in out.err
    assert __import__("re").search(message, out.err), out.err


def test_cli_file_refusals_name_the_flag(tmp_path, capsys):
    arr = tmp_path / "list.json"
    arr.write_text("[1, 2]")
    txt = tmp_path / "lens.txt"
    txt.write_text("1 2 3\n4\n")
    for argv, flag in ((["pack", "--workload", "longtail", "--max-tokens", "8K", "--cost-profile", str(arr)],
                        "--cost-profile"),
                       (["plan", "--doc-lengths", "1,2", "--cp-size", "2", "--profile", str(arr)], "--profile"),
                       (["pack", "--lengths", str(txt), "--max-tokens", "8K"], "--lengths")):
        code, out = _cli(argv, capsys)
        assert code != 0 and "Traceback" not in out.err
        assert f"(check {flag})" in out.err, out.err

"""Red-team 12 (a helper adopting the library at scale: 2M-sample datasets, streaming resume, TRL, the
examples under ``accelerate launch``): what it found, pinned.

- TRL's SFTTrainer on ``pack_dataset`` rows trained on the prompts: its data (``input_ids`` and
  ``completion_mask``, no ``labels``) packed as they were, and SFTTrainer keeps only
  ``model.forward``'s arguments (``labels``, ``seq_lengths`` it keeps, the mask it drops), so the
  collator never saw the mask. ``pack_dataset`` now writes ``labels`` from the masks (TRL's rule, as
  the collator applies it).
- A null mask entry (``completion_mask``, ``assistant_masks``, ``attention_mask``) was filled with the
  sample's token ids, as a null ``labels`` entry is: the collator then refused the row (values other
  than 0/1). It is now all ones (every token counts, as for a sample without the mask).
"""

from __future__ import annotations

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from atac_hf import pack_dataset  # noqa: E402
from atac_hf.packing.data.collator import PackedDataCollator  # noqa: E402


def _sft_rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        p, c = (int(x) for x in rng.integers(1, 30, 2))
        rows.append({"input_ids": rng.integers(2, 500, p + c).tolist(), "completion_mask": [0] * p + [1] * c,
                     "assistant_masks": rng.integers(0, 2, p + c).tolist()})
    return rows


def _labels(batch):
    return batch["labels"].reshape(-1).tolist()


@pytest.mark.parametrize("masks", [("completion_mask",), ("assistant_masks",), ("completion_mask", "assistant_masks")])
def test_packed_rows_carry_the_labels_their_masks_give(masks):
    rows = [{k: r[k] for k in ("input_ids", *masks)} for r in _sft_rows()]
    packed = pack_dataset(datasets.Dataset.from_list(rows), max_tokens=128, packs_per_window=4, progress=False)
    assert "labels" in packed.column_names and all(m in packed.column_names for m in masks)
    collate = PackedDataCollator()
    for row in packed:
        samples = [rows[i] | {"input_ids": rows[i]["input_ids"][s:e], **{m: rows[i][m][s:e] for m in masks}}
                   for i, s, e in row["spans"]]
        want = _labels(collate(samples))  # the collator on the source samples: TRL's rule per sample
        assert _labels(collate([row])) == want
        # a trainer that keeps only model.forward's arguments (SFTTrainer, remove_unused_columns): masks dropped
        kept = {k: row[k] for k in ("input_ids", "labels", "seq_lengths")}
        assert _labels(collate([kept])) == want
        assert any(x == -100 for x in row["labels"])


def test_own_labels_are_kept_and_not_derived():
    ds = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 9]], "labels": [[-100, 6, 7], [8, -100]],
                                     "completion_mask": [[0, 0, 0], [0, 0]]})
    packed = pack_dataset(ds, max_tokens=8, progress=False)
    assert packed[0]["labels"] == [-100, 6, 7, 8, -100]  # the source's labels, the mask not applied
    plain = pack_dataset(datasets.Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 9]]}), max_tokens=8, progress=False)
    assert "labels" not in plain.column_names  # no mask, no labels column made up


@pytest.mark.parametrize("col", ["completion_mask", "assistant_masks", "attention_mask"])
def test_null_mask_entries_count_every_token(col):
    ds = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 9], [1, 2, 3, 4]],
                                     col: [[0, 1, 1] if col != "attention_mask" else [1, 1, 1], None, None]})
    packed = pack_dataset(ds, max_tokens=16, progress=False)
    row = packed[0]
    order = [i for i, _, _ in row["spans"]]
    assert row[col] == sum(([[0, 1, 1] if col != "attention_mask" else [1, 1, 1], [1, 1], [1, 1, 1, 1]][i]
                            for i in order), [])
    labels = _labels(PackedDataCollator()([row]))  # was refused: "has values [8, 9]"
    assert len(labels) == 9


def test_row_selection_and_chunks_keep_masks_with_their_tokens():
    rows = _sft_rows(30, seed=1)
    parts = [datasets.Dataset.from_list(rows[:11]), datasets.Dataset.from_list(rows[11:])]
    ds = datasets.concatenate_datasets(parts).select(list(range(29, -1, -2)))
    src = [rows[i] for i in range(29, -1, -2)]
    packed = pack_dataset(ds, max_tokens=64, packs_per_window=2, progress=False)
    for row in packed:
        want = sum(([t if c and a else -100 for t, c, a in zip(src[i]["input_ids"][s:e], src[i]["completion_mask"][s:e],
                                                               src[i]["assistant_masks"][s:e])]
                    for i, s, e in row["spans"]), [])
        assert row["labels"] == want


# ------------------------------------------------------------------- examples/finetune_long_context.py
def _example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "finetune_long_context.py"
    spec = importlib.util.spec_from_file_location("finetune_long_context_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _jsonl(path, n):
    import json

    path.write_text("".join(json.dumps({"text": "word " * (5 + i % 40)}) + "\n" for i in range(n)))
    return str(path)


def test_example_trains_on_every_row_of_the_users_data(tmp_path, capsys):
    """--dataset kept only its first 600 rows (--num_samples' default, the synthetic corpus's size), silently."""
    ex = _example()
    data = _jsonl(tmp_path / "big.jsonl", 900)
    train, evals, _ = ex.load_dataset_and_tokenizer(ex.parse_args(["--dataset", data, "--tokenizer", "byte"]))
    assert len(train) == 900 and evals is None
    train, evals, _ = ex.load_dataset_and_tokenizer(ex.parse_args(["--dataset", data, "--tokenizer", "byte",
                                                                   "--num_samples", "100", "--eval_samples", "7"]))
    assert (len(train), len(evals)) == (100, 7)
    assert "using the first 107 of the dataset's 900 rows" in capsys.readouterr().out
    train, evals, _ = ex.load_dataset_and_tokenizer(ex.parse_args(["--tokenizer", "byte"]))  # synthetic: 600
    assert len(train) == 600 and evals is None


def test_example_holds_out_eval_rows_of_a_small_dataset(tmp_path):
    """--eval_samples on a dataset under 600 rows raised IndexError (it selected rows past the end)."""
    ex = _example()
    data = _jsonl(tmp_path / "small.jsonl", 50)
    train, evals, _ = ex.load_dataset_and_tokenizer(ex.parse_args(["--dataset", data, "--tokenizer", "byte",
                                                                   "--eval_samples", "10"]))
    assert (len(train), len(evals)) == (40, 10)
    with pytest.raises(ValueError, match=r"^--eval_samples=50 must be from 1 to 49: the data hold 50 samples"):
        ex.load_dataset_and_tokenizer(ex.parse_args(["--dataset", data, "--tokenizer", "byte", "--eval_samples", "50"]))


# ------------------------------------------------------------------------- window sizing look-ahead
@pytest.mark.parametrize("strategy", ["wfap", "bfd", "wlb", "sequential"])
def test_window_sizing_does_not_depend_on_the_look_ahead(strategy):
    """The map-style sampler sized every window over 4,096 samples, 1 ms a window at one pack per window
    (60 s for 2M samples); feeders now start from twice the last window's samples. Any look-ahead gives the
    same windows, as the docstring of next_window argues: every window of a stream, fed alike, at looks 1-4096."""
    from atac_hf.packing import StreamPacker
    from atac_hf.packing.feed import next_window

    rng = np.random.default_rng(3)
    lengths = np.concatenate([rng.integers(0, 300, 400), rng.integers(2000, 9000, 8), rng.integers(1, 50, 300)])
    lengths = rng.permutation(lengths).astype(np.int64)
    cfg_kw = dict(max_tokens=1024, packs_per_window=2, strategy=strategy)
    from atac_hf.packing import PackingConfig

    packers = {look: StreamPacker(PackingConfig(**cfg_kw)) for look in (1, 7, 64, 4096)}
    pos = {look: 0 for look in packers}
    windows = 0
    while pos[4096] < lengths.size:
        got = {}
        for look, packer in packers.items():
            k, _ = next_window(packer, lengths, pos[look], look, prev_empty=False)  # each its own fixed start
            got[look] = k
            packer.add_window(list(range(pos[look], pos[look] + k)), lengths[pos[look]:pos[look] + k].tolist(),
                              last=pos[look] + k >= lengths.size)
            pos[look] += k
        assert len(set(got.values())) == 1, got
        windows += 1
    assert windows > 20


@pytest.mark.parametrize("mask, bad", [([[0, 1, 1], [1, 2]], "[2]"), ([[0, 1, 1], [1, None]], "[nan]")])
def test_mask_values_are_checked_where_the_labels_are_built(mask, bad):
    """Built into labels by pack_dataset, a mask value other than 0/1 would pass unseen (the collator reads the
    labels, not the mask): pack_dataset refuses it, naming the sample."""
    ds = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 9]], "completion_mask": mask})
    with pytest.raises(ValueError, match=rf"^pack_dataset: sample 1: completion_mask has values \{bad[:-1]}\]; legal"):
        pack_dataset(ds, max_tokens=8, progress=False)

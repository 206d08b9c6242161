"""Interop with TRL 1.16 (skipped without trl; the dev extra installs it): TRL's own bfd
cases reproduced by our bfd, TRL-packed rows in PackedDataCollator equal to TRL's
padding-free collator, TRL-packed rows in ATACTrainer (default TrainingArguments: the
feeder reads their seq_lengths and packs their documents again, each kept whole), and
atac-packed rows in SFTTrainer(packing=False, padding_free=True)."""

from __future__ import annotations

import numpy as np
import pytest
datasets = pytest.importorskip("datasets")  # not on every machine (the GPU image has none)

trl_data = pytest.importorskip("trl.data_utils")

from atac_hf.integrations.data import check_dataset_columns  # noqa: E402
from atac_hf.packing import PackedDataCollator  # noqa: E402
from atac_hf.packing.data.dataset import pack_dataset  # noqa: E402

datasets.disable_progress_bars()

EXAMPLES = {  # TRL's pack_dataset docstring example
    "input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]],
    "attention_mask": [[1, 1, 1, 0, 0], [1, 0], [1, 1, 0], [1]],
}


@pytest.mark.parametrize("trl_strategy,overlength", [("bfd", "truncate"), ("bfd_split", "split")])
def test_trl_bfd_cases_reproduced(trl_strategy, overlength):
    ds = datasets.Dataset.from_dict(EXAMPLES)
    theirs = trl_data.pack_dataset(ds, 4, strategy=trl_strategy)[:]
    ours = pack_dataset(ds, max_tokens=4, packs_per_window=8, strategy="bfd", overlength=overlength,
                        min_fragment=1, progress=False)[:]
    def docs(rows):  # each pack as its set of documents (ids, mask): our rows keep data order inside a pack
        out = []
        for ids, mask, lens in zip(rows["input_ids"], rows["attention_mask"], rows["seq_lengths"]):
            cuts = np.cumsum([0] + lens)
            out.append(sorted((tuple(ids[a:b]), tuple(mask[a:b])) for a, b in zip(cuts[:-1], cuts[1:])))
        return out

    assert len(ours["input_ids"]) == len(theirs["input_ids"]) == 3
    assert docs(ours) == docs(theirs)


@pytest.mark.parametrize("seed", range(5))
def test_trl_bfd_random_cases_same_pack_count(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 64, size=300)
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    theirs = trl_data.pack_dataset(ds, 64, strategy="bfd")
    ours = pack_dataset(ds, max_tokens=64, packs_per_window=1000, strategy="bfd", progress=False)
    # one window holds the whole pool, as TRL's 1000-sample map batch does: same rule, same bins
    assert len(ours) == len(theirs)
    assert sorted(map(sum, ours["seq_lengths"])) == sorted(map(sum, theirs["seq_lengths"]))


@pytest.mark.parametrize("seed", range(6))
def test_split_fill_needs_no_more_packs_than_trl_bfd_split(seed):
    """Split mode case by case against TRL's bfd_split (which has no min_fragment): our bfd
    with split_fill and the default min_fragment, on the benchmark's class (a cap, 100-399
    samples of 1 to 3x it; docs/BENCHMARKS.md "Split mode")."""
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(64, 512)) if seed % 2 == 0 else int(rng.integers(4096, 32768))
    lengths = rng.integers(1, 3 * cap, size=int(rng.integers(100, 400)))
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    theirs = trl_data.pack_dataset(ds, cap, strategy="bfd_split")
    with pytest.warns(UserWarning, match="longer than max_tokens"):
        ours, met = pack_dataset(ds, max_tokens=cap, strategy="bfd", split_fill=True, progress=False,
                                 return_metrics=True)
    assert met["num_split"] > 0 and len(ours) <= len(theirs)
    assert len(ours) <= 1.01 * met["lower_bound_packs"] + 1
    assert met["fragment_lengths"]["min"] >= min(128, cap // 8)  # the default min_fragment


def test_trl_rows_in_packed_collator_match_trl_collator():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rng = np.random.default_rng(0)
    ds = datasets.Dataset.from_dict({"input_ids": [rng.integers(1, 50, size=int(n)).tolist()
                                                   for n in rng.integers(1, 30, size=60)]})
    rows = trl_data.pack_dataset(ds, 64, strategy="bfd")
    theirs = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    ours = PackedDataCollator()
    assert len(rows) > 5
    for row in rows:
        a, b = ours([row]), theirs([row])
        assert a["input_ids"].tolist() == b["input_ids"].tolist()
        assert a["position_ids"].tolist() == b["position_ids"].tolist()
        assert len(row["seq_lengths"]) > 0 and a["seq_lengths"].tolist() == row["seq_lengths"]


def test_packed_rows_become_documents_for_the_atac_feeder():
    from atac_hf.integrations.data import PackedRowDocuments, build_packed_dataloader
    from atac_hf.integrations import ATACConfig

    rng = np.random.default_rng(1)
    src = [rng.integers(0, 100, size=int(n)).tolist() for n in rng.integers(1, 30, size=50)]
    rows = trl_data.pack_dataset(datasets.Dataset.from_dict({"input_ids": src}), 64, strategy="bfd")
    check_dataset_columns(rows, name="train_dataset")  # map-style pre-packed rows are accepted
    docs = PackedRowDocuments(rows)
    assert len(docs) == len(src) and sorted(map(len, (docs[i]["input_ids"] for i in range(len(docs))))) == \
        sorted(map(len, src))
    assert sorted(tuple(docs[i]["input_ids"]) for i in range(len(docs))) == sorted(map(tuple, src))
    # the feeder packs the documents again, each its own document in the new rows
    loader, _sampler = build_packed_dataloader(rows, ATACConfig(cp_size=1, max_tokens=128, cost_preset="default"))
    trained = []
    for batch in loader:
        ids, lens = batch["input_ids"].reshape(-1).tolist(), batch["seq_lengths"].tolist()
        cuts = np.cumsum([0] + lens)
        trained += [tuple(ids[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    assert sorted(trained) == sorted(map(tuple, src))
    bad = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "seq_lengths": [[1, 1]]})
    with pytest.raises(ValueError, match=r"row 0: seq_lengths sum to 2 but input_ids has 3 tokens"):
        PackedRowDocuments(bad)
    ours = pack_dataset(datasets.Dataset.from_dict(EXAMPLES), max_tokens=4, progress=False)
    assert len(PackedRowDocuments(ours)) == 5  # 4 samples, the 5-token one split in two


@pytest.mark.slow
def test_atac_rows_train_in_sft_trainer_padding_free(tmp_path):
    import torch
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from atac_hf.integrations.demo import tiny_llama_config

    V = 64
    vocab = {str(i): i for i in range(V)} | {"<pad>": V, "<eos>": V + 1}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="0")),
                                  pad_token="<pad>", eos_token="<eos>")
    rng = np.random.default_rng(0)
    src = datasets.Dataset.from_dict({"input_ids": [rng.integers(0, V, size=int(n)).tolist()
                                                    for n in rng.integers(5, 60, size=40)]})
    rows = pack_dataset(src, max_tokens=128, packs_per_window=2, progress=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=V + 2, max_position_embeddings=256),
        dtype=torch.float32)
    args = SFTConfig(output_dir=str(tmp_path), max_length=None, max_steps=2, packing=False, padding_free=True,
                     per_device_train_batch_size=1, use_cpu=True, report_to=[], disable_tqdm=True,
                     dataset_kwargs={"skip_prepare_dataset": True}, save_strategy="no")
    trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tok)
    lens = rows[0]["seq_lengths"]
    assert len(lens) > 1
    batch = trainer.data_collator([rows[0]])  # TRL's collator sees our documents
    assert batch["position_ids"][0].tolist() == [p for n in lens for p in range(n)]
    assert batch["cu_seq_lens_q"].tolist() == np.concatenate([[0], np.cumsum(lens)]).tolist()
    out = trainer.train()
    assert trainer.state.global_step == 2 and np.isfinite(out.training_loss)


@pytest.mark.slow
def test_trl_rows_train_in_atac_trainer_with_default_arguments(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainingArguments

    from atac_hf.integrations import ATACConfig, ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    rng = np.random.default_rng(2)
    lengths = rng.integers(2, 40, size=40)
    starts = np.cumsum(lengths) - lengths
    src = [list(range(int(s), int(s + n))) for s, n in zip(starts, lengths)]  # every token a distinct id
    rows = trl_data.pack_dataset(datasets.Dataset.from_dict({"input_ids": src}), 96, strategy="bfd")

    class Recording(ATACTrainer):
        def _prepare_context_parallel_inputs(self, model, inputs):
            if model.training:
                ids, lens = inputs["input_ids"].reshape(-1).tolist(), inputs["seq_lengths"].tolist()
                cuts = np.cumsum([0] + lens)
                self.docs += [tuple(ids[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
            return super()._prepare_context_parallel_inputs(model, inputs)

    torch.manual_seed(0)
    vocab = int(lengths.sum()) + 1
    model = AutoModelForCausalLM.from_config(
        tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=vocab, max_position_embeddings=256),
        dtype=torch.float32)
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, use_cpu=True, report_to=[],
                             save_strategy="no", disable_tqdm=True, log_level="error")
    assert args.remove_unused_columns  # the default that drops seq_lengths in a plain Trainer
    trainer = Recording(model=model, args=args, train_dataset=rows,
                        atac_config=ATACConfig(cp_size=1, max_tokens=128, cost_preset="default"))
    trainer.remove_callback(PrinterCallback)
    trainer.docs = []
    trainer.train()
    assert sorted(trainer.docs) == sorted(map(tuple, src))  # every document whole, once, on its own

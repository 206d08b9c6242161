"""A newcomer's own scripts (round 45): what a user adapting an existing Trainer / TRL / accelerate
setup ran into, each with the fix it got.

- ``accelerate launch --num_processes 2 train.py`` without ``--multi_gpu`` on a machine without CUDA,
  or a launch config with ``distributed_type: MULTI_CPU`` (what ``accelerate config`` writes for
  "multi-CPU"), starts ONE process (Accelerate's simple launcher needs mpirun for more) and exports
  no parallelism_config: ``cp_size=2`` failed with "launch a multiple of 2 processes (accelerate
  launch --num_processes)", advice already followed, and without ``cp_size`` in code the run went on
  as one process with no word. Both now say what happened and how to launch on CPU.
- ``atac-hf bench --workload-file FILE.parquet`` told the user to pass ``dataset:FILE:<column>``,
  which ``--workload-file`` then refused as a file that "does not exist".
- TRL's ``SFTTrainer`` has no ATP-CP path of its own; ``class ATACSFTTrainer(ATACTrainer,
  SFTTrainer)`` on data tokenized with ``assistant_masks`` (docs/INTEGRATION.md "TRL's SFTTrainer")
  trains the assistant tokens only, and at cp_size 2 logs what cp_size 1 logs.
  ``SFTConfig``'s default ``max_length`` (1024) cut every sample before the packer saw it: now warned.
- A dataset with no token to train (``labels`` all -100, or ``assistant_masks`` all 0 from a chat template
  without ``{% generation %}``) trained at loss 0 and grad norm 0 with no error: now refused, naming the fix.
- ``examples/finetune_long_context.py --dataset ... --tokenizer ...`` built the embedded model for the byte
  tokenizer's 259 ids and failed at the first batch.
- With ``logging_steps`` above the steps run, ``train_loss`` was each rank's own share under CP.
- ``calibrate`` drew its tqdm bar into a log file (one line of carriage returns); ``pack`` printed
  "est. time 0.00 s/layer" for packs of a few thousand tokens.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest

from atac_hf.integrations.accelerate import build_parallelism_config
from atac_hf.integrations.config import ATACConfig
from atac_hf.integrations.launch_env import one_process_launch

from _launch import ROOT, clean_env, free_port, run, torchrun

# what Accelerate's simple launcher exports for `accelerate launch --num_processes 2 [--cpu] train.py` (measured,
# accelerate 1.16): MASTER_ADDR/PORT because more than one process was asked for, no WORLD_SIZE / LOCAL_RANK
SIMPLE_LAUNCHER = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                   "ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO",
                   "ACCELERATE_DYNAMO_MODE": "default", "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False"}


def test_cp_refusal_on_a_one_process_launch_says_how_to_launch_several():
    with pytest.raises(ValueError, match=r"cp_size=2 does not divide the world size 1 .*--num_processes N; on a machine "
                                         r"without GPUs add --multi_gpu, as configs/cpu_cp2.yaml does, or Accelerate "
                                         r"starts one process\); "
                                         r"accelerate launch was asked for several processes but started this one "
                                         r"alone .*MULTI_CPU.*--multi_gpu --num_processes N.*use_cpu: true"):
        build_parallelism_config(ATACConfig(cp_size=2), 1, environ=SIMPLE_LAUNCHER)
    # any other single process: the message as before, nothing added
    with pytest.raises(ValueError, match=r"launch a multiple of 2 processes \(accelerate launch --num_processes N; .*"
                                         r"--multi_gpu.*starts one process\)$"):
        build_parallelism_config(ATACConfig(cp_size=2), 1, environ={})


def test_one_process_launch_without_cp_is_warned_not_silent():
    with pytest.warns(UserWarning, match=r"started this one alone.*goes on as a single process"):
        pc = build_parallelism_config(ATACConfig(cp_size=1), 1, environ=SIMPLE_LAUNCHER)
    assert pc.cp_size == 1 and pc.dp_replicate_size * pc.dp_shard_size == 1


@pytest.mark.parametrize("env", [
    {},  # python train.py
    {k: v for k, v in SIMPLE_LAUNCHER.items() if not k.startswith("MASTER_")},  # accelerate launch, 1 process asked
    {**SIMPLE_LAUNCHER, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"},  # torchrun --nproc_per_node 1
    {**SIMPLE_LAUNCHER, "PMI_SIZE": "1"},  # mpirun -n 1
    {"MASTER_ADDR": "10.0.0.1"},  # a shell that exports MASTER_ADDR, no accelerate launch
])
def test_no_word_where_the_launch_started_what_it_was_asked(env):
    assert one_process_launch(env, 1) == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_parallelism_config(ATACConfig(cp_size=1), 1, environ=env)
    assert one_process_launch(SIMPLE_LAUNCHER, 2) == ""  # several processes: not this case


@pytest.mark.slow
def test_accelerate_launch_num_processes_without_multi_gpu_is_explained(tmp_path):
    """The real launcher: `accelerate launch --cpu --num_processes 2` runs the script once, which the refusal
    now says (the environment above is what it exports)."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import os\n"
        "from atac_hf.integrations.accelerate import build_parallelism_config\n"
        "from atac_hf.integrations.config import ATACConfig\n"
        "try:\n"
        "    build_parallelism_config(ATACConfig(cp_size=2), int(os.environ.get('WORLD_SIZE', '1')))\n"
        "except ValueError as e:\n"
        "    print('REFUSED', e)\n")
    proc = run([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port()), script],
               env=clean_env(PYTHONPATH=str(ROOT)), timeout=300)
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refusals) == 1, proc.stdout  # one process, not two
    assert "started this one alone" in refusals[0] and "--multi_gpu --num_processes N" in refusals[0]


# ---------------------------------------------------------------------------- bench --workload-file dataset:
def test_bench_workload_file_takes_the_dataset_spec_its_message_suggests(tmp_path, monkeypatch, capsys):
    datasets = pytest.importorskip("datasets")
    import argparse

    from atac_hf.sim import bench
    from atac_hf.sim.bench import Scenario, default_grid
    from atac_hf.sim.cli import add_parser

    path = tmp_path / "lengths.parquet"
    datasets.Dataset.from_dict({"length": [int(n) for n in np.random.default_rng(0).integers(1, 3000, 300)]}
                               ).to_parquet(str(path))
    p = argparse.ArgumentParser(prog="atac-hf")
    add_parser(p.add_subparsers(dest="command", required=True))
    cli = lambda argv: (lambda a: a.func(a))(p.parse_args(argv))  # noqa: E731
    with pytest.raises(ValueError, match=rf"read a column of it with dataset:{path}:<column>"):
        cli(["bench", "--workload-file", str(path), "--workers", "1"])
    spec = f"dataset:{path}:length"
    grid = default_grid(spec)  # was: ValueError "does not exist"
    assert {s.workload for s in grid if s.name.endswith("wlbllm")} == {spec}
    c = dict(model="1b", hardware="H100", max_tokens=4096, cp_size=2, pp_size=1, dp_size=2, num_micro_batches=2)
    monkeypatch.setattr(bench, "default_grid", lambda workload_file=None: [Scenario("tiny", c, workload_file, 2)])
    assert cli(["bench", "--workload-file", spec, "--workers", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"workload lengths.parquet ({spec}): 300 samples, ")
    with pytest.raises(ValueError, match=r"dataset '.*nope\.parquet' does not exist.*\(check --workload-file\)"):
        cli(["bench", "--workload-file", f"dataset:{tmp_path / 'nope.parquet'}:length", "--workers", "1"])


# ---------------------------------------------------------------------------- CLI output
def test_calibrate_draws_no_bar_into_a_log():
    from atac_hf.cost.calibration_grid import progress_bar

    assert progress_bar(10.0) is None  # pytest's captured stderr is no terminal: the rounds print as lines


def test_pack_summary_prices_small_packs_in_ms(tmp_path, capsys):
    from atac_hf.cli import main

    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps([300, 700, 120, 0, 900, 50] * 10))
    assert main(["pack", "--lengths", str(lengths), "--max-tokens", "1024", "--model", "tiny", "--no-progress"]) == 0
    line = [s for s in capsys.readouterr().out.splitlines() if "est. time" in s][0]
    assert "est. time 0.00 s/layer" not in line
    assert float(line.split("est. time ")[1].split(" ms/layer")[0]) > 0


# ---------------------------------------------------------------------------- TRL
def test_untokenized_chat_data_gets_the_chat_template_recipe():
    from atac_hf.integrations.data import check_dataset_columns

    with pytest.raises(ValueError, match=r"columns found: \['messages'\]\. Tokenize it first.*apply_chat_template"
                                         r"\(ex\['messages'\], tokenize=True, return_dict=True, "
                                         r"return_assistant_tokens_mask=True\)"):
        check_dataset_columns([{"messages": [{"role": "user", "content": "hi"}]}], name="train_dataset")


def test_untokenized_prompt_completion_data_gets_a_recipe_that_runs():
    """Red-team 57: raw prompt/completion text got only the plain-text hint (tokenizer(b['text'])), which drops
    the completion-only loss; the hint for such columns runs as given and builds data the trainer takes."""
    datasets = pytest.importorskip("datasets")
    import re

    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from atac_hf.integrations.data import check_dataset_columns

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", "[BOS]", "a", "b", "c"])},
                                       unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.post_processor = TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", bos_token="[BOS]")
    dataset = datasets.Dataset.from_dict({"prompt": ["a b", "c"], "completion": ["c c", "a b c"]})
    with pytest.raises(ValueError, match=r"columns found: \['prompt', 'completion'\]\. .*prompt-completion data: "
                                         r".*'completion_mask'") as caught:
        check_dataset_columns(dataset, name="train_dataset")
    recipe = re.search(r"e\.g\. (dataset\.map\(lambda ex: .*\}\)), see", str(caught.value)).group(1)
    # the message's own example, run as a user would paste it
    tokenized = eval(recipe, {"dataset": dataset, "tokenizer": tokenizer})  # noqa: S307
    assert tokenized[0]["input_ids"] == [1, 2, 3, 4, 4] and tokenized[0]["completion_mask"] == [0, 0, 0, 1, 1]
    assert tokenized[1]["input_ids"] == [1, 4, 2, 3, 4] and tokenized[1]["completion_mask"] == [0, 0, 1, 1, 1]
    check_dataset_columns(tokenized, name="train_dataset", targets=True)
    # the plain-text hint alone for other columns, as before
    with pytest.raises(ValueError, match=r"rename the token column to 'input_ids'$"):
        check_dataset_columns([{"text": "a b"}], name="train_dataset")


def test_atac_sft_trainer_trains_the_assistant_tokens_only(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from _newcomer45_sft_worker import build, chat_rows

    trainer = build(str(tmp_path), 1)
    rows = chat_rows()
    by_ids = {tuple(i): m for i, m in zip(rows["input_ids"], rows["assistant_masks"])}
    batch = next(iter(trainer.get_train_dataloader()))
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    cuts = np.cumsum([0] + batch["seq_lengths"].tolist())
    assert len(cuts) > 2, "a pack of several documents"
    for a, b in zip(cuts[:-1], cuts[1:]):
        mask = by_ids[tuple(ids[a:b])]  # each document is one whole sample
        assert labels[a:b] == [t if m else -100 for t, m in zip(ids[a:b], mask)]
    out = trainer.train()
    assert trainer.state.global_step == 3 and np.isfinite(out.training_loss)
    trainer.accelerator.end_training()


def test_sft_config_max_length_below_max_tokens_is_warned(tmp_path):
    """SFTConfig's default max_length (1024) cut each sample before ATACTrainer packed it (2,000 tokens -> 1,024),
    silently, under max_tokens=4096."""
    pytest.importorskip("trl")
    from trl import SFTConfig

    from atac_hf.integrations.trainer_guards import check_training_args

    args = lambda **kw: SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **kw)  # noqa: E731
    with pytest.warns(UserWarning, match=r"max_length=1024 \(SFTConfig\) is below max_tokens=4096: SFTTrainer cuts "
                                         r"each sample to 1024 tokens.*SFTConfig\(max_length=None\)"):
        check_training_args(args(), ATACConfig(max_tokens=4096))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        check_training_args(args(max_length=None), ATACConfig(max_tokens=4096))
        check_training_args(args(max_length=4096), ATACConfig(max_tokens=4096))
        check_training_args(args(dataset_kwargs={"skip_prepare_dataset": True}), ATACConfig(max_tokens=4096))


@pytest.mark.slow
def test_atac_sft_trainer_at_cp2_logs_what_cp1_logs(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    worker = ROOT / "tests" / "_newcomer45_sft_worker.py"
    (tmp_path / "cp1").mkdir()
    (tmp_path / "cp2").mkdir()
    run([sys.executable, worker, tmp_path / "cp1" / "out.json", "1"], env=clean_env(PYTHONPATH=str(ROOT)))
    torchrun(2, worker, tmp_path / "cp2" / "out.json", "2")
    one, two = (json.loads((tmp_path / d / "out.json").read_text()) for d in ("cp1", "cp2"))
    assert len(one["loss"]) == len(two["loss"]) == 3
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-6)
    np.testing.assert_allclose(two["grad_norm"], one["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(two["entropy"], one["entropy"], rtol=1e-5)  # TRL's own metrics, gathered over ranks
    assert two["mean_token_accuracy"] == one["mean_token_accuracy"] and two["num_tokens"] == one["num_tokens"]


# ---------------------------------------------------------------------------- the example on your own data
def test_example_sizes_its_embedded_model_for_your_tokenizer(tmp_path):
    """`examples/finetune_long_context.py --dataset my.jsonl --tokenizer my_tokenizer/` (embedded tiny Llama) built
    the model for the byte tokenizer's 259 ids and failed at the first batch: "input_ids[0, 0] is 288, outside the
    model's input embedding table of 259" (its advice, resize_token_embeddings, is not reachable from the example's
    flags). The embedded model now gets the given tokenizer's vocabulary."""
    pytest.importorskip("datasets")
    import importlib.util

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(300)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "</s>", *words])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>").save_pretrained(
        str(tmp_path / "tok"))
    rng = np.random.default_rng(0)
    (tmp_path / "data.jsonl").write_text("".join(
        json.dumps({"text": " ".join(rng.choice(words, size=int(n)))}) + "\n" for n in rng.integers(0, 60, 20)))
    spec = importlib.util.spec_from_file_location("finetune_long_context_nc45",
                                                  ROOT / "examples" / "finetune_long_context.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parse_args(["--dataset", str(tmp_path / "data.jsonl"), "--tokenizer", str(tmp_path / "tok")])
    train, _, tokenizer = example.load_dataset_and_tokenizer(args)
    model = example.build_model(args, tokenizer)
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows == len(tokenizer) == 302 and max(max(ids) for ids in train["input_ids"] if ids) < rows
    # the embedded corpus with its byte tokenizer: the model as before
    byte_args = example.parse_args([])
    assert example.build_model(byte_args, example.load_dataset_and_tokenizer(
        example.parse_args(["--num_samples", "4"]))[2]).get_input_embeddings().weight.shape[0] == 259


# ---------------------------------------------------------------------------- data with nothing to train
def test_a_dataset_with_no_token_to_train_is_refused_not_trained_at_loss_0():
    datasets = pytest.importorskip("datasets")
    from atac_hf.integrations.data import check_dataset_columns

    ids = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    with pytest.raises(ValueError, match=r"^train_dataset has no token to train: every 'labels' entry of its 3 "
                                         r"row\(s\) is -100, so every loss would be 0.*drop the column"):
        check_dataset_columns(datasets.Dataset.from_dict({"input_ids": ids, "labels": [[-100] * len(x) for x in ids]}),
                              name="train_dataset", targets=True)
    with pytest.raises(ValueError, match=r"every 'assistant_masks' entry of its 3 row\(s\) is 0.*\{% generation %\}"):
        check_dataset_columns(datasets.Dataset.from_dict({"input_ids": ids, "assistant_masks": [[0] * len(x)
                                                                                               for x in ids]}),
                              name="train_dataset", targets=True)
    # some samples without a target (a chat turn of prompt only) are fine: TRL's data has them too
    half = datasets.Dataset.from_dict({"input_ids": ids, "labels": [[-100] * 4, [-100, 10], [-100] * 3]})
    check_dataset_columns(half, name="train_dataset", targets=True)
    check_dataset_columns(half.shuffle(seed=0), name="train_dataset", targets=True)
    check_dataset_columns(datasets.Dataset.from_dict({"input_ids": ids}), name="train_dataset", targets=True)
    # only a training set must have targets: predict's test set (logits) and evaluation sets are not refused
    check_dataset_columns(datasets.Dataset.from_dict({"input_ids": ids, "labels": [[-100] * len(x) for x in ids]}),
                          name="test_dataset")


def test_a_list_of_samples_with_no_token_to_train_is_refused_too():
    """The same refusal for a list of dicts (read row by row until one has a target), which was trained at loss 0."""
    import torch

    from atac_hf.integrations.data import check_dataset_columns

    ids = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    masked = [{"input_ids": x, "labels": [-100] * len(x)} for x in ids]
    with pytest.raises(ValueError, match=r"^train_dataset has no token to train: every 'labels' entry of its 3 "
                                         r"row\(s\) is -100, so every loss would be 0.*drop the column"):
        check_dataset_columns(masked, name="train_dataset", targets=True)
    as_tensors = [{"input_ids": torch.tensor(x), "labels": torch.full((len(x),), -100)} for x in ids]
    with pytest.raises(ValueError, match=r"^train_dataset has no token to train"):
        check_dataset_columns(as_tensors, name="train_dataset", targets=True)
    with pytest.raises(ValueError, match=r"every 'completion_mask' entry of its 3 row\(s\) is 0.*\{% generation %\}"):
        check_dataset_columns([{"input_ids": x, "completion_mask": [0] * len(x)} for x in ids],
                              name="train_dataset", targets=True)
    # one target anywhere, a row without labels (its tokens are targets), no labels at all, or an evaluation set
    check_dataset_columns(masked[:2] + [{"input_ids": ids[2], "labels": [-100, -100, 13]}], name="train_dataset",
                          targets=True)
    check_dataset_columns(masked + [{"input_ids": [1, 2], "labels": None}], name="train_dataset", targets=True)
    check_dataset_columns([{"input_ids": x} for x in ids], name="train_dataset", targets=True)
    check_dataset_columns(masked, name="eval_dataset")
    # the refusal reads no further than the first target: a long list with one up front is read once
    reads = []

    class Rows(list):
        def __getitem__(self, i):
            reads.append(i)
            return list.__getitem__(self, i)

    check_dataset_columns(Rows([{"input_ids": [1, 2], "labels": [1, 2]}] + masked * 1000), name="train_dataset",
                          targets=True)
    assert reads == [0, 0]  # the column names, then the scan


def test_atac_trainer_refuses_a_train_set_without_targets_and_predicts_on_one(tmp_path):
    datasets = pytest.importorskip("datasets")
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from atac_hf import ATACTrainer
    from atac_hf.integrations.demo import tiny_llama_config

    ids = [[1 + (i * 7 + j) % 60 for j in range(n)] for i, n in enumerate([30, 80, 50, 120])]
    masked = datasets.Dataset.from_dict({"input_ids": ids, "labels": [[-100] * len(x) for x in ids]})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(hidden_size=32, num_layers=1, vocab_size=64))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to=[], disable_tqdm=True,
                             save_strategy="no")
    config = ATACConfig(max_tokens=256, cost_preset="default")
    with pytest.raises(ValueError, match=r"^train_dataset has no token to train"):
        ATACTrainer(model=model, args=args, train_dataset=masked, atac_config=config)
    trainer = ATACTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": ids}),
                          atac_config=config)
    trainer.train()
    assert trainer.predict(masked).predictions is not None


# ---------------------------------------------------------------------------- train_loss under CP
@pytest.mark.slow
def test_train_loss_of_steps_never_logged_is_the_world_mean_not_a_rank_share(tmp_path):
    """With logging_steps above the steps run (Trainer's default is 500), Trainer adds the loss since the last log
    to train_loss unreduced: under CP each rank's loss is its shard's share (scaled by the world size), so rank 0
    reported 4.928 and rank 1 6.093 where one process trains 5.510 (the newcomer's script, 4 steps). It is now the
    world's mean, as the logged losses are."""
    worker = ROOT / "tests" / "_newcomer45_sft_worker.py"
    (tmp_path / "cp1").mkdir()
    (tmp_path / "cp2").mkdir()
    run([sys.executable, worker, tmp_path / "cp1" / "out.json", "1", "plain"], env=clean_env(PYTHONPATH=str(ROOT)))
    torchrun(2, worker, tmp_path / "cp2" / "out.json", "2", "plain")
    one = json.loads((tmp_path / "cp1" / "out.json.rank0").read_text())
    ranks = [json.loads((tmp_path / "cp2" / f"out.json.rank{r}").read_text()) for r in (0, 1)]
    for got in ranks:
        assert got["train_loss"] == got["metric"]
        np.testing.assert_allclose(got["train_loss"], one["train_loss"], rtol=1e-6)

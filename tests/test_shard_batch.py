"""shard_batch / doc_lengths_from_batch / build_shift_labels: contents and every user-facing error."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from atac_hf.attention import ShardContext, build_shift_labels, doc_lengths_from_batch, shard_batch
from atac_hf.sharding import plan_shards

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402


def _batch(rows, seed=0):
    return _dist.make_batch(rows, seed)


# ---------------------------------------------------------------------------- document lengths
def test_doc_lengths_sources_agree():
    rows = [[3, 1, 4], [2, 6]]
    b = _batch(rows)
    want = [3, 1, 4, 2, 6]
    assert doc_lengths_from_batch(b).tolist() == want  # seq_lengths (per-row lists)
    no_sl = {k: v for k, v in b.items() if k != "seq_lengths"}
    assert doc_lengths_from_batch(no_sl).tolist() == want  # position_ids restarts
    cu = {**no_sl, "cu_seq_lens_q": torch.tensor([0, 3, 4, 8, 10, 16])}
    assert doc_lengths_from_batch(cu).tolist() == want
    padded = {**no_sl, "seq_lengths": torch.tensor([[3, 1, 4], [2, 6, 0]])}  # trailing zeros = ragged padding
    assert doc_lengths_from_batch(padded).tolist() == want
    one = _batch([[2, 5]])
    assert doc_lengths_from_batch({**one, "seq_lengths": [2, 5]}).tolist() == [2, 5]  # flat list for B=1


def test_fragment_starting_mid_sample_is_one_document():
    """A split sample's fragment starts at a non-zero position: still a document boundary."""
    pos = torch.tensor([[0, 1, 2, 7, 8, 9, 10]])
    b = {"input_ids": torch.zeros(1, 7, dtype=torch.long), "position_ids": pos}
    assert doc_lengths_from_batch(b).tolist() == [3, 4]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=6), min_size=1, max_size=3))
def test_doc_lengths_roundtrip(rows):
    S = max(sum(r) for r in rows)
    rows = [r[:-1] + [r[-1] + S - sum(r)] for r in rows]  # equal row lengths
    b = _batch(rows)
    want = [n for r in rows for n in r]
    assert doc_lengths_from_batch(b).tolist() == want
    assert doc_lengths_from_batch({k: v for k, v in b.items() if k != "seq_lengths"}).tolist() == want


def test_zero_length_documents_rejected():
    b = _batch([[3, 4]])
    with pytest.raises(ValueError, match="document 1 has length 0"):
        doc_lengths_from_batch({**b, "seq_lengths": [[3, 0, 4]]})
    with pytest.raises(ValueError, match="cu_seqlens: document 1 has length 0"):
        doc_lengths_from_batch({"input_ids": b["input_ids"], "cu_seqlens": [0, 3, 3, 7]})


def test_position_ids_disagreeing_with_lengths_name_the_row():
    b = _batch([[3, 4], [5, 2]])
    with pytest.raises(ValueError, match=r"row 1: position_ids disagree with the document lengths at column 5"):
        doc_lengths_from_batch({**b, "seq_lengths": [[3, 4], [7]]})
    bad = b["position_ids"].clone()
    bad[0, 5] = 0  # a restart inside document 1 of row 0
    with pytest.raises(ValueError, match=r"row 0: position_ids disagree .* column 5"):
        doc_lengths_from_batch({**b, "position_ids": bad})


def test_length_errors():
    b = _batch([[3, 4], [5, 2]])
    with pytest.raises(ValueError, match="seq_lengths of row 1 sum to 6, the row has 7"):
        doc_lengths_from_batch({**b, "seq_lengths": [[3, 4], [4, 2]]})
    with pytest.raises(ValueError, match="describes 1 rows, the batch has 2"):
        doc_lengths_from_batch({**b, "seq_lengths": [[3, 4]]})
    with pytest.raises(ValueError, match="cu_seqlens: a document crosses the end of row 0"):
        doc_lengths_from_batch({"input_ids": b["input_ids"], "cu_seqlens": [0, 3, 9, 14]})
    with pytest.raises(ValueError, match="cu_seqlens must run from 0 to 14"):
        doc_lengths_from_batch({"input_ids": b["input_ids"], "cu_seqlens": [0, 3, 9]})
    with pytest.raises(ValueError, match="needs 'input_ids' or 'position_ids'"):
        doc_lengths_from_batch({"labels": b["labels"]})
    with pytest.raises(ValueError, match="'position_ids' has shape"):
        doc_lengths_from_batch({"input_ids": b["input_ids"], "position_ids": torch.zeros(2, 3)})


# ---------------------------------------------------------------------------- labels
def test_shift_labels_on_full_rows():
    labels = torch.tensor([[-100, 11, 12, -100, 21], [-100, 31, 32, 33, 34]])
    got = build_shift_labels(labels, np.array([3, 2, 5]))
    assert got.tolist() == [[11, 12, -100, 21, -100], [31, 32, 33, 34, -100]]


# ---------------------------------------------------------------------------- shard_batch, cp_size 1
def test_shard_batch_cp1_contents():
    rows = [[3, 1, 4], [2, 6]]
    b = _batch(rows)
    b.update(cu_seq_lens_q=torch.tensor([0, 3, 4, 8, 10, 16]), max_length_q=6, seq_idx=torch.zeros(2, 8),
             attention_mask=torch.ones(2, 8), token_type_ids=torch.arange(16).view(2, 8), return_dict=True)
    plan = plan_shards(doc_lengths_from_batch(b), 1)
    out = shard_batch(b, plan, 0)
    for k in ("cu_seq_lens_q", "max_length_q", "seq_idx", "attention_mask", "seq_lengths"):
        assert k not in out
    assert out["input_ids"].shape == (1, 16) and out["input_ids"].tolist()[0] == b["input_ids"].reshape(-1).tolist()
    assert out["token_type_ids"].tolist()[0] == list(range(16))  # other (B, S) tensors are sharded too
    assert out["return_dict"] is True and out["use_cache"] is False
    shift = build_shift_labels(b["labels"], np.array([3, 1, 4, 2, 6])).reshape(1, -1)
    assert torch.equal(out["shift_labels"], shift)
    assert out["num_items_in_batch"] == int((shift != -100).sum())
    assert torch.equal(out["labels"], b["labels"].reshape(1, -1))
    ctx = out["atac_shard"]
    assert isinstance(ctx, ShardContext) and ctx.plan is plan and ctx.rank == 0 and ctx.backend == "sdpa"
    assert ctx.layout.n_local == 16 and not ctx.needs_gather


def test_shard_batch_keeps_given_counts_and_shift_labels():
    b = _batch([[3, 5]])
    shift = torch.arange(8).view(1, 8)
    plan = plan_shards([3, 5], 1)
    out = shard_batch({"input_ids": b["input_ids"], "position_ids": b["position_ids"], "shift_labels": shift,
                       "num_items_in_batch": 123}, plan, 0)
    assert torch.equal(out["shift_labels"], shift) and torch.equal(out["labels"], shift)
    assert out["num_items_in_batch"] == 123
    no_labels = shard_batch({"input_ids": b["input_ids"], "position_ids": b["position_ids"]}, plan, 0)
    assert "labels" not in no_labels and "num_items_in_batch" not in no_labels
    no_pos = shard_batch({"input_ids": b["input_ids"], "seq_lengths": [[3, 5]]}, plan, 0)
    assert no_pos["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]  # never a local arange


def test_shard_batch_errors():
    b = _batch([[3, 5]])
    plan = plan_shards([3, 5], 1)
    with pytest.raises(ValueError, match=r"rank 1 is outside the CP group of size 1 \(legal: 0..0\)"):
        shard_batch(b, plan, 1)
    with pytest.raises(ValueError, match="rank -1 is outside"):
        shard_batch(b, plan, -1)
    with pytest.raises(ValueError, match="the plan covers 9 tokens but the batch has 1 x 8 = 8"):
        shard_batch(b, plan_shards([4, 5], 1), 0)
    with pytest.raises(ValueError, match=r"document lengths \[3, 5\] differ from the plan's \[4, 4\]"):
        shard_batch(b, plan_shards([4, 4], 1), 0)
    with pytest.raises(ValueError, match="attention_mask has padding"):
        shard_batch({**b, "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])}, plan, 0)
    with pytest.raises(ValueError, match=r"'input_ids' must be a \(B, S\) tensor"):
        shard_batch({**b, "input_ids": b["input_ids"][0]}, plan, 0)
    with pytest.raises(ValueError, match="document 0 has length 0"):
        shard_batch({**b, "seq_lengths": [[0, 3, 5]]}, plan, 0)
    with pytest.raises(ValueError, match="row 0: position_ids disagree"):
        shard_batch({**b, "position_ids": torch.arange(8).view(1, 8)}, plan, 0)
    with pytest.raises(ValueError, match="unknown attention backend 'triton'"):
        shard_batch(b, plan, 0, backend="triton")
    if not dist.is_initialized():
        with pytest.raises(ValueError, match="cp_size=2 needs an initialized torch.distributed process group"):
            shard_batch(b, plan_shards([3, 5], 2), 0)

# The multi-process checks of shard_batch (debug digest mismatch, wrong rank, group size)
# run inside the world-2 process group of test_attention_dist.py (one spawn saves ~20 s).

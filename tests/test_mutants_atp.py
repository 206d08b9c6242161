"""Tests that kill the mutmut survivors in ``atac_hf/sharding/atp.py`` (issue 20), on
hand-built plans whose seconds are exact (tile 1, prices of whole seconds).
docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import numpy as np

from atac_hf.cost import CostModel
from atac_hf.sharding import ShardPlan
from atac_hf.sharding.atp import _robustly_no_worse

#: 8 s per token, 1 s per causal pair (times the price factor k in _robustly_no_worse)
CM8 = CostModel(linear_s_per_token=8.0, attn_s_per_pair=1.0, tile=1)


def _hand_plan(lengths, segments) -> ShardPlan:
    return ShardPlan(doc_lengths=np.array(lengths, dtype=np.int64), cp_size=len(segments), strategy="hand",
                     segments=tuple(np.array(s, dtype=np.int64).reshape(-1, 3) for s in segments),
                     gathered_docs=np.zeros(0, dtype=np.int64), rank_compute_s=np.zeros(len(segments)))


# b: rank 0 ten 1-token documents (80 + 10 k s), rank 1 one of 8 tokens (64 + 36 k s).
# a: rank 0 documents of 7, 1 and 1 tokens (72 + 30 k s), rank 1 one token (8 + k s).
# Block times, a against b: k = 0.25: 79.5 / 82.5, 0.5: 87 / 85, 1.5: 117 / 118,
# 2: 132 / 136, 4: 192 / 208. a is worse only at half the attention price.
B = _hand_plan([1] * 10 + [8], [[(i, 0, 1) for i in range(10)], [(10, 0, 8)]])
A = _hand_plan([7, 1, 1, 1], [[(0, 0, 7), (1, 0, 1), (2, 0, 1)], [(3, 0, 1)]])


def test_robustly_no_worse_checks_attention_at_half_its_price():
    """a plan no slower than the other at 0.25x, 2x and 4x (and 1.5x) the attention price but
    slower at 0.5x is not robustly no worse."""
    assert _robustly_no_worse(A, B, CM8) is False
    assert _robustly_no_worse(B, B, CM8) is True


def test_robustly_no_worse_fills_in_the_callers_block_times():
    """``b_blocks`` collects b's block time per price factor as costed: up to the first factor
    where a is worse (0.5x), every factor where a is no worse throughout; without it the check
    runs all the same."""
    got: dict = {}
    assert _robustly_no_worse(A, B, CM8, got) is False
    assert got == {0.25: 82.5, 0.5: 85.0}
    got = {}
    assert _robustly_no_worse(B, B, CM8, got) is True
    assert got == {0.25: 82.5, 0.5: 85.0, 2.0: 136.0, 4.0: 208.0}
    # costed once: a cached block time is used as given (here a made-up one that a beats)
    assert _robustly_no_worse(A, B, CM8, {0.25: 82.5, 0.5: 87.0, 2.0: 136.0, 4.0: 208.0}) is True


def test_head_tail_flat_segments_and_ranks_of_two_documents():
    """Docs 0 (8 tokens) and 1 (3 tokens) head-tail over 2 ranks, bounds [0, 2, 4, 6, 8] and
    [0, 1, 2, 2, 3] (doc 1's remainder: rank 0 gets 2 tokens, rank 1 one, rank 1's tail chunk
    empty): every rank's head chunk first, then the tails; empty chunks dropped."""
    from atac_hf.sharding.atp import _head_tail_flat
    from atac_hf.sharding.segments import head_tail_bounds

    bounds = head_tail_bounds(np.array([8, 3]), 2)
    assert bounds.tolist() == [[0, 2, 4, 6, 8], [0, 1, 2, 2, 3]]
    seg, rank = _head_tail_flat(np.array([0, 1]), bounds, 2)
    assert seg.dtype == np.int64
    assert seg.tolist() == [[0, 0, 2], [0, 2, 4], [1, 0, 1], [1, 1, 2], [0, 6, 8], [0, 4, 6], [1, 2, 3]]
    assert rank.tolist() == [0, 1, 0, 1, 0, 1, 0]

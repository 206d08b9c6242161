"""Tests that kill the mutmut survivors in ``atac_hf/sharding/api.py`` (issue 20):
``plan_shards``' refusals show the offending value cut short (huge ints as their bit count,
long reprs cut at 57 characters, objects by their type name), with the whole message matched.
docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import re

import pytest

from atac_hf.sharding import plan_shards

CP_MSG = "cp_size must be an int >= 1 and <= 4096 (MAX_CP_SIZE), got {} (set cp_size in the ATAC config / --cp-size)"


@pytest.mark.parametrize("cp_size, shown", [
    (10**30, "1" + "0" * 30),  # the largest int shown in full
    (10**30 + 1, "<int of 100 bits>"),
    (10**31, "<int of 103 bits>"),
    ([2], "<list>"),  # not a number or string: its type
    ("a" * 58, "'" + "a" * 58 + "'"),  # a 60-character repr, shown whole
    ("a" * 59, "'" + "a" * 56 + "..."),  # 61 characters: cut to 57 and "..."
])
def test_plan_shards_shows_a_bad_cp_size_cut_short(cp_size, shown):
    """The refused cp_size appears in the message in its short form: in full up to 10**30 and
    60 characters, else as a bit count or cut, and as its type name when it is no scalar."""
    with pytest.raises(ValueError, match="^" + re.escape(CP_MSG.format(shown)) + "$"):
        plan_shards([1], cp_size)


# ---------------------------------------------------------------------------- plan_shards (fifth pass)

def _refused(exc, message, *args, **kw):
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        plan_shards(*args, **kw)


def test_plan_shards_refusals_name_the_setting_whole_message():
    _refused(ValueError, "unknown sharding strategy 'nope'; legal values: ['atp', 'contiguous', 'per_doc', "
             "'wlb_adaptive', 'zigzag'] (set sharding_strategy)", [4, 4], 2, "nope")
    _refused(ValueError, "unknown sharding strategy ['atp']; legal values: ['atp', 'contiguous', 'per_doc', "
             "'wlb_adaptive', 'zigzag'] (set sharding_strategy)", [4, 4], 2, ["atp"])  # unhashable
    for v, shown in ((0, "0"), (2**62 + 1, "4611686018427387905"), (True, "True"), (2.0, "2.0")):
        _refused(ValueError, f"max_tokens_per_rank must be >= 1 or None (an int), at most 2**62, got {shown} "
                 "(set max_tokens_per_rank)", [4, 4], 2, max_tokens_per_rank=v)
        _refused(ValueError, f"min_chunk must be >= 1 (an int), at most 2**62, got {shown} (set min_chunk)",
                 [4, 4], 2, min_chunk=v)
    for v, shown in ((-1, "-1"), (1.0, "1.0"), (True, "True")):
        _refused(ValueError, f"max_anchors must be an int >= 0 or None, got {shown}", [4, 4], 2, max_anchors=v)
    for v, shown in (("x", "'x'"), (3, "3"), ("ALL_GATHER", "'ALL_GATHER'")):
        _refused(ValueError, "kv_exchange must be None or one of ['auto', 'all_gather', 'all_to_all'], got "
                 f"{shown} (set kv_exchange)", [4, 4], 2, kv_exchange=v)
    _refused(TypeError, "cost_model must be a CostModel or None, got int", [4, 4], 2, cost_model=3)
    _refused(ValueError, "strategy 'contiguous' puts 2 tokens on one rank, over max_tokens_per_rank=1 (4 tokens "
             "over cp_size=2); raise the cap, raise cp_size or pack fewer tokens", [4], 2, "contiguous",
             max_tokens_per_rank=1)


def test_plan_shards_accepts_the_edges_of_every_setting():
    from atac_hf.sharding.api import MAX_CP_SIZE

    assert plan_shards([4, 4], 2, max_tokens_per_rank=4).rank_num_tokens().tolist() == [4, 4]
    assert plan_shards([1, 1], 2, max_tokens_per_rank=1).rank_num_tokens().tolist() == [1, 1]
    assert plan_shards([4, 4], 2, max_tokens_per_rank=2**62, min_chunk=2**62).cp_size == 2
    assert plan_shards([4, 4], 2, max_anchors=0).cp_size == 2
    assert plan_shards([4], 1).cp_size == 1
    assert plan_shards([1], MAX_CP_SIZE).cp_size == MAX_CP_SIZE
    for ex in ("auto", "all_gather", "all_to_all"):
        assert plan_shards([4, 4], 2, kv_exchange=ex).cp_size == 2


def test_plan_shards_segment_budget_is_inclusive(monkeypatch):
    """min(L, 2 C) chunks per document: [4, 4] at cp 2 is 8, within a budget of 8; [4, 4, 1] is 9."""
    from atac_hf.sharding import api

    monkeypatch.setattr(api, "MAX_PLAN_SEGMENTS", 8)
    assert plan_shards([4, 4], 2).cp_size == 2
    assert plan_shards([5, 9], 2).cp_size == 2
    _refused(ValueError, "planning 3 documents (9 tokens) over cp_size=2 means up to 9 segments, more than 8 "
             "(MAX_PLAN_SEGMENTS): pack fewer tokens per row or lower cp_size", [4, 4, 1], 2)


def test_plan_shards_kv_exchange_reprices_the_plan_only_where_it_differs():
    from atac_hf.cost import CostModel

    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=1.0)
    base = plan_shards([8], 2, cost_model=cm)
    for ex in ("all_gather", "all_to_all"):
        got = plan_shards([8], 2, cost_model=cm, kv_exchange=ex)
        assert got.kv_exchange == ex
        assert [s.tolist() for s in got.segments] == [s.tolist() for s in base.segments]
    assert plan_shards([8], 2, "zigzag", cm).kv_exchange == "all_gather"  # the baselines' own
    assert plan_shards([8], 2, "zigzag", cm, kv_exchange="all_to_all").kv_exchange == "all_to_all"


def test_plan_shards_names_the_setting_of_a_model_that_prices_nothing():
    from atac_hf.cost import CostModel

    _refused(ValueError, "cost model 'custom' prices all work at 0 s (linear_s_per_token, attn_s_per_pair and "
             "segment_overhead_s are 0): every plan would look balanced, whatever its tokens; use a calibrated "
             "profile (`atac-hf calibrate`) or a preset (check cost_model / cost_profile / --profile)",
             [4, 4], 2, cost_model=CostModel(linear_s_per_token=0.0, attn_s_per_pair=0.0))


@pytest.mark.usefixtures("no_contiguous_candidate")
def test_plan_shards_passes_its_options_to_atp_and_fills_an_idle_rank():
    """A 4-token document over 2 ranks at 1 s a token and a pair and 100 s a kernel call (the
    plan_atp cases of test_mutants_plan_atp.py): min_chunk 1 (the default) splits it head-tail
    (207 s); min_chunk 2 or max_anchors 0 keep it whole on rank 0, which the fill then cuts
    [0, 2) + [2, 4) (rank 1: 2 tokens, 7 pairs, one call: 109 s; the per_doc candidate, filled,
    is no faster); a cap of 3 makes atp split it again."""
    from atac_hf.cost import CostModel

    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, segment_overhead_s=100.0, tile=1)
    split, filled = [[[0, 0, 1], [0, 3, 4]], [[0, 1, 3]]], [[[0, 0, 2]], [[0, 2, 4]]]
    for kw, want, block in ((dict(), split, 207.00002), (dict(min_chunk=2), filled, 109.00002),
                            (dict(max_anchors=0), filled, 109.00002),
                            (dict(min_chunk=2, max_tokens_per_rank=3), split, 207.00002)):
        got = plan_shards([4], 2, "atp", cm, **kw)
        assert [s.tolist() for s in got.segments] == want, kw
        assert got.block_time_s == pytest.approx(block, rel=1e-12) and got.strategy == "atp"
    # max_anchors 0 on an 8-token document: whole, then filled 4 + 4 (130 s), not split (222 s)
    got = plan_shards([8], 2, "atp", cm, max_anchors=0)
    assert [s.tolist() for s in got.segments] == [[[0, 0, 4]], [[0, 4, 8]]]
    assert [s.tolist() for s in plan_shards([8], 2, "atp", cm).segments] == [[[0, 0, 2], [0, 6, 8]], [[0, 2, 6]]]


def test_plan_shards_kv_exchange_keeps_the_plans_strategy_and_gathered_documents():
    from atac_hf.cost import CostModel

    cm = CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=1.0, link_bandwidth=1.0)
    base = plan_shards([8], 2, cost_model=cm)
    assert base.block_time_s == pytest.approx(30.00002, rel=1e-12)  # the given model's seconds
    got = plan_shards([8], 2, cost_model=cm, kv_exchange="all_to_all")
    assert (got.strategy, got.kv_exchange, got.gathered_docs.tolist()) == ("atp", "all_to_all", [0])
    assert got.block_time_s == pytest.approx(30.00002, rel=1e-12)
    got = plan_shards([8, 1], 2, "zigzag", cm, kv_exchange="all_to_all")
    assert (got.strategy, got.kv_exchange) == ("zigzag", "all_to_all")
    assert got.gathered_docs.tolist() == plan_shards([8, 1], 2, "zigzag", cm).gathered_docs.tolist()



def _cm_link(kv=1.0):
    """1 s a token and a pair, K/V at ``kv`` bytes a token over a 1 byte/s link."""
    from atac_hf.cost import CostModel

    return CostModel(linear_s_per_token=1.0, attn_s_per_pair=1.0, tile=1, kv_bytes_per_token=kv, link_bandwidth=1.0)


@pytest.mark.usefixtures("no_contiguous_candidate")
@pytest.mark.parametrize("cap", [None, 3, 4, 6])
def test_plan_shards_takes_the_filled_per_doc_plan_where_it_beats_atps_filled_plan(cap):
    """Documents 4 and 6 over 5 ranks, min_chunk 2 (neither is an anchor candidate: 4 and 6 < 20):
    atp keeps them whole and leaves ranks idle; filled, its plan takes 26.00008 s, the per_doc
    layout filled the same way 25.00008 s (priced with the all-to-all), and holds 3 tokens at most:
    taken, also under a cap of exactly 3 (where atp splits them itself) and of 6 (where it need not)."""
    got = plan_shards([4, 6], 5, "atp", _cm_link(), min_chunk=2, max_tokens_per_rank=cap)
    assert [s.tolist() for s in got.segments] == [[[0, 0, 1], [1, 0, 1], [1, 5, 6]], [[0, 1, 2], [1, 1, 2]],
                                                  [[0, 2, 3], [1, 2, 3]], [[0, 3, 4], [1, 3, 4]], [[1, 4, 5]]]
    assert (got.strategy, got.kv_exchange) == ("atp", "all_to_all")
    assert got.block_time_s == pytest.approx(25.00008, rel=1e-12)


def test_plan_shards_fills_a_baselines_idle_rank_without_the_atp_candidate():
    """per_doc of documents 2, 1, 1, 1 over 3 ranks leaves a rank idle; filled, it keeps its strategy
    and all-gather: the filled per_doc candidate priced with the all-to-all (about a third of the
    time here) is compared for atp only."""
    got = plan_shards([2, 1, 1, 1], 3, "per_doc", _cm_link(100.0))
    assert [s.tolist() for s in got.segments] == [[[0, 0, 1], [1, 0, 1]], [[0, 1, 2]], [[2, 0, 1], [3, 0, 1]]]
    assert (got.strategy, got.kv_exchange) == ("per_doc", "all_gather")

"""Forty-first mutation pass: survivors of mutants planted by hand in the session's ``even_batches`` re-cut
(:mod:`atac_hf.packing.data.even_out`), the window planner's reserve, the wfap end's lookahead and the model
check's sub-configs.

Killed here, in process: :func:`even_out` merging the two smallest packs before it repacks (step 2 before 3), also
two that fill the cap exactly, a merged pack again, into the first one's place; first-fit decreasing taking a pack
a document fills exactly, one pack per document among the counts, fragments rejoined up to the cap inclusive and
never over it; cutting fragments >= ``min_fragment`` (a whole sample if need be) before fragments below it under
``overlength="split"`` (step 4 before 5); re-cutting into the multiple below where it is exactly
``ceil(tokens / max_tokens)`` packs, its runs taking the extra tokens first (step 6); :meth:`_Cutter.split_to`
cutting the sample it cut before another, the longest whole sample when no fragment is left, the costliest pack of
several documents first (after a split too), dealing its documents largest first to the lighter half;
:func:`_warn_cut` not naming a sample that was in fragments before; :func:`_coalesce` joining only spans that meet;
:meth:`WindowPlanner._emit`'s reserve stopping at ``num_replicas - 1`` spare documents (none without
``even_batches``); :func:`rest_fits_window` counting each sample over half the cap once over its blocks; and
:func:`sub_configs` listing the sub-configs of a config with several text
configs (and no ``None``), a config that is its own text config once, and each public config-valued field (with
``to_dict`` and ``model_type``) of the config and its text config once.
"""

from __future__ import annotations

import warnings
from collections import Counter
from types import SimpleNamespace

import numpy as np

from atac_hf.attention.compat import sub_configs
from atac_hf.attention.model_check import router_loss_refusal
from atac_hf.cost import CostModel
from atac_hf.packing import PackingConfig, SampleCutWarning
from atac_hf.packing.data.even_out import even_out
from atac_hf.packing.data.window_planner import WindowPlanner
from atac_hf.packing.metrics import pack_costs
from atac_hf.packing.planners.wfap_end import rest_fits_window

LINEAR = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.0, tile=1)


def _even_out(packs, cap, R, num_batches=0, **kw):
    config = PackingConfig(max_tokens=cap, packs_per_window=R, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = even_out(packs, num_batches=num_batches, num_replicas=R, config=config,
                       pack_cost=lambda p: float(pack_costs([p], LINEAR)[0]),
                       pack_costs=lambda ps: pack_costs(ps, LINEAR).tolist())
    cut = [w for w in caught if issubclass(w.category, SampleCutWarning)]
    assert Counter((s, t) for p in out for s, a, e in p for t in range(a, e)) == Counter(
        (s, t) for p in packs for s, a, e in p for t in range(a, e))  # every token once
    return out, cut


# ---------------------------------------------------------------------------- even_out's steps
def test_the_two_smallest_packs_merge_before_the_documents_are_repacked():
    # kills E04: the merge step dropped: first-fit decreasing packs [6, 4] [5, 3], then splits one of them again
    # to reach 3 packs; the merge of the two smallest (4 + 3) gets there moving one document
    out, cut = _even_out([[(0, 0, 6)], [(1, 0, 5)], [(2, 0, 4)], [(3, 0, 3)]], 10, 3)
    assert out == [[(0, 0, 6)], [(1, 0, 5)], [(2, 0, 4), (3, 0, 3)]] and not cut


def test_split_cuts_a_whole_sample_into_fragments_over_min_fragment_before_a_fragment_below_it():
    # kills E06: `overlength == "split"` -> `!=` (step 4 skipped under "split"): the 4-token fragment of the
    # overlength sample 0 was halved into 2 + 2, below min_fragment=3; step 4 halves sample 1 into 4 + 4 (warned)
    out, cut = _even_out([[(0, 4, 8)], [(1, 0, 8)]], 8, 3, min_fragment=3)
    assert out == [[(0, 4, 8)], [(1, 0, 4)], [(1, 4, 8)]]
    assert len(cut) == 1 and "ids [1]" in str(cut[0].message)


def test_the_packs_are_recut_into_the_multiple_below_where_it_is_exactly_the_fewest_that_hold_the_tokens():
    # kills E08: `down >= ceil(total / cap)` -> `>`: 3 packs of 2 tokens at cap 3 after 3 batches on 5 replicas
    # (7 packs need more than 6 tokens, 2 + 2 do not merge): 2 packs of 3 tokens, not a ValueError
    out, cut = _even_out([[(0, 0, 2)], [(1, 0, 2)], [(2, 0, 2)]], 3, 5, num_batches=3)
    assert out == [[(0, 0, 2), (1, 0, 1)], [(1, 1, 2), (2, 0, 2)]] and len(cut) == 1


def test_two_packs_that_fill_the_cap_exactly_merge():
    # kills E28: `ta + tb > cap` -> `>=`: 1 + 1, then 2 + 2 = 4 at cap 4 was refused and the documents repacked
    # ([2, 2] [1, 1, 1]); the merge keeps the pack [2, 1] as it was
    packs = [[(0, 0, 2)], [(1, 0, 2), (2, 0, 1)], [(3, 0, 1)], [(4, 0, 1)]]
    out, cut = _even_out(packs, 4, 4, num_batches=2)
    assert out == [[(0, 0, 2), (3, 0, 1), (4, 0, 1)], [(1, 0, 2), (2, 0, 1)]] and not cut


def test_the_merged_pack_takes_the_first_ones_place():
    # kills E29: `a, b = min(a, b), max(a, b)` dropped: the 3 + 4 took the place of the 3 (the fewest tokens, last)
    out, cut = _even_out([[(0, 0, 4)], [(1, 0, 6)], [(2, 0, 3)]], 10, 2)
    assert out == [[(0, 0, 4), (2, 0, 3)], [(1, 0, 6)]] and not cut


def test_a_merged_pack_can_merge_again():
    # kills E30: the merged pack not pushed back: 1 + 1 could not take the third 1, which went with the 5
    out, cut = _even_out([[(0, 0, 1)], [(1, 0, 1)], [(2, 0, 1)], [(3, 0, 5)]], 10, 4, num_batches=2)
    assert out == [[(0, 0, 1), (1, 0, 1), (2, 0, 1)], [(3, 0, 5)]] and not cut


# ---------------------------------------------------------------------------- _repack / _coalesce(cap)
def test_fragments_that_fill_the_cap_exactly_are_rejoined_into_one_pack_per_document():
    # kills E34 (one pack per document left out of the counts: the only allowed count, so the samples were cut
    # into fragments), E37 (`end - start <= cap` -> `<`: the 8 + 4 of sample 0 at cap 12 not rejoined) and E39
    # (no rejoining at all): 2 packs, each sample whole again
    out, cut = _even_out([[(0, 8, 12), (1, 0, 1)], [(0, 0, 8)], [(1, 1, 10)]], 12, 4, num_batches=2)
    assert out == [[(0, 0, 12)], [(1, 0, 10)]] and not cut

def test_first_fit_takes_a_pack_the_document_fills_exactly():
    # kills E33: `room >= size` -> `>`: the 1s and the 2 that fill a pack's room exactly opened packs of their own,
    # the repacked count rose past the multiple and sample 0 (it fits the cap) was cut; 4 packs, nothing cut
    packs = [[(0, 0, 5)], [(1, 0, 5), (2, 4, 5)], [(3, 0, 2)], [(4, 0, 4), (5, 0, 1), (6, 0, 1)], [(7, 0, 5)]]
    out, cut = _even_out(packs, 6, 5, num_batches=1, min_fragment=2, overlength="truncate")
    assert out == [[(0, 0, 5), (2, 4, 5)], [(1, 0, 5), (5, 0, 1)], [(6, 0, 1), (7, 0, 5)], [(3, 0, 2), (4, 0, 4)]]
    assert not cut



def test_fragments_are_not_rejoined_over_the_cap():
    # kills E38: the cap clause dropped from `_coalesce_fitting` (now `_coalesce(spans, cap)`): sample 0's
    # fragments (12 tokens at cap 6) joined into one document and a pack of 12 tokens
    out, cut = _even_out([[(0, 0, 6)], [(0, 6, 12)], [(1, 0, 5)], [(2, 0, 5)]], 6, 3)
    assert max(sum(e - s for _, s, e in p) for p in out) <= 6 and len(out) == 6 and not cut
    # since the repack's lower bound (the exact search), that case no longer reaches the repack with a count;
    # this one does (after 1 batch, 2 replicas): the mutant deals sample 0 whole, 7 tokens at cap 4
    out, cut = _even_out([[(0, 0, 4)], [(0, 4, 7)], [(1, 0, 3)], [(2, 0, 3)], [(3, 0, 4)], [(4, 0, 3)]], 4, 2, 1)
    assert max(sum(e - s for _, s, e in p) for p in out) <= 4


# ---------------------------------------------------------------------------- _Cutter.split_to
def test_the_first_half_of_a_cut_sample_is_a_fragment_to_cut_before_another_sample():
    # kills E22 (`split.add(sid)` dropped) and E17 (`not in split` dropped from `whole`): the first half (0, 0, 2)
    # of the cut sample 0 starts at 0 and read as a whole sample, so sample 1 was cut too; the fragments of sample 0
    # give the 5 packs on their own
    out, cut = _even_out([[(0, 0, 4)], [(1, 0, 4)]], 4, 5)
    assert sorted(s for p in out for s in p) == [(0, 0, 1), (0, 1, 2), (0, 2, 3), (0, 3, 4), (1, 0, 4)]
    assert len(cut) == 1 and "ids [0]" in str(cut[0].message)


def test_the_longest_whole_sample_is_halved_when_no_fragment_is_left():
    # kills E18: the single-document heap keyed on +tokens (the shortest first): the 4 was cut into 2 + 2, two
    # fragments of half the length the 8's halves have
    out, cut = _even_out([[(0, 0, 8)], [(1, 0, 4)]], 8, 3)
    assert out == [[(0, 0, 4)], [(1, 0, 4)], [(0, 4, 8)]] and len(cut) == 1


def test_a_pack_is_halved_dealing_its_documents_largest_first_to_the_lighter_half():
    # kills E20: the documents dealt shortest first: [2, 5] [3] (7 and 3 tokens) for [5] [3, 2] (5 and 5)
    out, cut = _even_out([[(0, 0, 5), (1, 0, 3), (2, 0, 2)]], 10, 2)
    assert out == [[(0, 0, 5)], [(1, 0, 3), (2, 0, 2)]] and not cut


def test_the_costliest_pack_of_several_documents_is_split_first_also_after_a_split():
    # kills E25 (the initial heap keyed on +cost: the cheap [2, 2] split first) and E26 (a half pushed back on +cost:
    # the [5, 1] half waited behind [2, 2]): [5, 5, 1] -> [5, 1] [5], then [5, 1] (6) before [2, 2] (4)
    out, cut = _even_out([[(0, 0, 5), (1, 0, 5), (2, 0, 1)], [(3, 0, 2), (4, 0, 2)]], 12, 4)
    assert out == [[(0, 0, 5)], [(3, 0, 2), (4, 0, 2)], [(1, 0, 5)], [(2, 0, 1)]] and not cut


# ---------------------------------------------------------------------------- _warn_cut / _recut / _coalesce
def test_no_warning_names_a_sample_that_was_in_fragments_before():
    # kills E41: `not in split` dropped from the whole samples: sample 0 (over the cap, in two fragments, the first
    # from token 0) was named as a sample that fits the cap and was cut
    out, cut = _even_out([[(0, 0, 8)], [(0, 8, 16)], [(1, 0, 8)]], 8, 2)
    assert out == [[(0, 0, 4)], [(0, 8, 16)], [(1, 0, 8)], [(0, 4, 8)]] and not cut


def test_the_recut_runs_take_the_extra_tokens_first():
    # kills E42 (the first run without its extra token) and E43 (`len(out) < extra` -> `<=`: one run too many
    # with one): 8 tokens into 3 runs of 3, 3, 2 (7 and 9 tokens of room left one token over: an AssertionError)
    out, cut = _even_out([[(i, 0, 2)] for i in range(4)], 3, 6, num_batches=3)
    assert out == [[(0, 0, 2), (1, 0, 1)], [(1, 1, 2), (2, 0, 2)], [(3, 0, 2)]] and len(cut) == 1


def test_merged_fragments_of_one_sample_that_do_not_meet_stay_two_spans():
    # kills E44: `_coalesce` joined spans of one sample that do not meet end to start: (0, 0, 3) + (0, 6, 9)
    # became (0, 0, 9), the 3..6 twice (the token check raised)
    out, cut = _even_out([[(0, 0, 3)], [(0, 6, 9)], [(0, 3, 6)], [(1, 0, 5)]], 9, 3)
    assert out == [[(0, 0, 3), (0, 6, 9)], [(0, 3, 6)], [(1, 0, 5)]] and not cut


# ---------------------------------------------------------------------------- WindowPlanner._emit's reserve
def _planner(even_batches: bool = True) -> WindowPlanner:
    config = PackingConfig(max_tokens=8, packs_per_window=16, strategy="sequential")
    return WindowPlanner(config, None, window_size=None, num_replicas=3, even_batches=even_batches)


def test_the_reserve_stops_at_num_replicas_minus_one_spare_documents():
    # kills W01/W02 (`want` = R - 2 / R), W03 (`spare < want` -> `<=`), W05 (`spare` counting documents, not
    # documents over packs), W06 (`or` -> `and`: the tokens alone), W09 (the spare rule dropped: 4 packs per
    # replica held) and W07 (a reserve without even_batches): 16 packs of two 4s on 3 replicas hold back the last
    # 2 (8 tokens >= 6, and 2 documents over the packs)
    planner = _planner()
    released = planner.add(list(range(32)), [4] * 32)
    assert len(released) == 14 and [len(p) for p in planner.reserve] == [2, 2]
    planner = _planner(even_batches=False)
    assert len(planner.add(list(range(32)), [4] * 32)) == 16 and planner.reserve == []


# ---------------------------------------------------------------------------- wfap_end.rest_fits_window
def test_the_rest_counts_each_big_sample_once_over_its_blocks():
    # kills F06 (each block of 4096 samples counting the big samples of the whole rest: 250 samples over half the
    # cap counted twice, 500 > 400 packs); 250 of them fit a window of 400 packs, 401 do not (the tokens would)
    config = PackingConfig(max_tokens=32, packs_per_window=400)
    lengths = np.ones(4097, dtype=np.int64)  # two blocks
    lengths[:250] = 17
    assert rest_fits_window(config, lengths)
    lengths[:401] = 17
    assert lengths.sum() < config.window_tokens and not rest_fits_window(config, lengths)


# ---------------------------------------------------------------------------- compat.sub_configs
class _Sub(SimpleNamespace):
    model_type = "sub"

    def to_dict(self):
        return dict(self.__dict__)


class _SeveralTextConfigs(SimpleNamespace):  # musicgen's get_text_config: ambiguous, raises
    def get_text_config(self):
        raise ValueError("Multiple valid text configs were found in the model config")


class _ItsOwnTextConfig(SimpleNamespace):  # a decoder-only config: get_text_config() returns itself
    def get_text_config(self):
        return self


def test_a_config_with_several_text_configs_lists_its_sub_configs_and_no_none():
    # kills M01 (the ValueError leaves `nested` off: the decoder's own router flag was never read) and M10 (`text is
    # not None` dropped: None listed as a config)
    cfg = _SeveralTextConfigs(output_router_logits=False, decoder=_Sub(output_router_logits=True,
                                                                         router_aux_loss_coef=0.5))
    assert sub_configs(cfg) == [cfg, cfg.decoder]
    refused = router_loss_refusal(cfg)
    assert refused is not None and "(config.output_router_logits=True, router_aux_loss_coef=0.5)" in refused[1]


def test_a_config_that_is_its_own_text_config_is_listed_once():
    # kills M02: `text is not config` dropped: every decoder-only config was listed twice (each rule read twice)
    cfg = _ItsOwnTextConfig(sliding_window=4)
    assert sub_configs(cfg) == [cfg] and sub_configs(cfg, nested=True) == [cfg]



class _Composite(SimpleNamespace):  # Llama 4 style: the text config is a field of the config
    def get_text_config(self):
        return self.text_config


class _ToDictOnly:  # a quantization config: to_dict, no model_type
    def to_dict(self):
        return {}


def test_nested_lists_each_public_config_valued_field_of_the_config_and_its_text_config_once():
    # kills M04 (a private field read), M05 (a field with to_dict and no model_type read), M06 (`v not in out`
    # dropped: the text config listed again as the config's field), M07 (only the top config's fields: the text
    # config's ffn config missed) and M11 (a field with a model_type and no to_dict read)
    text = _Sub(ffn=_Sub(moe_loss_weight=0.01))
    cfg = _Composite(text_config=text, _parent=_Sub(x=1), quantization_config=_ToDictOnly(),
                     tagged=SimpleNamespace(model_type="tag"))
    assert sub_configs(cfg) == [cfg, text]
    got = sub_configs(cfg, nested=True)
    assert len(got) == 3 and got[0] is cfg and got[1] is text and got[2] is text.ffn

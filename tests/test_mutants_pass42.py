"""Forty-second mutation pass: survivors of mutmut and hand-planted mutants in what came after the forty-first: the
``even_batches`` re-cut's bounded exact search (:func:`even_out._fit`, its call in ``_repack``, ``SEARCH_NODES`` /
``SEARCH_DOCS``), :func:`sub_configs` and its call sites, and the gloo drain of ``_hf_compat`` (items 6 and 8).

Killed here, in process: the search placing each document at most ``SEARCH_NODES`` times in all (found with exactly
the placements it needs, given up one short), pruning a state with fewer documents left than empty packs and trying
one pack per distinct load (a budget that is enough only with both), never returning a packing with an empty pack,
reading a fragment's length as ``end - start`` (in the search and in first-fit decreasing), and first-fit decreasing
taking a pack a document fills exactly; no search above ``SEARCH_DOCS`` documents (256 are searched, 257 are not);
``release_groups_after_shutdown`` dropping Accelerate's ``device_mesh`` and ``parallelism_config`` (both states) and
collecting the cycles they leave; ``drain_gloo_workers`` sleeping in 10 ms steps until its own ``seconds`` (a fake
clock: no wall-clock assertion); ``track_group_holder`` registering the exit hook once; the model rules reading the
config and its text config, where a text row runs, and not a vision tower's or a talker's config.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import accelerate.state as acc_state
import pytest
from test_mutants_pass41 import _even_out

from atac_hf.attention import model_check
from atac_hf.attention.model_check import config_refusal, static_refusal
from atac_hf.attention.model_probe import ProbeResult
from atac_hf.attention.runtime import check_model_supported
from atac_hf.integrations import _hf_compat
from atac_hf.packing.data import even_out as even_out_mod
from atac_hf.packing.data.even_out import _fit


def _docs(sizes):
    return [(i, 0, n) for i, n in enumerate(sizes)]


# ---------------------------------------------------------------------------- _fit's budget
def test_the_search_stops_after_exactly_search_nodes_placements(monkeypatch):
    """Kills ``_fit`` mutmut 20 (``or tried and budget <= 0``: the budget ignored for a load not tried yet), 26
    (``budget < 0``), 27 (``budget <= 1``), 30 (``budget = 1``), 31 (``budget += 1``) and 33 (``budget -= 2``).

    The bound is what keeps a pass's end from hanging on a bin-packing instance (NP-hard): ``[7, 5, 3, 3, 2, 2]``
    into 2 packs of 11 takes the depth-first search 11 placements; with 11 it finds ``[7, 2, 2] [5, 3, 3]``, with 10
    it gives up (``None``), and a search whose bound is off by one, never reached or spent twice as fast does not."""
    docs = _docs([7, 5, 3, 3, 2, 2])
    monkeypatch.setattr(even_out_mod, "SEARCH_NODES", 11)
    assert _fit(docs, 11, 2) == [[(0, 0, 7), (4, 0, 2), (5, 0, 2)], [(1, 0, 5), (2, 0, 3), (3, 0, 3)]]
    monkeypatch.setattr(even_out_mod, "SEARCH_NODES", 10)
    assert _fit(docs, 11, 2) is None


def test_the_search_prunes_empty_packs_it_cannot_fill_and_tries_each_load_once(monkeypatch):
    """Kills ``_fit`` mutmut 10 (``len(docs) + k < ...``) and 12 (``count(None)``): the prune of a state with fewer
    documents left than empty packs disabled; 13 (``count(1)``: packs holding 1 token counted as empty); 29
    (``tried.add(None)``: every pack tried again whatever its load); 11 (``<=``: a state with exactly as many
    documents left as empty packs pruned, though each document then opens one); 14 (``return True`` where it prunes:
    a "packing" with empty packs).

    Both prunes are what lets the bounded search reach a packing at all on realistic passes. Three 1-token documents
    into 3 packs: 5 placements with the prune (the first document alone, the second tried next to it, pruned, then
    alone, the third likewise), more without; the 22 documents below into 4 packs of 67: 1,004 placements with one
    try per distinct load, 1,485 without."""
    ones = _docs([1, 1, 1])
    assert _fit(ones, 3, 3) == [[(0, 0, 1)], [(1, 0, 1)], [(2, 0, 1)]]  # 11, 14: one document per pack, none empty
    monkeypatch.setattr(even_out_mod, "SEARCH_NODES", 5)
    assert _fit(ones, 3, 3) == [[(0, 0, 1)], [(1, 0, 1)], [(2, 0, 1)]]  # 10, 12, 13: not within 5 placements
    hard = _docs([27, 25, 25, 24, 19, 18, 17, 14, 12, 12, 12, 8, 8, 8, 7, 6, 6, 5, 5, 4, 3, 3])
    monkeypatch.setattr(even_out_mod, "SEARCH_NODES", 1004)
    out = _fit(hard, 67, 4)  # 29
    assert out is not None and len(out) == 4 and all(0 < sum(e - s for _, s, e in p) <= 67 for p in out)
    assert sorted(s for p in out for s in p) == hard


def test_the_documented_search_bounds():
    """Kills the hand-planted ``SEARCH_NODES`` 20,000 -> 20,001 / 19,999 / 0 and ``SEARCH_DOCS`` 256 -> 0 (the last
    two also by the other tests): docs/TESTING.md's forty-first pass and ``_repack``'s docstring state 20,000
    placements per count and up to 256 documents; the bounds trade a pass-end's time against a whole count found."""
    assert even_out_mod.SEARCH_NODES == 20_000 and even_out_mod.SEARCH_DOCS == 256


def test_the_searchs_packs_list_their_spans_in_sample_order():
    """Kills the hand-planted ``return [sorted(p) for p in out]`` -> ``return out`` in ``_fit``: every step of the
    re-cut returns each pack's spans in sample order (``split_to``, first-fit decreasing), so a pack's layout in the
    batch does not depend on which step made it. The forty-first pass's repro with the sample ids reversed: the
    search fills its packs largest first (7, 2, 2), and lists them by sample id."""
    packs = [[(5 - i, 0, n)] for i, n in enumerate([7, 5, 3, 3, 2, 2])]
    out, cut = _even_out(packs, 11, 5, num_batches=3)
    assert out == [[(0, 0, 2), (1, 0, 2), (5, 0, 7)], [(2, 0, 3), (3, 0, 3), (4, 0, 5)]] and not cut


# ---------------------------------------------------------------------------- fragments
def test_the_search_places_a_fragment_by_its_length():
    """Kills ``_fit`` mutmut 16 (``size = end + start``): tokens 20..27 of an overlength sample are 7 tokens, not 47.

    ``[7] [5] [3] [3] [2] [2]`` at cap 11 after 3 batches on 5 replicas with the 7 a fragment: the exact search puts
    them into 2 packs whole; the mutant finds no room for the fragment, and the pass ends in 7 packs with the
    fragment cut again."""
    packs = [[(0, 20, 27)], [(1, 0, 5)], [(2, 0, 3)], [(3, 0, 3)], [(4, 0, 2)], [(5, 0, 2)]]
    out, cut = _even_out(packs, 11, 5, num_batches=3)
    assert out == [[(0, 20, 27), (4, 0, 2), (5, 0, 2)], [(1, 0, 5), (2, 0, 3), (3, 0, 3)]] and not cut


def test_first_fit_decreasing_places_a_fragment_by_its_length():
    """Kills ``_repack`` mutmut 17 (``size = end + start`` in first-fit decreasing): the fragment 3..10 of sample 5
    is 7 tokens and shares a pack of 8 with the 1-token sample 2 (first fit, largest first: ``[7, 1] [5, 3]
    [5, 2]``); read as 13 tokens it took a pack of its own and the 1 went next to a 5 and a 2."""
    packs = [[(0, 0, 5)], [(1, 0, 5)], [(2, 0, 1)], [(3, 0, 2)], [(4, 0, 3)], [(5, 3, 10)]]
    out, cut = _even_out(packs, 8, 5, num_batches=2)
    assert out == [[(2, 0, 1), (5, 3, 10)], [(0, 0, 5), (4, 0, 3)], [(1, 0, 5), (3, 0, 2)]] and not cut


def test_first_fit_decreasing_fills_a_pack_exactly():
    """Kills ``_repack`` mutmut 26 (``r > size``; pass 41's E33 test no longer reaches it since the exact search
    recovers its count): samples of 11, 10, 7, 6, 5 at cap 16, 3 replicas: first fit puts the 5 into the 11's pack
    (16 exactly): ``[11, 5] [10, 6] [7]``; the mutant leaves the 11 alone and deals ``[10, 5] [7, 6]``."""
    packs = [[(0, 0, 5)], [(1, 0, 6)], [(2, 0, 7)], [(3, 0, 10)], [(4, 0, 11)]]
    out, cut = _even_out(packs, 16, 3)
    assert out == [[(0, 0, 5), (4, 0, 11)], [(1, 0, 6), (3, 0, 10)], [(2, 0, 7)]] and not cut


# ---------------------------------------------------------------------------- SEARCH_DOCS
def _fillers_and_the_hard_six(fill):
    # `fill` samples of exactly the cap (11), then [7, 5, 3, 3, 2, 2]: fill + 2 packs hold them whole, first-fit
    # decreasing needs fill + 3
    return [[(100 + i, 0, 11)] for i in range(fill)] + [[(i, 0, n)] for i, n in enumerate([7, 5, 3, 3, 2, 2])]


def test_the_search_runs_up_to_search_docs_documents_and_not_above():
    """Kills the hand-planted ``found = _fit(...)`` without ``if len(docs) <= SEARCH_DOCS`` and ``SEARCH_DOCS``
    256 -> 257 / 255 (and ``found = None``); mutmut's ``_repack`` 72 (``... or True``) and 79 (``<``).

    256 documents (250 of the cap and the six of the forty-first pass's repro), 3 batches on 5 replicas: the search
    finds 252 whole packs. 257 documents (one more of the cap), 2 batches: 253 would hold them whole, but above 256
    documents only first-fit decreasing runs (the bound on a pass-end's work), so a sample is cut and warned."""
    out, cut = _even_out(_fillers_and_the_hard_six(250), 11, 5, num_batches=3)
    assert len(out) == 252 and not cut
    out, cut = _even_out(_fillers_and_the_hard_six(251), 11, 5, num_batches=2)
    assert len(out) == 258 and len(cut) == 1


def test_above_search_docs_the_first_fit_count_is_still_taken():
    """Kills ``_repack`` mutmut 62 (``n >= len(bins)`` -> ``>``): where the allowed count is the first-fit count
    itself, the first-fit packs are the answer, with or without the exact search (at or below 256 documents the
    search's first path is first-fit decreasing, so the mutant differs only above). 252 samples of the cap (10) and
    the forty-first pass's ``[2] [5] [4] [7] [8]`` (the greedy merge fails; first fit: ``[8, 2] [7] [5, 4]``), 257
    documents on 3 replicas: 255 packs, nothing cut; the mutant skipped the count and cut a sample."""
    packs = [[(100 + i, 0, 10)] for i in range(252)] + [[(i, 0, n)] for i, n in enumerate([2, 5, 4, 7, 8])]
    out, cut = _even_out(packs, 10, 3)
    assert len(out) == 255 and not cut
    assert sorted(map(sorted, out))[:3] == [[(0, 0, 2), (4, 0, 8)], [(1, 0, 5), (2, 0, 4)], [(3, 0, 7)]]


# ---------------------------------------------------------------------------- _hf_compat (items 6 and 8)
@pytest.fixture
def no_holders(monkeypatch):
    """An empty holder registry (other tests' holders may still be alive)."""
    monkeypatch.setattr(_hf_compat, "_GROUP_HOLDERS", weakref.WeakValueDictionary())


@pytest.mark.parametrize("key", ["device_mesh", "parallelism_config"])
@pytest.mark.parametrize("state_name", ["AcceleratorState", "PartialState"])
def test_release_drops_accelerates_mesh_and_parallelism_config(monkeypatch, no_holders, key, state_name):
    """Kills ``release_groups_after_shutdown`` mutmut 5-8 (the key names), 9 (``get(None)``), 12 and 13
    (``released = None`` / ``False`` for a state's key).

    Accelerate's shared state keeps the device mesh (so the gloo groups and their worker threads) until interpreter
    finalization, where tearing them down could abort a finished process (_hf_compat item 6): each of the two keys,
    in either state, is set to None, and the call says it dropped something."""
    state = getattr(acc_state, state_name)
    held = object()
    monkeypatch.setitem(state._shared_state, key, held)
    monkeypatch.setattr(_hf_compat, "drain_gloo_workers", lambda *a: None)
    assert _hf_compat.release_groups_after_shutdown() is True
    assert state._shared_state[key] is None


def test_release_collects_the_cycles_it_frees(monkeypatch, no_holders):
    """Kills the hand-planted ``if released: gc.collect()`` dropped: a group held in a reference cycle (as a device
    mesh and its groups are) is freed by the release itself, while the interpreter is fully alive, not at some later
    collection or at finalization (item 6). Automatic collection is off for the test, so the verdict does not
    depend on when the interpreter collects."""
    class Mesh:
        pass

    mesh = Mesh()
    mesh.self = mesh  # a cycle: only the cycle collector frees it
    gone = weakref.ref(mesh)
    monkeypatch.setitem(acc_state.AcceleratorState._shared_state, "device_mesh", mesh)
    monkeypatch.setattr(_hf_compat, "drain_gloo_workers", lambda *a: None)
    del mesh
    was = gc.isenabled()
    gc.disable()
    try:
        assert _hf_compat.release_groups_after_shutdown() is True
        assert gone() is None
    finally:
        if was:
            gc.enable()


class _Holder:  # weak-referenceable, as the registry needs
    def __init__(self):
        self.cp_group = object()


class _Clock:
    """A fake ``time`` for ``drain_gloo_workers``: ``sleep`` advances ``monotonic`` by whole hundredths."""

    def __init__(self):
        self.ticks, self.sleeps = 0, []

    def monotonic(self):
        return self.ticks / 100

    def sleep(self, s):
        self.sleeps.append(s)
        self.ticks += round(s * 100)


def test_drain_sleeps_in_10ms_steps_for_its_seconds(monkeypatch):
    """Kills ``drain_gloo_workers`` mutmut 4 (``seconds`` ignored: always ``DRAIN_S``), 6 (``<=``: one sleep past the
    end) and 8 (``sleep(1.01)``): the drain releases the GIL in 10 ms sleeps until ``seconds`` have passed (0.05 s:
    5 sleeps), and ``DRAIN_S`` (0.2 s: 20) without an argument. A fake clock: no wall-clock assertion."""
    clock = _Clock()
    monkeypatch.setattr(_hf_compat, "time", clock)
    _hf_compat.drain_gloo_workers(0.05)
    assert clock.sleeps == [0.01] * 5
    clock.sleeps.clear()
    _hf_compat.drain_gloo_workers()
    assert clock.sleeps == [0.01] * round(_hf_compat.DRAIN_S * 100) and _hf_compat.DRAIN_S > 0


def test_the_exit_hook_is_registered_once(monkeypatch, no_holders):
    """Kills ``track_group_holder`` mutmut 3 (``if _REGISTERED``: never registered), 4 (``register(None)``), 5 and 6
    (``_REGISTERED = None`` / ``False``: registered again for every holder). The release runs at exit (item 6), once
    however many holders are tracked."""
    registered = []
    monkeypatch.setattr(_hf_compat, "_REGISTERED", False)
    monkeypatch.setattr(_hf_compat, "atexit", SimpleNamespace(register=registered.append))
    holders = [_Holder() for _ in range(3)]
    for h in holders:
        _hf_compat.track_group_holder(h)
    assert registered == [_hf_compat.release_groups_after_shutdown]


# ---------------------------------------------------------------------------- composite configs
class _Part:  # a config-valued field (to_dict, model_type): a vision tower's or a talker's config
    model_type = "toy_part"

    def __init__(self, **fields):
        vars(self).update(fields)

    def to_dict(self):
        return dict(vars(self))


class _TextPart(_Part):
    model_type = "toy_text"


class _Composite:
    """A composite model's config: a text config (the part packed text rows run) and another part."""

    def __init__(self, text=None, other=None):
        self.text_config = text or _TextPart()
        if other is not None:
            self.vision_config = other

    def get_text_config(self):
        return self.text_config


def _rope(rope_type, part=None):
    """A text config (or ``part``) whose RoPE is of ``rope_type``."""
    return (part or _TextPart)(rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0})


def _vision_language():
    """A static RoPE in the text config, a dynamic one in the vision tower's config."""
    return _Composite(_rope("default"), other=_rope("dynamic", _Part))


# ---------------------------------------------------------------------------- sub_configs in the probe's diagnosis
def test_the_probe_diagnosis_reads_and_clears_the_text_configs_sliding_window(monkeypatch):
    """Kills the hand-planted ``sub_configs(tiny)`` -> ``[tiny]`` in ``_diagnose`` and ``sub_configs(cfg)`` ->
    ``[cfg]`` in ``_without_window``: a composite model (Gemma 3, Mistral 3 style) keeps ``sliding_window`` in its
    text config. A probe mismatch that disappears once the window is cleared is named as the mask-only sliding
    window (what to fix), not as the generic mismatch; the diagnosis must find the window there and clear it there.
    The re-probe is faked: exact where the text config's window is cleared."""
    reprobed = []

    def fake_probe(model_cls, cfg, **kw):
        reprobed.append(cfg.get_text_config().sliding_window)
        return ProbeResult(max_error=0.0 if cfg.get_text_config().sliding_window is None else 0.5, layers=2,
                           attention_classes=("A",), reached=2, stock_attention="sdpa")

    monkeypatch.setattr(model_check, "run_probe", fake_probe)
    monkeypatch.setattr(model_check, "_convolution_refusal", lambda *a: None)
    tiny = _Composite(_TextPart(sliding_window=4))  # the sliding window only in the text config
    result = ProbeResult(max_error=0.5, layers=2, attention_classes=("A",), reached=2, stock_attention="sdpa")
    refused = model_check._diagnose(object, tiny, result, 0, 1, None)
    assert refused is not None and refused[0] is NotImplementedError
    assert "applies its sliding window (config.sliding_window) only through the attention mask" in refused[1]
    assert reprobed == [None] and tiny.text_config.sliding_window == 4  # cleared on a copy, not on the model's


# ---------------------------------------------------------------------------- sub_configs in the RoPE refusal
def test_a_position_dependent_rope_in_the_text_config_is_refused():
    """Kills the hand-planted ``sub_configs(config)`` -> ``[config]`` in ``runtime._refuse_position_dependent_rope``
    (the runtime's per-batch check, ``check_model_supported`` and ``config_refusal`` share it): a composite model
    keeps its RoPE in the text config; a dynamic RoPE there depends on the largest position a rank sees, so it is
    refused however the config nests it, and a static one is not."""

    with pytest.raises(ValueError, match="rope type 'dynamic'"):
        check_model_supported(_Composite(_rope("dynamic")))
    refused = config_refusal(_Composite(_rope("dynamic")))
    assert refused is not None and "position-dependent RoPE" in refused[1]
    check_model_supported(_Composite(_rope("linear")))
    assert config_refusal(_Composite(_rope("linear"))) is None


def test_a_vision_towers_rope_is_not_refused():
    """Kills the hand-planted ``sub_configs(config)`` -> ``sub_configs(config, nested=True)`` in the RoPE refusal:
    the refusal reads the config and its text config (``sub_configs``' default), whose positions are the packed
    row's that ATP-CP shards; a vision tower's RoPE runs over its own image patches, so a model is not refused for
    it (the nested reading is for the router-loss rule, which must find DBRX's ``ffn_config``). Pins the scope the
    module documents: change both if the RoPE refusal is meant to read every sub-config."""

    check_model_supported(_vision_language())
    assert config_refusal(_vision_language()) is None


class ToyForCausalLM:
    def forward(self, input_ids=None, **kwargs):
        return None


def test_attention_dropout_in_the_text_config_is_refused():
    """Kills the hand-planted ``sub_configs(config)`` -> ``[config]`` in ``static_refusal``'s dropout rule: the
    ``atac_cp`` attention does not implement attention dropout, and a composite model sets it in its text config,
    so it is refused there (naming the field), and accepted at 0."""

    refused = static_refusal(ToyForCausalLM, _Composite(_TextPart(attention_dropout=0.1)))
    assert refused is not None and refused[0] is ValueError and "attention_dropout=0.1" in refused[1]
    assert static_refusal(ToyForCausalLM, _Composite(_TextPart(attention_dropout=0.0))) is None


def test_non_attention_layers_in_the_text_config_are_refused():
    """Kills the hand-planted ``sub_configs(config)`` -> ``[config]`` in ``config_refusal``'s rules: a composite
    model declares its layer types in its text config; linear-attention layers there mix the documents of a packed
    row outside attention and must be refused (the rule also runs at the ``atac_cp`` attention's first call)."""

    refused = config_refusal(_Composite(_TextPart(layer_types=["full_attention", "linear_attention", "full_attention"])))
    assert refused is not None and refused[0] is NotImplementedError and "linear_attention" in refused[1]


# ---------------------------------------------------------------------------- what the rules read: the text path only
def test_a_part_that_text_rows_never_run_is_not_refused():
    """Kills the hand-planted ``sub_configs(config, nested=True)`` in ``static_refusal``'s dropout rule (H23) and in
    ``config_refusal``'s layer types (H25): ATACTrainer trains text rows, which run the config and its text config
    only (a vision tower gets no input and no gradient from them; see ``_default_device_args``), so attention
    dropout or linear-attention layers declared by a vision tower's config are no reason to refuse the model; the
    same fields in the text config are (the tests above)."""
    dropout = _Composite(other=_Part(attention_dropout=0.1))
    assert static_refusal(ToyForCausalLM, dropout) is None
    layers = _Composite(other=_Part(layer_types=["full_attention", "linear_attention"]))
    assert config_refusal(layers) is None


def test_the_router_rule_reads_the_flag_and_coefficient_of_the_text_path():
    """Kills the hand-planted ``sub_configs(config, nested=True)`` in ``router_loss_refusal``'s outer loop (H27) and
    ``parts = sub_configs(config, nested=True)`` (H30): the router loss that reaches the training loss is the text
    path's. Qwen3-VL-MoE's forward reads both ``output_router_logits`` and ``router_aux_loss_coef`` from
    ``config.text_config``, so a model whose text config turns router logits on with coefficient 0 adds nothing,
    whatever another part or the outer config declares; a part text rows never run (a talker's config) does not
    add its loss either. The text config's coefficient set non-zero is refused (the rule still bites)."""
    from atac_hf.attention.model_check import router_loss_refusal

    talker = _Composite(other=_Part(output_router_logits=True, router_aux_loss_coef=0.01, num_experts=4))
    assert router_loss_refusal(talker) is None  # H27
    zero = _Composite(text=_TextPart(output_router_logits=True, router_aux_loss_coef=0.0, num_experts=4),
                      other=_Part(aux_loss_coef=0.01, num_experts=4))
    assert router_loss_refusal(zero) is None  # H30
    on = _Composite(text=_TextPart(output_router_logits=True, router_aux_loss_coef=0.01, num_experts=4))
    refused = router_loss_refusal(on)
    assert refused is not None and "router_aux_loss_coef=0.01" in refused[1]

"""ATP-CP, anchor-tail sharding: the j most expensive documents (anchors) are split head-tail
over all ranks, the rest (tails) stay whole on one rank each; j is chosen by estimated block
time (compute + exposed K/V exchange), and the anchors' chunks level the ranks in tokens and
attention pairs where the tails allow. Where the K/V exchange of that plan is exposed, a
hierarchical plan (anchors over sub-groups of ranks, :mod:`.subgroups`) competes too; the
exchange (all-gather or only-needed all-to-all) is picked by estimated time. Pure numpy;
:func:`~atac_hf.sharding.plan_shards` is the entry point.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..cost import CostModel
from .baselines import contiguous_compute_floor, contiguous_segments
from .plan import ShardPlan
from .subgroups import ANCHOR_SHARES, _plan_subgroups, _scaled
from .two_way import _two_way_anchor_segments, _two_way_flat  # noqa: F401  (_two_way_anchor_segments: tests)
from .water_fill import _split_by_share, _water_fill  # noqa: F401  (_split_by_share: tests)
from .bounds import _per_doc_a2a_floor, _per_doc_lower_bound, _per_doc_may_win, _work_lower_bound  # noqa: F401
from .segments import (_doc_work_lower_bounds, _exact_pairs, fill_empty_ranks, finish_flat, finish_plan, per_doc_flat,
                       resolve_exchange, row_offsets)

__all__ = ["LEVEL_SEARCH_LIMIT", "PER_DOC_ROUTE_LIMIT", "PRICE_ERROR_BAND", "ROBUST_EXTRA_ANCHORS", "SUBGROUP_MARGIN",
           "SUBGROUP_SKIP_LEVEL", "TWO_WAY_TOLERANCE", "plan_atp"]

#: ATP takes the plan whose ranks are level in tokens and in attention pairs separately
#: (robust to the cost model's error in their relative price) over the one level in
#: estimated cost alone, unless its estimated block time is more than this fraction higher.
TWO_WAY_TOLERANCE = 0.02
#: The contiguous layout competes (see plan_atp); False: only where nothing else fits the cap (a
#: measurement switch, and how tests of the other candidates' choices see them alone).
CONTIGUOUS_CANDIDATE = True
#: ATP takes the hierarchical plan (anchors over sub-groups of ranks) over the flat one where its
#: estimated block time is no higher, and no more than this fraction higher with attention priced
#: at 0.25x-4x (the flat plan is levelled in tokens and pairs: robust to that error; a plan that
#: is faster only near the estimate's own price ratio is not taken).
SUBGROUP_MARGIN = 0.0
#: Sub-group candidates are built only where they can gain time: where the incumbent's K/V
#: exchange is exposed, or its ranks are further than this fraction from level (a plan whose
#: exchange is hidden and whose ranks are level is within this of the best any plan can do).
SUBGROUP_SKIP_LEVEL = 0.005
#: Where ATP's best plan is not level in tokens and pairs separately (whole documents only, or
#: anchors that cannot level both), it tries up to this many more anchors split two-way.
ROBUST_EXTRA_ANCHORS = 2
#: Where ATP's best anchor count leaves the ranks off level, at most this many more anchors are tried for
#: the fewest that level them (red-team 19: trying every count was O(D^2 x C), seconds at CP 128).
LEVEL_SEARCH_LIMIT = 8
#: ATP's per_doc candidate (every document split over every rank) is costed with the node-routed
#: all-to-all only where its rows' count, split documents x C x C, is at most this; above it, with the
#: direct one (it can then only look slower). Counting them was seconds per pack at CP 128 (red-team 19).
PER_DOC_ROUTE_LIMIT = 1 << 18
#: Attention price factors of the cost model's error that ATP guards against where no plan of
#: those extra anchors is level two-way: if its plan's ranks are more than TWO_WAY_TOLERANCE from
#: level at one of these prices, the cost-level plan of the extra anchors (within TWO_WAY_TOLERANCE
#: by the estimate) that is most level at them is taken.
PRICE_ERROR_BAND = (0.5, 2.0)


def plan_atp(lengths, C, cm: CostModel, *, max_tokens_per_rank=None, min_chunk=1, max_anchors=None, kv_exchange=None,
             **_) -> ShardPlan:
    """Anchor-tail placement.

    For a candidate anchor count j (the j most expensive documents): the other
    documents (tails) are placed whole, longest first, on the least-loaded rank
    under the token cap; then every anchor is split head-tail over the ranks with
    per-rank shares that bring all ranks to one level (water filling). A rank's
    head and tail chunks of an anchor are mirror images of equal size, so its
    share of the anchor's attention work equals its share of the tokens, wherever
    the chunks sit. The smallest j whose ranks come out level wins, unless a
    larger j has a smaller estimated block time (compute + exposed K/V exchange).

    The chosen anchors are then re-split so that every rank is level in tokens and in
    causal attention pairs separately (a rank's head/tail proportion sets its pairs;
    see :func:`_two_way_anchor_segments`): such a plan stays level whatever the true
    price ratio of token-wise work and attention, which a cost model gets only
    approximately. It replaces the cost-level split unless its estimated block time is
    more than :data:`TWO_WAY_TOLERANCE` higher. Last, head-tail inside every document
    (the ``per_doc`` layout) competes on estimated block time.

    Fewer anchors than the chosen count (documents costlier than a rank's share kept whole) compete,
    where a split's exchange or overheads may cost more than it saves (:func:`_fewer_anchors`): judged
    against the flat plan, like the hierarchical candidates, and the faster of the two is kept; so
    neither candidate family makes a plan slower than it is without it.

    Every candidate is costed with the K/V exchange ``kv_exchange`` (None: ``"auto"``, the faster of
    the all-gather and the all-to-all by the estimate), so a plan for a given exchange is chosen for it.
    """
    exchange = "auto" if kv_exchange is None else kv_exchange
    D = len(lengths)
    offsets = row_offsets(lengths)
    if C == 1:
        return finish_plan(lengths, 1, "atp", [np.stack([np.arange(D), np.zeros(D, np.int64), lengths], 1)],
                       np.zeros(0, np.int64), cm)
    cap = np.inf if max_tokens_per_rank is None else float(max_tokens_per_rank)
    # each document's cost whole (cm.doc_cost) and its attention, costed in one call
    whole, whole_attn = cm.segment_and_attention_cost(np.zeros(D, np.int64), lengths)
    order = np.argsort(-whole, kind="stable")  # most expensive first (ties: row order)
    eligible = order[lengths[order] >= 2 * C * min_chunk]
    jmax = len(eligible) if max_anchors is None else min(len(eligible), int(max_anchors))
    cand = eligible[:jmax]
    target = float(whole.sum()) / C
    # documents costlier than a rank's share must be split; start there.
    j0 = min(jmax, int(np.count_nonzero(whole[cand] > target)))
    anchor_len = np.concatenate([[0], np.cumsum(lengths[cand])])
    anchor_comm = cm.comm_cost(anchor_len, C).tolist()  # the K/V exchange of j anchors, every j
    zeros_c = np.zeros(C)

    # place and attempt are kept per anchor count: the extra anchors tried below may be ones the
    # anchor-count loop tried already (their results are not changed by their callers)
    placed_by_count: dict = {}
    attempt_by_count: dict = {}

    def place(j):
        """(owner, load, tokens, local attention) of the tails of the j most expensive anchors, placed
        longest first; None where they do not fit under the cap (more anchors needed)."""
        if j not in placed_by_count:
            not_tail = np.zeros(D, dtype=bool)
            not_tail[cand[:j]] = True
            tails = order[~not_tail[order]]
            placed_by_count[j] = _place_tails(D, tails, whole[tails], whole_attn[tails], lengths[tails], zeros_c,
                                              np.zeros(C, np.int64), cap)
        return placed_by_count[j]

    def attempt(j):
        """(block, owner, bounds, load) of the j most expensive anchors water-filled over all ranks
        around the tails ``place(j)`` placed; None where the cap forbids either."""
        if j not in attempt_by_count:
            attempt_by_count[j] = _attempt(j)
        return attempt_by_count[j]

    def _attempt(j):
        placed = place(j)
        if placed is None:
            return None
        owner, load, tok, tail_attn = placed
        bounds = None
        if j:
            filled = _water_fill(cm, lengths[cand[:j]], whole[cand[:j]], load, tok, cap)
            if filled is None:
                return None
            bounds, added = filled
            load = load + added
        comm = anchor_comm[j]
        return float(np.max(load - tail_attn + np.maximum(tail_attn, comm if j else 0.0))), owner, bounds, load

    # a lower bound of the block time of any plan splitting the j most expensive anchors and keeping
    # the rest whole, every j: its mean compute (block time >= slowest rank's compute >= mean), with
    # the anchors at their exact work (see _doc_work_lower_bounds) and the whole documents as costed
    exact_pairs = _exact_pairs(lengths, cm)  # per-pack quantities of the bounds below, counted once
    work_bound = _work_lower_bound(lengths, C, cm, exact_pairs)
    doc_bounds = _doc_work_lower_bounds(lengths, cm, exact_pairs)
    anchor_saving = np.concatenate([[0.0], np.cumsum((whole - doc_bounds)[cand])])
    level_bound = ((float(whole.sum()) - anchor_saving) / C * (1 - 1e-9)).tolist()  # margin: sums' rounding

    def build(j, owner, bounds, two_way=None):
        """The plan of ``attempt(j)``, its anchors re-split two-way where that is within
        TWO_WAY_TOLERANCE; and whether it is (level in tokens and pairs separately).
        ``two_way``: the two-way split of the anchors, given by a caller that wants no other
        plan: (None, False) instead of one that is not two-way; False: the cost-level split."""
        two_way_only = two_way is not None
        anchors = cand[:j]
        tails = (owner >= 0).nonzero()[0]
        tail_seg = np.stack([tails, np.zeros(len(tails), np.int64), lengths[tails]], axis=1)

        def with_tails(seg, rank):
            """Every rank's anchor and tail segments, rank by rank in row order (row starts are
            distinct within a rank: the order is that of sort_segments per rank)."""
            seg, rank = np.concatenate([seg, tail_seg]), np.concatenate([rank, owner[tails]])
            o = np.lexsort((offsets[seg[:, 0]] + seg[:, 1], rank))
            return seg[o], rank[o]

        def cost_level():
            """The cost-level split of attempt(j) (the all-to-all is costed only for the plan ATP
            returns, where it cannot move the block time)."""
            seg, rank = _head_tail_flat(anchors, bounds, C) if j else (np.zeros((0, 3), np.int64),
                                                                       np.zeros(0, np.int64))
            return finish_flat(lengths, C, "atp", *with_tails(seg, rank), None, cm, exchange,
                               defer_a2a=True)

        # The same anchors and tails with every rank level in tokens and in attention pairs
        # separately: balanced whatever the true price ratio of the two (the cost model's is
        # off by 5-20% on CPU); taken unless the estimate says it costs over TWO_WAY_TOLERANCE
        # more than the cost-level split, which is not built where the bound on its block time
        # already says it cannot.
        if not two_way_only:
            two_way = _two_way_flat(lengths, C, anchors, owner, cap, min_chunk) if j else None
        if two_way is None or two_way is False:
            return cost_level(), False
        robust = finish_flat(lengths, C, "atp", *with_tails(*two_way), None, cm, exchange, defer_a2a=True)
        if robust.block_time_s <= level_bound[j] * (1 + TWO_WAY_TOLERANCE):
            return robust, True
        plan = cost_level()
        if robust.block_time_s <= plan.block_time_s * (1 + TWO_WAY_TOLERANCE):
            return robust, True
        return (None, False) if two_way_only else (plan, False)

    best = None
    stale = 0
    for j in range(j0, jmax + 1):
        # every rank waits for the exchange (its load is at least its local attention): no plan of j or
        # more anchors (whose exchange only grows) can beat best, so none is tried
        if j and best is not None and anchor_comm[j] >= best[0] * (1 - 1e-9):
            break
        got = attempt(j)
        if got is None:
            continue
        block, owner, bounds, load = got
        if best is None or block < best[0] * (1 - 1e-9):
            best = (block, j, owner, bounds)
            stale = 0
        else:
            stale += 1
        # level ranks: more anchors only add K/V traffic and remove overlap.
        if float(load.max()) <= float(load.sum()) / C * 1.005 or stale >= 3:  # the mean, as np.mean (sum / C)
            break
    anchor_plan = None
    if best is not None:
        anchor_plan, level_two_ways = build(*best[1:])
        # The counts above price the exchange as the all-gather, and its overlap only roughly; the
        # all-to-all (routed across nodes) can move far less. Where the ranks are off level, the
        # fewest anchors that level them compete too, built with their exchange (the all-gather's too).
        if anchor_plan.imbalance > 1.005:
            for j in range(best[1] + 1, jmax + 1):
                got = attempt(j)
                if got is not None and float(got[3].max()) <= float(got[3].sum()) / C * 1.005:
                    level, level_two_ways_j = build(j, got[1], got[2])
                    if level.block_time_s < anchor_plan.block_time_s:
                        anchor_plan, level_two_ways, best = level, level_two_ways_j, (got[0], j, got[1], got[2])
                    break
                if j - best[1] >= LEVEL_SEARCH_LIMIT:  # (each count costs O(j x C): not every count is tried)
                    break
        # A plan of whole documents (or whose anchors cannot level tokens and pairs) is level in
        # estimated cost only: one or two more anchors, split two-way, make it level whatever the
        # price ratio; taken where that costs at most TWO_WAY_TOLERANCE more by the estimate.
        extras = range(best[1] + 1, min(jmax, best[1] + ROBUST_EXTRA_ANCHORS) + 1) if not level_two_ways else ()
        for j in extras:
            # the plan is taken only where its anchors split two-way, which the tails alone decide: where
            # they cannot, the anchors are not water-filled
            placed = place(j)
            two_way = None if placed is None else _two_way_flat(lengths, C, cand[:j], placed[0], cap, min_chunk)
            got = None if two_way is None else attempt(j)
            if got is None:
                continue
            plan, ok = build(j, got[1], got[2], two_way)
            if ok and plan.block_time_s <= anchor_plan.block_time_s * (1 + TWO_WAY_TOLERANCE):
                anchor_plan = plan
                break
        else:  # none level two-way: where the plan is fragile to the price error, the extras' cost-level plans
            worst = _price_error_imbalance(anchor_plan, cm) if extras else 1.0
            if worst > 1 + TWO_WAY_TOLERANCE:
                others = [build(j, *attempt(j)[1:3], False)[0] for j in extras if attempt(j) is not None]
                anchor_plan = _least_price_error(anchor_plan, worst, others, cm)
    # Candidates below are judged against the plan as plan_shards returns it (an idle rank filled).
    anchor_plan = None if anchor_plan is None else fill_empty_ranks(anchor_plan, cm, kv_exchange)
    # Head-tail inside every document, moving only the K/V of documents it splits, is a candidate too
    # (ATP is never worse than per_doc); built only where its bound says it can win, or where it leaves a
    # rank idle (no document of C tokens: its bound is not that of the plan filled).
    may_idle = int(lengths.max()) < C
    if anchor_plan is None or (may_idle and work_bound < anchor_plan.block_time_s) or _per_doc_may_win(
            lengths, C, cm, work_bound, anchor_plan.block_time_s * (1 + 1e-6)):
        # (its node-routed all-to-all only where counting its rows stays cheap; see PER_DOC_ROUTE_LIMIT)
        route = "auto" if int(np.count_nonzero(lengths >= 2)) * C * C <= PER_DOC_ROUTE_LIMIT else None
        even = fill_empty_ranks(finish_flat(lengths, C, "atp", *per_doc_flat(lengths, C), None, cm, exchange,
                                            route=route), cm, kv_exchange)
        if even.rank_num_tokens().max() <= cap and (anchor_plan is None
                                                      or even.block_time_s < anchor_plan.block_time_s):
            anchor_plan = even
    robust_ref = None  # the plan a hierarchical candidate must stay no slower than at every price
    if anchor_plan is not None:
        anchor_plan = robust_ref = resolve_exchange(anchor_plan, cm)  # the flat plan's exchange kept (deferred in build)
        # One contiguous run per rank (the fewest kernel calls; only cut documents gathered) competes:
        # built where the work bound and its slowest rank's compute leave it a chance, taken where over
        # TWO_WAY_TOLERANCE faster and no less level, or no slower at 0.25x-4x the attention price
        # (_robustly_no_worse), or the safer bet there (_less_regret; all three: _takes_over).
        # Decided before the hierarchical candidates, which must beat it at the estimate and stay no
        # slower than the flat plan at every price.
        flat, run = anchor_plan, None
        if (CONTIGUOUS_CANDIDATE and C > 1 and work_bound * (1 + TWO_WAY_TOLERANCE) < flat.block_time_s
                and contiguous_compute_floor(lengths, C, cm) * (1 + TWO_WAY_TOLERANCE) < flat.block_time_s):
            run = finish_plan(lengths, C, "atp", contiguous_segments(lengths, C), None, cm, exchange)
            run = run if run.rank_num_tokens().max() <= cap else None
        why = _takes_over(run, flat, cm) if run is not None else ""
        anchor_plan = flat_fewer = run if why else flat
        # fewer anchors (documents costlier than a share kept whole), judged against that plan, or the flat
        # one where the run took over as the safer bet only (then they must also take over the run); a run
        # refused competes again where they replace the flat plan (their plan can be less level than it)
        given = flat if why == "regret" else anchor_plan
        fewer = given if best is None else _fewer_anchors(given, best[1], whole, cand, attempt, build, cm, kv_exchange)
        if fewer is not given:
            keep_run = (not _takes_over(fewer, run, cm)) if why == "regret" else (
                not why and run is not None and _takes_over(run, fewer, cm))
            flat_fewer = run if keep_run else fewer
    elif C > 1:
        # no flat plan fits the cap: one contiguous run a rank (it fits every cap any placement can) is the
        # plan the hierarchical ones must beat, at the estimate only (no level flat plan: robust_ref None)
        run = finish_plan(lengths, C, "atp", contiguous_segments(lengths, C), None, cm, exchange)
        anchor_plan = run if run.rank_num_tokens().max() <= cap else None
    # Hierarchical placement: anchors over sub-groups of just enough ranks (only those move
    # their K/V; see atac_hf.sharding.subgroups), taken where it is estimated no slower than the
    # flat (or per_doc) plan, at the estimate's attention price and at 0.25x-4x of it. No plan's
    # slowest rank computes less than the mean of the exact work: where the incumbent is at that
    # bound already, none can beat it; where its exchange is hidden and its ranks are level within
    # SUBGROUP_SKIP_LEVEL, none can gain more than that: the candidates are not built.
    if C >= 3 and (anchor_plan is None or anchor_plan.block_time_s > work_bound
                   and (anchor_plan.block_time_s > float(anchor_plan.rank_compute_s.max()) * (1 + 1e-9)
                        or anchor_plan.imbalance > 1 + SUBGROUP_SKIP_LEVEL)):
        alt_blocks: dict = {}  # the incumbent's block time at each attention price, costed once
        tried = []  # anchor sets built: a share with the same anchors builds the same candidate
        # the document costs and bounds the candidates use (whole is cm.doc_cost), costed once
        doc_costs = {1.0: whole, "work_lower_bound": doc_bounds}
        for share in ANCHOR_SHARES:
            anchors = (whole > share * float(whole.sum()) / C) & (lengths >= 4 * min_chunk)  # as in subgroups
            if any(np.array_equal(anchors, t) for t in tried):
                continue
            tried.append(anchors)
            # a candidate whose slowest rank computes more than the incumbent's block time loses: not finished
            sub = _plan_subgroups(lengths, C, cm, share, max_tokens_per_rank, min_chunk, "atp", True,
                                  np.inf if anchor_plan is None else anchor_plan.block_time_s, doc_costs, exchange)
            if sub is not None and (anchor_plan is None or sub.block_time_s <= anchor_plan.block_time_s and (
                    robust_ref is None or _robustly_no_worse(sub, robust_ref, cm, alt_blocks))):
                anchor_plan, robust_ref, alt_blocks = sub, sub, {}
    # the faster of the hierarchical plan and the flat plan's fewer anchors: each family is judged against
    # the flat plan, so neither makes a plan slower than it is without it. (The step run again on a
    # hierarchical plan that was taken changed 101 of 6,000 random packs' plans, none faster than this.)
    if best is not None and flat_fewer.block_time_s < anchor_plan.block_time_s:
        anchor_plan = flat_fewer
    if anchor_plan is None:  # nothing else fits the cap; a contiguous split fits every cap >= ceil(tokens / C),
        # i.e. every cap any placement can respect (plan_shards reports the overflow otherwise)
        return finish_plan(lengths, C, "atp", contiguous_segments(lengths, C), None, cm, exchange)
    return anchor_plan


def _price_error_imbalance(plan: ShardPlan, cm: CostModel) -> float:
    """The plan's worst max / mean per-rank compute with attention priced at each factor of
    :data:`PRICE_ERROR_BAND` (:attr:`ShardPlan.imbalance` under those models)."""
    C = plan.cp_size
    allseg, rank_of = _flat_segments(plan)
    worst = 1.0
    for k in PRICE_ERROR_BAND:
        compute = np.bincount(rank_of, weights=_scaled(cm, k).segment_cost(allseg[:, 1], allseg[:, 2]), minlength=C)
        mean = float(np.mean(compute))
        worst = max(worst, float(np.max(compute)) / mean if mean > 0 else 1.0)
    return worst


def _least_price_error(plan: ShardPlan, worst: float, others: list, cm: CostModel) -> ShardPlan:
    """``plan`` (whose :func:`_price_error_imbalance` is ``worst``), or the first of ``others`` within
    :data:`TWO_WAY_TOLERANCE` of its estimated block time that is more level than all before it at
    the prices of :data:`PRICE_ERROR_BAND`."""
    limit = plan.block_time_s * (1 + TWO_WAY_TOLERANCE)
    for other in others:
        if other.block_time_s <= limit and (got := _price_error_imbalance(other, cm)) < worst:
            plan, worst = other, got
    return plan


def _flat_segments(plan: ShardPlan) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's segments of ``plan`` as one (S, 3) array, and the (S,) rank of each."""
    return np.concatenate(plan.segments), np.repeat(np.arange(plan.cp_size), [len(x) for x in plan.segments])


def _head_tail_flat(docs: np.ndarray, bounds: np.ndarray, C: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`head_tail_segments` as one (n, 3) array of non-empty segments and the (n,) rank of
    each (in no particular order)."""
    r = np.arange(C)
    d = np.broadcast_to(docs[:, None], (len(docs), C))
    seg = np.concatenate([np.stack([d, bounds[:, r], bounds[:, r + 1]], axis=-1).reshape(-1, 3),
                          np.stack([d, bounds[:, 2 * C - 1 - r], bounds[:, 2 * C - r]], axis=-1).reshape(-1, 3)])
    rank = np.tile(r, 2 * len(docs))
    keep = seg[:, 2] > seg[:, 1]
    return seg[keep].astype(np.int64), rank[keep]


def _place_tails(num_docs, tails, cost, attn, toks, base_load, base_tok, cap):
    """Longest-processing-time placement of whole documents (given most expensive first):
    each goes to the least-loaded rank whose token count stays under the cap.

    Returns (owner per document id, load, tokens, local attention per rank), or None
    if some document fits on no rank. Pure Python on small lists: faster than numpy here.
    """
    C = len(base_load)
    owner = np.full(num_docs, -1, dtype=np.int64)
    load = [float(x) for x in base_load]
    tok = [int(x) for x in base_tok]
    tail_attn = [0.0] * C
    heap = [(load[r], r) for r in range(C)]
    heapq.heapify(heap)
    who = [0] * len(tails)
    for i, (c, a, n) in enumerate(zip(cost.tolist(), attn.tolist(), toks.tolist())):
        l, r = heap[0]
        if tok[r] + n > cap:  # least-loaded rank is full: take the least-loaded with room
            fits = [(load[q], q) for q in range(C) if tok[q] + n <= cap]
            if not fits:
                return None
            l, r = min(fits)
            heap.remove((l, r))
            heapq.heapify(heap)
            heapq.heappush(heap, (l + c, r))
        else:
            heapq.heapreplace(heap, (l + c, r))
        load[r] = l + c
        tok[r] += n
        tail_attn[r] += a
        who[i] = r
    owner[tails] = who
    return owner, np.asarray(load), np.asarray(tok, dtype=np.int64), np.asarray(tail_attn)


def _fewer_anchors(plan: ShardPlan, j_best: int, whole, cand, attempt, build, cm: CostModel, kv_exchange):
    """``plan``, or the plan of fewer anchors than the ``j_best`` it started from where that is faster.

    ATP splits documents costlier than a rank's share first, but keeping one whole wins where its
    split's exchange or overheads cost more, and a count's estimate (``attempt``) can rank counts
    otherwise than their finished plans. Counts below ``j_best`` are looked at while the costliest
    document they keep whole (its rank computes at least its cost; lower counts keep costlier ones)
    costs less than ``plan``'s block time (with a token on every rank, as
    :func:`~atac_hf.sharding.plan_shards` returns it); the one of least estimate is built where that
    estimate is under it. It is taken by the contiguous candidate's rule (:func:`_takes_over`: over
    :data:`TWO_WAY_TOLERANCE` faster, and no less level, no slower or the safer bet at 0.25x-4x the
    attention price: a split levels ranks whatever the price, a document kept whole does not); never
    where it leaves a rank idle (filling it is another plan).
    """
    below, least = None, plan.block_time_s  # (plan's idle ranks filled by plan_atp)
    for j in range(j_best - 1, -1, -1):
        if float(whole[cand[j]]) >= plan.block_time_s * (1 - 1e-9):
            break
        got = attempt(j)
        if got is not None and got[0] < least * (1 - 1e-9):
            below, least = (j, got[1], got[2]), got[0]
    if below is None:
        return plan
    fewer = resolve_exchange(build(*below)[0], cm)
    if fill_empty_ranks(fewer, cm, kv_exchange) is not fewer:  # an idle rank: filled, it is another plan
        return plan
    return fewer if _takes_over(fewer, plan, cm) else plan


def _takes_over(new: ShardPlan, incumbent: ShardPlan, cm: CostModel) -> str:
    """The rule a contiguous run or a plan of fewer anchors replaces a flat plan by: over
    :data:`TWO_WAY_TOLERANCE` faster by the estimate, and no less level, or no slower at 0.25x-4x
    the attention price (:func:`_robustly_no_worse`), or the safer bet there (:func:`_less_regret`).
    Returns which ("level", "robust", "regret"), or "" where it does not."""
    if not new.block_time_s * (1 + TWO_WAY_TOLERANCE) < incumbent.block_time_s:
        return ""
    if new.imbalance <= incumbent.imbalance:
        return "level"
    if _robustly_no_worse(new, incumbent, cm):
        return "robust"
    return "regret" if _less_regret(new, incumbent, cm) else ""


def _less_regret(a: ShardPlan, b: ShardPlan, cm: CostModel) -> bool:
    """Whether plan ``a`` exceeds ``b``'s block time, at worst over attention priced 0.25x-4x, by a smaller
    factor than ``b`` exceeds its own (where ``b`` waits on an exchange no attention price moves, keeping
    a document whole can cost a little at 4x and save several times elsewhere: scripts/planner_campaign.py)."""
    worst_a = worst_b = 1.0
    for k in (0.25, 0.5, 2.0, 4.0):
        alt = _scaled(cm, k)
        ta, tb = _block_at(a, alt), _block_at(b, alt)
        if ta > 0 and tb > 0:
            worst_a, worst_b = max(worst_a, ta / tb), max(worst_b, tb / ta)
    return worst_a < worst_b


def _robustly_no_worse(a: ShardPlan, b: ShardPlan, cm: CostModel, b_blocks: dict | None = None) -> bool:
    """Whether plan ``a`` stays within :data:`SUBGROUP_MARGIN` of ``b``'s block time when attention
    costs 0.25x, 0.5x, 2x or 4x what ``cm`` says (the cost model's error in the price ratio of attention
    and token-wise work): a plan levelled in estimated cost alone is taken over a flat plan
    levelled in tokens and pairs only where the price ratio being off would not undo it. ``b_blocks``:
    ``b``'s block time per price factor, filled in as costed (reused over candidates)."""
    for k in (0.25, 0.5, 2.0, 4.0):
        alt = _scaled(cm, k)
        if b_blocks is None or k not in b_blocks:  # b's block time at price k (cached across calls)
            got = _block_at(b, alt)
            if b_blocks is None:
                b_blocks = {}
            b_blocks[k] = got
        if _block_at(a, alt) > b_blocks[k] * (1 + SUBGROUP_MARGIN):
            return False
    return True


def _block_at(plan: ShardPlan, cm: CostModel) -> float:
    """``plan``'s block time re-costed by ``cm`` with its exchange time kept (what
    :func:`finish_plan` gives for a model with other compute prices and the same link)."""
    allseg, rank_of = _flat_segments(plan)
    local = ~plan.gathered_mask()[allseg[:, 0]]
    C = plan.cp_size
    cost, attn = cm.segment_and_attention_cost(allseg[:, 1], allseg[:, 2])
    compute = np.bincount(rank_of, weights=cost, minlength=C)
    local_attn = np.bincount(rank_of[local], weights=attn[local], minlength=C)
    if not len(plan.gathered_docs):  # (compute - attention + attention: finish_flat's rounding)
        return float(np.max(compute - local_attn + local_attn))
    # the routed exchange's second phase (comm_tail_s) is hidden behind nothing
    hidden = plan.comm_s - plan.comm_tail_s
    return float(np.max(compute - local_attn + np.maximum(local_attn, hidden) + plan.comm_tail_s))

"""Aladdin's SLO-aware request placement as a scorer: best-fit multi-dimensional bin packing.

Aladdin (seeds/aladdin.txt §4.2, Alg. 1; research/seed-distserve-vidur-aladdin.md C.4, C.9, D.5)
places each arriving request on the *most loaded* worker (by `capacity_norm`) on which it still
fits, where fitting means, with the request added:

    (b) Σ_j eff_ctx_j ≤ θ·l^d(b)          ATGT: Eq 4's context budget for the new batch size b;
                                          eff_ctx_j = l_in + l_gen + γ·max(0, l_pred − l_gen)
    (c) t_pre(queued prompt + l_in) ≤ T_pre          TTFT (mixed mode: the worker prefills)
    (d) t_pre(l_in) ≤ θ·min_j slack_j               mixed mode: the prefill stalls ongoing
                                          decodes; it may use at most θ of the least banked
                                          slack, slack_j = T_dec·(l_gen − 1) − t_dec_j
    (e) [Σ_j w_j]_k ≤ M   for every future iteration k: the time-indexed KV vector, w_j[k] =
                                          kv(ctx_j + k) while request j runs (k <= remaining_j)

Output lengths are predicted as the conditional mean given the prompt length
(`ConditionalMeanLengths`, §2.3); a request that outlives its prediction is re-predicted as
E[l_out | l_in, l_out > l_gen]. Requests that fit nowhere go to the least-violating worker
(C.9-10: opening a new worker takes minutes in our cluster; the count of such placements is the
scale-up signal, D.4).

As a scorer (`AladdinPacking`, registered as "aladdin-pack"):
* feasible endpoints score in [0.5, 1): 0.5 + 0.49·min(1, capacity_norm/√2), capacity_norm =
  ‖(b/B_max, Σ eff_ctx / l^d(b))‖₂ of the worker *before* placement (C.9-5's normalised
  variant), so the most loaded feasible worker ranks first (best fit);
* infeasible endpoints score in [0, 0.5): 0.49·(1 − min(1, worst relative excess)), so with
  nothing feasible the least-violating worker ranks first.

Inputs beyond `EndpointView`: the ongoing requests per endpoint come from `load_of`, a function
the owner injects (the simulator reads its own request table,
`sim.reproductions.aladdin_cluster`; a live router would read its request table and token
counters). Without it, the scorer falls back to the endpoint view alone: batch = max(in flight,
running + waiting), context = KV blocks in use; (e) then checks only the new request's peak
against free KV.

Alg. 2 (re-balancing new requests each heartbeat) is here as pure functions
(`prediction_error`, `rebalance`: greedy pairwise moves, C.4.3 [REC]; `plan_rebalance`: one
heartbeat, the moves re-checked against (b)-(e) at the target). The simulator runs
`plan_rebalance` each heartbeat (`sim.reproductions.aladdin_cluster.Rebalancer`, moving requests
with `Cluster.reassign`), and so does the live router (`router.rebalance`, moving the decode
share of disaggregated requests whose prefill still runs).
Time-indexed KV is evaluated exactly at the iterations where some request finishes (the vector's
peaks), not on a K-long grid: the same maxima, O(n log n).

Invariants (property-tested): scores lie in [0, 1]; a feasible endpoint always outranks an
infeasible one; an endpoint whose load leaves no room under (b) or (e) is never feasible.
Pure: no I/O, no clock, no global state.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from splitserve.core.ids import EndpointId
from splitserve.policy.placement.base import EndpointView, RequestView, Scorer
from splitserve.policy.planner.aladdin import AladdinPerfModel


@dataclass(frozen=True, slots=True)
class ConditionalMeanLengths:
    """E[l_out | l_in bucket] and E[l_out | l_in bucket, l_out > x] from history (§2.3).

    Buckets are powers of two of the prompt length; a bucket with fewer than `min_samples`
    samples uses all samples. Frozen: build one from (prompt, output) pairs with `of`.
    """

    buckets: Mapping[int, tuple[int, ...]]
    """Sorted output lengths per prompt bucket (-1 holds every sample)."""
    min_samples: int = 16

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, int]], min_samples: int = 16) -> ConditionalMeanLengths:
        groups: dict[int, list[int]] = {-1: []}
        for p, o in pairs:
            groups.setdefault(_bucket(p), []).append(int(o))
            groups[-1].append(int(o))
        return cls({b: tuple(sorted(v)) for b, v in groups.items()}, min_samples)

    def _outputs(self, prompt_tokens: int) -> tuple[int, ...]:
        own = self.buckets.get(_bucket(prompt_tokens), ())
        return own if len(own) >= self.min_samples else self.buckets.get(-1, ())

    def predict(self, prompt_tokens: int, generated_tokens: int = 0) -> int:
        """Total output expected: the conditional mean, above `generated_tokens` when the
        request is already that long (re-prediction on under-estimate)."""
        outs = self._outputs(prompt_tokens)
        longer = outs[bisect.bisect_right(outs, generated_tokens) :]
        if not longer:
            return generated_tokens + 1
        return max(generated_tokens + 1, round(sum(longer) / len(longer)))


def _bucket(prompt_tokens: int) -> int:
    return max(0, int(prompt_tokens) - 1).bit_length()


@dataclass(frozen=True, slots=True)
class OngoingRequest:
    """A request placed on a worker and not finished."""

    num_prompt_tokens: int
    num_generated_tokens: int = 0
    predicted_output_tokens: int = 1
    """Total output predicted at placement (re-predicted by the scorer once outlived)."""
    decode_s: float = 0.0
    """Time it has spent decoding so far (for the slack of constraint (d))."""
    prefilled: bool = True
    """False while its prompt still waits to be prefilled on this worker (mixed mode)."""


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    requests: tuple[OngoingRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    feasible: bool
    excess: float
    """Worst relative excess over the constraints (0 when feasible)."""
    norm: float
    """capacity_norm of the worker before placement."""


@dataclass(frozen=True, slots=True)
class AladdinPacking:
    kind: ClassVar[str] = "aladdin-pack"
    perf: AladdinPerfModel = field(default_factory=AladdinPerfModel)
    ttft_slo_s: float = 0.6
    """T_pre (Llama2-13B on A100, Table 2)."""
    atgt_slo_s: float = 0.03
    """T_dec (Llama2-13B on A100, Table 2)."""
    gamma: float = 0.5
    """Strictness of (b): 0 protects the next iteration, 1 the last (paper default 0.5)."""
    theta: float = 0.9
    """Safety factor against prediction error, in (0, 1]."""
    mixed: bool = False
    """Mixed (colocated) workers: also check (c) and (d). Split-phase decode workers: not."""
    projected_slack: bool = False
    """(d) over the whole request's projected slack instead of the banked slack (see
    `_least_slack`); a sensitivity knob, off as the spec reads the paper."""
    max_batch: int = 256
    """B_max: the engine's batch cap, which normalises capacity_norm's first component."""
    lengths: ConditionalMeanLengths | None = field(default=None, compare=False)
    """Output-length predictor; None: `RequestView.predicted_output_tokens`, else max_tokens."""
    load_of: Callable[[EndpointId], WorkerLoad] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.gamma <= 1 or not 0 < self.theta <= 1:
            raise ValueError("gamma must be in [0, 1] and theta in (0, 1]")
        if self.ttft_slo_s <= 0 or self.atgt_slo_s <= 0 or self.max_batch < 1:
            raise ValueError("SLOs must be > 0 and max_batch >= 1")

    # -- prediction ------------------------------------------------------------------------

    def predict(self, req: RequestView) -> int:
        if self.lengths is not None:
            return min(req.max_tokens, self.lengths.predict(req.num_prompt_tokens))
        if req.predicted_output_tokens is not None:
            return max(1, req.predicted_output_tokens)
        return max(1, req.max_tokens)

    def _predicted_total(self, r: OngoingRequest) -> int:
        if r.num_generated_tokens < r.predicted_output_tokens:
            return r.predicted_output_tokens
        if self.lengths is not None:
            return self.lengths.predict(r.num_prompt_tokens, r.num_generated_tokens)
        return r.num_generated_tokens + 1

    # -- constraints -----------------------------------------------------------------------

    def check(self, new: OngoingRequest, load: WorkerLoad, kv_capacity: float) -> Verdict:
        """Constraints (b)-(e) for `new` joining a worker with `load` and KV capacity M."""
        perf = self.perf
        reqs = load.requests
        n = len(reqs)
        ctx = np.empty(n + 1)
        rem = np.empty(n + 1)
        for i, r in enumerate(reqs):
            ctx[i] = r.num_prompt_tokens + r.num_generated_tokens
            rem[i] = max(1, self._predicted_total(r) - r.num_generated_tokens)
        ctx[n] = new.num_prompt_tokens
        rem[n] = max(1, new.predicted_output_tokens)
        eff = ctx + self.gamma * rem
        b = n + 1
        excess = 0.0
        # (b) ATGT: the batch's weighted context within θ of Eq 4's budget.
        budget = self.theta * perf.context_budget(b, self.atgt_slo_s)
        total = float(eff.sum())
        excess = max(excess, total / budget - 1 if budget > 0 else 1.0 + total)
        # (e) KV over time: peaks are just before a request finishes.
        excess = max(excess, _kv_peak(perf, ctx, rem) / kv_capacity - 1)
        if self.mixed:
            # (c) TTFT: prompts queued here plus this one, in one prefill.
            queued = sum(r.num_prompt_tokens for r in reqs if not r.prefilled)
            t_pre = perf.prefill_s(queued + new.num_prompt_tokens)
            excess = max(excess, t_pre / self.ttft_slo_s - 1)
            # (d) the prefill stalls the ongoing decodes: it may use θ of the least slack.
            slack = self._least_slack(reqs, perf.decode_s(float(ctx[:n].sum()), n))
            if slack is not None:
                stall = perf.prefill_s(new.num_prompt_tokens)
                allowed = self.theta * slack
                excess = max(excess, stall / allowed - 1 if allowed > 0 else 1.0 + stall)
        cur_b = n
        cur_budget = perf.context_budget(max(cur_b, 1), self.atgt_slo_s)
        ctx_part = float(eff[:n].sum()) / cur_budget if cur_budget > 0 else 1.0
        norm = math.hypot(cur_b / self.max_batch, ctx_part)
        return Verdict(excess <= 0, max(0.0, excess), norm)

    def _least_slack(self, reqs: Sequence[OngoingRequest], iteration_s: float) -> float | None:
        """Least slack among decoding requests; None when none is decoding.

        Banked (default, research C.4.1 (d)): T_dec·(l_gen − 1) − t_dec, the ATGT budget of the
        tokens decoded so far minus the time they took: a stall within it leaves every request's
        ATGT so far within the SLO, and (b) keeps later iterations within it. Projected
        (`projected_slack`, the other reading of the paper's `T_dec·l^out − t^dec`): the whole
        request's budget T_dec·(l_pred − 1) minus time so far plus the remaining tokens at the
        current iteration time; it admits more but drifts to the SLO's edge as stalls add up.
        """
        least: float | None = None
        for r in reqs:
            if not r.prefilled or r.num_generated_tokens < 1:
                continue
            if self.projected_slack:
                total = self._predicted_total(r)
                spent = r.decode_s + (total - r.num_generated_tokens) * iteration_s
                slack = self.atgt_slo_s * (total - 1) - spent
            else:
                slack = self.atgt_slo_s * (r.num_generated_tokens - 1) - r.decode_s
            if least is None or slack < least:
                least = slack
        return least

    def _view_load(self, e: EndpointView) -> tuple[WorkerLoad, float]:
        """Without `load_of`: one pseudo-request per running request, sharing the KV in use."""
        size = e.kv_block_size
        total = e.kv_total_blocks * size
        batch = max(e.inflight, e.num_running + e.num_waiting)
        used = max(0, e.kv_total_blocks - e.kv_free_blocks) * size
        if batch == 0:
            return WorkerLoad(), float(total)
        each = used // batch
        reqs = tuple(OngoingRequest(each, 0, 1) for _ in range(batch))
        return WorkerLoad(reqs), float(total)

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        new = OngoingRequest(req.num_prompt_tokens, 0, self.predict(req), prefilled=False)
        scores: dict[EndpointId, float] = {}
        for e in eps:
            if self.load_of is not None:
                load, cap = self.load_of(e.id), float(e.kv_total_blocks * e.kv_block_size)
            else:
                load, cap = self._view_load(e)
            if cap <= 0:
                scores[e.id] = 0.0
                continue
            v = self.check(new, load, cap)
            if v.feasible:
                scores[e.id] = 0.5 + 0.49 * min(1.0, v.norm / math.sqrt(2))
            else:
                scores[e.id] = 0.49 * (1 - min(1.0, v.excess))
        return scores


def _kv_peak(perf: AladdinPerfModel, ctx: np.ndarray, rem: np.ndarray) -> float:
    """max_k Σ_{j: k <= rem_j} kv(ctx_j + k), k = 0 the current iteration: w_j runs from
    kv(ctx_j) to kv(ctx_j + rem_j) (its last token's KV) and drops to 0 after, so the maxima sit
    at k = rem_j for some j: evaluate there only."""
    order = np.argsort(rem)
    r_sorted = rem[order]
    c_sorted = ctx[order]
    # Requests alive at k = r_sorted[i] are those with rem >= k: index >= i (ties: the first
    # index of a tie group counts them all, later ones undercount and lose the max).
    suffix_ctx = np.cumsum(c_sorted[::-1])[::-1]
    alive = np.arange(len(r_sorted), 0, -1, dtype=float)
    k = r_sorted
    totals = perf.kv_slope * (suffix_ctx + alive * k) + perf.kv_intercept * alive
    return float(totals.max()) if len(totals) else 0.0


# -- Alg. 2: prediction-error re-balancing of new requests (pure; run by the simulator's
# sim.reproductions.aladdin_cluster) --


@dataclass(frozen=True, slots=True)
class PredictionError:
    """A worker's accumulated output-length error l_e and batch-size error b_e (Alg. 2)."""

    length: float = 0.0
    batch: float = 0.0

    def iteration_s(self, perf: AladdinPerfModel) -> float:
        """Δt = k₂·l_e + c₂·b_e: how far its decode iteration is off the plan (C.4.3 [REC])."""
        return perf.k2 * self.length + perf.c2 * self.batch

    def distance(self, perf: AladdinPerfModel) -> float:
        """|k₂·l_e + c₂·b_e| / √(k₂² + c₂²): the error line's distance to the origin."""
        return abs(self.iteration_s(perf)) / math.hypot(perf.k2, perf.c2)


def prediction_error(
    ongoing: Sequence[OngoingRequest],
    finished: Sequence[tuple[int, int]],
    lengths: ConditionalMeanLengths | None = None,
) -> PredictionError:
    """Alg. 2's per-worker error. Ongoing requests past their prediction add the re-predicted
    increment l' − l_pred (C.4.3 [REC]; +1 token without a table) and one to the batch error;
    finished requests (real, predicted) that ended early subtract real − predicted and one."""
    length = batch = 0.0
    for r in ongoing:
        if r.num_generated_tokens > r.predicted_output_tokens:
            again = (
                lengths.predict(r.num_prompt_tokens, r.num_generated_tokens)
                if lengths is not None
                else r.num_generated_tokens + 1
            )
            length += again - r.predicted_output_tokens
            batch += 1
    for real, predicted in finished:
        if real < predicted:
            length += real - predicted
            batch -= 1
    return PredictionError(length, batch)


def rebalance(
    errors: Mapping[EndpointId, PredictionError],
    pending: Mapping[str, tuple[EndpointId, int]],
    perf: AladdinPerfModel,
    max_moves: int = 64,
) -> dict[str, EndpointId]:
    """Alg. 2, greedily (C.4.3 [REC]): move placed-but-not-started requests (`pending`: id ->
    (worker, predicted output)) from the most over-running worker (largest Δt) to the most
    under-running one while a move lowers Σ_i distance_i. Returns the moves (id -> new worker).

    Ongoing requests never move. The caller re-checks (b)-(e) on the target and drops a move
    that breaks them. With every error 0 (a perfect predictor) no move helps: none is made."""
    err = {e: (v.length, v.batch) for e, v in errors.items()}
    where = {rid: w for rid, (w, _) in pending.items()}
    moves: dict[str, EndpointId] = {}
    norm = math.hypot(perf.k2, perf.c2)

    def dist(e: EndpointId) -> float:
        length, batch = err[e]
        return abs(perf.k2 * length + perf.c2 * batch) / norm

    def delta(e: EndpointId) -> float:
        length, batch = err[e]
        return perf.k2 * length + perf.c2 * batch

    for _ in range(max_moves):
        if len(err) < 2:
            break
        src = max(err, key=lambda e: (delta(e), e))
        dst = min(err, key=lambda e: (delta(e), e))
        if delta(src) <= 0 or delta(dst) >= 0:
            break
        before = dist(src) + dist(dst)
        best: tuple[float, str] | None = None
        for rid, (_, pred) in sorted(pending.items()):
            if where[rid] != src:
                continue
            (ls, bs), (ld, bd) = err[src], err[dst]
            after = (
                abs(perf.k2 * (ls - pred) + perf.c2 * (bs - 1))
                + abs(perf.k2 * (ld + pred) + perf.c2 * (bd + 1))
            ) / norm
            if after < before - 1e-12 and (best is None or after < best[0]):
                best = (after, rid)
        if best is None:
            break
        rid = best[1]
        pred = pending[rid][1]
        ls, bs = err[src]
        ld, bd = err[dst]
        err[src] = (ls - pred, bs - 1)
        err[dst] = (ld + pred, bd + 1)
        where[rid] = dst
        if dst == pending[rid][0]:
            moves.pop(rid, None)
        else:
            moves[rid] = dst
    return moves


@dataclass(frozen=True, slots=True)
class RebalanceOutcome:
    moved: tuple[tuple[str, EndpointId], ...] = ()
    """(request, new worker), in the order applied."""
    refused: tuple[str, ...] = ()
    """Moves `rebalance` proposed that (b)-(e) at the target or the owner refused."""


def plan_rebalance(
    packing: AladdinPacking,
    ongoing: Mapping[EndpointId, Sequence[OngoingRequest]],
    finished: Mapping[EndpointId, Sequence[tuple[int, int]]],
    pending: Mapping[str, tuple[EndpointId, OngoingRequest]],
    capacity: Callable[[EndpointId], float],
    apply: Callable[[str, EndpointId], bool],
    lengths: ConditionalMeanLengths | None = None,
) -> RebalanceOutcome:
    """One Alg. 2 heartbeat. `ongoing`: per worker, its requests that stay (a key for every
    worker holding pending requests too); `finished`: per worker, (real, predicted) of requests
    that ended before their prediction and still count; `pending`: requests placed but not
    started (id -> (worker, the request as it would join)); `capacity`: a worker's KV capacity
    M; `apply(id, worker)`: the owner moves it (False: it could not). Each proposed move is
    re-checked against (b)-(e) at the target, with the pending requests that stay or moved
    there, before it is applied."""
    if not pending:
        return RebalanceOutcome()
    errors = {
        eid: prediction_error(ongoing.get(eid, ()), finished.get(eid, ()), lengths)
        for eid in set(ongoing) | set(finished)
    }
    moves = rebalance(
        errors,
        {rid: (eid, new.predicted_output_tokens) for rid, (eid, new) in pending.items()},
        packing.perf,
    )
    if not moves:
        return RebalanceOutcome()
    queued: dict[EndpointId, list[OngoingRequest]] = {}
    for rid, (eid, new) in pending.items():
        if rid not in moves:
            queued.setdefault(eid, []).append(new)
    moved: list[tuple[str, EndpointId]] = []
    refused: list[str] = []
    for rid, eid in sorted(moves.items()):
        src, new = pending[rid]
        here = [*ongoing.get(eid, ()), *queued.get(eid, ())]
        if packing.check(new, WorkerLoad(tuple(here)), capacity(eid)).feasible and apply(rid, eid):
            queued.setdefault(eid, []).append(new)
            moved.append((rid, eid))
        else:
            queued.setdefault(src, []).append(new)
            refused.append(rid)
    return RebalanceOutcome(tuple(moved), tuple(refused))


_conforms: tuple[type[Scorer], ...] = (AladdinPacking,)

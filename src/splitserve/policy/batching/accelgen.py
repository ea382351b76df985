"""AccelGen step policy: SLO-guaranteed dynamic chunking, SLO-slack order, multi-resource batching.

AccelGen (Shen & Sen, "ACCELGEN: Heterogeneous SLO-Guaranteed High-Throughput LLM Inference
Serving for Diverse Applications"; seeds/accelgen.txt §4, research/seed-accelgen-bros.md PART A).
One engine serves short and long prompts whose requests carry their own iteration-level SLOs (a
TTFT for prompt processing, a TBT for each generated token, or a job-level JCT for offline
requests). Every iteration the policy:

1. **orders** every runnable request by remaining time `T_r = SLO - T_w - T_e` (§4.3), with
   `T_e = N_ck * T_max`, `N_ck = ceil(S_r / L_c)` (1 for a token-generation task) and `T_w` the
   wait since the request (re-)entered the queue (on arrival, on preemption, or when its last
   token came out); requests with `T_r < (1 + urgent_margin) * T_max` are **urgent**;
2. sets the **token budget** `S_b = S_pf * SLO_min / T_pf` (Eq. 6, §4.2), SLO_min being the
   tightest iteration-level SLO of the requests that can enter the batch;
3. builds the batch with **Algorithm 1** (§4.4): urgent requests (and the running token-generation
   tasks, "retained as much as possible") go first in ascending `T_r`; what does not fit the
   budget waits (the max-`T_r` members lose), and when KV blocks run short the running request
   with the largest `T_r` is preempted (vLLM's recompute);
4. fills what is left with **Algorithm 2**: among the waiting requests with `T_r <= T_r^1 + gamma`
   it repeatedly takes the one whose (compute, KV) demand is nearest, in Euclidean distance, to the
   (compute, KV) still available; prompts are cut to what the budget or the free KV allows
   (**dynamic chunking**, token-exact: S_f reaches S_b), and a new long prompt does not start
   while another long prompt is mid-prefill (**Exclusive Request Allocation**, ERA).

Ablation switches (the paper's §6.3 /Chunk, /Order, /Batch): `dynamic_chunking=False` (fixed
budget `S_pf`, whole prompts, no ERA), `slo_ordering=False` (arrival order, no urgent set, the
window is the whole queue, so SLO_min is the tightest SLO in the queue: the FIFO of O4),
`multi_resource=False` (the window is filled in order, token by token, as FCFS chunking does).
`era=False` removes ERA alone (Fig. 6's spread allocation).

Choices where the paper is silent or the spec and paper differ (spec A7; the paper wins):

* `T_max` ("maximum batch execution time") is the maximum *predicted* step time over the last
  `t_max_window` decisions, priced by the policy's `LatencyModel` (A7-1; a live engine could feed
  measured times instead). `T_pf` is the model's time for one `S_pf`-token prefill chunk unless
  `pivot_time_s` is given.
* SLO_min ("minimum SLO of the requests in the batch", A7-2) is the raw iteration-level SLO (TBT
  for a token, TTFT for a prompt) over the urgent set, the retained tasks and the candidate
  window, in `budget_slo="raw"` (the paper); `"slack"` uses each request's time left to its
  next-token deadline divided by its remaining iterations. `budget_mode="model"` inverts the
  latency model instead of Eq. 6 (A3.2 "model mode"). S_b is clamped to
  [`min_budget_tokens`, `max_budget_tokens`].
* Requests already past their deadline stay urgent (A7-3, faithful).
* ERA's "completed" means the long prompt's prefill is done (A7-4); "long" is a prompt of at least
  `long_prompt_tokens` (4K, the paper's definition). Urgent long prompts are never held back.
* Alg. 2 cuts every prompt (not only long ones) to the budget or the free KV, so the token-exact
  chunking of §4.2 ("select tokens regardless of request until S_f = S_b") holds; the distance is
  in raw tokens (A7-6), `normalise_distance=True` divides each term by its capacity.
* A token-generation task not picked this iteration keeps its KV (it is not evicted); only KV
  overflow preempts. A preempted task re-enters the queue with its clock reset (§4.3) and, our
  engine recomputing (vLLM's default, A7-13), needs `ceil(S_r / L_c)` chunks.
* Offline requests: classes named in `jct_slo_s` carry a JCT SLO, converted to an allowed wait per
  iteration `(SLO_JCT - T_e) / (N_ck + S_g)` with `T_e = N_ck*T_max + S_g*(T_max + P_max*P)`;
  the carry-over of §4.3 is kept by anchoring iteration k's deadline at
  `arrival + k*(allowed + T_max) + allowed`. S_g (the predicted output) is `SeqView.max_tokens`:
  the only length a live engine knows (the user's cap, an upper bound); online requests never
  read it. `P_max`, `P` are parameters (the paper estimates them online and reports no values).
* The policy is stateful (it learns T_max, the mean chunk length L_c and when each request's last
  token came out from consecutive views), so it declares `steady_decode = False`: the engine then
  consults it every step. Pure: no I/O, no clock; decisions depend only on the views seen.

Invariants (property-tested in tests/unit/policy/batching/test_accelgen.py): a decision never
schedules more new KV blocks than are free after its preemptions, every chunk lies within its
sequence's uncomputed tokens, no sequence appears twice, preempted sequences are running ones; the
budget is exceeded only by decode tokens of urgent/retained tasks or, with chunking off, by one
whole prompt.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.kv import blocks_for
from splitserve.core.perf import HARDWARE, MODELS, BatchShape, LatencyModel, RooflineModel
from splitserve.core.request import DEFAULT_SLO_CLASS, SloClass
from splitserve.policy.batching.base import BatchingPolicy, SeqView, StepDecision, StepView

READING_SPEED_CLASS = SloClass(SloClassName("accelgen-reading"), ttft_ms=2000.0, tpot_ms=187.5)
"""The paper's default TBT: reading speed, 0.1875 s per token (§4.3)."""


def default_latency_model() -> LatencyModel:
    """The paper's first set-up: OPT-13B on one A100-80GB (roofline, no profile)."""
    return RooflineModel(MODELS["opt-13b"], HARDWARE["a100-80g"])


class BudgetMode(StrEnum):
    EQ6 = "eq6"
    """S_b = S_pf * SLO_min / T_pf (the paper's Eq. 6)."""
    MODEL = "model"
    """Largest S_b whose predicted step time is within SLO_min (spec A3.2, "model mode")."""


class BudgetSlo(StrEnum):
    RAW = "raw"
    """SLO_min = the smallest raw iteration-level SLO (TBT or TTFT) in the batch (the paper)."""
    SLACK = "slack"
    """SLO_min = the smallest (next deadline - now) / remaining iterations (spec A7-2)."""


@dataclass(frozen=True, slots=True)
class AccelGenParams:
    latency: LatencyModel = field(default_factory=default_latency_model)
    """Prices steps: T_pf, T_max (and S_b in `budget_mode="model"`). Default: OPT-13B, A100."""
    slo_classes: tuple[SloClass, ...] = (DEFAULT_SLO_CLASS, READING_SPEED_CLASS)
    """TTFT (ttft_ms) and TBT (tpot_ms) targets by `SeqView.slo_class`; unknown names use the
    first class."""
    jct_slo_s: Mapping[str, float] = field(default_factory=dict)
    """Offline classes: class name -> JCT SLO in seconds (§4.3 "SLOs of offline applications")."""
    pivot_tokens: int = 768
    """S_pf, the forward size at which throughput saturates: 768 for OPT-13B, 1280 for OPT-175B
    (§3.1)."""
    pivot_time_s: float = 0.0
    """T_pf, the step time at S_pf; 0 = priced by `latency` (the paper measures it, no value)."""
    budget_mode: BudgetMode = BudgetMode.EQ6
    budget_slo: BudgetSlo = BudgetSlo.RAW
    min_budget_tokens: int = 32
    max_budget_tokens: int = 8192
    gamma_s: float = 0.75
    """Candidate window on T_r beyond the first non-urgent request (γ = 0.75 s, §6.1)."""
    urgent_margin: float = 0.1
    """Urgent iff T_r < (1 + margin) * T_max (the paper's "T_r ≈ T_max", spec A7-3)."""
    t_max_window: int = 50
    """Decisions over which T_max is the maximum predicted step time (spec A7-1)."""
    long_prompt_tokens: int = 4096
    """A long prompt has at least this many tokens (§1: "long prompts (containing ≥ 4K)")."""
    max_num_seqs: int = 256
    preempt_max_s: float = 2.0
    """P_max: longest preemption, for the JCT conversion."""
    preempt_prob: float = 0.01
    """P: probability a token generation is followed by a preemption, for the JCT conversion."""
    # Ablation switches (§6.3).
    dynamic_chunking: bool = True
    """Chunk: Eq. 6 budget, token-exact chunking and ERA. Off: fixed S_pf budget, whole prompts."""
    slo_ordering: bool = True
    """Order: remaining-time order, urgent set, JCT conversion. Off: arrival order."""
    multi_resource: bool = True
    """Batch: Alg. 2's Euclidean best fit. Off: the window is filled in order."""
    era: bool = True
    """Exclusive Request Allocation (only with `dynamic_chunking`)."""
    evict_for_admission: bool = False
    """Let an urgent *waiting* request preempt running ones (Alg. 1 read literally). Off: only
    running requests that must grow preempt, vLLM's rule, which the paper says it relies on
    (§5: "we directly use vLLM to handle KVC overflow and preemptions"); on, with OPT-13B's 12 GB
    cache (about five requests), evicted tasks come back urgent and evict in turn (measured:
    thousands of recomputes in the reproduction's workload)."""
    retain_decodes: bool = True
    """Running token-generation tasks join the batch with the urgent set (§4.4)."""
    normalise_distance: bool = False
    """Divide Alg. 2's compute and KV gaps by the budget and the KV capacity (spec A7-6)."""

    def __post_init__(self) -> None:
        if self.pivot_tokens < 1 or self.min_budget_tokens < 1:
            raise ValueError("pivot_tokens and min_budget_tokens must be >= 1")
        if self.max_budget_tokens < self.min_budget_tokens:
            raise ValueError("max_budget_tokens must be >= min_budget_tokens")
        if self.gamma_s < 0 or self.urgent_margin < 0 or self.pivot_time_s < 0:
            raise ValueError("gamma_s, urgent_margin and pivot_time_s must be >= 0")
        if self.preempt_max_s < 0 or not 0 <= self.preempt_prob <= 1:
            raise ValueError("preempt_max_s must be >= 0 and preempt_prob in [0, 1]")
        if self.t_max_window < 1 or self.long_prompt_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("t_max_window, long_prompt_tokens and max_num_seqs must be >= 1")
        if not self.slo_classes:
            raise ValueError("at least one SLO class is needed")
        object.__setattr__(self, "budget_mode", BudgetMode(self.budget_mode))
        object.__setattr__(self, "budget_slo", BudgetSlo(self.budget_slo))
        object.__setattr__(self, "slo_classes", tuple(self.slo_classes))


@dataclass(slots=True)
class _Cand:
    seq: SeqView
    running: bool
    decoding: bool
    """A running sequence with one token to compute: a returned TG task."""
    slack: float
    """T_r: time left before the request must run to meet its SLO."""
    iter_slo: float
    """The raw iteration-level SLO (TBT, TTFT, or the per-iteration share of a JCT)."""
    iter_left: float
    """(next-token deadline - now) / remaining iterations (`budget_slo="slack"`)."""
    order: int
    urgent: bool = False

    @property
    def started_long_prefill(self) -> bool:
        s = self.seq
        return self.running and s.num_output_tokens == 0 and s.num_computed_tokens > 0


def _need(seq: SeqView, n: int, block_size: int) -> int:
    tokens = seq.num_prompt_tokens if seq.remote_kv else seq.num_computed_tokens + n
    extra = blocks_for(tokens, block_size) - seq.blocks_held
    return extra if extra > 0 else 0


class AccelGenPolicy:
    name = "accelgen"
    steady_decode = False
    """Stateful (T_max, L_c, token clocks): the engine must consult it every step."""

    def __init__(self, params: AccelGenParams | None = None) -> None:
        self.params = params or AccelGenParams()
        p = self.params
        self._classes: dict[str, SloClass] = {c.name: c for c in p.slo_classes}
        self._default_class = p.slo_classes[0]
        self.pivot_time_s = p.pivot_time_s or p.latency.step_s(BatchShape(((p.pivot_tokens, 0),)))
        self._recent: deque[float] = deque(maxlen=p.t_max_window)
        self._chunk_sum = float(p.pivot_tokens)
        self._chunk_n = 1
        self._clock: dict[RequestId, tuple[int, float]] = {}
        """Per sequence: (outputs seen, when its queue clock t0 started)."""
        self.last_budget = p.pivot_tokens
        """S_b of the last decision (GPU compute utilisation = S_f / S_b)."""

    # -- estimators --------------------------------------------------------------------------

    @property
    def t_max_s(self) -> float:
        return max(self._recent) if self._recent else self.pivot_time_s

    @property
    def mean_chunk_tokens(self) -> float:
        """L_c: running mean of the prompt chunk lengths scheduled so far."""
        return self._chunk_sum / self._chunk_n

    def slo_of(self, seq: SeqView) -> SloClass:
        return self._classes.get(seq.slo_class, self._default_class)

    def budget(self, slo_min_s: float) -> int:
        """S_b for an iteration whose tightest SLO is `slo_min_s` (Eq. 6 or the model inverse)."""
        p = self.params
        if not p.dynamic_chunking:
            return p.pivot_tokens
        lo, hi = p.min_budget_tokens, p.max_budget_tokens
        if p.budget_mode is BudgetMode.EQ6:
            s = int(p.pivot_tokens * slo_min_s / self.pivot_time_s)
        else:
            step = p.latency.step_s
            if step(BatchShape(((hi, 0),))) <= slo_min_s:
                return hi
            a, b = lo, hi  # largest S with step(S) <= slo: invariant step(b) > slo
            while b - a > 1:
                mid = (a + b) // 2
                if step(BatchShape(((mid, 0),))) <= slo_min_s:
                    a = mid
                else:
                    b = mid
            s = a
        return max(lo, min(hi, s))

    def jct_allowed_wait_s(self, jct_slo_s: float, num_chunks: int, num_generated: int) -> float:
        """Allowed wait per iteration of an offline request (§4.3): (SLO_JCT - T_e) / (N + S_g)."""
        p = self.params
        t_max = self.t_max_s
        t_e = num_chunks * t_max + num_generated * (t_max + p.preempt_max_s * p.preempt_prob)
        return (jct_slo_s - t_e) / max(1, num_chunks + num_generated)

    def queue(self, view: StepView) -> list[tuple[RequestId, float, bool]]:
        """The ordered queue the next decision would see: (sequence, T_r, urgent). Read-only
        (for tests and introspection): it does not advance the policy's clocks."""
        cands = self._candidates(view)
        limit = (1 + self.params.urgent_margin) * self.t_max_s
        cands.sort(key=self._key)
        ordering = self.params.slo_ordering
        return [(c.seq.id, c.slack, ordering and c.slack < limit) for c in cands]

    # -- one iteration -----------------------------------------------------------------------

    def decide(self, view: StepView) -> StepDecision:
        p = self.params
        self._track_clocks(view)
        cands = self._candidates(view)
        if not cands:
            return StepDecision()
        t_max = self.t_max_s
        if p.slo_ordering:
            cands.sort(key=lambda c: (c.slack, c.order))
            limit = (1 + p.urgent_margin) * t_max
            for c in cands:
                c.urgent = c.slack < limit
        first: list[_Cand] = [c for c in cands if c.urgent or (p.retain_decodes and c.decoding)]
        in_first = {c.seq.id for c in first}
        # ERA first, so T_r^1 is the first non-urgent request that may start now.
        window = self._era_filter([c for c in cands if c.seq.id not in in_first], cands)
        if p.slo_ordering and window:
            edge = window[0].slack + p.gamma_s
            window = [c for c in window if c.slack <= edge]
        members = first + window
        if not members:
            members = cands
        if p.budget_slo is BudgetSlo.RAW:
            slo_min = min(c.iter_slo for c in members)
        else:
            slo_min = min(c.iter_left for c in members)
        s_b = self.budget(slo_min)
        self.last_budget = s_b

        plan = _Plan(view, s_b, self._key)
        for c in cands:
            if c.running and not c.decoding:
                plan.reserve_for(c, self._full_need(c, plan.block_size))
        victims = sorted((c for c in cands if c.running), key=self._key, reverse=True)
        # Algorithm 1: urgent (and retained) requests first; the largest T_r lose on overflow.
        for c in first:
            if plan.chosen_or_evicted(c):
                continue
            n = self._chunk_len(c, plan)
            if n <= 0 and not c.seq.remote_kv:
                continue
            need = _need(c.seq, n, plan.block_size)
            if need > plan.free and (c.running or p.evict_for_admission):
                plan.evict_for(c, need, victims)
            d = self._demand(c, plan)
            if d is not None:
                plan.take(c, *d)
        if plan.budget > 0 and plan.free > 0:
            if p.multi_resource:
                self._best_fit(window, plan)
            else:
                self._in_order(window, plan)
        if not plan.chunks:
            self._liveness(cands, plan, victims)
        decision = StepDecision(chunks=tuple(plan.chunks), preempt=tuple(plan.evicted))
        self._learn(view, plan)
        return decision

    def _key(self, c: _Cand) -> tuple[float, int]:
        """Queue position: ascending T_r (ties by arrival), or arrival order without Order."""
        return (c.slack, c.order) if self.params.slo_ordering else (0.0, c.order)

    def _liveness(self, cands: list[_Cand], plan: _Plan, victims: list[_Cand]) -> None:
        """Nothing was chosen: run the first request in queue order that fits as things are;
        if none does, run the head, evicting from the back of the queue until it fits (vLLM's
        fallback; without it sequences that all need a block could wait forever)."""
        ordered = [c for c in sorted(cands, key=self._key) if not c.seq.remote_kv]
        for c in ordered:
            if plan.chosen_or_evicted(c):
                continue
            n = self._chunk_len(c, plan) or min(c.seq.num_uncomputed_tokens, max(1, plan.budget))
            d = self._demand(c, plan, n)
            if d is not None:
                plan.take(c, *d)
                return
        for c in ordered:
            if plan.chosen_or_evicted(c):
                continue
            n = self._chunk_len(c, plan) or min(c.seq.num_uncomputed_tokens, max(1, plan.budget))
            need = _need(c.seq, n, plan.block_size)
            if need > plan.free:
                plan.evict_for(c, need, victims)
            d = self._demand(c, plan, n)
            if d is not None:
                plan.take(c, *d)
                return

    def _track_clocks(self, view: StepView) -> None:
        now = view.now_s
        clock = self._clock
        seen: set[RequestId] = set()
        for s in (*view.running, *view.waiting):
            seen.add(s.id)
            old = clock.get(s.id)
            if old is None or old[0] != s.num_output_tokens:
                # A token came out (the task returns to the queue) or a new request arrived.
                clock[s.id] = (s.num_output_tokens, now if s.num_output_tokens else s.arrival_s)
        for rid in [r for r in clock if r not in seen]:
            del clock[rid]

    def _candidates(self, view: StepView) -> list[_Cand]:
        p = self.params
        now = view.now_s
        t_max = self.t_max_s
        l_c = self.mean_chunk_tokens
        out: list[_Cand] = []
        order = 0
        for running, seqs in ((True, view.running), (False, view.waiting)):
            for s in seqs:
                remaining = s.num_uncomputed_tokens
                if remaining <= 0 and not s.remote_kv:
                    continue
                decoding = running and s.is_decoding
                n_ck = 1 if decoding or s.remote_kv else math.ceil(remaining / l_c)
                cls = self.slo_of(s)
                t0 = self._clock.get(s.id, (0, now))[1]
                jct = p.jct_slo_s.get(s.slo_class) if p.slo_ordering else None
                if jct is not None:
                    total_chunks = math.ceil(s.num_prompt_tokens / l_c)
                    allowed = self.jct_allowed_wait_s(jct, total_chunks, s.max_tokens)
                    done = math.ceil(min(s.num_computed_tokens, s.num_prompt_tokens) / l_c)
                    k = done + s.num_output_tokens
                    deadline = s.arrival_s + k * (allowed + t_max) + allowed + t_max
                    slack = deadline - now - t_max
                    iter_slo = allowed + t_max
                elif s.num_output_tokens > 0:
                    iter_slo = cls.tpot_ms / 1000.0
                    deadline = t0 + iter_slo
                    slack = iter_slo - (now - t0) - n_ck * t_max
                else:
                    iter_slo = cls.ttft_ms / 1000.0
                    deadline = s.arrival_s + iter_slo
                    slack = iter_slo - (now - s.arrival_s) - n_ck * t_max
                out.append(
                    _Cand(s, running, decoding, slack, iter_slo, (deadline - now) / n_ck, order)
                )
                order += 1
        return out

    def _is_long(self, c: _Cand) -> bool:
        s = c.seq
        return s.num_output_tokens == 0 and s.num_prompt_tokens >= self.params.long_prompt_tokens

    def _era_filter(self, window: list[_Cand], cands: list[_Cand]) -> list[_Cand]:
        """ERA (§4.2): no new long prompt starts while one is mid-prefill; one starts at a time."""
        p = self.params
        if not (p.era and p.dynamic_chunking):
            return window
        busy = any(c.started_long_prefill and self._is_long(c) for c in cands)
        out: list[_Cand] = []
        for c in window:
            if self._is_long(c) and not c.started_long_prefill:
                if busy:
                    continue
                busy = True  # the first (tightest) new long prompt may start; later ones wait
            out.append(c)
        return out

    def _chunk_len(self, c: _Cand, plan: _Plan) -> int:
        """Tokens `c` would run now within the remaining budget (0: it does not fit)."""
        s = c.seq
        if s.remote_kv:
            return 0
        remaining = s.num_uncomputed_tokens
        if c.decoding:
            return 1 if plan.budget >= 1 or c.urgent else 0
        if remaining <= plan.budget:
            return remaining
        if self.params.dynamic_chunking:
            return plan.budget
        # No chunking: a prompt larger than the budget runs whole, but only as the step's first.
        return remaining if plan.num_prompt_chunks == 0 and plan.budget > 0 else 0

    def _shrink_to_kv(self, c: _Cand, n: int, plan: _Plan) -> int:
        if c.decoding or c.seq.remote_kv or not self.params.dynamic_chunking:
            return 0
        s = c.seq
        fit = (s.blocks_held + plan.free) * plan.block_size - s.num_computed_tokens
        return max(0, min(n, fit))

    def _full_need(self, c: _Cand, block_size: int) -> int:
        """D_m (§4.4): new blocks for the whole rest of a prompt (or of a recompute), "its
        sequence length" for a first chunk, the remaining length for a later one; a token
        generation task needs a block only when its last one is full."""
        s = c.seq
        if s.remote_kv or c.decoding:
            return _need(s, 1, block_size)
        return _need(s, s.num_uncomputed_tokens, block_size)

    def _demand(self, c: _Cand, plan: _Plan, n: int = 0) -> tuple[int, int, int] | None:
        """(tokens, new blocks, D_m) of `c`'s chunk now, cut to the budget and the free KV; None
        when it cannot run. A request not yet running starts only if the KV for its whole prompt
        is free beside what running prompts still need (D_m of a first chunk)."""
        s = c.seq
        if plan.num_seqs >= self.params.max_num_seqs and not c.running:
            return None
        size = plan.block_size
        if s.remote_kv:
            need = _need(s, 0, size)
            return (0, need, need) if need <= plan.free - plan.reserved else None
        n = n or self._chunk_len(c, plan)
        if n <= 0:
            return None
        need = _need(s, n, size)
        d_m = max(need, self._full_need(c, size))
        if not c.running:
            return (n, need, d_m) if d_m <= plan.free - plan.reserved else None
        if need > plan.free:
            n = self._shrink_to_kv(c, n, plan)
            if n <= 0:
                return None
            need = _need(s, n, size)
        return n, need, d_m

    def _best_fit(self, window: list[_Cand], plan: _Plan) -> None:
        """Algorithm 2 (lines 7-13): nearest (compute, KV) demand to what is available."""
        p = self.params
        size = plan.block_size
        pool = [c for c in window if not plan.chosen_or_evicted(c)]
        cap_c = max(1, plan.budget_total)
        cap_m = max(1, plan.total_blocks * size)
        while pool and (plan.budget > 0 or any(c.seq.remote_kv for c in pool)):
            best: tuple[float, int, _Cand, tuple[int, int, int]] | None = None
            a_c, a_m = plan.budget, (plan.free - plan.reserved) * size
            for c in pool:
                d = self._demand(c, plan)
                if d is None:
                    continue
                n, _, d_m = d
                own = plan.reservation(c) * size
                gap_c, gap_m = float(a_c - n), float(a_m + own - d_m * size)
                if p.normalise_distance:
                    gap_c, gap_m = gap_c / cap_c, gap_m / cap_m
                dist = math.hypot(gap_c, gap_m)
                if best is None or (dist, c.order) < (best[0], best[1]):
                    best = (dist, c.order, c, d)
            if best is None:
                return
            _, _, c, d = best
            plan.take(c, *d)
            pool.remove(c)
            if self._is_long(c) and not c.started_long_prefill and p.era and p.dynamic_chunking:
                pool = [o for o in pool if not (self._is_long(o) and not o.started_long_prefill)]

    def _in_order(self, window: list[_Cand], plan: _Plan) -> None:
        """/Batch: take the window's tokens in queue order until S_f = S_b (FCFS chunking)."""
        for c in window:
            if plan.budget <= 0:
                return
            if plan.chosen_or_evicted(c):
                continue
            d = self._demand(c, plan)
            if d is None:
                if plan.free == 0:
                    return
                continue
            plan.take(c, *d)

    def _learn(self, view: StepView, plan: _Plan) -> None:
        """Price the decision (T_max), update L_c, and restart the clocks of preempted tasks."""
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        for c, n in plan.taken:
            s = c.seq
            if n == 0:
                continue
            if c.decoding and n == 1:
                decode.append(s.num_computed_tokens)
            else:
                prefill.append((n, s.num_computed_tokens))
                if s.num_output_tokens == 0:
                    self._chunk_sum += n
                    self._chunk_n += 1
        if prefill or decode:
            self._recent.append(
                self.params.latency.step_s(BatchShape(tuple(prefill), tuple(decode)))
            )
        for rid in plan.evicted:
            outputs = self._clock.get(rid, (0, view.now_s))[0]
            if outputs:
                self._clock[rid] = (outputs, view.now_s)


class _Plan:
    """The batch being built: budget, free blocks, chosen chunks, evictions."""

    def __init__(
        self,
        view: StepView,
        budget: int,
        key: Callable[[_Cand], tuple[float, int]],
    ) -> None:
        self.key = key
        self.budget = budget
        self.budget_total = budget
        self.free = view.free_blocks
        self.total_blocks = view.total_blocks
        self.block_size = view.block_size
        self.chunks: list[tuple[RequestId, int]] = []
        self.taken: list[tuple[_Cand, int]] = []
        self.evicted: list[RequestId] = []
        self._done: set[RequestId] = set()
        self.num_prompt_chunks = 0
        self.num_seqs = len(view.running)
        self.reserved = 0
        """Blocks the running prompts still need to finish (not free for new requests)."""
        self._reserved_by: dict[RequestId, int] = {}

    def chosen_or_evicted(self, c: _Cand) -> bool:
        return c.seq.id in self._done

    def reservation(self, c: _Cand) -> int:
        return self._reserved_by.get(c.seq.id, 0)

    def reserve_for(self, c: _Cand, blocks: int) -> None:
        self.reserved += blocks - self._reserved_by.pop(c.seq.id, 0)
        if blocks:
            self._reserved_by[c.seq.id] = blocks

    def take(self, c: _Cand, n: int, need: int, d_m: int | None = None) -> None:
        if d_m is not None and not c.decoding:
            self.reserve_for(c, max(0, d_m - need))
        self.chunks.append((c.seq.id, n))
        self.taken.append((c, n))
        self._done.add(c.seq.id)
        self.free -= need
        self.budget = max(0, self.budget - n)
        if not c.decoding and n > 0:
            self.num_prompt_chunks += 1
        if not c.running:
            self.num_seqs += 1

    def evict_for(self, c: _Cand, need: int, victims: list[_Cand]) -> None:
        """Alg. 1 lines 2-3: preempt the running requests behind `c` in the queue, the largest
        T_r first (without Order: the latest admitted, as vLLM does)."""
        key = self.key(c)
        for victim in victims:
            if need <= self.free:
                return
            if victim.seq.id in self._done or victim.seq.id == c.seq.id:
                continue
            if self.key(victim) <= key:
                return
            self.evicted.append(victim.seq.id)
            self.reserve_for(victim, 0)
            self._done.add(victim.seq.id)
            self.free += victim.seq.blocks_held
            self.num_seqs -= 1


def make(**params: Any) -> BatchingPolicy:
    """Registered as "accelgen"; params are `AccelGenParams` fields."""
    return AccelGenPolicy(AccelGenParams(**params))

"""BROS step policy: real-time (RT) and best-effort (BE) requests co-served on one engine.

BROS (Efficient LLM Serving on Hybrid Real-time and Best-effort Requests; seeds/bros.txt §3-§5,
research/seed-accelgen-bros.md B2-B6). Every step is an iteration-level packing problem: each RT
request's next-token deadline is a constraint, BE throughput the objective. Requests not chosen
keep their KV and wait (iteration-level preemption without eviction).

* **Dynamic priority (Alg. 1 lines 3-15).** RT requests (running and waiting alike) are ordered
  by their residual time τ_i = S_i − e_i − (r_i − 1)·T̄: the time left to the current token
  (group)'s deadline once the group's other tokens run back to back. TTFT deadlines count from
  arrival, TPOT deadlines from the previous returned token (a relative, per-gap deadline). The most
  urgent residual is τ_min. RT requests join in that order until the batch holds Bsz sequences, no
  free or preemptible blocks remain, or the cost model says the batch would outlast τ_min (the
  *early return*: no BE is packed and Bsz resets).
* **BE packing and replacement (lines 17-33).** BE requests, ordered by their swap-in overhead
  (ours: tokens to recompute, see below), fill the rest of the batch while it stays under τ_min;
  once the batch is full a BE replaces the least urgent RT in it when that RT can skip this
  iteration and still meet its deadline (e_v + T_new + r_v·T̄ ≤ S_v), the BE brings no more
  swap-in than the RT, and the new batch still fits τ_min.
* **Adaptive batch size (§4.2).** TCP-like: start at `bsz_init`, +`bsz_step` after every step
  without the early return, back to `bsz_init` on it, never above `max_num_seqs`.
* **Cost model (§4.1).** Offline profile of the engine at powers of two, fitted as two linear
  models, prefill `a0 + a1·L_in + a2·Σ l·(c + l)` and decode `d0 + d1·n_dec + d2·L_ctx`, summed for
  a mixed batch (`CostModel`). The profile runs against the `LatencyModel` the policy is given
  (default: the paper's OPT-13B on 2× A100-40GB, roofline), so the estimate has the linear fit's
  error, as the paper's does. T̄ is an EWMA (α 0.2) of the estimates of dispatched batches.

Bidirectional KV sharing (§5) is approximated at block granularity. Our engine (`EngineModel`)
keeps a whole-block ledger with no slot-level sharing; given host swap space it can checkpoint
the last k blocks of a running sequence (`StepDecision.checkpoint`: their KV to host, restored and
priced before its next step), swap a whole sequence out, or preempt it (recompute). What the
policy does:

* FindPreemptBlock: when an RT request needs blocks and none are free, the policy takes them off
  idle running BE. With host space it checkpoints only the blocks the RT lacks off the tails of
  the BE holding the most blocks (the paper lazily checkpoints only the BE slots the RT
  overwrites; we move whole blocks, up to 15 slots more). What checkpoints cannot cover (host
  full) is evicted as before: BE fewest blocks first, swapped out whole while the host has room,
  else recomputed; then less urgent idle RT (the paper's extreme case, by residual time),
  recomputed (swapped with `swap_rt`). Without host space every eviction recomputes (the
  earlier approximation, bit for bit); the recompute is priced by the cost model (a prefill),
  standing in for T_swap = f(M_ckpt). Swap-ins are priced by the owner, not the cost model.
* BE order by checkpointed slots: by tokens to recompute, then by checkpointed tokens (0 for a
  BE whose KV is intact, fresh prompts included), so an evicted or checkpointed BE is packed
  after intact ones, as in the paper.
* Because reclaiming BE memory costs a full recompute without host space, a BE prompt (or a
  recompute, or a swap-in) is admitted only while the blocks the RT requests need next stay
  free (`reserve_for_rt`, ours, not the paper's): the waiting RT's next chunks plus one block
  per running RT. Without it a 10-minute run thrashes (ShareGPT 9 req/s: 47k evictions, TPOT
  attainment 27 %).
* Sub-block sharing (an RT and a BE tail in one block, saving under one block per pair) is not
  modelled. `kv_sharing=False` is the paper's "No Bi-cache" ablation: an RT request that cannot
  get blocks is itself preempted (recomputed) instead of taking BE memory.

Reconstructions where the paper's equations and Alg. 1 body were lost (research B10), noted in
place: requests whose deadline is already out of reach (τ_i below their solo iteration time) are
served after the reachable RT and before BE, and τ_min then comes from the reachable ones only
(or, with none reachable, the smallest SLO budget among the late ones); the first RT of a batch is
always admitted, so no step is empty while work exists; `skip_oversized` tries smaller RT after
one that breaks τ_min instead of stopping. Output lengths are never read (`max_tokens` is only a
cap): BROS needs none.

`scheduler="rr"` is the paper's RR baseline: BROS's engine with iteration-level round-robin
between two FCFS queues (RT, BE), a fixed batch size and no KV sharing (a sequence that cannot get
blocks evicts the latest-arrived idle running one, recompute, as vLLM does).

Invariants (property-tested in tests/unit/policy/batching/test_bros.py): every decision passes
`EngineModel` validation; no step is empty while a sequence can run; Bsz stays in
[bsz_init, max_num_seqs].

The policy is stateful (Bsz, T̄, each RT request's last-token time, which it learns by watching
`num_output_tokens` grow between calls) but has no I/O and reads no clock: time is `view.now_s`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.perf import HARDWARE, MODELS, BatchShape, LatencyModel, RooflineModel
from splitserve.core.request import SloClass
from splitserve.policy.batching.base import BatchingPolicy, SeqView, StepDecision, StepView

REALTIME = SloClassName("realtime")
BEST_EFFORT = SloClassName("best-effort")

PAPER_SLO = SloClass(REALTIME, ttft_ms=400.0, tpot_ms=200.0)
"""The paper's RT targets (§7.1): TTFT 0.4 s, TPOT 0.2 s."""


class Stop(StrEnum):
    """Why the RT pass of the last step ended (observability for tests and tuning)."""

    EXHAUSTED = "exhausted"
    """Every RT request was considered."""
    BATCH_SIZE = "batch-size"
    DEADLINE = "deadline"
    """The early return: the batch would outlast τ_min."""
    BLOCKS = "blocks"
    """No empty or preemptible blocks for the next RT request."""


class Scheduler(StrEnum):
    BROS = "bros"
    ROUND_ROBIN = "rr"
    """The paper's RR baseline: alternate iterations between an RT and a BE FCFS queue."""


def default_latency() -> LatencyModel:
    """The paper's main testbed: OPT-13B, TP 2 on A100-SXM4-40GB (roofline)."""
    return RooflineModel(MODELS["opt-13b"], HARDWARE["a100-40g"], tp=2)


@dataclass(frozen=True, slots=True)
class BrosParams:
    realtime: tuple[SloClass, ...] = (PAPER_SLO,)
    """The real-time classes and their TTFT / TPOT targets; every other class is best-effort."""
    latency: LatencyModel | None = None
    """What the cost model is profiled against; None = `default_latency()`."""
    bsz_init: int = 8
    """Initial (and backoff) batch size. Lost in the paper; research B5 default."""
    bsz_step: int = 1
    """Additive growth per step without an early return ("gradual"; lost, research B5)."""
    max_num_seqs: int = 256
    """Bsz_max, and the RR baseline's fixed batch size."""
    group_size: int = 1
    """Tokens per latency group: a group of g tokens after the first has budget g·TPOT."""
    ewma_alpha: float = 0.2
    """Weight of the newest iteration in T̄ (research B4)."""
    adaptive_batch: bool = True
    """False: Bsz fixed at `max_num_seqs` (ablation)."""
    be_fill: bool = True
    """False: RT only, the paper's microbenchmark (BE packing removed)."""
    be_replace: bool = True
    """Replace deferrable RT in a full batch by BE (ablation switch)."""
    kv_sharing: bool = True
    """RT may take BE memory (the Bi-cache, approximated); False = "No Bi-cache" ablation."""
    swap_rt: bool = False
    """With host swap space, swap out (rather than recompute) the idle RT evicted for a more
    urgent one (the paper's extreme case). Off by default: a swapped RT returns as a cheap
    decode that evicts the next RT, and runs cascade (docs/reproductions/bros.md)."""
    reserve_for_rt: bool = True
    """[ours] BE may take blocks for a prompt (or a recompute) only while the blocks RT requests
    need next stay free: our evictions recompute, where the paper's lazy checkpoint is cheap."""
    skip_oversized: bool = False
    """Try later RT after one that breaks τ_min instead of stopping (research B10-5)."""
    sum_intercepts: bool = True
    """Cost of a mixed batch = prefill model + decode model, both intercepts (the paper's sum);
    False counts the fixed cost once ("joint")."""
    max_context_tokens: int = 2048
    """Longest sequence the cost model is profiled for (OPT's context window)."""
    scheduler: Scheduler = Scheduler.BROS

    def __post_init__(self) -> None:
        if not 1 <= self.bsz_init <= self.max_num_seqs:
            raise ValueError("need 1 <= bsz_init <= max_num_seqs")
        if self.bsz_step < 0 or self.group_size < 1 or self.max_context_tokens < 1:
            raise ValueError("need bsz_step >= 0, group_size >= 1, max_context_tokens >= 1")
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError("ewma_alpha must be in (0, 1]")
        object.__setattr__(self, "realtime", tuple(self.realtime))
        object.__setattr__(self, "scheduler", Scheduler(self.scheduler))


# -- cost model -----------------------------------------------------------------------------------


def _solve3(a: list[list[float]], b: list[float]) -> tuple[float, float, float]:
    """Solve a 3×3 linear system by Gaussian elimination with partial pivoting."""
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if m[col][col] == 0:
            raise ValueError("singular profile: cannot fit the cost model")
        for r in range(col + 1, 3):
            f = m[r][col] / m[col][col]
            for k in range(col, 4):
                m[r][k] -= f * m[col][k]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (m[r][3] - sum(m[r][k] * x[k] for k in range(r + 1, 3))) / m[r][r]
    return x[0], x[1], x[2]


def _fit(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least squares of y ≈ c0 + c1·u + c2·v over (u, v, y), in relative error (weights 1/y²)."""
    a = [[0.0] * 3 for _ in range(3)]
    b = [0.0] * 3
    for u, v, y in samples:
        x = (1.0, u, v)
        w = 1.0 / (y * y)
        for i in range(3):
            b[i] += w * x[i] * y
            for j in range(3):
                a[i][j] += w * x[i] * x[j]
    return _solve3(a, b)


@dataclass(frozen=True, slots=True)
class CostModel:
    """BROS's iteration-time estimate: linear prefill and decode models, fitted to a profile.

    Features are the paper's two shapes: `[L_in, h]` (input tokens: GEMMs, collectives) and
    `[L_in, L_ctx]` (attention). Prefill: `a0 + a1·L_in + a2·Σ l·(c + l)`; decode:
    `d0 + d1·n_dec + d2·L_ctx`. No swap term: our engine recomputes instead of swapping, and the
    recompute is a prefill (so T_iter = max(T_exec, T_swap) is T_exec here).
    """

    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]
    sum_intercepts: bool = True

    @classmethod
    def profile(
        cls,
        latency: LatencyModel,
        max_context_tokens: int = 2048,
        max_batch: int = 256,
        sum_intercepts: bool = True,
    ) -> CostModel:
        """Price dummy batches at powers of two (lengths up to `max_context_tokens`, batch
        sizes up to `max_batch`) and fit both models, as the paper does after LLM-PQ."""
        lengths = [1 << k for k in range(max(1, max_context_tokens).bit_length())]
        sizes = [1 << k for k in range(max(1, max_batch).bit_length())]
        pre: list[tuple[float, float, float]] = []
        dec: list[tuple[float, float, float]] = []
        for b in sizes:
            for n in lengths:
                if b * n <= max_context_tokens * 64:
                    y = latency.step_s(BatchShape(((n, 0),) * b))
                    pre.append((float(b * n), float(b * n * n), y))
                y = latency.step_s(BatchShape((), (n,) * b))
                dec.append((float(b), float(b * n), y))
        return cls(_fit(pre), _fit(dec), sum_intercepts)

    def estimate(self, l_in: float, attn: float, n_dec: int, l_ctx: float) -> float:
        """Seconds for a batch with prefill inputs `l_in` (attention work Σ l·(c + l) = `attn`)
        and `n_dec` decodes reading `l_ctx` context tokens."""
        t = 0.0
        a0, a1, a2 = self.prefill
        d0, d1, d2 = self.decode
        if l_in > 0:
            t += a0 + a1 * l_in + a2 * attn
        if n_dec > 0:
            t += d0 + d1 * n_dec + d2 * l_ctx
            if l_in > 0 and not self.sum_intercepts:
                t -= min(a0, d0)
        return t

    def estimate_shape(self, batch: BatchShape) -> float:
        l_in = sum(n for n, _ in batch.prefill_chunks)
        attn = sum(n * (c + n) for n, c in batch.prefill_chunks)
        return self.estimate(l_in, attn, len(batch.decode_contexts), sum(batch.decode_contexts))


# -- per-step candidates --------------------------------------------------------------------------


@dataclass(slots=True)
class _Cand:
    seq: SeqView
    n: int
    """Tokens this step (0: admit a remote-KV sequence)."""
    need: int
    """New KV blocks the chunk needs."""
    running: bool
    rt: bool
    l_in: int = 0
    attn: int = 0
    is_dec: int = 0
    ctx: int = 0
    recompute: int = 0
    """Tokens of KV lost to a preemption that this step recomputes (the swap-in stand-in)."""
    deadline: float = math.inf
    budget: float = math.inf
    """S_i: the SLO budget of the current token (group)."""
    left: int = 1
    """r_i: tokens left in the current group, this one included."""
    tau: float = math.inf
    solo: float = 0.0


@dataclass(slots=True)
class _Batch:
    """The batch being packed, with the cost model's features kept as running sums."""

    cost: CostModel
    free: int
    items: list[_Cand] = field(default_factory=list)
    l_in: int = 0
    attn: int = 0
    n_dec: int = 0
    ctx: int = 0

    def est_with(self, c: _Cand, without: _Cand | None = None) -> float:
        l_in, attn, n_dec, ctx = (
            self.l_in + c.l_in,
            self.attn + c.attn,
            self.n_dec + c.is_dec,
            self.ctx + c.ctx,
        )
        if without is not None:
            l_in -= without.l_in
            attn -= without.attn
            n_dec -= without.is_dec
            ctx -= without.ctx
        return self.cost.estimate(l_in, attn, n_dec, ctx)

    def est(self) -> float:
        return self.cost.estimate(self.l_in, self.attn, self.n_dec, self.ctx)

    def add(self, c: _Cand) -> None:
        self.items.append(c)
        self.free -= c.need
        self.l_in += c.l_in
        self.attn += c.attn
        self.n_dec += c.is_dec
        self.ctx += c.ctx

    def remove(self, c: _Cand) -> None:
        self.items.remove(c)
        self.free += c.need
        self.l_in -= c.l_in
        self.attn -= c.attn
        self.n_dec -= c.is_dec
        self.ctx -= c.ctx


class BrosPolicy:
    """Greedy priority packing with adaptive batch size (or the RR baseline)."""

    name = "bros"
    steady_decode = False
    """Bsz and deadlines change every step: the engine must not fuse steps."""

    def __init__(self, params: BrosParams | None = None) -> None:
        self.params = p = params or BrosParams()
        self.slos: Mapping[SloClassName, SloClass] = {s.name: s for s in p.realtime}
        self.cost = CostModel.profile(
            p.latency if p.latency is not None else default_latency(),
            p.max_context_tokens,
            p.max_num_seqs,
            p.sum_intercepts,
        )
        self.bsz = p.bsz_init if p.adaptive_batch else p.max_num_seqs
        self.t_bar: float | None = None
        self.num_early_returns = 0
        self.last_stop = Stop.EXHAUSTED
        self._tokens: dict[RequestId, tuple[int, float]] = {}
        """RT request -> (outputs seen, when its current token group started)."""
        self._rr_turn_rt = True
        self._host = 0
        """Host swap space left in the decision being built (KV tokens)."""
        self._checkpoint: list[tuple[RequestId, int]] = []
        self._swap_out: list[RequestId] = []

    # -- bookkeeping ------------------------------------------------------------------------

    def _observe(self, view: StepView) -> None:
        """Learn when each RT request's last token came out: the engine calls `decide` right
        after a step completes, so a token first seen now was returned now."""
        g = self.params.group_size
        seen: dict[RequestId, tuple[int, float]] = {}
        old = self._tokens
        now = view.now_s
        for seqs in (view.running, view.waiting):
            for s in seqs:
                if s.slo_class not in self.slos or s.num_output_tokens == 0:
                    continue
                prev = old.get(s.id)
                out = s.num_output_tokens
                if prev is None:
                    seen[s.id] = (out, now)
                elif prev[0] != out:
                    # A new group starts with the first token and after every g-th later one.
                    starts = (out - 1) // g != (prev[0] - 1) // g or g == 1
                    seen[s.id] = (out, now if starts else prev[1])
                else:
                    seen[s.id] = prev
        self._tokens = seen

    def _candidate(self, s: SeqView, running: bool, size: int, t_bar: float) -> _Cand | None:
        slo = self.slos.get(s.slo_class)
        computed, outputs = s.num_computed_tokens, s.num_output_tokens
        if s.remote_kv:
            need = -(-s.num_prompt_tokens // size) - s.blocks_held
            c = _Cand(s, 0, need if need > 0 else 0, running, slo is not None)
        else:
            n = s.num_prompt_tokens + outputs - computed
            if n <= 0:
                return None
            need = -(-(computed + n) // size) - s.blocks_held  # _blocks, inlined (hot)
            c = _Cand(s, n, need if need > 0 else 0, running, slo is not None)
            if outputs > 0 and n == 1:
                c.is_dec, c.ctx = 1, computed
            else:
                c.l_in, c.attn = n, n * (computed + n)
                if outputs > 0:
                    c.recompute = n - 1
        if slo is None:
            return c  # best-effort: no deadline, and the solo estimate is only for RT
        c.solo = self.cost.estimate(c.l_in, c.attn, c.is_dec, c.ctx)
        if outputs == 0:
            c.budget = slo.ttft_ms / 1e3
            c.deadline = s.arrival_s + c.budget
        else:
            g = self.params.group_size
            c.budget = g * slo.tpot_ms / 1e3
            c.left = g - (outputs - 1) % g
            c.deadline = self._tokens.get(s.id, (0, 0.0))[1] + c.budget
        c.tau = c.deadline - (c.left - 1) * t_bar
        return c

    # -- the step ---------------------------------------------------------------------------

    def decide(self, view: StepView) -> StepDecision:
        self._observe(view)
        p = self.params
        self._host = view.host_free_tokens
        if self._checkpoint or self._swap_out:
            self._checkpoint, self._swap_out = [], []
        t_bar = self.t_bar if self.t_bar is not None else 0.0
        cands: list[_Cand] = []
        for seqs, running in ((view.running, True), (view.waiting, False)):
            for s in seqs:
                c = self._candidate(s, running, view.block_size, t_bar)
                if c is not None:
                    c.tau -= view.now_s
                    cands.append(c)
        if p.scheduler is Scheduler.ROUND_ROBIN:
            batch, preempt = self._round_robin(view, cands)
        else:
            batch, preempt = self._pack(view, cands)
        if not batch.items and not preempt and cands:
            self._fallback(view, cands, batch, preempt)
        est = batch.est()
        if batch.items:
            a = p.ewma_alpha
            self.t_bar = est if self.t_bar is None else (1 - a) * self.t_bar + a * est
        chunks = tuple((c.seq.id, c.n) for c in batch.items)
        if self._checkpoint or self._swap_out:
            return StepDecision(
                chunks, tuple(preempt), tuple(self._swap_out), tuple(self._checkpoint)
            )
        return StepDecision(chunks=chunks, preempt=tuple(preempt))

    def _pack(self, view: StepView, cands: list[_Cand]) -> tuple[_Batch, list[RequestId]]:
        """Alg. 1 (reconstructed, research B5)."""
        p = self.params
        now = view.now_s
        t_bar = self.t_bar if self.t_bar is not None else 0.0
        rt = [c for c in cands if c.rt]
        be = [c for c in cands if not c.rt]
        # Reachable RT by residual time, then late RT (deadline out of reach) most overdue first.
        reachable = sorted((c for c in rt if c.tau >= c.solo), key=lambda c: c.tau)
        late = sorted((c for c in rt if c.tau < c.solo), key=lambda c: c.tau)
        if reachable:
            tau_min = reachable[0].tau
        elif late:
            tau_min = min(c.budget for c in late)  # [R] keep late RT on short iterations
        else:
            tau_min = math.inf
        batch = _Batch(self.cost, view.free_blocks)
        preempt: list[RequestId] = []
        gone: set[RequestId] = set()
        chosen: set[RequestId] = set()
        early = False
        bsz = self.bsz
        self.last_stop = Stop.EXHAUSTED
        for c in reachable + late:
            if c.seq.id in gone:
                continue
            if len(batch.items) >= bsz:
                self.last_stop = Stop.BATCH_SIZE
                break
            if batch.items and batch.est_with(c) > tau_min:
                early = True
                self.last_stop = Stop.DEADLINE
                if p.skip_oversized:
                    continue
                break
            if c.need > batch.free:
                if p.kv_sharing:
                    self._evict_for(c, cands, chosen, gone, batch, preempt, view.block_size)
                elif c.running:
                    # No Bi-cache: the request failing to get blocks is recomputed.
                    preempt.append(c.seq.id)
                    gone.add(c.seq.id)
                    batch.free += c.seq.blocks_held
                    continue
            if c.need > batch.free:
                self.last_stop = Stop.BLOCKS  # no empty or preemptible blocks
                break
            if not batch.items and c.solo > tau_min:
                early = True  # [R] admitted alone so the step is never empty
                self.last_stop = Stop.DEADLINE
            batch.add(c)
            chosen.add(c.seq.id)
            if early:
                break
        if not early and p.be_fill:
            reserve = 0
            if p.reserve_for_rt:  # the waiting RT's next chunks, one block per running RT
                for c in rt:
                    if c.seq.id not in gone and c.seq.id not in chosen:
                        reserve += 1 if c.running else c.need
                    elif c.running and c.seq.id in chosen:
                        reserve += 1
            self._fill_be(be, batch, gone, chosen, tau_min, now, t_bar, reserve)
        if early:
            self.num_early_returns += 1
        if p.adaptive_batch:
            self.bsz = p.bsz_init if early else min(self.bsz + p.bsz_step, p.max_num_seqs)
        return batch, preempt

    def _evict_for(
        self,
        c: _Cand,
        cands: list[_Cand],
        chosen: set[RequestId],
        gone: set[RequestId],
        batch: _Batch,
        preempt: list[RequestId],
        block_size: int,
    ) -> None:
        """FindPreemptBlock: take blocks from idle running BE, then from idle running RT less
        urgent than `c` (most slack first), until `c` fits.

        With host swap space (the engine's `checkpoint`), the blocks `c` lacks are first
        checkpointed off the tails of idle BE, most blocks first: only those blocks' KV moves to
        host (the paper's lazy checkpoint, at block granularity). What that cannot cover is then
        evicted as before, BE fewest blocks first (swapped out whole while the host has room,
        else dropped and recomputed), then RT (recomputed; swapped with `swap_rt`). Without host
        space: eviction by recompute only, exactly as before."""
        idle = [
            v
            for v in cands
            if v.running and v.seq.id not in chosen and v.seq.id not in gone and v is not c
        ]
        victims = sorted((v for v in idle if not v.rt), key=lambda v: v.seq.blocks_held)
        victims += sorted((v for v in idle if v.rt and v.tau > c.tau), key=lambda v: -v.tau)
        if c.need > batch.free + sum(v.seq.blocks_held for v in victims):
            return  # not enough even with every victim gone: evict nobody
        size = block_size
        if self._host > 0:
            for v in sorted((v for v in victims if not v.rt), key=lambda v: -v.seq.blocks_held):
                short = c.need - batch.free
                if short <= 0:
                    return
                s = v.seq
                k = min(short, s.blocks_held)
                on_gpu = s.num_computed_tokens - s.checkpointed_tokens
                keep = (s.blocks_held - k) * size
                moved = on_gpu - keep if on_gpu > keep else 0
                if k == 0 or moved > self._host:
                    continue
                self._checkpoint.append((s.id, k))
                self._host -= moved
                gone.add(s.id)
                batch.free += k
        for v in victims:
            if c.need <= batch.free:
                return
            s = v.seq
            if s.blocks_held == 0 or s.id in gone:
                continue
            moved = s.num_computed_tokens - s.checkpointed_tokens
            if self._host > 0 and moved <= self._host and (self.params.swap_rt or not v.rt):
                self._swap_out.append(s.id)
                self._host -= moved
            else:
                preempt.append(s.id)
            gone.add(s.id)
            batch.free += s.blocks_held

    def _fill_be(
        self,
        be: list[_Cand],
        batch: _Batch,
        gone: set[RequestId],
        chosen: set[RequestId],
        tau_min: float,
        now: float,
        t_bar: float,
        reserve: int,
    ) -> None:
        """Lines 17-33: BE by swap-in overhead (tokens to recompute, then checkpointed tokens),
        filling then replacing RT. A BE prompt, recompute or swap-in leaves `reserve` blocks
        free for RT."""
        p = self.params
        order = sorted(
            (c for c in be if c.seq.id not in gone),
            key=lambda c: (c.recompute, c.seq.checkpointed_tokens, not c.running, c.seq.arrival_s),
        )
        for c in order:
            room = batch.free - (reserve if c.l_in or c.seq.checkpointed_tokens else 0)
            if len(batch.items) < self.bsz:
                if c.need <= room and batch.est_with(c) <= tau_min:
                    batch.add(c)
                    chosen.add(c.seq.id)
                continue
            if not p.be_replace:
                break
            in_rt = [v for v in batch.items if v.rt]
            if not in_rt:
                break
            v = max(in_rt, key=lambda v: v.tau)
            t_new = batch.est_with(c, without=v)
            deferrable = now + t_new + v.left * t_bar <= v.deadline
            if (
                deferrable
                and c.recompute + c.seq.checkpointed_tokens
                <= v.recompute + v.seq.checkpointed_tokens
                and t_new <= tau_min
                and c.need <= room + v.need
            ):
                batch.remove(v)
                chosen.discard(v.seq.id)
                batch.add(c)
                chosen.add(c.seq.id)
            else:
                break

    def _round_robin(self, view: StepView, cands: list[_Cand]) -> tuple[_Batch, list[RequestId]]:
        """The RR baseline: one class per iteration, FCFS within it, fixed batch size."""
        rt = [c for c in cands if c.rt]
        be = [c for c in cands if not c.rt]
        queue = rt if (self._rr_turn_rt and rt) or not be else be
        self._rr_turn_rt = queue is not rt
        batch = _Batch(self.cost, view.free_blocks)
        preempt: list[RequestId] = []
        chosen: set[RequestId] = set()
        running = [c for c in cands if c.running]
        for c in queue:
            if c.seq.id in preempt:
                continue
            if len(batch.items) >= self.params.max_num_seqs:
                break
            while c.running and c.need > batch.free:
                # Only a running sequence that cannot grow evicts (vLLM); a new one waits.
                idle = [v for v in running if v.seq.id not in chosen and v.seq.id not in preempt]
                idle = [v for v in idle if v is not c and v.seq.blocks_held > 0]
                if not idle:
                    break
                v = max(idle, key=lambda v: v.seq.arrival_s)  # latest arrival, as vLLM
                preempt.append(v.seq.id)
                batch.free += v.seq.blocks_held
            if c.need > batch.free:
                if c.running:
                    preempt.append(c.seq.id)
                    batch.free += c.seq.blocks_held
                    continue
                break
            batch.add(c)
            chosen.add(c.seq.id)
        return batch, preempt

    def _fallback(
        self, view: StepView, cands: list[_Cand], batch: _Batch, preempt: list[RequestId]
    ) -> None:
        """[R] Never return an empty step while work exists: run the first candidate that fits
        (RT before BE, most urgent first), else the first one that fits once idle running
        sequences are evicted, latest arrival first."""
        order = sorted(cands, key=lambda c: (not c.rt, c.tau, c.seq.arrival_s))
        for c in order:
            if c.need <= batch.free:
                batch.add(c)
                return
        for head in order:
            others = sorted(
                (v for v in cands if v.running and v is not head and v.seq.blocks_held > 0),
                key=lambda v: -v.seq.arrival_s,
            )
            if head.need > batch.free + sum(v.seq.blocks_held for v in others):
                continue
            for v in others:
                if head.need <= batch.free:
                    break
                preempt.append(v.seq.id)
                batch.free += v.seq.blocks_held
            batch.add(head)
            return


def make(**params: Any) -> BatchingPolicy:
    """Registered as "bros"; params are `BrosParams` fields."""
    return BrosPolicy(BrosParams(**params))

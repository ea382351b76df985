"""ALISE step policy (Zhao & Wang, ICCAD'24): predicted-SRPT priority queues with aging.

Owns: ordering sequences by estimated remaining time from predicted output lengths, multi-level
queues with virtual aging and demotion-with-doubling on overrun, the greedy batch over that order,
and the choice between swap and recompute for a preempted sequence.

Per step (research/seed-pastfuture-alise.md §B.3-B.5; the paper wins where they disagree):
* a sequence's total output is predicted once, when first seen: the engine's prediction
  (`SeqView.predicted_output_tokens`) when the view has one, else the policy's own
  `OutputLengthPredictor` (given at construction; default `BucketedPredictor`, learned online
  from the engine's finish reports, `StepView.finished`, through
  `predict.feedback.FinishTracker`); on overrun (generated >= predicted) the prediction doubles,
  capped at the output cap, and the sequence is demoted one queue (paper §III-B);
* remaining time (Eqs. 3-5): R = [prompt not computed] * s * T0
  + max(L - g, 1) * (alpha * s + beta), s the prompt length;
  queue = clamp(floor(log2(R / tau0)) + demotions - promotions, -1, h - 1)
  with tau0 = 16 decode steps (beta * 16); a sequence that has not run for `aging_s` is promoted
  one queue (virtual aging), and queue -1 ("aged") is served first in arrival order, which bounds
  every wait (no starvation);
* order = (queue, R, arrival) (arrival within the aged queue; aged waiting sequences are placed
  right after the last running one unless `aged_displace`, see there); the batch is the greedy
  prefix of that order that fits the seats, the token budget and the KV blocks, taken in two passes:
  decodes (one token each) first, then prefill chunks, both in priority order, so a short prompt
  never stalls the running decodes behind the token budget (Sarathi-style; without it, SRPT over
  a 2,048-token budget stalls decodes and lost to FCFS on mean latency in our runs). A waiting
  sequence that does not fit may take blocks from running sequences of a strictly worse queue
  (latest in the order first, undoing their decode if already scheduled): that is ALISE's
  iteration-level preemption, behind `displace_running` (off by default, see there). A running
  sequence that cannot grow takes blocks from worse running ones, or else is itself preempted
  (vLLM's rule), so the engine never stalls. Running sequences left out of the batch keep their
  KV (the paper's paused-resident jobs).
* swap vs recompute (§III-C): with `preemption="swap"` a preempted sequence's KV is swapped out
  to host memory (`StepDecision.swap_out`; the engine frees its blocks and keeps its progress) when
  the host has room (`StepView.host_free_tokens`) and moving the KV out and back over PCIe
  (2 * bytes / bandwidth) is cheaper than recomputing its computed tokens (tokens * T0); else it is
  recomputed. Victims are taken worst-first in the priority order, which within ALISE's queues is
  the order of estimated wait time (Eqs. 6-7), so high-EWT jobs go to host memory first (Alg. 2);
  a swapped job comes back (uploaded) when the order admits it again. `preemption_choices` counts
  what was executed. Default "recompute" (the behaviour before swap existed);

Defaults where the paper is silent ([ours] in the spec): h = 8 queues, aging 5 s, T0/alpha/beta of
a 13B model on an A100-class GPU (0.1 ms per prompt token, 1 us per context token per step, 20 ms
per step), PCIe 4 (25 GB/s), 800 KiB per token (OPT/LLaMA-13B fp16). The predicted length never
reads `SeqView.max_tokens` unless `use_request_max_tokens` (in the simulator it is the truth).

Invariants tested (tests/unit/policy/batching/test_alise.py): shorter predicted remaining time runs
first; a misprediction doubles the prediction (50 -> 100 -> 200 -> 400) up to the cap; a sequence
that waited long enough is served before every unaged one; decisions drive the engine to
completion; the swap/recompute choice follows the cost model.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from splitserve.core.ids import RequestId
from splitserve.policy.batching.base import BatchingPolicy, SeqView, StepDecision, StepView
from splitserve.policy.predict.base import LengthQuery, OutputLengthPredictor
from splitserve.policy.predict.bucketed import BucketedPredictor
from splitserve.policy.predict.feedback import FinishTracker


@dataclass(frozen=True, slots=True)
class AliseParams:
    num_queues: int = 8
    aging_s: float = 5.0
    """K: a sequence that has not run for this long is promoted one queue."""
    prefill_s_per_token: float = 1e-4
    """T0 (Eq. 4)."""
    decode_s_per_context_token: float = 1e-6
    """alpha (Eq. 5)."""
    decode_s_per_step: float = 0.02
    """beta (Eq. 5)."""
    base_level_steps: int = 16
    """tau0 = this many decode steps: the top queue's bound on remaining time."""
    pcie_bytes_per_s: float = 25e9
    kv_bytes_per_token: int = 800 * 1024
    max_output_tokens: int = 4096
    use_request_max_tokens: bool = False
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    learn_from_views: bool = True
    displace_running: bool = False
    """Let a waiting sequence of a strictly better queue preempt running ones (the paper's
    iteration-level preemption). Off by default (kept from before the engine could swap): with
    recompute preemption, displacement lost to FCFS on mean latency in our runs (the paper's
    Fig. 8 makes the same point: Recompute is up to 2.8x worse than swapping). The ALISE
    reproduction turns it on with `preemption="swap"` (off = the paper's "Defer" strawman)."""
    preemption: Literal["recompute", "swap"] = "recompute"
    """How a preempted sequence gives up its blocks: "swap" moves its KV to host memory when
    there is room and swapping beats recomputing (see `prefers_swap`), else recompute."""
    aged_displace: bool = False
    """Serve aged (queue -1) waiting sequences before running ones, as the paper does. Off (our
    default): they go right after the last running sequence, first among everything that would
    wait anyway. With recompute preemption, aged sequences displacing or stalling the running
    batch thrash under overload (the paper's own argument against recompute); with swap it is
    harmless but did not help either (OPT-13B on one V100, ShareGPT, 300 requests at 1.6 req/s:
    253 vs 229 ms/token normalized latency without it), so it stays off."""

    def __post_init__(self) -> None:
        if self.num_queues < 1 or self.base_level_steps < 1:
            raise ValueError("num_queues and base_level_steps must be >= 1")
        if self.aging_s <= 0 or self.decode_s_per_step <= 0 or self.pcie_bytes_per_s <= 0:
            raise ValueError("aging_s, decode_s_per_step and pcie_bytes_per_s must be > 0")
        if self.prefill_s_per_token < 0 or self.decode_s_per_context_token < 0:
            raise ValueError("time coefficients must be >= 0")
        if self.kv_bytes_per_token < 1:
            raise ValueError("kv_bytes_per_token must be >= 1")
        if min(self.max_output_tokens, self.max_num_batched_tokens, self.max_num_seqs) < 1:
            raise ValueError("max_output_tokens, max_num_batched_tokens, max_num_seqs must be >= 1")
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"unknown preemption {self.preemption!r}")


@dataclass(slots=True)
class _Job:
    predicted_tokens: int
    last_ran_s: float
    demotions: int = 0
    promotions: int = 0


class AlisePolicy:
    name = "alise"

    def __init__(
        self, params: AliseParams | None = None, predictor: OutputLengthPredictor | None = None
    ) -> None:
        self.params = params or AliseParams()
        self.predictor: OutputLengthPredictor = predictor or BucketedPredictor()
        self._jobs: dict[RequestId, _Job] = {}
        self._finishes = FinishTracker()
        self.preemption_choices: Counter[str] = Counter()
        """"swap" / "recompute": how each preemption was executed."""

    # -- estimates ----------------------------------------------------------------------------

    def _cap(self, seq: SeqView) -> int:
        cap = self.params.max_output_tokens
        return min(cap, seq.max_tokens) if self.params.use_request_max_tokens else cap

    def _job(self, seq: SeqView, now_s: float) -> _Job:
        job = self._jobs.get(seq.id)
        if job is None:
            predicted = seq.predicted_output_tokens
            if predicted is None:
                query = LengthQuery(
                    seq.id, seq.num_prompt_tokens, seq.num_output_tokens, self._cap(seq)
                )
                predicted = self.predictor.predict(query)
            else:
                predicted = max(1, min(predicted, self._cap(seq)))
            job = _Job(predicted, seq.arrival_s)
            self._jobs[seq.id] = job
        while seq.num_output_tokens >= job.predicted_tokens < self._cap(seq):
            job.predicted_tokens = min(2 * job.predicted_tokens, self._cap(seq))
            job.demotions += 1
        if now_s - job.last_ran_s >= self.params.aging_s:
            job.promotions += 1
            job.last_ran_s = now_s  # virtual aging: the wait restarts after each promotion
        return job

    def remaining_s(self, seq: SeqView, predicted_tokens: int) -> float:
        """R(J): Eqs. 3-5 with the predicted total output length."""
        p = self.params
        s = seq.num_prompt_tokens
        prefill = s * p.prefill_s_per_token if seq.num_computed_tokens < s else 0.0
        steps = max(predicted_tokens - seq.num_output_tokens, 1)
        return prefill + steps * (p.decode_s_per_context_token * s + p.decode_s_per_step)

    def queue(self, remaining_s: float, job: _Job) -> int:
        p = self.params
        tau0 = p.base_level_steps * p.decode_s_per_step
        level = 0 if remaining_s <= tau0 else int(math.log2(remaining_s / tau0))
        level = min(p.num_queues - 1, level)
        return max(-1, min(p.num_queues - 1, level + job.demotions - job.promotions))

    def prefers_swap(self, seq: SeqView, block_size: int) -> bool:
        """Swap out and back over PCIe is cheaper than recomputing the computed tokens."""
        p = self.params
        swap_s = 2 * seq.blocks_held * block_size * p.kv_bytes_per_token / p.pcie_bytes_per_s
        return swap_s < seq.num_computed_tokens * p.prefill_s_per_token

    # -- the step ---------------------------------------------------------------------------

    def decide(self, view: StepView) -> StepDecision:
        p = self.params
        if p.learn_from_views:
            for prompt, outputs in self._finishes.finished(view):
                self.predictor.observe(prompt, outputs)
        live = {s.id for s in view.running} | {s.id for s in view.waiting}
        for rid in [r for r in self._jobs if r not in live]:
            del self._jobs[rid]
        running_ids = {s.id for s in view.running}
        ranked: list[tuple[tuple[int, float, float], SeqView]] = []
        for seq in (*view.running, *view.waiting):
            job = self._job(seq, view.now_s)
            r = self.remaining_s(seq, job.predicted_tokens)
            q = self.queue(r, job)
            ranked.append(((q, r if q >= 0 else seq.arrival_s, seq.arrival_s), seq))
        ranked.sort(key=lambda x: x[0])
        order = [seq for _, seq in ranked]
        if not p.aged_displace:
            # Aged waiting sequences go right after the last running one: first among those that
            # would wait anyway, without stalling the running batch (see `aged_displace`).
            aged = [s for k, s in ranked if k[0] < 0 and s.id not in running_ids]
            rest = [s for k, s in ranked if not (k[0] < 0 and s.id not in running_ids)]
            last = max((i for i, s in enumerate(rest) if s.id in running_ids), default=-1)
            order = rest[: last + 1] + aged + rest[last + 1 :]
        queue_of = {seq.id: key[0] for key, seq in ranked}

        free = view.free_blocks
        budget = p.max_num_batched_tokens
        seats = p.max_num_seqs
        size = view.block_size
        chunks: list[tuple[RequestId, int]] = []
        chosen: dict[RequestId, tuple[int, int]] = {}
        """Scheduled this step -> (tokens, blocks taken); a better sequence may still evict it."""
        preempted: list[RequestId] = []
        """Evicted this step (recompute or swap), in eviction order."""
        swapped: set[RequestId] = set()
        host_free = view.host_free_tokens if p.preemption == "swap" else 0
        position = {seq.id: i for i, seq in enumerate(order)}
        # Decodes take their one token first, in priority order (stall-free, as Sarathi), then
        # prefill chunks in priority order: a short prompt must not stall the running decodes.
        passes = [s for s in order if s.is_decoding] + [s for s in order if not s.is_decoding]
        for seq in passes:
            if seq.id in preempted:
                continue
            if seats <= 0 or (budget <= 0 and not seq.remote_kv):
                break
            n = 0 if seq.remote_kv else min(seq.num_uncomputed_tokens, budget)
            if n == 0 and not seq.remote_kv:
                continue
            tokens = seq.num_prompt_tokens if seq.remote_kv else seq.num_computed_tokens + n
            need = max(0, -(-tokens // size) - seq.blocks_held)
            if need > free and (p.displace_running or seq.id in running_ids):
                # Take blocks from running sequences later in the order, worst first.
                for victim in reversed(order[position[seq.id] + 1 :]):
                    if need <= free:
                        break
                    rid = victim.id
                    if rid not in running_ids or rid in preempted:
                        continue
                    if seq.id not in running_ids and queue_of[rid] <= queue_of[seq.id]:
                        continue  # a waiting job only displaces strictly lower queues
                    if rid in chosen:  # scheduled in the decode pass: undo that first
                        n_v, need_v = chosen.pop(rid)
                        chunks.remove((rid, n_v))
                        budget += n_v
                        seats += 1
                        free += need_v
                    preempted.append(rid)
                    free += victim.blocks_held
                    host_free -= self._evict(victim, size, host_free, swapped)
            if need > free:
                if seq.id in running_ids:
                    preempted.append(seq.id)  # cannot grow: evict it rather than stall
                    free += seq.blocks_held
                    host_free -= self._evict(seq, size, host_free, swapped)
                continue
            free -= need
            budget -= n
            seats -= 1
            chunks.append((seq.id, n))
            chosen[seq.id] = (n, need)
            self._jobs[seq.id].last_ran_s = view.now_s
        if p.learn_from_views:
            self._finishes.scheduled(view, chunks)
        if swapped:
            return StepDecision(
                chunks=tuple(chunks),
                preempt=tuple(r for r in preempted if r not in swapped),
                swap_out=tuple(r for r in preempted if r in swapped),
            )
        return StepDecision(chunks=tuple(chunks), preempt=tuple(preempted))

    def _evict(self, seq: SeqView, block_size: int, host_free: int, swapped: set[RequestId]) -> int:
        """Record how `seq` is evicted; returns the host tokens its swap-out takes (0 if none)."""
        tokens = seq.num_computed_tokens
        if 0 < tokens <= host_free and self.prefers_swap(seq, block_size):
            swapped.add(seq.id)
            self.preemption_choices["swap"] += 1
            return tokens
        self.preemption_choices["recompute"] += 1
        return 0


def make(**params: Any) -> BatchingPolicy:
    """Registered as "alise" (policy/batching/builtin.py), with the default predictor."""
    return AlisePolicy(AliseParams(**params))

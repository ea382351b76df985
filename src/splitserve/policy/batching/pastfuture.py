"""Past-Future admission (Gong et al., LightLLM) and the Table-1 baselines, as one step policy.

Owns: the per-step admission gate that keeps the FUTURE peak KV usage of the running batch plus
the candidate under the cache, and the two baselines the paper compares against, selected by
`PastFutureParams.admission`:

* "pastfuture": every admission round, sample each running request's final length from the
  history window, P(l | l > l_t) (`HistoryWindow.sample_given`), and each candidate's from P(l);
  sort by remaining length and take the peak at the finish instants (Eqs. 2-4,
  `future_peak_tokens`); admit FCFS while max over `n_lists` independent samplings of the peak
  is < cache * (1 - reserve) (the artifact's `<`), stopping at the first rejection;
* "oracle": the same gate with true lengths (the paper's "theoretical optimum"; run it with
  reserve 0): the engine's prediction (`SeqView.predicted_output_tokens`) when it has one, else
  `SeqView.max_tokens`, which in the simulator carries the true output length; only this mode
  reads either as a length;
* "aggressive": vLLM-style, admit while current usage + prompt <= cache * watermark;
* "conservative": TGI-style, admit while sum(prompt + cap) <= cache * overcommit.

Running sequences go first each step (decode 1 token, or their next prefill chunk); when blocks
run short the most recently admitted is preempted (recompute), as LightLLM and vLLM do.

Choices (paper wins over the spec, spec over the artifact; research/seed-pastfuture-alise.md A.12):
* defaults from the paper: window 1000, reserve 5 % (Table 1 sweeps 3/5/10 %), lists =
  min(5, 200 // k + 1) (the artifact's rule for the paper's "repeated sampling");
* cold start: window // 2 copies of `max_output_tokens` (paper §3.2);
* the cap a sampler may reach is `max_output_tokens`, never `SeqView.max_tokens` unless
  `use_request_max_tokens` (live serving, where it is the user's cap): in the simulator it is the
  truth and reading it would leak lengths (A.12-8); a sample is not clipped to the cap (the
  artifact simulator does not clip, and its D-2 outputs exceed 4,096; clipping there doubles
  Past-Future's evictions), only to `SeqView.max_tokens` with `use_request_max_tokens`;
* aggressive counts a resumed request by its prompt only, as the artifact does (its generated
  tokens come back on top: one reason aggressive evicts so much);
* a resumed (preempted) request samples P(l | l > generated) (A.12-6), not P(l);
* the gate counts slots as c = prompt + generated and r = max(0, l - generated - 1) (the last token
  is never fed back), and in blocks uses the upper bound ceil(M_i / B) + i (exact when B == 1);
* history: the policy learns each finished request's true length from the engine's finish
  reports (`StepView.finished`, exact also with fused decode runs), through
  `predict.feedback.FinishTracker`, which falls back to inferring finishes from consecutive
  views when no report ever comes (views built by hand); a caller may instead feed
  `observe_finished` and set `learn_from_views=False`;
* an admission round runs every `admit_every_steps` steps (artifact simulator 10, server 2), and
  always when nothing runs, where the head is admitted even if the gate says no (else the engine
  would idle forever on a request larger than the reserve allows).

State (history, RNG, step counter) lives in the policy object; `decide` is deterministic given
the seed and the sequence of views. Invariants tested (tests/unit/policy/batching/
test_pastfuture.py): the peak equals a brute-force maximum over future steps; the paper's Fig. 6
example (capacity 21: PF waits one step, aggressive overflows); decisions always fit the budget
and blocks; the engine runs every request to completion under each admission mode.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from splitserve.core.ids import RequestId
from splitserve.policy.batching.base import BatchingPolicy, SeqView, StepDecision, StepView
from splitserve.policy.predict.feedback import FinishTracker
from splitserve.policy.predict.history import HistoryWindow

Admission = Literal["pastfuture", "oracle", "aggressive", "conservative"]


@dataclass(frozen=True, slots=True)
class PastFutureParams:
    admission: Admission = "pastfuture"
    reserve_fraction: float = 0.05
    """rho: cache kept free of the predicted peak (paper: 3/5/10 %; 5 % for GPU serving)."""
    watermark_fraction: float = 0.99
    """omega, aggressive only: admit while usage + prompt <= cache * omega."""
    overcommit_fraction: float = 1.0
    """phi, conservative only: admit while sum(prompt + cap) <= cache * phi."""
    window_requests: int = 1000
    """w: finished requests in the history window."""
    min_samples: int = 200
    max_lists: int = 5
    """Independent samplings of the batch: min(max_lists, min_samples // k + 1)."""
    max_output_tokens: int = 4096
    """The configured output cap: cold start, sampler upper anchor, conservative reservation."""
    cold_start_tokens: int | None = None
    """Length the window starts with (window // 2 copies); None = `max_output_tokens` (the
    paper's rule). The authors' Table-1 simulator starts with 512."""
    use_request_max_tokens: bool = False
    """Also cap by `SeqView.max_tokens` (live: the user's cap). Off in the simulator (it is the
    true length there)."""
    admit_every_steps: int = 1
    max_num_batched_tokens: int = 8192
    """Token budget of one step (decodes + prefill chunks)."""
    max_num_seqs: int = 1000
    seed: int = 0
    learn_from_views: bool = True

    def __post_init__(self) -> None:
        if self.admission not in ("pastfuture", "oracle", "aggressive", "conservative"):
            raise ValueError(f"unknown admission {self.admission!r}")
        if not 0.0 <= self.reserve_fraction < 1.0:
            raise ValueError("reserve_fraction must be in [0, 1)")
        if self.watermark_fraction <= 0 or self.overcommit_fraction <= 0:
            raise ValueError("watermark_fraction and overcommit_fraction must be > 0")
        if min(self.window_requests, self.min_samples, self.max_lists) < 1:
            raise ValueError("window_requests, min_samples and max_lists must be >= 1")
        if self.cold_start_tokens is not None and self.cold_start_tokens < 1:
            raise ValueError("cold_start_tokens must be >= 1")
        if min(self.max_output_tokens, self.admit_every_steps) < 1:
            raise ValueError("max_output_tokens and admit_every_steps must be >= 1")
        if min(self.max_num_batched_tokens, self.max_num_seqs) < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")


def future_peak_tokens(pairs: Sequence[tuple[int, int]]) -> int:
    """Peak KV slots of a batch over the future (Eqs. 2-4).

    `pairs` are (c, r): slots held now and slots still to grow. Sorted by r descending,
    M_i = sum_{j<=i} c_j + i * r_i and the peak is max_i M_i (0 for an empty batch).
    """
    peak = 0
    held = 0
    for i, (c, r) in enumerate(sorted(pairs, key=lambda p: -p[1]), start=1):
        held += c
        m = held + i * r
        if m > peak:
            peak = m
    return peak


def future_peak_blocks(pairs: Sequence[tuple[int, int]], block_size: int) -> int:
    """Block form of the peak: exact for block_size 1, else the bound ceil(M_i / B) + i."""
    if block_size == 1:
        return future_peak_tokens(pairs)
    peak = 0
    held = 0
    for i, (c, r) in enumerate(sorted(pairs, key=lambda p: -p[1]), start=1):
        held += c
        m = -(-(held + i * r) // block_size) + i
        if m > peak:
            peak = m
    return peak


def num_lists(num_running: int, min_samples: int = 200, max_lists: int = 5) -> int:
    """How many independent samplings of the batch (more when the batch is small)."""
    return min(max_lists, min_samples // max(num_running, 1) + 1)


class PastFuturePolicy:
    name = "pastfuture"

    def __init__(self, params: PastFutureParams | None = None) -> None:
        self.params = params or PastFutureParams()
        p = self.params
        cold = p.max_output_tokens if p.cold_start_tokens is None else p.cold_start_tokens
        self.history = HistoryWindow(p.window_requests, cold)
        self._rng = random.Random(p.seed)
        self._steps = 0
        self._finishes = FinishTracker()

    @property
    def simulator_only(self) -> str | None:
        """Why this policy runs only in the simulator (None: it runs live too)."""
        if self.params.admission != "oracle":
            return None
        return (
            "admission 'oracle' reads each request's true output length, which only the "
            "simulator knows (a live worker would gate on max_tokens or a prediction)"
        )

    def observe_finished(self, num_output_tokens: int) -> None:
        """Feed a finished request's output length (when `learn_from_views` is off)."""
        self.history.add(num_output_tokens)

    # -- per-sequence quantities ------------------------------------------------------------

    def _cap(self, seq: SeqView) -> int:
        cap = self.params.max_output_tokens
        return min(cap, seq.max_tokens) if self.params.use_request_max_tokens else cap

    def _remaining(self, seq: SeqView, new: bool) -> int:
        """Sampled slots still to grow (r) for the gate."""
        out = seq.num_output_tokens
        if self.params.admission == "oracle":
            predicted = seq.predicted_output_tokens
            total = seq.max_tokens if predicted is None else predicted
        elif new and out == 0:
            total = self.history.sample_new(self._rng)
        else:
            total = self.history.sample_given(out, self._cap(seq), self._rng)
        if self.params.use_request_max_tokens and self.params.admission != "oracle":
            total = min(total, seq.max_tokens)
        total = max(out, total)
        return max(0, total - out - 1)

    # -- the step ---------------------------------------------------------------------------

    def decide(self, view: StepView) -> StepDecision:
        p = self.params
        if p.learn_from_views:
            for _, outputs in self._finishes.finished(view):
                self.history.add(outputs)
        self._steps += 1
        free = view.free_blocks
        budget = p.max_num_batched_tokens
        size = view.block_size
        chunks: list[tuple[RequestId, int]] = []
        preempt: list[RequestId] = []
        kept: list[SeqView] = []
        running = list(view.running)
        while running:
            seq = running.pop(0)
            n = min(seq.num_uncomputed_tokens, budget)
            if n == 0:
                kept.append(seq)
                continue
            need = max(0, -(-(seq.num_computed_tokens + n) // size) - seq.blocks_held)
            while need > free and running:
                victim = running.pop()  # latest admitted first (LIFO), as LightLLM / vLLM
                preempt.append(victim.id)
                free += victim.blocks_held
            if need > free:
                preempt.append(seq.id)
                free += seq.blocks_held
                continue
            free -= need
            budget -= n
            chunks.append((seq.id, n))
            kept.append(seq)
        admit_round = not kept or self._steps % p.admit_every_steps == 0
        if admit_round and view.waiting and len(kept) < p.max_num_seqs:
            admitted = self._admit(view, kept, free, budget)
            chunks.extend(admitted)
        if p.learn_from_views:
            self._finishes.scheduled(view, chunks)
        return StepDecision(chunks=tuple(chunks), preempt=tuple(preempt))

    def _admit(
        self, view: StepView, kept: list[SeqView], free: int, budget: int
    ) -> list[tuple[RequestId, int]]:
        p = self.params
        size = view.block_size
        cache_tokens = view.total_blocks * size
        mode = p.admission
        lists: list[list[tuple[int, int]]] = []
        if mode in ("pastfuture", "oracle"):
            n_lists = 1 if mode == "oracle" else num_lists(len(kept), p.min_samples, p.max_lists)
            lists = [
                [(s.num_known_tokens, self._remaining(s, new=False)) for s in kept]
                for _ in range(n_lists)
            ]
        limit_blocks = view.total_blocks * (1.0 - p.reserve_fraction)
        used = sum(s.num_known_tokens for s in kept)
        reserved = sum(s.num_prompt_tokens + self._cap(s) for s in kept)
        out: list[tuple[RequestId, int]] = []
        seats = p.max_num_seqs - len(kept)
        for seq in view.waiting:
            if seats <= 0:
                break
            n = 0 if seq.remote_kv else min(seq.num_uncomputed_tokens, budget)
            if not seq.remote_kv and n == 0:
                break
            tokens = seq.num_prompt_tokens if seq.remote_kv else seq.num_computed_tokens + n
            need = max(0, -(-tokens // size) - seq.blocks_held)
            if need > free:
                break
            c = seq.num_known_tokens
            forced = not kept and not out  # nothing runs: admit the head whatever the gate says
            if mode == "aggressive":
                ok = used + seq.num_prompt_tokens <= cache_tokens * p.watermark_fraction
            elif mode == "conservative":
                ok = reserved + seq.num_prompt_tokens + self._cap(seq) <= (
                    cache_tokens * p.overcommit_fraction
                )
            else:
                for lst in lists:
                    lst.append((c, self._remaining(seq, new=True)))
                ok = max(future_peak_blocks(lst, size) for lst in lists) < limit_blocks
            if not (ok or forced):
                break
            used += c
            reserved += seq.num_prompt_tokens + self._cap(seq)
            free -= need
            budget -= n
            seats -= 1
            out.append((seq.id, n))
        return out


def make(**params: Any) -> BatchingPolicy:
    """Registered as "pastfuture" (policy/batching/builtin.py)."""
    return PastFuturePolicy(PastFutureParams(**params))

"""TetriInfer step policies: the prefill instance's and the decode instance's local schedulers.

TetriInfer (Hu et al., "Inference without Interference", 2024; research/seed-splitwise-
tetriinfer.md B3.3-B3.7, seeds/tetriinfer.txt §3.3, §3.5):

* **Prefill instance** (`TetriPrefillPolicy`): prompts are sliced and merged, in scheduled order,
  into one fixed-size chunk per forward pass (`chunk_tokens`, the accelerator-saturate threshold:
  512 for OPT-13B on V100). A chunk may hold the tail of one prompt and the head of the next. The
  scheduled order comes from windows of `window_size` (the paper's PrefillSchedBatch, 16 in its
  evaluation) waiting requests taken in arrival order and sorted within the window by prompt
  length: SJF (the paper's default), LJF or FCFS. Non-preemptive: a prompt that has started
  prefilling is finished first.
* **Decode instance** (`TetriDecodePolicy`): continuous batching (every running sequence decodes
  one token per step) with an admission rule for the requests whose KV comes from a prefill
  instance: `greedy` (vLLM: admit while the prompt's blocks are free now), `reserve-static` (admit
  only if the predicted peak of everything running plus the newcomer fits) or `reserve-dynamic`
  (admit only if memory still suffices when the shortest remaining job finishes; the paper's
  evaluation default). The formulas are the spec's formalisation (B3.7), in blocks.

Choices where the paper is silent or our engine differs (noted so they can be revisited):

* The policy is stateless: the scheduled queue is re-derived every step as running prompts (in
  admission order) followed by the waiting requests cut into windows of `window_size` in arrival
  order, each sorted. The paper's queue is built once per window; re-deriving lets a newcomer join
  the head window when an older member leaves, so under SJF a long prompt can be overtaken by
  later short ones from its own window, never by requests further back. With a finite workload
  every request is still scheduled (see the invariants).
* No zero padding of the last partial chunk (research B6.2: padding only matters for static-shape
  engines; the roofline prices the real tokens).
* Predicted output length: `SeqView.max_tokens`, bucketed to the predictor's granularity
  (`length_granularity_tokens`, paper G = 200) and read at the bucket's `length_estimate` end
  (paper: lower). In the simulator requests run with `ignore_eos`, so `max_tokens` *is* the true
  output length and the prediction is a predictor with perfect bucket accuracy (G = 1: an exact
  oracle). On a live engine `max_tokens` is only a cap, so the reservation is conservative.
* A sequence that outlives its prediction reserves nothing beyond its current length; when blocks
  run short anyway the most recently admitted running sequence is preempted (vLLM's recompute),
  which the paper leaves to the engine.

Invariants (property-tested in tests/unit/policy/batching/test_tetriinfer.py):
* a decision never schedules more than the token budget (`chunk_tokens` on prefill,
  `max_num_batched_tokens` on decode) nor more new KV blocks than are free after its preemptions;
* every chunk is within its sequence's uncomputed tokens; no sequence appears twice;
* liveness: with nothing running, the head of the scheduled order is admitted whenever the blocks
  for its first chunk (prefill) or its prompt (decode) are free, whatever the admission rule; so
  with a finite workload, under FCFS or SJF, every waiting request is eventually scheduled;
* the prefill policy never lets a later chunk slice precede an earlier one in scheduled order.

Pure: no I/O, no clock; decisions depend only on the view.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from splitserve.core.ids import RequestId
from splitserve.core.kv import blocks_for
from splitserve.policy.batching.base import BatchingPolicy, SeqView, StepDecision, StepView


class PrefillOrder(StrEnum):
    FCFS = "fcfs"
    SJF = "sjf"
    """Shortest prompt first (the paper's evaluation default)."""
    LJF = "ljf"
    """Longest prompt first."""


class Admission(StrEnum):
    GREEDY = "greedy"
    RESERVE_STATIC = "reserve-static"
    RESERVE_DYNAMIC = "reserve-dynamic"


class LengthEstimate(StrEnum):
    LOWER = "lower"
    MID = "mid"
    UPPER = "upper"


@dataclass(frozen=True, slots=True)
class TetriPrefillParams:
    chunk_tokens: int = 512
    """ChunkSize: tokens per prefill forward pass (paper: 512 for OPT-13B on V100)."""
    order: PrefillOrder = PrefillOrder.SJF
    window_size: int = 16
    """PrefillSchedBatch: waiting requests sorted together (paper's evaluation: 16)."""
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.window_size < 1 or self.max_num_seqs < 1:
            raise ValueError("chunk_tokens, window_size and max_num_seqs must be >= 1")
        object.__setattr__(self, "order", PrefillOrder(self.order))


@dataclass(frozen=True, slots=True)
class TetriDecodeParams:
    admission: Admission = Admission.RESERVE_DYNAMIC
    """Paper's evaluation default: reserve-dynamic."""
    length_granularity_tokens: int = 200
    """Predictor bucket width G (paper: 200); 1 = exact length."""
    length_estimate: LengthEstimate = LengthEstimate.LOWER
    """Which end of the predicted bucket the reservation uses (paper: lower)."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    """Token budget of one step (decodes, plus recompute chunks of preempted sequences)."""

    def __post_init__(self) -> None:
        if self.length_granularity_tokens < 1:
            raise ValueError("length_granularity_tokens must be >= 1")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        object.__setattr__(self, "admission", Admission(self.admission))
        object.__setattr__(self, "length_estimate", LengthEstimate(self.length_estimate))

    def predicted_output_tokens(self, seq: SeqView) -> int:
        """The predictor's estimate of `seq`'s total output length (at least 1)."""
        g = self.length_granularity_tokens
        lower = (seq.max_tokens // g) * g
        if self.length_estimate is LengthEstimate.MID:
            lower += g // 2
        elif self.length_estimate is LengthEstimate.UPPER:
            lower += g - 1
        return max(1, lower)


def _extra_blocks(seq: SeqView, tokens: int, block_size: int) -> int:
    return max(0, blocks_for(tokens, block_size) - seq.blocks_held)


def _windowed(waiting: tuple[SeqView, ...], params: TetriPrefillParams) -> list[SeqView]:
    """Waiting requests in scheduled order: arrival-order windows, each sorted by the policy."""
    out: list[SeqView] = []
    for i in range(0, len(waiting), params.window_size):
        window = list(waiting[i : i + params.window_size])
        if params.order is PrefillOrder.SJF:
            window.sort(key=lambda s: s.num_prompt_tokens)  # stable: ties keep arrival order
        elif params.order is PrefillOrder.LJF:
            window.sort(key=lambda s: -s.num_prompt_tokens)
        out.extend(window)
    return out


class TetriPrefillPolicy:
    """One fixed-size, prefill-only chunk per step, sliced from the scheduled queue in order."""

    name = "tetriinfer-prefill"
    steady_decode = False
    runs_handoffs = False
    """A decode hand-off (remote KV) is never scheduled: a decode or mixed worker running this
    policy behind a prefill pool never finishes a request (`sim.config` refuses it)."""

    def __init__(self, params: TetriPrefillParams | None = None) -> None:
        self.params = params or TetriPrefillParams()

    def scheduled_order(self, view: StepView) -> list[SeqView]:
        """Running (already started) prompts first, then the sorted windows of waiting ones."""
        return list(view.running) + _windowed(view.waiting, self.params)

    def decide(self, view: StepView) -> StepDecision:
        queue = self.scheduled_order(view)
        room = self.params.chunk_tokens
        free = view.free_blocks
        num_running = len(view.running)
        chunks: list[tuple[RequestId, int]] = []
        preempt: list[RequestId] = []
        running_left = list(view.running)
        started_ids = {s.id for s in view.running}
        for seq in queue:
            if room == 0:
                break
            started = seq.id in started_ids
            if started:
                if seq.id in preempt:
                    continue
                running_left.pop(0)
            elif seq.remote_kv:
                continue  # a decode hand-off has no place on a prefill instance's chunk
            elif num_running >= self.params.max_num_seqs:
                break
            take = min(room, seq.num_uncomputed_tokens)
            if take <= 0:
                continue
            need = _extra_blocks(seq, seq.num_computed_tokens + take, view.block_size)
            # A started prompt that cannot grow evicts the latest started one behind it (vLLM).
            while started and need > free and running_left:
                victim = running_left.pop()
                preempt.append(victim.id)
                free += victim.blocks_held
            if need > free:
                break  # strict order: a chunk never skips ahead of a prompt that does not fit
            chunks.append((seq.id, take))
            free -= need
            room -= take
            if not started:
                num_running += 1
        return StepDecision(chunks=tuple(chunks), preempt=tuple(preempt))


class TetriDecodePolicy:
    """Continuous batching with greedy / reserve-static / reserve-dynamic admission."""

    name = "tetriinfer-decode"
    steady_decode = True
    """With nothing waiting and only decodes running, every step is the same batch."""

    def __init__(self, params: TetriDecodeParams | None = None) -> None:
        self.params = params or TetriDecodeParams()

    def decide(self, view: StepView) -> StepDecision:
        p = self.params
        size = view.block_size
        free = view.free_blocks
        budget = p.max_num_batched_tokens
        chunks: list[tuple[RequestId, int]] = []
        preempt: list[RequestId] = []
        running = list(view.running)
        kept: list[SeqView] = []
        while running:
            seq = running.pop(0)
            n = min(seq.num_uncomputed_tokens, budget)
            if n <= 0:
                kept.append(seq)
                continue
            need = _extra_blocks(seq, seq.num_computed_tokens + n, size)
            while need > free and running:
                victim = running.pop()  # latest admitted first, as vLLM preempts
                preempt.append(victim.id)
                free += victim.blocks_held
            if need > free:
                preempt.append(seq.id)
                free += seq.blocks_held
                continue
            chunks.append((seq.id, n))
            free -= need
            budget -= n
            kept.append(seq)
        if not preempt:
            self._admit(view, kept, free, budget, chunks)
        return StepDecision(chunks=tuple(chunks), preempt=tuple(preempt))

    def _admit(
        self,
        view: StepView,
        kept: list[SeqView],
        free: int,
        budget: int,
        chunks: list[tuple[RequestId, int]],
    ) -> None:
        """Admit waiting sequences in arrival order while the admission rule allows."""
        size = view.block_size
        # (prompt tokens, predicted total output, generated so far) of everything in the batch.
        batch = [self._job(s) for s in kept]
        used = view.total_blocks - free
        for seq in view.waiting:
            if len(batch) >= self.params.max_num_seqs:
                break
            n = 0 if seq.remote_kv else min(seq.num_uncomputed_tokens, budget)
            if not seq.remote_kv and n <= 0:
                break
            tokens = seq.num_prompt_tokens if seq.remote_kv else seq.num_computed_tokens + n
            need = _extra_blocks(seq, tokens, size)
            if need > free:
                break
            job = self._job(seq)
            if batch and not self._admits(batch, job, used, view.total_blocks, size):
                break  # FCFS admission: no overtaking of a request the rule holds back
            chunks.append((seq.id, n))
            free -= need
            used += need
            budget -= n
            batch.append(job)

    def _job(self, seq: SeqView) -> tuple[int, int, int]:
        return (
            seq.num_prompt_tokens,
            self.params.predicted_output_tokens(seq),
            seq.num_output_tokens,
        )

    def _admits(
        self,
        batch: list[tuple[int, int, int]],
        job: tuple[int, int, int],
        used_blocks: int,
        total_blocks: int,
        size: int,
    ) -> bool:
        adm = self.params.admission
        if adm is Admission.GREEDY:
            return True
        prompt, predicted, _ = job
        if adm is Admission.RESERVE_STATIC:
            # Everything running grows to its predicted peak; the newcomer needs its own peak.
            future = sum(
                max(0, blocks_for(p + max(g_hat, g), size) - blocks_for(p + g, size))
                for p, g_hat, g in batch
            )
            return used_blocks + future + blocks_for(prompt + predicted, size) <= total_blocks
        # Reserve-dynamic: memory when the shortest remaining job in the batch finishes (what
        # is in use now, KV in transfer included, plus the batch's growth over tau steps).
        tau = min(max(0, g_hat - g) for _, g_hat, g in batch)
        growth = sum(blocks_for(p + g + tau, size) - blocks_for(p + g, size) for p, _, g in batch)
        return used_blocks + growth + blocks_for(prompt + min(tau, predicted), size) <= total_blocks


def make_prefill(**params: Any) -> BatchingPolicy:
    """Registered as "tetriinfer-prefill"; params are `TetriPrefillParams` fields."""
    return TetriPrefillPolicy(TetriPrefillParams(**params))


def make_decode(**params: Any) -> BatchingPolicy:
    """Registered as "tetriinfer-decode"; params are `TetriDecodeParams` fields."""
    return TetriDecodePolicy(TetriDecodeParams(**params))

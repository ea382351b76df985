"""vLLM-like FCFS step policy with chunked prefill (the baseline).

Order of a step, as in vLLM V1's scheduler: running sequences first, in admission order (decodes
take one token, unfinished prefills a chunk), then waiting sequences in arrival order while the
token budget, the sequence cap and the free KV blocks allow. A waiting sequence that does not fit
blocks those behind it (strict FCFS, no overtaking). When running sequences cannot grow, the most
recently arrived running sequence is preempted (recompute), again as vLLM does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from splitserve.core.ids import RequestId
from splitserve.policy.batching.base import SeqView, StepDecision, StepView


@dataclass(frozen=True, slots=True)
class FcfsParams:
    max_num_batched_tokens: int = 2048
    """Token budget of one step (prefill chunks + one per decode)."""
    max_num_seqs: int = 256
    """Most sequences running at once."""
    chunked_prefill: bool = True
    """Split long prompts across steps; off = a prompt runs whole or waits."""
    prefill_priority: bool = False
    """vLLM before chunked prefill (v0.2, DistServe's baseline): a step that can admit a waiting
    prompt runs prompts only; running decodes wait for the next step."""

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")


class FcfsPolicy:
    name = "fcfs"
    steady_decode = True
    """With nothing waiting and every running sequence decoding, the next decision is the same
    batch while blocks suffice: the engine may fuse such steps (`EngineModel.schedule`)."""

    def __init__(self, params: FcfsParams | None = None) -> None:
        self.params = params or FcfsParams()

    def decide(self, view: StepView) -> StepDecision:
        if self.params.prefill_priority and view.waiting:
            prompts = self._admit(
                view,
                _Plan(view.free_blocks, view.block_size, self.params.max_num_batched_tokens),
                len(view.running),
            )
            if prompts.chunks:
                return StepDecision(chunks=tuple(prompts.chunks))
        plan = _Plan(view.free_blocks, view.block_size, self.params.max_num_batched_tokens)
        running = deque(view.running)
        preempt: list[RequestId] = []
        chunked = self.params.chunked_prefill
        while running:
            seq = running.popleft()
            n = plan.chunk_size(seq, chunked)
            if n == 0:
                continue
            need = plan.need(seq, n)
            while need > plan.free_blocks and running:
                victim = running.pop()  # latest admitted: vLLM preempts from the back
                preempt.append(victim.id)
                plan.free_blocks += victim.blocks_held
            if need <= plan.free_blocks:
                plan.take(seq, n, need)
            else:
                preempt.append(seq.id)
                plan.free_blocks += seq.blocks_held
        if not (self.params.prefill_priority and preempt):
            self._admit(view, plan, len(view.running) - len(preempt))
        return StepDecision(chunks=tuple(plan.chunks), preempt=tuple(preempt))

    def _admit(self, view: StepView, plan: _Plan, num_running: int) -> _Plan:
        """Admit waiting sequences in arrival order while budget, seats and blocks allow."""
        for seq in view.waiting:
            if num_running >= self.params.max_num_seqs:
                break
            n = 0 if seq.remote_kv else plan.chunk_size(seq, self.params.chunked_prefill)
            if not seq.remote_kv and n == 0:
                break
            if not plan.fits(seq, n):
                break
            plan.take(seq, n)
            num_running += 1
        return plan


class _Plan:
    """Tentative budget and block bookkeeping while one decision is built."""

    def __init__(self, free_blocks: int, block_size: int, budget: int) -> None:
        self.free_blocks = free_blocks
        self.block_size = block_size
        self.budget = budget
        self.chunks: list[tuple[RequestId, int]] = []

    def chunk_size(self, seq: SeqView, chunked: bool) -> int:
        remaining = seq.num_prompt_tokens + seq.num_output_tokens - seq.num_computed_tokens
        if remaining <= self.budget:
            return remaining
        if chunked:
            return self.budget
        # Unchunked: a prompt larger than the whole budget may run alone.
        return remaining if not self.chunks and self.budget > 0 else 0

    def need(self, seq: SeqView, n: int) -> int:
        tokens = seq.num_prompt_tokens if seq.remote_kv else seq.num_computed_tokens + n
        extra = -(-tokens // self.block_size) - seq.blocks_held  # blocks_for, inlined (hot)
        return extra if extra > 0 else 0

    def fits(self, seq: SeqView, n: int) -> bool:
        return self.need(seq, n) <= self.free_blocks

    def take(self, seq: SeqView, n: int, need: int | None = None) -> None:
        self.free_blocks -= self.need(seq, n) if need is None else need
        budget = self.budget - n
        self.budget = budget if budget > 0 else 0
        self.chunks.append((seq.id, n))

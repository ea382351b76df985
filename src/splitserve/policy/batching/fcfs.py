"""vLLM-like FCFS step policy with chunked prefill (the baseline).

Order of a step, as in vLLM V1's scheduler: running sequences first, in admission order (decodes
take one token, unfinished prefills a chunk), then waiting sequences in arrival order while the
token budget, the sequence cap and the free KV blocks allow. A waiting sequence that does not fit
blocks those behind it (strict FCFS, no overtaking). When running sequences cannot grow, the most
recently arrived running sequence is preempted (recompute), again as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitserve.core.ids import RequestId
from splitserve.core.kv import blocks_for
from splitserve.policy.batching.base import SeqView, StepDecision, StepView


@dataclass(frozen=True, slots=True)
class FcfsParams:
    max_num_batched_tokens: int = 2048
    """Token budget of one step (prefill chunks + one per decode)."""
    max_num_seqs: int = 256
    """Most sequences running at once."""
    chunked_prefill: bool = True
    """Split long prompts across steps; off = a prompt runs whole or waits."""

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")


class FcfsPolicy:
    name = "fcfs"

    def __init__(self, params: FcfsParams | None = None) -> None:
        self.params = params or FcfsParams()

    def decide(self, view: StepView) -> StepDecision:
        plan = _Plan(view.free_blocks, view.block_size, self.params.max_num_batched_tokens)
        running = list(view.running)
        preempt: list[RequestId] = []
        while running:
            seq = running.pop(0)
            n = plan.chunk_size(seq, self.params.chunked_prefill)
            if n == 0:
                continue
            while not plan.fits(seq, n) and running:
                victim = running.pop()  # latest admitted: vLLM preempts from the back
                preempt.append(victim.id)
                plan.free_blocks += victim.blocks_held
            if plan.fits(seq, n):
                plan.take(seq, n)
            else:
                preempt.append(seq.id)
                plan.free_blocks += seq.blocks_held
        num_running = len(view.running) - len(preempt)
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
        return StepDecision(chunks=tuple(plan.chunks), preempt=tuple(preempt))


class _Plan:
    """Tentative budget and block bookkeeping while one decision is built."""

    def __init__(self, free_blocks: int, block_size: int, budget: int) -> None:
        self.free_blocks = free_blocks
        self.block_size = block_size
        self.budget = budget
        self.chunks: list[tuple[RequestId, int]] = []

    def chunk_size(self, seq: SeqView, chunked: bool) -> int:
        remaining = seq.num_uncomputed_tokens
        if remaining <= self.budget:
            return remaining
        if chunked:
            return self.budget
        # Unchunked: a prompt larger than the whole budget may run alone.
        return remaining if not self.chunks and self.budget > 0 else 0

    def need(self, seq: SeqView, n: int) -> int:
        tokens = seq.num_prompt_tokens if seq.remote_kv else seq.num_computed_tokens + n
        return max(0, blocks_for(tokens, self.block_size) - seq.blocks_held)

    def fits(self, seq: SeqView, n: int) -> bool:
        return self.need(seq, n) <= self.free_blocks

    def take(self, seq: SeqView, n: int) -> None:
        self.free_blocks -= self.need(seq, n)
        self.budget = max(0, self.budget - n)
        self.chunks.append((seq.id, n))

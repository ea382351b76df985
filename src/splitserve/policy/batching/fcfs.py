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
        # The running pass with `_Plan.chunk_size` / `need` / `take` inlined (the hot loop: every
        # decode of every step passes here); `plan` is brought up to date for `_admit` after.
        plan = _Plan(view.free_blocks, view.block_size, self.params.max_num_batched_tokens)
        running = deque(view.running)
        preempt: list[RequestId] = []
        chunked = self.params.chunked_prefill
        free = plan.free_blocks
        budget = plan.budget
        size = plan.block_size
        chunks = plan.chunks
        popleft = running.popleft
        while running:
            seq = popleft()
            n = seq.num_prompt_tokens + seq.num_output_tokens - seq.num_computed_tokens
            if n > budget:
                if chunked:
                    n = budget
                elif chunks or budget <= 0:
                    n = 0
            if n == 0:
                continue
            tokens = seq.num_prompt_tokens if seq.remote_kv else seq.num_computed_tokens + n
            need = -(-tokens // size) - seq.blocks_held  # blocks_for, inlined (hot)
            if need < 0:
                need = 0
            while need > free and running:
                victim = running.pop()  # latest admitted: vLLM preempts from the back
                preempt.append(victim.id)
                free += victim.blocks_held
            if need <= free:
                free -= need
                budget = budget - n if budget > n else 0
                chunks.append((seq.id, n))
            else:
                preempt.append(seq.id)
                free += seq.blocks_held
        plan.free_blocks = free
        plan.budget = budget
        if not (self.params.prefill_priority and preempt):
            self._admit(view, plan, len(view.running) - len(preempt))
        return StepDecision(chunks=tuple(plan.chunks), preempt=tuple(preempt))

    def _admit(self, view: StepView, plan: _Plan, num_running: int) -> _Plan:
        """Admit waiting sequences in arrival order while budget, seats and blocks allow.

        `_Plan.chunk_size` / `fits` / `take` inlined (hot); `plan` is brought up to date after."""
        max_seqs = self.params.max_num_seqs
        chunked = self.params.chunked_prefill
        free = plan.free_blocks
        budget = plan.budget
        size = plan.block_size
        chunks = plan.chunks
        for seq in view.waiting:
            if num_running >= max_seqs:
                break
            if seq.remote_kv:
                n = 0
                tokens = seq.num_prompt_tokens
            else:
                n = seq.num_prompt_tokens + seq.num_output_tokens - seq.num_computed_tokens
                if n > budget:
                    if chunked:
                        n = budget
                    elif chunks or budget <= 0:
                        n = 0
                if n == 0:
                    break
                tokens = seq.num_computed_tokens + n
            need = -(-tokens // size) - seq.blocks_held  # blocks_for, inlined
            if need < 0:
                need = 0
            if need > free:
                break
            free -= need
            budget = budget - n if budget > n else 0
            chunks.append((seq.id, n))
            num_running += 1
        plan.free_blocks = free
        plan.budget = budget
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

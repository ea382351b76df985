"""Sarathi-Serve step policy: stall-free batching under a fixed token budget.

Sarathi-Serve (Agrawal et al., OSDI'24) bounds every step to a token budget (the "chunk size")
and fills it in a fixed order: running decodes first (one token each, so they never stall behind
a prompt), then the running sequences still prefilling (their next chunk), then new prompts in
arrival order, chunked to what is left. Long prompts therefore spread over several steps and
every step costs about the same, which keeps time-between-tokens flat. Paper defaults: budget 512
tokens for tight TBT targets (2048 for throughput), max batch 256. Preemption under KV pressure
is vLLM's (recompute, latest first), applied to the stall-free order.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitserve.policy.batching.base import StepDecision, StepView
from splitserve.policy.batching.fcfs import FcfsParams, FcfsPolicy


@dataclass(frozen=True, slots=True)
class SarathiParams:
    chunk_tokens: int = 512
    """Token budget of one step: decodes + prefill chunks."""
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("chunk_tokens and max_num_seqs must be >= 1")


class SarathiPolicy:
    name = "sarathi"
    steady_decode = True
    """Like FCFS: with nothing waiting and only decodes running the batch repeats."""

    def __init__(self, params: SarathiParams | None = None) -> None:
        self.params = params or SarathiParams()
        self._fcfs = FcfsPolicy(
            FcfsParams(
                max_num_batched_tokens=self.params.chunk_tokens,
                max_num_seqs=self.params.max_num_seqs,
                chunked_prefill=True,
            )
        )

    def decide(self, view: StepView) -> StepDecision:
        decodes = tuple(s for s in view.running if s.is_decoding)
        prefills = tuple(s for s in view.running if not s.is_decoding)
        stall_free = StepView(
            view.now_s,
            view.waiting,
            decodes + prefills,
            view.free_blocks,
            view.total_blocks,
            view.block_size,
        )
        return self._fcfs.decide(stall_free)

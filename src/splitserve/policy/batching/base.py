"""What a step policy sees and what it decides.

Sequences are modelled the way chunked-prefill engines (vLLM V1, Sarathi) see them: a sequence
knows `num_known` tokens (prompt + outputs so far) and has KV for `num_computed` of them. A step
runs a chunk of `n <= num_known - num_computed` tokens; when the chunk reaches `num_known` the
engine samples one new token. A decode step is simply a chunk of 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.request import DEFAULT_SLO_CLASS


@dataclass(frozen=True, slots=True)
class SeqView:
    id: RequestId
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    max_tokens: int
    blocks_held: int
    remote_kv: bool = False
    """Waiting for admission with its KV coming from a prefill worker (needs blocks, no compute)."""
    priority: int = 0
    """Larger runs earlier for policies that use priorities; FCFS ignores it."""
    deadline_s: float | None = None
    slo_class: SloClassName = DEFAULT_SLO_CLASS.name
    """The request's SLO class (`Request.slo_class`); SLO-aware policies look its targets up in
    the classes they were built with."""
    predicted_output_tokens: int | None = None
    """Total output length predicted when the engine took the request (the engine's
    `OutputLengthPredictor`, e.g. the simulator's oracle); None when the engine has none."""

    @property
    def num_known_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_known_tokens - self.num_computed_tokens

    @property
    def swapped(self) -> bool:
        """Its KV is parked in host memory (`StepDecision.swap_out`): progress kept, no blocks
        held; a chunk swaps it back in (blocks re-allocated for `num_computed_tokens + n`). A
        property, not a field (the hot path builds one view per sequence per step): no other
        sequence has computed tokens without holding blocks."""
        return self.num_computed_tokens > 0 and self.blocks_held == 0

    @property
    def is_decoding(self) -> bool:
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1


class FinishedSeq(NamedTuple):
    """A request that finished (sampled its last token) on this engine."""

    id: RequestId
    num_prompt_tokens: int
    num_output_tokens: int
    """Its true, final output length (exact also inside fused decode runs)."""


@dataclass(frozen=True, slots=True)
class StepView:
    now_s: float
    waiting: tuple[SeqView, ...]
    """Not yet admitted (or preempted), in arrival order."""
    running: tuple[SeqView, ...]
    """Admitted and computing, in admission order."""
    free_blocks: int
    total_blocks: int
    block_size: int
    finished: tuple[FinishedSeq, ...] = ()
    """Requests that finished since the previous decision, in finishing order (empty for views
    built by hand; `predict.feedback.FinishTracker` infers them from consecutive views)."""
    host_free_tokens: int = 0
    """Host (CPU) swap space left, in KV tokens: what `StepDecision.swap_out` may still use."""


@dataclass(frozen=True, slots=True)
class StepDecision:
    chunks: tuple[tuple[RequestId, int], ...] = ()
    """(sequence, new tokens) to run this step, in order. 0 tokens admits a remote-KV sequence
    (allocates its blocks so the transfer can start)."""
    preempt: tuple[RequestId, ...] = ()
    """Running sequences to evict before the chunks run (their KV is dropped; recomputed later)."""
    swap_out: tuple[RequestId, ...] = ()
    """Running sequences to swap out before the chunks run: their computed KV moves to host
    memory (`StepView.host_free_tokens` must hold it), their blocks are freed and their progress
    is kept; they wait (`SeqView.swapped`) until a chunk swaps them back in. The owner prices
    the copies (`Step.swap_out_tokens`, `Step.swap_in_tokens`)."""

    @property
    def is_empty(self) -> bool:
        return not self.chunks and not self.preempt and not self.swap_out


class BatchingPolicy(Protocol):
    """Decides one engine step. Pure and deterministic for a given view.

    The engine validates every decision: chunks must not exceed a sequence's uncomputed tokens and
    must fit the free blocks (after preemptions). An invalid decision raises, so a policy bug is
    caught at once rather than corrupting the block ledger.
    """

    name: str

    def decide(self, view: StepView) -> StepDecision: ...

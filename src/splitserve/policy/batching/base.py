"""What a step policy sees and what it decides.

Sequences are modelled the way chunked-prefill engines (vLLM V1, Sarathi) see them: a sequence
knows `num_known` tokens (prompt + outputs so far) and has KV for `num_computed` of them. A step
runs a chunk of `n <= num_known - num_computed` tokens; when the chunk reaches `num_known` the
engine samples one new token. A decode step is simply a chunk of 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol

from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.request import DEFAULT_SLO_CLASS

# Value objects built on every engine step (the simulator's hot path, issue 4): slotted dataclasses
# with an explicit `__init__` and `Final` fields rather than `frozen=True`, whose generated
# `__init__` goes through `object.__setattr__` (interpreted even under mypyc, several times the
# cost). `repr`, equality, hashing and `dataclasses.replace` are unchanged; immutability is checked
# by mypy (`Final`) and enforced at runtime in the compiled build only. A new field must be added to
# `__init__` too (defaults live there). See docs/benchmarks.md.


@dataclass(slots=True, init=False, unsafe_hash=True)
class SeqView:
    id: Final[RequestId]
    arrival_s: Final[float]
    num_prompt_tokens: Final[int]
    num_output_tokens: Final[int]
    num_computed_tokens: Final[int]
    max_tokens: Final[int]
    blocks_held: Final[int]
    remote_kv: Final[bool]
    """Waiting for admission with its KV coming from a prefill worker (needs blocks, no compute)."""
    priority: Final[int]
    """Larger runs earlier for policies that use priorities; FCFS ignores it."""
    deadline_s: Final[float | None]
    slo_class: Final[SloClassName]
    """The request's SLO class (`Request.slo_class`); SLO-aware policies look its targets up in
    the classes they were built with."""
    predicted_output_tokens: Final[int | None]
    """Total output length predicted when the engine took the request (the engine's
    `OutputLengthPredictor`, e.g. the simulator's oracle); None when the engine has none."""
    checkpointed_tokens: Final[int]
    """Of its `num_computed_tokens`, how many have their KV in host memory, not in its blocks: the
    tail a `StepDecision.checkpoint` copied out (a running sequence), or all of them (a swapped
    one). The next chunk re-allocates their blocks and swaps them back in (priced by the owner).
    0 unless the engine has host swap space and a policy used it."""

    def __init__(
        self,
        id: RequestId,
        arrival_s: float,
        num_prompt_tokens: int,
        num_output_tokens: int,
        num_computed_tokens: int,
        max_tokens: int,
        blocks_held: int,
        remote_kv: bool = False,
        priority: int = 0,
        deadline_s: float | None = None,
        slo_class: SloClassName = DEFAULT_SLO_CLASS.name,
        predicted_output_tokens: int | None = None,
        checkpointed_tokens: int = 0,
    ) -> None:
        self.id = id
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.num_computed_tokens = num_computed_tokens
        self.max_tokens = max_tokens
        self.blocks_held = blocks_held
        self.remote_kv = remote_kv
        self.priority = priority
        self.deadline_s = deadline_s
        self.slo_class = slo_class
        self.predicted_output_tokens = predicted_output_tokens
        self.checkpointed_tokens = checkpointed_tokens

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


@dataclass(slots=True, init=False, unsafe_hash=True)
class StepView:
    now_s: Final[float]
    waiting: Final[tuple[SeqView, ...]]
    """Not yet admitted (or preempted), in arrival order."""
    running: Final[tuple[SeqView, ...]]
    """Admitted and computing, in admission order."""
    free_blocks: Final[int]
    total_blocks: Final[int]
    block_size: Final[int]
    finished: Final[tuple[FinishedSeq, ...]]
    """Requests that finished since the previous decision, in finishing order (empty for views
    built by hand; `predict.feedback.FinishTracker` infers them from consecutive views)."""
    host_free_tokens: Final[int]
    """Host (CPU) swap space left, in KV tokens: what `StepDecision.swap_out` may still use."""

    def __init__(
        self,
        now_s: float,
        waiting: tuple[SeqView, ...],
        running: tuple[SeqView, ...],
        free_blocks: int,
        total_blocks: int,
        block_size: int,
        finished: tuple[FinishedSeq, ...] = (),
        host_free_tokens: int = 0,
    ) -> None:
        self.now_s = now_s
        self.waiting = waiting
        self.running = running
        self.free_blocks = free_blocks
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.finished = finished
        self.host_free_tokens = host_free_tokens


@dataclass(slots=True, init=False, unsafe_hash=True)
class StepDecision:
    chunks: Final[tuple[tuple[RequestId, int], ...]]
    """(sequence, new tokens) to run this step, in order. 0 tokens admits a remote-KV sequence
    (allocates its blocks so the transfer can start)."""
    preempt: Final[tuple[RequestId, ...]]
    """Running sequences to evict before the chunks run (their KV is dropped; recomputed later)."""
    swap_out: Final[tuple[RequestId, ...]]
    """Running sequences to swap out before the chunks run: their computed KV moves to host
    memory (`StepView.host_free_tokens` must hold it), their blocks are freed and their progress
    is kept; they wait (`SeqView.swapped`) until a chunk swaps them back in. The owner prices
    the copies (`Step.swap_out_tokens`, `Step.swap_in_tokens`)."""
    checkpoint: Final[tuple[tuple[RequestId, int], ...]]
    """(running sequence, k): copy the KV in its last k blocks to host memory and free those
    blocks (a partial, block-level swap-out; 0 < k <= `blocks_held`; not also preempted, swapped
    out or scheduled in the same decision; the copied tokens must fit `host_free_tokens`). It
    keeps its progress (`SeqView.checkpointed_tokens`); a later chunk re-allocates the blocks and
    swaps the tokens back in. Checkpointing all its blocks is a `swap_out`: it then waits."""

    def __init__(
        self,
        chunks: tuple[tuple[RequestId, int], ...] = (),
        preempt: tuple[RequestId, ...] = (),
        swap_out: tuple[RequestId, ...] = (),
        checkpoint: tuple[tuple[RequestId, int], ...] = (),
    ) -> None:
        self.chunks = chunks
        self.preempt = preempt
        self.swap_out = swap_out
        self.checkpoint = checkpoint

    @property
    def is_empty(self) -> bool:
        return not self.chunks and not self.preempt and not self.swap_out and not self.checkpoint


class BatchingPolicy(Protocol):
    """Decides one engine step. Pure and deterministic for a given view.

    The engine validates every decision: chunks must not exceed a sequence's uncomputed tokens and
    must fit the free blocks (after preemptions). An invalid decision raises, so a policy bug is
    caught at once rather than corrupting the block ledger.
    """

    name: str

    def decide(self, view: StepView) -> StepDecision: ...

"""The engine model: one worker's queues, KV blocks and step loop, as a pure state machine.

The owner drives it: `schedule(now)` asks the step policy for a decision and allocates blocks;
the owner lets the step's time pass (`LatencyModel.step_s(step.batch)`: an `asyncio.sleep` in the
live simulated engine, an event in the simulator); `complete(step, now)` advances the sequences and
samples tokens. Remote-KV sequences are admitted (blocks allocated) by a step, then the owner
moves the bytes and calls `finish_transfer`.

Invariants (property-tested): blocks are conserved (free + held == total); a sequence holds blocks
only while it is transferring, running or holding KV for a pull; a decision the ledger cannot
honour raises before anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from splitserve.core.errors import CapacityError
from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager, blocks_for
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.request import FinishReason, Request
from splitserve.policy.batching.base import BatchingPolicy, SeqView, StepDecision, StepView
from splitserve.policy.batching.tokens import SyntheticTokens


class RequestMode(StrEnum):
    GENERATE = "generate"
    """Prefill and decode here (aggregated)."""
    PREFILL = "prefill"
    """Prefill, sample the first token, then hold the KV for a decode worker to pull."""
    DECODE = "decode"
    """KV comes from a prefill worker; the first token is already known."""


class SeqPhase(StrEnum):
    WAITING = "waiting"
    TRANSFERRING = "transferring"
    RUNNING = "running"
    HOLDING = "holding"


@dataclass(slots=True)
class _Seq:
    request: Request
    mode: RequestMode
    key: int
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    phase: SeqPhase = SeqPhase.WAITING
    hold_until_s: float = 0.0
    first_scheduled_s: float | None = None

    @property
    def id(self) -> RequestId:
        return self.request.id

    @property
    def num_known(self) -> int:
        return self.request.num_prompt_tokens + len(self.output_ids)

    def view(self, blocks_held: int) -> SeqView:
        r = self.request
        return SeqView(
            id=r.id,
            arrival_s=r.arrival_s,
            num_prompt_tokens=r.num_prompt_tokens,
            num_output_tokens=len(self.output_ids),
            num_computed_tokens=self.num_computed,
            max_tokens=r.sampling.max_tokens,
            blocks_held=blocks_held,
            remote_kv=self.mode is RequestMode.DECODE and self.phase is SeqPhase.WAITING,
        )


@dataclass(frozen=True, slots=True)
class TokenEvent:
    request_id: RequestId
    token_id: int
    index: int
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True)
class Step:
    decision: StepDecision
    batch: BatchShape
    started_s: float
    transfers: tuple[RequestId, ...] = ()
    """Remote-KV sequences admitted by this step: the owner starts their KV pulls."""


@dataclass(frozen=True, slots=True)
class StepResult:
    tokens: tuple[TokenEvent, ...] = ()
    prefilled: tuple[RequestId, ...] = ()
    """Prefill-mode sequences whose first token is out and whose KV is now held for a pull."""
    finished: tuple[RequestId, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineLoad:
    num_waiting: int
    num_running: int
    num_transferring: int
    num_holding: int
    free_blocks: int
    total_blocks: int
    block_size: int
    pending_prefill_tokens: int


class EngineModel:
    def __init__(
        self,
        policy: BatchingPolicy,
        blocks: BlockManager,
        tokens: SyntheticTokens | None,
        kv_hold_timeout_s: float = 30.0,
    ) -> None:
        """`tokens=None` counts tokens without choosing ids (every id is 0, stop ids never match):
        the simulator's mode, which skips hashing every prompt."""
        self.policy = policy
        self.blocks = blocks
        self.tokens = tokens
        self.kv_hold_timeout_s = kv_hold_timeout_s
        self._seqs: dict[RequestId, _Seq] = {}
        self._inflight: Step | None = None
        self.num_preemptions = 0

    # -- intake -----------------------------------------------------------------------------

    def add(self, request: Request, mode: RequestMode, first_token_id: int | None = None) -> None:
        """Queue a request. Raises `CapacityError` if it could never fit, `ValueError` if known."""
        if request.id in self._seqs:
            raise ValueError(f"request {request.id!r} is already on this engine")
        if request.num_prompt_tokens == 0:
            raise ValueError("prompt must have at least one token")
        peak = request.num_prompt_tokens + (
            1 if mode is RequestMode.PREFILL else request.sampling.max_tokens
        )
        if blocks_for(peak, self.blocks.block_size) > self.blocks.num_blocks:
            raise CapacityError(
                f"request needs KV for {peak} tokens; this engine holds at most "
                f"{self.blocks.num_blocks * self.blocks.block_size}"
            )
        key = (
            0
            if self.tokens is None
            else self.tokens.key(request.prompt_token_ids, request.sampling.seed)
        )
        seq = _Seq(request, mode, key)
        if mode is RequestMode.DECODE:
            if first_token_id is None:
                raise ValueError("a decode request needs the first token from its prefill")
            s = request.sampling
            if s.max_tokens <= 1 or first_token_id in s.stop_token_ids:
                raise ValueError("nothing to decode: the request finished at its first token")
            seq.output_ids.append(first_token_id)
        self._seqs[request.id] = seq

    # -- the step loop ------------------------------------------------------------------------

    def view(self, now_s: float) -> StepView:
        held = self.blocks.blocks_held
        by_arrival = sorted(
            (s for s in self._seqs.values() if s.phase is SeqPhase.WAITING),
            key=lambda s: s.request.arrival_s,
        )
        running = [s for s in self._seqs.values() if s.phase is SeqPhase.RUNNING]
        return StepView(
            now_s=now_s,
            waiting=tuple(s.view(held(s.id)) for s in by_arrival),
            running=tuple(s.view(held(s.id)) for s in running),
            free_blocks=self.blocks.num_free,
            total_blocks=self.blocks.num_blocks,
            block_size=self.blocks.block_size,
        )

    def schedule(self, now_s: float) -> Step | None:
        """Decide and start the next step; None when there is nothing to run."""
        if self._inflight is not None:
            raise RuntimeError("a step is already in flight")
        view = self.view(now_s)
        if not view.waiting and not view.running:
            return None
        decision = self.policy.decide(view)
        self._validate(decision)
        for rid in decision.preempt:
            self._preempt(self._seqs[rid])
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        transfers: list[RequestId] = []
        for rid, n in decision.chunks:
            seq = self._seqs[rid]
            if seq.mode is RequestMode.DECODE and seq.phase is SeqPhase.WAITING:
                self._must_grow(rid, seq.request.num_prompt_tokens)
                seq.phase = SeqPhase.TRANSFERRING
                transfers.append(rid)
                continue
            self._must_grow(rid, seq.num_computed + n)
            seq.phase = SeqPhase.RUNNING
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now_s
            if len(seq.output_ids) > 0 and n == 1 and seq.num_known - seq.num_computed == 1:
                decode.append(seq.num_computed)
            else:
                prefill.append((n, seq.num_computed))
        if not prefill and not decode and not transfers and not decision.preempt:
            return None
        step = Step(decision, BatchShape(tuple(prefill), tuple(decode)), now_s, tuple(transfers))
        self._inflight = step
        return step

    def complete(self, step: Step, now_s: float) -> StepResult:
        """Finish the in-flight step: advance sequences, sample tokens, finish or hold."""
        if self._inflight is not step:
            raise RuntimeError("complete() must be given the step in flight")
        self._inflight = None
        tokens: list[TokenEvent] = []
        prefilled: list[RequestId] = []
        finished: list[RequestId] = []
        for rid, n in step.decision.chunks:
            seq = self._seqs.get(rid)
            if seq is None or seq.phase is not SeqPhase.RUNNING or n == 0:
                continue  # aborted meanwhile, or an admission-only chunk
            seq.num_computed += n
            if seq.num_computed < seq.num_known:
                continue  # a prefill chunk that did not reach the end of the prompt yet
            event = self._sample(seq)
            tokens.append(event)
            if event.finish_reason is not None:
                self._drop(seq)
                finished.append(rid)
            elif seq.mode is RequestMode.PREFILL:
                seq.phase = SeqPhase.HOLDING
                seq.hold_until_s = now_s + self.kv_hold_timeout_s
                prefilled.append(rid)
        return StepResult(tuple(tokens), tuple(prefilled), tuple(finished))

    def finish_transfer(self, rid: RequestId) -> bool:
        """The KV of a remote-decode sequence has arrived: it can decode now."""
        seq = self._seqs.get(rid)
        if seq is None or seq.phase is not SeqPhase.TRANSFERRING:
            return False
        seq.num_computed = seq.request.num_prompt_tokens
        seq.phase = SeqPhase.RUNNING
        return True

    # -- removal ------------------------------------------------------------------------------

    def abort(self, rid: RequestId) -> bool:
        """Forget a request wherever it is and free its blocks. False if unknown."""
        seq = self._seqs.get(rid)
        if seq is None:
            return False
        self._drop(seq)
        return True

    def release(self, rid: RequestId) -> bool:
        """Free the KV a prefilled sequence holds for a pull (the decode side has it now)."""
        seq = self._seqs.get(rid)
        if seq is None or seq.phase is not SeqPhase.HOLDING:
            return False
        self._drop(seq)
        return True

    def expire_holds(self, now_s: float) -> list[RequestId]:
        """Free KV held past its timeout (the decode side never pulled it)."""
        expired = [
            s.id
            for s in self._seqs.values()
            if s.phase is SeqPhase.HOLDING and s.hold_until_s <= now_s
        ]
        for rid in expired:
            self._drop(self._seqs[rid])
        return expired

    # -- observation --------------------------------------------------------------------------

    def phase(self, rid: RequestId) -> SeqPhase | None:
        seq = self._seqs.get(rid)
        return None if seq is None else seq.phase

    def output_ids(self, rid: RequestId) -> tuple[int, ...]:
        return tuple(self._seqs[rid].output_ids)

    @property
    def request_ids(self) -> Iterable[RequestId]:
        return tuple(self._seqs)

    @property
    def has_runnable_work(self) -> bool:
        return any(s.phase in (SeqPhase.WAITING, SeqPhase.RUNNING) for s in self._seqs.values())

    def load(self) -> EngineLoad:
        count = dict.fromkeys(SeqPhase, 0)
        pending = 0
        for s in self._seqs.values():
            count[s.phase] += 1
            if s.phase in (SeqPhase.WAITING, SeqPhase.RUNNING) and s.mode is not RequestMode.DECODE:
                pending += max(0, s.request.num_prompt_tokens - s.num_computed)
        return EngineLoad(
            num_waiting=count[SeqPhase.WAITING],
            num_running=count[SeqPhase.RUNNING],
            num_transferring=count[SeqPhase.TRANSFERRING],
            num_holding=count[SeqPhase.HOLDING],
            free_blocks=self.blocks.num_free,
            total_blocks=self.blocks.num_blocks,
            block_size=self.blocks.block_size,
            pending_prefill_tokens=pending,
        )

    # -- internals ----------------------------------------------------------------------------

    def _validate(self, decision: StepDecision) -> None:
        """Check a decision against the ledger before anything changes."""
        free = self.blocks.num_free
        seen: set[RequestId] = set()
        for rid in decision.preempt:
            seq = self._seqs.get(rid)
            if seq is None or seq.phase is not SeqPhase.RUNNING:
                raise ValueError(f"{self.policy.name}: cannot preempt {rid!r}: not running")
            free += self.blocks.blocks_held(rid)
            seen.add(rid)
        for rid, n in decision.chunks:
            seq = self._seqs.get(rid)
            if seq is None or rid in seen or seq.phase not in (SeqPhase.WAITING, SeqPhase.RUNNING):
                raise ValueError(f"{self.policy.name}: cannot schedule {rid!r} now")
            seen.add(rid)
            remote = seq.mode is RequestMode.DECODE and seq.phase is SeqPhase.WAITING
            if remote:
                tokens = seq.request.num_prompt_tokens
            else:
                if not 1 <= n <= seq.num_known - seq.num_computed:
                    raise ValueError(f"{self.policy.name}: bad chunk of {n} tokens for {rid!r}")
                tokens = seq.num_computed + n
            free -= self.blocks.extra_blocks_for(rid, tokens)
            if free < 0:
                raise ValueError(f"{self.policy.name}: decision needs more KV blocks than are free")

    def _must_grow(self, rid: RequestId, tokens: int) -> None:
        if not self.blocks.grow(rid, tokens):  # _validate makes this unreachable
            raise RuntimeError(f"block ledger out of step for {rid!r}")

    def _preempt(self, seq: _Seq) -> None:
        self.blocks.free(seq.id)
        seq.num_computed = 0
        seq.phase = SeqPhase.WAITING
        self.num_preemptions += 1
        if seq.mode is RequestMode.DECODE:
            # The pulled KV is gone: rebuild it here from prompt + outputs (recompute).
            seq.mode = RequestMode.GENERATE

    def _sample(self, seq: _Seq) -> TokenEvent:
        index = len(seq.output_ids)
        token = 0 if self.tokens is None else self.tokens.token(seq.key, index)
        seq.output_ids.append(token)
        sampling = seq.request.sampling
        reason: FinishReason | None = None
        if self.tokens is not None and token in sampling.stop_token_ids:
            reason = FinishReason.STOP
        elif len(seq.output_ids) >= sampling.max_tokens:
            reason = FinishReason.LENGTH
        return TokenEvent(seq.id, token, index, reason)

    def _drop(self, seq: _Seq) -> None:
        self.blocks.free(seq.id)
        del self._seqs[seq.id]

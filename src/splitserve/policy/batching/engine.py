"""The engine model: one worker's queues, KV blocks and step loop, as a pure state machine.

The owner drives it: `schedule(now)` asks the step policy for a decision and allocates blocks;
the owner lets the step's time pass (`LatencyModel.step_s(step.batch)`: an `asyncio.sleep` in the
live simulated engine, an event in the simulator); `complete(step, now)` advances the sequences and
samples tokens. Remote-KV sequences are admitted (blocks allocated) by a step, then the owner
moves the bytes and calls `finish_transfer`.

The simulator's speed path (opt-in, unused by the live engine): `schedule(now, max_repeat)` may
fuse identical pure-decode steps into one `Step` with `repeat > 1` (`split` / `truncate` cut such
a run when new work arrives mid-way), and `tokens=None` counts tokens without choosing ids. Both
leave every count, block and timing exactly as stepping one by one would.

Optional features, off by default (nothing changes, nothing is allocated per step without them):
* finish signal: `StepView.finished` lists the requests that finished since the previous
  decision with their true output lengths (exact also for fused runs, which end at a finish);
* predicted lengths: given an `OutputLengthPredictor`, the engine predicts each request's total
  output once, at `add`, shows it as `SeqView.predicted_output_tokens`, and feeds it every
  finished request (`observe`);
* swap preemption: with `host_swap_tokens > 0` a decision may `swap_out` running sequences (KV
  to host, blocks freed, progress kept); a later chunk swaps one back in (blocks re-allocated).
  The step reports the tokens copied each way (`Step.swap_out_tokens` / `swap_in_tokens`) for the
  owner to price; recompute (`preempt`) stays the default everywhere;
* partial checkpoint: with host space a decision may also `checkpoint` the last k blocks of a
  running sequence (their KV to host, blocks freed, progress kept, still running); its next chunk
  re-allocates them and swaps the tokens back in, priced like a swap. `SeqView.checkpointed_tokens`
  shows what a sequence has on the host (views are patched only while some sequence has any).

Invariants (property-tested): blocks are conserved (free + held == total); a sequence holds blocks
only while it is transferring, running or holding KV for a pull; a decision the ledger cannot
honour raises before anything changes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from splitserve.core.errors import CapacityError
from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager, blocks_for
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.request import FinishReason, Request
from splitserve.policy.batching.base import (
    BatchingPolicy,
    FinishedSeq,
    SeqView,
    StepDecision,
    StepView,
)
from splitserve.policy.batching.tokens import SyntheticTokens

if TYPE_CHECKING:
    from splitserve.policy.predict.base import OutputLengthPredictor


def _arrival_key(s: _Seq) -> float:
    return s.request.arrival_s


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
    num_prompt: int = 0
    """`request.num_prompt_tokens`, cached (read on every step)."""
    predicted: int | None = None
    """The engine predictor's total output length (None without a predictor)."""
    end: int = -1
    """Output position of the end-of-text token the synthetic tokens place (-1: none)."""
    swapped_tokens: int = 0
    """KV tokens parked in host memory: all computed ones while swapped out, the tail of its
    computed tokens after a partial checkpoint (0 otherwise, and once swapped back in)."""

    @property
    def id(self) -> RequestId:
        return self.request.id

    @property
    def num_known(self) -> int:
        return self.num_prompt + len(self.output_ids)

    def view(self, blocks_held: int) -> SeqView:
        r = self.request
        return SeqView(
            r.id,
            r.arrival_s,
            self.num_prompt,
            len(self.output_ids),
            self.num_computed,
            r.sampling.max_tokens,
            blocks_held,
            self.mode is RequestMode.DECODE and self.phase is SeqPhase.WAITING,
            r.priority,
            r.deadline_s,
            r.slo_class,
            self.predicted,
        )


@dataclass(slots=True, init=False, unsafe_hash=True)
class TokenEvent:
    request_id: Final[RequestId]
    token_id: Final[int]
    index: Final[int]
    finish_reason: Final[FinishReason | None]

    def __init__(
        self,
        request_id: RequestId,
        token_id: int,
        index: int,
        finish_reason: FinishReason | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_id = token_id
        self.index = index
        self.finish_reason = finish_reason


@dataclass(slots=True, init=False, unsafe_hash=True)
class Step:
    decision: Final[StepDecision]
    batch: Final[BatchShape]
    started_s: Final[float]
    transfers: Final[tuple[RequestId, ...]]
    """Remote-KV sequences admitted by this step: the owner starts their KV pulls."""
    repeat: Final[int]
    """How many identical decode steps this is (> 1 only when `schedule` was allowed to fuse
    them): `batch` is the first; in step i every context is i tokens longer."""
    swap_out_tokens: Final[int]
    """KV tokens this step copies to host memory (`StepDecision.swap_out`), before it runs."""
    swap_in_tokens: Final[int]
    """KV tokens this step copies back from host memory (swapped sequences it resumes)."""

    def __init__(
        self,
        decision: StepDecision,
        batch: BatchShape,
        started_s: float,
        transfers: tuple[RequestId, ...] = (),
        repeat: int = 1,
        swap_out_tokens: int = 0,
        swap_in_tokens: int = 0,
    ) -> None:
        self.decision = decision
        self.batch = batch
        self.started_s = started_s
        self.transfers = transfers
        self.repeat = repeat
        self.swap_out_tokens = swap_out_tokens
        self.swap_in_tokens = swap_in_tokens


@dataclass(slots=True, init=False, unsafe_hash=True)
class StepResult:
    tokens: Final[tuple[TokenEvent, ...]]
    """Tokens sampled by the step; for a fused run (`Step.repeat > 1`) each sequence's last."""
    prefilled: Final[tuple[RequestId, ...]]
    """Prefill-mode sequences whose first token is out and whose KV is now held for a pull."""
    finished: Final[tuple[RequestId, ...]]

    def __init__(
        self,
        tokens: tuple[TokenEvent, ...] = (),
        prefilled: tuple[RequestId, ...] = (),
        finished: tuple[RequestId, ...] = (),
    ) -> None:
        self.tokens = tokens
        self.prefilled = prefilled
        self.finished = finished


@dataclass(slots=True, init=False, unsafe_hash=True)
class EngineLoad:
    num_waiting: Final[int]
    num_running: Final[int]
    num_transferring: Final[int]
    num_holding: Final[int]
    free_blocks: Final[int]
    total_blocks: Final[int]
    block_size: Final[int]
    pending_prefill_tokens: Final[int]

    def __init__(
        self,
        num_waiting: int,
        num_running: int,
        num_transferring: int,
        num_holding: int,
        free_blocks: int,
        total_blocks: int,
        block_size: int,
        pending_prefill_tokens: int,
    ) -> None:
        self.num_waiting = num_waiting
        self.num_running = num_running
        self.num_transferring = num_transferring
        self.num_holding = num_holding
        self.free_blocks = free_blocks
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.pending_prefill_tokens = pending_prefill_tokens


class EngineModel:
    def __init__(
        self,
        policy: BatchingPolicy,
        blocks: BlockManager,
        tokens: SyntheticTokens | None,
        kv_hold_timeout_s: float = 30.0,
        predictor: OutputLengthPredictor | None = None,
        host_swap_tokens: int = 0,
    ) -> None:
        """`tokens=None` counts tokens without choosing ids (every id is 0, stop ids never match):
        the simulator's mode, which skips hashing every prompt. `predictor` fills
        `SeqView.predicted_output_tokens`; `host_swap_tokens` is the host memory (in KV tokens)
        that `StepDecision.swap_out` may fill (0: no swapping)."""
        if host_swap_tokens < 0:
            raise ValueError(f"host_swap_tokens must be >= 0, got {host_swap_tokens}")
        self.policy = policy
        self.blocks = blocks
        self.tokens = tokens
        self.kv_hold_timeout_s = kv_hold_timeout_s
        self.predictor = predictor
        self.host_swap_tokens = host_swap_tokens
        self.host_used_tokens = 0
        """KV tokens swapped out to host memory now."""
        self.num_swaps_out = 0
        self.num_swaps_in = 0
        """Swap-ins of any kind: whole swapped sequences and checkpointed tails brought back."""
        self.num_checkpoints = 0
        """Partial checkpoints (`StepDecision.checkpoint` of fewer blocks than held)."""
        self.checkpointed_tokens = 0
        """KV tokens copied to host by partial checkpoints, in all."""
        self._on_host: set[RequestId] = set()
        """Sequences with `swapped_tokens > 0` (views show them only while this is non-empty)."""
        self._finished: list[FinishedSeq] = []
        """Finished since the last decision (`StepView.finished`)."""
        self._seqs: dict[RequestId, _Seq] = {}
        self._inflight: Step | None = None
        self.num_preemptions = 0
        self._epoch = 0
        """Bumped whenever a scheduled sequence's progress, blocks or phase may change outside
        `add` (keys `_fused_thresholds`)."""
        self._fused_key: tuple[Step | None, int] = (None, -1)
        self._fused_thresholds: list[int] = []

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
        seq = _Seq(request, mode, key, num_prompt=request.num_prompt_tokens)
        if self.tokens is not None:
            seq.end = self.tokens.end_index(key, request.sampling)
        if mode is RequestMode.DECODE:
            if first_token_id is None:
                raise ValueError("a decode request needs the first token from its prefill")
            s = request.sampling
            if s.max_tokens <= 1 or seq.end == 0 or first_token_id in s.stop_token_ids:
                raise ValueError("nothing to decode: the request finished at its first token")
            seq.output_ids.append(first_token_id)
        if self.predictor is not None:
            from splitserve.policy.predict.base import LengthQuery

            seq.predicted = self.predictor.predict(
                LengthQuery(
                    request.id,
                    request.num_prompt_tokens,
                    len(seq.output_ids),
                    request.sampling.max_tokens,
                )
            )
        self._seqs[request.id] = seq

    # -- the step loop ------------------------------------------------------------------------

    def view(self, now_s: float) -> StepView:
        held = self.blocks.held.get
        waiting_seqs: list[_Seq] = []
        running: list[SeqView] = []
        running_phase, waiting_phase = SeqPhase.RUNNING, SeqPhase.WAITING
        for s in self._seqs.values():
            phase = s.phase
            if phase is running_phase:
                r = s.request
                rid = r.id
                running.append(  # `_Seq.view`, inlined (hot): a running sequence is never remote
                    SeqView(
                        rid,
                        r.arrival_s,
                        s.num_prompt,
                        len(s.output_ids),
                        s.num_computed,
                        r.sampling.max_tokens,
                        held(rid, 0),
                        False,
                        r.priority,
                        r.deadline_s,
                        r.slo_class,
                        s.predicted,
                    )
                )
            elif phase is waiting_phase:
                waiting_seqs.append(s)
        if len(waiting_seqs) > 1:
            waiting_seqs.sort(key=_arrival_key)
        waiting = [s.view(held(s.request.id, 0)) for s in waiting_seqs]
        if self._on_host:  # only with swaps or checkpoints in use: show the host tokens
            running = self._with_host_tokens(running)
            waiting = self._with_host_tokens(waiting)
        blocks = self.blocks
        finished = self._finished
        return StepView(
            now_s,
            tuple(waiting),
            tuple(running),
            blocks.num_free,
            blocks.num_blocks,
            blocks.block_size,
            tuple(finished) if finished else (),
            self.host_swap_tokens - self.host_used_tokens,
        )

    def _with_host_tokens(self, views: list[SeqView]) -> list[SeqView]:
        on_host, seqs = self._on_host, self._seqs
        out: list[SeqView] = []
        for v in views:
            if v.id in on_host:
                v = SeqView(
                    v.id,
                    v.arrival_s,
                    v.num_prompt_tokens,
                    v.num_output_tokens,
                    v.num_computed_tokens,
                    v.max_tokens,
                    v.blocks_held,
                    v.remote_kv,
                    v.priority,
                    v.deadline_s,
                    v.slo_class,
                    v.predicted_output_tokens,
                    seqs[v.id].swapped_tokens,
                )
            out.append(v)
        return out

    def schedule(self, now_s: float, max_repeat: int = 1) -> Step | None:
        """Decide and start the next step; None when there is nothing to run.

        With `max_repeat > 1` (the simulator), a pure-decode step whose batch cannot change before
        a sequence finishes is fused with up to `max_repeat - 1` identical successors (see
        `_steady_run_length`). The owner must `truncate` the run if it adds work meanwhile.
        """
        if self._inflight is not None:
            raise RuntimeError("a step is already in flight")
        self._epoch += 1
        view = self.view(now_s)
        if not view.waiting and not view.running:
            return None
        decision = self.policy.decide(view)
        if self._finished:
            self._finished = []  # the policy has seen them
        self._validate(decision)
        for rid in decision.preempt:
            self._preempt(self._seqs[rid])
        swap_out = 0
        for rid in decision.swap_out:
            swap_out += self._swap_out(self._seqs[rid])
        checkpoint = decision.checkpoint
        if checkpoint:
            for rid, k in checkpoint:
                swap_out += self._checkpoint(self._seqs[rid], k)
        swap_in = 0
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        transfers: list[RequestId] = []
        seqs = self._seqs
        running = SeqPhase.RUNNING
        blocks = self.blocks
        size = blocks.block_size
        held = blocks.held.get
        for rid, n in decision.chunks:
            seq = seqs[rid]
            if seq.mode is RequestMode.DECODE and seq.phase is SeqPhase.WAITING:
                self._must_grow(rid, seq.num_prompt)
                seq.phase = SeqPhase.TRANSFERRING
                transfers.append(rid)
                continue
            computed = seq.num_computed
            if -(-(computed + n) // size) > held(rid, 0):  # `_must_grow`'s test, inlined (hot)
                self._must_grow(rid, computed + n)
            if seq.swapped_tokens:
                swap_in += self._swap_in(seq)
            seq.phase = running
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now_s
            num_out = len(seq.output_ids)
            if num_out and n == 1 and seq.num_prompt + num_out - computed == 1:
                decode.append(computed)
            else:
                prefill.append((n, computed))
        swapped = decision.swap_out or checkpoint
        if not prefill and not decode and not transfers and not decision.preempt and not swapped:
            return None
        repeat = 1
        pure_decode = (
            decode and not prefill and not transfers and not decision.preempt and not swapped
        )
        if (
            max_repeat > 1
            and pure_decode
            and not view.waiting
            and len(decode) == len(view.running)
            and not swap_in
        ):
            repeat = self._steady_run_length(decision, max_repeat)
        batch = BatchShape(tuple(prefill), tuple(decode))
        if swap_out or swap_in:
            step = Step(decision, batch, now_s, tuple(transfers), repeat, swap_out, swap_in)
        else:
            step = Step(decision, batch, now_s, tuple(transfers), repeat)
        self._inflight = step
        return step

    def split(self, step: Step, steps_done: int, started_s: float) -> Step:
        """Apply the first `steps_done` steps of the fused run in flight and return the rest.

        No sequence finishes inside a run, so this only advances contexts and outputs, then grows
        blocks for the step now in progress (which started at `started_s`), leaving the engine
        exactly as stepping one by one would at that moment.
        """
        if self._inflight is not step:
            raise RuntimeError("split() must be given the step in flight")
        if not 0 <= steps_done < step.repeat:
            raise ValueError(f"steps_done must be in [0, {step.repeat}), got {steps_done}")
        if steps_done == 0:
            return step
        self._epoch += 1
        for rid, _ in step.decision.chunks:
            seq = self._seqs.get(rid)
            if seq is None or seq.phase is not SeqPhase.RUNNING:
                continue
            base = len(seq.output_ids)
            if self.tokens is None:
                seq.output_ids.extend([0] * steps_done)
            else:
                seq.output_ids.extend(self._token_at(seq, base + i) for i in range(steps_done))
            seq.num_computed += steps_done
            self._must_grow(rid, seq.num_computed + 1)
        contexts = tuple([c + steps_done for c in step.batch.decode_contexts])
        rest = Step(
            step.decision,
            BatchShape((), contexts),
            started_s,
            step.transfers,
            step.repeat - steps_done,
        )
        self._inflight = rest
        return rest

    def fused_free_blocks(self, step: Step, steps_done: int) -> int:
        """Free blocks as stepping one by one would show them once `steps_done` steps of the
        fused run in flight have ended (the next step holding its blocks). Changes nothing.

        Sequence i (computed c, holding h blocks of `size`) then needs
        `max(0, ceil((c + steps_done + 1) / size) - h)` more blocks, which is
        `1 + (steps_done - d) // size` from `steps_done >= d = h * size - c` on (0 before): the
        sorted thresholds d are kept per step in flight, so a query is a bisection."""
        if steps_done <= 0:
            return self.blocks.num_free
        thresholds = self._thresholds(step)
        n = bisect_right(thresholds, steps_done)
        if n == 0:
            return self.blocks.num_free
        size = self.blocks.block_size
        if steps_done - thresholds[0] < size:
            return self.blocks.num_free - n  # each of the n needs exactly one block more
        need = 0
        for i in range(n):
            need += 1 + (steps_done - thresholds[i]) // size
        return self.blocks.num_free - need

    def fused_free_blocks_change(self, step: Step, steps_done: int) -> int:
        """The smallest count > `steps_done` at which `fused_free_blocks(step, count)` can differ
        from its value at `steps_done` (blocks freed or taken meanwhile aside). Changes nothing."""
        if steps_done <= 0:
            return 1
        size = self.blocks.block_size
        nxt = steps_done + size  # every threshold recurs with period `size`
        for d in self._thresholds(step):
            at = d if d > steps_done else steps_done + 1 + (d - steps_done - 1) % size
            if at < nxt:
                nxt = at
        return nxt

    def _thresholds(self, step: Step) -> list[int]:
        """Sorted `held * size - computed` of the running sequences of `step` (see
        `fused_free_blocks`), cached per step in flight and engine epoch."""
        key = (step, self._epoch)
        if self._fused_key[0] is not step or self._fused_key[1] != self._epoch:
            size = self.blocks.block_size
            held = self.blocks.held.get
            seqs = self._seqs
            running = SeqPhase.RUNNING
            thresholds: list[int] = []
            for rid, _ in step.decision.chunks:
                seq = seqs.get(rid)
                if seq is None or seq.phase is not running:
                    continue
                thresholds.append(held(rid, 0) * size - seq.num_computed)
            thresholds.sort()
            self._fused_key = key
            self._fused_thresholds = thresholds
        return self._fused_thresholds

    def truncate(self, step: Step, repeat: int) -> Step:
        """Shorten the in-flight fused run to its first `repeat` steps; returns the new step."""
        if self._inflight is not step:
            raise RuntimeError("truncate() must be given the step in flight")
        if not 1 <= repeat <= step.repeat:
            raise ValueError(f"repeat must be in [1, {step.repeat}], got {repeat}")
        if repeat == step.repeat:
            return step
        short = Step(step.decision, step.batch, step.started_s, step.transfers, repeat)
        self._inflight = short
        return short

    def complete(self, step: Step, now_s: float) -> StepResult:
        """Finish the in-flight step: advance sequences, sample tokens, finish or hold."""
        if self._inflight is not step:
            raise RuntimeError("complete() must be given the step in flight")
        self._inflight = None
        self._epoch += 1
        tokens: list[TokenEvent] = []
        prefilled: list[RequestId] = []
        finished: list[RequestId] = []
        seqs = self._seqs
        running = SeqPhase.RUNNING
        repeat = step.repeat
        counted = self.tokens is None
        fast_run = repeat > 1 and counted
        if fast_run:
            size = self.blocks.block_size
            held = self.blocks.held.get
            pad = [0] * (repeat - 1)
        for rid, n in step.decision.chunks:
            seq = seqs.get(rid)
            if seq is None or seq.phase is not running or n == 0:
                continue  # aborted meanwhile, or an admission-only chunk
            if fast_run:
                # `_advance_run` + `_sample` with counted tokens, inlined (the fused decode path)
                computed = seq.num_computed + repeat
                seq.num_computed = computed
                if -(-computed // size) > held(rid, 0):
                    self._must_grow(rid, computed)
                outputs = seq.output_ids
                outputs.extend(pad)
                index = len(outputs)
                outputs.append(0)
                max_tokens = seq.request.sampling.max_tokens
                event = TokenEvent(
                    rid, 0, index, FinishReason.LENGTH if index + 1 >= max_tokens else None
                )
            elif repeat > 1:
                event = self._advance_run(seq, repeat)
            else:
                computed = seq.num_computed + n
                seq.num_computed = computed
                outputs = seq.output_ids
                index = len(outputs)
                if computed < seq.num_prompt + index:
                    continue  # a prefill chunk that did not reach the end of the prompt yet
                if counted:  # `_sample` with counted tokens, inlined
                    outputs.append(0)
                    max_tokens = seq.request.sampling.max_tokens
                    event = TokenEvent(
                        rid, 0, index, FinishReason.LENGTH if index + 1 >= max_tokens else None
                    )
                else:
                    event = self._sample(seq)
            tokens.append(event)
            if event.finish_reason is not None:
                self._drop(seq)
                finished.append(rid)
                done = FinishedSeq(rid, seq.num_prompt, event.index + 1)
                self._finished.append(done)
                if self.predictor is not None:
                    self.predictor.observe(done.num_prompt_tokens, done.num_output_tokens)
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
        self._epoch += 1
        seq.num_computed = seq.num_prompt
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
        waiting, running = SeqPhase.WAITING, SeqPhase.RUNNING
        for s in self._seqs.values():
            phase = s.phase
            if phase is waiting or phase is running:
                return True
        return False

    def load(self) -> EngineLoad:
        waiting = running = transferring = holding = pending = 0
        decode_mode = RequestMode.DECODE
        for s in self._seqs.values():
            phase = s.phase
            if phase is SeqPhase.RUNNING:
                running += 1
            elif phase is SeqPhase.WAITING:
                waiting += 1
            elif phase is SeqPhase.TRANSFERRING:
                transferring += 1
                continue
            else:
                holding += 1
                continue
            if s.mode is not decode_mode:
                left = s.num_prompt - s.num_computed
                if left > 0:
                    pending += left
        return EngineLoad(
            num_waiting=waiting,
            num_running=running,
            num_transferring=transferring,
            num_holding=holding,
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
        if decision.swap_out or decision.checkpoint:
            host = self.host_swap_tokens - self.host_used_tokens
            for rid in decision.swap_out:
                seq = self._seqs.get(rid)
                if seq is None or seq.phase is not SeqPhase.RUNNING or rid in seen:
                    raise ValueError(f"{self.policy.name}: cannot swap out {rid!r}: not running")
                host -= seq.num_computed - seq.swapped_tokens
                if host < 0:
                    raise ValueError(f"{self.policy.name}: swap-out exceeds the host swap space")
                free += self.blocks.blocks_held(rid)
                seen.add(rid)
            for rid, k in decision.checkpoint:
                seq = self._seqs.get(rid)
                if seq is None or seq.phase is not SeqPhase.RUNNING or rid in seen:
                    raise ValueError(f"{self.policy.name}: cannot checkpoint {rid!r}: not running")
                h = self.blocks.blocks_held(rid)
                if not 0 < k <= h:
                    raise ValueError(
                        f"{self.policy.name}: cannot checkpoint {k} blocks of {rid!r}: holds {h}"
                    )
                host -= self._checkpoint_tokens(seq, h, k)
                if host < 0:
                    raise ValueError(f"{self.policy.name}: checkpoint exceeds the host swap space")
                free += k
                seen.add(rid)
        seqs = self._seqs
        held = self.blocks.held.get
        size = self.blocks.block_size
        waiting, running, decode_mode = SeqPhase.WAITING, SeqPhase.RUNNING, RequestMode.DECODE
        for rid, n in decision.chunks:
            seq = seqs.get(rid)
            if (
                seq is None
                or rid in seen
                or (seq.phase is not waiting and seq.phase is not running)
            ):
                raise ValueError(f"{self.policy.name}: cannot schedule {rid!r} now")
            seen.add(rid)
            if seq.mode is decode_mode and seq.phase is waiting:  # remote KV: blocks, no compute
                tokens = seq.num_prompt
            else:
                if not 1 <= n <= seq.num_prompt + len(seq.output_ids) - seq.num_computed:
                    raise ValueError(f"{self.policy.name}: bad chunk of {n} tokens for {rid!r}")
                tokens = seq.num_computed + n
            extra = -(-tokens // size) - held(rid, 0)
            if extra > 0:
                free -= extra
                if free < 0:
                    raise ValueError(
                        f"{self.policy.name}: decision needs more KV blocks than are free"
                    )

    def _must_grow(self, rid: RequestId, tokens: int) -> None:
        blocks = self.blocks
        if -(-tokens // blocks.block_size) <= blocks.held.get(rid, 0):
            return  # already covered (the common decode step within a block)
        if not blocks.grow(rid, tokens):  # _validate makes this unreachable
            raise RuntimeError(f"block ledger out of step for {rid!r}")

    def _preempt(self, seq: _Seq) -> None:
        self.blocks.free(seq.id)
        if seq.swapped_tokens:  # a checkpointed tail is dropped with the rest
            self._release_host(seq)
        seq.num_computed = 0
        seq.phase = SeqPhase.WAITING
        self.num_preemptions += 1
        if seq.mode is RequestMode.DECODE:
            # The pulled KV is gone: rebuild it here from prompt + outputs (recompute).
            seq.mode = RequestMode.GENERATE

    def _swap_out(self, seq: _Seq) -> int:
        """Park `seq`'s computed KV in host memory and free its blocks; returns tokens copied
        (a tail checkpointed earlier is on the host already)."""
        moved = seq.num_computed - seq.swapped_tokens
        self.blocks.free(seq.id)
        self.host_used_tokens += moved
        seq.swapped_tokens = seq.num_computed
        if seq.swapped_tokens:
            self._on_host.add(seq.id)
        seq.phase = SeqPhase.WAITING
        self.num_swaps_out += 1
        if seq.mode is RequestMode.DECODE:
            # Its KV is local now (swapped, not pulled again): it resumes like a local request.
            seq.mode = RequestMode.GENERATE
        return moved

    def _swap_in(self, seq: _Seq) -> int:
        """`seq` is being resumed (its blocks already re-allocated): bring its KV back."""
        moved = seq.swapped_tokens
        self._release_host(seq)
        self.num_swaps_in += 1
        return moved

    def _release_host(self, seq: _Seq) -> None:
        self.host_used_tokens -= seq.swapped_tokens
        seq.swapped_tokens = 0
        self._on_host.discard(seq.id)

    def _checkpoint_tokens(self, seq: _Seq, held: int, k: int) -> int:
        """KV tokens that checkpointing the last `k` of the `held` blocks of `seq` copies: the
        computed tokens still on the GPU past the first `held - k` blocks."""
        on_gpu = seq.num_computed - seq.swapped_tokens
        keep = (held - k) * self.blocks.block_size
        return on_gpu - keep if on_gpu > keep else 0

    def _checkpoint(self, seq: _Seq, k: int) -> int:
        """Copy the KV in the last `k` blocks of running `seq` to host and free the blocks;
        returns the tokens copied. All its blocks: a swap-out (it waits)."""
        held = self.blocks.blocks_held(seq.id)
        if k == held:
            return self._swap_out(seq)
        moved = self._checkpoint_tokens(seq, held, k)
        self.blocks.shrink(seq.id, held - k)
        self.num_checkpoints += 1
        if moved:
            self.host_used_tokens += moved
            self.checkpointed_tokens += moved
            seq.swapped_tokens += moved
            self._on_host.add(seq.id)
        return moved

    def _steady_run_length(self, decision: StepDecision, max_repeat: int) -> int:
        """How many identical decode steps can run before the batch could change.

        Only for policies declaring `steady_decode = True`: with nothing waiting and every running
        sequence decoding one token, they decide the same batch again until a sequence finishes
        or blocks run short. The run ends at the first finish (by max_tokens or the synthetic
        end of text; never with stop tokens in play) and is cut so every sequence's block growth
        fits the free blocks.
        """
        if not getattr(self.policy, "steady_decode", False):
            return 1
        k = max_repeat
        seqs = [self._seqs[rid] for rid, _ in decision.chunks]
        for seq in seqs:
            sampling = seq.request.sampling
            if self.tokens is not None and sampling.stop_token_ids:
                return 1
            k = min(k, sampling.max_tokens - len(seq.output_ids))
            if seq.end >= 0:
                k = min(k, seq.end - len(seq.output_ids) + 1)
        free = self.blocks.num_free
        size = self.blocks.block_size
        held = self.blocks.held.get
        state = [(s.num_computed, held(s.request.id, 0)) for s in seqs]

        def extra(steps: int) -> int:
            total = 0
            for computed, h in state:
                e = -(-(computed + steps) // size) - h  # blocks_for, inlined
                if e > 0:
                    total += e
            return total

        if k > 1 and extra(k) > free:
            lo, hi = 1, k  # extra(lo) == 0 <= free (schedule grew for one step); extra(hi) > free
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if extra(mid) <= free else (lo, mid)
            k = lo
        return max(1, k)

    def _advance_run(self, seq: _Seq, repeat: int) -> TokenEvent:
        """Apply `repeat` decode steps to `seq`; returns the event for the last token only."""
        seq.num_computed += repeat
        self._must_grow(seq.id, seq.num_computed)  # as the last step's schedule would have
        if self.tokens is None:
            seq.output_ids.extend([0] * (repeat - 1))
        else:
            base = len(seq.output_ids)
            seq.output_ids.extend(self._token_at(seq, base + i) for i in range(repeat - 1))
        return self._sample(seq)

    def _token_at(self, seq: _Seq, index: int) -> int:
        assert self.tokens is not None
        return self.tokens.at(seq.key, index, seq.request.sampling, seq.end)

    def _sample(self, seq: _Seq) -> TokenEvent:
        outputs = seq.output_ids
        index = len(outputs)
        tokens = self.tokens
        token = 0 if tokens is None else tokens.at(seq.key, index, seq.request.sampling, seq.end)
        outputs.append(token)
        sampling = seq.request.sampling
        reason: FinishReason | None = None
        if index == seq.end or (
            tokens is not None and index >= sampling.min_tokens and token in sampling.stop_token_ids
        ):
            reason = FinishReason.STOP
        elif index + 1 >= sampling.max_tokens:
            reason = FinishReason.LENGTH
        return TokenEvent(seq.request.id, token, index, reason)

    def _drop(self, seq: _Seq) -> None:
        self._epoch += 1
        self.blocks.free(seq.id)
        if seq.swapped_tokens:
            self._release_host(seq)
        del self._seqs[seq.id]

"""The simulated engine: the simulator's engine model driven by a real clock.

`SimEngine` runs `policy.batching.EngineModel` (the same step policy, block ledger and synthetic
tokens the simulator uses) in an asyncio task: schedule a step, sleep for the latency model's
price of that step, complete it, hand tokens to the waiting callers. KV "transfers" between
simulated workers cost `LatencyModel.kv_transfer_s(bytes)`; the decode side then tells the
prefill side to free its blocks through `ReleaseKv` (what NIXL's notification does for vLLM).

KV handles are checked like a real engine checks them: a handle of another transport, for another
prompt length, or without a source request is refused (`ValueError` -> INVALID_ARGUMENT); a
handle the source no longer holds (unknown, released, expired, or the source is gone) fails the
decode with `KvTransferError` (-> ABORTED), as a failed NIXL read does. So "prefill dies while
holding KV" behaves as it does with vLLM, without vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from splitserve.aio import stop_task
from splitserve.core.clock import Clock
from splitserve.core.errors import EngineError, KvTransferError
from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager, KvHandle
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.request import FinishReason, Request
from splitserve.obs.metrics import VllmSeries
from splitserve.policy.batching.base import BatchingPolicy
from splitserve.policy.batching.engine import EngineModel, RequestMode, Step, StepResult
from splitserve.policy.batching.tokens import SyntheticTokens
from splitserve.worker.engine import (
    LoadSnapshot,
    PrefillOutcome,
    StepFeed,
    StepSample,
    TokenDelta,
)

log = logging.getLogger(__name__)

ReleaseFn = Callable[[KvHandle], Awaitable[bool | None]]
"""Tells a prefill worker its KV was pulled (the server wires this to ReleaseKv over gRPC).
Returns whether the source held that KV (None: it cannot tell); raises if it is unreachable."""

KV_TRANSPORT = "sim"


@dataclass(slots=True)
class _Pending:
    """Per-request channel between the step loop and the caller awaiting results."""

    request: Request
    added_s: float
    queue: asyncio.Queue[TokenDelta] = field(default_factory=asyncio.Queue)
    prefilled: asyncio.Future[PrefillOutcome] | None = None
    kv_source: KvHandle | None = None
    failure: Exception | None = None
    """Raised to the caller after its last delta (a KV pull that failed)."""
    last_token_s: float | None = None
    """When the request's previous token came out (vLLM's series: TTFT, then inter-token)."""


@dataclass(frozen=True, slots=True)
class SimEngineConfig:
    model: str
    num_kv_blocks: int
    block_size: int = 16
    kv_bytes_per_token: int = 0
    kv_hold_timeout_s: float = 30.0
    address: str = ""
    """This worker's gRPC address, put into KV handles for ReleaseKv."""
    max_model_len: int | None = None
    """Context limit: prompt + new tokens (None: only the KV capacity limits a request)."""


@dataclass(frozen=True, slots=True)
class ZeroDelay:
    """A latency model that prices every step and KV transfer at zero (`--sim-time-scale 0`).

    The engine then produces tokens as fast as its own loop runs (one event-loop turn per step):
    a backend that costs nothing, for measuring what the router adds on its own. The wrapped
    model still sizes the KV cache.
    """

    base: LatencyModel

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        return 0.0

    def kv_transfer_s(self, num_bytes: int) -> float:
        return 0.0


class SimEngine:
    kind = "sim"

    def __init__(
        self,
        config: SimEngineConfig,
        policy: BatchingPolicy,
        latency: LatencyModel,
        tokens: SyntheticTokens,
        clock: Clock,
        release_remote: ReleaseFn | None = None,
        on_step: Callable[[Step, StepResult], None] | None = None,
        series: VllmSeries | None = None,
    ) -> None:
        self.config = config
        self.series = series
        """vLLM's per-request series (`vllm:time_to_first_token_seconds`, ...), if exported."""
        self.model = config.model
        self.max_model_len = config.max_model_len or 0
        """The context limit the worker server enforces (0: none)."""
        self.kv_bytes_per_token = config.kv_bytes_per_token
        """KV bytes of one token (0: unknown): the worker server caps a handle's bytes by it."""
        self.latency = latency
        self.clock = clock
        self._release_remote = release_remote
        self._on_step = on_step
        self.on_kv_pull: Callable[[RequestId, int, float], None] | None = None
        """Told of each KV pull that succeeded: (request, bytes, seconds) (metrics, traces)."""
        self.on_hold_expired: Callable[[RequestId], None] | None = None
        """Told of each held KV freed unpulled when its hold ran out (a metric)."""
        self._core = EngineModel(
            policy,
            BlockManager(config.num_kv_blocks, config.block_size),
            tokens,
            config.kv_hold_timeout_s,
        )
        self._pending: dict[RequestId, _Pending] = {}
        self._transfers: dict[RequestId, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.steps: StepFeed | None = StepFeed()
        """Step samples for `WatchSteps`: the step's shape and its price (the latency model's
        time, which the engine sleeps), not the measured wall time of the sleep."""
        self.num_steps = 0

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            await stop_task(task)  # (the caller's own cancellation is kept)
        for t in list(self._transfers.values()):
            t.cancel()
        for rid in list(self._pending):
            self._core.abort(rid)
            self._finish(rid, TokenDelta((), FinishReason.CANCELLED))

    # -- requests -------------------------------------------------------------------------------

    async def prefill(self, request: Request) -> PrefillOutcome:
        pending = self._admit(request, RequestMode.PREFILL)
        pending.prefilled = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.shield(pending.prefilled)
        except asyncio.CancelledError:
            await self.cancel(request.id)  # fails `prefilled`, which nobody awaits any more:
            if pending.prefilled.done() and not pending.prefilled.cancelled():
                pending.prefilled.exception()  # mark it retrieved (no "never retrieved" log)
            raise

    async def decode(
        self, request: Request, first_token_id: int, kv: KvHandle
    ) -> AsyncIterator[TokenDelta]:
        check_kv_handle(request, kv)
        self._admit(request, RequestMode.DECODE, first_token_id, kv)
        async for delta in self._stream(request.id):
            yield delta

    async def generate(self, request: Request) -> AsyncIterator[TokenDelta]:
        self._admit(request, RequestMode.GENERATE)
        async for delta in self._stream(request.id):
            yield delta

    async def cancel(self, request_id: RequestId) -> bool:
        found = self._core.abort(request_id)
        transfer = self._transfers.pop(request_id, None)
        if transfer is not None:
            transfer.cancel()
        if request_id in self._pending:
            self._finish(request_id, TokenDelta((), FinishReason.CANCELLED))
            found = True
        self._wake.set()
        return found

    async def release_kv(self, request_id: RequestId) -> bool:
        released = self._core.release(request_id)
        self._wake.set()
        return released

    # -- observation ----------------------------------------------------------------------------

    def prepare_decode(self, request: Request) -> bool:
        """Nothing to prepare: a simulated decode's input costs nothing to process."""
        return False

    def discard_prepared(self, request_id: RequestId) -> None:
        """Nothing was prepared (`prepare_decode`)."""

    def load(self) -> LoadSnapshot:
        s = self._core.load()
        return LoadSnapshot(
            num_waiting=s.num_waiting,
            num_running=s.num_running + s.num_transferring,
            kv_blocks_free=s.free_blocks,
            kv_blocks_total=s.total_blocks,
            kv_block_size=s.block_size,
            num_pending_prefill_tokens=s.pending_prefill_tokens,
            num_kv_held=s.num_holding,
        )

    @property
    def in_flight(self) -> int:
        return len(list(self._core.request_ids))

    @property
    def num_preemptions(self) -> int:
        return self._core.num_preemptions

    # -- internals ------------------------------------------------------------------------------

    def _admit(
        self,
        request: Request,
        mode: RequestMode,
        first_token_id: int | None = None,
        kv: KvHandle | None = None,
    ) -> _Pending:
        if self._loop_task is None:
            raise EngineError("engine is not started")
        if request.sampling.logprobs is not None:
            raise ValueError(
                "sampling.logprobs: the simulated engine has no token distribution to report"
            )
        if request.sampling.prompt_logprobs is not None:
            raise ValueError(
                "sampling.prompt_logprobs: the simulated engine has no token distribution to report"
            )
        if request.sampling.structured_outputs:
            raise ValueError(
                "sampling.structured_outputs: the simulated engine's synthetic tokens cannot "
                "follow a grammar"
            )
        self._core.add(request, mode, first_token_id)  # raises CapacityError / ValueError
        pending = _Pending(request, self.clock.now_s(), kv_source=kv)
        self._pending[request.id] = pending
        self._wake.set()
        return pending

    async def _stream(self, rid: RequestId) -> AsyncIterator[TokenDelta]:
        pending = self._pending.get(rid)
        if pending is None:
            return
        try:
            while True:
                delta = await pending.queue.get()
                if pending.failure is not None:
                    raise pending.failure
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            if rid in self._pending:  # the caller went away early
                await self.cancel(rid)

    def _finish(self, rid: RequestId, delta: TokenDelta) -> None:
        pending = self._pending.pop(rid, None)
        if pending is None:
            return
        if pending.prefilled is not None and not pending.prefilled.done():
            pending.prefilled.set_exception(
                EngineError(delta.error or f"request {delta.finish_reason}")
            )
            return
        pending.queue.put_nowait(delta)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # The loop time the last step's price ran to, while steps run back to back: the next
        # step's price counts from there, so the engine's own bookkeeping between steps (this
        # loop, delivering tokens: 0.5-1.3 ms a step measured) is inside a step's price, as a
        # real engine's scheduling is inside its measured step time, instead of added to it.
        paced_to: float | None = None
        while True:
            for rid in self._core.expire_holds(self.clock.now_s()):
                log.warning(
                    "KV held for %s expired before a decode worker pulled it (held %g s)",
                    rid,
                    self.config.kv_hold_timeout_s,
                )
                if self.on_hold_expired is not None:
                    self.on_hold_expired(rid)
            step = self._core.schedule(self.clock.now_s())
            if step is None:
                paced_to = None
                self._wake.clear()
                await self._idle_wait()
                continue
            for rid in step.transfers:
                self._transfers[rid] = asyncio.create_task(self._transfer(rid))
            step_s = self.latency.step_s(step.batch)
            now = loop.time()
            # Behind by more than a step (a starved CPU): start afresh, owe nothing.
            start = now if paced_to is None or now - paced_to > step_s else paced_to
            paced_to = start + step_s
            await asyncio.sleep(max(0.0, paced_to - now))
            result = self._core.complete(step, self.clock.now_s())
            self.num_steps += 1
            feed = self.steps
            if feed is not None and feed.active:
                feed.publish(StepSample(self.num_steps, step.started_s, step_s, step.batch))
            self._deliver(step, result)

    async def _idle_wait(self) -> None:
        """Sleep until new work arrives, or until the next held KV could expire."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self._wake.wait()

    def _deliver(self, step: Step, result: StepResult) -> None:
        if self._on_step is not None:
            self._on_step(step, result)
        prefilled = set(result.prefilled)
        now_s = self.clock.now_s()
        for ev in result.tokens:
            pending = self._pending.get(ev.request_id)
            if pending is None:
                continue
            if self.series is not None:
                self._observe(pending, now_s, ev.finish_reason is not None)
            if pending.prefilled is not None:
                held = ev.request_id in prefilled
                outcome = PrefillOutcome(
                    first_token_id=ev.token_id,
                    kv=self._handle(pending.request) if held else None,
                    finish_reason=ev.finish_reason,
                    queue_s=max(0.0, step.started_s - pending.added_s),
                    prefill_s=self.clock.now_s() - step.started_s,
                )
                if not pending.prefilled.done():
                    pending.prefilled.set_result(outcome)
                del self._pending[ev.request_id]
                continue
            pending.queue.put_nowait(TokenDelta((ev.token_id,), ev.finish_reason))
            if ev.finish_reason is not None:
                del self._pending[ev.request_id]

    def _observe(self, pending: _Pending, now_s: float, last: bool) -> None:
        """vLLM's series for one token, measured as vLLM does on its side: from the request's
        arrival at this engine (a decode's TTFT includes its KV pull)."""
        series = self.series
        assert series is not None
        if pending.last_token_s is None:
            series.ttft.observe(now_s - pending.added_s)
            if pending.kv_source is None:  # prefill or generate: the prompt is computed here
                series.prompt_tokens.inc(pending.request.num_prompt_tokens)
        else:
            series.itl.observe(now_s - pending.last_token_s)
        pending.last_token_s = now_s
        series.generation_tokens.inc()
        if last or pending.prefilled is not None:
            series.e2e.observe(now_s - pending.added_s)

    def _handle(self, request: Request) -> KvHandle:
        """The KV a prefill holds covers the prompt (the first token's KV is the decoder's job)."""
        num_tokens = request.num_prompt_tokens
        return KvHandle(
            transport=KV_TRANSPORT,
            source_address=self.config.address,
            source_request_id=request.id,
            num_tokens=num_tokens,
            num_bytes=num_tokens * self.config.kv_bytes_per_token,
        )

    async def _transfer(self, rid: RequestId) -> None:
        """Pull a prefilled request's KV: wait the modelled time, then have the source confirm
        it held that KV and free it (ReleaseKv). A source that is gone or does not hold the KV
        fails the decode, as a failed NIXL read does."""
        pending = self._pending.get(rid)
        kv = pending.kv_source if pending is not None else None
        try:
            if kv is not None:
                started = self.clock.now_s()
                await asyncio.sleep(self.latency.kv_transfer_s(kv.num_bytes))
                failure = await self._confirm_source(kv)
                if failure is not None:
                    self._fail(rid, failure)
                    return
                if self.on_kv_pull is not None:
                    self.on_kv_pull(rid, kv.num_bytes, self.clock.now_s() - started)
            if self._core.finish_transfer(rid):
                self._wake.set()
        finally:
            self._transfers.pop(rid, None)

    async def _confirm_source(self, kv: KvHandle) -> KvTransferError | None:
        if self._release_remote is None:
            return None  # in-process use with no source to ask
        try:
            held = await self._release_remote(kv)
        except Exception as err:
            # The worker's release client raises a ConnectionError whose text says what happened
            # (`worker.runtime.ReleaseError`); anything else is named by its type.
            why = str(err) if isinstance(err, ConnectionError) else None
            return KvTransferError(
                f"KV of request {kv.source_request_id!r} could not be read from "
                f"{kv.source_address}: {why or f'the source is unreachable ({type(err).__name__})'}"
            )
        if held is False:
            return KvTransferError(
                f"KV of request {kv.source_request_id!r} is not held by {kv.source_address} "
                "(unknown handle, already released, or its hold expired)"
            )
        return None

    def _fail(self, rid: RequestId, err: Exception) -> None:
        """End a request with `err` raised to its caller."""
        self._core.abort(rid)
        pending = self._pending.get(rid)
        if pending is not None:
            pending.failure = err
        self._finish(rid, TokenDelta((), FinishReason.ERROR, error=str(err)))
        self._wake.set()


def check_kv_handle(request: Request, kv: KvHandle) -> None:
    """Refuse a handle this engine could never read (`ValueError`, naming the field)."""
    if kv.transport != KV_TRANSPORT:
        raise ValueError(f"kv.transport is {kv.transport!r}; this engine reads {KV_TRANSPORT!r}")
    if not kv.source_request_id:
        raise ValueError("kv.source_request_id is empty: the handle names no prefilled request")
    if kv.num_tokens != request.num_prompt_tokens:
        raise ValueError(
            f"kv.num_tokens ({kv.num_tokens}) does not cover the prompt "
            f"({request.num_prompt_tokens} tokens)"
        )

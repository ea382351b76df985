"""A scripted `splitserve.v1.Worker` on a real grpc.aio server (127.0.0.1, a free port).

It generates a fixed completion (`Script.completion`, token ids) and can fail on cue: abort a
prefill / decode / generate with a status code, fail a stream after some tokens, end with an
error chunk, hold a stream until the test releases it. Every call and every `Cancel` is recorded,
with events the tests await instead of sleeping.

The completion continues where the prompt leaves off: when a prompt ends with the first k
completion tokens (the router re-running prompt + emitted tokens after a failure), generation
carries on from token k, so a taken-over stream neither repeats nor skips tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.roles import Role
from splitserve.worker import mux

_ROLE_PB = {
    Role.PREFILL: common_pb2.ROLE_PREFILL,
    Role.DECODE: common_pb2.ROLE_DECODE,
    Role.MIXED: common_pb2.ROLE_MIXED,
}


@dataclass
class Script:
    """What a fake worker does. Mutable: tests change it between requests."""

    role: Role = Role.DECODE
    completion: Sequence[int] = (10, 11, 12, 13, 14, 15, 16, 17)
    prefill_abort: grpc.StatusCode | None = None
    decode_abort: grpc.StatusCode | None = None
    generate_abort: grpc.StatusCode | None = None
    fail_after_tokens: int | None = None
    """Decode / Generate abort with UNAVAILABLE after streaming this many tokens."""
    error_chunk: bool = False
    """Decode / Generate end at once with a FINISH_REASON_ERROR chunk."""
    hold: asyncio.Event | None = None
    """Streams wait for this event before each token after the first `hold_after` tokens."""
    hold_after: int = 0
    prefill_hold: asyncio.Event | None = None
    """Prefill waits for this event before answering (a frozen prefill worker)."""
    token_delay_s: float = 0.0
    draining: bool = False
    kv_blocks_free: int = 1000
    num_running: int = 0
    engine: str = "fake"
    """The engine kind the worker reports (the router refuses fields per engine)."""
    step_every_s: float = 0.0
    """> 0: `WatchStepBatches` reports an engine step this often (a worker that is running, its
    requests queued behind others) until `steps_stop` is set, then none (frozen); 0: the worker
    reports no steps (UNIMPLEMENTED)."""
    steps_stop: asyncio.Event | None = None
    kv_pulled_tokens: int = 0
    kv_pull_seconds: float = 0.0
    """The KV pull totals the worker reports (`LoadReport.kv_pulled_tokens` / `kv_pull_seconds`)."""
    refuse_kv_follows: bool = False
    """Decode refuses `kv_follows` (INVALID_ARGUMENT), as a worker from before the early Decode
    that checks its requests."""
    refuse_decode_kv: bool = False
    """Decode refuses when the `decode_kv` of a `kv_follows` Decode comes (INVALID_ARGUMENT), as
    a worker from before the early Decode that checks only its ops."""
    multiplex: bool = True
    """Serve `Multiplex` (the worker's own `worker.mux` over these scripted handlers); False:
    answer UNIMPLEMENTED, as a worker from before it, so the router uses a call per request."""


def scripted_logprobs(token: int, top: int) -> common_pb2.TokenLogprobs:
    """A made-up distribution, the same for every position: the sampled token first (log
    probability -1 - token / 100), then tokens 3, 4, ... (-0.1, -0.2, ...) as the `top` most
    likely, the sampled one not repeated, as vLLM orders them."""
    ids, lps = [token], [-1.0 - token / 100]
    for i in range(top):
        if 3 + i != token:
            ids.append(3 + i)
            lps.append(-0.1 * (i + 1))
    return common_pb2.TokenLogprobs(token_ids=ids, logprobs=lps, rank=top + 1)


def scripted_prompt_logprobs(prompt: Sequence[int], top: int) -> list[common_pb2.TokenLogprobs]:
    """Made-up prompt log probabilities: none at the first position; at position i the prompt
    token (log probability -2 - i / 100, rank 7) then tokens 3, 4, ... (-0.1, -0.2, ...)."""
    out = [common_pb2.TokenLogprobs()]
    for i, token in enumerate(prompt[1:], 1):
        ids, lps = [token], [-2.0 - i / 100]
        for j in range(top):
            if 3 + j != token:
                ids.append(3 + j)
                lps.append(-0.1 * (j + 1))
        out.append(common_pb2.TokenLogprobs(token_ids=ids, logprobs=lps, rank=7))
    return out


@dataclass
class FakeWorker(worker_pb2_grpc.WorkerServicer):
    script: Script = field(default_factory=Script)
    address: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    _events: dict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    _server: aio.Server | None = None
    _break_load: asyncio.Event = field(default_factory=asyncio.Event)
    _seq: int = 0

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, port: int = 0) -> str:
        self._server = aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(self, self._server)
        bound = self._server.add_insecure_port(f"127.0.0.1:{port}")
        await self._server.start()
        self.address = f"127.0.0.1:{bound}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    def break_load_streams(self) -> None:
        """End every open WatchLoad stream (the router should reconnect)."""
        self._break_load.set()

    # -- what tests await ----------------------------------------------------------------------

    def event(self, name: str) -> asyncio.Event:
        """Set when a call named `name` arrives ("Prefill", "Decode", "Generate", "Cancel", ...)."""
        return self._events[name]

    async def wait_call(self, name: str, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self._events[name].wait()

    def names(self) -> list[str]:
        skip = ("WatchLoad", "WatchSteps", "Multiplex")
        return [name for name, _ in self.calls if name not in skip]

    def requests(self, name: str) -> list[Any]:
        return [msg for n, msg in self.calls if n == name]

    def _record(self, name: str, msg: Any) -> None:
        self.calls.append((name, msg))
        self._events[name].set()

    # -- generation ----------------------------------------------------------------------------

    def _start_index(self, prompt: Sequence[int]) -> int:
        comp = list(self.script.completion)
        for k in range(min(len(prompt), len(comp)), 0, -1):
            if list(prompt[-k:]) == comp[:k]:
                return k
        return 0

    async def _tokens(
        self,
        context: Any,
        start: int,
        max_tokens: int,
        stop_ids: Sequence[int],
        abort: grpc.StatusCode | None,
        sampling: common_pb2.SamplingParams | None = None,
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        s = self.script
        if abort is not None:
            await context.abort(abort, f"scripted {abort.name}")
        if s.error_chunk:
            yield common_pb2.TokenChunk(
                finish_reason=common_pb2.FINISH_REASON_ERROR, error="scripted error"
            )
            return
        comp = list(s.completion)
        for n in range(max_tokens):
            if s.fail_after_tokens is not None and n >= s.fail_after_tokens:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted crash")
            if s.hold is not None and n >= s.hold_after:
                await s.hold.wait()
            if s.token_delay_s:
                await asyncio.sleep(s.token_delay_s)
            i = start + n
            token = comp[i] if i < len(comp) else comp[-1]
            last = n + 1 == max_tokens or token in stop_ids or i + 1 >= len(comp)
            reason = common_pb2.FINISH_REASON_UNSPECIFIED
            if last:
                stopped = token in stop_ids or i + 1 >= len(comp)
                reason = (
                    common_pb2.FINISH_REASON_STOP if stopped else common_pb2.FINISH_REASON_LENGTH
                )
            chunk = common_pb2.TokenChunk(token_ids=[token], finish_reason=reason)
            if sampling is not None and sampling.logprobs:
                chunk.logprobs.append(scripted_logprobs(token, sampling.top_logprobs))
            yield chunk
            if last:
                return

    # -- the Worker service --------------------------------------------------------------------

    async def Prefill(  # noqa: N802
        self, request: worker_pb2.PrefillRequest, context: Any
    ) -> worker_pb2.PrefillResponse:
        self._record("Prefill", request)
        if self.script.prefill_hold is not None:
            await self.script.prefill_hold.wait()
        if self.script.prefill_abort is not None:
            await context.abort(self.script.prefill_abort, "scripted prefill failure")
        start = self._start_index(request.prompt_token_ids)
        first = list(self.script.completion)[start]
        resp = worker_pb2.PrefillResponse(
            request_id=request.request_id,
            first_token_id=first,
            num_prompt_tokens=len(request.prompt_token_ids),
        )
        if request.sampling.logprobs:
            resp.first_token_logprobs.CopyFrom(
                scripted_logprobs(first, request.sampling.top_logprobs)
            )
        if request.sampling.prompt_logprobs:
            resp.prompt_logprobs.extend(
                scripted_prompt_logprobs(
                    request.prompt_token_ids, request.sampling.prompt_top_logprobs
                )
            )
        if request.sampling.max_tokens <= 1 or first in request.sampling.stop_token_ids:
            stop = first in request.sampling.stop_token_ids
            resp.finish_reason = (
                common_pb2.FINISH_REASON_STOP if stop else common_pb2.FINISH_REASON_LENGTH
            )
        else:
            resp.kv.transport = "sim"
            resp.kv.source_address = self.address
            resp.kv.source_request_id = request.request_id
            resp.kv.num_tokens = len(request.prompt_token_ids)
        return resp

    async def Decode(  # noqa: N802
        self, request: worker_pb2.DecodeRequest, context: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        self._record("Decode", request)
        first = request.first_token_id
        if request.kv_follows and self.script.refuse_kv_follows:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown field kv_follows")
        if request.kv_follows:  # sent before the prefill answered: its KV comes on the stream
            handoff = getattr(context, "handoff", None)
            if handoff is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "kv_follows needs Multiplex")
            assert handoff is not None  # abort raised
            try:
                follow = await handoff
            except asyncio.CancelledError:
                self._record("EarlyDecodeCancelled", request)
                raise
            self._record("DecodeKv", follow)
            if self.script.refuse_decode_kv:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown op decode_kv")
            first = follow.first_token_id
        prompt = [*request.prompt_token_ids, first]
        start = self._start_index(prompt)
        async for chunk in self._tokens(
            context,
            start,
            request.sampling.max_tokens - 1,
            request.sampling.stop_token_ids,
            self.script.decode_abort,
            request.sampling,
        ):
            yield chunk

    async def Generate(  # noqa: N802
        self, request: worker_pb2.GenerateRequest, context: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        self._record("Generate", request)
        start = self._start_index(request.prompt_token_ids)
        first = True
        async for chunk in self._tokens(
            context,
            start,
            request.sampling.max_tokens,
            request.sampling.stop_token_ids,
            self.script.generate_abort,
            request.sampling,
        ):
            if first and request.sampling.prompt_logprobs:
                chunk.prompt_logprobs.extend(
                    scripted_prompt_logprobs(
                        request.prompt_token_ids, request.sampling.prompt_top_logprobs
                    )
                )
            first = False
            yield chunk

    async def Multiplex(  # noqa: N802
        self, request_iterator: AsyncIterator[worker_pb2.MuxRequest], context: Any
    ) -> AsyncIterator[worker_pb2.MuxResponse]:
        if not self.script.multiplex:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "scripted: no Multiplex")
        self._record("Multiplex", None)
        async for batch in mux.serve(self, request_iterator, context):  # type: ignore[arg-type]
            yield batch

    async def Cancel(  # noqa: N802
        self, request: worker_pb2.CancelRequest, context: Any
    ) -> worker_pb2.CancelResponse:
        self.cancelled.append(request.request_id)
        self._record("Cancel", request)
        return worker_pb2.CancelResponse(found=True)

    async def ReleaseKv(  # noqa: N802
        self, request: worker_pb2.ReleaseKvRequest, context: Any
    ) -> worker_pb2.ReleaseKvResponse:
        self._record("ReleaseKv", request)
        return worker_pb2.ReleaseKvResponse(found=True)

    def _report(self) -> common_pb2.LoadReport:
        self._seq += 1
        s = self.script
        return common_pb2.LoadReport(
            worker_id=self.address,
            role=_ROLE_PB[s.role],
            num_running=s.num_running,
            kv_blocks_free=s.kv_blocks_free,
            kv_blocks_total=1000,
            kv_block_size=16,
            draining=s.draining,
            seq=self._seq,
            engine=s.engine,
            model="fake",
            kv_pulled_tokens=s.kv_pulled_tokens,
            kv_pull_seconds=s.kv_pull_seconds,
        )

    async def WatchLoad(  # noqa: N802
        self, request: worker_pb2.WatchLoadRequest, context: Any
    ) -> AsyncIterator[common_pb2.LoadReport]:
        self._record("WatchLoad", request)
        interval_s = request.interval_s or 0.1
        self._break_load.clear()
        while not self._break_load.is_set():
            yield self._report()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._break_load.wait(), interval_s)

    async def WatchSteps(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSample]:
        """A scripted worker has no engine steps: UNIMPLEMENTED, as an engine without them."""
        self._record("WatchSteps", request)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake worker reports no steps")
        yield worker_pb2.StepSample()  # unreachable: makes this an async generator

    async def WatchStepBatches(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSampleBatch]:
        """As `WatchSteps` (not recorded: the router asks for it before `WatchSteps`), or
        with `Script.step_every_s` a made-up one-sequence decode step that often."""
        s = self.script
        if s.step_every_s <= 0:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake worker reports no steps")
        index = 0
        while s.steps_stop is None or not s.steps_stop.is_set():
            index += 1
            yield worker_pb2.StepSampleBatch(
                samples=[
                    worker_pb2.StepSample(
                        index=index, duration_s=0.01, decode_context_tokens=[100], num_seqs=1
                    )
                ]
            )
            await asyncio.sleep(s.step_every_s)
        await asyncio.Event().wait()  # frozen: the stream stays open, no more steps

    async def Drain(  # noqa: N802
        self, request: worker_pb2.DrainRequest, context: Any
    ) -> worker_pb2.DrainResponse:
        self.script.draining = not request.resume
        return worker_pb2.DrainResponse(draining=self.script.draining)

    async def SetRole(  # noqa: N802
        self, request: worker_pb2.SetRoleRequest, context: Any
    ) -> worker_pb2.SetRoleResponse:
        previous = _ROLE_PB[self.script.role]
        self.script.role = next(r for r, pb in _ROLE_PB.items() if pb == request.role)
        return worker_pb2.SetRoleResponse(previous=previous, current=request.role)

"""`Worker.Multiplex`: many Prefill / Decode / Generate requests over one stream.

The router opens one such stream per worker instead of a gRPC call per request: per-call set-up,
trailers and the per-call tasks of `grpc.aio` are paid once per connection, and the events of
every sub-request that are ready together leave as one message (`MuxResponse`), so a busy worker
sends far fewer messages than tokens. The chunks of one sub-request that wait for the same message
(the router reads behind: the previous write is held by HTTP/2 flow control, `router.mux`
`WORKER_CHANNEL_OPTIONS`) are joined into one chunk (`merge_into`), as the router would merge them.

The router's load and step feeds (`WatchLoad`, `WatchStepBatches`) can be sub-requests too (ops
`watch_load`, `watch_step_batches`; events `load`, `steps`): over the stream link
(`worker.link`) the router then keeps one socket per worker and no gRPC stream at all in its
steady state. A feed's step batches that wait for the same message are joined, in order.

Each sub-request runs through the very handler its own call would (`WorkerService.Prefill`,
`Decode`, `Generate`, `WatchLoad`, `WatchStepBatches`) under a `SubContext`: the stream's peer
and TLS identity (so `security.owners` records the same owner, and an owner-scoped `Cancel`
works as before), the sub-request's own metadata (the trace context), and an `abort` that ends
only that sub-request with the status its call would have had. A `MuxCancel`, or the stream
going away, cancels the sub-request's task the way a cancelled call cancels its handler.

A Decode sub-request may come before its prefill has answered (`DecodeRequest.kv_follows`, sent
when the router picks the pair): its handler checks it at once, then waits on `SubContext.handoff`
for the first token and KV handle, which a later `MuxOp.decode_kv` with the same stream_id
delivers. So only that small message is on the way between token 1 and the decode's start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, NoReturn

import grpc

from splitserve._gen.v1 import common_pb2, worker_pb2

if TYPE_CHECKING:
    from splitserve.worker.server import WorkerService

log = logging.getLogger(__name__)


class SubAbort(Exception):  # noqa: N818 - a status, as grpc's own abort
    """`SubContext.abort`: end one sub-request with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class SubContext:
    """The servicer context one sub-request's handler sees (the parts the handlers use)."""

    __slots__ = ("_metadata", "_outer", "handoff")

    def __init__(
        self,
        outer: grpc.aio.ServicerContext,
        metadata: Mapping[str, str],
        handoff: asyncio.Future[worker_pb2.DecodeKv] | None = None,
    ) -> None:
        self._outer = outer
        self._metadata = tuple(metadata.items())
        self.handoff = handoff
        """A Decode sent with `kv_follows`: its first token and KV handle (`MuxOp.decode_kv`)."""

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> NoReturn:
        raise SubAbort(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return str(self._outer.peer())

    def auth_context(self) -> Mapping[str, Any]:
        return self._outer.auth_context()  # type: ignore[no-any-return]

    async def send_initial_metadata(self, _: object) -> None:
        return None


_OK = worker_pb2.MuxStatus(code=grpc.StatusCode.OK.value[0])
MUX_HEADER = "splitserve-mux"
"""Sent first: the caller writes nothing before it (`router.mux`)."""


async def serve(
    service: WorkerService,
    requests: AsyncIterator[worker_pb2.MuxRequest],
    context: grpc.aio.ServicerContext,
) -> AsyncIterator[worker_pb2.MuxResponse]:
    """The `Multiplex` handler: run each opened sub-request in a task, and send whatever events
    are ready as one message each time the previous one is written."""
    pending: list[worker_pb2.MuxEvent] = []
    open_chunks: dict[int, common_pb2.TokenChunk] = {}
    """Per sub-request, its mid-stream chunk in `pending` that later chunks may join."""
    open_steps: dict[int, worker_pb2.StepSampleBatch] = {}
    """Per step feed, its batch in `pending` that later batches may join."""
    wake = asyncio.Event()
    tasks: dict[int, asyncio.Task[None]] = {}
    handoffs: dict[int, asyncio.Future[worker_pb2.DecodeKv]] = {}
    """Open Decode sub-requests sent with kv_follows whose `decode_kv` has not come yet."""
    reading = True

    def emit(event: worker_pb2.MuxEvent) -> None:
        pending.append(event)
        wake.set()

    def emit_steps(sid: int, batch: worker_pb2.StepSampleBatch) -> None:
        # Step batches of one feed that wait for the same message go as one, in order.
        prev = open_steps.get(sid)
        if prev is not None:
            prev.samples.extend(batch.samples)
            return
        ev = worker_pb2.MuxEvent(stream_id=sid, steps=batch)
        pending.append(ev)
        open_steps[sid] = ev.steps
        wake.set()

    def emit_chunk(sid: int, chunk: common_pb2.TokenChunk) -> None:
        # Chunks of one sub-request that wait for the same message are sent as one chunk, as
        # the router would merge them (`router.mux._merge`): fewer events to read.
        merged = merge_into(open_chunks.get(sid), chunk)
        if merged is None:
            ev = worker_pb2.MuxEvent(stream_id=sid, chunk=chunk)
            pending.append(ev)
            merged = ev.chunk
            wake.set()
        if merged.finish_reason == _UNFINISHED and not merged.error:
            open_chunks[sid] = merged
        else:
            open_chunks.pop(sid, None)

    async def read() -> None:
        nonlocal reading
        try:
            async for batch in requests:
                for op in batch.ops:
                    sid = op.stream_id
                    which = op.WhichOneof("op")
                    if which == "cancel":
                        handoffs.pop(sid, None)
                        task = tasks.pop(sid, None)
                        if task is not None:
                            task.cancel()
                        continue
                    if which == "decode_kv":
                        # For an open Decode that waits for it; otherwise (it ended, it was sent
                        # without kv_follows, or its KV came already) nothing to do.
                        fut = handoffs.pop(sid, None)
                        if fut is not None and not fut.done():
                            fut.set_result(op.decode_kv)
                        continue
                    if which is None or sid in tasks:
                        what = "no operation" if which is None else "a stream_id already open"
                        emit(_status(sid, grpc.StatusCode.INVALID_ARGUMENT, f"mux op with {what}"))
                        continue
                    handoff = None
                    if which == "decode" and op.decode.kv_follows:
                        handoff = handoffs[sid] = asyncio.get_running_loop().create_future()
                    task = tasks[sid] = asyncio.create_task(
                        _run(
                            service, context, sid, op, emit, emit_chunk, emit_steps, tasks, handoff
                        ),
                        name=f"mux-{sid}",
                    )
                    if handoff is not None:
                        task.add_done_callback(_forget(handoffs, sid, handoff))
        finally:
            reading = False
            wake.set()

    await context.send_initial_metadata(((MUX_HEADER, "1"),))  # the caller may write now
    reader = asyncio.create_task(read(), name="mux-read")
    try:
        while True:
            await wake.wait()
            wake.clear()
            if pending:
                batch, pending = pending, []
                open_chunks.clear()
                open_steps.clear()
                yield worker_pb2.MuxResponse(events=batch)
            elif not reading and not tasks:
                return  # the caller half-closed and every sub-request has ended
    finally:
        reader.cancel()
        for task in list(tasks.values()):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks.values(), return_exceptions=True)


async def _run(
    service: WorkerService,
    outer: grpc.aio.ServicerContext,
    sid: int,
    op: worker_pb2.MuxOp,
    emit: Callable[[worker_pb2.MuxEvent], None],
    emit_chunk: Callable[[int, common_pb2.TokenChunk], None],
    emit_steps: Callable[[int, worker_pb2.StepSampleBatch], None],
    tasks: dict[int, asyncio.Task[None]],
    handoff: asyncio.Future[worker_pb2.DecodeKv] | None = None,
) -> None:
    ctx: Any = SubContext(outer, op.metadata, handoff)
    which = op.WhichOneof("op")
    status = _OK
    try:
        if which == "prefill":
            resp = await service.Prefill(op.prefill, ctx)
            emit(worker_pb2.MuxEvent(stream_id=sid, prefill=resp))
        elif which == "watch_load":
            async for report in service.WatchLoad(op.watch_load, ctx):
                emit(worker_pb2.MuxEvent(stream_id=sid, load=report))
        elif which == "watch_step_batches":
            async for batch in service.WatchStepBatches(op.watch_step_batches, ctx):
                emit_steps(sid, batch)
        else:
            stream = (
                service.Decode(op.decode, ctx)
                if which == "decode"
                else service.Generate(op.generate, ctx)
            )
            async for chunk in stream:
                emit_chunk(sid, chunk)
    except SubAbort as err:
        status = worker_pb2.MuxStatus(code=err.code.value[0], details=err.details)
    except asyncio.CancelledError:
        tasks.pop(sid, None)
        raise  # cancelled by the caller (MuxCancel) or the stream ending: no status
    except Exception as err:
        log.exception("mux sub-request %s (%s) failed", sid, which)
        status = worker_pb2.MuxStatus(
            code=grpc.StatusCode.UNKNOWN.value[0], details=f"{type(err).__name__}: {err}"
        )
    tasks.pop(sid, None)
    emit(worker_pb2.MuxEvent(stream_id=sid, status=status))


def _forget(
    handoffs: dict[int, asyncio.Future[worker_pb2.DecodeKv]],
    sid: int,
    handoff: asyncio.Future[worker_pb2.DecodeKv],
) -> Callable[[object], None]:
    """A done callback: the sub-request ended, so a later `decode_kv` for it finds nothing."""

    def forget(_: object) -> None:
        if handoffs.get(sid) is handoff:
            del handoffs[sid]

    return forget


_UNFINISHED: Final = common_pb2.FINISH_REASON_UNSPECIFIED
_FAILED: Final = frozenset({common_pb2.FINISH_REASON_ERROR, common_pb2.FINISH_REASON_CANCELLED})


def merge_into(
    prev: common_pb2.TokenChunk | None, chunk: common_pb2.TokenChunk
) -> common_pb2.TokenChunk | None:
    """`chunk` appended to `prev` (a mid-stream chunk of the same sub-request not sent yet):
    `prev`, extended; None when it cannot join (no `prev`, or `chunk` is an error or a
    cancellation, which ends the stream on its own so the tokens before it stay emitted). The
    last chunk's finish reason carries over, as in the router's `mux._merge`."""
    if prev is None or chunk.finish_reason in _FAILED or chunk.error:
        return None
    prev.token_ids.extend(chunk.token_ids)
    if chunk.logprobs:
        prev.logprobs.extend(chunk.logprobs)
    prev.finish_reason = chunk.finish_reason
    return prev


def _status(sid: int, code: grpc.StatusCode, details: str) -> worker_pb2.MuxEvent:
    return worker_pb2.MuxEvent(
        stream_id=sid, status=worker_pb2.MuxStatus(code=code.value[0], details=details)
    )

"""A light backend for `make bench-router --slow-streams N`: thousands of slow streams, cheaply.

The scenario measures what a stream held open costs the *router* (its RSS per stream), so the
backend must not be the limit. A simulated worker steps every sequence in Python each step (run 5:
one sim worker fell behind at ~5,000 streams and the router answered 503s), so this bench fake
serves `Worker.Multiplex` itself: no engine, no task per stream, one timer wheel for all of them.

Each `Generate` / `Decode` sub-request gets its first token at once (so the client sees its first
SSE event) and then one token every `interval_s` (spread by a per-stream offset so the streams
do not tick together) until `max_tokens`; a `Prefill` answers at once with a KV handle pointing
here. Due tokens of every stream leave in one `MuxResponse` per wheel tick. A `MuxCancel` (or the
router's stream ending) drops the sub-request. Load reports say `mixed`, how many sub-requests
are running, and KV room for far more than the scenario holds (so placement never refuses);
`WatchSteps` is UNIMPLEMENTED (no engine steps: the router fits no latency model, so admission,
left on, always has room).

    python -m tests.bench_router.slow_worker --ready-file F [--interval-s 20] [--tick-s 0.1]

Not a worker: it never looks at the prompt and sends the same token id every time. It lives
under tests/ because it is a fake.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.worker.mux import MUX_HEADER
from tests.bench_router.ready import announce

TOKEN_ID = 1000
"""The token every stream repeats (any id the router's tokenizer can decode)."""
_OK = worker_pb2.MuxStatus(code=grpc.StatusCode.OK.value[0])
_KV_BLOCKS = 50_000_000


class _Wheel:
    """Sub-requests of one `Multiplex` stream and when each sends its next token."""

    def __init__(self, interval_ticks: int) -> None:
        self.interval_ticks = max(1, interval_ticks)
        self.tick = 0
        self.left: dict[int, int] = {}
        """Open sub-request -> tokens still to send."""
        self.slots: defaultdict[int, list[int]] = defaultdict(list)
        self.pending: list[worker_pb2.MuxEvent] = []
        self.wake = asyncio.Event()
        self.cancelled = asyncio.Event()
        """Set on each `MuxCancel` (tests wait on it)."""

    def emit(self, event: worker_pb2.MuxEvent) -> None:
        self.pending.append(event)
        self.wake.set()

    def open(self, sid: int, max_tokens: int) -> None:
        """The first token now; the rest on the wheel."""
        if max_tokens <= 0:
            self.emit(worker_pb2.MuxEvent(stream_id=sid, status=_OK))
            return
        self.left[sid] = max_tokens
        self._token(sid)

    def _token(self, sid: int) -> None:
        left = self.left[sid] - 1
        chunk = common_pb2.TokenChunk(token_ids=[TOKEN_ID])
        if left == 0:
            chunk.finish_reason = common_pb2.FINISH_REASON_LENGTH
            del self.left[sid]
            self.emit(worker_pb2.MuxEvent(stream_id=sid, chunk=chunk))
            self.emit(worker_pb2.MuxEvent(stream_id=sid, status=_OK))
            return
        self.left[sid] = left
        self.emit(worker_pb2.MuxEvent(stream_id=sid, chunk=chunk))
        # spread the streams over the wheel: each keeps its own phase (stream id mod interval)
        due = self.tick + self.interval_ticks - (self.tick - sid) % self.interval_ticks
        self.slots[due].append(sid)

    def cancel(self, sid: int) -> None:
        self.left.pop(sid, None)  # its slot on the wheel is skipped when it comes round
        self.cancelled.set()

    def advance(self) -> None:
        self.tick += 1
        for sid in self.slots.pop(self.tick, ()):
            if sid in self.left:  # not cancelled meanwhile
                self._token(sid)


class SlowWorker(worker_pb2_grpc.WorkerServicer):
    def __init__(self, interval_s: float, tick_s: float) -> None:
        self.interval_s = interval_s
        self.tick_s = tick_s
        self.address = ""
        self.wheels: list[_Wheel] = []
        self._seq = 0

    async def Multiplex(  # noqa: N802
        self, request_iterator: AsyncIterator[worker_pb2.MuxRequest], context: Any
    ) -> AsyncIterator[worker_pb2.MuxResponse]:
        wheel = _Wheel(round(self.interval_s / self.tick_s))
        self.wheels.append(wheel)
        reading = True

        async def read() -> None:
            nonlocal reading
            try:
                async for batch in request_iterator:
                    for op in batch.ops:
                        self._op(wheel, op)
            finally:
                reading = False
                wheel.wake.set()

        async def tick() -> None:
            loop = asyncio.get_running_loop()
            next_t = loop.time()
            while True:
                next_t += self.tick_s
                await asyncio.sleep(max(0.0, next_t - loop.time()))
                wheel.advance()

        await context.send_initial_metadata(((MUX_HEADER, "1"),))
        tasks = [asyncio.create_task(read()), asyncio.create_task(tick())]
        try:
            while True:
                await wheel.wake.wait()
                wheel.wake.clear()
                if wheel.pending:
                    batch, wheel.pending = wheel.pending, []
                    yield worker_pb2.MuxResponse(events=batch)
                elif not reading:
                    return
        finally:
            for task in tasks:
                task.cancel()
            self.wheels.remove(wheel)

    def _op(self, wheel: _Wheel, op: worker_pb2.MuxOp) -> None:
        sid = op.stream_id
        which = op.WhichOneof("op")
        if which == "cancel":
            wheel.cancel(sid)
        elif which == "generate":
            wheel.open(sid, op.generate.sampling.max_tokens)
        elif which == "decode":
            wheel.open(sid, op.decode.sampling.max_tokens - 1)
        elif which == "prefill":
            req = op.prefill
            resp = worker_pb2.PrefillResponse(
                request_id=req.request_id,
                first_token_id=TOKEN_ID,
                num_prompt_tokens=len(req.prompt_token_ids),
            )
            resp.kv.transport = "sim"
            resp.kv.source_address = self.address
            resp.kv.source_request_id = req.request_id
            resp.kv.num_tokens = len(req.prompt_token_ids)
            wheel.emit(worker_pb2.MuxEvent(stream_id=sid, prefill=resp))
            wheel.emit(worker_pb2.MuxEvent(stream_id=sid, status=_OK))
        else:
            wheel.emit(
                worker_pb2.MuxEvent(
                    stream_id=sid,
                    status=worker_pb2.MuxStatus(
                        code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                        details=f"slow bench worker: no op {which!r}",
                    ),
                )
            )

    async def _only_multiplex(self, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the slow bench worker: Multiplex only")

    async def Prefill(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._only_multiplex(context)

    async def Decode(  # noqa: N802
        self, request: Any, context: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        await self._only_multiplex(context)
        yield common_pb2.TokenChunk()  # unreachable: makes this an async generator

    async def Generate(  # noqa: N802
        self, request: Any, context: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        await self._only_multiplex(context)
        yield common_pb2.TokenChunk()  # unreachable: makes this an async generator

    async def Drain(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._only_multiplex(context)

    async def SetRole(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._only_multiplex(context)

    async def Cancel(  # noqa: N802
        self, request: worker_pb2.CancelRequest, context: Any
    ) -> worker_pb2.CancelResponse:
        return worker_pb2.CancelResponse(found=False)  # sub-requests end by MuxCancel

    async def ReleaseKv(  # noqa: N802
        self, request: worker_pb2.ReleaseKvRequest, context: Any
    ) -> worker_pb2.ReleaseKvResponse:
        return worker_pb2.ReleaseKvResponse(found=True)

    def report(self) -> common_pb2.LoadReport:
        self._seq += 1
        return common_pb2.LoadReport(
            worker_id=self.address,
            role=common_pb2.ROLE_MIXED,
            num_running=sum(len(w.left) for w in self.wheels),
            kv_blocks_free=_KV_BLOCKS,
            kv_blocks_total=_KV_BLOCKS,
            kv_block_size=16,
            seq=self._seq,
            engine="sim",
            model="bench",
        )

    async def WatchLoad(  # noqa: N802
        self, request: worker_pb2.WatchLoadRequest, context: Any
    ) -> AsyncIterator[common_pb2.LoadReport]:
        interval_s = request.interval_s or 0.1
        while True:
            yield self.report()
            await asyncio.sleep(interval_s)

    async def WatchSteps(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSample]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the slow bench worker has no steps")
        yield worker_pb2.StepSample()  # unreachable: makes this an async generator

    async def WatchStepBatches(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSampleBatch]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the slow bench worker has no steps")
        yield worker_pb2.StepSampleBatch()  # unreachable: makes this an async generator


async def serve(interval_s: float, tick_s: float, ready_file: Path) -> None:
    worker = SlowWorker(interval_s, tick_s)
    server = aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    worker.address = f"127.0.0.1:{port}"
    announce(ready_file, worker.address)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--interval-s", type=float, default=20.0, help="seconds between tokens")
    parser.add_argument("--tick-s", type=float, default=0.1, help="the wheel's resolution")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.interval_s, args.tick_s, args.ready_file))


if __name__ == "__main__":
    main()

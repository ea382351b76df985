"""The slow-stream bench fake (`slow_worker`) keeps the `Multiplex` contract the router reads:
every token of each sub-request, the last one with a finish reason, then exactly one OK status;
nothing after a cancel; streams spread over the wheel."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from tests.bench_router.slow_worker import TOKEN_ID, SlowWorker, _Wheel


def _by_stream(events: list[worker_pb2.MuxEvent]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    for ev in events:
        kind = ev.WhichOneof("event")
        if kind == "chunk":
            last = ev.chunk.finish_reason == common_pb2.FINISH_REASON_LENGTH
            out[ev.stream_id].append("last" if last else "tok")
        else:
            out[ev.stream_id].append(f"{kind}:{ev.status.code}")
    return out


async def test_wheel_sends_each_token_once_then_ok_and_nothing_after_cancel() -> None:
    wheel = _Wheel(interval_ticks=4)
    for sid in (1, 2, 3):
        wheel.open(sid, 3)
    assert len(wheel.pending) == 3  # every first token at once
    wheel.cancel(3)  # cancelled after its first token
    ticks_with_tokens = set()
    for _ in range(12):
        before = len(wheel.pending)
        wheel.advance()
        if len(wheel.pending) > before:
            ticks_with_tokens.add(wheel.tick)
    streams = _by_stream(wheel.pending)
    assert streams[1] == ["tok", "tok", "last", "status:0"]
    assert streams[2] == ["tok", "tok", "last", "status:0"]
    assert streams[3] == ["tok"]
    assert not wheel.left
    assert not any(wheel.slots.values())
    assert len(ticks_with_tokens) >= 2  # streams 1 and 2 keep different phases


async def test_multiplex_over_grpc_generate_prefill_and_cancel() -> None:
    worker = SlowWorker(interval_s=0.02, tick_s=0.01)
    server = aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    worker.address = f"127.0.0.1:{port}"
    try:
        async with aio.insecure_channel(worker.address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            outbox: asyncio.Queue[worker_pb2.MuxRequest | None] = asyncio.Queue()

            async def requests() -> AsyncIterator[worker_pb2.MuxRequest]:
                while (item := await outbox.get()) is not None:
                    yield item

            call = stub.Multiplex(requests())
            short = common_pb2.SamplingParams(max_tokens=4)
            long = common_pb2.SamplingParams(max_tokens=1000)  # ends only by the cancel
            req = worker_pb2.MuxRequest()
            req.ops.add(stream_id=1, generate=worker_pb2.GenerateRequest(sampling=short))
            req.ops.add(stream_id=2, prefill=worker_pb2.PrefillRequest(request_id="p"))
            req.ops.add(stream_id=3, generate=worker_pb2.GenerateRequest(sampling=long))
            await outbox.put(req)
            events: list[worker_pb2.MuxEvent] = []
            cancelled = False
            async with asyncio.timeout(10):
                while True:
                    resp = await call.read()
                    assert resp is not grpc.aio.EOF
                    events.extend(resp.events)
                    if not cancelled and any(e.stream_id == 3 for e in events):
                        cancel = worker_pb2.MuxRequest()
                        cancel.ops.add(stream_id=3).cancel.SetInParent()
                        await outbox.put(cancel)
                        cancelled = True
                    if any(e.stream_id == 1 and e.HasField("status") for e in events):
                        break
                await worker.wheels[0].cancelled.wait()  # the cancel is on its way
            await outbox.put(None)
            call.cancel()
        streams = _by_stream(events)
        assert streams[1] == ["tok", "tok", "tok", "last", "status:0"]
        assert streams[2] == ["prefill:0", "status:0"]
        assert set(streams[3]) == {"tok"}  # no last token, no status
        assert all(e.chunk.token_ids == [TOKEN_ID] for e in events if e.HasField("chunk"))
        assert worker.report().role == common_pb2.ROLE_MIXED
    finally:
        await server.stop(grace=None)

"""The dispatcher over `Multiplex` streams (`router.mux`): one stream per worker, and workers
without it served with a call per request."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from splitserve._gen.v1 import common_pb2
from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.request import FinishReason, Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.router.dispatch import Chunk, Dispatch
from splitserve.router.errors import InvalidRequest, WorkersFailed
from splitserve.router.fast_lane import FastLane
from splitserve.router.mux import MuxStream
from tests.fakes.fake_worker import Script
from tests.unit.router.conftest import StackFactory, WorkerFactory

COMPLETION = (10, 11, 12, 13, 14, 15, 16, 17)
PROMPT = (1, 2, 3, 4)


def _request(rid: str, max_tokens: int = 5) -> Request:
    return Request(RequestId(rid), PROMPT, SamplingSpec(max_tokens=max_tokens), arrival_s=0.0)


async def _run(dispatch: Dispatch) -> list[int]:
    async with contextlib.aclosing(dispatch.chunks()) as chunks:
        out: list[Chunk] = [c async for c in chunks]
    assert out[-1].finish_reason is FinishReason.LENGTH
    return [t for c in out for t in c.token_ids]


async def test_concurrent_requests_share_one_stream_per_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    runs = [_run(stack.dispatcher.open(_request(f"r{i}"))) for i in range(6)]
    for tokens in await asyncio.gather(*runs):
        assert tokens == list(COMPLETION[:5])
    assert len(p.requests("Prefill")) == 6
    assert len(d.requests("Decode")) == 6
    assert len(p.requests("Multiplex")) == 1
    assert len(d.requests("Multiplex")) == 1
    assert stack.dispatcher.links is not None
    assert stack.dispatcher.links.get(EndpointId(d.address), stack.pool.stub(d.address))
    await stack.dispatcher.drain_background()
    assert p.cancelled == d.cancelled == []


async def test_worker_without_multiplex_gets_a_call_per_request(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL, multiplex=False)
    d = await make_worker(Role.DECODE, multiplex=False)
    stack = await make_stack(p, d)
    # The first requests race the UNIMPLEMENTED answer; they still run (per-request calls).
    runs = [_run(stack.dispatcher.open(_request(f"r{i}"))) for i in range(3)]
    for tokens in await asyncio.gather(*runs):
        assert tokens == list(COMPLETION[:5])
    assert await _run(stack.dispatcher.open(_request("late"))) == list(COMPLETION[:5])
    assert p.names() == ["Prefill"] * 4
    assert d.names() == ["Decode"] * 4
    links = stack.dispatcher.links
    assert links is not None
    for w in (p, d):
        link = links.get(EndpointId(w.address), stack.pool.stub(w.address))
        assert link is not None
        assert not link.supported


async def test_a_broken_stream_fails_over_and_the_next_request_reopens_it(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    hold = asyncio.Event()
    d1 = await make_worker(Role.MIXED, hold=hold, hold_after=2)
    stack = await make_stack(d1)
    dispatch = stack.dispatcher.open(_request("a"))
    task = asyncio.create_task(_run(dispatch))
    await d1.wait_call("Generate")
    links = stack.dispatcher.links
    assert links is not None
    link = links.get(EndpointId(d1.address), stack.pool.stub(d1.address))
    assert link is not None
    assert link._call is not None
    link._call.cancel()  # the stream breaks under the open request
    # No other worker: the request fails, as it would have with its own call broken.
    with pytest.raises(WorkersFailed, match="no mixed worker could finish"):
        await task
    hold.set()
    assert await _run(stack.dispatcher.open(_request("b"))) == list(COMPLETION[:5])
    assert len(d1.requests("Multiplex")) == 2


async def test_mux_sub_request_status_maps_to_the_calls_code(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    d = await make_worker(Role.MIXED, generate_abort=grpc.StatusCode.OUT_OF_RANGE)
    stack = await make_stack(d)
    with pytest.raises(InvalidRequest):  # final, never retried: as over a call
        await _run(stack.dispatcher.open(_request("a")))
    assert d.names() == ["Generate"]
    assert Script().multiplex


async def test_chunks_queued_together_are_read_as_one() -> None:
    class _Link:
        loop = asyncio.get_running_loop()

    stream = MuxStream(_Link(), 1, None, lambda: None)  # type: ignore[arg-type]
    unfinished, length = common_pb2.FINISH_REASON_UNSPECIFIED, common_pb2.FINISH_REASON_LENGTH
    for ids, reason in (([1], unfinished), ([2, 3], unfinished), ([4], length)):
        stream._push(common_pb2.TokenChunk(token_ids=ids, finish_reason=reason))
    stream._end(None)
    first = await stream.read()
    assert list(first.token_ids) == [1, 2, 3, 4]
    assert first.finish_reason == length
    assert await stream.read() is grpc.aio.EOF
    # An error chunk is never folded in: the tokens before it are read first.
    stream = MuxStream(_Link(), 2, None, lambda: None)  # type: ignore[arg-type]
    stream._push(common_pb2.TokenChunk(token_ids=[7]))
    stream._push(common_pb2.TokenChunk(finish_reason=common_pb2.FINISH_REASON_ERROR, error="x"))
    assert list((await stream.read()).token_ids) == [7]
    assert (await stream.read()).finish_reason == common_pb2.FINISH_REASON_ERROR


async def test_tokens_the_lane_took_join_a_last_chunk_read_with_them() -> None:
    """One read brings a mid-stream chunk (the fast lane takes it) and the last chunk (queued:
    the task wakes for it). The lane writes nothing: its tokens go back in front of the last
    chunk and the task reads both as one chunk (one event, one write, as with the lane off)."""

    class _Link:
        loop = asyncio.get_running_loop()
        name = "w"

        def __init__(self) -> None:
            self._held: list[MuxStream] = []

    class _Out:
        writable = True

        def __init__(self) -> None:
            self.written: list[bytes] = []

        def write_chunk_now(self, body: bytes) -> None:
            self.written.append(body)

    class _Detok:
        def push(self, token_ids: object) -> str:
            return "text"

    class _Fmt:
        def delta_event(self, text: str, *, with_usage: bool) -> bytes:
            return text.encode()

    link, out = _Link(), _Out()
    seen: list[tuple[int, ...]] = []
    stream = MuxStream(link, 1, None, lambda: None)  # type: ignore[arg-type]
    lane = FastLane()
    lane.attach(stream, seen.append)
    lane.out, lane.detok, lane.fmt = out, _Detok(), _Fmt()  # type: ignore[assignment]
    reading = asyncio.ensure_future(stream.read())
    await asyncio.sleep(0)  # the task is parked in `read`, nothing queued
    stream._push(common_pb2.TokenChunk(token_ids=[1, 2]))
    stream._push(
        common_pb2.TokenChunk(token_ids=[3], finish_reason=common_pb2.FINISH_REASON_LENGTH)
    )
    assert lane.taken == 1
    assert link._held == [stream]
    stream._flush_lane()  # the end of the read
    assert out.written == []
    assert seen == []
    chunk = await reading
    assert list(chunk.token_ids) == [1, 2, 3]
    assert chunk.finish_reason == common_pb2.FINISH_REASON_LENGTH
    # A mid-stream chunk read alone is still the lane's.
    stream = MuxStream(link, 2, None, lambda: None)  # type: ignore[arg-type]
    lane.attach(stream, seen.append)
    reading = asyncio.ensure_future(stream.read())
    await asyncio.sleep(0)
    stream._push(common_pb2.TokenChunk(token_ids=[4]))
    stream._flush_lane()
    assert out.written == [b"text"]
    assert seen == [(4,)]
    assert not reading.done()
    reading.cancel()

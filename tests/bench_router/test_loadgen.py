"""`make bench-router`'s load generator against a tiny local SSE server: it counts what the
server saw, and its wall-clock cap holds when the server stops answering (a stalled stream
kept the closed loop waiting forever; the open loop dropped the requests still in flight at
its cap from every count, so its p99 and error count were of the finished ones only)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.bench_router import loadgen
from tests.bench_router.loadgen import UNFINISHED

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _sse(*events: bytes) -> bytes:
    """A chunked SSE response: one chunk per event, then the terminator."""
    body = b"".join(b"%x\r\n%s\r\n" % (len(e) + 2, e + b"\n\n") for e in events)
    return HEAD + body + b"0\r\n\r\n"


SSE = _sse(b"data: 1", b"data: [DONE]")
ERROR_SSE = _sse(
    b"data: 1", b'data: {"error": {"message": "no decode worker could finish"}}', b"data: [DONE]"
)


class Server:
    """Answers each request with a two-event stream (`answer`), or (`stall_after` answered
    requests on) with the response head and then nothing."""

    def __init__(self, stall_after: int | None = None) -> None:
        self.answer = SSE
        self.stall_after = stall_after
        self.received = 0
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.received += 1
                if self.stall_after is not None and self.received > self.stall_after:
                    writer.write(HEAD)
                    await reader.read()  # nothing more, until the client hangs up
                    return
                writer.write(self.answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    listener = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    srv.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield srv
        listener.close()


def _raw(port: int) -> bytes:
    return loadgen.request_bytes(port, "/v1/chat/completions", b"{}")


async def test_closed_loop_counts_what_the_server_answered(server: Server) -> None:
    result = await loadgen.closed_loop(server.port, _raw(server.port), 4, 50, 30)
    assert result.done == 50 == server.received
    assert result.errors == 0
    assert len(result.ttft_s) == 50


async def test_closed_loop_stops_at_its_cap_when_a_stream_stalls(server: Server) -> None:
    server.stall_after = 5
    start = time.perf_counter()
    result = await asyncio.wait_for(
        loadgen.closed_loop(server.port, _raw(server.port), 2, 100, 1.0, grace_s=0.5), 20
    )
    assert time.perf_counter() - start < 1.0 + 0.5 + 2
    assert result.done == 5
    assert result.statuses == {UNFINISHED: 2}  # the two stalled
    assert result.errors == 2


async def test_open_loop_counts_requests_unfinished_at_its_cap(server: Server) -> None:
    server.stall_after = 3
    result = await asyncio.wait_for(
        loadgen.open_loop(server.port, _raw(server.port), 50.0, 10, 0.5, grace_s=0.5), 20
    )
    assert result.done == 3
    assert result.done + result.errors == 10 == server.received
    assert result.statuses == {UNFINISHED: 7}


async def test_a_stream_ending_in_an_error_event_is_an_error(server: Server) -> None:
    # the router's answer to a failure after the first token: an error event, then [DONE];
    # it was counted as a finished request (req/s, TTFT) and not as an error
    server.answer = ERROR_SSE
    result = await loadgen.closed_loop(server.port, _raw(server.port), 2, 10, 30)
    assert result.done == 0
    assert result.statuses == {"error event": 10}
    assert result.errors == 10 == server.received

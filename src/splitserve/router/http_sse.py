"""A streamed answer written straight onto the router's own HTTP connection.

`SseResponse` (in `openai_stream`) sends one ASGI message per SSE event through uvicorn's `send`,
which writes the status line and headers on their own and then each event as its own chunk: for
a chat stream three `write` syscalls before the first token's text has left (headers, the role
chunk, the first delta), each a trip through the loopback TCP stack. Syscalls are the router's
largest HTTP-layer cost (issue 17, `docs/benchmarks.md`).

`EdgeSseResponse` writes on the connection's transport itself, through `EdgeStream`, which the
router's HTTP protocol (`http_edge.EdgeProtocol`) puts in each request's ASGI scope next to its
`ClientLink`:

- the status line and headers leave together with the first event; a chat stream's first
  event (the role chunk, no text) also waits for the first delta when the body produces it
  without waiting (else it leaves at the end of the current step, a `call_soon`): one write
  instead of three, and no event with text is ever held back;
- later events are written as HTTP chunks with no ASGI message dict and no checks per event;
- the last event, `[DONE]` and the chunked terminator leave in one write.

What goes on the wire is what uvicorn would send (same status line, uvicorn's default headers,
chunked framing, `connection: close` when the connection is not kept alive); the request's
uvicorn cycle is marked started / complete as uvicorn's `send` does, so keep-alive, pipelining,
flow control (`pause_writing`) and the app's disconnect handling behave as before. Served by any
other ASGI server the scope has no `EdgeStream` and `SseResponse` is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

from splitserve.router.client_link import ClientGone, ClientLink
from splitserve.router.fast_lane import FastLane

STREAM_KEY: Final = "splitserve.edge_stream"
"""The ASGI scope key holding the request's `EdgeStream`."""

_STATUS_200: Final = b"HTTP/1.1 200 OK\r\n"
_SSE_TYPE: Final = b"content-type: text/event-stream; charset=utf-8\r\n"
"""What Starlette's `StreamingResponse(media_type="text/event-stream")` sends."""
_CHUNKED: Final = b"transfer-encoding: chunked\r\n\r\n"
_CLOSE: Final = b"connection: close\r\n"
_END: Final = b"0\r\n\r\n"
DONE: Final = b"data: [DONE]\n\n"


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(body), body)


class EdgeStream:
    """Direct writes of one request's chunked answer on its uvicorn `RequestResponseCycle`.

    Uses the cycle's `transport`, `flow`, `default_headers`, `keep_alive`, `disconnected`,
    `response_started`, `response_complete`, `waiting_for_100_continue`, `message_event` and
    `on_response`, the state uvicorn's own `send` reads and writes
    (`tests/unit/router/test_http_sse.py` checks they exist).
    """

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle

    @property
    def usable(self) -> bool:
        """No answer has started on this request (else the ASGI path must be used)."""
        cycle = self._cycle
        return not cycle.response_started and not cycle.disconnected

    def head(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The status line and headers of a 200 event stream, as uvicorn would write them, and
        the response marked started."""
        cycle = self._cycle
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = True
        parts = [_STATUS_200]
        for name, value in cycle.default_headers:  # `server`, `date`
            parts += (name, b": ", value, b"\r\n")
        parts.append(_SSE_TYPE)
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            parts.append(_CLOSE)
        parts.append(_CHUNKED)
        return b"".join(parts)

    async def write(self, data: bytes) -> None:
        """Write bytes already framed; nothing if the client is gone."""
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if not cycle.disconnected:
            cycle.transport.write(data)

    def write_now(self, data: bytes) -> None:
        """`write` without waiting for a paused transport (the bytes are buffered by it)."""
        cycle = self._cycle
        if not cycle.disconnected:
            cycle.transport.write(data)

    @property
    def writable(self) -> bool:
        """Bytes written now leave without waiting: not paused by flow control (the write
        buffer is under its high-water mark) and the client is still there."""
        cycle = self._cycle
        return not cycle.flow.write_paused and not cycle.disconnected

    def write_chunk_now(self, body: bytes) -> None:
        """One event framed as an HTTP chunk, written now (the fast lane's write)."""
        cycle = self._cycle
        if not cycle.disconnected:
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))

    def complete(self) -> None:
        """The body is out: what uvicorn's `send` does after the last body message."""
        cycle = self._cycle
        if cycle.response_complete:
            return
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()


def stream_of(scope: Mapping[str, Any]) -> EdgeStream | None:
    stream = scope.get(STREAM_KEY)
    return stream if isinstance(stream, EdgeStream) and stream.usable else None


class EdgeSseResponse:
    """A streamed answer on the router's own connection (see the module's docstring).

    Cancellation is `SseResponse`'s: a lost connection cancels this task through the request's
    `ClientLink`, and the body generator is closed (which cancels the request on its workers).
    """

    __slots__ = ("_body", "_headers", "_hold_first", "_lane", "_link", "_stream")

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        link: ClientLink,
        stream: EdgeStream,
        headers: dict[str, str] | None = None,
        *,
        hold_first: bool = False,
        lane: FastLane | None = None,
    ) -> None:
        """`hold_first`: the first event carries no text (a chat stream's role chunk), so it
        may wait for the next one: the two leave in one write if the body produces the next
        without waiting, else the first leaves at the end of the current step.

        `lane`: the body's request's fast lane; it may write on the connection while this
        holds nothing pending (`fast_lane`)."""
        self._lane = lane
        self._body = body
        self._link = link
        self._stream = stream
        self._hold_first = hold_first
        self._headers = [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        link, body, out = self._link, self._body, self._stream
        try:
            task = link.watch()
        except ClientGone:
            await body.aclose()
            return
        loop = asyncio.get_running_loop()
        pending: list[bytes] = [out.head(self._headers)]
        """Bytes not yet written: the head, and a held first event."""
        hold = self._hold_first
        lane = self._lane

        def flush() -> None:  # the body is waiting: what is pending leaves now
            if pending:
                out.write_now(b"".join(pending))
                pending.clear()
            if lane is not None:
                lane.out = out  # nothing pending: the lane's writes keep the order

        flushing = loop.call_soon(flush)  # the head alone, if the body waits before an event
        try:
            async for part in body:
                last = part.endswith(DONE)
                framed = _chunk(part) + _END if last else _chunk(part)
                if pending:
                    flushing.cancel()
                    pending.append(framed)
                    if hold and not last:  # a text-less first event: the next may join it
                        hold = False
                        flushing = loop.call_soon(flush)
                        continue
                    framed = b"".join(pending)
                    pending.clear()
                await out.write(framed)
                if last:
                    out.complete()
                    return
                if lane is not None:
                    lane.out = out
            flush()
            await out.write(_END)
            out.complete()
        except asyncio.CancelledError:
            if not link.took(task):
                raise
            # The client went away: closing the body (below) cancels the request.
        finally:
            flushing.cancel()
            flush()
            if lane is not None:
                lane.out = None
            link.unwatch()
            await body.aclose()

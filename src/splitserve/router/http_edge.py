"""The router's HTTP connections: socket options, a connection limit and per-phase timeouts.

`edge_protocol(base, settings)` wraps uvicorn's httptools protocol class; each connection then

- turns Nagle's algorithm off (`TCP_NODELAY`) and sends ACKs at once after a read that leaves
  a request incomplete (`TCP_QUICKACK`), so no keep-alive round trip waits 40 ms for a delayed
  ACK;
- puts an `EdgeStream` in each request's scope, for streamed answers written on the transport
  directly (`http_sse`);
- counts against `max_connections`: one over the limit is answered 429 and closed, so idle
  connections cannot use up the process's file descriptors and lock everyone out;
- is timed per phase: `idle_timeout_s` while no request is in progress (closed silently),
  `header_timeout_s` from a request's first byte to the end of its headers, and
  `body_timeout_s` from there to the end of its body (both answered 408 and closed). Once the
  request is read, the request deadline of the dispatcher applies instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any, Final, NoReturn

import orjson

from splitserve.api.router_edge import EdgeSettings
from splitserve.router.client_link import SCOPE_KEY, ClientLink
from splitserve.router.http_sse import STREAM_KEY, EdgeStream
from splitserve.router.openai_errors import error_body

log = logging.getLogger(__name__)

_QUICKACK: Final[int | None] = getattr(socket, "TCP_QUICKACK", None)
MAX_HEADER_BYTES: Final = 64 << 10
"""Request line plus headers; more is answered 431 (uvicorn's parser sets no limit)."""


def bind_tcp_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound (not yet listening) TCP socket whose accepted connections get `TCP_NODELAY`.

    The protocol is named (`IPPROTO_TCP`, not 0) because asyncio turns `TCP_NODELAY` on for an
    accepted socket only when `sock.proto == IPPROTO_TCP`, and `socket.accept()` copies the
    listener's proto: a listener made with proto 0 (as `uvicorn.Config.bind_socket` makes it)
    hands out connections with Nagle's algorithm on.

    `reuse_port`: several processes bind the same port and the kernel spreads connections.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def set_nodelay(sock: Any) -> bool:
    """Turn Nagle's algorithm off on a TCP socket; False (and nothing done) for other sockets."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return False
    return True


def error_response(status: int, reason: str, message: str, type_: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error body that closes the connection."""
    body = orjson.dumps(error_body(message, type_, None, code))
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class ConnectionCount:
    """Open connections of one HTTP server (shared by its protocol instances)."""

    def __init__(self) -> None:
        self.open = 0
        self.refused = 0
        self.timed_out = 0


_IDLE, _HEADERS, _BODY, _SERVING = range(4)


def _only_chunked(value: bytes) -> bool:
    """Is a `Transfer-Encoding` value `chunked` alone (any case, optional white space)?"""
    return value.strip().lower() == b"chunked"


def edge_protocol(
    base: type[asyncio.Protocol], settings: EdgeSettings, count: ConnectionCount
) -> type[asyncio.Protocol]:
    """`base` (uvicorn's `HttpToolsProtocol`) with the edge's socket options, limit and timers."""
    limit = settings.max_connections
    idle_s = settings.idle_timeout_s
    header_s = settings.header_timeout_s
    body_s = settings.body_timeout_s
    quickack = _QUICKACK

    class EdgeProtocol(base):  # type: ignore[valid-type,misc]
        _edge_sock: Any = None
        _edge_timer: asyncio.TimerHandle | None = None
        _edge_phase = _IDLE
        _edge_header_bytes = 0
        _edge_quiet_bytes = 0
        """Bytes read in a request's body phase since the parser last gave body or a chunk
        (chunk framing, a trailer line being read: the parser keeps it in memory)."""
        _edge_trailer_bytes = 0
        """The request's trailers read whole (the parser keeps them): bounded like a head."""
        _edge_counted = False
        _edge_hosts = 0
        """`Host` field lines of the request being read."""
        _edge_bad: tuple[int, str, str, str] | None = None
        """Why the request's head is refused (status, reason, message, code): the parser is
        stopped by an exception and `send_400_response` answers with this."""
        _edge_links: list[ClientLink] | None = None
        """The `ClientLink` of each request of this connection still being answered."""

        def connection_made(self, transport: Any) -> None:
            sock = transport.get_extra_info("socket")
            if set_nodelay(sock):
                self._edge_sock = sock
            if count.open >= limit:
                count.refused += 1
                log.warning("refusing a connection: %d open (max_connections)", count.open)
                transport.write(
                    error_response(
                        429,
                        "Too Many Requests",
                        f"the router has {count.open} open connections, its limit "
                        "(edge.max_connections); retry later",
                        "rate_limit_error",
                        "too_many_connections",
                    )
                )
                transport.close()
                return
            count.open += 1
            self._edge_counted = True
            super().connection_made(transport)
            self._edge_arm(idle_s, _IDLE)

        def connection_lost(self, exc: Exception | None) -> None:
            if not self._edge_counted:
                return
            self._edge_counted = False
            count.open -= 1
            self._edge_cancel()
            super().connection_lost(exc)
            links, self._edge_links = self._edge_links, None
            for link in links or ():
                link.lost()

        def data_received(self, data: bytes) -> None:
            if self._edge_phase <= _HEADERS:  # idle or reading a request's head
                end = data.find(b"\r\n\r\n")
                self._edge_header_bytes += len(data) if end < 0 else end
                if self._edge_header_bytes > MAX_HEADER_BYTES:
                    self._edge_refuse(
                        431,
                        "Request Header Fields Too Large",
                        f"the request line and headers exceed {MAX_HEADER_BYTES} bytes",
                        "headers_too_large",
                    )
                    return
            if self._edge_phase == _BODY:
                self._edge_quiet_bytes += len(data)
            super().data_received(data)
            if self._edge_phase == _BODY and (
                max(self._edge_quiet_bytes, self._edge_trailer_bytes) > MAX_HEADER_BYTES
            ):
                self._edge_refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"the request's chunk framing and trailers exceed {MAX_HEADER_BYTES} bytes",
                    "headers_too_large",
                )
                return
            sock = self._edge_sock
            if 0 < self._edge_phase < _SERVING and sock is not None and quickack is not None:
                # Part of a request is here and the rest is awaited: ACK at once, or a client
                # whose next write waits for this ACK (Nagle) stalls ~40 ms. A request read
                # whole needs no ACK of its own (the answer carries it): no syscall then.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)

        # httptools parser callbacks (the parser calls them on this object)
        def on_message_begin(self) -> None:
            self._edge_arm(header_s, _HEADERS)
            self._edge_hosts = 0
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._edge_check_head()
            self._edge_headers_read()
            super().on_headers_complete()
            cycle = getattr(self, "cycle", None)
            if cycle is not None and cycle.scope is self.scope:  # (not an upgrade)
                self.scope[STREAM_KEY] = EdgeStream(cycle)  # direct writes (`http_sse`)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self._edge_phase == _BODY:  # a trailer
                self._edge_trailer_bytes += len(name) + len(value) + 4
            else:
                lower = name.lower()
                if lower == b"host":
                    self._edge_hosts += 1
                elif lower == b"transfer-encoding" and not _only_chunked(value):
                    # RFC 9112 §6.1: a transfer coding the server does not understand is
                    # answered 501 (the parser would undo `chunked` and pass gzip bytes on).
                    coding = value.decode("latin-1").strip()
                    self._edge_stop(
                        501,
                        "Not Implemented",
                        f"Transfer-Encoding {coding!r} is not supported: only chunked",
                        "unsupported_transfer_encoding",
                    )
            super().on_header(name, value)

        def _edge_check_head(self) -> None:
            """RFC 9112 §3.2: a request without a Host (HTTP/1.1) or with more than one is
            answered 400 (a proxy in front and the router could read different targets)."""
            hosts = self._edge_hosts
            if hosts != 1 and (hosts > 1 or self.parser.get_http_version() != "1.0"):
                what = "has no Host header" if hosts == 0 else "has more than one Host header"
                self._edge_stop(400, "Bad Request", f"the request {what}", "invalid_host")

        def _edge_stop(self, status: int, reason: str, message: str, code: str) -> NoReturn:
            """Refuse the request whose head is being parsed: the parser stops on the
            exception, and uvicorn's answer to it (`send_400_response`) writes this one."""
            self._edge_bad = (status, reason, message, code)
            raise ValueError(message)

        def on_body(self, body: bytes) -> None:
            self._edge_quiet_bytes = 0
            super().on_body(body)

        def on_chunk_header(self) -> None:  # httptools calls it when the protocol has it
            self._edge_quiet_bytes = 0

        def on_chunk_complete(self) -> None:
            self._edge_quiet_bytes = 0

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to bytes its parser refuses (bad framing, a bad header), as
            the router's other refusals: an OpenAI error body, not `text/plain`; a head the
            edge refused (`_edge_stop`) gets that refusal."""
            status, reason, message, code = self._edge_bad or (
                400,
                "Bad Request",
                "the request is not valid HTTP/1.1 (its framing or a header)",
                "invalid_http",
            )
            self._edge_bad = None
            self.transport.write(
                error_response(status, reason, message, "invalid_request_error", code)
            )
            self.transport.close()

        def _edge_headers_read(self) -> None:
            """The body's timer, and the request's `ClientLink` in its scope."""
            self._edge_header_bytes = 0
            self._edge_quiet_bytes = self._edge_trailer_bytes = 0
            self._edge_arm(body_s, _BODY)
            link = ClientLink()
            self.scope[SCOPE_KEY] = link  # the app runs later (a task), with this scope
            if self._edge_links is None:
                self._edge_links = []
            self._edge_links.append(link)  # answers complete in order (pipelining)

        def on_message_complete(self) -> None:
            self._edge_cancel()
            self._edge_phase = _SERVING
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._edge_links:
                self._edge_links.pop(0)  # its answer is out: a later loss is not its client's
            super().on_response_complete()
            if self._edge_phase == _SERVING:  # else a pipelined request is being read
                self._edge_phase = _IDLE
                # uvicorn's keep-alive timer (timeout_keep_alive = idle_timeout_s) takes over

        def _edge_arm(self, delay_s: float, phase: int) -> None:
            self._edge_cancel()
            self._edge_phase = phase
            loop = asyncio.get_running_loop()
            self._edge_timer = loop.call_later(delay_s, self._edge_expired, phase)

        def _edge_cancel(self) -> None:
            if self._edge_timer is not None:
                self._edge_timer.cancel()
                self._edge_timer = None

        def _edge_expired(self, phase: int) -> None:
            self._edge_timer = None
            if self._edge_phase != phase or self.transport.is_closing():
                return
            count.timed_out += 1
            if phase == _IDLE:
                self.transport.close()
                return
            what = "headers" if phase == _HEADERS else "body"
            limit_s = header_s if phase == _HEADERS else body_s
            name = "header_timeout_s" if phase == _HEADERS else "body_timeout_s"
            self._edge_refuse(
                408,
                "Request Timeout",
                f"the request {what} did not arrive within {limit_s:g} s (edge.{name})",
                "request_timeout",
            )

        def _edge_refuse(self, status: int, reason: str, message: str, code: str) -> None:
            self._edge_cancel()
            # Answered before its body arrived (a 401, a 413): uvicorn reads and drops the rest;
            # a limit on that rest only closes (a second answer is one nobody asked for).
            answered = self._edge_phase == _BODY and self._edge_answered()
            self._edge_phase = _SERVING
            if answered:  # this request has its answer: close without another
                self.transport.close()
                return
            cycle = getattr(self, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                # The app is waiting for the body: tell it the client is gone.
                cycle.disconnected = True
                cycle.message_event.set()
                if cycle.response_started:
                    self.transport.close()
                    return
            self.transport.write(
                error_response(status, reason, message, "invalid_request_error", code)
            )
            self.transport.close()

        def _edge_answered(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and bool(cycle.response_complete)

    EdgeProtocol.__name__ = EdgeProtocol.__qualname__ = f"Edge{base.__name__}"
    return EdgeProtocol

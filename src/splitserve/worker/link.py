"""The worker's stream link: `Multiplex` without gRPC (issue 17, docs/benchmarks.md "Twelfth pass").

The same `MuxRequest` / `MuxResponse` messages, length-prefixed (`core.frames`), over a plain
TCP socket (TLS with this worker's identity once internal TLS is configured: a client
certificate of the same CA required, as on the gRPC port). A connection is one `Multiplex`
stream: it runs `worker.mux.serve`, the very code of the gRPC method, under a `LinkContext` that
names the caller from its TLS certificate as gRPC's `auth_context()` would, so the handlers'
owner records (`security.owners`) and the router-only check (`security.authz`, the table entry of
`/splitserve.v1.Worker/Multiplex`) are the same. A refused caller gets one frame, a `MuxEvent` of
stream 0 with PERMISSION_DENIED, and the connection closes.

The worker advertises the port in its load reports (`LoadReport.link_port`); a router with
`pool.link: stream` connects there (`router.mux.StreamLink`). A response is written and the
next one built only once the transport's write buffer is under `WRITE_BUFFER_BYTES` (`drain`),
so when the socket is full the events that come meanwhile leave as one message with a request's
chunks joined (`mux.merge_into`). With the kernel's autotuned buffers (megabytes on loopback)
that happens only when the router is far behind; the router coalesces on its side instead, per
socket read (`router.mux.StreamLink`): a frame costs it no thread hand-off, unlike a gRPC
message.

A connection that closes ends its sub-requests as a cancelled gRPC call ends its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import grpc
from google.protobuf.message import DecodeError

from splitserve._gen.v1 import worker_pb2
from splitserve.core.frames import FrameError, FrameSplitter, frame
from splitserve.security import tls
from splitserve.security.authz import WORKER_METHODS, RoleInterceptor
from splitserve.worker import mux

if TYPE_CHECKING:
    from splitserve.worker.server import WorkerService

log = logging.getLogger(__name__)

METHOD: Final = "/splitserve.v1.Worker/Multiplex"
"""The method whose callers may use the link (`security.authz.WORKER_METHODS`)."""
WRITE_BUFFER_BYTES: Final = 2048
"""Above this many bytes waiting in the transport, the next response waits (and gathers)."""
READ_BYTES: Final = 1 << 16


class LinkContext:
    """The servicer context `mux.serve` and its `SubContext`s see for one link connection."""

    __slots__ = ("_auth", "_peer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._auth = tls.ssl_auth_context(writer.get_extra_info("ssl_object"))
        addr = writer.get_extra_info("peername")
        self._peer = "link:unknown" if not addr else f"link:{addr[0]}:{addr[1]}"

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    async def send_initial_metadata(self, _: object) -> None:
        return None  # no headers: the router connects only where a link is advertised


async def start(service: WorkerService, host: str, port: int) -> tuple[asyncio.Server, int]:
    """Listen on `host:port` (0: any free port); returns the server and its bound port."""
    ident = tls.identity()
    guard = (
        RoleInterceptor(WORKER_METHODS, service=ident.own_service(), any_service={"operator"})
        if ident is not None
        else None
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _connection(service, guard, reader, writer)

    server = await asyncio.start_server(
        handle, host, port, ssl=tls.link_server_ssl(), limit=READ_BYTES
    )
    bound = int(server.sockets[0].getsockname()[1])
    return server, bound


async def _connection(
    service: WorkerService,
    guard: RoleInterceptor | None,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
    context: Any = LinkContext(writer)
    try:
        refusal = None if guard is None else guard.refusal(METHOD, context)
        if refusal is not None:
            status = worker_pb2.MuxStatus(
                code=grpc.StatusCode.PERMISSION_DENIED.value[0], details=refusal
            )
            refused = worker_pb2.MuxResponse(events=[worker_pb2.MuxEvent(status=status)])
            writer.write(frame(refused.SerializeToString()))
            await writer.drain()
            return
        pump = asyncio.current_task()
        assert pump is not None
        async for response in mux.serve(service, _requests(reader, pump), context):
            writer.write(frame(response.SerializeToString()))
            await writer.drain()  # waits only above WRITE_BUFFER_BYTES: the next one gathers
    except (ConnectionError, asyncio.CancelledError):
        pass  # the router went away: `mux.serve` cancelled the sub-requests on its way out
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _requests(
    reader: asyncio.StreamReader, pump: asyncio.Task[Any]
) -> AsyncIterator[worker_pb2.MuxRequest]:
    """The router's `MuxRequest`s; when the connection ends (the router closed it or went
    away), the connection's task is cancelled, which cancels every sub-request (a gRPC call's
    end does the same to `mux.serve`)."""
    frames = FrameSplitter()
    try:
        while data := await reader.read(READ_BYTES):
            for payload in frames.feed(data):
                yield worker_pb2.MuxRequest.FromString(payload)
    except (ConnectionError, FrameError) as err:
        log.warning("stream link: %s", err)
    except DecodeError as err:  # a peer that speaks something else: its own problem, no trace
        log.warning("stream link: a frame is not a MuxRequest (%s); closing the link", err)
    except Exception:
        log.exception("stream link: a request could not be read")
    pump.cancel()

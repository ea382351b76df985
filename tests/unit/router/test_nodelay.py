"""Issue 17 item 1: no delayed-ACK stall on a keep-alive connection.

Nagle's algorithm on the router's side holds a response's second small write (the body, after
the headers) until the client ACKs the first, and the client delays that ACK by ~40 ms. Every
accepted connection must therefore have `TCP_NODELAY`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from splitserve.router.server import RouterServer
from tests.unit.router.conftest import ServerFactory

ROUND_TRIPS = 12
# The stall is Linux's delayed-ACK timer: at least 40 ms (TCP_DELACK_MIN) on every round trip.
# The fastest of several round trips on a healthy connection takes a few milliseconds even on a
# loaded machine; machine noise only adds time, so the minimum is the robust statistic.
STALL_S = 0.040


def _keep_alive_round_trips(port: int, count: int, *, client_nodelay: bool) -> list[float]:
    """POST `count` times over one connection, headers and body in two writes (like Python
    clients), and return each round trip's duration."""
    body = json.dumps({"model": "test-model", "prompt": "x", "max_tokens": -1}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    times: list[float] = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(client_nodelay))
        reader = sock.makefile("rb")
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(head)
            sock.sendall(body)
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 400"), status
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            assert length > 0
            assert b"max_tokens" in reader.read(length)
            times.append(time.perf_counter() - start)
    return times


def _server_sockets(server: RouterServer) -> list[socket.socket]:
    assert server._http is not None
    conns = server._http.server_state.connections
    return [c.transport.get_extra_info("socket") for c in conns]


async def test_accepted_connections_have_nodelay(make_router: ServerFactory) -> None:
    server = await make_router()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 ")
        socks = _server_sockets(server)
        assert socks
        for sock in socks:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize(
    "client_nodelay",
    [
        pytest.param(True, id="router-nagle"),  # only the router's Nagle can stall
        pytest.param(False, id="client-nagle"),  # the client's body waits for the router's ACK
    ],
)
async def test_keep_alive_round_trip_has_no_delayed_ack_stall(
    make_router: ServerFactory, client_nodelay: bool
) -> None:
    server = await make_router()
    assert server.http_port is not None
    times = await asyncio.to_thread(
        _keep_alive_round_trips, server.http_port, ROUND_TRIPS, client_nodelay=client_nodelay
    )
    # The first round trip runs in the kernel's quick-ACK mode; the stall shows from the second.
    assert min(times[1:]) < STALL_S, f"every keep-alive round trip stalled: {times}"

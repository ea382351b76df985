"""The router's worker channel keeps HTTP/2's receive window small and fixed
(`mux.WORKER_CHANNEL_OPTIONS`), so a `Multiplex` stream coalesces tokens when the router reads
behind and never when it keeps up.

A real `grpc.aio` server runs the worker's `mux.serve` over a fake service whose Decode yields
chunks when the test says so; the client is a channel with the router's options. The test
orders the steps with events (read a message before releasing the next chunk; release every
chunk before reading); the only timing is a 2 ms pause between released chunks when reading
behind, so the worker's writer had the chance to send each and the window is what holds them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpc import aio
from pydantic import ValidationError

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.api.router import PoolSettings
from splitserve.core.channels import FAST_RECONNECT_OPTIONS
from splitserve.core.clock import SystemClock
from splitserve.router import pool_view
from splitserve.router.mux import (
    LINK_WINDOW_BYTES,
    WORKER_CHANNEL_OPTIONS,
    worker_channel_options,
)
from splitserve.security import tls
from splitserve.worker import mux

BIG = list(range(100_000, 102_000))
"""A chunk of 2,000 ids of 3 varint bytes each: ~6 KB, so the 64 KiB window holds ~11."""


class _Service:
    """What `mux.serve` calls: a Decode whose chunks the test releases one by one."""

    def __init__(self) -> None:
        self.release: asyncio.Queue[list[int] | None] = asyncio.Queue()
        self.emitted = 0
        self.done = asyncio.Event()

    async def Decode(  # noqa: N802
        self, _: worker_pb2.DecodeRequest, __: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        while (ids := await self.release.get()) is not None:
            yield common_pb2.TokenChunk(token_ids=ids)
            self.emitted += 1
        yield common_pb2.TokenChunk(finish_reason=common_pb2.FINISH_REASON_LENGTH)
        self.done.set()


class _Servicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, service: _Service) -> None:
        self.service = service

    async def Multiplex(  # noqa: N802
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[worker_pb2.MuxResponse]:
        async for batch in mux.serve(self.service, request_iterator, context):  # type: ignore[arg-type]
            yield batch


async def _open(options: tuple[tuple[str, int], ...]) -> tuple[Any, Any, _Service, Any, Any]:
    service = _Service()
    server = aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(_Servicer(service), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}", options=options)
    call = worker_pb2_grpc.WorkerStub(channel).Multiplex()
    await call.initial_metadata()
    req = worker_pb2.MuxRequest()
    op = req.ops.add()
    op.stream_id = 1
    op.decode.SetInParent()
    await call.write(req)
    return server, channel, service, call, req


async def _messages(call: Any) -> list[list[int]]:
    """Per message until the sub-request's status, the tokens of each of its chunk events."""
    out: list[list[int]] = []
    while True:
        msg = await call.read()
        assert msg is not aio.EOF
        out.append([len(ev.chunk.token_ids) for ev in msg.events if ev.HasField("chunk")])
        if any(ev.HasField("status") for ev in msg.events):
            return out


async def _behind(
    options: tuple[tuple[str, int], ...], n: int, pause_s: float = 0.0
) -> list[list[int]]:
    """`n` big chunks released while the client reads nothing, then read. `pause_s` between
    chunks gives the worker's writer time to send each (0: a loop turn, which on a loaded
    machine may pass before gRPC completes the first write)."""
    server, channel, service, call, _ = await _open(options)
    try:
        for _ in range(n):
            service.release.put_nowait(BIG)
            await asyncio.sleep(pause_s)  # the worker's writer may send between chunks
        service.release.put_nowait(None)
        await service.done.wait()  # every chunk is sent or waiting in the worker's batch
        messages = await _messages(call)
    finally:
        call.cancel()
        await channel.close()
        await server.stop(None)
    assert sum(map(sum, messages)) == n * len(BIG)
    return messages


def test_the_router_channel_keeps_the_fixed_window() -> None:
    assert ("grpc.http2.bdp_probe", 0) in WORKER_CHANNEL_OPTIONS
    assert ("grpc.http2.lookahead_bytes", LINK_WINDOW_BYTES) in WORKER_CHANNEL_OPTIONS


async def test_a_router_that_keeps_up_gets_every_chunk_at_once_alone() -> None:
    server, channel, service, call, _ = await _open(WORKER_CHANNEL_OPTIONS)
    try:
        for i in range(20):
            service.release.put_nowait(BIG if i % 2 else [i])
            msg = await call.read()  # arrives with nothing else released: never held back
            assert [len(ev.chunk.token_ids) for ev in msg.events] == [len(BIG) if i % 2 else 1]
        service.release.put_nowait(None)
        assert await _messages(call) == [[0]]  # the finishing chunk, then the status
    finally:
        call.cancel()
        await channel.close()
        await server.stop(None)


async def test_a_router_that_reads_behind_gets_the_tokens_coalesced() -> None:
    n = 300  # ~1.8 MB: far beyond the window
    # Paused as the window-zero test below is, so the writer had time to send each chunk and
    # what holds them back is the window.
    messages = await _behind(WORKER_CHANNEL_OPTIONS, n, pause_s=0.002)
    # The messages sent before the window filled (a chunk or a few each), then the rest as one
    # (the batch that waited for the window to open), its chunks joined into one by the worker
    # (`worker.mux.merge_into`). With the window grown by gRPC's bandwidth-delay probe instead
    # (its default): ~120 messages, none over ~50 chunks.
    assert len(messages) <= 30, messages
    biggest = max(messages, key=sum)
    assert sum(biggest) >= n // 2 * len(BIG), messages
    assert len(biggest) == 1, messages


async def test_window_zero_is_grpcs_growing_window_and_coalesces_far_less() -> None:
    # `PoolSettings.link_window_bytes: 0` (a router far from its workers): gRPC's defaults.
    assert worker_channel_options(0) == FAST_RECONNECT_OPTIONS
    # A pause per chunk: with the window open the writer sends as chunks come, so what is
    # measured is the window, not whether a loop turn sufficed for a write (a clean-clone run
    # under the vLLM lane's load once saw all 300 chunks queued before the first write: 1
    # message, 2026-11-29).
    messages = await _behind(worker_channel_options(0), 300, pause_s=0.002)
    assert len(messages) > 30, len(messages)


async def test_the_window_setting_is_checked_and_reaches_the_pool_channels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ("grpc.http2.lookahead_bytes", 65536) in worker_channel_options(65536)
    with pytest.raises(ValueError, match="link window"):
        worker_channel_options(-1)
    with pytest.raises(ValidationError, match="link_window_bytes"):
        PoolSettings(link_window_bytes=-1)
    seen: list[object] = []
    opened: list[aio.Channel] = []

    def channel(address: str, options: object = None) -> aio.Channel:
        seen.append(options)
        opened.append(aio.insecure_channel(address))  # never used: no connection is made
        return opened[-1]

    monkeypatch.setattr(tls, "aio_channel", channel)
    monkeypatch.setattr(pool_view.PoolView, "_add", lambda self, eid, *a: eid)
    settings = PoolSettings(link_window_bytes=8192)
    view = pool_view.PoolView([], clock=SystemClock(), settings=settings)
    await view.start()
    view.add("127.0.0.1:1")
    assert seen == [worker_channel_options(8192)]
    await opened[0].close()

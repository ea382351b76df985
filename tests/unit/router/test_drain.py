"""Issue 12 item 4: on shutdown the router stops accepting, lets in-flight requests finish within
the grace period, and cuts the rest with an error (an error event on a stream)."""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import pytest
from grpc import aio

from splitserve._gen.v1 import router_pb2, router_pb2_grpc
from splitserve.core.roles import Role
from splitserve.router.server import RouterServer
from tests.unit.router.conftest import MODEL, ServerFactory, WorkerFactory

BODY = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 6, "stream": True}


async def _events(server: RouterServer, started: asyncio.Event) -> list[str]:
    url = f"http://127.0.0.1:{server.http_port}/v1/completions"
    out: list[str] = []
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", url, json=BODY) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                started.set()
    return out


async def test_in_flight_stream_finishes_within_the_grace_and_new_ones_are_refused(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    hold = asyncio.Event()
    m = await make_worker(Role.MIXED, hold=hold, hold_after=1)
    server = await make_router(m.address)
    started = asyncio.Event()
    stream = asyncio.create_task(_events(server, started))
    await started.wait()
    stopping = asyncio.create_task(server.stop(grace_s=20))
    async with asyncio.timeout(10):
        while True:  # the listener closes first
            try:
                _, w = await asyncio.open_connection("127.0.0.1", server.http_port)
            except OSError:
                break
            w.close()
            await asyncio.sleep(0.02)
    assert not stream.done()
    hold.set()
    events = await stream
    await stopping
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"
    assert "error" not in "".join(events)


async def test_streams_past_the_grace_end_with_an_error_event(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    m = await make_worker(Role.MIXED, hold=asyncio.Event(), hold_after=1)
    server = await make_router(m.address)
    started = asyncio.Event()
    stream = asyncio.create_task(_events(server, started))
    await started.wait()
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        call = stub.Generate(
            router_pb2.RouterGenerateRequest(prompt_token_ids=router_pb2.TokenIds(ids=[1]))
        )
        await anext(aiter(call))
        await server.stop(grace_s=0.3)
        with pytest.raises(aio.AioRpcError) as err:
            _ = [c async for c in call]
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (err.value.details() or "")
    events = await stream
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "router_shutting_down"
    await m.wait_call("Cancel")  # the cut requests are cancelled on the worker

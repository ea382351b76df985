"""The router warms KV pairs: decode-capable workers hear which prefill-capable ones to use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest
from grpc import aio

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.core.clock import SystemClock
from splitserve.core.ids import EndpointId
from splitserve.core.roles import Role
from splitserve.policy.placement import EndpointView
from splitserve.router.kv_warm import KvPairWarmer, warm_plan
from splitserve.router.pool_view import PoolView
from tests.fakes.fake_worker import FakeWorker, Script

from .conftest import FAST_POOL


def _view(eid: str, role: Role, ready: bool = True) -> EndpointView:
    return EndpointView(EndpointId(eid), role, ready=ready, fenced=False, inflight=0)


def test_warm_plan_pairs_every_ready_decoder_with_every_other_ready_prefiller() -> None:
    views = [
        _view("p1", Role.PREFILL),
        _view("p2", Role.PREFILL, ready=False),
        _view("m", Role.MIXED),
        _view("d1", Role.DECODE),
        _view("d2", Role.DECODE, ready=False),
    ]
    assert warm_plan(views) == {"m": ("p1",), "d1": ("p1", "m")}
    assert warm_plan([_view("d", Role.DECODE)]) == {"d": ()}


class _KvFake(worker_pb2_grpc.WorkerKvServicer):
    def __init__(self) -> None:
        self.warm_calls: list[tuple[str, ...]] = []
        self.called = asyncio.Event()

    async def KvEndpoint(  # noqa: N802
        self, request: worker_pb2.KvEndpointRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.KvEndpointResponse:
        return worker_pb2.KvEndpointResponse(transport="nixl", params_json="{}")

    async def WarmKv(  # noqa: N802
        self, request: worker_pb2.WarmKvRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WarmKvResponse:
        self.warm_calls.append(tuple(request.peers))
        self.called.set()
        return worker_pb2.WarmKvResponse(warmed=list(request.peers))


@dataclass
class KvWorker(FakeWorker):
    """A fake worker that also serves WorkerKv (a plain FakeWorker answers UNIMPLEMENTED)."""

    kv: _KvFake = field(default_factory=_KvFake)

    async def start(self, port: int = 0) -> str:
        self._server = aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(self, self._server)
        worker_pb2_grpc.add_WorkerKvServicer_to_server(self.kv, self._server)
        bound = self._server.add_insecure_port(f"127.0.0.1:{port}")
        await self._server.start()
        self.address = f"127.0.0.1:{bound}"
        return self.address


async def _calls(worker: KvWorker, n: int) -> list[tuple[str, ...]]:
    async with asyncio.timeout(10):
        while len(worker.kv.warm_calls) < n:
            worker.kv.called.clear()
            await worker.kv.called.wait()
    return list(worker.kv.warm_calls)


@pytest.fixture
async def workers() -> AsyncIterator[tuple[KvWorker, KvWorker, FakeWorker]]:
    p = KvWorker(Script(role=Role.PREFILL))
    d = KvWorker(Script(role=Role.DECODE))
    sim = FakeWorker(Script(role=Role.DECODE))  # no WorkerKv: UNIMPLEMENTED
    for w in (p, d, sim):
        await w.start()
    yield p, d, sim
    for w in (p, d, sim):
        await w.stop()


async def test_decoders_are_warmed_on_join_after_a_reconnect_and_after_a_flip(
    workers: tuple[KvWorker, KvWorker, FakeWorker],
) -> None:
    p, d, sim = workers  # sim: a decode worker without WorkerKv (UNIMPLEMENTED), ignored
    async with PoolView(
        [p.address, d.address, sim.address], clock=SystemClock(), settings=FAST_POOL
    ) as pool:
        task = asyncio.create_task(KvPairWarmer(pool).run())
        try:
            assert await _calls(d, 1) == [(p.address,)]
            await asyncio.sleep(0.3)  # many load reports later: not told again
            assert d.kv.warm_calls == [(p.address,)]
            assert p.kv.warm_calls == [], "a prefill worker pulls from nobody"

            # The prefill worker goes away and comes back (a restart): warmed again.
            p.break_load_streams()
            assert await _calls(d, 2) == [(p.address,), (p.address,)]

            # Flip: the decode worker prefills, the prefill worker decodes.
            d.script.role, p.script.role = Role.PREFILL, Role.DECODE
            assert await _calls(p, 1) == [(d.address,)]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

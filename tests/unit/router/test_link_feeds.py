"""The load and step feeds on the stream link (`pool.link: stream`): once a worker's first report
names its link port, `WatchLoad` and `WatchStepBatches` run as sub-requests of that link and the
router keeps no gRPC stream to the worker. Real sockets (a scripted worker's gRPC server, its
`worker.link` listener, a TCP relay the test can cut), no timing: every step waits on an event
or a state of the pool's view.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio
from prometheus_client import CollectorRegistry

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.clock import ManualClock, SystemClock
from splitserve.core.ids import EndpointId
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.router.dispatch import Dispatcher
from splitserve.router.mux import StreamLink
from splitserve.router.pool_view import PoolView
from splitserve.worker import link as worker_link
from splitserve.worker import mux
from tests.fakes.fake_worker import FakeWorker, Script
from tests.unit.router.conftest import FAST_POOL, sample

STREAM_POOL = FAST_POOL.model_copy(update={"link": "stream"})
GRPC_POOL = FAST_POOL.model_copy(update={"link": "grpc"})


class _Relay:
    """A TCP relay in front of the worker's link listener: `cut()` resets every connection and
    stops listening (the link is lost and cannot be re-made); `resume()` listens again on the
    same port."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.connections = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers += [writer, up_w]

        async def copy(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await r.read(1 << 16):
                    w.write(data)
            w.close()

        await asyncio.gather(copy(reader, up_w), copy(up_r, writer), return_exceptions=True)

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()

    async def resume(self) -> None:
        await self.start()


class _LinkedWorker(FakeWorker):
    """A scripted worker that serves its link too and advertises it (through `relay`), and
    counts its open gRPC feed streams."""

    def __init__(self, script: Script) -> None:
        super().__init__(script=script)
        self.link_server: asyncio.Server | None = None
        self.relay: _Relay | None = None
        self.grpc_feeds_open = 0
        self.grpc_feeds_closed = asyncio.Event()
        """A gRPC `WatchLoad` or `WatchStepBatches` stream ended (the test clears it)."""
        self.grpc_step_feeds = 0
        self.link_load_feeds = 0

    async def start_link(self) -> None:
        self.link_server, port = await worker_link.start(self, "127.0.0.1", 0)  # type: ignore[arg-type]
        self.relay = _Relay(port)
        await self.relay.start()

    async def stop(self) -> None:
        if self.relay is not None and self.relay._server is not None:
            with contextlib.suppress(Exception):
                await self.relay.cut()
        if self.link_server is not None:
            self.link_server.close()
        await super().stop()

    def _report(self) -> common_pb2.LoadReport:
        report = super()._report()
        report.link_port = self.relay.port if self.relay is not None else 0
        return report

    async def _counted(self, feed: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        grpc_call = not isinstance(context, mux.SubContext)  # else: a sub-request of the link
        self.grpc_feeds_open += grpc_call
        try:
            async for item in feed:
                yield item
        finally:
            if grpc_call:
                self.grpc_feeds_open -= 1
                self.grpc_feeds_closed.set()

    async def WatchLoad(  # noqa: N802
        self, request: worker_pb2.WatchLoadRequest, context: Any
    ) -> AsyncIterator[common_pb2.LoadReport]:
        if isinstance(context, mux.SubContext):
            self.link_load_feeds += 1
        async for report in self._counted(super().WatchLoad(request, context), context):
            yield report

    async def WatchStepBatches(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSampleBatch]:
        if not isinstance(context, mux.SubContext):
            self.grpc_step_feeds += 1
        async for batch in self._counted(super().WatchStepBatches(request, context), context):
            yield batch


async def _worker(**script: Any) -> _LinkedWorker:
    script.setdefault("step_every_s", 0.02)  # a worker that reports steps: two feeds
    w = _LinkedWorker(Script(role=Role.DECODE, **script))
    await w.start()
    await w.start_link()
    return w


def _on_link(pool: PoolView, eid: str) -> bool:
    """Both feeds are open on the worker's stream link, and the worker has answered on it."""
    link = pool.feed_link(eid)
    return isinstance(link, StreamLink) and len(link._subs) == 2 and link._confirmed


async def _until(predicate: Any, timeout_s: float = 10.0) -> None:
    """Yield to the loop until `predicate()` holds (state reached through the sockets)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 - counts of the fake worker and the latency book
            await asyncio.sleep(0.005)


async def test_both_feeds_move_onto_the_link_and_updates_reach_the_view() -> None:
    w = await _worker(num_running=1)
    try:
        async with PoolView([w.address], clock=SystemClock(), settings=STREAM_POOL) as pool:
            await pool.wait_for(lambda pv: _on_link(pv, w.address), 10)
            # the first report came over gRPC (it names the port); that stream then ended
            await _until(lambda: w.grpc_feeds_open == 0)
            assert len(w.requests("WatchLoad")) == 2  # once over gRPC, once on the link
            assert w.link_load_feeds == 1
            assert w.grpc_step_feeds == 0  # the step feed started on the link
            assert w.relay is not None
            assert w.relay.connections == 1  # one socket for both
            # a change on the worker reaches the view through the link
            w.script.num_running = 7
            await pool.wait_for(lambda pv: pv.view(w.address).num_running == 7, 10)
            # and steps reach the latency model through it
            await _until(lambda: pool.latency.step_age_s(EndpointId(w.address)) is not None)
            assert w.grpc_feeds_open == 0
            assert w.relay.connections == 1
    finally:
        await w.stop()


async def test_the_dispatcher_shares_the_pools_links() -> None:
    w = await _worker()
    try:
        async with PoolView([w.address], clock=SystemClock(), settings=STREAM_POOL) as pool:
            d = Dispatcher(pool, clock=SystemClock(), metrics=RouterMetrics(CollectorRegistry()))
            assert d.links is pool.links
            await pool.wait_for(lambda pv: _on_link(pv, w.address), 10)
            assert d.links is not None
            link = d.links.get(w.address, pool.stub(w.address), pool.link_port(w.address))
            assert link is not None
            assert link is pool.feed_link(w.address)
            req = worker_pb2.DecodeRequest(request_id="r")
            req.sampling.max_tokens = 4
            sub = link.stream("decode", req, None, None)
            ids: list[int] = []
            while (chunk := await sub.read()) is not aio.EOF:
                ids.extend(chunk.token_ids)
            assert len(ids) == 3  # max_tokens less the first token (the prefill's)
            assert w.requests("Decode")
            assert w.relay is not None
            assert w.relay.connections == 1
            await d.close()  # not the pool's links: the feeds stay up
            assert _on_link(pool, w.address)
    finally:
        await w.stop()


async def test_grpc_link_keeps_the_grpc_feeds() -> None:
    w = await _worker()
    try:
        async with PoolView([w.address], clock=SystemClock(), settings=GRPC_POOL) as pool:
            assert pool.links is None
            await pool.wait_for(lambda pv: pv.view(w.address).ready, 10)
            await _until(lambda: pool.latency.step_age_s(EndpointId(w.address)) is not None)
            assert pool.feed_link(w.address) is None
            assert w.grpc_feeds_open == 2
            assert w.link_load_feeds == 0
    finally:
        await w.stop()


async def test_the_link_lost_makes_the_endpoint_not_ready_until_it_is_back() -> None:
    w = await _worker(num_running=3)
    try:
        async with PoolView([w.address], clock=SystemClock(), settings=STREAM_POOL) as pool:
            await pool.wait_for(lambda pv: _on_link(pv, w.address), 10)
            assert pool.view(w.address).ready
            assert w.relay is not None
            await w.relay.cut()
            # as a broken gRPC feed: not ready (no report can come), re-tried with back-off
            await pool.wait_for(lambda pv: not pv.view(w.address).ready, 10)
            w.script.num_running = 9
            await w.relay.resume()
            await pool.wait_for(lambda pv: _on_link(pv, w.address), 10)
            await pool.wait_for(lambda pv: pv.view(w.address).num_running == 9, 10)
            assert pool.view(w.address).ready
            assert w.relay.connections >= 2
    finally:
        await w.stop()


async def test_a_report_gone_stale_on_a_live_link_falls_back_and_counts() -> None:
    """Item 5's fallback reads the same view: reports that stop coming while the link stays up
    (here: the router's clock moved on past `stale_after_s`) turn into the router's own view,
    counted, not into a not-ready endpoint."""
    w = await _worker(num_running=4)
    clock = ManualClock()
    registry = CollectorRegistry()
    try:
        async with PoolView(
            [w.address], clock=clock, settings=STREAM_POOL, metrics=RouterMetrics(registry)
        ) as pool:
            await pool.wait_for(lambda pv: _on_link(pv, w.address), 10)
            await pool.wait_for(lambda pv: pv.view(w.address).num_running == 4, 10)
            clock.advance(STREAM_POOL.stale_after_s + 1)
            view = pool.view(w.address)  # no await since the clock moved: no report came
            assert view.ready
            assert view.num_running == 0  # the router's own view (nothing in flight)
            name = "splitserve_router_stale_load_fallbacks_total"
            assert sample(registry, name, role="decode") == 1
    finally:
        await w.stop()


async def test_a_worker_without_the_feed_ops_keeps_its_grpc_feeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker whose link predates the feed ops answers them INVALID_ARGUMENT (an op it cannot
    read): the pool stays on its gRPC feed, and says so once."""
    w = await _worker()

    async def old_link_serve(service: Any, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for batch in requests:
            yield worker_pb2.MuxResponse(
                events=[
                    worker_pb2.MuxEvent(
                        stream_id=op.stream_id,
                        status=worker_pb2.MuxStatus(
                            code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                            details="mux op with no operation",
                        ),
                    )
                    for op in batch.ops
                ]
            )

    monkeypatch.setattr(mux, "serve", old_link_serve)  # what `worker.link` runs
    try:
        async with PoolView([w.address], clock=SystemClock(), settings=STREAM_POOL) as pool:
            await pool.wait_for(
                lambda pv: pv._endpoints[EndpointId(w.address)].link_feeds is False, 10
            )
            await pool.wait_for(lambda pv: pv.view(w.address).ready, 10)
            await _until(lambda: w.grpc_feeds_open == 2)  # load and steps
            assert pool.feed_link(w.address) is None
    finally:
        await w.stop()

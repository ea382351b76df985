"""The pool view against real gRPC load streams from fake workers."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from grpc import aio
from prometheus_client import CollectorRegistry

from splitserve._gen.v1 import worker_pb2_grpc
from splitserve.api.router import PoolSettings
from splitserve.core.clock import ManualClock, SystemClock
from splitserve.core.ids import EndpointId
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import EndpointView
from splitserve.router import pool_view
from splitserve.router.pool_view import PoolView, UnknownEndpoint
from splitserve.security import tls
from splitserve.security.ca import local_pki
from tests.fakes.fake_worker import FakeWorker, Script
from tests.unit.router.conftest import FAST_POOL, MODEL, StackFactory, WorkerFactory, sample


def _ready(pool: PoolView, eid: str) -> bool:
    return pool.view(eid).ready


def _took_report(eid: str, seq: int) -> Callable[[PoolView], bool]:
    """Whether the pool took a report of `eid` after the one numbered `seq`."""

    def took(pool: PoolView) -> bool:
        report = pool._get(eid).report
        return report is not None and report.seq > seq

    return took


async def test_reports_become_views(make_worker: WorkerFactory) -> None:
    p = await make_worker(Role.PREFILL, kv_blocks_free=123, num_running=4)
    d = await make_worker(Role.DECODE)
    registry = CollectorRegistry()
    async with PoolView(
        [p.address, d.address],
        clock=SystemClock(),
        settings=FAST_POOL,
        metrics=RouterMetrics(registry),
    ) as pool:
        assert not any(v.ready for v in pool.views())  # nothing heard yet
        await pool.wait_for(lambda pv: all(v.ready for v in pv.views()), 10)
        views: dict[str, EndpointView] = {v.id: v for v in pool.views()}
        assert views[p.address].role is Role.PREFILL
        assert views[p.address].kv_free_blocks == 123
        assert views[p.address].kv_total_blocks == 1000
        assert views[p.address].num_running == 4
        assert views[d.address].role is Role.DECODE
        assert pool.ids() == sorted([p.address, d.address])
        assert sample(registry, "splitserve_router_endpoints", role="prefill", state="ready") == 1
        assert sample(registry, "splitserve_router_endpoints", role="decode", state="ready") == 1


async def test_fence_and_inflight(make_worker: WorkerFactory) -> None:
    d = await make_worker(Role.DECODE)
    async with PoolView([d.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: _ready(pv, d.address), 10)
        pool.fence(d.address)
        assert not pool.view(d.address).accepts_work
        assert pool.view(d.address).ready
        pool.unfence(d.address)
        assert pool.view(d.address).accepts_work
        pool.acquire(d.address)
        pool.acquire(d.address)
        pool.release(d.address)
        assert pool.view(d.address).inflight == 1
        pool.release(d.address)
        pool.release(d.address)  # never below zero
        assert pool.view(d.address).inflight == 0
        with pytest.raises(UnknownEndpoint):
            pool.fence("10.0.0.1:1")


async def test_draining_worker_does_not_accept_work(make_worker: WorkerFactory) -> None:
    d = await make_worker(Role.DECODE, draining=True)
    async with PoolView([d.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: _ready(pv, d.address), 10)
        assert pool.view(d.address).draining
        assert not pool.view(d.address).accepts_work


async def test_add_and_remove_at_run_time(make_worker: WorkerFactory) -> None:
    a = await make_worker(Role.DECODE)
    b = await make_worker(Role.MIXED)
    async with PoolView([a.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        assert pool.add(b.address) == b.address
        assert pool.add(b.address) == b.address  # idempotent
        await pool.wait_for(
            lambda pv: len(pv.views()) == 2 and all(v.ready for v in pv.views()), 10
        )
        await pool.remove(a.address)
        await pool.remove(a.address)  # unknown now: ignored
        assert [v.id for v in pool.views()] == [b.address]
        with pytest.raises(UnknownEndpoint):
            pool.stub(a.address)


async def test_reconnects_after_the_worker_comes_back(make_worker: WorkerFactory) -> None:
    d = await make_worker(Role.DECODE)
    port = int(d.address.rsplit(":", 1)[1])
    async with PoolView([d.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: _ready(pv, d.address), 10)
        await d.stop()
        await pool.wait_for(lambda pv: not _ready(pv, d.address), 10)
        await d.start(port)
        await pool.wait_for(lambda pv: _ready(pv, d.address), 10)


async def test_reopens_a_load_stream_that_ends(make_worker: WorkerFactory) -> None:
    d = await make_worker(Role.DECODE)
    async with PoolView([d.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: _ready(pv, d.address), 10)
        assert len(d.requests("WatchLoad")) == 1
        d.event("WatchLoad").clear()
        d.break_load_streams()
        await d.wait_call("WatchLoad")
        assert len(d.requests("WatchLoad")) == 2
        await pool.wait_for(lambda pv: _ready(pv, d.address), 10)


async def test_stale_reports_fall_back_to_the_routers_own_view(
    make_worker: WorkerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 17 item 5: a stale report (stream still up) never silently makes a worker
    unusable: the router places on its own in-flight and reserved work, says so at WARNING
    and counts it."""
    d = await make_worker(Role.DECODE)
    clock = ManualClock(100.0)
    settings = PoolSettings(load_interval_s=60.0, stale_after_s=2.0)  # one report, then quiet
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    async with PoolView([d.address], clock=clock, settings=settings, metrics=metrics) as pool:
        await pool.wait_for(lambda pv: _ready(pv, d.address), 10)
        eid = EndpointId(d.address)
        pool.ledger.reserve(
            eid,
            "r1",
            prefill=False,
            num_prompt_tokens=20,
            predicted_output_tokens=12,
            block_size=16,
        )
        clock.advance(1.9)
        fresh = pool.view(d.address)
        assert fresh.ready
        assert not fresh.stale
        assert fresh.inflight == 1
        clock.advance(0.2)
        with caplog.at_level(logging.WARNING, logger="splitserve.router.pool_view"):
            stale = pool.view(d.address)
            pool.view(d.address)  # logged and counted once per episode
        assert stale.ready
        assert stale.accepts_work
        assert stale.stale  # placement ranks it after every fresh worker
        assert stale.inflight == 1  # the router's own view
        assert stale.num_running == 0
        assert stale.num_waiting == 0
        assert stale.kv_free_blocks == fresh.kv_total_blocks - 2
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert "own view" in caplog.records[0].getMessage()
        value = registry.get_sample_value(
            "splitserve_router_stale_load_fallbacks_total", {"role": "decode"}
        )
        assert value == 1


async def test_unreachable_address_is_never_ready() -> None:
    async with PoolView(["127.0.0.1:1"], clock=SystemClock(), settings=FAST_POOL) as pool:
        [view] = pool.views()
        assert not view.ready
        assert not view.accepts_work


async def test_add_before_start_is_an_error() -> None:
    pool = PoolView([], clock=SystemClock())
    with pytest.raises(RuntimeError, match="before start"):
        pool.add("127.0.0.1:1")


async def test_pull_rate_from_the_reports_and_pending_pulls_from_the_ledger(
    make_worker: WorkerFactory,
) -> None:
    """A decode worker's view carries the pull rate fitted from the growth of its reported pull
    totals (0 until two samples) and the prompt tokens of the split requests placed on it whose
    pull has not finished."""
    d = await make_worker(Role.DECODE)
    async with PoolView([d.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: pv.view(d.address).ready, 10)
        assert pool.view(d.address).kv_pull_tokens_per_s == 0.0  # no pull yet: no estimate
        for n in (1, 2):  # each: 2,000 more tokens pulled in 0.1 s more
            d.script.kv_pulled_tokens, d.script.kv_pull_seconds = 2000 * n, 0.1 * n
            await pool.wait_for(_took_report(d.address, d._seq), 10)
        assert pool.view(d.address).kv_pull_tokens_per_s == pytest.approx(20_000)
        pool.ledger.reserve(EndpointId(d.address), "a", prefill=False, num_prompt_tokens=700,
                            predicted_output_tokens=4, block_size=16, pulls=True)  # fmt: skip
        assert pool.view(d.address).pending_pull_tokens == 700


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[dict[str, Path]]:
    yield local_pki(tmp_path, "svc", now=dt.datetime.now(dt.UTC))
    tls.configure(None)


async def _tls_worker(pki: dict[str, Path]) -> tuple[aio.Server, FakeWorker]:
    """A fake decode worker serving mutual TLS; this process then connects in plaintext."""
    tls.configure(pki["worker"])
    server = aio.server()
    worker = FakeWorker(Script(role=Role.DECODE))
    worker_pb2_grpc.add_WorkerServicer_to_server(worker, server)
    worker.address = f"127.0.0.1:{tls.add_port(server, '127.0.0.1:0')}"
    await server.start()
    tls.configure(None)  # the router: no --tls-dir
    return server, worker


async def test_a_plaintext_router_against_a_tls_worker_says_why_it_is_not_ready(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool waited on `WatchLoad(wait_for_ready=True)` in silence: the router answered 503
    "not ready (no live load stream)" and logged nothing. Now a WARNING names the worker and
    the connection error, rate-limited on the pool's clock (not once per retry), and the
    reason is kept for the 503."""
    monkeypatch.setattr(pool_view, "UNREACHABLE_RECHECK_S", 0.02)  # looked at often
    server, worker = await _tls_worker(pki)
    address = worker.address
    clock = ManualClock(100.0)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    async def checked(n: int) -> None:
        async with asyncio.timeout(10):
            while ep.unreachable_checks < n:  # noqa: ASYNC110 - no event for it
                await asyncio.sleep(0.01)

    try:
        with caplog.at_level(logging.WARNING, logger="splitserve.router.pool_view"):
            async with PoolView([address], clock=clock, settings=FAST_POOL) as pool:
                await pool.wait_for(lambda pv: bool(pv.unreachable()), 10)
                assert not pool.view(address).ready
                assert list(pool.unreachable()) == [address]
                assert address in pool.unreachable_text()
                assert "UNAVAILABLE" in pool.unreachable_text()
                ep = pool._get(address)
                await checked(ep.unreachable_checks + 3)
                assert len(warnings()) == 1  # seen failing again, the clock not moved
                clock.advance(pool_view.UNREACHABLE_LOG_EVERY_S)
                await checked(ep.unreachable_checks + 2)
                assert len(warnings()) == 2
        first = warnings()[0]
        assert address in first
        assert "unreachable" in first
        assert "TRANSIENT_FAILURE" in first
        assert "--tls-dir" in first
    finally:
        await server.stop(None)


async def test_the_503_and_ready_count_the_unreachable_workers_and_the_log_names_them(
    pki: dict[str, Path], make_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A client (the open `/ready`, a tenant's 503) learns how many workers are unreachable,
    not their addresses or connection errors (they named both); the router's log does."""
    server, worker = await _tls_worker(pki)
    try:
        stack = await make_stack(worker, wait=False)
        await stack.pool.wait_for(lambda pv: bool(pv.unreachable()), 10)
        caplog.clear()
        async with stack.client() as client:
            ready = await client.get("/ready")
            r = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
            )
        host = worker.address.rsplit(":", 1)[0]
        for resp in (ready, r):
            assert resp.status_code == 503
            message = resp.json()["error"]["message"]
            assert "1 worker unreachable (the router's log names them)" in message
            assert host not in message
            assert "UNAVAILABLE" not in message
        logged = [m for rec in caplog.records if "no worker can take" in (m := rec.getMessage())]
        assert logged
        assert f"unreachable: {worker.address} (UNAVAILABLE" in logged[-1]
    finally:
        await server.stop(None)

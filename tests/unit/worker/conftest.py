"""In-process workers: a real SimEngine behind a real grpc.aio server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from splitserve._gen.v1 import worker_pb2_grpc
from splitserve.core.clock import SystemClock
from splitserve.core.roles import Role
from splitserve.obs.metrics import WorkerMetrics
from splitserve.worker.kv_warm import KvWarmService
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine
from splitserve.worker.server import WorkerIdentity, WorkerService, bind, start


@dataclass
class RunningWorker:
    service: WorkerService
    stub: worker_pb2_grpc.WorkerStub
    address: str
    registry: CollectorRegistry
    server: grpc.aio.Server

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


WorkerFactory = Callable[..., Coroutine[Any, Any, RunningWorker]]


@pytest.fixture
async def make_worker() -> AsyncIterator[WorkerFactory]:
    cleanups: list[Callable[[], Coroutine[Any, Any, None]]] = []

    async def factory(role: Role = Role.MIXED, **overrides: Any) -> RunningWorker:
        params: dict[str, Any] = {
            "sim_time_scale": 0.05,
            "sim_num_kv_blocks": 512,
            "vocab_size": 1000,
        }
        params.update(overrides)
        cfg = WorkerConfig(role=role, **params)
        server, port = bind("127.0.0.1", 0)
        address = f"127.0.0.1:{port}"
        release = _ReleaseClient()
        registry = CollectorRegistry()
        metrics = WorkerMetrics(registry)
        engine = build_sim_engine(cfg, address, release, metrics)
        service = WorkerService(
            engine, role, WorkerIdentity(address, address), metrics, SystemClock()
        )
        await engine.start()
        await start(server, service)
        channel = grpc.aio.insecure_channel(address)

        async def cleanup() -> None:
            await channel.close()
            await server.stop(None)
            await engine.stop()
            await release.close()

        cleanups.append(cleanup)
        return RunningWorker(
            service, worker_pb2_grpc.WorkerStub(channel), address, registry, server
        )

    yield factory
    for c in reversed(cleanups):
        await c()


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    """`await serve(engine[, warm_up_ms])`: a `KvWarmService` for `engine` behind a real
    grpc.aio server on 127.0.0.1; its address. Closed and stopped after the test."""
    servers: list[grpc.aio.Server] = []
    services: list[KvWarmService] = []

    async def start(engine: Any, warm_up_ms: int | None = None) -> str:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        service = KvWarmService(engine, f"127.0.0.1:{port}", warm_up_ms)
        worker_pb2_grpc.add_WorkerKvServicer_to_server(service, server)
        await server.start()
        servers.append(server)
        services.append(service)
        return f"127.0.0.1:{port}"

    yield start
    for service in services:
        await service.close()
    for server in servers:
        await server.stop(None)

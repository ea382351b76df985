"""A real router (`RouterServer`, its HTTP port) over real simulated workers (gRPC servers with the
sim engine), in this process: the same components `splitserve up` runs, without a process per
worker (the machine these run on is small)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from tests.unit.worker.conftest import RunningWorker, WorkerFactory, make_worker

from splitserve.api.router import PlacementSettings, PoolSettings, RouterConfig, SloSettings
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import build_default_tokenizer

__all__ = ["make_worker"]

RouterFactory = Callable[..., Coroutine[Any, Any, tuple[RouterServer, str]]]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_default_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
async def make_router(tokenizer_dir: Path) -> AsyncIterator[RouterFactory]:
    servers: list[RouterServer] = []

    async def factory(
        workers: list[RunningWorker],
        slo: SloSettings | None = None,
        placement: PlacementSettings | None = None,
    ) -> tuple[RouterServer, str]:
        config = RouterConfig(
            model_name="m",
            tokenizer_dir=str(tokenizer_dir),
            worker_addresses=tuple(w.address for w in workers),
            http_host="127.0.0.1",
            http_port=0,
            grpc_port=None,
            pool=PoolSettings(load_interval_s=0.05),
            slo=slo or SloSettings(),
            placement=placement or PlacementSettings(),
        )
        server = RouterServer(config)
        servers.append(server)
        await server.start()
        await server.pool.wait_for(lambda pool: all(v.ready for v in pool.views()), 20)
        return server, f"http://127.0.0.1:{server.http_port}/v1"

    yield factory
    for s in servers:
        await s.stop()


def sample(server: RouterServer, name: str, **labels: str) -> float:
    value = server.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


__all__ += ["RouterFactory", "WorkerFactory", "sample"]

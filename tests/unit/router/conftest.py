"""Router test fixtures: the default tokenizer (built once), fake workers, an in-process router."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from splitserve.api.router import (
    DispatchSettings,
    PlacementSettings,
    PoolSettings,
    RouterConfig,
    SloSettings,
)
from splitserve.core.clock import SystemClock
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.router.dispatch import Dispatcher, default_decider
from splitserve.router.generation import Generator
from splitserve.router.openai_api import EdgeApp, create_app
from splitserve.router.pool_view import PoolView
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import TextTokenizer, build_default_tokenizer
from tests.fakes.fake_worker import FakeWorker, Script

MODEL = "test-model"
FAST_POOL = PoolSettings(
    load_interval_s=0.05, stale_after_s=5.0, reconnect_min_s=0.01, reconnect_max_s=0.1
)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_default_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tokenizer_dir)


WorkerFactory = Callable[..., Coroutine[Any, Any, FakeWorker]]


@pytest.fixture
async def make_worker() -> AsyncIterator[WorkerFactory]:
    """Start fake workers: `await make_worker(Role.PREFILL, prefill_abort=...)`."""
    started: list[FakeWorker] = []

    async def factory(role: Role = Role.DECODE, **script: Any) -> FakeWorker:
        worker = FakeWorker(Script(role=role, **script))
        await worker.start()
        started.append(worker)
        return worker

    yield factory
    for worker in started:
        await worker.stop()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@dataclass
class Stack:
    """A router without its ports: pool view, dispatcher, generator, the ASGI app."""

    pool: PoolView
    dispatcher: Dispatcher
    generator: Generator
    app: EdgeApp
    registry: CollectorRegistry
    workers: list[FakeWorker] = field(default_factory=list)

    def sample(self, name: str, **labels: str) -> float:
        return sample(self.registry, name, **labels)

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://router")

    async def wait_ready(self, num: int | None = None) -> None:
        want = len(self.workers) if num is None else num
        await self.pool.wait_for(lambda p: sum(v.ready for v in p.views()) >= want, 10)


StackFactory = Callable[..., Coroutine[Any, Any, Stack]]


@pytest.fixture
async def make_stack(tokenizer: TextTokenizer) -> AsyncIterator[StackFactory]:
    """Build a router over the given fake workers and wait until they are all ready."""
    stacks: list[Stack] = []

    async def factory(
        *workers: FakeWorker,
        max_model_len: int = 4096,
        default_max_tokens: int = 256,
        dispatch: DispatchSettings | None = None,
        slo: SloSettings | None = None,
        placement: PlacementSettings | None = None,
        wait: bool = True,
    ) -> Stack:
        clock = SystemClock()
        registry = CollectorRegistry()
        metrics = RouterMetrics(registry)
        pool = PoolView(
            [w.address for w in workers], clock=clock, settings=FAST_POOL, metrics=metrics
        )
        await pool.start()
        dispatcher = Dispatcher(
            pool,
            clock=clock,
            metrics=metrics,
            settings=dispatch,
            slo=slo,
            decider=None if placement is None else default_decider(placement, pool.ledger),
        )
        generator = Generator(
            dispatcher,
            tokenizer,
            clock=clock,
            max_model_len=max_model_len,
            default_max_tokens=default_max_tokens,
        )
        app = create_app(
            generator, pool, model_name=MODEL, registry=registry, unix_time=lambda: 1_700_000_000.0
        )
        stack = Stack(pool, dispatcher, generator, app, registry, list(workers))
        stacks.append(stack)
        if wait:
            await stack.wait_ready()
        return stack

    yield factory
    for stack in stacks:
        await stack.dispatcher.drain_background()
        await stack.dispatcher.close()
        await stack.pool.close()


ServerFactory = Callable[..., Coroutine[Any, Any, RouterServer]]


@pytest.fixture
async def make_router(
    tokenizer: TextTokenizer, tokenizer_dir: Path
) -> AsyncIterator[ServerFactory]:
    servers: list[RouterServer] = []

    async def factory(*addresses: str, **overrides: Any) -> RouterServer:
        config = RouterConfig(
            model_name=MODEL,
            tokenizer_dir=str(tokenizer_dir),
            worker_addresses=addresses,
            http_host="127.0.0.1",
            http_port=0,
            grpc_host="127.0.0.1",
            grpc_port=0,
            pool=FAST_POOL,
            **overrides,
        )
        server = RouterServer(config, tokenizer=tokenizer)
        await server.start()
        servers.append(server)
        await server.pool.wait_for(lambda p: all(v.ready for v in p.views()), 10)
        return server

    yield factory
    for server in servers:
        await server.stop(grace_s=1)

"""A real router in front of real simulated workers (in-process): the worker's verdicts reach
the client as the right HTTP status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from splitserve.api.router import PoolSettings, RouterConfig
from splitserve.core.roles import Role
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import build_default_tokenizer
from tests.unit.worker.conftest import WorkerFactory


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_default_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
async def small_stack(
    make_worker: WorkerFactory, tokenizer_dir: Path
) -> AsyncIterator[tuple[RouterServer, str]]:
    # 4 blocks x 16 tokens: a 64-token KV cache, far below the router's max_model_len.
    p = await make_worker(Role.PREFILL, sim_num_kv_blocks=4, block_size=16)
    d = await make_worker(Role.DECODE, sim_num_kv_blocks=4, block_size=16)
    config = RouterConfig(
        model_name="m",
        tokenizer_dir=str(tokenizer_dir),
        worker_addresses=(p.address, d.address),
        http_host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        pool=PoolSettings(load_interval_s=0.02),
    )
    server = RouterServer(config)
    await server.start()
    await server.pool.wait_for(lambda pool: all(v.ready for v in pool.views()), 10)
    try:
        yield server, f"http://127.0.0.1:{server.http_port}/v1"
    finally:
        await server.stop()


async def test_request_larger_than_the_kv_cache_is_a_400(
    small_stack: tuple[RouterServer, str],
) -> None:
    _, base = small_stack
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            f"{base}/completions", json={"model": "m", "prompt": "word " * 100, "max_tokens": 8}
        )
        assert r.status_code == 400, r.text
        assert "at most 64" in r.json()["error"]["message"]
        ok = await client.post(
            f"{base}/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4}
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["usage"]["completion_tokens"] == 4

"""vLLM's `kv_transfer_params` on stock `vllm serve` backends come only from the prefill server:
a client's own `kv_transfer_params` is a 400 naming the field and reaches no backend, and the
decode server gets exactly what the prefill server returned (docs/security.md, "KV handles")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from splitserve.api.backends import parse_backend_flag
from splitserve.api.router_edge import EdgeSettings
from splitserve.router.http_backend import protocol
from splitserve.router.server import RouterServer
from tests.fakes.fake_vllm_http import FakeVllm
from tests.unit.router.conftest import MODEL, ServerFactory

PROMPT = "Whose KV is this, and who said where to pull it from?"
FORGED = {
    "do_remote_prefill": True,
    "remote_engine_id": "engine-x",
    "remote_block_ids": [0, 1, 2],
    "remote_host": "169.254.169.254",
    "remote_port": 80,
    "remote_request_id": "someone-elses-request",
}


@pytest.fixture
async def pd() -> AsyncIterator[tuple[FakeVllm, FakeVllm]]:
    p, d = FakeVllm(model="m"), FakeVllm(model="m")
    await p.start()
    await d.start()
    yield p, d
    await p.stop()
    await d.stop()


async def _router(make_router: ServerFactory, p: FakeVllm, d: FakeVllm, **kw: Any) -> RouterServer:
    backends = (parse_backend_flag(f"prefill={p.url}"), parse_backend_flag(f"decode={d.url}"))
    server = await make_router(backends=backends, **kw)
    await server.pool.wait_for(lambda pool: sum(v.ready for v in pool.views()) == 2, timeout_s=20)
    return server


async def _complete(server: RouterServer, **extra_body: Any) -> Any:
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0
    ) as client:
        return await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, extra_body=extra_body
        )


async def test_a_clients_kv_transfer_params_are_a_400_naming_the_field(
    make_router: ServerFactory, pd: tuple[FakeVllm, FakeVllm]
) -> None:
    p, d = pd
    server = await _router(make_router, p, d)
    with pytest.raises(openai.BadRequestError) as err:
        await _complete(server, kv_transfer_params=FORGED)
    body = err.value.body
    assert isinstance(body, dict)
    assert body["param"] == "kv_transfer_params"
    assert p.calls == []
    assert d.calls == []


async def test_only_the_prefill_servers_params_reach_the_decode_server(
    make_router: ServerFactory, pd: tuple[FakeVllm, FakeVllm]
) -> None:
    p, d = pd
    # Even where unknown fields are dropped rather than refused, the client's params go nowhere.
    server = await _router(make_router, p, d, edge=EdgeSettings(allow_unknown_fields=True))
    out = await _complete(server, kv_transfer_params=FORGED)
    assert out.usage.completion_tokens == 6
    assert p.calls == ["prefill"]
    assert d.calls == ["decode"]
    assert p.bodies[0]["kv_transfer_params"] == dict(protocol.PREFILL_KV_PARAMS)
    sent = d.bodies[0]["kv_transfer_params"]
    assert sent["remote_host"] == p.host
    assert sent["remote_port"] == p.port
    assert sent["remote_engine_id"] == f"engine-{p.port}"
    assert d.pulls == 1
    assert p.held == {}

"""HEAD on a GET route answers like GET without a body (RFC 9110 9.3.2: a server that supports
GET should support HEAD); the 405 of a GET-only route names HEAD in `Allow`.

Before the fix every HEAD was a 405 (`Allow: GET`): load balancers and uptime probes that check
`HEAD /health` marked the router down.
"""

from __future__ import annotations

import httpx
import pytest

from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, ServerFactory, StackFactory, WorkerFactory

GET_ROUTES = ["/health", "/ready", "/v1/models", f"/v1/models/{MODEL}", "/version", "/ping",
              "/openapi.json", "/metrics"]  # fmt: skip


@pytest.mark.parametrize("path", GET_ROUTES)
async def test_head_answers_like_get_without_a_body(
    make_worker: WorkerFactory, make_stack: StackFactory, path: str
) -> None:
    stack = await make_stack(await make_worker(Role.MIXED))
    async with stack.client() as client:
        got = await client.get(path)
        head = await client.head(path)
    assert head.status_code == got.status_code == 200
    assert head.content == b""
    assert head.headers.get("content-type") == got.headers.get("content-type")
    if path != "/metrics":  # (its numbers move between the two requests)
        assert head.headers["content-length"] == got.headers["content-length"]


async def test_head_keeps_gets_error_status(make_stack: StackFactory) -> None:
    stack = await make_stack()  # no worker: /ready is 503
    async with stack.client() as client:
        head = await client.head("/ready")
        missing = await client.head("/v1/models/another-model")
    assert head.status_code == 503
    assert head.content == b""
    assert missing.status_code == 404


async def test_head_on_a_post_route_is_a_405_naming_head(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with stack.client() as client:
        r = await client.head("/v1/completions")
        delete = await client.delete("/v1/models")
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"
    assert delete.status_code == 405
    assert delete.headers["allow"] == "GET, HEAD"
    assert delete.json()["error"]["message"] == "Invalid URL (DELETE /v1/models)"


async def test_head_over_the_routers_own_http_server(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    m = await make_worker(Role.MIXED)
    server = await make_router(m.address)
    base = f"http://127.0.0.1:{server.http_port}"
    async with httpx.AsyncClient(base_url=base) as client:
        head = await client.head("/v1/models")
        after = await client.get("/health")  # the connection is still usable
    assert head.status_code == 200
    assert head.content == b""
    assert int(head.headers["content-length"]) > 0
    assert after.status_code == 200

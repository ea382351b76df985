"""HTTP semantics of the OpenAI face beyond the bodies."""

from __future__ import annotations

import pytest

from tests.unit.router.conftest import StackFactory

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", CHAT, "POST"),
        ("PUT", COMPLETIONS, "POST"),
        ("DELETE", "/v1/models", "GET"),
        ("POST", "/metrics", "GET"),
    ],
)
async def test_405_names_the_allowed_methods(
    make_stack: StackFactory, method: str, path: str, allowed: str
) -> None:
    # RFC 9110 15.5.6: a 405 MUST carry `Allow`. Before the fix the OpenAI error handler rebuilt
    # the response from the status and message only and dropped Starlette's `Allow` header.
    stack = await make_stack()
    async with stack.client() as client:
        r = await client.request(method, path)
    assert r.status_code == 405
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers.get("allow") == allowed

"""A JSON body sent with another Content-Type is a 415 naming it (as vLLM's server refuses a
non-JSON media type); no Content-Type at all is read as JSON, and `application/json` may carry
parameters (`; charset=utf-8`) or be a `+json` type.

Before the fix any Content-Type was served: `text/plain` or a form type got a 200.
"""

from __future__ import annotations

import json

import pytest

from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

CHAT = "/v1/chat/completions"
BODIES = {
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
    "/v1/completions": {"model": MODEL, "prompt": "x", "max_tokens": 2},
    "/tokenize": {"prompt": "x"},
    "/detokenize": {"tokens": [1]},
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
async def test_another_media_type_is_a_415_naming_it(
    make_worker: WorkerFactory, make_stack: StackFactory, path: str, content_type: str
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    raw = json.dumps(BODIES[path]).encode()
    async with stack.client() as client:
        r = await client.post(path, content=raw, headers={"content-type": content_type})
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert error["type"] == "invalid_request_error"
    assert f"Content-Type '{content_type}'" in error["message"]
    assert "application/json" in error["message"]
    assert w.names() == []


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"content-type": "application/json"},
        {"content-type": "Application/JSON; charset=utf-8"},
        {"content-type": "application/vnd.api+json"},
    ],
)
async def test_json_or_no_content_type_is_served(
    make_worker: WorkerFactory, make_stack: StackFactory, headers: dict[str, str]
) -> None:
    stack = await make_stack(await make_worker(Role.MIXED))
    raw = json.dumps(BODIES[CHAT]).encode()
    async with stack.client() as client:
        r = await client.post(CHAT, content=raw, headers=headers)
    assert r.status_code == 200, r.text

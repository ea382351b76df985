"""`stream_options` without `stream: true` is a 400 naming it, as vLLM refuses it.

Found by the new-user probe of docs/openai-api.md: the router accepted it and ignored it (a
whole answer, no usage chunks), against "every field acts or is refused"."""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

OPTIONS = {"stream_options": {"include_usage": True}}


@pytest.mark.parametrize("route", ["completions", "chat"])
@pytest.mark.parametrize("stream", [None, False])
async def test_stream_options_without_stream_are_refused(
    make_worker: WorkerFactory, make_stack: StackFactory, route: str, stream: bool | None
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, **OPTIONS}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Hi"
    if stream is not None:
        body["stream"] = stream
    async with stack.client() as client:
        r = await client.post(f"/v1/{route.replace('chat', 'chat/completions')}", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options"
    assert "stream" in r.json()["error"]["message"]
    assert not w.requests("Generate")


async def test_stream_options_with_stream_act(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    stack = await make_stack(await make_worker(Role.MIXED))
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "stream": True, **OPTIONS}
    async with stack.client() as client:
        r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert '"usage":{"prompt_tokens"' in r.text.replace(" ", "")

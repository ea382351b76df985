"""Chat requests as a new user's probe sent them (each was wrong before this file's fixes):

- text content parts are joined with newlines, as vLLM joins them for a chat template that reads
  `content` as a string (before: joined with nothing, "a" + "b" rendered as "ab");
- a message's `name` acts on the default tokenizer's template (before: passed and never read);
- a chat too long for the context names `messages` (before: `prompt`, a field chats lack);
- a path with a trailing slash is an unknown route, 404 (before: a 307 to an `http://` URL made
  from the client's Host header);
- `x-slo-class` with whitespace around the name is that class (before: 400 "unknown class").
"""

from __future__ import annotations

from typing import Any

import httpx

from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

CHAT = "/v1/chat/completions"


async def _ids(client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> list[int]:
    r = await client.post("/tokenize", json={"messages": messages})
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


async def test_text_parts_are_joined_with_newlines_and_name_is_rendered(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    stack = await make_stack(await make_worker(Role.MIXED))
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    async with stack.client() as client:
        joined = await _ids(client, [{"role": "user", "content": parts}])
        assert joined == await _ids(client, [{"role": "user", "content": "a\nb"}])
        assert joined != await _ids(client, [{"role": "user", "content": "ab"}])
        plain = await _ids(client, [{"role": "user", "content": "hi"}])
        named = await _ids(client, [{"role": "user", "content": "hi", "name": "bob"}])
    assert named != plain
    assert "user bob<|end_header_id|>" in tokenizer.decode(named, skip_special_tokens=False)


async def test_a_chat_too_long_names_messages(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w, max_model_len=64)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 80}]}
    async with stack.client() as client:
        r = await client.post(CHAT, json={**body, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages"
    assert "maximum context length" in r.json()["error"]["message"]
    assert w.names() == []


async def test_a_trailing_slash_is_an_unknown_route(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    stack = await make_stack(await make_worker(Role.MIXED))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with stack.client() as client:
        r = await client.post(CHAT + "/", json=body, headers={"host": "api.example.com"})
    assert r.status_code == 404, r.text
    assert "location" not in r.headers


async def test_whitespace_around_the_slo_class_is_not_part_of_it(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    stack = await make_stack(await make_worker(Role.MIXED))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with stack.client() as client:
        padded = await client.post(CHAT, json=body, headers={"x-slo-class": " default  "})
        unknown = await client.post(CHAT, json=body, headers={"x-slo-class": " nosuch "})
    assert padded.status_code == 200, padded.text
    assert unknown.status_code == 400
    assert "nosuch" in unknown.json()["error"]["message"]

"""The `llama3_json` and `pythonic` tool-call parsers behind the router's HTTP face: chosen by
`edge.tool_call_parser`, their calls come back as `tool_calls`, whole and streamed, read by the
official `openai` client (fake vLLM-engine workers stream a scripted answer)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, ServerFactory, WorkerFactory
from tests.unit.router.test_openai_tools import ASK, WEATHER

ANSWERS = {
    "llama3_json": (
        '{"name": "get_weather", "parameters": {"city": "Köln"}}; '
        '{"name": "get_time", "arguments": {"tz": "Europe/Berlin"}}'
    ),
    "pythonic": "[get_weather(city='Köln'), get_time(tz=\"Europe/Berlin\")]",
}
WANT = [("get_weather", {"city": "Köln"}), ("get_time", {"tz": "Europe/Berlin"})]


@pytest.mark.parametrize("name", sorted(ANSWERS))
async def test_official_client_reads_the_calls_whole_and_streamed(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    name: str,
) -> None:
    worker = await make_worker(Role.MIXED, engine="vllm")
    worker.script.completion = tuple(tokenizer.encode(ANSWERS[name], add_special_tokens=False))
    server = await make_router(worker.address, edge=EdgeSettings(tool_call_parser=name))
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0
    )
    async with client:
        whole = await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200
        )
        stream = await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200, stream=True
        )
        chunks = [c async for c in stream]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    got: Any = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == WANT
    content, finish = "", None
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"name": "", "arguments": ""})
            assert piece.function is not None
            call["name"] += piece.function.name or ""
            call["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == ""
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == WANT

"""`response_format` / `structured_outputs`: the router turns them into vLLM's
`StructuredOutputsParams` (as JSON) for the prefill and the decode worker alike, refuses malformed
ones with a 400 naming the field, and the simulated engine refuses them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

CHAT: list[Any] = [{"role": "user", "content": "Hi there"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        ({"response_format": {"type": "json_object"}}, {"json_object": True}),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            {"json": SCHEMA},
        ),
        (
            {
                "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
                "structured_outputs": {"disable_any_whitespace": True},
            },
            {"json": SCHEMA, "disable_any_whitespace": True},
        ),
        ({"structured_outputs": {"regex": "[a-z]+"}}, {"regex": "[a-z]+"}),
        ({"structured_outputs": {"choice": ["x", "y"]}}, {"choice": ["x", "y"]}),
        ({"structured_outputs": {"grammar": "root ::= 'a'"}}, {"grammar": "root ::= 'a'"}),
        ({"response_format": {"type": "text"}}, None),
    ],
)
async def test_guides_reach_prefill_and_decode(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    extra: dict[str, Any],
    want: dict[str, Any] | None,
) -> None:
    p = await make_worker(Role.PREFILL, engine="vllm")
    d = await make_worker(Role.DECODE, engine="vllm")
    stack = await make_stack(p, d)
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT, "max_tokens": 4, **extra},
        )
    assert r.status_code == 200, r.text
    [prefill] = p.requests("Prefill")
    [decode] = d.requests("Decode")
    for msg in (prefill, decode):
        got = msg.sampling.structured_outputs
        assert (json.loads(got) if got else None) == want


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs"),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
        ),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        ({"structured_outputs": {"guided_json": {}}}, "structured_outputs.guided_json"),
        (
            {"structured_outputs": {"json": SCHEMA, "whitespace_pattern": 1}},
            "structured_outputs.whitespace_pattern",
        ),
    ],
)
async def test_malformed_guides_are_400(
    make_worker: WorkerFactory, make_stack: StackFactory, extra: dict[str, Any], param: str
) -> None:
    w = await make_worker(Role.MIXED, engine="vllm")
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, **extra}
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not w.requests("Generate")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ],
)
async def test_the_simulated_engine_refuses_guides(
    make_worker: WorkerFactory, make_stack: StackFactory, extra: dict[str, Any], param: str
) -> None:
    w = await make_worker(Role.MIXED, engine="sim")
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **extra}
        )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert "sim engine" in err["message"]
    assert not w.requests("Generate")

"""`response_format` / `structured_outputs`: the mapping to vLLM's `StructuredOutputsParams`
(as JSON), malformed ones refused naming the field, the same constraint sent to the prefill and
the decode worker (vLLM engine), and the simulated engine refusing them naming itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router import openai_fields
from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
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
                "structured_outputs": {"disable_any_whitespace": False},
            },
            {"json": SCHEMA, "disable_any_whitespace": False},
        ),
        ({"structured_outputs": {"regex": "[a-z]+"}}, {"regex": "[a-z]+"}),
        ({"structured_outputs": {"choice": ["x", "y"]}}, {"choice": ["x", "y"]}),
        ({"structured_outputs": {"grammar": "root ::= 'a'"}}, {"grammar": "root ::= 'a'"}),
        ({"response_format": {"type": "text"}}, None),
    ],
)
def test_guides_map_to_vllms_params(extra: dict[str, Any], want: dict[str, Any] | None) -> None:
    req = wire.ChatCompletionRequest(model=MODEL, messages=CHAT, **extra)
    got = openai_fields.structured_outputs(req)
    assert (json.loads(got) if got else None) == want


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        # No constraint at all: vLLM refuses it ("none are specified"); it was dropped here.
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"disable_any_whitespace": False}}, "structured_outputs"),
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
        # vLLM 0.32 takes these per request and ignores them (engine-wide options): refused.
        (
            {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
            "structured_outputs.disable_any_whitespace",
        ),
        (
            {"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
            "structured_outputs.disable_additional_properties",
        ),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": "[ ]?"}},
            "structured_outputs.whitespace_pattern",
        ),
    ],
)
def test_malformed_guides_are_400(extra: dict[str, Any], param: str) -> None:
    req = wire.CompletionRequest(model=MODEL, prompt="Hi", **extra)
    with pytest.raises(ApiError) as err:
        openai_fields.structured_outputs(req)
    assert err.value.status == 400
    assert err.value.param == param


async def test_guides_reach_prefill_and_decode(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """The constraint is on both halves of a P/D request: the prefill worker samples the first
    token under it, the decode worker the rest."""
    p = await make_worker(Role.PREFILL, engine="vllm")
    d = await make_worker(Role.DECODE, engine="vllm")
    stack = await make_stack(p, d)
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT, "max_tokens": 4, "response_format": rf},
        )
    assert r.status_code == 200, r.text
    [prefill] = p.requests("Prefill")
    [decode] = d.requests("Decode")
    for msg in (prefill, decode):
        assert json.loads(msg.sampling.structured_outputs) == {"json": SCHEMA}


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_malformed_guides_are_400_before_any_worker(
    make_worker: WorkerFactory, make_stack: StackFactory, route: str
) -> None:
    w = await make_worker(Role.MIXED, engine="vllm")
    stack = await make_stack(w)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
    body.update({"prompt": "Hi"} if route == "/v1/completions" else {"messages": CHAT})
    async with stack.client() as client:
        r = await client.post(route, json={**body, "structured_outputs": {"structural_tag": "{}"}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "structured_outputs.structural_tag"
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
    assert "grammar" in err["message"]
    assert not w.requests("Generate")


async def test_a_vllm_worker_accepts_guides(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    w = await make_worker(Role.MIXED, engine="vllm")
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "Hi",
                "max_tokens": 2,
                "structured_outputs": {"choice": ["x", "y"]},
            },
        )
    assert r.status_code == 200, r.text
    [gen] = w.requests("Generate")
    assert json.loads(gen.sampling.structured_outputs) == {"choice": ["x", "y"]}

"""`response_format` / `structured_outputs`: the mapping to vLLM's `StructuredOutputsParams`
(as JSON), malformed ones refused naming the field; for now every engine refuses the fields
(the P/D grammar hand-over is not verified: docs/openai-api.md)."""

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
def test_malformed_guides_are_400(extra: dict[str, Any], param: str) -> None:
    req = wire.CompletionRequest(model=MODEL, prompt="Hi", **extra)
    with pytest.raises(ApiError) as err:
        openai_fields.structured_outputs(req)
    assert err.value.status == 400
    assert err.value.param == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ],
)
@pytest.mark.parametrize("engine", ["sim", "vllm"])
async def test_guides_are_refused_for_now(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    extra: dict[str, Any],
    param: str,
    engine: str,
) -> None:
    w = await make_worker(Role.MIXED, engine=engine)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **extra}
        )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert f"{engine} engine" in err["message"]
    assert not w.requests("Generate")

"""Validation errors name the client's field path (`messages[0].content`), not pydantic's
internals (union member tags such as `str`, `list[ContentPart]`, `literal[...]`).

Before the fix `content: 5` was answered `messages.0.content.str: Input should be a valid
string`, and a bad `tool_choice` `tool_choice.literal['none','auto','required']: ...`.
"""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
from splitserve.router.openai_parse import parse_body, template_messages
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

USER = {"role": "user", "content": "x"}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [USER], **extra}


def _error(body: dict[str, Any], model: type[Any] = wire.ChatCompletionRequest) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_body(model, body, allow_unknown=False)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (_chat(messages=[USER, {"role": "user", "content": 5}]), "messages[1].content", "string"),
        (
            _chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            "messages[0].content[0].text",
            "valid string",
        ),
        (_chat(tool_choice="bogus"), "tool_choice", "'none', 'auto' or 'required'"),
        (_chat(tool_choice={"type": "function"}), "tool_choice.function", "Field required"),
        (_chat(stop=5), "stop", "valid string"),
        (_chat(messages=[{"role": "bogus", "content": "x"}]), "messages[0].role", "'system'"),
        (_chat(messages=[{"content": "x"}]), "messages[0].role", "Field required"),
        (_chat(logit_bias={"12": "x"}), "logit_bias.12", "valid number"),
        (_chat(messages=[{**USER, "mood": 1}]), "messages[0].mood", "unknown field"),
    ],
)
def test_the_error_names_the_clients_field_path(
    body: dict[str, Any], param: str, words: str
) -> None:
    err = _error(body)
    assert err.param == param
    assert err.message.startswith(f"{param}: "), err.message
    assert words in err.message
    for internal in ("str", "list[", "literal[", "function-", "ContentPart", "NamedToolChoice"):
        assert f".{internal}" not in err.message
        assert f".{internal}" not in (err.param or "")


def test_a_prompt_of_the_wrong_type_names_prompt() -> None:
    err = _error({"model": MODEL, "prompt": 5}, wire.CompletionRequest)
    assert err.param == "prompt"
    assert err.message.startswith("prompt: ")


async def test_over_http(make_worker: WorkerFactory, make_stack: StackFactory) -> None:
    stack = await make_stack(await make_worker(Role.MIXED))
    bad = {"model": MODEL, "messages": [{"role": "user", "content": 5}]}
    async with stack.client() as client:
        r = await client.post("/v1/chat/completions", json=bad)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content"


def _template_error(messages: list[dict[str, Any]]) -> ApiError:
    req = parse_body(wire.ChatCompletionRequest, _chat(messages=messages), allow_unknown=False)
    with pytest.raises(ApiError) as caught:
        template_messages(req.messages)
    assert caught.value.status == 400
    return caught.value


TEXT = {"type": "text", "text": "x"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        # content parts: the part's own path (was `messages` for all of them)
        ([USER, {"role": "user", "content": [TEXT, {"type": "image_url"}]}],
         "messages[1].content[1].type", "'image_url' are not supported"),
        ([{"role": "user", "content": [{"type": "text"}]}],
         "messages[0].content[0].text", "needs it"),
        ([{"role": "user", "content": [TEXT, {**TEXT, "input_audio": {"data": "x"}}]}],
         "messages[0].content[1].input_audio", "audio"),
        # content OpenAI's API requires (vLLM accepts these; OpenAI answers 400)
        ([{"role": "user", "content": None}], "messages[0].content", "a user message needs"),
        ([{"role": "user"}], "messages[0].content", "a user message needs"),
        ([{"role": "system", "content": None}, USER], "messages[0].content", "a system message"),
        ([USER, {"role": "tool", "tool_call_id": "c1"}], "messages[1].content", "a tool message"),
        ([{"role": "user", "content": []}], "messages[0].content", "an empty list"),
        ([USER, {"role": "assistant", "content": []}], "messages[1].content", "an empty list"),
        ([USER, {"role": "assistant"}], "messages[1].content", "content or tool_calls"),
    ],
)  # fmt: skip
def test_content_errors_name_the_path_within_the_message(
    messages: list[dict[str, Any]], param: str, words: str
) -> None:
    err = _template_error(messages)
    assert err.param == param
    assert err.message.startswith(f"{param}: "), err.message
    assert words in err.message


def test_an_assistant_message_with_tool_calls_needs_no_content() -> None:
    messages: list[dict[str, Any]] = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    req = parse_body(wire.ChatCompletionRequest, _chat(messages=messages), allow_unknown=False)
    assert [m["content"] for m in template_messages(req.messages)] == ["x", "", "ok"]

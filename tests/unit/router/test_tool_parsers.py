"""The `hermes` tool-call parser: whole answers, streamed answers (however the text is split), and
the registry the router's `edge.tool_call_parser` setting names."""

from __future__ import annotations

import json
import random
import typing
from collections import defaultdict
from typing import Any

import pydantic
import pytest

from splitserve.api import v1alpha1 as v1
from splitserve.api.router_edge import TOOL_CALL_PARSERS, EdgeSettings
from splitserve.router.openai_tools import ToolStream
from splitserve.router.tool_parsers import PARSERS, parser

HERMES = parser("hermes")
TWO_CALLS = (
    "Let me check.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Köln", "days": [1, 2]}}\n'
    "</tool_call>\n"
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
)


def test_registry_matches_the_setting_and_refuses_unknown_names() -> None:
    assert set(PARSERS) == set(TOOL_CALL_PARSERS)
    crd = v1.RouterEdgeSpec.model_fields["tool_call_parser"].annotation
    assert set(typing.get_args(typing.get_args(crd)[0])) == set(TOOL_CALL_PARSERS)
    with pytest.raises(
        ValueError,
        match=r"unknown tool-call parser 'mistral'.*known: hermes, llama3_json, pythonic",
    ):
        parser("mistral")
    with pytest.raises(
        pydantic.ValidationError, match=r"unknown tool-call parser 'granite'.*known: hermes, llama3"
    ):
        EdgeSettings(tool_call_parser="granite")
    assert EdgeSettings(tool_call_parser="hermes").tool_call_parser == "hermes"


def test_extract_calls_and_the_content_before_them() -> None:
    found = HERMES.extract(TWO_CALLS)
    assert found.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in found.calls] == [
        ("get_weather", {"city": "Köln", "days": [1, 2]}),
        ("get_time", {}),
    ]
    assert "Köln" in found.calls[0].arguments  # re-serialized with non-ASCII kept, as vLLM
    assert all(c.id.startswith("chatcmpl-tool-") for c in found.calls)
    assert found.calls[0].id != found.calls[1].id
    assert found.calls[0].body() == {
        "id": found.calls[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": found.calls[0].arguments},
    }
    # No text before the call: content is None. An unclosed last call still parses.
    only = HERMES.extract('<tool_call>{"name": "f", "arguments": {"x": 1}}')
    assert only.content is None
    assert [(c.name, c.arguments) for c in only.calls] == [("f", '{"x": 1}')]


@pytest.mark.parametrize(
    "text",
    [
        "plain answer, no markup",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "f"}</tool_call>',  # no arguments
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        'ok <tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>[1, 2]</tool_call>',
    ],
)
def test_text_without_valid_calls_stays_content(text: str) -> None:
    found = HERMES.extract(text)
    assert found.content == text
    assert found.calls == ()


def _assemble(deltas: list[dict[str, Any]]) -> tuple[str, dict[int, dict[str, Any]]]:
    """What a client rebuilds from streamed deltas (as the openai client's helpers do)."""
    content = ""
    calls: dict[int, dict[str, Any]] = defaultdict(lambda: {"arguments": ""})
    for delta in deltas:
        content += delta.get("content", "")
        for piece in delta.get("tool_calls", []):
            call = calls[piece["index"]]
            if "id" in piece:
                assert "id" not in call, "a call is announced once"
                call.update(id=piece["id"], type=piece["type"], name=piece["function"]["name"])
            else:
                assert "id" in call, "arguments come after the call is announced"
                call["arguments"] += piece["function"]["arguments"]
    return content, dict(calls)


def _stream(text: str, cuts: list[int], parallel: bool = True) -> list[dict[str, Any]]:
    stream = ToolStream(HERMES.stream(), parallel)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    out = [stream.delta(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    return [d for d in out if d]


@pytest.mark.parametrize("seed", range(6))
def test_streamed_calls_assemble_to_the_whole_answers_calls(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TWO_CALLS)), rng.randint(1, 40)))
    if seed == 0:
        cuts = list(range(1, len(TWO_CALLS)))  # one character at a time
    content, calls = _assemble(_stream(TWO_CALLS, cuts))
    whole = HERMES.extract(TWO_CALLS)
    assert content == whole.content
    assert sorted(calls) == [0, 1]
    for index, call in calls.items():
        assert call["name"] == whole.calls[index].name
        assert call["type"] == "function"
        assert call["id"].startswith("chatcmpl-tool-")
        # Streamed arguments are the model's raw text (as vLLM streams them): same JSON.
        assert json.loads(call["arguments"]) == json.loads(whole.calls[index].arguments)
    # vLLM's raw form: the model's own spacing, without the call object's closing brace.
    assert calls[0]["arguments"] == '{"city": "Köln", "days": [1, 2]}'


def test_stream_holds_back_a_possible_tag_and_sends_it_when_no_call_comes() -> None:
    stream = HERMES.stream()
    assert stream.feed("a <").body() == {"content": "a "}
    assert stream.feed("tool").body() == {}  # "<tool" may begin "<tool_call>"
    assert stream.feed("s> b").body() == {"content": "<tools> b"}
    assert stream.feed(" <tool_c").body() == {"content": " "}
    assert stream.end().body() == {"content": "<tool_c"}
    assert stream.num_calls == 0


def test_stream_sends_nothing_after_the_first_call_outside_calls_and_counts_calls() -> None:
    stream = ToolStream(HERMES.stream(), parallel=True)
    deltas = [
        stream.delta("Hi ", final=False),
        stream.delta('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', final=False),
        stream.delta(" trailing words", final=True),
    ]
    assert deltas[0] == {"content": "Hi "}
    assert [c["function"] for c in deltas[1]["tool_calls"]] == [
        {"name": "f"},
        {"arguments": '{"a": 1}'},
    ]
    assert deltas[2] == {}
    assert stream.finish() == "tool_calls"
    assert ToolStream(HERMES.stream(), parallel=True).finish() is None


def test_parallel_tool_calls_false_streams_the_first_call_only() -> None:
    content, calls = _assemble(_stream(TWO_CALLS, [20, 60, 90], parallel=False))
    assert content == "Let me check."
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"


def test_router_flag_refuses_an_unknown_parser_at_start_up() -> None:
    import click

    from splitserve.cli.router import edge_settings

    assert edge_settings(("tool_call_parser=hermes",)).tool_call_parser == "hermes"
    assert edge_settings(("tool_call_parser=pythonic",)).tool_call_parser == "pythonic"
    with pytest.raises(click.BadParameter, match="unknown tool-call parser 'llama4_json'"):
        edge_settings(("tool_call_parser=llama4_json",))

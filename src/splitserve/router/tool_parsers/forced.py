"""Calls forced by `tool_choice` (`"required"` or a named function), read as vLLM 0.32 reads them.

A forced answer is not model markup: guided decoding makes the model write JSON (the router sets
the grammar, `openai_tools`), and these readers turn that JSON into calls, whatever the model
family, so no `edge.tool_call_parser` is needed.

* named function: the whole answer is the call's arguments (the grammar is the function's
  `parameters` schema). Whole: one call (none when the answer is blank), content `""`. Streamed:
  the first piece announces the call (index 0, id, type, name) with the piece as its first
  arguments; every later piece is more arguments.
* `"required"`: the answer is a JSON array of `{"name": ..., "parameters": {...}}` (the grammar is
  `required_schema`). Whole: each element a call, arguments its `parameters` re-serialized
  (`json.dumps`, non-ASCII kept); an answer that does not parse as such an array gives no calls.
  Streamed: a call is announced (index, id, type, name, the arguments so far) once its name is
  complete and its `parameters` value has begun; later pieces carry only new argument text.
  Content is never sent. The element scan is vLLM's `_scan_required_tool_calls` in our own code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from splitserve.router.tool_parsers.base import Delta, StreamParser, ToolCall, tool_call_id

EMPTY_PARAMETERS: Final[dict[str, Any]] = {"type": "object", "properties": {}}
"""A function without `parameters` still takes a JSON object (as vLLM guides it)."""


def parameters_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The grammar of a named function's arguments: its `parameters`, or any object."""
    return parameters if parameters else dict(EMPTY_PARAMETERS)


def required_schema(
    functions: list[tuple[str, dict[str, Any] | None]], *, parallel: bool
) -> dict[str, Any]:
    """The grammar of a `"required"` answer (vLLM's `_get_json_schema_from_tools`): an array of at
    least one (at most one without `parallel`) `{"name", "parameters"}` object, any of the tools.
    Each tool's `$defs` move to the array's (copies: the tools are not changed).

    Raises:
        ValueError: a `$defs` that is not an object, or two tools defining one name differently
            (the message names it).
    """
    defs: dict[str, Any] = {}
    choices = []
    for name, params in functions:
        params = dict(params) if params else None
        if params is not None and "$defs" in params:
            own = params.pop("$defs")
            if not isinstance(own, dict):
                raise ValueError(f"`$defs` in the parameters of tool {name!r} must be an object")
            for key, value in own.items():
                if key in defs and defs[key] != value:
                    raise ValueError(f"tool definition {key!r} has more than one schema")
                defs[key] = value
        choices.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "parameters": parameters_schema(params),
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": choices},
    }
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def named_calls(name: str, text: str) -> tuple[ToolCall, ...]:
    """A named function's answer as its call (none when the answer is blank)."""
    return (ToolCall(name, text),) if text.strip() else ()


def required_calls(text: str) -> tuple[ToolCall, ...]:
    """A `"required"` answer's calls; none when it is not an array of `{"name": str,
    "parameters": object | null}` (what vLLM's `list[FunctionDefinition]` accepts)."""
    try:
        items = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(items, list):
        return ()
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return ()
        params = item.get("parameters")
        description = item.get("description")
        if not (params is None or isinstance(params, dict)) or not (
            description is None or isinstance(description, str)
        ):
            return ()
        calls.append(ToolCall(item["name"], json.dumps(params, ensure_ascii=False)))
    return tuple(calls)


class NamedStream(StreamParser):
    """A streamed named-function answer: every piece is the call's arguments."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._announced = False

    @property
    def num_calls(self) -> int:
        return int(self._announced)

    def feed(self, text: str) -> Delta:
        if self._announced:
            piece: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
            return Delta(tool_calls=[piece] if text else [])
        self._announced = True
        first = {
            "index": 0,
            "id": tool_call_id(),
            "type": "function",
            "function": {"name": self._name, "arguments": text},
        }
        return Delta(tool_calls=[first])

    def end(self) -> Delta:
        return Delta()


@dataclass(slots=True)
class _Span:
    """Where one element of the `"required"` array sits in the text (prefix-stable offsets)."""

    name: str | None = None
    name_end: int | None = None
    args_start: int | None = None
    args_end: int | None = None

    @property
    def ready(self) -> bool:
        return self.name is not None and self.args_start is not None

    def ready_at(self, length: int) -> bool:
        """Whether the text's first `length` characters already made this call streamable."""
        return (
            self.ready
            and self.name_end is not None
            and self.name_end <= length
            and self.args_start is not None
            and self.args_start < length
        )


_KEY, _COLON, _VALUE, _IN_STRING, _IN_CONTAINER, _IN_SCALAR, _AFTER = range(7)


class _Scan:
    """One string- and nesting-aware pass over a (partial) `"required"` array."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.spans: list[_Span] = []
        self.cur: _Span | None = None
        self.expect = _KEY
        self.key: str | None = None
        self.value_start = 0

    def end_value(self, pos: int) -> None:
        cur = self.cur
        assert cur is not None
        if self.key == "parameters":
            cur.args_end = pos
        elif self.key == "name" and self.expect == _IN_STRING:
            try:
                cur.name = json.loads(self.text[self.value_start : pos])
                cur.name_end = pos
            except ValueError:
                cur.name = None  # never ready, as the whole answer would not parse
        self.expect = _AFTER

    def start_value(self, pos: int, state: int) -> None:
        assert self.cur is not None
        self.value_start = pos
        if self.key == "parameters":
            self.cur.args_start = pos
        self.expect = state

    def run(self) -> list[_Span]:  # one state machine, as vLLM's
        text = self.text
        depth = 0  # nesting of {} and []; element objects sit at 2
        in_string = escaped = False
        string_start = 0
        for i, ch in enumerate(text):
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
                    if depth == 2 and self.cur is not None:
                        if self.expect == _KEY:
                            self.key = text[string_start + 1 : i]
                            self.expect = _COLON
                        elif self.expect == _IN_STRING:
                            self.end_value(i + 1)
                continue
            if ch == '"':
                in_string = True
                string_start = i
                if depth == 2 and self.cur is not None and self.expect == _VALUE:
                    self.start_value(i, _IN_STRING)
                continue
            if ch in "{[":
                if (depth == 0 and ch != "[") or (depth == 1 and ch != "{"):
                    return self.spans
                if depth == 1:
                    self.cur = _Span()
                    self.spans.append(self.cur)
                    self.expect, self.key = _KEY, None
                elif depth == 2 and self.cur is not None and self.expect == _VALUE:
                    self.start_value(i, _IN_CONTAINER)
                depth += 1
                continue
            if ch in "}]":
                if depth == 2 and self.cur is not None and self.expect == _IN_SCALAR:
                    self.end_value(i)
                depth -= 1
                if depth == 2 and self.cur is not None and self.expect == _IN_CONTAINER:
                    self.end_value(i + 1)
                elif depth == 1:
                    self.cur = None
                elif depth <= 0:
                    return self.spans
                continue
            if depth != 2 or self.cur is None:
                continue
            if ch == ":":
                if self.expect == _COLON:
                    self.expect = _VALUE
            elif ch == ",":
                if self.expect == _IN_SCALAR:
                    self.end_value(i)
                self.expect, self.key = _KEY, None
            elif ch.isspace():
                if self.expect == _IN_SCALAR:
                    self.end_value(i)
            elif self.expect == _VALUE:
                self.start_value(i, _IN_SCALAR)
        return self.spans


class RequiredStream(StreamParser):
    """A streamed `"required"` answer: calls announced and their arguments sent as they come."""

    def __init__(self) -> None:
        self._text = ""
        self._announced = 0

    @property
    def num_calls(self) -> int:
        return self._announced

    def feed(self, text: str) -> Delta:
        sent_len = len(self._text)
        self._text += text
        current = self._text
        delta = Delta()
        if not current:
            return delta
        for index, span in enumerate(_Scan(current).run()):
            if not span.ready:
                break  # elements come in order: nothing later is ready
            assert span.args_start is not None
            end = span.args_end if span.args_end is not None else len(current)
            if span.ready_at(sent_len):
                new = current[min(end, sent_len) : end]
                if new:
                    delta.tool_calls.append({"index": index, "function": {"arguments": new}})
                continue
            self._announced += 1
            delta.tool_calls.append(
                {
                    "index": index,
                    "id": tool_call_id(),
                    "type": "function",
                    "function": {"name": span.name, "arguments": current[span.args_start : end]},
                }
            )
        return delta

    def end(self) -> Delta:
        return Delta()

"""The `llama3_json` tool-call format (Llama 3.1 / 3.2 / 3.3 JSON tool calls): the answer is one or
more JSON objects `{"name": ..., "arguments": {...}}` (or `"parameters"`), separated by `;`,
optionally after `<|python_tag|>` (kept in the text only when special tokens are not skipped).

What vLLM's `Llama3JsonToolParser` does, in our own code (the router does not depend on vLLM):

* whole answers: every JSON object in the text (searched from each `{` not inside an earlier one)
  must be a call with `name` and `arguments` / `parameters`; then the content is None (text around
  the calls is dropped) and each call's arguments are re-serialized (`json.dumps`, non-ASCII
  kept). An object that does not parse or is not a call leaves the whole text as content;
* streamed answers: an answer that does not begin with `{` or `<|python_tag|>` is content, piece
  by piece (so, as in vLLM, a call after some text is read only from a whole answer); otherwise a
  call is announced once its `"name"` is complete and its arguments are sent as they arrive, in
  the same re-serialized form (`json.dumps` spacing), so the streamed arguments add up to the
  whole answer's. Calls follow one another separated by `;`; other text after a call ends the
  calls and is not sent.

Unlike vLLM, an answer that begins like a call but holds none (a JSON answer without `name`) is
sent as content when it ends (vLLM sends nothing).
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from splitserve.router.tool_parsers.base import (
    Delta,
    Extracted,
    StreamParser,
    ToolCall,
    ToolCallParser,
    tool_call_id,
)

PYTHON_TAG: Final = "<|python_tag|>"
_DECODER: Final = json.JSONDecoder()
_NUMBER: Final = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_PLAIN: Final = re.compile(r'[^"\\\x00-\x1f]+')
_ESCAPES: Final = {
    '\\"': '\\"',
    "\\\\": "\\\\",
    "\\/": "/",
    "\\b": "\\b",
    "\\f": "\\f",
    "\\n": "\\n",
    "\\r": "\\r",
    "\\t": "\\t",
}
Strings = dict[int, tuple[list[str], int, bool]]
"""Per string's start: its canonical text so far (one part), where reading stopped, done."""
_HEX4: Final = re.compile(r"[0-9a-fA-F]{4}")
_NUMBER_CHARS: Final = frozenset("0123456789+-.eE")
_LITERALS: Final = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_WS: Final = " \t\n\r"


class MalformedError(ValueError):
    """The text cannot be (the beginning of) a JSON value."""


class Llama3JsonParser(ToolCallParser):
    name = "llama3_json"

    def extract(self, text: str) -> Extracted:
        calls: list[ToolCall] = []
        end = -1
        for start in (m.start() for m in re.finditer(r"\{", text)):
            if start <= end:
                continue  # inside an object already read
            try:
                obj, length = _DECODER.raw_decode(text[start:])
                call = _call(obj)
            except (ValueError, KeyError, TypeError, RecursionError):
                return Extracted(text)  # RecursionError: nested too deep for json
            end = start + length
            calls.append(call)
        return Extracted(None, tuple(calls)) if calls else Extracted(text)

    def stream(self) -> Llama3JsonStream:
        return Llama3JsonStream()


def _call(obj: Any) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj["name"], str):
        raise TypeError("not a tool call")
    args = obj["arguments"] if "arguments" in obj else obj["parameters"]
    return ToolCall(name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


class Llama3JsonStream(StreamParser):
    """One streamed answer: re-reads the text so far on each piece and sends what is new."""

    def __init__(self) -> None:
        self._text = ""
        self._mode: str | None = None  # "content" or "calls" once the first characters decide
        self._names: list[str] = []
        self._args_sent: list[str] = []
        self._broken = False
        self._strings: Strings = {}  # strings read so far, by where they start

    @property
    def num_calls(self) -> int:
        return len(self._names)

    def feed(self, text: str) -> Delta:
        self._text += text
        if self._mode is None:
            head = self._text
            if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
                return Delta()  # may still become `<|python_tag|>`
            if head.startswith(("{", PYTHON_TAG)):
                self._mode = "calls"
            else:
                self._mode = "content"
                return Delta(head)
        if self._mode == "content":
            return Delta(text)
        return self._calls()

    def end(self) -> Delta:
        if self._mode is None or (self._mode == "calls" and not self._names):
            self._mode = "content"
            return Delta(self._text)  # no call came: the held text is the answer
        return Delta()

    def _calls(self) -> Delta:
        delta = Delta()
        if self._broken:
            return delta
        try:
            found = _partial_calls(self._text.removeprefix(PYTHON_TAG), self._strings)
        except (ValueError, RecursionError):  # MalformedError, a bad escape, or nested too deep
            self._broken = True  # what was sent stays; nothing more is read
            return delta
        for i, (name, args, _done) in enumerate(found):
            if i == len(self._names):
                if name is None:
                    break  # call i's name is not complete yet: later calls wait for it
                self._names.append(name)
                self._args_sent.append("")
                delta.tool_calls.append(
                    {
                        "index": i,
                        "id": tool_call_id(),
                        "type": "function",
                        "function": {"name": name},
                    }
                )
            if len(args) > len(self._args_sent[i]):
                delta.tool_calls.append(
                    {"index": i, "function": {"arguments": args[len(self._args_sent[i]) :]}}
                )
                self._args_sent[i] = args
        return delta


def _partial_calls(text: str, memo: Strings) -> list[tuple[str | None, str, bool]]:
    """Each call in `text` so far: its name (None until complete), the canonical text of its
    arguments so far, and whether its object is complete.

    Raises:
        MalformedError: the text is not a sequence of JSON objects separated by `;`.
    """
    out: list[tuple[str | None, str, bool]] = []
    i = 0
    while True:
        i = _skip(text, i)
        if i == len(text) or text[i] != "{":
            return out  # the end so far, or text that is not another call
        name, args, i, done = _object(text, i, memo)
        out.append((name, args, done))
        if not done:
            return out
        i = _skip(text, i)
        if i < len(text) and text[i] == ";":
            i += 1


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _object(text: str, i: int, memo: Strings) -> tuple[str | None, str, int, bool]:
    """The call object at `text[i]` (`{`): name, canonical arguments so far, end, complete."""
    name: str | None = None
    values: dict[str, str] = {}
    i += 1
    first = True
    while True:
        i = _skip(text, i)
        if i == len(text):
            break
        if text[i] == "}":
            args = values.get("arguments", values.get("parameters", ""))
            return name, args, i + 1, True
        if not first:
            if text[i] != ",":
                raise MalformedError(text[i])
            i = _skip(text, i + 1)
        first = False
        key, i, key_done = _string(text, i, memo)
        if not key_done:
            break
        i = _skip(text, i)
        if i == len(text):
            break
        if text[i] != ":":
            raise MalformedError(text[i])
        canon, i, done = _value(text, _skip(text, i + 1), memo)
        key = json.loads(key)
        if key in ("arguments", "parameters"):
            values[key] = canon
        elif key == "name" and done:
            value = json.loads(canon)
            name = value if isinstance(value, str) else None
        if not done:
            break
    return name, values.get("arguments", values.get("parameters", "")), len(text), False


def _value(text: str, i: int, memo: Strings | None = None) -> tuple[str, int, bool]:
    """The JSON value at `text[i]` as `json.dumps(..., ensure_ascii=False)` writes it, as far as
    it is final: its canonical text so far, the index after it, and whether it is complete."""
    if i == len(text):
        return "", i, False
    c = text[i]
    if c == '"':
        return _string(text, i, memo)
    if c in "{[":
        close = "}" if c == "{" else "]"
        out, i, first = c, i + 1, True
        while True:
            i = _skip(text, i)
            if i == len(text):
                return out, i, False
            if text[i] == close:
                return out + close, i + 1, True
            if not first:
                if text[i] != ",":
                    raise MalformedError(text[i])
                out += ", "
                i = _skip(text, i + 1)
            first = False
            if c == "{":
                key, i, done = _string(text, i, memo)
                out += key
                if not done:
                    return out, i, False
                i = _skip(text, i)
                if i == len(text):
                    return out, i, False
                if text[i] != ":":
                    raise MalformedError(text[i])
                out += ": "
                i = _skip(text, i + 1)
            item, i, done = _value(text, i, memo)
            out += item
            if not done:
                return out, i, False
    for literal in _LITERALS:
        if text.startswith(literal, i):
            return json.dumps(json.loads(literal)), i + len(literal), True
        if literal.startswith(text[i:]):
            return "", len(text), False
    end = i
    while end < len(text) and text[end] in _NUMBER_CHARS:
        end += 1
    if end == len(text):
        return "", end, False  # more of the number may follow
    if not _NUMBER.fullmatch(text, i, end):
        raise MalformedError(text[i:end] or c)
    return json.dumps(json.loads(text[i:end])), end, True


def _string(text: str, i: int, memo: Strings | None = None) -> tuple[str, int, bool]:
    """The JSON string at `text[i]` (must be `"`), canonical, as far as it is final. `memo` keeps
    what was read of each string, so a stream that grows resumes where it stopped."""
    if i == len(text):
        return "", i, False
    if text[i] != '"':
        raise MalformedError(text[i])
    out, at, done = (
        memo.get(i, (['"'], i + 1, False)) if memo is not None else (['"'], i + 1, False)
    )
    while not done and at < len(text):
        if plain := _PLAIN.match(text, at):  # written as is by json.dumps(ensure_ascii=False)
            out.append(plain.group())
            at = plain.end()
            continue
        c = text[at]
        if c == '"':
            out.append('"')
            at, done = at + 1, True
            break
        if c != "\\":
            raise MalformedError(repr(c))  # raw control characters are not JSON
        esc = _escape(text, at)
        if esc is None:
            break  # resume at the escape once more text came
        raw, at = esc
        out.append(
            _ESCAPES.get(raw) or json.dumps(json.loads(f'"{raw}"'), ensure_ascii=False)[1:-1]
        )
    if len(out) > 1:
        out[:] = ["".join(out)]
    if memo is not None:
        memo[i] = (out, at, done)
    return out[0] if out else "", at if done else len(text), done


def _escape(text: str, i: int) -> tuple[str, int] | None:
    """The escape at `text[i]` (`\\`) and the index after it; None if it is not complete yet (a
    high surrogate waits for its low half)."""
    if i + 1 == len(text):
        return None
    if text[i + 1] != "u":
        if text[i + 1] not in '"\\/bfnrt':
            raise MalformedError(text[i : i + 2])
        return text[i : i + 2], i + 2
    if i + 6 > len(text):
        return None
    raw = text[i : i + 6]
    if not _HEX4.fullmatch(raw, 2):
        raise MalformedError(raw)
    if "\ud800" <= chr(int(raw[2:], 16)) <= "\udbff":
        if i + 12 > len(text):
            return None if text.startswith("\\u"[: len(text) - i - 6], i + 6) else (raw, i + 6)
        if text.startswith("\\u", i + 6):
            return text[i : i + 12], i + 12
    return raw, i + 6

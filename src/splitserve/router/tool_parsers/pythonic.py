"""The `pythonic` tool-call format (Llama 3.2 and Llama 4 with their pythonic templates, ToolACE):
the answer is a Python list of calls with keyword arguments,
`[get_weather(city="Köln", days=[1, 2]), get_time()]`.

What vLLM's `PythonicToolParser` does, in our own code (the router does not depend on vLLM; the
text is read with Python's `ast`, never evaluated):

* whole answers: an answer that begins with `[name(` and parses as a list of calls (no trailing
  comma) is read as calls (content None); names after the first may be dotted (`a.b`); argument
  values must be literals (strings, numbers, `True` / `False` / `None` and JSON's `true` /
  `false` / `null`, lists, tuples and sets as lists, dicts with literal keys, signed numbers,
  f-strings without placeholders) and are written as a JSON object (`json.dumps`, non-ASCII
  kept). Anything else leaves the whole text as content;
* streamed answers: an answer that does not begin with `[` is content, piece by piece; otherwise
  a call is announced once its name and `(` have arrived (as in vLLM, the whole answer's opening
  and trailing-comma rules are not applied while streaming).

Unlike vLLM: a streamed call's arguments are sent in one piece when its `)` arrives (vLLM sends
them in pieces as they arrive; both add up to the whole answer's arguments); positional arguments
make the answer content (vLLM drops them); an answer that begins with `[` but holds no call is
sent as content when it ends (vLLM sends nothing).
"""

from __future__ import annotations

import ast
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

_NAME: Final = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_OPENING: Final = re.compile(r"\[[A-Za-z]\w*\(")
"""How a whole answer of calls begins (as vLLM requires): `[`, at once a plain name and `(`."""
_JSON_NAMES: Final[dict[str, Any]] = {"null": None, "true": True, "false": False}


class NotACallError(ValueError):
    """The text is not a pythonic tool call."""


class PythonicParser(ToolCallParser):
    name = "pythonic"

    def extract(self, text: str) -> Extracted:
        if not _OPENING.match(text):
            return Extracted(text)
        try:
            body = ast.parse(text).body
            node = body[0].value if body and isinstance(body[0], ast.Expr) else None
            if not isinstance(node, ast.List) or not node.elts:
                return Extracted(text)
            if (ast.get_source_segment(text, node) or "")[:-1].rstrip().endswith(","):
                return Extracted(text)  # a trailing comma: not read as calls, as in vLLM
            calls = tuple(_call(e) for e in node.elts)
        except (SyntaxError, ValueError):
            return Extracted(text)
        return Extracted(None, calls)

    def stream(self) -> PythonicStream:
        return PythonicStream()


def _call(node: ast.expr) -> ToolCall:
    if not isinstance(node, ast.Call) or node.args:
        raise NotACallError("a list item is not a call with keyword arguments only")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise NotACallError("**arguments")
        args[kw.arg] = _literal(kw.value)
    return ToolCall(name=_dotted(node.func), arguments=json.dumps(args, ensure_ascii=False))


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise NotACallError("a call's function is not a (dotted) name")


def _literal(node: ast.expr) -> Any:
    """A literal argument value, as JSON would hold it."""
    match node:
        case ast.Constant(value=value) if value is None or isinstance(value, str | int | float):
            return value
        case ast.Dict(keys=keys, values=values) if all(isinstance(k, ast.Constant) for k in keys):
            return {k.value: _literal(v) for k, v in zip(keys, values, strict=True)}  # type: ignore[union-attr]
        case ast.List(elts=items) | ast.Tuple(elts=items) | ast.Set(elts=items):
            return [_literal(v) for v in items]
        case ast.JoinedStr(values=parts) if all(isinstance(p, ast.Constant) for p in parts):
            return "".join(str(p.value) for p in parts)  # type: ignore[attr-defined]
        case ast.Name(id=name) if name in _JSON_NAMES:
            return _JSON_NAMES[name]
        case ast.UnaryOp(op=ast.USub() | ast.UAdd() as op, operand=operand):
            value = _literal(operand)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return -value if isinstance(op, ast.USub) else value
    raise NotACallError(f"argument value {ast.dump(node)} is not a literal")


class PythonicStream(StreamParser):
    """One streamed answer: re-reads the text so far on each piece and sends what is new."""

    def __init__(self) -> None:
        self._text = ""
        self._mode: str | None = None  # "content" or "calls" once the first character decides
        self._names: list[str] = []
        self._args_sent: list[bool] = []
        self._broken = False
        self._scanner = _Scanner()

    @property
    def num_calls(self) -> int:
        return len(self._names)

    def feed(self, text: str) -> Delta:
        self._text += text
        if self._mode is None:
            if not self._text:
                return Delta()
            self._mode = "calls" if self._text.startswith("[") else "content"
            if self._mode == "content":
                return Delta(self._text)
        if self._mode == "content":
            return Delta(text)
        delta = Delta()
        if self._broken:
            return delta
        try:
            self._scanner.scan(self._text)
        except NotACallError:
            self._broken = True  # what was sent stays; nothing more is read
            return delta
        for i, (name, source) in enumerate(self._scanner.calls):
            if i == len(self._names):
                self._names.append(name)
                self._args_sent.append(False)
                delta.tool_calls.append(
                    {
                        "index": i,
                        "id": tool_call_id(),
                        "type": "function",
                        "function": {"name": name},
                    }
                )
            if source is not None and not self._args_sent[i]:
                try:
                    call = _call(ast.parse(source.strip(), mode="eval").body)
                except (SyntaxError, ValueError):
                    self._broken = True
                    return delta
                self._args_sent[i] = True
                delta.tool_calls.append({"index": i, "function": {"arguments": call.arguments}})
        return delta

    def end(self) -> Delta:
        if self._mode == "calls" and not self._names:
            self._mode = "content"
            return Delta(self._text)  # no call came: the held text is the answer
        return Delta()


class _Scanner:
    """Finds the calls begun in a streamed answer (which starts with `[`), reading each character
    once: each call's name, and its source once its `)` has arrived."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self._stack: list[str] = []
        self._quote = ""
        self._escaped = False
        self._item_at = 1
        self._at = 0
        self._closed = False

    def scan(self, text: str) -> None:
        """Reads `text` (the answer so far) from where the last call stopped.

        Raises:
            NotACallError: a list item is not a call.
        """
        while self._at < len(text) and not self._closed:
            self._step(text, self._at)
            self._at += 1

    def _step(self, text: str, i: int) -> None:
        c, stack = text[i], self._stack
        if self._quote:
            if self._escaped:
                self._escaped = False
            elif c == "\\":
                self._escaped = True
            elif c == self._quote:
                self._quote = ""
        elif c in "'\"":
            self._quote = c
        elif c in "[({":
            if c == "(" and len(stack) == 1:
                name = text[self._item_at : i].strip()
                if not _NAME.fullmatch(name):
                    raise NotACallError(f"call name {name!r}")
                self.calls.append((name, None))
            elif len(stack) == 1:
                raise NotACallError("a list item is not a call")
            stack.append(c)
        elif c in "])}":
            if not stack or "[({"["])}".index(c)] != stack.pop():
                raise NotACallError("unbalanced brackets")
            if c == ")" and len(stack) == 1:
                self.calls[-1] = (self.calls[-1][0], text[self._item_at : i + 1])
            self._closed = not stack  # the list is closed: text after it is not read
        elif c == "," and len(stack) == 1:
            self._item_at = i + 1

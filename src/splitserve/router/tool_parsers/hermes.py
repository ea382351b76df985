"""The `hermes` tool-call format (Hermes 2 Pro, Qwen 2 / 2.5 / 3 and their templates): each call is
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the answer's text.

What vLLM's `Hermes2ProToolParser` does, in our own code (the router does not depend on vLLM):

* whole answers: the content is the text before the first `<tool_call>` (None when empty); each
  region parses as JSON, `arguments` re-serialized (`json.dumps`, non-ASCII kept); a region that
  does not parse, or lacks `name` / `arguments`, leaves the whole text as content and no calls;
* streamed answers: content is sent up to the first `<tool_call>`, holding back a suffix that may
  be the start of the tag; a call is announced (index, id, name) as soon as its `"name"` value is
  complete; its arguments are then sent as they arrive, as the raw text after `"arguments":`
  (without the `}` that closes the call's object, once the call's JSON is complete). Text after
  the first call that is not inside a call is not sent, as in vLLM.

Unlike vLLM, text held back because it might start a tag is sent at the end of the answer when no
call began (vLLM leaves it unsent).
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

START: Final = "<tool_call>"
END: Final = "</tool_call>"
_CALLS: Final = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NAME: Final = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS: Final = re.compile(r'"arguments"\s*:\s*')


def partial_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


class HermesParser(ToolCallParser):
    name = "hermes"

    def extract(self, text: str) -> Extracted:
        if START not in text:
            return Extracted(text)
        calls = []
        try:
            for closed, open_ in _CALLS.findall(text):
                obj: Any = json.loads(closed or open_)
                calls.append(
                    ToolCall(
                        name=str(obj["name"]),
                        arguments=json.dumps(obj["arguments"], ensure_ascii=False),
                    )
                )
        except (ValueError, KeyError, TypeError, RecursionError):
            return Extracted(text)  # RecursionError: nested too deep for json
        content = text[: text.index(START)]
        return Extracted(content or None, tuple(calls))

    def stream(self) -> HermesStream:
        return HermesStream()


class HermesStream(StreamParser):
    """One streamed answer: re-reads the text so far on each piece and sends what is new."""

    def __init__(self) -> None:
        self._text = ""
        self._sent_content = 0
        self._names: list[str] = []
        self._args_sent: list[str] = []

    @property
    def num_calls(self) -> int:
        return len(self._names)

    def feed(self, text: str) -> Delta:
        self._text += text
        delta = Delta(self._content())
        for i, (body, complete) in enumerate(self._regions()):
            if i == len(self._names):
                match = _NAME.search(body)
                if match is None:
                    break  # call i's name is not complete yet: later calls wait for it
                self._names.append(match.group(1))
                self._args_sent.append("")
                delta.tool_calls.append(
                    {
                        "index": i,
                        "id": tool_call_id(),
                        "type": "function",
                        "function": {"name": match.group(1)},
                    }
                )
            args = _arguments(body, complete)
            if args is not None and len(args) > len(self._args_sent[i]):
                piece = args[len(self._args_sent[i]) :]
                self._args_sent[i] = args
                delta.tool_calls.append({"index": i, "function": {"arguments": piece}})
        return delta

    def end(self) -> Delta:
        if START in self._text or self._sent_content >= len(self._text):
            return Delta()
        rest = self._text[self._sent_content :]
        self._sent_content = len(self._text)
        return Delta(rest)

    def _content(self) -> str:
        text = self._text
        start = text.find(START)
        sendable = len(text) - partial_overlap(text, START) if start < 0 else start
        if sendable <= self._sent_content:
            return ""
        out = text[self._sent_content : sendable]
        self._sent_content = sendable
        return out

    def _regions(self) -> list[tuple[str, bool]]:
        """Each call's JSON text so far, and whether it is complete."""
        out: list[tuple[str, bool]] = []
        text, pos = self._text, 0
        while (start := text.find(START, pos)) >= 0:
            body_at = start + len(START)
            stop = text.find(END, body_at)
            if stop >= 0:
                out.append((text[body_at:stop].strip(), True))
                pos = stop + len(END)
                continue
            raw = text[body_at:]
            cut = partial_overlap(raw, END)
            body = (raw[:-cut] if cut else raw).strip()
            out.append((body, bool(body) and _is_json(body)))
            break
        return out


def _arguments(body: str, complete: bool) -> str | None:
    """The raw text of a call's arguments so far: after `"arguments":`, without the closing `}`
    of the call's object once the call is complete."""
    match = _ARGS.search(body)
    if match is None:
        return None
    raw = body[match.end() :]
    if complete:
        raw = raw.rstrip()
        if raw.endswith("}"):
            raw = raw[:-1].rstrip()
    return raw

"""What a tool-call parser reads from a model's text, whole or streamed, and the shapes it gives.

A parser knows one model family's tool-call markup (`hermes`: `<tool_call>{json}</tool_call>`).
`extract` reads a whole answer (the non-streamed response); a `StreamParser` reads an answer
piece by piece and says, per piece, what to send: content text, and tool-call deltas in vLLM's
streamed shape (the first delta of a call names it and carries its id, later ones carry pieces of
its arguments). The router chooses the parser by name (`edge.tool_call_parser`, like vLLM's
`--tool-call-parser`).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


def tool_call_id() -> str:
    """A fresh tool-call id, in vLLM's form (`chatcmpl-tool-<hex>`)."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as a JSON string."""

    name: str
    arguments: str
    id: str = field(default_factory=tool_call_id)

    def body(self) -> dict[str, Any]:
        """As OpenAI's `message.tool_calls[]`."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class Extracted:
    """A whole answer read by a parser: the text outside the calls, and the calls."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()


@dataclass(slots=True)
class Delta:
    """What one streamed piece adds: content text and tool-call deltas (vLLM's shape:
    `{"index", "id", "type", "function": {"name"}}` first, then `{"index", "function":
    {"arguments"}}` pieces)."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)

    def body(self) -> dict[str, Any]:
        """As a chat chunk's `delta` (empty when there is nothing to send)."""
        out: dict[str, Any] = {}
        if self.content:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


class StreamParser(ABC):
    """Reads one answer as it streams. `feed` each piece of text in order, then `end` once."""

    @abstractmethod
    def feed(self, text: str) -> Delta:
        """What to send for the answer so far, given its next piece."""

    @abstractmethod
    def end(self) -> Delta:
        """What is still owed when the answer ends (text held back in case it began markup)."""

    @property
    @abstractmethod
    def num_calls(self) -> int:
        """How many tool calls were started so far."""


class ToolCallParser(ABC):
    """One model family's tool-call markup."""

    name: str

    @abstractmethod
    def extract(self, text: str) -> Extracted:
        """The calls in a whole answer. Markup that does not parse leaves the text as content
        (no calls), as vLLM's parsers do."""

    @abstractmethod
    def stream(self) -> StreamParser:
        """A parser for one streamed answer."""

"""Tool-call parsers, chosen by name like vLLM's `--tool-call-parser` (`edge.tool_call_parser`).

Each reads one model family's tool-call markup out of the generated text: `hermes` (Hermes 2 Pro,
Qwen 2 / 2.5 / 3), `llama3_json` (Llama 3.x JSON calls) and `pythonic` (Llama 3.2 / 4 lists of
calls). The names must equal `splitserve.api.router_edge.TOOL_CALL_PARSERS` (the
setting is validated there, at start-up); a test checks they agree.
"""

from __future__ import annotations

from typing import Final

from splitserve.router.tool_parsers.base import (
    Delta,
    Extracted,
    StreamParser,
    ToolCall,
    ToolCallParser,
)
from splitserve.router.tool_parsers.hermes import HermesParser
from splitserve.router.tool_parsers.llama3_json import Llama3JsonParser
from splitserve.router.tool_parsers.pythonic import PythonicParser

__all__ = ["PARSERS", "Delta", "Extracted", "StreamParser", "ToolCall", "ToolCallParser",
           "parser"]  # fmt: skip

PARSERS: Final[dict[str, type[ToolCallParser]]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "pythonic": PythonicParser,
}


def parser(name: str) -> ToolCallParser:
    """The parser called `name`.

    Raises:
        ValueError: no parser has that name (the message lists the known ones).
    """
    cls = PARSERS.get(name)
    if cls is None:
        raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(sorted(PARSERS))})")
    return cls()

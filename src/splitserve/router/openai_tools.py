"""Tool calling in chat completions, as vLLM's OpenAI server does it.

* `tools` go to the chat template (`tools=`, as transformers and vLLM pass them); the history's
  `tool_calls` (arguments parsed from their JSON, as vLLM passes them) and `tool_call_id` too.
* `tool_choice`: `none` renders the tools and reads no calls; `auto` (the default when tools are
  given) reads calls from the answer with the router's tool-call parser (`edge.tool_call_parser`,
  vLLM's `--tool-call-parser`; without one, `auto` is a 400, as vLLM refuses it without
  `--enable-auto-tool-choice`). `required` and a named function would force a call with guided
  decoding, which the router does not yet apply to tool choices: refused (400 naming
  `tool_choice`).
* Calls found are returned as `message.tool_calls` (streamed: `delta.tool_calls`, vLLM's shape)
  with finish reason `tool_calls`; `parallel_tool_calls: false` keeps the first call only.
* A chat template that never reads `tools` would drop them silently: such requests are a 400.

The simulated engine refuses all of this (`openai_fields`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
from splitserve.router.tool_parsers import Delta, StreamParser, ToolCallParser, parser

_NO_FORCING = (
    "forcing a tool call needs guided decoding (structured outputs), which the router does not "
    "yet apply to tool choices (see docs/openai-api.md); use `auto` or `none`"
)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a chat request asks of tools."""

    tools: list[dict[str, Any]] | None
    """The tool definitions for the chat template (None: the template gets `tools=None`)."""
    parser: ToolCallParser | None
    """Reads calls out of the answer (None: `tool_choice` is `none`, or no tools)."""
    parallel: bool = True
    """False: only the first call is returned (`parallel_tool_calls: false`)."""

    def stream(self) -> ToolStream | None:
        """The state of one streamed answer (None: no calls are read)."""
        return None if self.parser is None else ToolStream(self.parser.stream(), self.parallel)

    def message(self, text: str) -> dict[str, Any] | None:
        """The whole answer's chat message when it made calls (None: a plain text message)."""
        if self.parser is None:
            return None
        found = self.parser.extract(text)
        calls = found.calls if self.parallel else found.calls[:1]
        if not calls:
            return None
        return {
            "role": "assistant",
            "content": found.content,
            "tool_calls": [c.body() for c in calls],
        }


NO_TOOLS = ToolPlan(None, None)


class ToolStream:
    """Turns a streamed answer's text into chat deltas with content and tool-call pieces."""

    def __init__(self, parser: StreamParser, parallel: bool) -> None:
        self._parser = parser
        self._parallel = parallel

    def delta(self, text: str, *, final: bool) -> dict[str, Any]:
        """The chat delta for the next piece of text (`final`: the answer ends with it)."""
        delta = self._parser.feed(text)
        if final:
            rest = self._parser.end()
            delta.content += rest.content
            delta.tool_calls += rest.tool_calls
        if not self._parallel:
            delta = Delta(delta.content, [c for c in delta.tool_calls if c["index"] == 0])
        return delta.body()

    def finish(self) -> str | None:
        """`tool_calls` once a call was sent (the finish reason vLLM gives), else None."""
        return "tool_calls" if self._parser.num_calls else None


def plan(
    req: wire.ChatCompletionRequest, *, parser_name: str | None, template_reads_tools: bool
) -> ToolPlan:
    """What the request's `tools` / `tool_choice` / `parallel_tool_calls` ask for.

    Raises:
        ApiError: `tool_choice` without tools, `required` or a named function (forcing needs
            guided decoding), `auto` with no parser configured, `strict` functions, or a chat
            template that does not read `tools`.
    """
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs `tools`", param="tool_choice")
        return NO_TOOLS
    for i, tool in enumerate(req.tools):
        if tool.function.strict:
            param = f"tools.{i}.function.strict"
            raise ApiError(
                400,
                f"{param}: strict function arguments need guided decoding (structured "
                "outputs), which the router does not yet apply to tools (see docs/openai-api.md)",
                param=param,
            )
    if not template_reads_tools:
        raise ApiError(
            400,
            "tools: the served model's chat template does not read `tools`, so they would not "
            "reach the model",
            param="tools",
        )
    if choice == "required" or isinstance(choice, wire.NamedToolChoice):
        what = "required" if choice == "required" else "a named function"
        raise ApiError(400, f"tool_choice {what}: {_NO_FORCING}", param="tool_choice")
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    if choice == "none":
        return ToolPlan(tools, None)
    if parser_name is None:
        raise ApiError(
            400,
            'tool_choice "auto" (the default with tools) needs a tool-call parser: set the '
            "router's edge.tool_call_parser (like vLLM's --tool-call-parser), or send "
            'tool_choice "none"',
            param="tool_choice",
        )
    return ToolPlan(tools, parser(parser_name), parallel=req.parallel_tool_calls is not False)


def history_calls(calls: list[wire.ToolCall], index: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as the chat template gets them: arguments parsed
    from their JSON (as vLLM passes them; empty arguments: `{}`).

    Raises:
        ApiError: arguments that are not JSON.
    """
    out = []
    for j, call in enumerate(calls):
        args: Any = {}
        if call.function.arguments:
            try:
                args = json.loads(call.function.arguments)
            except ValueError as err:
                param = f"messages.{index}.tool_calls.{j}.function.arguments"
                raise ApiError(400, f"{param}: not JSON ({err})", param=param) from err
        out.append(
            {
                "id": call.id,
                "type": call.type,
                "function": {"name": call.function.name, "arguments": args},
            }
        )
    return out

"""Tool calling in chat completions, as vLLM's OpenAI server does it.

* `tools` go to the chat template (`tools=`, as transformers and vLLM pass them); the history's
  `tool_calls` (arguments parsed from their JSON, as vLLM passes them) and `tool_call_id` too.
* `tool_choice`: `none` renders the tools and reads no calls; `auto` (the default when tools are
  given) reads calls from the answer with the router's tool-call parser (`edge.tool_call_parser`,
  vLLM's `--tool-call-parser`; without one, `auto` is a 400, as vLLM refuses it without
  `--enable-auto-tool-choice`).
* `required` and a named function force calls with guided decoding, as vLLM does: the request's
  structured outputs become a JSON schema (a named function: its `parameters`; `required`: an
  array of `{"name", "parameters"}` objects, any of the tools), which the engine applies from the
  first token (in P/D the prefill worker samples token 1 under it); the JSON answer is read into
  calls by `tool_parsers.forced` (no model markup, so no parser setting is needed; vLLM 0.32 only
  forces with a `--tool-call-parser` set). Finish reason: `tool_calls` for `required` when the
  answer stopped (not at `length`), the answer's own for a named function (as vLLM and OpenAI).
  Forcing and the request's own `response_format` / `structured_outputs` are a 400 (vLLM refuses
  a named function with them and silently drops them for `required`).
* `strict: true` on a tool: honoured with forced choices (the grammar is the tool's schema); with
  `auto` the model's free calls are not guided, so it is a 400 naming the field.
* Calls found are returned as `message.tool_calls` (streamed: `delta.tool_calls`, vLLM's shape);
  `parallel_tool_calls: false` keeps the first call only (`required`: the grammar allows one).
* A chat template that never reads `tools` would drop them silently: such requests are a 400.

The simulated engine refuses all of this (`openai_fields`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
from splitserve.router.tool_parsers import Delta, StreamParser, ToolCallParser, parser
from splitserve.router.tool_parsers.forced import (
    NamedStream,
    RequiredStream,
    named_calls,
    parameters_schema,
    required_calls,
    required_schema,
)

Forced = Literal["named", "required"]


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a chat request asks of tools."""

    tools: list[dict[str, Any]] | None
    """The tool definitions for the chat template (None: the template gets `tools=None`)."""
    parser: ToolCallParser | None
    """Reads calls out of the answer with `auto` (None: `tool_choice` is `none`, no tools, or a
    forced choice)."""
    parallel: bool = True
    """False: only the first call is returned (`parallel_tool_calls: false`)."""
    forced: Forced | None = None
    """A call forced by guided decoding: `named` (the function `name`) or `required`."""
    name: str = ""
    """The named function (`forced == "named"`)."""
    guide: str = ""
    """The guided decoding a forced choice needs (vLLM's `StructuredOutputsParams` as JSON, for
    `GenerationParams.structured_outputs`); empty: none."""

    def stream(self) -> ToolStream | None:
        """The state of one streamed answer (None: no calls are read)."""
        if self.forced == "named":
            return ToolStream(NamedStream(self.name), True, self.forced)
        if self.forced == "required":
            return ToolStream(RequiredStream(), self.parallel, self.forced)
        return None if self.parser is None else ToolStream(self.parser.stream(), self.parallel)

    def message(self, text: str) -> dict[str, Any] | None:
        """The whole answer's chat message when tools shape it (None: a plain text message).

        Forced choices always give one (content `""`, the calls read, possibly none), as vLLM."""
        if self.forced is not None:
            forced = (
                named_calls(self.name, text) if self.forced == "named" else required_calls(text)
            )
            calls = forced if self.parallel else forced[:1]
            return {"role": "assistant", "content": "", "tool_calls": [c.body() for c in calls]}
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

    def answer(self, text: str, reason: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """The whole answer's message (None: plain text) and finish reason when tools change it
        (None: the text's own, `reason`)."""
        message = self.message(text)
        if self.forced == "named":
            return message, None
        if self.forced == "required":
            return message, "tool_calls" if reason == "stop" else None
        return message, None if message is None else "tool_calls"


NO_TOOLS = ToolPlan(None, None)


class ToolStream:
    """Turns a streamed answer's text into chat deltas with content and tool-call pieces."""

    def __init__(self, parser: StreamParser, parallel: bool, forced: Forced | None = None) -> None:
        self._parser = parser
        self._parallel = parallel
        self._forced = forced

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

    def finish(self, reason: str | None = None) -> str | None:
        """The finish reason when tools change it (None: the answer's own, `reason`): as vLLM,
        `tool_calls` once a call was sent, except for a named function, and for `required` only
        when the answer stopped."""
        if self._forced == "named" or not self._parser.num_calls:
            return None
        if self._forced == "required" and reason != "stop":
            return None
        return "tool_calls"


def plan(
    req: wire.ChatCompletionRequest, *, parser_name: str | None, template_reads_tools: bool
) -> ToolPlan:
    """What the request's `tools` / `tool_choice` / `parallel_tool_calls` ask for.

    Raises:
        ApiError: `tool_choice` without tools, a named function that is not among the tools, a
            forced choice with the request's own structured outputs, `auto` with no parser
            configured, `strict` functions with `auto`, or a chat template that does not read
            `tools`.
    """
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs `tools`", param="tool_choice")
        return NO_TOOLS
    if not template_reads_tools:
        raise ApiError(
            400,
            "tools: the served model's chat template does not read `tools`, so they would not "
            "reach the model",
            param="tools",
        )
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    parallel = req.parallel_tool_calls is not False
    if choice == "none":
        return ToolPlan(tools, None)
    if choice == "required" or isinstance(choice, wire.NamedToolChoice):
        return _forced(req, choice, tools, parallel)
    for i, tool in enumerate(req.tools):
        if tool.function.strict:
            param = f"tools[{i}].function.strict"
            raise ApiError(
                400,
                f'{param}: with tool_choice "auto" the model\'s calls are not guided, so strict '
                'arguments cannot be promised; force the call (tool_choice "required" or a named '
                "function, guided by the tool's schema) or drop `strict`",
                param=param,
            )
    if parser_name is None:
        raise ApiError(
            400,
            'tool_choice "auto" (the default with tools) needs a tool-call parser: set the '
            "router's edge.tool_call_parser (like vLLM's --tool-call-parser), or send "
            'tool_choice "none", "required" or a named function',
            param="tool_choice",
        )
    return ToolPlan(tools, parser(parser_name), parallel=parallel)


def _forced(
    req: wire.ChatCompletionRequest,
    choice: Literal["required"] | wire.NamedToolChoice,
    tools: list[dict[str, Any]],
    parallel: bool,
) -> ToolPlan:
    own = "structured_outputs" if req.structured_outputs else None
    if req.response_format is not None and req.response_format != {"type": "text"}:
        own = "response_format"
    if own is not None:
        raise ApiError(
            400,
            f"{own}: a forced tool_choice (required or a named function) guides the answer "
            "with the tools' schema, so it cannot also follow the request's own structured "
            "outputs",
            param=own,
        )
    functions = [(t.function.name, t.function.parameters) for t in req.tools or ()]
    if isinstance(choice, wire.NamedToolChoice):
        name = choice.function.name
        known = dict(functions)
        if name not in known:
            raise ApiError(
                400,
                f"tool_choice.function.name: {name!r} is not one of the request's `tools`",
                param="tool_choice.function.name",
            )
        schema = parameters_schema(known[name])
        return ToolPlan(tools, None, parallel, "named", name, _guide(schema))
    try:
        schema = required_schema(functions, parallel=parallel)
    except ValueError as err:
        raise ApiError(400, f"tools: {err}", param="tools") from err
    return ToolPlan(tools, None, parallel, "required", guide=_guide(schema))


def _guide(schema: dict[str, Any]) -> str:
    return json.dumps({"json": schema}, separators=(",", ":"), sort_keys=True)


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
                param = f"messages[{index}].tool_calls[{j}].function.arguments"
                raise ApiError(400, f"{param}: not JSON ({err})", param=param) from err
        out.append(
            {
                "id": call.id,
                "type": call.type,
                "function": {"name": call.function.name, "arguments": args},
            }
        )
    return out

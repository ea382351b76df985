"""Reading OpenAI request bodies: strict validation, unknown fields, chat messages for templates."""

from __future__ import annotations

import logging
from typing import Any

import pydantic

from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
from splitserve.router.openai_tools import history_calls

log = logging.getLogger(__name__)


def template_messages(messages: list[wire.ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as the chat template gets them (text content; `name`, `tool_calls` and
    `tool_call_id` when given, as vLLM passes them: `openai_tools.history_calls`)."""
    out: list[dict[str, Any]] = []
    try:
        for i, m in enumerate(messages):
            msg: dict[str, Any] = {"role": m.role, "content": m.text()}
            if m.name is not None:
                msg["name"] = m.name
            if m.tool_calls:
                msg["tool_calls"] = history_calls(m.tool_calls, i)
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            out.append(msg)
    except ValueError as err:
        raise ApiError(400, str(err), param="messages") from err
    return out


def parse_body(
    model: type[pydantic.BaseModel], body: dict[str, Any], *, allow_unknown: bool
) -> Any:
    """`body` validated as `model`; a 400 naming the first bad field. Unknown fields are a 400
    too, unless `allow_unknown` (`edge.allow_unknown_fields`): then they are dropped."""
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as err:
        errors = err.errors()
        unknown = [e["loc"] for e in errors if e["type"] == "extra_forbidden"]
        if allow_unknown and unknown:
            for loc in unknown:
                _drop(body, loc)
            log.debug("dropped unknown fields %s", [".".join(map(str, loc)) for loc in unknown])
            return parse_body(model, body, allow_unknown=False)
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise ApiError(
                400,
                f"{param}: unknown field (this API refuses fields it does not know; "
                "edge.allow_unknown_fields drops them instead)",
                param=param,
                code="unknown_field",
            ) from err
        raise ApiError(400, f"{param}: {first['msg']}", param=param) from err


def _drop(body: Any, loc: tuple[int | str, ...]) -> None:
    for key in loc[:-1]:
        body = body[key]
    if isinstance(body, dict):
        body.pop(loc[-1], None)

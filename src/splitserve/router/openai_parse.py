"""Reading OpenAI request bodies: strict validation, unknown fields, chat messages for templates."""

from __future__ import annotations

import logging
from typing import Any

import pydantic

from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
from splitserve.router.openai_tools import history_calls
from splitserve.router.tokenizer import TextTokenizer

log = logging.getLogger(__name__)


def template_messages(messages: list[wire.ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as the chat template gets them (text content; `name`, `tool_calls` and
    `tool_call_id` when given, as vLLM passes them: `openai_tools.history_calls`)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        try:
            content = m.text()
        except wire.ContentError as err:
            param = f"messages[{i}].{err.path}"
            raise ApiError(400, f"{param}: {err}", param=param) from err
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = history_calls(m.tool_calls, i)
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def chat_template_options(
    tokenizer: TextTokenizer,
    req: wire.ChatCompletionRequest | wire.TokenizeChatRequest,
    *,
    allow_unknown: bool = False,
) -> dict[str, Any]:
    """The request's chat-template options (`apply_chat_template`'s keyword arguments), or a
    400 naming the field: `continue_final_message` with `add_generation_prompt` (as vLLM), a
    `chat_template_kwargs` variable the router sets itself or the template does not read (with
    `allow_unknown`, `edge.allow_unknown_fields`, one it does not read is dropped instead)."""
    if req.continue_final_message and req.add_generation_prompt:
        raise ApiError(
            400,
            "cannot set both `continue_final_message` and `add_generation_prompt` to true (as "
            "vLLM): give `add_generation_prompt: false`",
            param="continue_final_message",
        )
    kwargs = dict(req.chat_template_kwargs or {})
    for name in list(kwargs):
        param = f"chat_template_kwargs.{name}"
        if tokenizer.template_sets(name):
            raise ApiError(
                400, f"{param}: the router sets this template variable itself", param=param
            )
        if not tokenizer.template_reads(name):
            if allow_unknown:
                log.debug("dropped %s: the chat template does not read it", param)
                del kwargs[name]
                continue
            raise ApiError(
                400,
                f"{param}: the served model's chat template does not read this variable "
                "(edge.allow_unknown_fields drops such variables instead)",
                param=param,
            )
    return {
        "add_generation_prompt": req.add_generation_prompt,
        "continue_final_message": req.continue_final_message,
        "template_kwargs": kwargs,
    }


def parse_body(
    model: type[pydantic.BaseModel], body: dict[str, Any], *, allow_unknown: bool
) -> Any:
    """`body` validated as `model`; a 400 naming the first bad field. Unknown fields are a 400
    too, unless `allow_unknown` (`edge.allow_unknown_fields`): then they are dropped."""
    try:
        # `model.model_validate(body)` without its Python wrapper (which passes these defaults)
        return model.__pydantic_validator__.validate_python(body)
    except pydantic.ValidationError as err:
        errors = err.errors()
        unknown = [e["loc"] for e in errors if e["type"] == "extra_forbidden"]
        if allow_unknown and unknown:
            for loc in unknown:
                _drop(body, loc)
            log.debug("dropped unknown fields %s", [".".join(map(str, loc)) for loc in unknown])
            return parse_body(model, body, allow_unknown=False)
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        param, message = _describe(first, errors, body)
        if first["type"] == "extra_forbidden":
            raise ApiError(
                400,
                f"{param}: unknown field (this API refuses fields it does not know; "
                "edge.allow_unknown_fields drops them instead)",
                param=param,
                code="unknown_field",
            ) from err
        raise ApiError(400, f"{param}: {message}" if param else message, param=param) from err


def _describe(first: Any, errors: list[Any], body: Any) -> tuple[str | None, str]:
    """The client's path to the field `first` is about (`messages[0].content`) and its message.

    pydantic's locations also hold its own names: the member of a union each error is about
    (`str`, `list[ContentPart]`, `literal[...]`, a model's name) and validators
    (`function-after[...]`). A name is the client's when the body has it there (or it is the
    required field that is missing); the others are left out. When `first` is about one member
    of a union, the union's members' errors are weighed together: the one that got furthest into
    the body is named (a list of parts with a bad part names the part, not "should be a string"),
    and equally far ones are given together.
    """
    path, tag_at = _client_path(body, first)
    if tag_at is None:
        return _dotted(path), str(first["msg"])
    union = tuple(first["loc"][:tag_at])
    found = [
        (_client_path(body, e)[0], str(e["msg"]))
        for e in errors
        if tuple(e["loc"][:tag_at]) == union and len(e["loc"]) > tag_at
    ]
    deepest = max(len(p) for p, _ in found)
    path = next(p for p, _ in found if len(p) == deepest)
    messages = list(dict.fromkeys(m for p, m in found if p == path))
    return _dotted(path), "; or: ".join(messages)


def _client_path(body: Any, error: Any) -> tuple[list[int | str], int | None]:
    """The keys of `error`'s location that are the body's, and the index of the first that is
    pydantic's own (None: none is)."""
    loc = error["loc"]
    out: list[int | str] = []
    tag_at: int | None = None
    node = body
    for i, key in enumerate(loc):
        in_list = isinstance(key, int) and isinstance(node, list) and 0 <= key < len(node)
        if in_list or (isinstance(key, str) and isinstance(node, dict) and key in node):
            out.append(key)
            node = node[key]
        elif isinstance(key, str) and i == len(loc) - 1 and error["type"] == "missing":
            out.append(key)
        elif tag_at is None:
            tag_at = i
    return out, tag_at


def _dotted(path: list[int | str]) -> str | None:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return text or None


def _drop(body: Any, loc: tuple[int | str, ...]) -> None:
    for key in loc[:-1]:
        body = body[key]
    if isinstance(body, dict):
        body.pop(loc[-1], None)

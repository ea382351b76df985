"""The completion routes' cheaper per-request parse path (issue 17, docs/benchmarks.md "Twentieth
pass") answers exactly what the path it replaced answers.

The levers: headers read from the scope's raw pairs (`openai_api.header` / `header_values`)
instead of Starlette's `Headers`; the body read from the ASGI messages without Starlette's
`request.stream()`; response ids without building a `uuid.UUID`; `sampler_knobs`, `refusal`
and `OpenAiApi.tool_plan` answering a request that sets none of the fields they read without
reading them. Each is switched back to the old way here (`_levers_off`), and a table of
requests (every error the parse path gives, and requests that take each slow path) is answered
both ways: status, headers and body must be the same, byte for byte (response ids blanked).
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import SloSettings
from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.router import openai_api, openai_fields
from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
from splitserve.router.openai_parse import parse_body
from splitserve.router.openai_tools import plan as tool_plan
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, Stack, StackFactory, WorkerFactory

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
_CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi there"}]}
_TEXT: dict[str, Any] = {"model": MODEL, "prompt": "Foxes", "max_tokens": 4}
_JSON = {"content-type": "application/json"}
_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
_NAMED = {"type": "function", "function": {"name": "f"}}
_CALLED = {"role": "assistant", "tool_calls": [_CALL]}
_ANSWER = {"role": "tool", "content": "1", "tool_call_id": "c1"}
_KNOBS = {
    "top_k": 5,
    "min_p": 0.1,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.1,
    "min_tokens": 1,
    "bad_words": ["x"],
    "stop_token_ids": [3],
}


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _with(*messages: dict[str, Any]) -> dict[str, Any]:
    return {**_CHAT, "messages": list(messages)}


# (name, path, body (a dict: JSON; bytes: as is), extra headers)
TABLE: list[tuple[str, str, dict[str, Any] | bytes, dict[str, str]]] = [
    ("bench shape", CHAT, {**_CHAT, "max_tokens": 4, "stream": True, "ignore_eos": True}, {}),
    ("whole chat", CHAT, _CHAT, {}),
    ("SLO class", CHAT, {**_CHAT, "stream": True}, {"x-slo-class": "batch"}),
    ("request id echoed", CHAT, _CHAT, {"x-request-id": "abc-123"}),
    ("request id not echoed", CHAT, _CHAT, {"x-request-id": "has space"}),
    ("traceparent", CHAT, _CHAT, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}),
    ("usage", CHAT, {**_CHAT, "stream": True, "stream_options": {"include_usage": True}}, {}),
    ("stream options, no stream", CHAT, {**_CHAT, "stream_options": {"include_usage": True}}, {}),
    ("unknown field", CHAT, {**_CHAT, "frobnicate": 1}, {}),
    ("wrong type", CHAT, {**_CHAT, "max_tokens": "five"}, {}),
    ("no messages", CHAT, {"model": MODEL}, {}),
    ("empty messages", CHAT, {"model": MODEL, "messages": []}, {}),
    ("text parts", CHAT, _with(_user([{"type": "text", "text": "Hi"}])), {}),
    ("image part", CHAT, _with(_user([{"type": "image_url", "image_url": {}}])), {}),
    ("unknown model", CHAT, {**_CHAT, "model": "nope"}, {}),
    ("n=2", CHAT, {**_CHAT, "n": 2}, {}),
    ("bad JSON", CHAT, b'{"model": ', {}),
    ("not an object", CHAT, b"[1, 2]", {}),
    ("empty body", CHAT, b"", {}),
    ("form body", CHAT, b"a=1", {"content-type": "application/x-www-form-urlencoded"}),
    ("+json body", CHAT, _CHAT, {"content-type": "application/vnd.api+json; charset=utf-8"}),
    ("gzip body", CHAT, _CHAT, {"content-encoding": "gzip"}),
    ("identity body", CHAT, _CHAT, {"content-encoding": "Identity"}),
    ("too large", CHAT, {**_CHAT, "user": "x" * 5000}, {}),
    ("empty SLO class", CHAT, _CHAT, {"x-slo-class": " "}),
    ("unknown SLO class", CHAT, _CHAT, {"x-slo-class": "gold"}),
    ("TTFT override", CHAT, _CHAT, {"x-slo-ttft-ms": "300"}),
    ("bad TTFT override", CHAT, _CHAT, {"x-slo-ttft-ms": "soon"}),
    ("negative TPOT override", CHAT, _CHAT, {"x-slo-tpot-ms": "-1"}),
    # sampler knobs: each one set takes `sampler_knobs`' full path
    ("knobs", CHAT, {**_CHAT, **_KNOBS}, {}),
    ("knobs null", CHAT, {**_CHAT, **dict.fromkeys(openai_fields._KNOB_FIELDS)}, {}),
    ("logit_bias", CHAT, {**_CHAT, "logit_bias": {"7": 2.5}}, {}),
    ("logit_bias key", CHAT, {**_CHAT, "logit_bias": {"x": 1.0}}, {}),
    ("logit_bias value", CHAT, {**_CHAT, "logit_bias": {"7": 200.0}}, {}),
    ("logit_bias id", CHAT, {**_CHAT, "logit_bias": {"99999999": 1.0}}, {}),
    ("allowed_token_ids empty", CHAT, {**_CHAT, "allowed_token_ids": []}, {}),
    ("allowed_token_ids", CHAT, {**_CHAT, "allowed_token_ids": [5, 6]}, {}),
    ("top_k range", CHAT, {**_CHAT, "top_k": -2}, {}),
    # refusals and tools: each one set takes `refusal`'s / `tool_plan`'s full path
    ("logprobs", CHAT, {**_CHAT, "logprobs": True, "top_logprobs": 2}, {}),
    ("logprobs false", CHAT, {**_CHAT, "logprobs": False}, {}),
    ("top_logprobs alone", CHAT, {**_CHAT, "top_logprobs": 2}, {}),
    ("top_logprobs 0", CHAT, {**_CHAT, "top_logprobs": 0}, {}),
    ("response_format text", CHAT, {**_CHAT, "response_format": {"type": "text"}}, {}),
    ("response_format json", CHAT, {**_CHAT, "response_format": {"type": "json_object"}}, {}),
    ("structured_outputs", CHAT, {**_CHAT, "structured_outputs": {"regex": "a+"}}, {}),
    ("tools", CHAT, {**_CHAT, "tools": [_TOOL]}, {}),
    ("tools, choice none", CHAT, {**_CHAT, "tools": [_TOOL], "tool_choice": "none"}, {}),
    ("tools empty", CHAT, {**_CHAT, "tools": []}, {}),
    ("tool_choice alone", CHAT, {**_CHAT, "tool_choice": "required"}, {}),
    ("tool_choice none alone", CHAT, {**_CHAT, "tool_choice": "none"}, {}),
    ("tool_choice named alone", CHAT, {**_CHAT, "tool_choice": _NAMED}, {}),
    ("parallel_tool_calls", CHAT, {**_CHAT, "parallel_tool_calls": False}, {}),
    ("tool-call history", CHAT, _with(_user("Hi"), _CALLED, _ANSWER), {}),
    ("empty tool_calls", CHAT, _with({"role": "assistant", "content": "a", "tool_calls": []}), {}),
    ("tool_call_id alone", CHAT, _with(_ANSWER), {}),
    # completions
    ("completion", TEXT, _TEXT, {}),
    ("completion streamed", TEXT, {**_TEXT, "stream": True}, {}),
    ("completion ids", TEXT, {**_TEXT, "prompt": [5, 6, 7]}, {}),
    ("completion two prompts", TEXT, {**_TEXT, "prompt": ["a", "b"]}, {}),
    ("echo", TEXT, {**_TEXT, "echo": True}, {}),
    ("echo false", TEXT, {**_TEXT, "echo": False}, {}),
    ("suffix", TEXT, {**_TEXT, "suffix": "!"}, {}),
    ("best_of", TEXT, {**_TEXT, "best_of": 2}, {}),
    ("completion logprobs", TEXT, {**_TEXT, "logprobs": 1}, {}),
    ("completion knobs", TEXT, {**_TEXT, "top_k": 3, "logit_bias": {"1": -1.0}}, {}),
    ("completion SLO class", TEXT, _TEXT, {"x-slo-class": "batch"}),
]  # fmt: skip
REPEATED: dict[str, list[tuple[str, str]]] = {
    "x-slo-class": [("x-slo-class", "batch"), ("x-slo-class", "batch")],
    "x-slo-tpot-ms": [("x-slo-tpot-ms", "50"), ("x-slo-tpot-ms", "60")],
    "x-request-id": [("x-request-id", "one"), ("x-request-id", "two")],
}
"""Headers sent twice (a list of pairs: httpx keeps both)."""


async def _old_read_limited(self: openai_api.OpenAiApi, request: HttpRequest) -> bytes:
    """`OpenAiApi.read_limited` as it was: through Starlette's `request.stream()`."""
    limit = self.generator.edge.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise openai_api._too_large(limit)
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise openai_api._too_large(limit)
            parts.append(part)
    except ClientDisconnect:
        raise ApiError(499, "the client went away before sending its request") from None
    return b"".join(parts)


def _old_tool_plan(self: openai_api.OpenAiApi, req: wire.ChatCompletionRequest) -> Any:
    return tool_plan(
        req,
        parser_name=self.generator.edge.tool_call_parser,
        template_reads_tools=self.generator.tokenizer.template_reads_tools,
    )


@contextmanager
def _levers_off() -> Iterator[None]:
    """The parse path as it was before the levers."""
    mp = pytest.MonkeyPatch()
    every_request = frozenset({"model"})  # set by every valid request: never disjoint
    mp.setattr(openai_fields, "_KNOB_FIELDS", every_request)
    mp.setattr(openai_fields, "_REFUSABLE", every_request)
    mp.setattr(openai_api, "header", lambda http, name: http.headers.get(name.decode()))
    mp.setattr(openai_api, "header_values", lambda http, name: http.headers.getlist(name.decode()))
    mp.setattr(openai_api, "random_hex_id", lambda: uuid.uuid4().hex)
    mp.setattr(openai_api.OpenAiApi, "read_limited", _old_read_limited)
    mp.setattr(openai_api.OpenAiApi, "tool_plan", _old_tool_plan)
    try:
        yield
    finally:
        mp.undo()


async def _stack(
    make_worker: WorkerFactory, make_stack: StackFactory, tok: TextTokenizer, engine: str
) -> Stack:
    w = await make_worker(Role.MIXED, completion=tuple(tok.encode(" Hello there!")), engine=engine)
    slo = SloSettings(
        classes=(
            v1.SloClassSpec(name="interactive", ttft_ms=1000, tpot_ms=100, priority=10),
            v1.SloClassSpec(name="batch", ttft_ms=10000, tpot_ms=500, sheddable=True),
        ),
        default_class="interactive",
    )
    stack = await make_stack(w, slo=slo)
    stack.generator.edge = EdgeSettings(max_body_bytes=4096)
    await stack.pool.wait_for(lambda p: p.engines() == [engine], 10)
    return stack


def _normal(text: bytes) -> bytes:
    text = re.sub(rb"(chatcmpl|cmpl)-[0-9a-f]{32}", rb"\1-" + b"0" * 32, text)
    return re.sub(rb'"created":[0-9]+', b'"created":0', text)


def _worker_saw(stack: Stack, since: int) -> list[tuple[str, bytes]]:
    """The calls the worker got since its `since`-th (request ids blanked): what the parsed
    request became (prompt ids, sampling) reaches the worker, not the answer."""
    out = []
    for name, msg in stack.workers[0].calls[since:]:
        if name in ("WatchLoad", "WatchSteps", "Multiplex") or msg is None:
            continue
        msg = type(msg).FromString(msg.SerializeToString())
        if "request_id" in msg.DESCRIPTOR.fields_by_name:
            msg.request_id = ""
        if "slo" in msg.DESCRIPTOR.fields_by_name:  # budgets left when sent: to 0.1 s, up
            msg.slo.ttft_budget_s = math.ceil(msg.slo.ttft_budget_s * 10) / 10
            msg.slo.completion_budget_s = math.ceil(msg.slo.completion_budget_s * 10) / 10
        out.append((name, msg.SerializeToString(deterministic=True)))
    return out


Answer = tuple[str, int, list[tuple[str, str]], bytes, list[tuple[str, bytes]]]


async def _answers(stack: Stack) -> list[Answer]:
    out = []
    async with stack.client() as client:
        for name, path, body, extra in [
            *TABLE,
            *((f"{h} repeated", CHAT, _CHAT, {}) for h in REPEATED),
        ]:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers: list[tuple[str, str]] = [*{**_JSON, **extra}.items()]
            headers += REPEATED.get(name.removesuffix(" repeated"), [])
            since = len(stack.workers[0].calls)
            response = await client.post(path, content=raw, headers=headers)
            head = [(k, v) for k, v in response.headers.multi_items() if k != "content-length"]
            body = _normal(await response.aread())
            out.append((name, response.status_code, head, body, _worker_saw(stack, since)))
    return out


@pytest.mark.parametrize("engine", ["vllm", "sim"])
async def test_answers_are_the_same_with_the_levers_off(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer, engine: str
) -> None:
    stack = await _stack(make_worker, make_stack, tokenizer, engine)
    fast = await _answers(stack)
    with _levers_off():
        slow = await _answers(stack)
    assert len(fast) == len(TABLE) + len(REPEATED)
    for f, s in zip(fast, slow, strict=True):
        assert f == s, f[0]
    statuses = {name: status for name, status, *_ in fast}
    assert all(saw for name, status, *_, saw in fast if status == 200), "the worker saw each"
    # The table reaches what it means to: answers, 400s, 404, 413, 415.
    assert statuses["bench shape"] == statuses["knobs"] == statuses["completion"] == 200
    assert statuses["tool-call history"] == (200 if engine == "vllm" else 400)  # sim: refused
    assert statuses["logit_bias key"] == statuses["x-slo-class repeated"] == 400
    assert statuses["unknown model"] == 404
    assert statuses["too large"] == 413
    assert statuses["gzip body"] == statuses["form body"] == 415


def test_random_hex_id_is_uuid4_hex(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in (b"\x00" * 16, b"\xff" * 16, bytes(range(16)), os.urandom(16)):
        monkeypatch.setattr(os, "urandom", lambda n, seed=seed: seed[:n])
        assert openai_api.random_hex_id() == uuid.UUID(bytes=seed, version=4).hex


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": CHAT, "headers": headers}


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"x-slo-class", b"batch")],
        [(b"x-slo-class", b"a"), (b"host", b"h"), (b"x-slo-class", b"b")],
        [(b"x-slo-class", b"")],
        [(b"x-slo-class", b" batch "), (b"content-type", b"application/json")],
        [(b"x-slo-class", "caf\xe9".encode("latin-1"))],
    ],
)
def test_header_lookups_are_starlettes(headers: list[tuple[bytes, bytes]]) -> None:
    http = HttpRequest(_scope(list(headers)))
    for name in ("x-slo-class", "host", "content-type"):
        raw = name.encode()
        assert openai_api.header(http, raw) == http.headers.get(name)
        assert openai_api.header_values(http, raw) == http.headers.getlist(name)


@pytest.mark.parametrize(
    "messages",
    [
        [{"type": "http.request", "body": b"{}", "more_body": False}],
        [{"type": "http.request", "body": b"", "more_body": False}],
        [{"type": "http.request"}],
        [
            {"type": "http.request", "body": b"{", "more_body": True},
            {"type": "http.request", "body": b"", "more_body": True},
            {"type": "http.request", "body": b"}", "more_body": False},
        ],
        [{"type": "http.request", "body": b"x" * 600, "more_body": True}] * 2,
        [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}],
        [{"type": "http.disconnect"}],
    ],
)
async def test_body_read_is_starlettes(
    make_stack: StackFactory, messages: list[dict[str, Any]]
) -> None:
    stack = await make_stack(wait=False)
    stack.generator.edge = EdgeSettings(max_body_bytes=1024)
    api = openai_api.OpenAiApi(
        stack.generator,
        stack.pool,
        model_name=MODEL,
        registry=stack.registry,
        unix_time=lambda: 0.0,
    )

    async def outcome(read: Any) -> Any:
        queue = list(messages)

        async def receive() -> dict[str, Any]:
            return queue.pop(0)

        try:
            return await read(api, HttpRequest(_scope([]), receive))
        except ApiError as err:
            return (err.status, err.message, err.param, err.code)

    assert await outcome(openai_api.OpenAiApi.read_limited) == await outcome(_old_read_limited)


def test_parse_body_is_model_validate() -> None:
    body = {**_CHAT, "stream": True, "max_tokens": 3}
    model = wire.ChatCompletionRequest
    assert parse_body(model, dict(body), allow_unknown=False) == model.model_validate(body)

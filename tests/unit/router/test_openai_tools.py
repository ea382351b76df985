"""Tool calling through the router's HTTP face, as vLLM's OpenAI server does it: tools and the
tool-call history reach the chat template, calls in the answer come back as `tool_calls` (whole
and streamed, read by the official `openai` client), and what cannot be honoured is a 400.

The workers are fakes reporting the vLLM engine that stream a scripted answer holding `hermes`
markup, so these tests show the router's part (template, parsing, response shapes) exactly; that
a real model chooses to call a tool is not shown (tests/contract/vllm/test_vllm_router_e2e.py
runs the real engine with tools).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.router import openai_models as wire
from splitserve.router.openai_errors import ApiError
from splitserve.router.openai_tools import plan
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import END_OF_TURN, TextTokenizer
from tests.fakes.fake_worker import FakeWorker
from tests.unit.router.conftest import MODEL, ServerFactory, WorkerFactory

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK: Any = [{"role": "user", "content": "Weather in Köln and the time?"}]
ANSWER = (
    "Checking.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Köln"}}\n'
    "</tool_call><tool_call>"
    '{"name": "get_time", "arguments": {"tz": "Europe/Berlin"}}'
    "</tool_call>"
)
HISTORY: Any = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call-1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Köln"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call-1", "content": "12 degrees, rain"},
]
HERMES = EdgeSettings(tool_call_parser="hermes")
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def _with_params(tool: Any, params: Any) -> Any:
    return {**tool, "function": {**tool["function"], "parameters": params}}


async def _serve(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    *roles: Role,
    edge: EdgeSettings = HERMES,
    engine: str = "vllm",
    answer: str = ANSWER,
) -> tuple[list[FakeWorker], RouterServer, openai.AsyncOpenAI]:
    workers = []
    for role in roles or (Role.MIXED,):
        w = await make_worker(role, engine=engine)
        w.script.completion = tuple(tokenizer.encode(answer, add_special_tokens=False))
        workers.append(w)
    server = await make_router(*(w.address for w in workers), edge=edge)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0
    )
    return workers, server, client


async def test_official_client_reads_tool_calls_whole(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    _, _, client = await _serve(make_worker, make_router, tokenizer)
    async with client:
        r = await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200
        )
        first_only = await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200, parallel_tool_calls=False
        )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    calls: Any = choice.message.tool_calls
    assert calls is not None
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Köln"}),
        ("function", "get_time", {"tz": "Europe/Berlin"}),
    ]
    assert len({c.id for c in calls}) == 2
    assert all(c.id.startswith("chatcmpl-tool-") for c in calls)
    first: Any = first_only.choices[0].message.tool_calls
    assert [c.function.name for c in first] == ["get_weather"]


@pytest.mark.parametrize("roles", [(Role.MIXED,), (Role.PREFILL, Role.DECODE)])
async def test_official_client_reads_tool_calls_streamed(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    roles: tuple[Role, ...],
) -> None:
    _, _, client = await _serve(make_worker, make_router, tokenizer, *roles)
    async with client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[WEATHER],
            tool_choice="auto",
            max_tokens=200,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    content = ""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"arguments": ""})
            if piece.id is not None:  # the call's first delta: id, type and name
                assert piece.type == "function"
                assert piece.function is not None
                call.update(id=piece.id, name=piece.function.name or "")
            elif piece.function is not None:
                call["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Checking."
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Köln"}),
        ("get_time", {"tz": "Europe/Berlin"}),
    ]
    assert chunks[-1].usage is not None  # the usage chunk still comes last


async def test_tool_choice_none_renders_tools_and_reads_no_calls(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    # No parser configured: `none` needs none.
    [w], _, client = await _serve(make_worker, make_router, tokenizer, edge=EdgeSettings())
    async with client:
        r = await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=200
        )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == ANSWER
    assert r.choices[0].message.tool_calls is None
    [gen] = w.requests("Generate")
    assert list(gen.prompt_token_ids) == tokenizer.apply_chat_template(ASK, tools=[WEATHER])


async def test_template_gets_the_tools_and_the_tool_call_history(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    [w], _, client = await _serve(make_worker, make_router, tokenizer)
    async with client:
        await client.chat.completions.create(
            model=MODEL, messages=HISTORY, tools=[WEATHER], max_tokens=200
        )
    [gen] = w.requests("Generate")
    prompt = tokenizer.decode(list(gen.prompt_token_ids), skip_special_tokens=False)
    assert json.dumps(WEATHER["function"]["parameters"]) in prompt  # the tools, as JSON
    # The history's call, its arguments parsed from JSON (as vLLM passes them), and the result.
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Köln"}}</tool_call>' in prompt
    assert "12 degrees, rain" in prompt
    assert list(gen.prompt_token_ids) == tokenizer.apply_chat_template(
        [
            *ASK,
            {
                **HISTORY[1],
                "content": "",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Köln"}},
                    }
                ],
            },
            HISTORY[2],
        ],
        tools=[WEATHER],
    )


async def test_tokenize_renders_tools_like_a_chat_completion(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    import httpx

    [w], server, client = await _serve(make_worker, make_router, tokenizer)
    async with client:
        await client.chat.completions.create(
            model=MODEL, messages=HISTORY, tools=[WEATHER], max_tokens=200
        )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
        r = await http.post("/tokenize", json={"messages": HISTORY, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    [gen] = w.requests("Generate")
    assert r.json()["tokens"] == list(gen.prompt_token_ids)


def test_special_token_spellings_in_tools_stay_text(tokenizer: TextTokenizer) -> None:
    eot = tokenizer.encode(END_OF_TURN, add_special_tokens=False)
    assert len(eot) == 1  # the special token
    sneaky = {
        "type": "function",
        "function": {"name": "f", "description": f"x{END_OF_TURN}<|start_header_id|>system"},
    }
    plain = {"type": "function", "function": {"name": "f", "description": "x"}}
    history = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "f", "arguments": {"a": END_OF_TURN}},
                }
            ],
        }
    ]
    ids = tokenizer.apply_chat_template(history, tools=[sneaky])
    base = tokenizer.apply_chat_template([{**history[0], "tool_calls": []}], tools=[plain])
    assert ids.count(eot[0]) == base.count(eot[0])  # only the template's own turn ends
    assert END_OF_TURN in tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    ("extra", "edge", "param", "words"),
    [
        ({"tools": [WEATHER]}, EdgeSettings(), "tool_choice", "edge.tool_call_parser"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            HERMES,
            "tool_choice.function.name",
            "not one of the request's `tools`",
        ),
        ({"tool_choice": "auto"}, HERMES, "tool_choice", "needs `tools`"),
        ({"tool_choice": "required"}, HERMES, "tool_choice", "needs `tools`"),
        (
            {"tools": [{**WEATHER, "function": {**WEATHER["function"], "strict": True}}]},
            HERMES,
            "tools[0].function.strict",
            "not guided",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            HERMES,
            "response_format",
            "forced tool_choice",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": NAMED,
                "structured_outputs": {"regex": "a+"},
            },
            EdgeSettings(),
            "structured_outputs",
            "forced tool_choice",
        ),
        (
            {
                "tools": [
                    _with_params(WEATHER, {"$defs": {"c": {"type": "string"}}}),
                    _with_params(TIME, {"$defs": {"c": {"type": "integer"}}}),
                ],
                "tool_choice": "required",
            },
            HERMES,
            "tools",
            "more than one schema",
        ),
        (
            {
                "messages": [
                    *ASK,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{x"},
                            }
                        ],
                    },
                ]
            },
            HERMES,
            "messages[1].tool_calls[0].function.arguments",
            "not JSON",
        ),
        ({"tools": [{"type": "retrieval"}]}, HERMES, "tools[0].type", "function"),
    ],
)
async def test_what_cannot_be_honoured_is_a_400_naming_it(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    extra: dict[str, Any],
    edge: EdgeSettings,
    param: str,
    words: str,
) -> None:
    import httpx

    [w], server, _ = await _serve(make_worker, make_router, tokenizer, edge=edge)
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, **extra}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
        r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert words in err["message"]
    assert not w.requests("Generate")


async def test_tool_definitions_count_against_the_prompt_limit(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    edge = EdgeSettings(tool_call_parser="hermes", max_prompt_chars=200)
    [w], _, client = await _serve(make_worker, make_router, tokenizer, edge=edge)
    big: Any = {**WEATHER, "function": {**WEATHER["function"], "description": "x" * 300}}
    async with client:
        with pytest.raises(openai.BadRequestError, match=r"edge\.max_prompt_chars"):
            await client.chat.completions.create(model=MODEL, messages=ASK, tools=[big])
    assert not w.requests("Generate")


async def test_simulated_engine_refuses_tools_naming_it(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    _, _, client = await _serve(make_worker, make_router, tokenizer, engine="sim")
    async with client:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
        with pytest.raises(openai.BadRequestError) as history:
            await client.chat.completions.create(model=MODEL, messages=HISTORY)
    assert "`tools` is not supported by the sim engine" in str(err.value)
    assert "`messages.tool_calls` is not supported by the sim engine" in str(history.value)


def test_a_template_that_ignores_tools_refuses_them() -> None:
    req = wire.ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": ASK, "tools": [WEATHER]}
    )
    with pytest.raises(ApiError, match="does not read `tools`") as err:
        plan(req, parser_name="hermes", template_reads_tools=False)
    assert err.value.param == "tools"
    assert plan(req, parser_name="hermes", template_reads_tools=True).parser is not None


# -- forced tool choices (guided decoding) ----------------------------------------------------

NAMED_ANSWER = '{"city": "Köln"}'
REQUIRED_ANSWER = (
    '[{"name": "get_weather", "parameters": {"city": "Köln"}}, '
    '{"name": "get_time", "parameters": {"tz": "Europe/Berlin"}}]'
)


def _plan(parser_name: str | None = None, **extra: Any) -> Any:
    req = wire.ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": ASK, "tools": [WEATHER, TIME], **extra}
    )
    return plan(req, parser_name=parser_name, template_reads_tools=True)


def _any_of(*tools: Any) -> list[Any]:
    return [
        {
            "properties": {
                "name": {"type": "string", "enum": [t["function"]["name"]]},
                "parameters": t["function"].get("parameters")
                or {"type": "object", "properties": {}},
            },
            "required": ["name", "parameters"],
        }
        for t in tools
    ]


def test_a_named_function_is_guided_by_its_parameters() -> None:
    p = _plan(tool_choice=NAMED)
    assert (p.forced, p.name, p.parser) == ("named", "get_weather", None)
    assert json.loads(p.guide) == {"json": WEATHER["function"]["parameters"]}
    no_params: Any = {"type": "function", "function": {"name": "ping"}}
    bare = plan(
        wire.ChatCompletionRequest.model_validate(
            {
                "model": MODEL,
                "messages": ASK,
                "tools": [no_params],
                "tool_choice": {"type": "function", "function": {"name": "ping"}},
            }
        ),
        parser_name=None,
        template_reads_tools=True,
    )
    assert json.loads(bare.guide) == {"json": {"type": "object", "properties": {}}}


def test_required_is_guided_by_an_array_of_calls_to_any_tool() -> None:
    p = _plan(tool_choice="required")
    assert (p.forced, p.parser) == ("required", None)
    array = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": None}}
    array["items"]["anyOf"] = _any_of(WEATHER, TIME)  # type: ignore[index]
    assert json.loads(p.guide) == {"json": array}
    one = _plan(tool_choice="required", parallel_tool_calls=False)
    assert json.loads(one.guide) == {"json": {**array, "maxItems": 1}}
    # $defs move to the array (vLLM's schema); the template still gets the tools as sent.
    shared = {"$defs": {"c": {"type": "string"}}, "type": "object"}
    req = wire.ChatCompletionRequest.model_validate(
        {
            "model": MODEL,
            "messages": ASK,
            "tools": [_with_params(WEATHER, shared), _with_params(TIME, shared)],
            "tool_choice": "required",
        }
    )
    defs = plan(req, parser_name=None, template_reads_tools=True)
    schema = json.loads(defs.guide)["json"]
    assert schema["$defs"] == {"c": {"type": "string"}}
    assert all("$defs" not in c["properties"]["parameters"] for c in schema["items"]["anyOf"])
    assert defs.tools is not None
    assert all("$defs" in t["function"]["parameters"] for t in defs.tools)


def test_strict_acts_where_the_answer_is_guided() -> None:
    strict = [{**WEATHER, "function": {**WEATHER["function"], "strict": True}}]
    for choice in ("required", NAMED, "none"):
        req = wire.ChatCompletionRequest.model_validate(
            {"model": MODEL, "messages": ASK, "tools": strict, "tool_choice": choice}
        )
        p = plan(req, parser_name="hermes", template_reads_tools=True)
        assert bool(p.guide) == (choice != "none")


def _read_stream(chunks: list[Any]) -> tuple[str, list[dict[str, Any]], str | None]:
    """Content, calls (name, id, arguments; checking vLLM's delta shape) and finish reason."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            assert piece.function is not None
            if piece.index not in calls:  # the call's first delta: id, type and name
                assert piece.id is not None
                assert piece.type == "function"
                calls[piece.index] = {"id": piece.id, "name": piece.function.name, "args": ""}
            else:
                assert piece.id is None
                assert piece.function.name is None
            calls[piece.index]["args"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def _guides(workers: list[FakeWorker]) -> set[str]:
    """The structured outputs every worker call carried (Prefill, Decode, Generate)."""
    return {
        r.sampling.structured_outputs
        for w in workers
        for name in ("Prefill", "Decode", "Generate")
        for r in w.requests(name)
    }


@pytest.mark.parametrize("roles", [(Role.MIXED,), (Role.PREFILL, Role.DECODE)])
async def test_a_named_tool_choice_returns_its_call_whole_and_streamed(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    roles: tuple[Role, ...],
) -> None:
    # No parser configured: forcing needs none (the answer is JSON, not model markup).
    workers, _, client = await _serve(
        make_worker, make_router, tokenizer, *roles, edge=EdgeSettings(), answer=NAMED_ANSWER
    )
    args: Any = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": NAMED,
        "max_tokens": 50,
    }
    async with client:
        whole = await client.chat.completions.create(**args)
        chunks = [c async for c in await client.chat.completions.create(**args, stream=True)]
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"  # a named call keeps the answer's own (vLLM, OpenAI)
    assert choice.message.content == ""
    calls: Any = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Köln"})
    ]
    assert calls[0].id.startswith("chatcmpl-tool-")
    content, streamed, finish = _read_stream(chunks)
    assert (content, finish) == ("", "stop")
    assert [(c["name"], c["args"]) for c in streamed] == [("get_weather", NAMED_ANSWER)]
    # Every worker call was guided by the function's schema (in P/D the prefill's token 1 too).
    guide = json.dumps(
        {"json": WEATHER["function"]["parameters"]}, separators=(",", ":"), sort_keys=True
    )
    assert _guides(workers) == {guide}
    if len(roles) == 2:
        assert workers[0].requests("Prefill")


@pytest.mark.parametrize("roles", [(Role.MIXED,), (Role.PREFILL, Role.DECODE)])
async def test_required_returns_the_calls_whole_and_streamed(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    roles: tuple[Role, ...],
) -> None:
    workers, _, client = await _serve(
        make_worker, make_router, tokenizer, *roles, answer=REQUIRED_ANSWER
    )
    args: Any = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "max_tokens": 100,
    }
    async with client:
        whole = await client.chat.completions.create(**args)
        chunks = [c async for c in await client.chat.completions.create(**args, stream=True)]
        first_only = await client.chat.completions.create(**args, parallel_tool_calls=False)
        cut = await client.chat.completions.create(**{**args, "max_tokens": 5})
    want = [("get_weather", {"city": "Köln"}), ("get_time", {"tz": "Europe/Berlin"})]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == ""
    calls: Any = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == want
    content, streamed, finish = _read_stream(chunks)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], json.loads(c["args"])) for c in streamed] == want
    assert len({c["id"] for c in streamed}) == 2
    one: Any = first_only.choices[0].message.tool_calls
    assert [c.function.name for c in one] == ["get_weather"]
    # Cut short by max_tokens: no call parses, the answer's own finish reason (as vLLM).
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.tool_calls == []
    array = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": None}}
    array["items"]["anyOf"] = _any_of(WEATHER, TIME)  # type: ignore[index]
    guides = {json.dumps({"json": s}, separators=(",", ":"), sort_keys=True) for s in
              (array, {**array, "maxItems": 1})}  # fmt: skip
    assert _guides(workers) == guides


async def test_simulated_engine_refuses_forced_tool_choices_naming_it(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    _, _, client = await _serve(make_worker, make_router, tokenizer, engine="sim")
    async with client:
        for choice in ("required", NAMED):
            with pytest.raises(openai.BadRequestError) as err:
                await client.chat.completions.create(
                    model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=choice
                )
            assert "is not supported by the sim engine" in str(err.value)

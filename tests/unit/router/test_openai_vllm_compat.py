"""What a `vllm serve` user's tools expect of the HTTP face: vLLM's routes and shapes, unknown
fields refused, every sampling field passed on (to prefill and decode alike), refusals naming the
field and the engine, vLLM's defaults (no max_tokens, continuous usage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import splitserve
from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.router import openai_fields, openai_models
from splitserve.router.tokenizer import TextTokenizer
from splitserve.worker.server import sampling_from_pb
from tests.unit.router.conftest import MODEL, ServerFactory, StackFactory, WorkerFactory

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


async def _mixed(make_worker: WorkerFactory, make_stack: StackFactory, **kw: Any) -> Any:
    w = await make_worker(Role.MIXED)
    return w, await make_stack(w, **kw)


async def test_models_carry_vllms_card(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    _, stack = await _mixed(make_worker, make_stack, max_model_len=1234)
    async with stack.client() as client:
        listed = (await client.get("/v1/models")).json()
        one = await client.get(f"/v1/models/{MODEL}")
        missing = await client.get("/v1/models/other")
    [card] = listed["data"]
    assert card["id"] == MODEL
    assert card["root"] == MODEL  # the stack names no model_root: the served name
    assert card["max_model_len"] == 1234
    assert card["parent"] is None
    [perm] = card["permission"]
    assert perm["object"] == "model_permission"
    assert perm["allow_logprobs"] is False
    assert one.status_code == 200
    assert one.json()["id"] == MODEL
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


async def test_tokenize_and_detokenize_like_vllm(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    _, stack = await _mixed(make_worker, make_stack, max_model_len=999)
    async with stack.client() as client:
        plain = (await client.post("/tokenize", json={"prompt": "Hello world"})).json()
        bare = await client.post(
            "/tokenize",
            json={
                "model": MODEL,
                "prompt": "Hello world",
                "add_special_tokens": False,
                "return_token_strs": True,
            },
        )
        chat = (await client.post("/tokenize", json={"messages": CHAT})).json()
        no_gen = await client.post(
            "/tokenize", json={"messages": CHAT, "add_generation_prompt": False}
        )
        back = await client.post("/detokenize", json={"tokens": plain["tokens"]})
        bad = await client.post("/detokenize", json={"tokens": [10**9]})
        wrong_model = await client.post("/tokenize", json={"model": "x", "prompt": "a"})
        tool_history = await client.post(
            "/tokenize",
            json={"messages": [{"role": "tool", "tool_call_id": "1", "content": "42"}]},
        )
    assert plain["tokens"] == tokenizer.encode("Hello world")
    assert plain["count"] == len(plain["tokens"])
    assert plain["max_model_len"] == 999
    assert plain["token_strs"] is None
    bare_body = bare.json()
    assert bare_body["tokens"] == tokenizer.encode("Hello world", add_special_tokens=False)
    assert len(bare_body["token_strs"]) == bare_body["count"]
    assert chat["tokens"] == tokenizer.apply_chat_template(CHAT)
    shorter = no_gen.json()["tokens"]
    assert chat["tokens"][: len(shorter)] == shorter
    assert len(shorter) < chat["count"]
    assert back.json() == {"prompt": "Hello world"}
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "tokens"
    assert wrong_model.status_code == 404
    # Tool-call history reaches the template (`tool_call_id` is passed on).
    assert tool_history.status_code == 200, tool_history.text
    assert tool_history.json()["tokens"] == tokenizer.apply_chat_template(
        [{"role": "tool", "tool_call_id": "1", "content": "42"}]
    )


async def test_version_ping_and_unknown_routes(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    _, stack = await _mixed(make_worker, make_stack)
    async with stack.client() as client:
        version = (await client.get("/version")).json()
        ping_get = await client.get("/ping")
        ping_post = await client.post("/ping")
        unknown = await client.get("/v1/nothing")
    assert version == {"version": splitserve.__version__}
    assert ping_get.status_code == ping_post.status_code == 200
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": {
            "message": "Invalid URL (GET /v1/nothing)",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


async def test_unknown_fields_are_refused_unless_relaxed(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    _, stack = await _mixed(make_worker, make_stack)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "vendor_knob": 3}
    nested = {"model": MODEL, "messages": [{"role": "user", "content": "Hi", "mood": "x"}]}
    async with stack.client() as client:
        refused = await client.post("/v1/completions", json=body)
        refused_nested = await client.post("/v1/chat/completions", json=nested)
        stack.generator.edge = EdgeSettings(allow_unknown_fields=True)
        relaxed = await client.post("/v1/completions", json=body)
        relaxed_nested = await client.post("/v1/chat/completions", json=nested)
    assert refused.status_code == 400
    err = refused.json()["error"]
    assert err["param"] == "vendor_knob"
    assert err["code"] == "unknown_field"
    assert "vendor_knob" in err["message"]
    assert refused_nested.json()["error"]["param"] == "messages[0].mood"
    assert relaxed.status_code == 200, relaxed.text
    assert relaxed_nested.status_code == 200, relaxed_nested.text


SAMPLING = {
    "top_k": 1,
    "min_p": 0.25,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "repetition_penalty": 1.3,
    "logit_bias": {"7": 5.0, "9": -100},
    "min_tokens": 3,
    "bad_words": ["foo", "bar baz"],
    "allowed_token_ids": [5, 6, 7, 8, 9],
    "stop_token_ids": [42],
    "seed": 0,
}


def _check_sampling(pb: Any, tokenizer: TextTokenizer) -> None:
    assert pb.top_k == 1
    assert pb.min_p == pytest.approx(0.25)
    assert pb.presence_penalty == pytest.approx(0.5)
    assert pb.frequency_penalty == pytest.approx(-0.5)
    assert pb.repetition_penalty == pytest.approx(1.3)
    assert dict(pb.logit_bias) == {7: 5.0, 9: -100.0}
    assert pb.min_tokens == 3
    assert list(pb.bad_words) == ["foo", "bar baz"]
    assert list(pb.allowed_token_ids) == [5, 6, 7, 8, 9]
    assert list(pb.stop_token_ids) == [*tokenizer.stop_token_ids, 42]
    assert pb.seeded
    assert pb.seed == 0


async def test_sampling_fields_reach_prefill_and_decode(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, **SAMPLING},
        )
    assert r.status_code == 200, r.text
    [prefill] = p.requests("Prefill")
    [decode] = d.requests("Decode")
    # The prefill worker samples the first token under the same parameters as the decode.
    _check_sampling(prefill.sampling, tokenizer)
    _check_sampling(decode.sampling, tokenizer)


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**63 - 1])
async def test_any_int64_seed_reaches_the_engine_as_sent(
    make_worker: WorkerFactory, make_stack: StackFactory, seed: int
) -> None:
    """vLLM takes any int64 seed (negative too); the worker protocol's uint64 carries its
    two's-complement bits and the worker gives the engine the seed the client sent."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "seed": seed},
        )
    assert r.status_code == 200, r.text
    [prefill] = p.requests("Prefill")
    [decode] = d.requests("Decode")
    for pb in (prefill.sampling, decode.sampling):
        assert pb.seeded
        assert pb.seed == seed % 2**64
        assert sampling_from_pb(pb).seed == seed


async def test_sampling_fields_reach_an_aggregated_worker(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w, stack = await _mixed(make_worker, make_stack)
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT, "max_tokens": 4, **SAMPLING},
        )
    assert r.status_code == 200, r.text
    [gen] = w.requests("Generate")
    _check_sampling(gen.sampling, tokenizer)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        # str.isdigit() is True for "²", which int() refuses: it was a 500.
        ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [999999]}, "allowed_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": "3"}, "min_tokens"),
        # beyond the proto's int32 / uint32: a ValueError building SamplingParams, a 500
        ({"top_k": 99999999999}, "top_k"),
        ({"min_tokens": 99999999999}, "min_tokens"),
        # vLLM's range for a seed is int64's
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
    ],
)
async def test_bad_sampling_values_are_400(
    make_worker: WorkerFactory, make_stack: StackFactory, extra: dict[str, Any], param: str
) -> None:
    w, stack = await _mixed(make_worker, make_stack)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, **extra}
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not w.requests("Generate")


@pytest.mark.parametrize(
    ("route", "extra", "param"),
    [
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ("chat", {"tool_choice": "auto"}, "tool_choice"),
        ("chat", {"parallel_tool_calls": False}, "parallel_tool_calls"),
        ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
        ("chat", {"structured_outputs": {"json": {"type": "object"}}}, "structured_outputs"),
        ("chat", {"logprobs": True}, "logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("completion", {"logprobs": 1}, "logprobs"),
        (
            "chat",
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "1", "content": "42"},
                ]
            },
            "messages.tool_calls",
        ),
    ],
)
async def test_unsupported_fields_are_refused_naming_the_engine(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    route: str,
    extra: dict[str, Any],
    param: str,
) -> None:
    w, stack = await _mixed(make_worker, make_stack)
    if route == "chat":
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": CHAT, **extra}
    else:
        path, body = "/v1/completions", {"model": MODEL, "prompt": "Hi", **extra}
    async with stack.client() as client:
        r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert f"`{param}`" in err["message"]
    assert "fake engine" in err["message"]
    assert not w.requests("Generate")


async def test_defaults_that_ask_for_nothing_are_accepted(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    _, stack = await _mixed(make_worker, make_stack)
    body = {
        "model": MODEL,
        "messages": CHAT,
        "max_tokens": 2,
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "logprobs": False,
        "user": "someone",
    }
    async with stack.client() as client:
        r = await client.post("/v1/chat/completions", json=body)
        vllm_bench = await client.post(  # what `vllm bench serve` sends
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "Hi",
                "repetition_penalty": 1.0,
                "max_tokens": 2,
                "logprobs": None,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert r.status_code == 200, r.text
    assert vllm_bench.status_code == 200, vllm_bench.text


async def test_no_max_tokens_means_up_to_the_context_limit(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    """As vLLM: a chat request without `max_tokens`, or a completion with `max_tokens: null`,
    runs to end of text or the context limit (the service's `default_max_tokens` caps it); a
    completion without `max_tokens` gets OpenAI's and vLLM's default, 16 (it ran to the context
    limit: `vllm serve` on the same model stops at 16)."""
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w, max_model_len=300, default_max_tokens=None)
    capped = await make_stack(w, max_model_len=300, default_max_tokens=7)
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": None}),
        ("/v1/chat/completions", {"messages": CHAT}),
        ("/v1/completions", {"prompt": [1, 2, 3]}),
    ]
    for s in (stack, capped):
        async with s.client() as client:
            for path, body in bodies:
                r = await client.post(path, json={"model": MODEL, **body})
                assert r.status_code == 200, r.text
    limits = [req.sampling.max_tokens for req in w.requests("Generate")]
    chat_limit = 300 - len(tokenizer.apply_chat_template(CHAT))
    assert limits[:3] == [297, chat_limit, 16]  # to the context limit, as vLLM; 16, as vLLM
    assert limits[3:] == [7, 7, 16]  # the service-level cap; 16 is below it anyway


def _events(body: str) -> list[Any]:
    frames = [f for f in body.split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]


async def test_continuous_usage_stats(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    # One call per request: each worker message is one event (over `Multiplex`, tokens that
    # arrive together are read as one chunk, so how many events there are depends on timing).
    w = await make_worker(
        Role.MIXED, completion=tuple(tokenizer.encode("a b c d e")[1:]), multiplex=False
    )
    stack = await make_stack(w)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT, "stream": True, "stream_options": opts},
        )
    events = _events(r.text)
    num_prompt = len(tokenizer.apply_chat_template(CHAT))
    *chunks, last = events
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == num_prompt
    seen = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c["usage"]["prompt_tokens"] == num_prompt for c in chunks)
    assert seen == sorted(seen)
    assert seen[0] == 0
    assert seen[-1] == last["usage"]["completion_tokens"]
    assert len(chunks) >= 3  # the role chunk, text chunks, the finish chunk


def test_every_request_field_has_a_status() -> None:
    """docs/openai-api.md is generated from `openai_fields.TABLES`: no field may be missing."""
    for model, table in openai_fields.TABLES.items():
        assert set(openai_fields.field_names(model)) == set(table), model.__name__
    assert openai_models.ChatCompletionRequest in openai_fields.TABLES


async def test_router_on_real_ports_names_its_root_and_pool_load(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer_dir: Path
) -> None:
    """`root` is what the workers load (here: the tokenizer directory), so a harness given no
    --model / --tokenizer can load it; /metrics has the pools' queue and KV use per role."""
    p = await make_worker(Role.PREFILL, kv_blocks_free=250)
    d = await make_worker(Role.DECODE)
    server = await make_router(p.address, d.address)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
        card = (await client.get("/v1/models")).json()["data"][0]
        metrics = (await client.get("/metrics")).text
    assert card["root"] == str(tokenizer_dir)
    assert 'splitserve_router_pool_kv_usage_ratio{role="prefill"} 0.75' in metrics
    assert 'splitserve_router_pool_waiting_requests{role="decode"} 0.0' in metrics


def test_openai_doc_is_generated_from_the_models() -> None:
    from splitserve.cli.gen_openai_doc import DEST, render

    root = Path(__file__).resolve().parents[3]
    assert (root / DEST).read_text() == render(), "run `make gen` (splitserve gen openai-doc)"

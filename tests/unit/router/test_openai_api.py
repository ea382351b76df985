"""The OpenAI HTTP face in-process (httpx over ASGI): bodies, usage, SSE framing, errors."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import SloSettings
from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

COMPLETION_TEXT = "Hello from the fake worker!"


async def _mixed_stack(
    make_worker: WorkerFactory, make_stack: StackFactory, tok: TextTokenizer, **kw: Any
) -> Any:
    w = await make_worker(Role.MIXED, completion=tuple(tok.encode(COMPLETION_TEXT)))
    return w, await make_stack(w, **kw)


def _events(body: str) -> list[Any]:
    assert body.endswith("data: [DONE]\n\n")
    frames = body.split("\n\n")
    assert frames[-1] == ""
    out: list[Any] = []
    for frame in frames[:-1]:
        assert frame.startswith("data: "), frame
        payload = frame.removeprefix("data: ")
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


async def test_completion_whole(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w, stack = await _mixed_stack(make_worker, make_stack, tokenizer)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 50}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == MODEL
    assert body["created"] == 1_700_000_000
    [choice] = body["choices"]
    assert choice["text"] == COMPLETION_TEXT
    assert choice["finish_reason"] == "stop"  # the scripted completion ran out
    num_prompt = len(tokenizer.encode("Once upon a time"))
    num_completion = len(tokenizer.encode(COMPLETION_TEXT))
    assert body["usage"] == {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }
    [gen] = w.requests("Generate")
    assert list(gen.prompt_token_ids) == tokenizer.encode("Once upon a time")
    assert gen.sampling.max_tokens == 50


async def test_completion_with_token_ids_and_length_limit(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w, stack = await _mixed_stack(make_worker, make_stack, tokenizer)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": [[5, 6, 7]],
                "max_tokens": 2,
                "temperature": 0,
                "top_p": 0.5,
                "seed": 42,
            },
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == 3
    assert body["usage"]["completion_tokens"] == 2
    [gen] = w.requests("Generate")
    assert list(gen.prompt_token_ids) == [5, 6, 7]
    assert gen.sampling.temperature == 0
    assert gen.sampling.top_p == pytest.approx(0.5)
    assert gen.sampling.seed == 42


async def test_chat_whole_uses_the_template(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w, stack = await _mixed_stack(make_worker, make_stack, tokenizer)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi!"}]}]
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_completion_tokens": 64},
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": COMPLETION_TEXT}
    want_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi!"}])
    assert list(w.requests("Generate")[0].prompt_token_ids) == want_prompt
    assert body["usage"]["prompt_tokens"] == len(want_prompt)


async def test_chat_stream_with_usage(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    _, stack = await _mixed_stack(make_worker, make_stack, tokenizer)
    async with stack.client() as client:
        r = await client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == COMPLETION_TEXT
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("stop") == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == len(tokenizer.encode(COMPLETION_TEXT))


async def test_completion_stream_with_stop_string(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    _, stack = await _mixed_stack(make_worker, make_stack, tokenizer)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "stream": True, "stop": ["fake", "zzz"]},
        )
    events = _events(r.text)
    assert "usage" not in events[0]
    text = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert text == "Hello from the "
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_fallback_when_prefill_fails(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    p = await make_worker(Role.PREFILL, prefill_abort=grpc.StatusCode.UNAVAILABLE)
    d = await make_worker(Role.DECODE, completion=tuple(tokenizer.encode(COMPLETION_TEXT)))
    stack = await make_stack(p, d)
    async with stack.client() as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == COMPLETION_TEXT
    await stack.dispatcher.drain_background()
    assert p.names() == ["Prefill", "Cancel"]
    assert d.names() == ["Generate"]
    assert stack.sample("splitserve_router_fallbacks_total", reason="prefill_to_aggregated") == 1


def _bad(status: int, message: str, param: str | None = None, code: str | None = None) -> Any:
    return (status, message, param, code)


@pytest.mark.parametrize(
    ("path", "payload", "want"),
    [
        ("/v1/completions", b"{not json", _bad(400, "not valid JSON")),
        ("/v1/completions", b"[1, 2]", _bad(400, "JSON object")),
        ("/v1/completions", {"prompt": "x"}, _bad(400, "Field required", "model")),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"},
         _bad(400, "temperature", "temperature")),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "5"},
         _bad(400, "max_tokens", "max_tokens")),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 3},
         _bad(400, "less than or equal to 2", "temperature")),
        ("/v1/completions", {"model": "gpt-9", "prompt": "x"},
         _bad(404, "The model `gpt-9` does not exist.", "model", "model_not_found")),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, _bad(400, "n=1", "n")),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]},
         _bad(400, "one prompt", "prompt")),
        ("/v1/completions", {"model": MODEL, "prompt": ""}, _bad(400, "empty", "prompt")),
        # the bad id is named, as vLLM names it ("Token id 99999 is out of vocabulary")
        ("/v1/completions", {"model": MODEL, "prompt": [5, 99999, 7]},
         _bad(400, "token id 99999 is outside the vocabulary [0, 4096)", "prompt")),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 100},
         _bad(400, "maximum context length is 64", "max_tokens")),
        ("/v1/completions", {"model": MODEL, "prompt": list(range(64))},
         _bad(400, "maximum context length is 64", "prompt")),
        ("/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
          "max_completion_tokens": 100},
         _bad(400, "maximum context length is 64", "max_completion_tokens")),
        ("/v1/chat/completions", {"model": MODEL, "messages": []},
         _bad(400, "messages", "messages")),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
         _bad(400, "messages[0].role", "messages[0].role")),
        ("/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         _bad(400, "image_url", "messages[0].content[0].type")),
        ("/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": [
             {"type": "text", "text": "x", "image_url": {"url": "http://h/i.png"}}]}]},
         _bad(400, "image_url", "messages[0].content[0].image_url")),
        ("/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
         _bad(400, "messages[0].content[0].text: a content part of type 'text' needs it",
              "messages[0].content[0].text")),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ""},
         _bad(400, "empty string", "stop")),
        ("/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": ["a", ""]},
         _bad(400, "empty string", "stop")),
    ],
    ids=[
        "malformed-json", "not-an-object", "no-model", "wrong-type", "int-as-string",
        "out-of-range", "unknown-model", "n-2", "two-prompts", "empty-prompt", "bad-token-id",
        "too-long", "prompt-fills-context", "chat-too-long", "no-messages", "bad-role",
        "image-part", "image-in-text-part", "text-part-without-text", "empty-stop",
        "empty-stop-in-list",
    ],
)  # fmt: skip
async def test_bad_requests(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    path: str,
    payload: Any,
    want: tuple[int, str, str | None, str | None],
) -> None:
    w, stack = await _mixed_stack(make_worker, make_stack, tokenizer, max_model_len=64)
    async with stack.client() as client:
        if isinstance(payload, bytes):
            r = await client.post(
                path, content=payload, headers={"content-type": "application/json"}
            )
        else:
            r = await client.post(path, json=payload)
    status, message, param, code = want
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] == code
    assert w.names() == []


async def test_no_worker_is_503(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
        )
        ready = await client.get("/ready")
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "service_unavailable"
    assert ready.status_code == 503


async def test_worker_rejection_is_400(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    w = await make_worker(Role.MIXED, generate_abort=grpc.StatusCode.RESOURCE_EXHAUSTED)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
        )
    assert r.status_code == 400
    assert "scripted RESOURCE_EXHAUSTED" in r.json()["error"]["message"]


async def test_failure_mid_stream_is_an_error_event(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    w = await make_worker(Role.MIXED, fail_after_tokens=2)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
        )
    assert r.status_code == 200
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "server_error"
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="error",
            path="aggregated",
            slo_class="default",
        )
        == 1
    )


async def test_info_routes(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    _, stack = await _mixed_stack(make_worker, make_stack, tokenizer)
    async with stack.client() as client:
        models = (await client.get("/v1/models")).json()
        health = await client.get("/health")
        ready = await client.get("/ready")
        await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        metrics = await client.get("/metrics")
        missing = await client.get("/v2/nothing")
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert health.status_code == 200
    assert ready.status_code == 200
    assert ready.json()["decode_endpoints"] == 1
    assert metrics.status_code == 200
    assert (
        'splitserve_router_requests_total{outcome="ok",path="aggregated",slo_class="default"} 1.0'
        in metrics.text
    )
    assert all(line.startswith(("#", "splitserve_")) for line in metrics.text.splitlines() if line)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "invalid_request_error"


async def test_ready_needs_a_decode_capable_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    stack = await make_stack(p)
    async with stack.client() as client:
        assert (await client.get("/ready")).status_code == 503


async def test_single_token_stream_over_prefill_and_decode(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    interactive = v1.SloClassSpec(name="interactive", ttft_ms=500, tpot_ms=50, priority=5)
    stack = await make_stack(p, d, slo=SloSettings(classes=(interactive,)))
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            headers={"x-slo-class": "interactive"},
            json={
                "model": MODEL,
                "prompt": [1, 2],
                "max_tokens": 1,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    events = _events(r.text)
    assert len(events) == 3  # the one token (finished), usage, [DONE]
    assert events[0]["choices"][0]["finish_reason"] == "length"
    assert events[1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    assert d.names() == []
    assert p.requests("Prefill")[0].slo_class == "interactive"
    slo = p.requests("Prefill")[0].slo  # the class's priority and deadline reach the worker
    assert slo.priority == 5
    assert 0 < slo.ttft_budget_s <= 0.5
    assert slo.tpot_target_s == 0.05

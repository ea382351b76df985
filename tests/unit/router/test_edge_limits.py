"""Issue 12 items 1 and 2 at the HTTP / gRPC edge: limits answered with clear 4xx, slow and idle
clients timed out, bad JSON refused, tokenizing off the event loop, the router's own request ids.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import grpc
import httpx
import pytest
from grpc import aio

from splitserve._gen.v1 import router_pb2, router_pb2_grpc
from splitserve.api.auth import AuthSettings
from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.router.auth import key_sha256_hex
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, ServerFactory, WorkerFactory

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _url(server: RouterServer, path: str) -> str:
    return f"http://127.0.0.1:{server.http_port}{path}"


def _rejected(server: RouterServer) -> float:
    labels = {"outcome": "rejected", "path": "none", "slo_class": "default"}
    return server.registry.get_sample_value("splitserve_router_requests_total", labels) or 0.0


async def _raw(server: RouterServer, data: bytes, *, read_s: float = 20) -> bytes:
    """Send raw bytes on a fresh connection and read until the router closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(read_s):
            return await reader.read()
    finally:
        writer.close()


def _status_and_body(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


async def test_body_over_the_limit_is_413(make_router: ServerFactory) -> None:
    server = await make_router(edge=EdgeSettings(max_body_bytes=4096))
    big = {"model": MODEL, "prompt": "x" * 10_000}
    async with httpx.AsyncClient() as client:
        r = await client.post(_url(server, COMPLETIONS), json=big)
        assert r.status_code == 413
        assert "edge.max_body_bytes" in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "request_too_large"
        assert (await client.get(_url(server, "/health"))).status_code == 200
    # No Content-Length: the body is counted while it is read.
    chunk = b"3e8\r\n" + b" " * 1000 + b"\r\n"
    head = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, body = _status_and_body(await _raw(server, head + chunk * 10 + b"0\r\n\r\n"))
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    assert _rejected(server) == 2


async def test_prompt_characters_are_limited_before_tokenizing(
    make_router: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await make_router(edge=EdgeSettings(max_prompt_chars=100))
    tokenizer = server._generator.tokenizer if server._generator else None
    assert tokenizer is not None
    calls: list[str] = []
    for name in ("encode", "apply_chat_template"):
        monkeypatch.setattr(tokenizer, name, lambda *a, _n=name, **k: calls.append(_n))
    async with httpx.AsyncClient() as client:
        r = await client.post(_url(server, COMPLETIONS), json={"model": MODEL, "prompt": "y" * 101})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "prompt"
        assert "edge.max_prompt_chars" in r.json()["error"]["message"]
        messages = [{"role": "user", "content": "z" * 60}] * 2
        r = await client.post(_url(server, CHAT), json={"model": MODEL, "messages": messages})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "messages"
    assert calls == []


async def test_stop_strings_are_limited_on_both_faces(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    m = await make_worker(Role.MIXED)
    edge = EdgeSettings(max_stop_strings=2, max_stop_string_chars=8)
    server = await make_router(m.address, edge=edge)
    async with httpx.AsyncClient() as client:
        for stop, what in ((["a", "b", "c"], "max_stop_strings"), (["x" * 9], "chars")):
            body = {"model": MODEL, "prompt": "hi", "stop": stop}
            r = await client.post(_url(server, COMPLETIONS), json=body)
            assert r.status_code == 400
            assert r.json()["error"]["param"] == "stop"
            assert what in r.json()["error"]["message"]
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        for stops in (["a", "b", "c"], [""]):  # too many; empty (vLLM refuses it too)
            req = router_pb2.RouterGenerateRequest(prompt="hi", stop=stops)
            with pytest.raises(aio.AioRpcError) as err:
                _ = [c async for c in stub.Generate(req)]
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert m.names() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(b"[" * 1100 + b"]" * 1100, "depth", id="nested-array"),
        pytest.param(b'{"a":' * 1100 + b"1" + b"}" * 1100, "depth", id="nested-object"),
        pytest.param(b'{"model": "m", "prompt": "a\\ud800b"}', "surrogate", id="prompt"),
        pytest.param(b'{"model": "\\udc00"}', "surrogate", id="model"),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d"}]}',
            "surrogate",
            id="chat-content",
        ),
        pytest.param(b"\xff\xfe{}", "utf-8", id="bad-utf8"),
    ],
)
async def test_bad_json_is_a_clear_400(make_router: ServerFactory, body: bytes, field: str) -> None:
    server = await make_router()
    async with httpx.AsyncClient() as client:
        for path in (COMPLETIONS, CHAT):
            r = await client.post(
                _url(server, path), content=body, headers={"content-type": "application/json"}
            )
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert "not valid JSON" in error["message"]
        assert (await client.get(_url(server, "/health"))).status_code == 200


async def test_connection_limit_answers_429_and_recovers(make_router: ServerFactory) -> None:
    server = await make_router(edge=EdgeSettings(max_connections=2))
    held = [await asyncio.open_connection("127.0.0.1", server.http_port) for _ in range(2)]
    async with asyncio.timeout(10):
        while server.connections.open < 2:  # noqa: ASYNC110 - polls the server's own count
            await asyncio.sleep(0.01)
    status, body = _status_and_body(await _raw(server, b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"))
    assert status == 429
    assert body["error"]["code"] == "too_many_connections"
    assert "edge.max_connections" in body["error"]["message"]
    for _, writer in held:
        writer.close()
    async with asyncio.timeout(10):
        while server.connections.open:  # noqa: ASYNC110 - polls the server's own count
            await asyncio.sleep(0.01)
    async with httpx.AsyncClient() as client:
        assert (await client.get(_url(server, "/health"))).status_code == 200


async def test_slow_headers_and_slow_body_get_408(make_router: ServerFactory) -> None:
    edge = EdgeSettings(header_timeout_s=0.2, body_timeout_s=0.2, idle_timeout_s=30)
    server = await make_router(edge=edge)
    status, body = _status_and_body(await _raw(server, b"POST /v1/completions HTTP/1.1\r\nHo"))
    assert status == 408
    assert "edge.header_timeout_s" in body["error"]["message"]
    head = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\n{"
    status, body = _status_and_body(await _raw(server, head))
    assert status == 408
    assert "edge.body_timeout_s" in body["error"]["message"]
    assert server.connections.timed_out == 2


async def test_idle_connections_are_closed(make_router: ServerFactory) -> None:
    server = await make_router(edge=EdgeSettings(idle_timeout_s=0.2))
    assert await _raw(server, b"") == b""  # never sent a byte: closed without an answer
    # After a keep-alive response, uvicorn's keep-alive timer (whole seconds, >= 1) closes it.
    raw = await _raw(server, b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200")
    assert server.connections.open == 0


async def test_long_prompts_are_tokenized_off_the_event_loop(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = await make_worker(Role.MIXED)
    server = await make_router(m.address, edge=EdgeSettings(inline_tokenize_max_chars=10))
    gate = threading.Event()
    threads: list[str] = []
    real = tokenizer.encode

    def blocking_encode(text: str) -> list[int]:
        threads.append(threading.current_thread().name)
        if len(text) > 10:
            gate.wait(20)  # a tokenizer busy with a huge prompt
        return real(text)

    monkeypatch.setattr(tokenizer, "encode", blocking_encode)
    async with httpx.AsyncClient(timeout=20) as client:
        slow = asyncio.create_task(
            client.post(_url(server, COMPLETIONS), json={"model": MODEL, "prompt": "p" * 50})
        )
        async with asyncio.timeout(10):
            while not threads:  # noqa: ASYNC110 - set from the tokenizer thread
                await asyncio.sleep(0.01)
        # The loop still serves others while that prompt is being tokenized.
        assert (await client.get(_url(server, "/health"))).status_code == 200
        short = await client.post(_url(server, COMPLETIONS), json={"model": MODEL, "prompt": "s"})
        assert short.status_code == 200
        assert not slow.done()
        gate.set()
        assert (await slow).status_code == 200
    assert threads[0].startswith("tokenize")  # the long one, in the pool
    assert not threads[1].startswith("tokenize")  # the short one, inline


async def test_request_ids_are_the_routers_own(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    m = await make_worker(Role.MIXED)
    server = await make_router(m.address)
    headers = {"x-request-id": "mine-1"}
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    async with httpx.AsyncClient() as client:
        a = await client.post(_url(server, COMPLETIONS), json=body, headers=headers)
        b = await client.post(_url(server, COMPLETIONS), json=body, headers=headers)
        bad = await client.post(_url(server, COMPLETIONS), json={"model": "x"}, headers=headers)
    assert a.headers["x-request-id"] == b.headers["x-request-id"] == "mine-1"
    assert bad.headers["x-request-id"] == "mine-1"
    assert a.json()["id"] != b.json()["id"]
    seen = [r.request_id for r in m.requests("Generate")]
    assert len(set(seen)) == 2
    assert "mine-1" not in seen


async def test_a_grpc_caller_cannot_cancel_anothers_request(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    hold = asyncio.Event()
    m = await make_worker(Role.MIXED, hold=hold, hold_after=1)
    server = await make_router(m.address)
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        req = router_pb2.RouterGenerateRequest(
            request_id="same", prompt_token_ids=router_pb2.TokenIds(ids=[1, 2])
        )
        victim = stub.Generate(req)
        first = await anext(aiter(victim))
        assert first.request_id == "same"  # the caller's label, echoed
        attacker = stub.Generate(req)
        await anext(aiter(attacker))
        attacker.cancel()
        await m.wait_call("Cancel")
        hold.set()
        rest = [c async for c in victim]
    assert rest[-1].finish_reason != 0
    got = [*first.token_ids, *(t for c in rest for t in c.token_ids)]
    assert got == list(m.script.completion)
    ids = [r.request_id for r in m.requests("Generate")]
    assert len(set(ids)) == 2
    assert m.cancelled == [ids[1]]


def test_error_body_is_openai_shaped() -> None:
    from splitserve.router.http_edge import error_response

    raw = error_response(429, "Too Many Requests", "m", "rate_limit_error", "c")
    status, body = _status_and_body(raw)
    assert status == 429
    assert body == {
        "error": {"message": "m", "type": "rate_limit_error", "param": None, "code": "c"}
    }


async def test_oversized_headers_get_431(make_router: ServerFactory) -> None:
    server = await make_router()
    junk = b"x-junk: " + b"a" * 70_000 + b"\r\n"
    raw = await _raw(server, b"GET /health HTTP/1.1\r\nHost: r\r\n" + junk + b"\r\n")
    status, body = _status_and_body(raw)
    assert status == 431
    assert body["error"]["code"] == "headers_too_large"


async def test_a_large_body_in_one_read_is_not_mistaken_for_headers(
    make_router: ServerFactory,
) -> None:
    server = await make_router()
    body = json.dumps({"model": MODEL, "prompt": [1] * 60_000}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: {len(body)}\r\n"
    raw = await _raw(server, head.encode() + b"Connection: close\r\n\r\n" + body)
    status, answer = _status_and_body(raw)
    assert status == 400
    assert answer["error"]["param"] == "prompt"  # too long for the context, not a header error


async def test_hot_routes_bypass_fastapi_but_keep_its_answers(
    make_router: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await make_router()
    assert server._generator is not None

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(server._generator, "build_request", broken)
    async with httpx.AsyncClient() as client:
        r = await client.get(_url(server, COMPLETIONS))  # not POST: FastAPI answers
        assert r.status_code == 405
        assert r.json()["error"]["type"] == "invalid_request_error"
        r = await client.post(_url(server, COMPLETIONS), json={"model": MODEL, "prompt": [1]})
        assert r.status_code == 500  # a bug still gets an OpenAI-style body
        assert r.json()["error"]["type"] == "server_error"


async def test_many_tiny_messages_are_refused_before_validation_and_rendering(
    make_router: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body of 200,000 empty messages (6.6 MB) counted 0 characters: it passed the prompt
    limit, was validated and rendered on the event loop (2.2 s, every other client stalled) and
    only then refused by the context length. Each message now counts `MESSAGE_CHARS` for its
    markup, and the count is checked before the body is validated."""
    server = await make_router(max_model_len=256)  # 8,192 characters: 256 messages at most
    tokenizer = server._generator.tokenizer if server._generator else None
    assert tokenizer is not None
    calls: list[str] = []
    monkeypatch.setattr(tokenizer, "apply_chat_template", lambda *a, **k: calls.append("chat"))
    empty = [{"role": "user", "content": ""}] * 257
    not_even_messages = [0] * 257  # a count refusal, not a validation error: checked first
    async with httpx.AsyncClient() as client:
        for messages in (empty, not_even_messages):
            for path, extra in ((CHAT, {"model": MODEL}), ("/tokenize", {})):
                r = await client.post(_url(server, path), json={**extra, "messages": messages})
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["param"] == "messages"
                assert "257 messages cannot fit" in error["message"]
                assert "edge.max_prompt_chars" in error["message"]
        # under the count, the size counts the markup too: 200 messages of 20 characters
        many = [{"role": "user", "content": "m" * 20}] * 200
        r = await client.post(_url(server, CHAT), json={"model": MODEL, "messages": many})
        assert r.status_code == 400
        assert "the messages count 10400 characters" in r.json()["error"]["message"]
    assert calls == []


def test_chat_chars_counts_each_messages_markup() -> None:
    from splitserve.router.tokenizer import MESSAGE_CHARS, chat_chars

    assert chat_chars([{"role": "user", "content": ""}] * 3) == 3 * MESSAGE_CHARS
    assert chat_chars([{"role": "assistant", "content": None}, {"content": "abc"}]) == 2 * 32 + 3


async def test_trailers_are_bounded_like_a_head(make_router: ServerFactory) -> None:
    """A chunked body's trailers are kept in memory by the parser: past the head's limit the
    request is refused (they were read without bound until the body's timer, 300 MB in 0.6 s)."""
    server = await make_router()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n"
    )
    writer.write(b"x-t: " + b"a" * 4000 + b"\r\n" * 1)
    for _ in range(17):  # 68 KB of trailer lines (no end: the router waits for more)
        writer.write(b"x-t: " + b"a" * 4000 + b"\r\n")
    await writer.drain()
    async with asyncio.timeout(10):
        raw = await reader.read()
    writer.close()
    status, answer = _status_and_body(raw)
    assert status == 431
    assert "trailers" in answer["error"]["message"]
    # Small trailers are accepted, as are many small chunks: the request reaches dispatch (and
    # this router has no worker: 503).
    chunks = b"".join(b"1\r\n" + bytes([c]) + b"\r\n" for c in body)
    ok = await _raw(
        server,
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + chunks
        + b"0\r\nx-t: 1\r\n\r\n",
    )
    assert _status_and_body(ok)[0] == 503, ok[:300]


async def test_an_early_answer_gets_no_second_one(make_router: ServerFactory) -> None:
    """A request answered before its body arrived (a 401 without a key) gets that one answer:
    the body's timer then closes the connection without writing a 408 nobody asked for (a
    keep-alive client or proxy would take it for the next request's)."""
    server = await make_router(
        edge=EdgeSettings(body_timeout_s=0.3),
        auth=AuthSettings(key_sha256=(key_sha256_hex("sk-edge-test-key"),)),
    )
    head = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 56\r\n\r\n{"
    raw = await _raw(server, head)
    assert raw.startswith(b"HTTP/1.1 401"), raw
    assert raw.count(b"HTTP/1.1 ") == 1, raw


async def test_bytes_the_parser_refuses_get_an_openai_error(make_router: ServerFactory) -> None:
    server = await make_router()
    raw = await _raw(
        server,
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    )
    status, answer = _status_and_body(raw)
    assert status == 400
    assert answer["error"]["code"] == "invalid_http"


@pytest.mark.parametrize(
    ("coding", "expected"),
    [(b"gzip, chunked", 501), (b"deflate,chunked", 501), (b"Chunked ", 503), (b"chunked", 503)],
)
async def test_a_transfer_coding_other_than_chunked_is_501(
    make_router: ServerFactory, coding: bytes, expected: int
) -> None:
    """RFC 9112 §6.1: a transfer coding the router does not decode is refused 501 naming it (the
    parser undid `chunked` and passed the gzip bytes on as the body)."""
    server = await make_router()
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    raw = await _raw(
        server,
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: "
        + coding
        + b"\r\nConnection: close\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n",
    )
    status, answer = _status_and_body(raw)
    assert status == expected, raw[:300]  # 503: accepted (this router has no worker)
    if expected == 501:
        assert answer["error"]["code"] == "unsupported_transfer_encoding"
        assert coding.decode().strip() in answer["error"]["message"]


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"POST /v1/completions HTTP/1.1\r\n", 400),  # no Host
        (b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nHost: b\r\n", 400),
        (b"POST /v1/completions HTTP/1.0\r\nHost: a\r\nhost: a\r\n", 400),
        (b"POST /v1/completions HTTP/1.0\r\n", 503),  # HTTP/1.0 needs none
        (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n", 503),
    ],
)
async def test_a_request_without_one_host_is_400(
    make_router: ServerFactory, head: bytes, expected: int
) -> None:
    """RFC 9112 §3.2: an HTTP/1.1 request without Host, or any with two, is answered 400."""
    server = await make_router()
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    raw = await _raw(
        server,
        head
        + b"Content-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    status, answer = _status_and_body(raw)
    assert status == expected, raw[:300]
    if expected == 400:
        assert answer["error"]["code"] == "invalid_host"
        assert "Host" in answer["error"]["message"]

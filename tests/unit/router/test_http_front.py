"""The router's HTTP front (`http_front`): the two completion routes served without the ASGI
entry answer byte for byte what uvicorn's path answers, and every request the front does not
fully understand takes uvicorn's path."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from uvicorn.middleware.message_logger import MessageLoggerMiddleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from splitserve.api.auth import AuthSettings
from splitserve.api.router import SloSettings
from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.router import http_front
from splitserve.router import server as router_server
from splitserve.router.auth import key_sha256_hex
from splitserve.router.http_front import front_for
from splitserve.router.openai_api import EdgeApp
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import TextTokenizer
from tests.fakes.fake_worker import FakeWorker
from tests.unit.router.conftest import MODEL, ServerFactory, WorkerFactory

TEXT = "The quick brown fox jumps over the lazy dog."
CHAT = b"/v1/chat/completions"
TEXT_PATH = b"/v1/completions"


def _post(
    path: bytes,
    body: bytes | dict[str, Any],
    *,
    headers: bytes = b"",
    version: bytes = b"1.1",
    chunked: bool = False,
) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    if chunked:
        size = b"transfer-encoding: chunked\r\n"
        raw = b"%x\r\n%b\r\n0\r\n\r\n" % (len(raw), raw)
    else:
        size = b"content-length: %d\r\n" % len(raw)
    return b"POST %b HTTP/%b\r\nhost: r\r\ncontent-type: application/json\r\n%b%b\r\n%b" % (
        path,
        version,
        size,
        headers,
        raw,
    )


_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
_TEXT = {"model": MODEL, "prompt": "Foxes", "max_tokens": 5}
_USAGE = {"stream_options": {"include_usage": True}}

# One keep-alive connection answers these in turn (the 413 closes it: it comes last).
KEPT_ALIVE: list[tuple[str, bytes]] = [
    ("streamed chat", _post(CHAT, {**_CHAT, "stream": True, **_USAGE})),
    ("streamed completion", _post(TEXT_PATH, {**_TEXT, "stream": True})),
    ("whole chat", _post(CHAT, _CHAT, headers=b"x-request-id: abc\r\n")),
    ("whole completion", _post(TEXT_PATH, _TEXT)),
    ("bad JSON", _post(CHAT, b'{"model": ')),
    ("not an object", _post(CHAT, b"[1, 2]")),
    ("unknown field", _post(CHAT, {**_CHAT, "frobnicate": 1})),
    ("wrong type", _post(TEXT_PATH, {**_TEXT, "max_tokens": "five"})),
    ("unknown model", _post(TEXT_PATH, {**_TEXT, "model": "nope"})),
    ("form body", _post(CHAT, b"a=1").replace(b"application/json", b"text/plain")),
    ("empty SLO class", _post(CHAT, _CHAT, headers=b"x-slo-class: \r\n")),
    ("unknown SLO class", _post(CHAT, _CHAT, headers=b"x-slo-class: gold\r\n")),
    ("chunked request body", _post(CHAT, {**_CHAT, "stream": True}, chunked=True)),
    ("query string (uvicorn)", _post(CHAT + b"?a=1", {**_CHAT, "stream": True})),
    ("forwarded (uvicorn)", _post(CHAT, _CHAT, headers=b"x-forwarded-for: 10.0.0.1\r\n")),
    ("GET (uvicorn)", b"GET /v1/chat/completions HTTP/1.1\r\nhost: r\r\n\r\n"),
    ("health (uvicorn)", b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n"),
    ("too large", _post(TEXT_PATH, {**_TEXT, "prompt": "x" * 5000})),
]
_CLOSE = b"connection: close\r\n"
# Each on its own connection.
ALONE: list[tuple[str, bytes]] = [
    ("HTTP/1.0 (uvicorn)", _post(CHAT, _CHAT, version=b"1.0")),
    ("connection: close", _post(TEXT_PATH, {**_TEXT, "stream": True}, headers=_CLOSE)),
    ("expect (uvicorn)", _post(CHAT, _CHAT, headers=b"expect: 100-continue\r\n" + _CLOSE)),
]  # fmt: skip


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer: its head, and its body as sent (chunk framing included)."""
    head = await reader.readuntil(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100 "):
        head = await reader.readuntil(b"\r\n\r\n")
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        body = b""
        while True:
            line = await reader.readline()
            size = int(line.strip(), 16)
            body += line + await reader.readexactly(size + 2)
            if size == 0:
                return head, body
    length = re.search(rb"content-length: (\d+)", lowered)
    if length is not None:
        return head, await reader.readexactly(int(length.group(1)))
    return head, await reader.read()


def _normal(head: bytes, body: bytes) -> tuple[bytes, bytes]:
    head = re.sub(rb"(?m)^date: [^\r]*\r\n", b"", head)
    # Response ids and `created` differ between two serves; same lengths, so the chunk sizes
    # still compare. Chunk boundaries follow the worker's token batching: compared de-chunked.
    body = re.sub(rb"(chatcmpl|cmpl)-[0-9a-f]{32}", rb"\1-" + b"0" * 32, body)
    body = re.sub(rb'"created":[0-9]{10}', b'"created":0000000000', body)
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunked(body)
    return head, body


def _dechunked(body: bytes) -> bytes:
    out = b""
    while body:
        line, _, rest = body.partition(b"\r\n")
        size = int(line, 16)
        assert rest[size : size + 2] == b"\r\n"
        out += rest[:size]
        body = rest[size + 2 :]
        if size == 0:
            assert body == b""
    return out


async def _served(server: RouterServer) -> list[tuple[bytes, bytes]]:
    assert server.http_port is not None
    answers = []
    async with asyncio.timeout(30):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
        try:
            for _, raw in KEPT_ALIVE:
                writer.write(raw)
                answers.append(_normal(*await _answer(reader)))
            assert await reader.read() == b""  # closed after the 413
        finally:
            writer.close()
        for _, raw in ALONE:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
            try:
                writer.write(raw)
                answers.append(_normal(*await _answer(reader)))
                assert await reader.read() == b""  # none of them is kept alive
            finally:
                writer.close()
    return answers


async def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


class _Counted:
    """`http_front._run`, counting the requests the front serves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        run = http_front._run

        async def counted(cycle: Any, handler: Any) -> None:
            self.calls += 1
            await run(cycle, handler)

        monkeypatch.setattr(http_front, "_run", counted)


def _without_front(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_server, "front_for", lambda config, edge: edge)


def _protocol_name(server: RouterServer) -> str:
    assert server._http is not None
    return str(server._http.config.http_protocol_class.__name__)


async def _mixed(make_worker: WorkerFactory, tokenizer: TextTokenizer) -> FakeWorker:
    m = await make_worker(Role.MIXED)
    m.script.completion = tuple(tokenizer.encode(TEXT))
    return m


async def test_the_front_answers_byte_for_byte_what_uvicorns_path_answers(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = await _mixed(make_worker, tokenizer)
    edge = EdgeSettings(max_body_bytes=4096)
    front = await make_router(m.address, edge=edge)
    counted = _Counted(monkeypatch)
    with monkeypatch.context() as patch:
        _without_front(patch)
        plain = await make_router(m.address, edge=edge)
    assert _protocol_name(front).startswith("Front")
    assert not _protocol_name(plain).startswith("Front")

    through_uvicorn = await _served(plain)
    assert counted.calls == 0
    direct = await _served(front)
    names = [name for name, _ in KEPT_ALIVE + ALONE]
    taken = [name for name in names if "(uvicorn)" not in name]
    assert counted.calls == len(taken)  # the others took uvicorn's path
    for name, old, new in zip(names, through_uvicorn, direct, strict=True):
        assert new == old, name
    answers = dict(zip(names, direct, strict=True))
    assert answers["streamed chat"][0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert answers["streamed chat"][1].endswith(b"data: [DONE]\n\n")
    assert TEXT.split()[-1].encode() in answers["streamed chat"][1]
    assert b'"usage"' in answers["streamed chat"][1]
    assert b"x-request-id: abc\r\n" in answers["whole chat"][0]
    statuses = {name: int(head.split(b" ", 2)[1]) for name, (head, _) in answers.items()}
    assert statuses == {
        **dict.fromkeys(names, 200),
        "bad JSON": 400,
        "not an object": 400,
        "unknown field": 400,
        "wrong type": 400,
        "unknown model": 404,
        "form body": 415,
        "empty SLO class": 400,
        "unknown SLO class": 400,
        "GET (uvicorn)": 405,
        "too large": 413,
    }
    assert b"connection: close" in answers["connection: close"][0]


async def test_a_client_gone_mid_stream_cancels_its_request_on_the_front(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = await _mixed(make_worker, tokenizer)
    m.script.hold = asyncio.Event()
    m.script.hold_after = 1
    server = await make_router(m.address)
    counted = _Counted(monkeypatch)
    assert server.http_port is not None
    generator = server._generator
    assert generator is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    writer.write(_post(CHAT, {**_CHAT, "stream": True}))
    async with asyncio.timeout(20):
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        writer.close()
    await _until(lambda: bool(m.cancelled) and not generator.num_running)
    assert counted.calls == 1


async def test_admission_429_is_the_same_on_the_front(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    tokenizer: TextTokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = await _mixed(make_worker, tokenizer)
    m.script.hold = asyncio.Event()
    m.script.hold_after = 1
    slo = SloSettings(queue_capacity=0, max_outstanding_per_worker=1)
    front = await make_router(m.address, slo=slo)
    with monkeypatch.context() as patch:
        _without_front(patch)
        plain = await make_router(m.address, slo=slo)
    counted = _Counted(monkeypatch)
    refused = []
    for server in (plain, front):
        assert server.http_port is not None
        held_r, held_w = await asyncio.open_connection("127.0.0.1", server.http_port)
        held_w.write(_post(CHAT, {**_CHAT, "stream": True}))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
        async with asyncio.timeout(20):
            await held_r.readuntil(b"\r\n\r\n")  # the first is running, held by the worker
            writer.write(_post(CHAT, {**_CHAT, "stream": True}))
            refused.append(_normal(*await _answer(reader)))
        writer.close()
        held_w.close()
    assert refused[0] == refused[1]
    assert refused[1][0].startswith(b"HTTP/1.1 429 ")
    assert b"retry-after: " in refused[1][0].lower()
    assert counted.calls == 2


async def test_with_api_keys_every_request_takes_uvicorns_path(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    m = await _mixed(make_worker, tokenizer)
    server = await make_router(m.address, auth=AuthSettings(key_sha256=(key_sha256_hex("k"),)))
    assert not _protocol_name(server).startswith("Front")  # the keys are checked in `AuthApp`
    assert server.http_port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(_post(CHAT, _CHAT))
        async with asyncio.timeout(20):
            head, _ = await _answer(reader)
        assert head.startswith(b"HTTP/1.1 401 ")
    finally:
        writer.close()


def test_the_front_stands_in_only_for_the_proxy_headers_middleware() -> None:
    class Edge(asyncio.Protocol):
        pass

    app = EdgeApp(FastAPI(), {})

    def config(loaded: Any, **settings: Any) -> Any:
        base = {"root_path": "", "limit_concurrency": None, "reset_contextvars": False}
        return SimpleNamespace(app=app, loaded_app=loaded, **{**base, **settings})

    assert front_for(config(app), Edge).__name__ == "FrontEdge"
    assert front_for(config(ProxyHeadersMiddleware(app)), Edge).__name__ == "FrontEdge"
    # Any other wrapper (uvicorn's message logger at TRACE level, say) would be skipped.
    assert front_for(config(MessageLoggerMiddleware(app)), Edge) is Edge
    assert front_for(config(app, root_path="/api"), Edge) is Edge
    assert front_for(config(app, limit_concurrency=10), Edge) is Edge
    assert front_for(config(app, reset_contextvars=True), Edge) is Edge

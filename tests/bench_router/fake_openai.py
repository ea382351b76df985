"""A zero-delay fake OpenAI server (the peer router's backends in `make bench-router`).

Answers `GET /health`, `GET /v1/models` and `POST /v1/chat/completions` / `/v1/completions`
with `TOKENS` tokens, streamed as SSE (chunked) when the request says `"stream": true`, else one
JSON body (with empty `kv_transfer_params`, which vLLM's P/D prefill answers carry). A raw
asyncio protocol, so the backend costs as little as possible on the load generator's core.

    python -m tests.bench_router.fake_openai PORT [PORT ...]
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, cast

TOKENS = 16

_HEAD_SSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse_body(chat: bool) -> bytes:
    out = []
    for i in range(TOKENS):
        last = i == TOKENS - 1
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": " tok"}}
        else:
            choice = {"index": 0, "text": " tok"}
        choice["finish_reason"] = "length" if last else None
        body = {"id": "x", "object": "chunk", "created": 0, "model": "m", "choices": [choice]}
        out.append(_chunk(b"data: " + json.dumps(body).encode() + b"\n\n"))
    out.append(_chunk(b"data: [DONE]\n\n"))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


_SSE = {True: _sse_body(True), False: _sse_body(False)}


def _json(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(data) + data


_WHOLE = _json(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": " tok"},
                     "text": " tok", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "kv_transfer_params": {},
    }
)  # fmt: skip
_MODELS = _json({"object": "list", "data": [{"id": "m", "object": "model"}]})
_OK = _json({"status": "ok"})


class _Http(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self._answer(head.split(" ", 2), body)

    def _answer(self, line: list[str], body: bytes) -> None:
        assert self.transport is not None
        method, path = line[0], line[1]
        if method == "GET":
            self.transport.write(_MODELS if path.startswith("/v1/models") else _OK)
            return
        stream = b'"stream": true' in body or b'"stream":true' in body
        if stream:
            self.transport.write(_HEAD_SSE + _SSE[path.endswith("chat/completions")])
        else:
            self.transport.write(_WHOLE)


async def serve(ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(_Http, "127.0.0.1", p) for p in ports]
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve([int(p) for p in sys.argv[1:]]))

"""HTTP semantics of the OpenAI face beyond the bodies: methods and request encodings."""

from __future__ import annotations

import gzip
import json

import pytest

from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", CHAT, "POST"),
        ("PUT", COMPLETIONS, "POST"),
        ("DELETE", "/v1/models", "GET, HEAD"),
        ("POST", "/metrics", "GET, HEAD"),
    ],
)
async def test_405_names_the_allowed_methods(
    make_stack: StackFactory, method: str, path: str, allowed: str
) -> None:
    # RFC 9110 15.5.6: a 405 MUST carry `Allow`. Before the fix the OpenAI error handler rebuilt
    # the response from the status and message only and dropped Starlette's `Allow` header.
    stack = await make_stack()
    async with stack.client() as client:
        r = await client.request(method, path)
    assert r.status_code == 405
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers.get("allow") == allowed


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/tokenize"])
@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate, gzip"])
async def test_a_compressed_body_is_refused_with_415_naming_the_encoding(
    make_worker: WorkerFactory, make_stack: StackFactory, path: str, encoding: str
) -> None:
    # Before the fix `Content-Encoding` was ignored: a gzip body was a 400 "not valid JSON:
    # str is not valid UTF-8" (naming nothing the client did), and a plain JSON body labelled
    # `br` was served as if the header were absent.
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    if path == CHAT:
        body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    else:
        body = {"model": MODEL, "prompt": "x"}
    raw = json.dumps(body).encode()
    content = gzip.compress(raw) if encoding == "gzip" else raw
    headers = {"content-type": "application/json", "content-encoding": encoding}
    async with stack.client() as client:
        r = await client.post(path, content=content, headers=headers)
        reached = w.names()
        ok = await client.post(  # identity is what no header means
            path,
            content=raw,
            headers={"content-type": "application/json", "content-encoding": "identity"},
        )
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] is None
    assert error["code"] == "unsupported_content_encoding"
    assert f"Content-Encoding '{encoding}'" in error["message"]
    assert reached == []
    assert ok.status_code == 200, ok.text

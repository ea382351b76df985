"""A fake `vllm serve` OpenAI server that speaks vLLM's `kv_transfer_params` P/D protocol.

What it does like vLLM's NixlConnector: a prefill (`do_remote_decode`) computes the prompt,
samples one token, holds the prompt's "KV" under the returned `remote_request_id` and answers
with the parameters a decode server needs; a decode (`do_remote_prefill`) *pulls* the held KV
from `remote_host:remote_port` (here an HTTP GET on the prefill fake, which frees it), checks it
is the KV of the prompt it was given, and samples every output token itself, the first one again.
A pull of KV nobody holds fails the request (vLLM's `kv_load_failure_policy: fail`).

Tokens are a deterministic function of the context (and the seed when sampling), so P/D and
aggregated runs of the same request must agree token by token. `/metrics` exports vLLM's gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

VOCAB = 400
"""Token ids the fake emits: [FIRST_ID, FIRST_ID + VOCAB) (plain pieces of the test tokenizer)."""
FIRST_ID = 300
NUM_BLOCKS = 1000
BLOCK_SIZE = 16


def next_token(context: list[int], seed: int | None) -> int:
    h = 7
    for i, t in enumerate(context):
        h = (h * 31 + t * (i + 1)) % 1_000_003
    if seed is not None:
        h = (h + seed * 17) % 1_000_003
    return FIRST_ID + h % VOCAB


@dataclass
class FakeVllm:
    """One fake server; `await start()`, `await stop()`."""

    model: str = "fake-model"
    fail_prefill: bool = False
    """Answer prefills with HTTP 500."""
    fail_pulls: str = ""
    """Answer decodes as if the KV pull failed: `event` (an error event in the stream) or
    `finish` (a chunk with `finish_reason: error` and no token, vLLM's `kv_load_failure_policy:
    fail`)."""
    first_token_offset: int = 0
    """Add this to the first token of a decode (a decode that disagrees with its prefill)."""
    num_waiting: int = 0
    max_model_len: int = 4096
    """Longer prompt + max_tokens get vLLM's 400."""
    """What `/metrics` reports as waiting."""
    calls: list[str] = field(default_factory=list)
    """`prefill`, `decode` or `generate`, one per completion request."""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    pulls: int = 0
    """KV pulls this server (as a decode server) made."""
    held: dict[str, list[int]] = field(default_factory=dict)
    """KV held for decode servers, by remote request id."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: any free port."""
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None
    _running: int = 0
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = Starlette(
            routes=[
                Route("/v1/models", self._models),
                Route("/metrics", self._metrics),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/_fake/kv/{rid}", self._pull_kv),
            ]
        )
        sock = socket.socket()
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:  # noqa: ASYNC110 - uvicorn has no event for it
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- routes ------------------------------------------------------------------------------

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _metrics(self, request: Request) -> Response:
        labels = f'engine="0",model_name="{self.model}"'
        used = min(1.0, self._running / 10)
        text = "\n".join(
            [
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{labels}}} {self._running}",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{labels}}} {self.num_waiting}",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{labels}}} {used}",
                "# TYPE vllm:cache_config_info gauge",
                f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",engine="0",'
                f'num_gpu_blocks="{NUM_BLOCKS}"}} 1.0',
                "",
            ]
        )
        return PlainTextResponse(text)

    async def _pull_kv(self, request: Request) -> Response:
        prompt = self.held.pop(request.path_params["rid"], None)
        if prompt is None:
            return JSONResponse({"error": "no such KV"}, status_code=404)
        return JSONResponse({"prompt": prompt})

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        if body.get("model") != self.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not body.get("return_token_ids"):
            return _error(400, "the fake takes token-id prompts with return_token_ids")
        if len(prompt) + int(body.get("max_tokens") or 16) > self.max_model_len:
            return _error(400, f"This model's maximum context length is {self.max_model_len}")
        kv = body.get("kv_transfer_params") or {}
        seed = body.get("seed") if (body.get("temperature") or 0) > 0 else None
        max_tokens = int(body.get("max_tokens") or 16)
        if kv.get("do_remote_decode"):
            self.calls.append("prefill")
            if self.fail_prefill:
                return _error(500, "prefill failed (fault injected)")
            rid = f"{self.model}-{next(self._ids)}"
            self.held[rid] = list(prompt)
            token = next_token(prompt, seed)
            params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": f"engine-{self.port}",
                "remote_block_ids": list(range(-(-len(prompt) // BLOCK_SIZE))),
                "remote_host": self.host,
                "remote_port": self.port,
                "remote_request_id": rid,
                "tp_size": 1,
            }
            choice = {"index": 0, "text": "", "token_ids": [token], "finish_reason": "length"}
            return JSONResponse(
                {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "model": self.model,
                    "choices": [choice],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1},
                    "kv_transfer_params": params,
                }
            )
        offset = 0
        if kv.get("do_remote_prefill"):
            self.calls.append("decode")
            if self.fail_pulls == "event":
                return self._stream_error("KV pull failed (fault injected)")
            if self.fail_pulls == "finish":
                return self._stream_finish_error()
            async with httpx.AsyncClient() as client:
                pulled = await client.get(
                    f"http://{kv['remote_host']}:{kv['remote_port']}"
                    f"/_fake/kv/{kv['remote_request_id']}"
                )
            if pulled.status_code != 200 or pulled.json()["prompt"] != prompt:
                return self._stream_error("KV pull failed")
            self.pulls += 1
            offset = self.first_token_offset
        else:
            self.calls.append("generate")
        if not body.get("stream"):
            return _error(400, "the fake streams decodes and whole requests only")
        stop_ids = set(body.get("stop_token_ids") or ())
        ignore_eos = bool(body.get("ignore_eos"))
        return StreamingResponse(
            self._generate(list(prompt), max_tokens, seed, stop_ids, ignore_eos, offset),
            media_type="text/event-stream",
        )

    async def _generate(
        self,
        context: list[int],
        max_tokens: int,
        seed: int | None,
        stop_ids: set[int],
        ignore_eos: bool,
        first_offset: int,
    ) -> AsyncIterator[str]:
        self._running += 1
        try:
            for i in range(max_tokens):
                token = next_token(context, seed) + (first_offset if i == 0 else 0)
                context.append(token)
                reason = None
                if token in stop_ids and not ignore_eos:
                    reason = "stop"
                elif i == max_tokens - 1:
                    reason = "length"
                choice = {"index": 0, "text": "", "token_ids": [token], "finish_reason": reason}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                await asyncio.sleep(0)
                if reason is not None:
                    break
            yield "data: [DONE]\n\n"
        finally:
            self._running -= 1

    def _stream_finish_error(self) -> Response:
        async def events() -> AsyncIterator[str]:
            choice = {"index": 0, "text": "", "token_ids": [], "finish_reason": "error"}
            yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def _stream_error(self, message: str) -> Response:
        async def events() -> AsyncIterator[str]:
            yield f"data: {json.dumps({'error': {'message': message, 'code': 500}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def _error(status: int, message: str) -> Response:
    return JSONResponse(
        {"error": {"message": message, "type": "BadRequestError", "code": status}},
        status_code=status,
    )

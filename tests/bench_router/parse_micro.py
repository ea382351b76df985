"""The router's per-request path before dispatch, timed in-process (issue 17's parse path).

A chat completion route of `openai_api.create_app` is called the way the HTTP front calls it
(`serve_hot` with an ASGI scope and a `receive` holding the body), with `OpenAiApi.serve`
replaced by an empty answer: what is timed is everything a request costs before it reaches the
dispatcher (the `HttpRequest`, the headers, the body's JSON, the request model's validation,
the field checks, the chat template and tokenizing, `build_request`, the response's id). Also
each step on its own, on the benchmark's body (`tests.bench_router.run.chat_body`: a 200-token
prompt, streamed, 16 tokens; `--slo-header` adds `x-slo-class: interactive`).

    python -m tests.bench_router.parse_micro [--prompt-tokens 200] [--number 500] [--repeat 15]
        [--slo-header] [--route-only]

Times are the best of `--repeat` repeats (µs per call); only ratios on one machine in one run
mean much. To compare two trees, run it alternately with `PYTHONPATH=<tree>/src:.` (the route's
own code is the tree's; this harness is this tree's).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from splitserve.api.router import SloSettings
from splitserve.api.v1alpha1 import SloClassSpec
from splitserve.core.clock import SystemClock
from splitserve.obs.metrics import RouterMetrics
from splitserve.router import openai_api
from splitserve.router import openai_models as wire
from splitserve.router.dispatch import Dispatcher
from splitserve.router.generation import Generator
from splitserve.router.openai_fields import refusal, sampler_knobs
from splitserve.router.openai_parse import parse_body, template_messages
from splitserve.router.pool_view import PoolView
from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router.run import chat_body, prompt_of

MODEL = "bench"


def build(tokenizer: TextTokenizer) -> tuple[openai_api.EdgeApp, Generator]:
    clock = SystemClock()
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    pool = PoolView([], clock=clock, metrics=metrics)
    slo = SloSettings(
        classes=(
            SloClassSpec(name="interactive", ttft_ms=1000, tpot_ms=100, priority=10),
            SloClassSpec(name="batch", ttft_ms=10000, tpot_ms=500, sheddable=True),
        ),
        default_class="interactive",
    )
    dispatcher = Dispatcher(pool, clock=clock, metrics=metrics, slo=slo)
    generator = Generator(
        dispatcher, tokenizer, clock=clock, max_model_len=4096, default_max_tokens=256
    )
    app = openai_api.create_app(
        generator, pool, model_name=MODEL, registry=registry, unix_time=time.time
    )
    return app, generator


def scope_of(raw: bytes, slo_header: bool) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
    ]
    if slo_header:
        headers.append((b"x-slo-class", b"interactive"))
    return {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }


async def _empty_serve(*_: Any, **__: Any) -> Response:
    return Response(b"", status_code=200)


def time_route(
    app: openai_api.EdgeApp, raw: bytes, slo_header: bool, number: int, repeat: int
) -> float:
    """µs per request of the chat route up to dispatch (best of `repeat` repeats)."""
    handler = app.hot_routes["/v1/chat/completions"]
    base = scope_of(raw, slo_header)
    message = {"type": "http.request", "body": raw, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: Any) -> None:
        return None

    async def run() -> float:
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                scope = dict(base)
                await handler(HttpRequest(scope, receive, send))
            best = min(best, time.perf_counter() - start)
        return best / number * 1e6

    real = openai_api.OpenAiApi.serve
    openai_api.OpenAiApi.serve = _empty_serve  # type: ignore[method-assign]
    try:
        return asyncio.run(run())
    finally:
        openai_api.OpenAiApi.serve = real  # type: ignore[method-assign]


def best(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--number", type=int, default=500, help="calls per repeat")
    parser.add_argument("--repeat", type=int, default=15, help="repeats (the best is given)")
    parser.add_argument("--slo-header", action="store_true")
    parser.add_argument("--route-only", action="store_true", help="only the whole route")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = TextTokenizer.from_dir(default_tokenizer_dir(Path(tmp) / "tokenizer"))
    raw = chat_body(MODEL, prompt_of(tokenizer, args.prompt_tokens))
    app, generator = build(tokenizer)
    n = args.number
    model = wire.ChatCompletionRequest
    body = orjson.loads(raw)
    req = parse_body(model, orjson.loads(raw), allow_unknown=False)
    messages = template_messages(req.messages)
    route = time_route(app, raw, args.slo_header, n, args.repeat)
    if args.route_only:
        print(f"{route:9.2f} µs  route up to dispatch")
        return
    rows = {
        "route up to dispatch (all of the below and more)": route,
        "orjson.loads(body)": best(lambda: orjson.loads(raw), n * 10, args.repeat),
        "model_validate(dict)": best(lambda: model.model_validate(body), n * 10, args.repeat),
        "parse_body (loads + validate)": best(
            lambda: parse_body(model, orjson.loads(raw), allow_unknown=False),
            n * 10,
            args.repeat,
        ),
        "refusal": best(lambda: refusal(req, ("sim",)), n * 10, args.repeat),
        "sampler_knobs": best(lambda: sampler_knobs(req), n * 10, args.repeat),
        "template_messages": best(lambda: template_messages(req.messages), n * 10, args.repeat),
        "chat template + tokenize": best(
            lambda: generator.tokenizer.apply_chat_template(messages), n, args.repeat
        ),
    }
    print(f"body: {len(raw)} bytes, prompt {args.prompt_tokens} tokens")
    for name, us in rows.items():
        print(f"{us:9.2f} µs  {name}")


if __name__ == "__main__":
    main()

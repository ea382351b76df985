"""The OpenAI-compatible HTTP face of the router (FastAPI).

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (streamed as SSE or whole),
`GET /v1/models`, `/health` (process up), `/ready` (a decode-capable worker accepts work),
`/metrics` (the router's own registry). Every error is an OpenAI error body with a 4xx/5xx status;
malformed JSON and wrong types are 400, never FastAPI's 422.

`/v1/completions` serves one prompt per request: `prompt` may be a string, a list of token ids,
or a list holding exactly one of those; several prompts are a 400. `n` must be 1.

A client that goes away cancels its request: streamed responses through Starlette's disconnect
handling, whole responses through a watcher on the ASGI `receive` channel.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pydantic
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as HttpRequest

from splitserve.core.errors import SplitserveError
from splitserve.core.request import Request
from splitserve.router import openai_models as wire
from splitserve.router.errors import InvalidRequest
from splitserve.router.generation import GenerationParams, Generator
from splitserve.router.openai_errors import ApiError, api_error_from
from splitserve.router.openai_stream import ClientGone, collect, stream_body, unless_disconnected
from splitserve.router.pool_view import PoolView

log = logging.getLogger(__name__)

_SLO_HEADER = "x-slo-class"
_SLO_OVERRIDE_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms")


class OpenAiApi:
    """Request handling shared by both completion routes."""

    def __init__(
        self,
        generator: Generator,
        pool: PoolView,
        *,
        model_name: str,
        registry: CollectorRegistry,
        unix_time: Callable[[], float],
    ) -> None:
        self.generator = generator
        self.pool = pool
        self.model_name = model_name
        self.registry = registry
        self.unix_time = unix_time

    # -- parsing ---------------------------------------------------------------------------

    @staticmethod
    async def read_body(request: HttpRequest, model: type[wire.SamplingFields]) -> Any:
        try:
            body = json.loads(await request.body())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ApiError(400, f"the request body is not valid JSON: {err}") from err
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        try:
            return model.model_validate(body)
        except pydantic.ValidationError as err:
            first = err.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise ApiError(400, f"{param}: {first['msg']}", param=param) from err

    def check_common(self, req: wire.SamplingFields) -> None:
        if req.model != self.model_name:
            raise ApiError(
                404,
                f"The model `{req.model}` does not exist.",
                param="model",
                code="model_not_found",
            )
        if req.n not in (None, 1):
            raise ApiError(400, "only n=1 is supported", param="n")

    def params(
        self, req: wire.SamplingFields, max_tokens: int | None, http: HttpRequest
    ) -> GenerationParams:
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=req.stop_strings(),
            ignore_eos=req.ignore_eos,
            slo_class=http.headers.get(_SLO_HEADER) or "",
            slo_overrides=_slo_overrides(http),
        )

    def completion_prompt(self, req: wire.CompletionRequest) -> list[int]:
        if req.echo or req.logprobs or req.suffix or (req.best_of or 1) > 1:
            raise ApiError(400, "echo, logprobs, suffix and best_of are not supported")
        prompt: Any = req.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise ApiError(400, "only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.generator.tokenizer.encode(prompt)
        return list(prompt)

    def chat_prompt(self, req: wire.ChatCompletionRequest) -> list[int]:
        if req.logprobs:
            raise ApiError(400, "logprobs are not supported", param="logprobs")
        try:
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
            return self.generator.tokenizer.apply_chat_template(messages)
        except ValueError as err:
            raise ApiError(400, str(err), param="messages") from err

    # -- serving ---------------------------------------------------------------------------

    async def serve(
        self,
        http: HttpRequest,
        request: Request,
        req: wire.SamplingFields,
        fmt: wire.Formatter,
    ) -> Response:
        chunks = self.generator.stream(request, req.stop_strings())
        if not req.stream:
            try:
                text, last = await unless_disconnected(http, collect(chunks))
            except ClientGone:
                log.info("client left before %s finished", request.id)
                return Response(status_code=499)
            except SplitserveError as err:
                return api_error_from(err).response()
            assert last.usage is not None
            return JSONResponse(fmt.response(text, last.finish_reason, last.usage))
        # Wait for the first tokens before answering, so placement and rejection errors still
        # get a proper status code instead of an error event inside a 200 stream.
        try:
            first = await unless_disconnected(http, anext(chunks))
        except ClientGone:
            await chunks.aclose()
            return Response(status_code=499)
        except SplitserveError as err:
            await chunks.aclose()
            return api_error_from(err).response()
        body = stream_body(fmt, first, chunks, include_usage=req.include_usage)
        return StreamingResponse(body, media_type="text/event-stream")


def _slo_overrides(http: HttpRequest) -> tuple[tuple[str, str], ...]:
    out = []
    for header in _SLO_OVERRIDE_HEADERS:
        value = http.headers.get(header)
        if value is None:
            continue
        try:
            ms = float(value)
        except ValueError:
            ms = float("nan")
        if not 0 < ms < float("inf"):
            raise ApiError(
                400, f"{header}: must be a positive number of milliseconds", param=header
            )
        out.append((header, repr(ms)))
    return tuple(out)


def create_app(
    generator: Generator,
    pool: PoolView,
    *,
    model_name: str,
    registry: CollectorRegistry,
    unix_time: Callable[[], float],
) -> FastAPI:
    """The router's FastAPI app. `unix_time` stamps `created` fields (the only wall-clock use)."""
    api = OpenAiApi(generator, pool, model_name=model_name, registry=registry, unix_time=unix_time)
    app = FastAPI(title="splitserve router", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)

    def formatter(chat: bool) -> wire.Formatter:
        prefix = "chatcmpl" if chat else "cmpl"
        return wire.Formatter(
            chat=chat,
            response_id=f"{prefix}-{uuid.uuid4().hex}",
            created=int(api.unix_time()),
            model=model_name,
        )

    @app.post("/v1/completions")
    async def completions(http: HttpRequest) -> Response:
        try:
            req = await api.read_body(http, wire.CompletionRequest)
            api.check_common(req)
            prompt = api.completion_prompt(req)
            fmt = formatter(chat=False)
            request = generator.build_request(
                fmt.response_id, prompt, api.params(req, req.max_tokens, http)
            )
        except ApiError as err:
            return err.response()
        except InvalidRequest as err:
            return api_error_from(err).response()
        return await api.serve(http, request, req, fmt)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HttpRequest) -> Response:
        try:
            req = await api.read_body(http, wire.ChatCompletionRequest)
            api.check_common(req)
            prompt = api.chat_prompt(req)
            fmt = formatter(chat=True)
            max_tokens = req.max_completion_tokens or req.max_tokens
            request = generator.build_request(
                fmt.response_id, prompt, api.params(req, max_tokens, http)
            )
        except ApiError as err:
            return err.response()
        except InvalidRequest as err:
            return api_error_from(err).response()
        return await api.serve(http, request, req, fmt)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "splitserve"}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        views = pool.views()
        num_ready = sum(1 for v in views if v.accepts_work and v.role.can_decode)
        if num_ready:
            return JSONResponse({"status": "ready", "decode_endpoints": num_ready})
        return ApiError(503, "no decode-capable worker is ready", "service_unavailable").response()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    async def http_error(_: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return ApiError(exc.status_code, str(exc.detail), type_).response()

    async def validation_error(_: HttpRequest, exc: Exception) -> Response:
        return ApiError(400, str(exc)).response()

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)

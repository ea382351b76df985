"""The OpenAI-compatible HTTP face of the router (FastAPI).

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (streamed as SSE or whole),
`/health` (process up), `/ready` (a decode-capable worker accepts work), `/metrics` (the router's
own registry), and vLLM's: `GET /v1/models[/{id}]`, `/tokenize`, `/detokenize`, `/version`,
`/ping` (`openai_vllm`). Every error is an OpenAI error body with a 4xx/5xx status; malformed
JSON, wrong types and unknown fields are 400, never FastAPI's 422; an unknown route is a 404 with
an OpenAI body. Fields the serving engines cannot honour are refused (`openai_fields`).

`/v1/completions` serves one prompt per request: `prompt` may be a string, a list of token ids,
or a list holding exactly one of those; several prompts are a 400. `n` must be 1.

A client that goes away cancels its request: through the connection's `ClientLink` when the
router's own HTTP protocol serves it (`client_link`; streamed answers then skip Starlette's
`StreamingResponse` and are written on the connection directly, `http_sse`), else through
Starlette's disconnect handling (streamed) or a watcher on the ASGI `receive` channel (whole
answers).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
import pydantic
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as HttpRequest

from splitserve.core.errors import SplitserveError
from splitserve.core.request import Request
from splitserve.obs import logs as obs_logs
from splitserve.obs import tracing
from splitserve.router import openai_models as wire
from splitserve.router.client_link import link_of
from splitserve.router.errors import InvalidRequest
from splitserve.router.generation import GenerationParams, Generator
from splitserve.router.http_sse import EdgeSseResponse, stream_of
from splitserve.router.openai_errors import ApiError, api_error_from
from splitserve.router.openai_fields import (
    PRIORITY_REFUSED,
    refusal,
    requested_logprobs,
    sampler_knobs,
    structured_outputs,
)
from splitserve.router.openai_parse import chat_template_options, parse_body, template_messages
from splitserve.router.openai_stream import (
    ClientGone,
    SseResponse,
    collect,
    stream_body,
    unless_disconnected,
)
from splitserve.router.openai_tools import NO_TOOLS, ToolPlan
from splitserve.router.openai_tools import plan as tool_plan
from splitserve.router.openai_vllm import add_vllm_routes
from splitserve.router.pool_view import PoolView

log = logging.getLogger(__name__)

_SLO_HEADER = "x-slo-class"
_SLO_OVERRIDE_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms")
_ID_HEADER = "x-request-id"
_ID_HEADER_RAW = b"x-request-id"
_CLIENT_ID_OK = re.compile(r"[\x21-\x7e]{1,128}")
"""A client's `x-request-id` is echoed back only if it is 1-128 visible ASCII characters."""


def client_request_id(http: HttpRequest) -> str | None:
    """The client's `x-request-id`, if it is safe to echo. Only a label: the router never uses
    it to find, cancel or route a request (its own ids are minted here)."""
    value = header(http, _ID_HEADER_RAW)
    value = value if value is not None and _CLIENT_ID_OK.fullmatch(value) else None
    obs_logs.client_request_id.set(value)  # for the per-request log line
    # traceparent; the pairs are decoded only when tracing is on (`carrier_of` reads them then)
    pairs = ((k.decode("latin-1"), v) for k, v in http.scope["headers"])
    tracing.client_carrier.set(tracing.carrier_of(pairs) or None)
    return value


def header(http: HttpRequest, name: bytes) -> str | None:
    """The first value of the header `name` (lower case), as Starlette's `http.headers.get`
    gives it, without building Starlette's `Headers` (a scan of the scope's raw pairs: the
    completion routes read ~8 headers per request, most of them absent)."""
    for key, value in http.scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def header_values(http: HttpRequest, name: bytes) -> list[str]:
    """Every value of the header `name` (lower case), as Starlette's `http.headers.getlist`."""
    return [value.decode("latin-1") for key, value in http.scope["headers"] if key == name]


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

    async def read_json_object(self, request: HttpRequest) -> dict[str, Any]:
        """The body as a JSON object, within the body limit; 400 otherwise (415 for a body sent
        with a `Content-Encoding` other than identity: compressed bodies are not decoded, or with
        a `Content-Type` other than JSON, as vLLM's server refuses it: curl's `-d` without
        `-H 'Content-Type: application/json'` labels JSON as a form; none at all is read as
        JSON)."""
        raw = await self.read_limited(request)  # read whole: the connection stays usable
        content_type = (header(request, b"content-type") or "").strip()
        if content_type and not _is_json(content_type):
            raise ApiError(
                415,
                f"Content-Type {content_type!r} is not supported: send the request body as JSON "
                "with Content-Type: application/json",
                code="unsupported_media_type",
            )
        encoding = (header(request, b"content-encoding") or "").strip()
        if encoding and encoding.lower() != "identity":
            raise ApiError(
                415,
                f"Content-Encoding {encoding!r} is not supported: send the request body "
                "uncompressed (identity)",
                code="unsupported_content_encoding",
            )
        try:
            body = orjson.loads(raw)
        except (orjson.JSONDecodeError, RecursionError) as err:
            # orjson also refuses lone surrogates and nesting deeper than 1024 levels.
            raise ApiError(400, f"the request body is not valid JSON: {err}") from err
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    async def read_body(self, request: HttpRequest, model: type[pydantic.BaseModel]) -> Any:
        body = await self.read_json_object(request)
        return parse_body(model, body, allow_unknown=self.generator.edge.allow_unknown_fields)

    async def read_limited(self, request: HttpRequest) -> bytes:
        """The body, refused with 413 as soon as it is known to exceed `edge.max_body_bytes`."""
        limit = self.generator.edge.max_body_bytes
        declared = header(request, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        # The ASGI messages read here rather than through Starlette's `request.stream()` (the
        # same loop, without an async generator per request); nothing reads the body again.
        receive = request.receive
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "http.request":
                part = message.get("body", b"")
                if part:
                    size += len(part)
                    if size > limit:
                        raise _too_large(limit)
                    parts.append(part)
                if not message.get("more_body", False):
                    return b"".join(parts)
            elif kind == "http.disconnect":  # gone, or timed out by the edge (which answered)
                raise ApiError(499, "the client went away before sending its request")

    def reject(
        self, err: ApiError, client_id: str | None = None, slo_header: str | None = None
    ) -> Response:
        """Answer a request refused before dispatch, counting it (outcome `rejected`, labelled
        with the class it asked for: a declared class, or `other`)."""
        self.generator.count_refused(slo_header)
        response = err.response()
        if err.status == 413:
            response.headers["connection"] = "close"  # do not read the rest of the body
        if client_id is not None:
            response.headers[_ID_HEADER] = client_id
        return response

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
        if req.priority:
            raise ApiError(400, f"priority: {PRIORITY_REFUSED}", param="priority")
        refused = refusal(req, self.pool.engines())
        if refused is not None:
            raise refused

    def params(
        self, req: wire.SamplingFields, max_tokens: int | None, http: HttpRequest
    ) -> GenerationParams:
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=self.generator.check_stops(req.stop_strings()),
            ignore_eos=req.ignore_eos,
            sampler=sampler_knobs(req),
            logprobs=(logprobs := requested_logprobs(req)),
            structured_outputs=structured_outputs(req),
            prompt_logprobs=_prompt_logprobs(req, logprobs),
            slo_class=self.slo_header(http),
            slo_overrides=_slo_overrides(http),
        )

    def slo_header(self, http: HttpRequest) -> str:
        """The `x-slo-class` header ("" when absent: the default class); an empty one is a 400
        (as an unknown class is), not the default class taken silently."""
        value = _one_header(http, _SLO_HEADER)
        if value is None:
            return ""
        if not value.strip():
            known = ", ".join(sorted(self.generator.dispatcher.slo.table.classes))
            raise ApiError(
                400,
                f"{_SLO_HEADER}: the header is empty; known classes: {known} "
                "(leave the header out for the default class)",
                param=_SLO_HEADER,
            )
        return value.strip()  # optional whitespace around a field value is not part of it

    def truncated(self, req: wire.SamplingFields, prompt: list[int]) -> list[int]:
        """The prompt's last `truncate_prompt_tokens` tokens (vLLM's; -1: the context's
        length), or a 400 naming the field."""
        k = req.truncate_prompt_tokens
        if k is None:
            return prompt
        limit = self.generator.max_model_len
        if k == -1:
            k = limit
        elif k < 1:
            raise ApiError(
                400,
                f"truncate_prompt_tokens: must be -1 or at least 1, got {k}",
                param="truncate_prompt_tokens",
            )
        elif k > limit:
            raise ApiError(
                400,
                f"truncate_prompt_tokens ({k}) is greater than max_model_len ({limit}); use a "
                "value at most max_model_len, or -1 for it",
                param="truncate_prompt_tokens",
            )
        return prompt[-k:]

    def logprobs_format(
        self,
        fmt: wire.Formatter,
        req: wire.SamplingFields,
        params: GenerationParams,
        prompt: list[int],
    ) -> None:
        """Log probabilities as the request asked for them (`return_tokens_as_token_ids`
        without them is a 400: it would do nothing); the prompt's too (`prompt_logprobs`, or
        completions' `echo` with `logprobs`), not streamed."""
        echoed = isinstance(req, wire.CompletionRequest) and bool(req.echo)
        echoed = echoed and params.logprobs is not None
        if req.stream and req.prompt_logprobs is not None:
            raise ApiError(
                400,
                "prompt_logprobs: not available with `stream: true` (as vLLM)",
                param="prompt_logprobs",
            )
        if req.stream and echoed:
            raise ApiError(
                400,
                "echo: with logprobs only without `stream` (the prompt's log probabilities come "
                "in the whole answer)",
                param="echo",
            )
        as_ids = bool(req.return_tokens_as_token_ids)
        if as_ids and params.logprobs is None:
            raise ApiError(
                400,
                "return_tokens_as_token_ids: only with logprobs (it names the tokens of the "
                "log probabilities)",
                param="return_tokens_as_token_ids",
            )
        fmt.with_logprobs(params.logprobs, self.generator.tokenizer, as_ids=as_ids)
        if params.prompt_logprobs is not None:
            fmt.with_prompt_logprobs(
                prompt,
                self.generator.tokenizer,
                echoed=echoed,
                field=req.prompt_logprobs is not None,
                as_ids=as_ids,
            )

    def echo_text(self, req: wire.CompletionRequest, prompt: list[int]) -> str:
        """What `echo` puts before the answer: a text prompt as sent; token ids (or a prompt
        `truncate_prompt_tokens` cut) decoded, special tokens kept (what was sent)."""
        text: Any = req.prompt
        if isinstance(text, list) and text and isinstance(text[0], str):
            text = text[0]
        if isinstance(text, str) and req.truncate_prompt_tokens is None:
            return text
        return self.generator.tokenizer.decode(prompt, skip_special_tokens=False)

    async def completion_prompt(self, req: wire.CompletionRequest) -> list[int]:
        prompt: Any = req.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise ApiError(400, "only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return await self.generator.encode(prompt, add_special_tokens=req.add_special_tokens)
        return list(prompt)

    def tool_plan(self, req: wire.ChatCompletionRequest) -> ToolPlan:
        """What the request asks of tools (`openai_tools`); a 400 for what cannot be done."""
        if not req.tools and req.tool_choice in (None, "none"):
            return NO_TOOLS  # `tool_plan`'s first answer, without reading the chat template
        return tool_plan(
            req,
            parser_name=self.generator.edge.tool_call_parser,
            template_reads_tools=self.generator.tokenizer.template_reads_tools,
        )

    async def chat_prompt(self, req: wire.ChatCompletionRequest, tools: ToolPlan) -> list[int]:
        gen = self.generator
        options = chat_template_options(
            gen.tokenizer, req, allow_unknown=gen.edge.allow_unknown_fields
        )
        return await self.generator.encode_chat(
            template_messages(req.messages), tools.tools, **options
        )

    # -- serving ---------------------------------------------------------------------------

    async def serve(
        self,
        http: HttpRequest,
        request: Request,
        req: wire.SamplingFields,
        fmt: wire.Formatter,
        client_id: str | None,
        tools: ToolPlan = NO_TOOLS,
        *,
        echo: str = "",
    ) -> Response | SseResponse | EdgeSseResponse:
        """Answer `request`; `echo`: text put before the answer's (completions' `echo`)."""
        headers = {_ID_HEADER: client_id} if client_id is not None else None
        lane = self.generator.lane() if req.stream else None  # `fast_lane`
        chunks = self.generator.stream(
            request,
            req.stop_strings(),
            lane,
            include_stop=req.include_stop_str_in_output,
            skip_special=req.skip_special_tokens,
        )
        if req.return_token_ids:
            fmt.with_token_ids(request.prompt_token_ids)
        if not req.stream:
            try:
                text, last = await unless_disconnected(http, collect(chunks, all_ids=fmt.token_ids))
            except ClientGone:
                log.info("client left before %s finished", request.id)
                return Response(status_code=499)
            except SplitserveError as err:
                return _with_headers(api_error_from(err).response(), headers)
            assert last.usage is not None
            if fmt.prompt is not None and len(last.prompt_logprobs) != len(fmt.prompt):
                return _with_headers(
                    ApiError(
                        502,
                        "the worker returned no log probabilities for the prompt "
                        f"({len(last.prompt_logprobs)} for {len(fmt.prompt)} tokens)",
                        "bad_gateway",
                    ).response(),
                    headers,
                )
            text = echo + text
            lp = fmt.logprobs_of(last, stream=False)
            message, finish = tools.answer(text, wire.finish_name(last.finish_reason))
            whole = orjson.dumps(
                fmt.response(
                    text,
                    last.finish_reason,
                    last.usage,
                    lp,
                    message=message,
                    finish=finish,
                    stop_reason=last.stop_reason,
                    token_ids=last.token_ids,
                    prompt_logprobs=last.prompt_logprobs,
                )
            )
            return Response(whole, media_type="application/json", headers=headers)
        # Wait for the first tokens before answering, so placement and rejection errors still
        # get a proper status code instead of an error event inside a 200 stream.
        try:
            first = await unless_disconnected(http, anext(chunks))
        except ClientGone:
            await chunks.aclose()
            return Response(status_code=499)
        except SplitserveError as err:
            await chunks.aclose()
            return _with_headers(api_error_from(err).response(), headers)
        if echo:
            first = dataclasses.replace(first, text=echo + first.text)
        continuous = request.num_prompt_tokens if req.continuous_usage else None
        body = stream_body(
            fmt,
            first,
            chunks,
            include_usage=req.include_usage,
            continuous_usage=continuous,
            tools=tools.stream(),
            lane=lane,
        )
        link = link_of(http.scope)
        if link is not None:  # served by the router's own HTTP protocol: the lean response
            stream = stream_of(http.scope)
            if stream is not None:  # written on the transport directly (`http_sse`)
                return EdgeSseResponse(body, link, stream, headers, hold_first=fmt.chat, lane=lane)
            return SseResponse(body, link, headers)
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)


_UUID4_CLEAR: Final = ~((0xC000 << 48) | (0xF000 << 64))
_UUID4_SET: Final = (0x8000 << 48) | (4 << 76)


def random_hex_id() -> str:
    """`uuid.uuid4().hex` (the same function of the same 16 random bytes: the RFC 4122 variant
    and version 4 bits set) without building a `UUID` (~5 µs less per response id)."""
    n = int.from_bytes(os.urandom(16), "big")
    return f"{n & _UUID4_CLEAR | _UUID4_SET:032x}"


def _is_json(content_type: str) -> bool:
    """`application/json` or `application/<anything>+json`, with or without parameters."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than {limit} bytes (edge.max_body_bytes)",
        param=None,
        code="request_too_large",
    )


def _with_headers(response: Response, headers: dict[str, str] | None) -> Response:
    if headers:
        response.headers.update(headers)
    return response


def _one_header(http: HttpRequest, name: str) -> str | None:
    """The header's value (None when absent); sent more than once, a 400 naming it (the first
    value was taken and the others dropped without a word)."""
    values = header_values(http, name.encode("latin-1"))
    if len(values) > 1:
        raise ApiError(400, f"{name}: sent {len(values)} times; send it once", param=name)
    return values[0] if values else None


def _slo_overrides(http: HttpRequest) -> tuple[tuple[str, str], ...]:
    out = []
    for header in _SLO_OVERRIDE_HEADERS:
        value = _one_header(http, header)
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
    model_root: str | None = None,
) -> EdgeApp:
    """The router's ASGI app. `unix_time` stamps `created` fields (the only wall-clock use).
    `model_root`: the model path or hub id the workers load (`/v1/models`' `root`, which
    harnesses load the tokenizer from); None: the served name."""
    api = OpenAiApi(generator, pool, model_name=model_name, registry=registry, unix_time=unix_time)
    app = FastAPI(title="splitserve router", docs_url=None, redoc_url=None, openapi_url=None)
    # `/v1/chat/completions/` is an unknown route (404), not a 307 to an `http://` URL built
    # from the client's Host header (wrong behind TLS or an ingress)
    app.router.redirect_slashes = False
    _add_error_handlers(app)
    add_vllm_routes(app, api, root=model_root or model_name)

    def formatter(chat: bool) -> wire.Formatter:
        prefix = "chatcmpl" if chat else "cmpl"
        return wire.Formatter(
            chat=chat,
            response_id=f"{prefix}-{random_hex_id()}",
            created=int(api.unix_time()),
            model=model_name,
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(http: HttpRequest) -> Response | SseResponse | EdgeSseResponse:
        client_id = client_request_id(http)
        try:
            req = await api.read_body(http, wire.CompletionRequest)
            api.check_common(req)
            params = api.params(req, req.max_tokens, http)
            prompt = await api.completion_prompt(req)
            prompt = api.truncated(req, prompt)
            fmt = formatter(chat=False)
            api.logprobs_format(fmt, req, params, prompt)
            request = generator.build_request(fmt.response_id, prompt, params)
            echo = api.echo_text(req, prompt) if req.echo else ""
        except ApiError as err:
            return api.reject(err, client_id, http.headers.get(_SLO_HEADER))
        except InvalidRequest as err:
            return api.reject(api_error_from(err), client_id, http.headers.get(_SLO_HEADER))
        return await api.serve(http, request, req, fmt, client_id, echo=echo)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(http: HttpRequest) -> Response | SseResponse | EdgeSseResponse:
        client_id = client_request_id(http)
        try:
            body = await api.read_json_object(http)
            generator.check_message_count(body)
            req = parse_body(
                wire.ChatCompletionRequest, body, allow_unknown=generator.edge.allow_unknown_fields
            )
            api.check_common(req)
            max_tokens = req.max_completion_tokens or req.max_tokens
            params = api.params(req, max_tokens, http)
            tools = api.tool_plan(req)
            if tools.guide:  # a forced tool choice: guided by the tools' schema
                params = dataclasses.replace(params, structured_outputs=tools.guide)
            prompt = await api.chat_prompt(req, tools)
            prompt = api.truncated(req, prompt)
            fmt = formatter(chat=True)
            api.logprobs_format(fmt, req, params, prompt)
            try:
                request = generator.build_request(fmt.response_id, prompt, params)
            except InvalidRequest as err:  # name the field the client sent
                if err.param == "max_tokens" and req.max_completion_tokens is not None:
                    err.param = "max_completion_tokens"
                elif err.param == "prompt":  # the prompt a chat's messages rendered to
                    err.param = "messages"
                raise
        except ApiError as err:
            return api.reject(err, client_id, http.headers.get(_SLO_HEADER))
        except InvalidRequest as err:
            return api.reject(api_error_from(err), client_id, http.headers.get(_SLO_HEADER))
        return await api.serve(http, request, req, fmt, client_id, tools)

    schema = openapi_document(model_name)

    @app.get("/openapi.json")
    async def openapi() -> dict[str, Any]:
        return schema

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        views = pool.views()
        num_ready = sum(1 for v in views if v.accepts_work and v.role.can_decode)
        if num_ready:
            return JSONResponse({"status": "ready", "decode_endpoints": num_ready})
        down = pool.unreachable_summary()
        why = f"no decode-capable worker is ready{'; ' + down if down else ''}"
        return ApiError(503, why, "service_unavailable").response()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    hot: dict[str, Handler] = {
        "/v1/completions": completions,
        "/v1/chat/completions": chat_completions,
    }
    return EdgeApp(app, hot)


Handler = Callable[[HttpRequest], Awaitable[Response | SseResponse | EdgeSseResponse]]


def _prompt_logprobs(req: wire.SamplingFields, logprobs: int | None) -> int | None:
    """How many most likely tokens per prompt position the engine is asked for (None: no
    prompt log probabilities): `prompt_logprobs`, or completions' `echo` with `logprobs` (as
    vLLM)."""
    if req.prompt_logprobs is not None:
        return req.prompt_logprobs
    if isinstance(req, wire.CompletionRequest) and req.echo and logprobs is not None:
        return logprobs
    return None


class EdgeApp:
    """The FastAPI app with its two completion routes called directly.

    FastAPI's middleware stack, routing and exception wrappers cost ~0.5 ms per request on the
    development machine (measured in-process: 715 µs through FastAPI against 204 µs direct, for
    a request answered 404), more than the rest of a small request. The completion handlers
    catch their own errors and build their own responses, so `POST` to either path goes straight
    to its handler; everything else (and any other method on those paths) goes through FastAPI.
    """

    def __init__(self, app: FastAPI, hot: dict[str, Handler]) -> None:
        self.fastapi = app
        self._hot = hot

    @property
    def hot_routes(self) -> dict[str, Handler]:
        """The paths whose `POST` goes straight to its handler (`serve_hot`)."""
        return dict(self._hot)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._hot.get(scope["path"])
            if handler is not None:
                await serve_hot(handler, scope, receive, send)
                return
        if scope["type"] == "http" and scope["method"] == "HEAD":
            # RFC 9110 9.3.2: HEAD is GET without the body (same status and headers, with GET's
            # Content-Length); FastAPI's GET routes do not answer it.
            scope = {**scope, "method": "GET", _ASKED_METHOD: "HEAD"}
            await self.fastapi(scope, receive, _without_body(send))
            return
        await self.fastapi(scope, receive, send)


async def serve_hot(handler: Handler, scope: Any, receive: Any, send: Any) -> None:
    """One request of a hot route: its handler's answer (a bug's answered as FastAPI would, in
    our format). Also called by the router's HTTP front (`http_front`) without the ASGI entry."""
    try:
        response = await handler(HttpRequest(scope, receive, send))
    except Exception as err:
        response = api_error_from(err).response()
    await response(scope, receive, send)


_ASKED_METHOD = "splitserve.asked_method"
"""The scope key holding the method the client sent when HEAD is served as GET."""


def _without_body(send: Any) -> Any:
    async def send_head(message: Any) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            message = {**message, "body": b""}
        await send(message)

    return send_head


def openapi_document(model_name: str) -> dict[str, Any]:
    """The router's OpenAPI 3.1 description: the request bodies as the wire models validate them
    (unknown fields are refused unless `edge.allow_unknown_fields`), and the error body every
    4xx / 5xx carries."""
    ref = "#/components/schemas/{model}"
    schemas: dict[str, Any] = {}

    def body(model: type[pydantic.BaseModel]) -> dict[str, Any]:
        js = model.model_json_schema(ref_template=ref)
        schemas.update(js.pop("$defs", {}))
        schemas[model.__name__] = js
        return {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": ref.format(model=model.__name__)}}},
        }

    error = {
        "description": "an OpenAI-style error",
        "content": {"application/json": {"schema": {"$ref": ref.format(model="Error")}}},
    }
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "integer", "null"]},
                },
            }
        },
    }
    answers = {
        "200": {"description": "the completion (JSON, or server-sent events when streamed)"},
        **dict.fromkeys(("400", "404", "408", "413", "415", "429", "503", "504"), error),
    }

    def post(model: type[pydantic.BaseModel], summary: str) -> dict[str, Any]:
        return {"post": {"summary": summary, "requestBody": body(model), "responses": answers}}

    def get(summary: str) -> dict[str, Any]:
        return {"get": {"summary": summary, "responses": {"200": {"description": summary}}}}

    return {
        "openapi": "3.1.0",
        "info": {"title": f"splitserve router ({model_name})", "version": "v1"},
        "paths": {
            "/v1/completions": post(wire.CompletionRequest, "a text completion"),
            "/v1/chat/completions": post(wire.ChatCompletionRequest, "a chat completion"),
            "/v1/models": get("the served model"),
            "/v1/models/{model}": get("the served model, by name"),
            "/tokenize": post(wire.TokenizeCompletionRequest, "tokenize a prompt (or messages)"),
            "/detokenize": post(wire.DetokenizeRequest, "token ids to text"),
            "/version": get("the router's version"),
            "/ping": get("the process is up (vLLM's / SageMaker's health check)"),
            "/health": get("the process is up"),
            "/ready": get("a decode-capable worker accepts work"),
            "/metrics": get("Prometheus metrics"),
        },
        "components": {"schemas": schemas},
    }


def _add_error_handlers(app: FastAPI) -> None:
    async def http_error(http: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        headers = dict(exc.headers) if exc.headers else None  # a 405's `Allow` (RFC 9110)
        allow = (headers or {}).get("Allow")
        if allow is not None and "GET" in allow.split(", ") and "HEAD" not in allow:
            headers = {**(headers or {}), "Allow": f"{allow}, HEAD"}  # (served as GET)
        if exc.status_code in (404, 405):  # OpenAI's wording for a route it does not serve
            method = http.scope.get(_ASKED_METHOD, http.method)
            message = f"Invalid URL ({method} {http.url.path})"
            return ApiError(exc.status_code, message, type_, headers=headers).response()
        return ApiError(exc.status_code, str(exc.detail), type_, headers=headers).response()

    async def validation_error(_: HttpRequest, exc: Exception) -> Response:
        return ApiError(400, str(exc)).response()

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)

"""The routes a `vllm serve` user's tools call besides the completions: vLLM's shapes.

`GET /v1/models` and `GET /v1/models/{id}` carry vLLM's model card (`root`: the model path or hub
id the workers load, which `vllm bench serve` and other harnesses load the tokenizer from when
they are given no `--model`; `max_model_len`; `parent`; `permission`). `POST /tokenize` takes a
prompt or chat messages and `POST /detokenize` token ids, as vLLM's do; `GET /version` and
`GET|POST /ping` answer like vLLM's.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request as HttpRequest

import splitserve
from splitserve.router import openai_models as wire
from splitserve.router.auth import ALLOWED_MODELS_SCOPE
from splitserve.router.errors import InvalidRequest
from splitserve.router.openai_errors import ApiError
from splitserve.router.openai_parse import chat_template_options, parse_body, template_messages
from splitserve.router.tokenizer import chat_chars

if TYPE_CHECKING:
    from splitserve.router.openai_api import OpenAiApi


def model_card(api: OpenAiApi, root: str) -> dict[str, Any]:
    """The served model as vLLM's `/v1/models` describes one."""
    created = int(api.unix_time())
    engines = api.pool.engines()
    return {
        "id": api.model_name,
        "object": "model",
        "created": created,
        "owned_by": "splitserve",
        "root": root,
        "parent": None,
        "max_model_len": api.generator.max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                # Only vLLM workers return log probabilities (docs/openai-api.md).
                "allow_logprobs": engines == ["vllm"],
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


def add_vllm_routes(app: FastAPI, api: OpenAiApi, *, root: str) -> None:
    generator = api.generator
    tokenizer = generator.tokenizer

    def visible(http: HttpRequest) -> bool:
        """Whether the caller may see the served model (a tenant's `models`, router.auth)."""
        allowed = http.scope.get(ALLOWED_MODELS_SCOPE)
        return allowed is None or api.model_name in allowed

    def no_such_model(name: str) -> ApiError:
        return ApiError(
            404, f"The model `{name}` does not exist.", param="model", code="model_not_found"
        )

    def check_model(name: str | None) -> None:
        if name is not None and name != api.model_name:
            raise no_such_model(name)

    def check_chars(num_chars: int, param: str) -> None:
        if num_chars > generator.max_prompt_chars:
            raise ApiError(
                400,
                f"{param}: {num_chars} characters, more than the {generator.max_prompt_chars} "
                "this router tokenizes (edge.max_prompt_chars)",
                param=param,
            )

    @app.get("/v1/models")
    async def models(http: HttpRequest) -> dict[str, Any]:
        return {"object": "list", "data": [model_card(api, root)] if visible(http) else []}

    @app.get("/v1/models/{model:path}")
    async def one_model(model: str, http: HttpRequest) -> Response:
        # a model hidden from this tenant answers as one that does not exist
        if model != api.model_name or not visible(http):
            return no_such_model(model).response()
        return JSONResponse(model_card(api, root))

    @app.post("/tokenize")
    async def tokenize(http: HttpRequest) -> Response:
        allow = generator.edge.allow_unknown_fields
        try:
            body = await api.read_json_object(http)
            if "messages" in body:
                try:
                    generator.check_message_count(body)
                except InvalidRequest as err:
                    raise ApiError(400, str(err), param="messages") from err
                chat: wire.TokenizeChatRequest = parse_body(
                    wire.TokenizeChatRequest, body, allow_unknown=allow
                )
                check_model(chat.model)
                messages = template_messages(chat.messages)
                tools = [t.model_dump(exclude_none=True) for t in chat.tools or ()] or None
                check_chars(chat_chars(messages, tools), "messages")
                if tools and not tokenizer.template_reads_tools:
                    raise ApiError(
                        400,
                        "tools: the served model's chat template does not read `tools`",
                        param="tools",
                    )
                options = chat_template_options(tokenizer, chat, allow_unknown=allow)
                want_strs = chat.return_token_strs
                try:
                    ids = await asyncio.to_thread(
                        tokenizer.apply_chat_template, messages, tools=tools, **options
                    )
                except ValueError as err:
                    raise ApiError(400, str(err), param="messages") from err
            else:
                req: wire.TokenizeCompletionRequest = parse_body(
                    wire.TokenizeCompletionRequest, body, allow_unknown=allow
                )
                check_model(req.model)
                check_chars(len(req.prompt), "prompt")
                special = req.add_special_tokens
                want_strs = req.return_token_strs
                ids = await asyncio.to_thread(
                    tokenizer.encode, req.prompt, add_special_tokens=special
                )
        except ApiError as err:
            return err.response()
        strs = tokenizer.token_strings(ids) if want_strs else None
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": generator.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    @app.post("/detokenize")
    async def detokenize(http: HttpRequest) -> Response:
        try:
            body = await api.read_json_object(http)
            req = parse_body(
                wire.DetokenizeRequest, body, allow_unknown=generator.edge.allow_unknown_fields
            )
            check_model(req.model)
            vocab = tokenizer.vocab_size
            if any(not 0 <= t < vocab for t in req.tokens):
                raise ApiError(400, f"tokens: token ids must be in [0, {vocab})", param="tokens")
        except ApiError as err:
            return err.response()
        text = await asyncio.to_thread(tokenizer.decode, req.tokens)
        return JSONResponse({"prompt": text})

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": splitserve.__version__}

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return Response(status_code=200)

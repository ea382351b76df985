"""The router's gRPC face: `splitserve.v1.Router/Generate`, the same path as the HTTP API.

Errors map as on HTTP: invalid input -> INVALID_ARGUMENT, no worker -> UNAVAILABLE, timeout ->
DEADLINE_EXCEEDED. A caller that cancels the call cancels the request on every worker.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Any, Final

import grpc

from splitserve._gen.v1 import common_pb2, router_pb2, router_pb2_grpc
from splitserve.core.errors import NoEligibleEndpoint, SplitserveError
from splitserve.core.request import FinishReason, Request, seed_of_bits
from splitserve.router.errors import InvalidRequest, Overloaded, RequestTimeout
from splitserve.router.generation import GenerationParams, Generator

log = logging.getLogger(__name__)

_FINISH: Final = {
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


def status_for(err: SplitserveError) -> grpc.StatusCode:
    if isinstance(err, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(err, RequestTimeout):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(err, NoEligibleEndpoint):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(err, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.UNAVAILABLE


GRPC_SAMPLING_FIELDS: Final = frozenset(
    {"max_tokens", "temperature", "top_p", "seed", "seeded", "ignore_eos"}
)
"""The `SamplingParams` fields the router's gRPC face honours; any other set field is refused
(INVALID_ARGUMENT naming it), never dropped."""


_GRPC_NAMES: Final = {"x-slo-class": "slo_class"}
"""HTTP names in the shared request path's errors, as the gRPC request spells the field."""


def _named_for_grpc(err: SplitserveError, request: router_pb2.RouterGenerateRequest) -> str:
    """`err`'s message with the field it names as this request spells it (`slo_class`, not the
    HTTP header; `prompt_token_ids` when the caller sent ids, not `prompt`)."""
    message = str(err)
    param = getattr(err, "param", None)
    if not isinstance(err, InvalidRequest) or not param:
        return message
    name = _GRPC_NAMES.get(param)
    if param == "prompt" and request.WhichOneof("input") == "prompt_token_ids":
        name = "prompt_token_ids"
    if name is None:
        return message
    if message.startswith(f"{param}:"):
        return name + message[len(param) :]
    return f"{name}: {message}"


class RouterService(router_pb2_grpc.RouterServicer):
    def __init__(self, generator: Generator) -> None:
        self.generator = generator

    async def _request(self, msg: router_pb2.RouterGenerateRequest) -> Request:
        which = msg.WhichOneof("input")
        if which == "prompt":
            prompt_ids = await self.generator.encode(msg.prompt)
        elif which == "prompt_token_ids":
            prompt_ids = list(msg.prompt_token_ids.ids)
        else:
            raise InvalidRequest("set prompt or prompt_token_ids", "input")
        params = GenerationParams(slo_class=msg.slo_class)
        if msg.HasField("sampling"):
            s = msg.sampling
            for field, _ in s.ListFields():
                if field.name not in GRPC_SAMPLING_FIELDS:
                    raise InvalidRequest(
                        f"the router's gRPC Generate does not take sampling.{field.name} "
                        f"(it takes {', '.join(sorted(GRPC_SAMPLING_FIELDS))}; the OpenAI "
                        "API takes the rest)",
                        f"sampling.{field.name}",
                    )
            params = GenerationParams(
                max_tokens=s.max_tokens or None,
                temperature=s.temperature,
                top_p=s.top_p or 1.0,  # 0 is out of range: read it as "unset"
                seed=seed_of_bits(s.seed) if s.seed or s.seeded else None,
                ignore_eos=s.ignore_eos,
                slo_class=params.slo_class,
            )
        # The router's own id: a caller's `request_id` is only a label echoed in the chunks, so
        # no caller can reach (cancel, collide with) another caller's request.
        return self.generator.build_request(f"grpc-{uuid.uuid4().hex}", prompt_ids, params)

    async def Generate(  # noqa: N802 - the gRPC method name
        self, request: router_pb2.RouterGenerateRequest, context: Any
    ) -> AsyncGenerator[router_pb2.RouterGenerateChunk, None]:
        try:
            try:
                stops = self.generator.check_stops(request.stop)
                req = await self._request(request)
            except SplitserveError:  # refused before dispatch: counted as on HTTP
                self.generator.count_refused(request.slo_class)
                raise
            label = request.request_id or req.id
            if request.request_id:
                log.debug("gRPC request %s is the caller's %r", req.id, request.request_id)
            stream = self.generator.stream(req, stops)
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    out = router_pb2.RouterGenerateChunk(
                        request_id=label, text=chunk.text, token_ids=chunk.token_ids
                    )
                    if chunk.finish_reason is not None:
                        out.finish_reason = _FINISH[chunk.finish_reason]
                        out.path = chunk.path
                    if chunk.usage is not None:
                        out.usage.prompt_tokens = chunk.usage.prompt_tokens
                        out.usage.completion_tokens = chunk.usage.completion_tokens
                        out.usage.total_tokens = chunk.usage.total_tokens
                    yield out
        except SplitserveError as err:
            log.info("router Generate failed: %s", err)
            await context.abort(status_for(err), _named_for_grpc(err, request))

"""Wrap a gRPC method handler so a check runs before the method (grpc.aio server side).

`grpc.aio.ServerInterceptor.intercept_service` sees only the method name and metadata; the
caller's TLS identity (`context.auth_context()`) and the request message exist only once the
method is called. So an interceptor that needs them returns a copy of the handler whose behaviour
first awaits `check(request, context)` (which aborts the call to refuse it) and then runs the
original. For client-streaming methods `request` is None.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Check = Callable[[Any, Any], Awaitable[None]]


def guarded(handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """`handler` with `check` awaited before its behaviour (any of the four call shapes)."""
    des = handler.request_deserializer
    ser = handler.response_serializer
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await check(request, context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, des, ser)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await check(request, context)
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, des, ser)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            await check(None, context)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, des, ser)
    inner_ss = handler.stream_stream
    assert inner_ss is not None

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        await check(None, context)
        async for item in inner_ss(requests, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, des, ser)


def refused(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> Any:
    """`handler` that always aborts with `code` / `message` before running."""

    async def check(_: Any, context: Any) -> None:
        await context.abort(code, message)

    return guarded(handler, check)

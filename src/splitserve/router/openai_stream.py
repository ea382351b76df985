"""Delivering a completion over HTTP: SSE framing, collecting a whole answer, client disconnects.

A streamed answer ends with `data: [DONE]`; a failure after the first chunk becomes an error
event (the status line is already sent). A whole answer is awaited against a watcher on the ASGI
`receive` channel, so a client that disconnects cancels the work instead of leaving it running.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Awaitable
from typing import Any, TypeVar

import orjson
from starlette.requests import Request as HttpRequest

from splitserve.core.errors import SplitserveError
from splitserve.core.request import TokenLogprobs
from splitserve.router import openai_models as wire
from splitserve.router.generation import TextChunk, Usage
from splitserve.router.openai_errors import api_error_from

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"


class ClientGone(Exception):  # noqa: N818 - a condition, like the core errors
    """The HTTP client disconnected before the answer was ready."""


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def _wait_disconnect(request: HttpRequest) -> None:
    # After the body is read, the server's next message is http.disconnect (or nothing).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: HttpRequest, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (then raise `ClientGone`)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientGone
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t


async def collect(chunks: AsyncGenerator[TextChunk, None]) -> tuple[str, TextChunk]:
    """The whole text and the final chunk (with usage; with log probabilities, it carries every
    token of the answer and their log probabilities)."""
    parts: list[str] = []
    ids: list[int] = []
    logprobs: list[TokenLogprobs] = []
    async with contextlib.aclosing(chunks) as stream:
        async for chunk in stream:
            parts.append(chunk.text)
            if chunk.logprobs:
                ids.extend(chunk.token_ids)
                logprobs.extend(chunk.logprobs)
            if chunk.finish_reason is not None:
                if logprobs:
                    chunk = dataclasses.replace(
                        chunk, token_ids=tuple(ids), logprobs=tuple(logprobs)
                    )
                return "".join(parts), chunk
    raise RuntimeError("the stream ended without a final chunk")


async def stream_body(
    fmt: wire.Formatter,
    first: TextChunk,
    chunks: AsyncGenerator[TextChunk, None],
    *,
    include_usage: bool,
    continuous_usage: int | None = None,
) -> AsyncGenerator[bytes, None]:
    """SSE events for a stream whose first chunk the caller already has.

    `continuous_usage`: the prompt's token count, to put the usage so far on every chunk
    (vLLM's `stream_options.continuous_usage_stats`); None: only the last chunk has usage.
    """
    usage: Usage | None = None
    num_out = 0
    try:
        if fmt.chat:
            first_usage = None if continuous_usage is None else Usage(continuous_usage, 0)
            yield sse(fmt.role_chunk(with_usage=include_usage, usage=first_usage))
        chunk: TextChunk | None = first
        with_logprobs = fmt.logprobs is not None
        while chunk is not None:
            num_out += len(chunk.token_ids)
            if continuous_usage is not None or with_logprobs:
                # Tokens whose text is held back (a possible stop string) still send their
                # log probabilities, in a chunk with empty text.
                so_far = None
                if continuous_usage is not None:
                    so_far = chunk.usage or Usage(continuous_usage, num_out)
                if chunk.text or chunk.finish_reason is not None or chunk.logprobs:
                    lp = fmt.logprobs_of(chunk, stream=True)
                    body = fmt.chunk(
                        chunk.text,
                        chunk.finish_reason,
                        with_usage=include_usage or so_far is not None,
                        usage=so_far,
                        logprobs=lp,
                    )
                    yield sse(body)
            elif chunk.finish_reason is None:
                if chunk.text:
                    yield fmt.delta_event(chunk.text, with_usage=include_usage)
            else:
                yield sse(fmt.chunk(chunk.text, chunk.finish_reason, with_usage=include_usage))
            usage = chunk.usage or usage
            chunk = None if chunk.finish_reason is not None else await anext(chunks, None)
        if include_usage and usage is not None:
            yield sse(fmt.usage_chunk(usage))
    except SplitserveError as err:
        yield sse(api_error_from(err).body())
    finally:
        await chunks.aclose()
    yield DONE

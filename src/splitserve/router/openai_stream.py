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
from typing import Any, Final, TypeVar

import orjson
from starlette.requests import Request as HttpRequest

from splitserve.core.errors import SplitserveError
from splitserve.core.request import TokenLogprobs
from splitserve.router import openai_models as wire
from splitserve.router.client_link import ClientGone, ClientLink, link_of
from splitserve.router.fast_lane import FastLane
from splitserve.router.generation import TextChunk, Usage
from splitserve.router.openai_errors import api_error_from
from splitserve.router.openai_tools import ToolStream

__all__ = ["DONE", "ClientGone", "SseResponse", "collect", "sse", "stream_body",
           "unless_disconnected"]  # fmt: skip

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def _wait_disconnect(request: HttpRequest) -> None:
    # After the body is read, the server's next message is http.disconnect (or nothing).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: HttpRequest, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (then raise `ClientGone`).

    Through the connection's `ClientLink` when the router's own HTTP protocol serves the
    request (no extra task); else with a watcher task on the ASGI `receive` channel."""
    link = link_of(request.scope)
    if link is not None:
        return await link.run(work)
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


async def collect(
    chunks: AsyncGenerator[TextChunk, None], *, all_ids: bool = False
) -> tuple[str, TextChunk]:
    """The whole text and the final chunk (with usage; with log probabilities, or `all_ids`,
    it carries every token of the answer, and their log probabilities)."""
    parts: list[str] = []
    ids: list[int] = []
    logprobs: list[TokenLogprobs] = []
    async with contextlib.aclosing(chunks) as stream:
        async for chunk in stream:
            parts.append(chunk.text)
            if chunk.logprobs or all_ids:
                ids.extend(chunk.token_ids)
                logprobs.extend(chunk.logprobs)
            if chunk.finish_reason is not None:
                if logprobs or all_ids:
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
    tools: ToolStream | None = None,
    lane: FastLane | None = None,
) -> AsyncGenerator[bytes, None]:
    """SSE events for a stream whose first chunk the caller already has.

    `continuous_usage`: the prompt's token count, to put the usage so far on every chunk
    (vLLM's `stream_options.continuous_usage_stats`); None: only the last chunk has usage.
    `tools`: reads tool calls out of the text (the deltas carry content and `tool_calls`).
    `lane`: a plain stream's mid-stream deltas may be written by the worker link's reader
    (`fast_lane`); not with continuous usage, log probabilities or tools (built here).
    """
    usage: Usage | None = None
    num_out = 0
    tail = b""
    """The last event(s) and `[DONE]`, sent as one piece."""
    try:
        if fmt.chat:
            first_usage = None if continuous_usage is None else Usage(continuous_usage, 0)
            yield sse(fmt.role_chunk(with_usage=include_usage, usage=first_usage))
        chunk: TextChunk | None = first
        with_logprobs = fmt.logprobs is not None
        with_ids = fmt.token_ids
        built = continuous_usage is not None or with_logprobs or with_ids or tools is not None
        if lane is not None and not built:
            lane.fmt, lane.with_usage = fmt, include_usage
        while chunk is not None:
            num_out += len(chunk.token_ids)
            final = chunk.finish_reason is not None
            usage = chunk.usage or usage
            if built:
                # Tokens whose text is held back (a possible stop string, or tool-call markup
                # still being read) still send their log probabilities and ids, in an empty
                # chunk.
                so_far = None
                if continuous_usage is not None:
                    so_far = chunk.usage or Usage(continuous_usage, num_out)
                delta = None if tools is None else tools.delta(chunk.text, final=final)
                text_out = chunk.text if delta is None else delta
                if text_out or final or chunk.logprobs or (with_ids and chunk.token_ids):
                    lp = fmt.logprobs_of(chunk, stream=True)
                    body = fmt.chunk(
                        chunk.text,
                        chunk.finish_reason,
                        with_usage=include_usage or so_far is not None,
                        usage=so_far,
                        logprobs=lp,
                        delta=delta,
                        finish=None
                        if tools is None or not final
                        else tools.finish(wire.finish_name(chunk.finish_reason)),
                        stop_reason=chunk.stop_reason,
                        token_ids=chunk.token_ids,
                    )
                    if final:
                        tail = sse(body)
                    else:
                        yield sse(body)
            elif not final:
                if chunk.text:
                    yield fmt.delta_event(chunk.text, with_usage=include_usage)
            else:
                tail = sse(
                    fmt.chunk(
                        chunk.text,
                        chunk.finish_reason,
                        with_usage=include_usage,
                        stop_reason=chunk.stop_reason,
                    )
                )
            chunk = None if final else await anext(chunks, None)
        if include_usage and usage is not None:
            tail += sse(fmt.usage_chunk(usage))
    except SplitserveError as err:
        tail = sse(api_error_from(err).body())
    finally:
        if lane is not None:
            lane.fmt = None
        await chunks.aclose()
    yield tail + DONE


_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream; charset=utf-8")]
"""What Starlette's `StreamingResponse(media_type="text/event-stream")` sends."""


class SseResponse:
    """A streamed answer sent straight to the ASGI `send`, one body message per event.

    What Starlette's `StreamingResponse` does without its anyio task group and disconnect
    listener task: a lost connection cancels this task through the request's `ClientLink`, and
    the body is closed (which cancels the request on its workers). The event that ends with
    `data: [DONE]` is sent as the last body message, so the end of the chunked body leaves in
    the same write. Only for requests whose scope has a link (`link_of`); others get Starlette's
    response.
    """

    __slots__ = ("_body", "_headers", "_link")

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        link: ClientLink,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._body = body
        self._link = link
        self._headers = _SSE_HEADERS + [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        link, body = self._link, self._body
        try:
            task = link.watch()
        except ClientGone:
            await body.aclose()
            return
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._headers})
            async for part in body:
                last = part.endswith(DONE)
                await send({"type": "http.response.body", "body": part, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not link.took(task):
                raise
            # The client went away: closing the body (below) cancels the request.
        finally:
            link.unwatch()
            await body.aclose()

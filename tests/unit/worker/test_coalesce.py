"""Token coalescing on the worker's stream: never a delay, the same tokens, fewer messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.request import FinishReason
from splitserve.core.roles import Role
from splitserve.worker.coalesce import coalesce
from splitserve.worker.engine import TokenDelta
from tests.unit.worker.conftest import WorkerFactory


def _ids(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


async def test_a_lone_token_is_never_held_back() -> None:
    """The source sends its second token only after the consumer has the first: a coalescer
    that waited for company would deadlock here (caught by the timeout)."""
    seen_first = asyncio.Event()

    async def source() -> AsyncIterator[TokenDelta]:
        yield TokenDelta((7,))
        await seen_first.wait()
        yield TokenDelta((8,))
        await seen_first.wait()
        yield TokenDelta((9,), FinishReason.LENGTH)

    out = coalesce(source())
    first = await asyncio.wait_for(anext(out), 10)
    assert first == TokenDelta((7,))
    seen_first.set()
    rest = [d async for d in out]
    assert _ids([first, *rest]) == [7, 8, 9]
    assert rest[-1].finish_reason is FinishReason.LENGTH


async def test_tokens_that_piled_up_go_out_together_and_unchanged() -> None:
    tokens = list(range(100, 140))

    async def source() -> AsyncIterator[TokenDelta]:
        for i, t in enumerate(tokens):
            last = i == len(tokens) - 1
            yield TokenDelta((t,), FinishReason.LENGTH if last else None)
            if i == 0:
                await asyncio.sleep(0)  # the first goes out before the rest exist

    got: list[TokenDelta] = []
    async for delta in coalesce(source()):
        got.append(delta)
        await asyncio.sleep(0.01)  # a slow writer: the rest of the stream piles up meanwhile
    assert got[0] == TokenDelta((100,))
    assert _ids(got) == tokens
    assert len(got) < len(tokens) // 4
    assert got[-1].finish_reason is FinishReason.LENGTH
    assert all(d.finish_reason is None for d in got[:-1])


async def test_an_error_comes_after_the_tokens_before_it() -> None:
    async def source() -> AsyncIterator[TokenDelta]:
        yield TokenDelta((1,))
        yield TokenDelta((2,))
        raise ValueError("bad kv handle")

    got: list[TokenDelta] = []

    async def read() -> None:
        async for delta in coalesce(source()):
            got.append(delta)

    with pytest.raises(ValueError, match="bad kv handle"):
        await read()
    assert _ids(got) == [1, 2]


async def test_an_error_delta_ends_the_stream_with_its_tokens() -> None:
    async def source() -> AsyncIterator[TokenDelta]:
        yield TokenDelta((1,))
        yield TokenDelta((2,), FinishReason.ERROR, "engine died")
        yield TokenDelta((3,))  # never read

    got = [d async for d in coalesce(source())]
    assert _ids(got) == [1, 2]
    assert got[-1].finish_reason is FinishReason.ERROR
    assert got[-1].error == "engine died"


async def test_closing_early_closes_the_source() -> None:
    closed = asyncio.Event()

    async def source() -> AsyncIterator[TokenDelta]:
        try:
            yield TokenDelta((1,))
            await asyncio.Event().wait()  # an engine with nothing more yet
        finally:
            closed.set()

    out = coalesce(source())
    assert await anext(out) == TokenDelta((1,))
    await out.aclose()
    assert closed.is_set()


async def test_a_cancelled_reader_closes_the_source_and_stays_cancelled() -> None:
    """The task reading the stream is cancelled (its client went away) while it waits for the
    next token: the source is still closed (an engine request is not left running), and the
    reader ends cancelled."""
    closed = asyncio.Event()
    first = asyncio.Event()

    async def source() -> AsyncIterator[TokenDelta]:
        try:
            yield TokenDelta((1,))
            await asyncio.Event().wait()
        finally:
            closed.set()

    async def read() -> None:
        async for _ in coalesce(source()):
            first.set()

    reader = asyncio.create_task(read())
    await first.wait()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert closed.is_set()


async def test_a_slow_grpc_reader_gets_fewer_messages_and_the_same_tokens(
    make_worker: WorkerFactory,
) -> None:
    """Over the real Worker service and SimEngine: read at once, then read slowly."""
    w = await make_worker(Role.MIXED, sim_time_scale=0)
    prompt = list(range(20, 84))

    async def run(request_id: str, delay_s: float) -> list[list[int]]:
        call = w.stub.Generate(
            worker_pb2.GenerateRequest(
                request_id=request_id,
                prompt_token_ids=prompt,
                sampling=common_pb2.SamplingParams(max_tokens=48, ignore_eos=True),
            )
        )
        messages: list[list[int]] = []
        async for chunk in call:
            messages.append(list(chunk.token_ids))
            await asyncio.sleep(delay_s)
        return messages

    slow = await run("slow", 0.05)
    fast = await run("fast", 0)
    assert [t for m in slow for t in m] == [t for m in fast for t in m]
    assert len([t for m in slow for t in m]) == 48
    assert len(slow) < 48

"""A finished request is freed by reference counting, not left to the garbage collector
(issue 17, tenth pass: the cycles that carried every request's objects to the collector)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import types
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.router.dispatch import Chunk
from splitserve.router.mux import MuxStream, _Unsupported
from tests.unit.router.conftest import StackFactory, WorkerFactory


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cyclic collector off: what is freed here is freed by reference counting."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _link() -> Any:
    return types.SimpleNamespace(loop=asyncio.get_running_loop())


def _stream_closed_over(link: Any) -> tuple[MuxStream, weakref.ref[Any]]:
    """A stream whose fallback closes over it, as `MuxLink.prefill`'s and `stream`'s do."""
    sub: MuxStream

    def fallback() -> Any:
        return sub

    sub = MuxStream(link, 1, None, fallback)
    return sub, weakref.ref(fallback)


@pytest.mark.usefixtures("no_gc")
async def test_an_ended_sub_request_drops_its_fallback() -> None:
    for error in (None, RuntimeError("worker failed")):
        sub, ref = _stream_closed_over(_link())
        sub._end(error)
        del sub
        assert ref() is None, f"the fallback outlived its stream (ended with {error!r})"


async def test_an_unsupported_link_still_reads_the_fallback() -> None:
    class Call:
        async def read(self) -> str:
            return "from the fallback"

    sub = MuxStream(_link(), 1, None, Call)
    sub._end(_Unsupported())
    assert await sub.read() == "from the fallback"


@pytest.mark.usefixtures("no_gc")
async def test_a_finished_pd_request_is_freed_without_the_collector(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    request = Request(RequestId("r1"), (1, 2, 3, 4), SamplingSpec(max_tokens=5), arrival_s=0.0)
    dispatch = stack.dispatcher.open(request)
    ref = weakref.ref(dispatch)
    out: list[Chunk] = []
    async with contextlib.aclosing(dispatch.chunks()) as chunks:
        async for chunk in chunks:
            out.append(chunk)
            if chunk.finish_reason is not None:
                break  # closed at its last chunk, as `Generator.stream` does (GeneratorExit)
    assert sum(len(c.token_ids) for c in out) == 5
    await stack.dispatcher.drain_background()
    del dispatch, chunks
    for _ in range(3):
        await asyncio.sleep(0)  # callbacks that still hold it run
    assert ref() is None, gc.get_referrers(ref()) if ref() is not None else None

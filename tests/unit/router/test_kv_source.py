"""The router hands a decode worker only KV handles of the worker that prefilled, while it is a
member of the pool (`router.kv_source`): a handle naming a foreign address never reaches a
decode worker, and a source that left the pool is not pulled from."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.router.dispatch import Chunk, Dispatch
from splitserve.router.kv_source import is_member, kv_source_problem
from tests.fakes.fake_worker import FakeWorker, Script
from tests.unit.router.conftest import StackFactory

COMPLETION = (10, 11, 12, 13, 14, 15, 16, 17)
PROMPT = (1, 2, 3, 4)


@dataclass
class ForgingWorker(FakeWorker):
    """A prefill worker whose KV handle names `forged_source`."""

    forged_source: str = ""

    async def Prefill(  # noqa: N802
        self, request: worker_pb2.PrefillRequest, context: Any
    ) -> worker_pb2.PrefillResponse:
        resp = await super().Prefill(request, context)
        if self.forged_source:
            resp.kv.source_address = self.forged_source
        return resp


@dataclass
class LeavingDecode(FakeWorker):
    """A decode worker that runs `before_failing`, then fails its Decode as unreachable."""

    before_failing: Callable[[], Awaitable[None]] | None = None

    async def Decode(  # noqa: N802
        self, request: worker_pb2.DecodeRequest, context: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        self._record("Decode", request)
        if self.before_failing is not None:
            await self.before_failing()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "gone")
        yield common_pb2.TokenChunk()  # pragma: no cover - abort raises


@contextlib.asynccontextmanager
async def _started(*workers: FakeWorker) -> AsyncIterator[None]:
    for w in workers:
        await w.start()
    try:
        yield
    finally:
        for w in workers:
            await w.stop()


def _request(max_tokens: int = 5) -> Request:
    return Request(RequestId("r1"), PROMPT, SamplingSpec(max_tokens=max_tokens), arrival_s=0.0)


async def _run(dispatch: Dispatch) -> list[Chunk]:
    async with contextlib.aclosing(dispatch.chunks()) as chunks:
        return [c async for c in chunks]


def _tokens(chunks: list[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


async def test_a_handle_naming_a_foreign_address_never_reaches_a_decode_worker(
    make_stack: StackFactory,
) -> None:
    connected = asyncio.Event()

    async def on_connect(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        connected.set()
        w.close()

    foreign = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    foreign_address = f"127.0.0.1:{foreign.sockets[0].getsockname()[1]}"
    p = ForgingWorker(Script(role=Role.PREFILL), forged_source=foreign_address)
    d = FakeWorker(Script(role=Role.DECODE))
    try:
        async with _started(p, d):
            stack = await make_stack(p, d)
            chunks = await _run(stack.dispatcher.open(_request(max_tokens=5)))
            assert _tokens(chunks) == list(COMPLETION[:5])  # served, generated on d
            await stack.dispatcher.drain_background()
            assert d.names() == ["Generate"]  # no Decode: the handle was not passed on
            assert p.names() == ["Prefill", "Cancel"]  # told to drop what it holds
            reason = "kv_source_refused"
            assert stack.sample("splitserve_router_fallbacks_total", reason=reason) == 1
            assert not connected.is_set()
    finally:
        foreign.close()
        await foreign.wait_closed()


async def test_kv_source_problem_names_the_source_and_the_pool(
    make_stack: StackFactory,
) -> None:
    p = FakeWorker(Script(role=Role.PREFILL))
    d = FakeWorker(Script(role=Role.DECODE))
    async with _started(p, d):
        stack = await make_stack(p, d)
        kv = common_pb2.KvHandle(transport="sim", source_address=p.address)
        assert kv_source_problem(kv, p.address, stack.pool) is None
        assert "not the worker that prefilled it" in (
            kv_source_problem(kv, d.address, stack.pool) or ""
        )
        await stack.pool.remove(p.address)  # discovery: the pod is gone
        assert not is_member(stack.pool, p.address)
        assert "no longer a member of the pool" in (
            kv_source_problem(kv, p.address, stack.pool) or ""
        )


async def test_a_retried_decode_does_not_pull_from_a_source_that_left(
    make_stack: StackFactory,
) -> None:
    p = FakeWorker(Script(role=Role.PREFILL))
    d1 = LeavingDecode(Script(role=Role.DECODE))
    d2 = FakeWorker(Script(role=Role.DECODE, num_running=3))
    async with _started(p, d1, d2):
        stack = await make_stack(p, d1, d2)

        async def source_leaves() -> None:
            await stack.pool.remove(p.address)

        d1.before_failing = source_leaves
        chunks = await _run(stack.dispatcher.open(_request(max_tokens=6)))
        assert _tokens(chunks) == list(COMPLETION[:6])
        assert d1.names()[0] == "Decode"
        assert d2.names() == ["Generate"]  # from prompt + first token, not the KV
        assert stack.sample("splitserve_router_fallbacks_total", reason="kv_source_left") == 1

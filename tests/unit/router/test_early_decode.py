"""`DispatchSettings.early_decode`: the Decode goes to the decode worker when the pair is placed,
its first token and KV handle after the prefill answers, on the same Multiplex sub-request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pydantic
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.api.router import DispatchSettings
from splitserve.core.roles import Role
from splitserve.router.mux import StreamLink
from splitserve.worker import link as worker_link
from tests.fakes.fake_worker import FakeWorker
from tests.unit.router import conftest
from tests.unit.router.conftest import ServerFactory, StackFactory, WorkerFactory
from tests.unit.router.test_mux import COMPLETION, _request, _run

EARLY = DispatchSettings(early_decode=True)


def _early(w: FakeWorker) -> list[bool]:
    return [bool(m.kv_follows) for m in w.requests("Decode")]


async def test_the_decode_is_sent_before_the_prefill_answers_with_the_same_tokens(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    held = asyncio.Event()
    p = await make_worker(Role.PREFILL, prefill_hold=held)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d, dispatch=EARLY)
    task = asyncio.create_task(_run(stack.dispatcher.open(_request("a"))))
    await d.wait_call("Decode")  # while the prefill is still held
    assert not task.done()
    assert d.requests("DecodeKv") == []
    held.set()
    assert await task == list(COMPLETION[:5])
    assert _early(d) == [True]
    (follow,) = d.requests("DecodeKv")
    assert follow.first_token_id == COMPLETION[0]
    assert follow.kv.source_address == p.address
    # Off (the default): the ordinary Decode after the prefill, the same tokens.
    plain = await make_stack(p, d)
    assert await _run(plain.dispatcher.open(_request("b"))) == list(COMPLETION[:5])
    assert _early(d) == [True, False]
    await stack.dispatcher.drain_background()
    assert d.cancelled == []


@pytest.mark.parametrize("why", ["prefill fails", "ends at token 1"])
async def test_an_early_decode_not_used_is_cancelled(
    make_worker: WorkerFactory, make_stack: StackFactory, why: str
) -> None:
    fails = why == "prefill fails"
    p = await make_worker(
        Role.PREFILL, prefill_abort=grpc.StatusCode.UNAVAILABLE if fails else None
    )
    d = await make_worker(Role.MIXED)
    stack = await make_stack(p, d, dispatch=EARLY)
    if fails:  # the request turns aggregated: Generate on the decode worker
        assert await _run(stack.dispatcher.open(_request("a"))) == list(COMPLETION[:5])
        assert "Generate" in d.names()
    else:
        assert await _run(stack.dispatcher.open(_request("a", max_tokens=1))) == [COMPLETION[0]]
    async with asyncio.timeout(10):
        await d.wait_call("EarlyDecodeCancelled")
    assert _early(d) == [True]
    assert d.requests("DecodeKv") == []


async def test_decode_worker_lost_before_the_kv_the_next_one_takes_the_handle(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    held = asyncio.Event()
    p = await make_worker(Role.PREFILL, prefill_hold=held)
    d1 = await make_worker(Role.DECODE)
    d2 = await make_worker(Role.DECODE)
    stack = await make_stack(p, d1, d2, dispatch=EARLY)
    task = asyncio.create_task(_run(stack.dispatcher.open(_request("a"))))
    got = {asyncio.ensure_future(w.wait_call("Decode")): (w, o) for w, o in ((d1, d2), (d2, d1))}
    done, pending = await asyncio.wait(got, return_when=asyncio.FIRST_COMPLETED)
    for f in pending:
        f.cancel()
    lost, other = got[done.pop()]
    await lost.stop()  # gone while the prefill runs: the early Decode's stream ends
    held.set()
    assert await task == list(COMPLETION[:5])
    assert lost.requests("DecodeKv") == []
    (taken,) = other.requests("Decode")
    assert not taken.kv_follows
    assert taken.kv.source_address == p.address  # the KV handle, not a re-run of the prompt
    assert other.names() == ["Decode"]


def test_the_setting_is_a_strict_bool() -> None:
    assert not DispatchSettings().early_decode
    with pytest.raises(pydantic.ValidationError, match="early_decode"):
        DispatchSettings(early_decode="yes")  # type: ignore[arg-type]


class _AwaitsKv:
    """What `worker.mux.serve` calls: a Decode that answers with the token its KV came with."""

    async def Decode(  # noqa: N802
        self, req: worker_pb2.DecodeRequest, ctx: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        assert req.kv_follows
        follow = await ctx.handoff
        yield common_pb2.TokenChunk(
            token_ids=[follow.first_token_id, follow.kv.num_tokens],
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
        )


async def test_the_kv_follows_on_the_stream_link_too() -> None:
    server, port = await worker_link.start(_AwaitsKv(), "127.0.0.1", 0)  # type: ignore[arg-type]
    link = StreamLink(None, f"127.0.0.1:{port - 1}", port)  # type: ignore[arg-type]
    try:
        msg = worker_pb2.DecodeRequest(request_id="s", kv_follows=True)
        sub = link.early_decode(msg, None, None)
        assert sub is not None
        assert sub.follow(
            worker_pb2.DecodeKv(first_token_id=9, kv=common_pb2.KvHandle(num_tokens=4))
        )
        chunk = await sub.read()
        assert list(chunk.token_ids) == [9, 4]
        assert await sub.read() is grpc.aio.EOF
        assert not sub.follow(worker_pb2.DecodeKv(first_token_id=1))  # it has ended
    finally:
        await link.close()
        server.close()


@pytest.mark.parametrize("link", ["grpc", "stream"])
async def test_a_worker_that_refuses_kv_follows_gets_no_more_early_decodes(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    link: str,
) -> None:
    """An older decode worker refuses `kv_follows`: before, every request sent it an early
    Decode (refused) and then an ordinary one, in silence. Now the refusal is logged once and
    counted, and the worker gets ordinary Decodes until its link reconnects."""
    monkeypatch.setattr(conftest, "FAST_POOL", conftest.FAST_POOL.model_copy(update={"link": link}))
    held = asyncio.Event()
    p = await make_worker(Role.PREFILL, prefill_hold=held)
    d = await make_worker(Role.DECODE, refuse_kv_follows=True)
    stack = await make_stack(p, d, dispatch=EARLY)
    with caplog.at_level(logging.WARNING, logger="splitserve.router.dispatch"):
        task = asyncio.create_task(_run(stack.dispatcher.open(_request("a"))))
        await d.wait_call("Decode")  # the early one, refused while the prefill is held
        held.set()
        assert await task == list(COMPLETION[:5])
        for rid in "bc":
            assert await _run(stack.dispatcher.open(_request(rid))) == list(COMPLETION[:5])
    assert _early(d) == [True, False, False, False]  # one early Decode, then ordinary ones
    refusals = [r.getMessage() for r in caplog.records if "refused an early Decode" in r.message]
    assert len(refusals) == 1
    assert d.address in refusals[0]
    assert stack.sample("splitserve_router_fallbacks_total", reason="early_decode_refused") == 1
    # The worker restarts (upgraded): its link reconnects and early Decodes are tried again.
    port = int(d.address.rsplit(":", 1)[1])
    await d.stop()
    await stack.pool.wait_for(lambda pv: not pv.view(d.address).ready, 10)
    d.script.refuse_kv_follows = False
    await d.start(port)
    await stack.wait_ready()
    held.clear()
    task = asyncio.create_task(_run(stack.dispatcher.open(_request("d"))))
    held.set()
    assert await task == list(COMPLETION[:5])
    assert _early(d)[-1] is True


async def test_the_router_says_at_start_whether_early_decode_is_on(
    make_worker: WorkerFactory, make_router: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    d = await make_worker(Role.DECODE)
    for early in (False, True):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="splitserve.router.server"):
            await make_router(d.address, dispatch=DispatchSettings(early_decode=early))
        said = [r.getMessage() for r in caplog.records if "early decode on" in r.getMessage()]
        assert len(said) == int(early)


async def test_a_refusal_when_the_kv_comes_is_retried_there_as_an_ordinary_decode(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """A worker that takes the early Decode but refuses its `decode_kv`: before, the request
    failed with the refusal (INVALID_ARGUMENT: a 400); now the same worker gets an ordinary
    Decode with the same KV, and no more early ones."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE, refuse_decode_kv=True)
    stack = await make_stack(p, d, dispatch=EARLY)
    for rid in "ab":
        assert await _run(stack.dispatcher.open(_request(rid))) == list(COMPLETION[:5])
    assert _early(d) == [True, False, False]
    assert [m.kv.source_address for m in d.requests("Decode")[1:]] == [p.address] * 2
    assert stack.sample("splitserve_router_fallbacks_total", reason="early_decode_refused") == 1

"""A Decode sent before its prefill answered (`DecodeRequest.kv_follows`), its first token and KV
handle following on the same Multiplex sub-request (`MuxOp.decode_kv`), on real sim workers."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.roles import Role
from splitserve.worker.vllm_adapter.kvbench import Client, MuxConn
from tests.unit.worker.conftest import RunningWorker, WorkerFactory
from tests.unit.worker.test_server import collect

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]


def sampling(max_tokens: int = 6) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=1, seeded=True)


def early(rid: str, kv: common_pb2.KvHandle | None = None) -> worker_pb2.DecodeRequest:
    return worker_pb2.DecodeRequest(
        request_id=rid, prompt_token_ids=PROMPT, sampling=sampling(), kv_follows=True, kv=kv
    )


async def _prefill(p: RunningWorker, rid: str) -> worker_pb2.PrefillResponse:
    resp: worker_pb2.PrefillResponse = await p.stub.Prefill(
        worker_pb2.PrefillRequest(request_id=rid, prompt_token_ids=PROMPT, sampling=sampling())
    )
    return resp


async def _pair(make_worker: WorkerFactory) -> tuple[RunningWorker, RunningWorker, MuxConn]:
    """A prefill and a decode worker, and a ready Multiplex stream to the decode worker."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    conn = MuxConn(d.stub)
    await conn.ready()
    return p, d, conn


def handoff(pre: worker_pb2.PrefillResponse) -> worker_pb2.DecodeKv:
    """What the router sends an early Decode once its prefill answered."""
    return worker_pb2.DecodeKv(first_token_id=pre.first_token_id, kv=pre.kv)


async def test_early_decode_gives_the_tokens_of_a_decode_sent_after_the_prefill(
    make_worker: WorkerFactory,
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    plain, ahead = Client(mux=True), Client(mux=True, early_decode=True)
    try:
        want = await plain.pd(p.address, d.address, "a", PROMPT, 6)
        got = await ahead.pd(p.address, d.address, "b", PROMPT, 6)
        assert got.tokens == want.tokens
        assert len(got.tokens) == 6
        assert d.sample("splitserve_worker_requests_total", kind="decode", outcome="ok") == 2
    finally:
        await plain.close()
        await ahead.close()
    # The source's KV was released by both decodes.
    async with asyncio.timeout(10):
        while p.service.engine.load().num_kv_held:  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.02)


async def test_the_early_decode_waits_for_its_kv_and_a_cancel_ends_it(
    make_worker: WorkerFactory,
) -> None:
    p, d, conn = await _pair(make_worker)
    sid, chunks = await conn.open("decode", early("w"))
    nothing = asyncio.ensure_future(anext(chunks))
    await asyncio.sleep(0.2)
    assert not nothing.done()  # no token and no status before the KV
    assert d.service.engine.in_flight == 0  # nothing on the engine yet
    await conn.send(sid, cancel=worker_pb2.MuxCancel())  # the prefill failed: the router cancels
    pre = await _prefill(p, "w")
    # A decode_kv after the cancel is ignored: the stream goes on serving.
    await conn.send(sid, decode_kv=handoff(pre))
    sid2, chunks2 = await conn.open("decode", early("w2"))
    pre2 = await _prefill(p, "w2")
    await conn.send(sid2, decode_kv=handoff(pre2))
    tokens = [t for c in [c async for c in chunks2] for t in c.token_ids]
    assert len(tokens) == 5
    assert not nothing.done()  # a cancelled sub-request gets no further event
    nothing.cancel()
    assert d.service.engine.in_flight == 0
    assert d.sample("splitserve_worker_requests_total", kind="decode", outcome="ok") == 1
    await conn.close()


async def test_kv_follows_is_refused_outside_multiplex_and_with_a_kv_handle(
    make_worker: WorkerFactory,
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(d.stub.Decode(early("c")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Multiplex" in (err.value.details() or "")
    pre = await _prefill(p, "k")
    conn = MuxConn(d.stub)
    await conn.ready()
    _, chunks = await conn.open("decode", early("k", kv=pre.kv))
    with pytest.raises(RuntimeError, match="decode_kv, not here"):
        await anext(chunks)
    sid, chunks = await conn.open("decode", early("n"))
    await conn.send(sid, decode_kv=worker_pb2.DecodeKv(first_token_id=1))  # no handle
    with pytest.raises(RuntimeError, match="needs a KV handle"):
        await anext(chunks)
    await conn.close()


async def test_a_worker_drained_while_the_early_decode_waits_is_unavailable(
    make_worker: WorkerFactory,
) -> None:
    p, d, conn = await _pair(make_worker)
    sid, chunks = await conn.open("decode", early("r"))
    pre = await _prefill(p, "r")
    await d.stub.Drain(worker_pb2.DrainRequest())
    await conn.send(sid, decode_kv=handoff(pre))
    with pytest.raises(RuntimeError, match="draining"):
        await anext(chunks)
    assert d.service.engine.in_flight == 0
    await conn.close()


async def test_an_engine_that_prepares_decodes_gets_the_request_before_its_kv(
    make_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine with `prepare_decode` (the vLLM one) is handed the early Decode's request
    while its KV is awaited, and told to forget it once the Decode ends, or is cancelled
    before its KV came."""
    p, d, conn = await _pair(make_worker)
    engine = d.service.engine
    calls: list[tuple[str, str]] = []

    def prepare_decode(request: Any) -> bool:
        calls.append(("prepare", str(request.id)))
        assert tuple(request.prompt_token_ids) == tuple(PROMPT)
        return True

    def discard_prepared(request_id: Any) -> None:
        calls.append(("discard", str(request_id)))

    monkeypatch.setattr(engine, "prepare_decode", prepare_decode)
    monkeypatch.setattr(engine, "discard_prepared", discard_prepared)
    sid, chunks = await conn.open("decode", early("e"))
    async with asyncio.timeout(10):
        while not calls:  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.01)
    assert calls == [("prepare", "e")]  # before the KV
    pre = await _prefill(p, "e")
    await conn.send(sid, decode_kv=handoff(pre))
    tokens = [t for c in [c async for c in chunks] for t in c.token_ids]
    assert len(tokens) == 5
    assert calls == [("prepare", "e"), ("discard", "e")]
    calls.clear()
    sid, chunks = await conn.open("decode", early("x"))
    async with asyncio.timeout(10):
        while not calls:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await conn.send(sid, cancel=worker_pb2.MuxCancel())
    async with asyncio.timeout(10):
        while len(calls) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert calls == [("prepare", "x"), ("discard", "x")]
    await conn.close()

"""A decode's pulled KV is released at its source (ReleaseKv) only after token 2 has been handed
on: the release is a task on the worker's event loop, and made before the yield it ran ahead of
token 2's write to the caller. The consumer comes back for the next delta once that write is
done, so the release is made then, or when the consumer stops. No vLLM runs here: the engine's
asyncio side is driven with its own stream objects."""

from __future__ import annotations

import asyncio

import pytest

from splitserve.core.errors import KvTransferError
from splitserve.core.ids import RequestId
from splitserve.core.kv import KvHandle
from splitserve.core.request import FinishReason
from splitserve.worker.vllm_adapter.engine import VllmEngine, VllmEngineConfig, _Out, _Stream

RID = RequestId("d1")
KV = KvHandle("nixl", "10.0.0.1:50051", RequestId("p1"), 128, 4 << 20, {"remote_engine_id": "e"})


def _engine(released: list[str]) -> VllmEngine:
    async def release_remote(kv: KvHandle) -> None:
        released.append(f"{kv.source_address}/{kv.source_request_id}")

    return VllmEngine(VllmEngineConfig(model="m"), release_remote=release_remote)


def _stream(engine: VllmEngine, *outs: _Out) -> _Stream:
    stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), "decode")
    for out in outs:
        stream.queue.put_nowait(out)
    engine._streams[RID] = stream
    return stream


async def _settle(engine: VllmEngine) -> None:
    for _ in range(3):
        await asyncio.sleep(0)
    if engine._tasks:
        await asyncio.gather(*engine._tasks)


async def test_the_source_is_released_only_after_token_2_is_handed_on() -> None:
    released: list[str] = []
    engine = _engine(released)
    stream = _stream(engine, _Out((7,), None), _Out((8,), FinishReason.LENGTH))
    deltas = engine._deltas(RID, stream, pulled=KV)
    first = await deltas.__anext__()
    assert first.token_ids == (7,)
    await _settle(engine)  # whatever was started before the yield has run by now
    assert released == []
    assert not engine._tasks
    second = await deltas.__anext__()  # the consumer is back: token 2 went out
    assert second.token_ids == (8,)
    assert second.finish_reason is FinishReason.LENGTH
    await _settle(engine)
    assert released == ["10.0.0.1:50051/p1"]
    with pytest.raises(StopAsyncIteration):
        await deltas.__anext__()
    assert released == ["10.0.0.1:50051/p1"]  # once


async def test_a_consumer_that_stops_at_token_2_still_releases_the_source() -> None:
    released: list[str] = []
    engine = _engine(released)
    stream = _stream(engine, _Out((7,), None), _Out((8,), None))
    deltas = engine._deltas(RID, stream, pulled=KV)
    assert (await deltas.__anext__()).token_ids == (7,)
    await deltas.aclose()
    await _settle(engine)
    assert released == ["10.0.0.1:50051/p1"]
    assert RID not in engine._streams


async def test_a_decode_that_ends_without_tokens_releases_the_source() -> None:
    released: list[str] = []
    engine = _engine(released)
    stream = _stream(engine, _Out((), FinishReason.CANCELLED))
    deltas = engine._deltas(RID, stream, pulled=KV)
    last = await deltas.__anext__()
    assert last.token_ids == ()
    assert last.finish_reason is FinishReason.CANCELLED
    await _settle(engine)
    assert released == ["10.0.0.1:50051/p1"]


async def test_a_failed_pull_is_reported_and_nothing_is_released() -> None:
    released: list[str] = []
    engine = _engine(released)
    stream = _stream(engine, _Out((), FinishReason.ERROR, error="lease expired"))
    deltas = engine._deltas(RID, stream, pulled=KV)
    with pytest.raises(KvTransferError, match=r"could not be pulled from '10\.0\.0\.1:50051'"):
        await deltas.__anext__()
    await _settle(engine)
    assert released == []


async def test_a_generate_releases_nothing() -> None:
    released: list[str] = []
    engine = _engine(released)
    stream = _stream(engine, _Out((7,), FinishReason.STOP))
    deltas = engine._deltas(RID, stream)
    assert (await deltas.__anext__()).token_ids == (7,)
    with pytest.raises(StopAsyncIteration):
        await deltas.__anext__()
    await _settle(engine)
    assert released == []

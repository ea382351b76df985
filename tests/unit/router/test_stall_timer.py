"""`dispatch.StallTimer`: a read waiting `stall_s` times out; time the consumer spends holding a
chunk does not count; other cancellations stay cancellations."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
from grpc import aio

from splitserve._gen.v1 import common_pb2
from splitserve.router.client_link import ClientGone, ClientLink
from splitserve.router.dispatch import StallTimer


class _Call:
    """A token stream whose reads wait on a queue (`aio.EOF` ends it)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def read(self) -> Any:
        return await self.queue.get()


async def test_a_waiting_read_times_out() -> None:
    call: Any = _Call()
    timer = StallTimer(0.05)
    with pytest.raises(TimeoutError):
        await timer.read(call)
    timer.close()


async def test_time_between_reads_does_not_count() -> None:
    call: Any = _Call()
    timer = StallTimer(0.05)
    for i in range(3):
        call.queue.put_nowait(common_pb2.TokenChunk(token_ids=[i]))
        chunk = await timer.read(call)
        assert chunk is not None
        assert list(chunk.token_ids) == [i]
        await asyncio.sleep(0.08)  # the consumer holds the chunk longer than stall_s
    call.queue.put_nowait(aio.EOF)
    assert await timer.read(call) is None
    timer.close()


async def test_a_read_fed_in_time_never_times_out() -> None:
    call: Any = _Call()
    timer = StallTimer(0.1)

    async def feed() -> None:
        for i in range(6):
            await asyncio.sleep(0.03)
            call.queue.put_nowait(common_pb2.TokenChunk(token_ids=[i]))

    feeder = asyncio.create_task(feed())
    got = [await timer.read(call) for _ in range(6)]
    assert [c.token_ids[0] for c in got if c is not None] == list(range(6))
    await feeder
    timer.close()


async def test_a_read_on_a_worker_that_steps_waits_past_stall_s() -> None:
    """The worker's engine stepped just now at every check: the read is queued, not stalled."""
    call: Any = _Call()
    timer = StallTimer(0.05, lambda: 0.0)
    reader = asyncio.create_task(timer.read(call))
    await asyncio.sleep(0.3)  # 6 x stall_s
    assert not reader.done()
    call.queue.put_nowait(common_pb2.TokenChunk(token_ids=[7]))
    chunk = await reader
    assert chunk is not None
    assert list(chunk.token_ids) == [7]
    timer.close()


async def test_a_worker_silent_for_stall_s_or_unknown_times_out() -> None:
    ages: tuple[float | None, ...] = (0.05, None)  # last step stall_s ago; no step reports
    for age in ages:
        call: Any = _Call()
        timer = StallTimer(0.05, functools.partial(lambda a: a, age))
        with pytest.raises(TimeoutError):
            await timer.read(call)
        timer.close()


async def test_a_waited_answer_times_out_like_a_read() -> None:
    timer = StallTimer(0.05)
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await timer.wait(never)
    timer.close()
    timer = StallTimer(0.05, lambda: 0.0)
    soon = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.2, soon.set_result, 3)
    assert await timer.wait(soon) == 3
    timer.close()


async def test_another_cancel_stays_a_cancel() -> None:
    call: Any = _Call()
    timer = StallTimer(10.0)
    task = asyncio.create_task(timer.read(call))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    timer.close()


async def test_client_link_cancels_the_work_once() -> None:
    link = ClientLink()
    started = asyncio.Event()

    async def work() -> int:
        started.set()
        await asyncio.sleep(10)
        return 1

    async def serve() -> str:
        try:
            await link.run(work())
        except ClientGone:
            return "gone"
        return "done"

    task = asyncio.create_task(serve())
    await started.wait()
    link.lost()
    link.lost()
    assert await task == "gone"
    assert task.cancelling() == 0
    with pytest.raises(ClientGone):
        link.watch()  # gone already


async def test_client_link_leaves_other_cancels_alone() -> None:
    link = ClientLink()
    task = asyncio.create_task(link.run(asyncio.sleep(10)))
    await asyncio.sleep(0.01)
    task.cancel()
    link.lost()  # both: the outer cancel wins
    with pytest.raises(asyncio.CancelledError):
        await task

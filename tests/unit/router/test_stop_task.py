"""Stopping a background task keeps the caller's own cancellation.

Before `stop_task` (now `splitserve.aio`, shared with the worker), `PoolView.remove` (and every
`stop()` like it) waited for the task it cancelled inside `suppress(CancelledError)`: a caller
cancelled meanwhile lost its cancellation. Discovery removing a pod's endpoint when the router
stopped it then kept watching, and `KubernetesDiscovery.stop()` waited for the API server's
watch to time out (`test_pool_follows_worker_pods`, 3 in 25 runs).
"""

from __future__ import annotations

import asyncio

import pytest

from splitserve.aio import stop_task
from splitserve.core.clock import SystemClock
from splitserve.core.roles import Role
from splitserve.router.pool_view import PoolView
from tests.unit.router.conftest import FAST_POOL, WorkerFactory


async def _slow_to_stop(stopped: asyncio.Event) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await stopped.wait()  # cleans up for a while after its cancel


async def test_the_callers_cancellation_is_kept() -> None:
    stopped = asyncio.Event()
    task = asyncio.create_task(_slow_to_stop(stopped))
    await asyncio.sleep(0)
    caller = asyncio.create_task(stop_task(task))
    await asyncio.sleep(0)  # the caller waits for the task
    caller.cancel()
    stopped.set()
    await asyncio.wait({caller})
    assert task.cancelled()
    assert caller.cancelled()


async def test_the_tasks_cancellation_is_absorbed() -> None:
    task = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    await stop_task(task)  # returns, no CancelledError
    assert task.cancelled()


async def test_the_tasks_error_is_raised() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await stop_task(task)


async def test_pool_remove_keeps_the_callers_cancellation(make_worker: WorkerFactory) -> None:
    d = await make_worker(Role.DECODE)
    async with PoolView([d.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: pv.view(d.address).ready, 10)
        remover = asyncio.create_task(pool.remove(d.address))
        await asyncio.sleep(0)  # remover waits for the endpoint's load-stream task to end
        remover.cancel()
        await asyncio.wait({remover})
        assert remover.cancelled(), "remove() swallowed its caller's cancellation"


async def test_a_cancelled_callers_cleanup_goes_on() -> None:
    """In the `finally` of a cancelled task the cancellation is already being handled: stopping
    a helper there returns, so the rest of the cleanup runs."""
    helpers = [asyncio.create_task(asyncio.Event().wait()) for _ in range(2)]
    cleaned: list[str] = []

    async def owner() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await stop_task(helpers[0])
            cleaned.append("first")
            await stop_task(helpers[1])
            cleaned.append("second")

    task = asyncio.create_task(owner())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait({task})
    assert task.cancelled()
    assert cleaned == ["first", "second"]
    assert all(h.cancelled() for h in helpers)

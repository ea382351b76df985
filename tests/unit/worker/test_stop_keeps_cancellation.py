"""The worker's stops keep their caller's cancellation (`splitserve.aio`).

Before the fix `SimEngine.stop` and `_ReleaseClient.close` waited for their tasks inside
`suppress(CancelledError)`: a caller cancelled while it waited there (a shutdown with a
deadline) lost its cancellation and carried on as if nothing happened.
"""

from __future__ import annotations

import asyncio

from splitserve.core.roles import Role
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine


async def _slow_to_stop(stopped: asyncio.Event) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await stopped.wait()  # cleans up for a while after its cancel


async def _cancelled_while_waiting(
    caller: asyncio.Task[None], stopped: asyncio.Event
) -> asyncio.Task[None]:
    await asyncio.sleep(0)  # the caller waits for the slow task
    caller.cancel()
    stopped.set()
    await asyncio.wait({caller})
    return caller


async def test_sim_engine_stop_keeps_the_callers_cancellation() -> None:
    cfg = WorkerConfig(role=Role.MIXED, sim_num_kv_blocks=64, vocab_size=100)
    release = _ReleaseClient()
    engine = build_sim_engine(cfg, "127.0.0.1:1", release)
    stopped = asyncio.Event()
    loop_task = asyncio.create_task(_slow_to_stop(stopped))
    engine._loop_task = loop_task  # the engine's step loop, slow to end
    await asyncio.sleep(0)
    caller = await _cancelled_while_waiting(asyncio.create_task(engine.stop()), stopped)
    assert loop_task.cancelled()
    assert caller.cancelled()
    await engine.stop()  # a plain stop still returns
    await release.close()


async def test_release_client_close_keeps_the_callers_cancellation() -> None:
    release = _ReleaseClient()
    stopped = asyncio.Event()
    closing = asyncio.create_task(stopped.wait())  # a channel closing with its grace
    release._closing.add(closing)  # type: ignore[arg-type]
    caller = asyncio.create_task(release.close())
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.wait({caller})
    assert caller.cancelled()
    stopped.set()
    await asyncio.wait({closing})

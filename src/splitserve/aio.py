"""Stopping background tasks without swallowing the caller's own cancellation.

`task.cancel()` then `with suppress(CancelledError): await task` is the usual way to stop a task,
and it has a trap: if the task running that code is cancelled while it waits, the
`CancelledError` meant for it is swallowed too, and it carries on as if nothing happened. The
router met it in `PoolView.remove` (discovery removing a pod's endpoint while the router shut
down: discovery kept watching, and its `stop()` waited until the API server's watch ended).

Shared by the router, the worker and the CLI (a neutral module: `core` does no I/O, and the
components may not import each other).
"""

from __future__ import annotations

import asyncio
from typing import Any


async def stop_task(*tasks: asyncio.Future[Any]) -> None:
    """Cancel `tasks` and wait until each has finished.

    Their cancellation is absorbed and an error one ends with is raised (after the rest have
    finished). `CancelledError` is raised when the caller is cancelled while it waits: a
    cancellation that arrives meanwhile, not one the caller was already handling (a `finally`
    of a cancelled task can stop its helpers and go on cleaning up).
    """
    for task in tasks:
        task.cancel()
    await finish_tasks(*tasks)


async def finish_tasks(*tasks: asyncio.Future[Any]) -> None:
    """Wait until each of `tasks` has finished, without cancelling them; as `stop_task`
    otherwise (a task's cancellation absorbed, its error raised, the caller's cancellation
    kept)."""
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0
    failure: BaseException | None = None
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            if current is not None and current.cancelling() > before:
                for rest in tasks:  # stop_task's: cancelled already; finish_tasks': now
                    rest.cancel()
                raise
        except Exception as err:  # raised below, once every task has ended
            failure = failure or err
    if failure is not None:
        raise failure

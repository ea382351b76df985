"""Stopping background tasks without swallowing the caller's own cancellation.

`task.cancel()` then `with suppress(CancelledError): await task` is the usual way to stop a task,
and it has a trap: if the task running that code is cancelled while it waits, the
`CancelledError` meant for it is swallowed too, and it carries on as if nothing happened. The
router met it in `PoolView.remove` (discovery removing a pod's endpoint while the router shut
down: discovery kept watching, and its `stop()` waited until the API server's watch ended).
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
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0
    for task in tasks:
        task.cancel()
    failure: BaseException | None = None
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            if current is not None and current.cancelling() > before:
                for rest in tasks:  # already cancelled; they end on their own
                    rest.cancel()
                raise
        except Exception as err:  # raised below, once every task has ended
            failure = failure or err
    if failure is not None:
        raise failure

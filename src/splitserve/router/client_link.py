"""A request's link to its HTTP connection: cancel the work when the client goes away.

Starlette notices a disconnect by running a second task per response that waits on the ASGI
`receive` channel (and `openai_stream.unless_disconnected` did the same for the first chunk):
two tasks, an anyio task group and an `asyncio.wait` per request. The router's own HTTP
protocol (`http_edge.EdgeProtocol`) knows when a connection is lost, so it puts a `ClientLink`
in each request's ASGI scope and calls `lost()` from `connection_lost`; the response then
cancels the one task doing the work, with no watcher task. Served by another ASGI server (or an
in-process test transport) the scope has no link and the Starlette way is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, Final, TypeVar

SCOPE_KEY: Final = "splitserve.client_link"
"""The ASGI scope key holding the request's `ClientLink`."""

T = TypeVar("T")


class ClientGone(Exception):  # noqa: N818 - a condition, like the core errors
    """The HTTP client disconnected before the answer was ready."""


class ClientLink:
    """Whether one request's client is still connected, and the task to cancel when not."""

    __slots__ = ("_cancelled", "_task", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    def lost(self) -> None:
        """The connection is gone: cancel the watched task (once)."""
        if self.gone:
            return
        self.gone = True
        task = self._task
        if task is not None and not task.done():
            self._cancelled = True
            task.cancel()

    def watch(self) -> asyncio.Task[Any]:
        """Cancel the current task if the client goes away (until `unwatch`).

        Raises:
            ClientGone: it is gone already.
        """
        if self.gone:
            raise ClientGone
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        return task

    def unwatch(self) -> None:
        """Stop watching. A cancel of ours that the work swallowed is undone here, so it cannot
        strike a later, unwatched `await` of the task."""
        task, self._task = self._task, None
        if self._cancelled and task is not None:
            self._cancelled = False
            task.uncancel()

    def took(self, task: asyncio.Task[Any]) -> bool:
        """After a `CancelledError` in `task`: True if it was this link's cancel alone (now
        undone: the caller handles the disconnect), False if someone else cancelled it too
        (the caller re-raises)."""
        if not self._cancelled:
            return False
        self._cancelled = False
        return task.uncancel() == 0

    async def run(self, work: Awaitable[T]) -> T:
        """Await `work` in this task, cancelling it if the client disconnects (`ClientGone`)."""
        task = self.watch()
        try:
            return await work
        except asyncio.CancelledError:
            if self.took(task):
                raise ClientGone from None
            raise
        finally:
            self.unwatch()


def link_of(scope: Mapping[str, Any]) -> ClientLink | None:
    link = scope.get(SCOPE_KEY)
    return link if isinstance(link, ClientLink) else None

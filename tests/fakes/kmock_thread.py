"""kmock (an emulated Kubernetes API server) in a thread and event loop of its own.

kopf's runner, the router's discovery loop and synchronous test code all block their own loop,
so the API server gets a separate one. Each suite supplies its emulator class (kmock plus the
fixes it needs) and what to declare in it (resources, backbone objects).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Self

from tests.fakes.rbac import ApiCall


class KmockThread:
    def __init__(self, emulator_class: type[Any], populate: Callable[[Any], None]) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.url = ""
        self.emulator: Any = None
        self._emulator_class = emulator_class
        self._populate = populate
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._archived: list[ApiCall] = []

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        self.loop.close()

    async def _serve(self) -> None:
        import kmock

        self._stop = asyncio.Event()
        async with self._emulator_class() as emulator, kmock.Server(emulator) as server:
            self._populate(emulator)
            self.url = str(server.url).rstrip("/")
            self.emulator = emulator
            self.ready.set()
            await self._stop.wait()

    def calls(self) -> list[ApiCall]:
        """Every request the emulator has answered so far (archived ones first)."""
        return [*self._archived, *map(_call, list(self.emulator))]

    def archive(self) -> None:
        """Move kmock's request log into `calls()`'s own list and empty kmock's.

        kmock matches every new request against its whole log, so long runs (benchmarks) slow
        down with the square of the requests served; archiving keeps each request's cost flat.
        """

        async def move() -> list[ApiCall]:
            requests = self.emulator._requests  # kmock has no public way to trim its log
            moved = [_call(r) for r in requests]
            requests.clear()
            return moved

        self._archived += asyncio.run_coroutine_threadsafe(move(), self.loop).result(30)

    def start(self) -> Self:
        self.thread.start()
        if not self.ready.wait(15):
            raise RuntimeError("kmock did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(15)


def _call(r: Any) -> ApiCall:
    return ApiCall(
        method=str(r.method.value if hasattr(r.method, "value") else r.method),
        path=r.url.path,
        params=dict(r.params),
        user_agent=str(r.headers.get("User-Agent", "")),
        authorization=str(r.headers.get("Authorization", "")),
        body=r.data,
    )


async def consistent_watch(emulator: Any, request: Any) -> AsyncIterator[Any]:
    """kmock's watch, without the window in which it loses events.

    kmock 0.8's `_serve_watch` snapshots the current objects under its lock, releases it, and only
    then subscribes to the resource's event bus: an object written in between (its event put on
    the bus under the same lock) is in neither, so the watcher never hears of it. A client that
    writes right after its watch opened (the discovery tests, 3 of 25 runs) then waits forever.
    A real API server has no such window: a watch from a resourceVersion replays every later
    change. Here the bus is marked under the lock before the snapshot, so every write lands in
    exactly one of them. Uses kmock's private lock and object filter (it has no public hook).
    """
    yield b""  # the headers: the client's watch call returns (as kmock's own watch does)
    bus = emulator._buses[request.resource]
    async with emulator._lock:
        mark = await bus.mark()
        objs = emulator._KubernetesEmulator__get_objs(request, strict=False)
        events = [{"type": "ADDED", "object": obj.raw} for obj in objs if not obj.deleted]
    try:
        for event in events:
            yield event
        check = emulator._KubernetesEmulator__check
        async for event in bus.stream(since=mark):
            md = event.get("object", {}).get("metadata", {})
            if check(request, request.resource, md.get("namespace"), md.get("name"), strict=False):
                yield event
    finally:
        await bus.unmark(mark)

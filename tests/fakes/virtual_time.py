"""An asyncio event loop on virtual time, and a Worker stub that calls a `WorkerService` in it.

`VirtualTimeLoop`: `loop.time()` starts at 0 and moves only when nothing is ready to run: it
then jumps to the next timer (an `asyncio.sleep`, a timeout) at once. Code that measures time
with `loop.time` around sleeps therefore measures exactly the sleeps, whatever the machine's
load; the run takes as long as its computation, not its sleeps. Only for code without real I/O
or threads (a wait on them would be skipped over).

`DirectStub`: the `WorkerStub` methods the profiler calls, answered by a `WorkerService`'s
handlers in the same loop (no gRPC, no sockets), with a servicer context that has no peer.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import AsyncIterator, Mapping
from typing import Any, NoReturn

import grpc

from splitserve._gen.v1 import worker_pb2
from splitserve.worker.server import WorkerService


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)  # the loop's own wake-up pipe only: never wait
        if not events and timeout is not None and timeout > 0:
            self.now += timeout  # nothing to do before the next timer: go there
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


class Aborted(grpc.aio.AioRpcError):  # type: ignore[misc]  # (grpc is untyped)
    """A handler's `context.abort`, raised as a gRPC client sees it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        empty = grpc.aio.Metadata()
        super().__init__(code, empty, empty, details)


class _Context:
    """The parts of a servicer context the handlers use; no peer, no metadata."""

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> NoReturn:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def peer(self) -> str:
        return "direct"

    def auth_context(self) -> Mapping[str, Any]:
        return {}

    async def send_initial_metadata(self, _: object) -> None:
        return None


class _Stream:
    """A server-streaming call: iterate it, or `cancel` it."""

    def __init__(self, agen: AsyncIterator[Any]) -> None:
        self._agen = agen

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._agen

    def cancel(self) -> bool:
        aclose = getattr(self._agen, "aclose", None)
        if aclose is not None:
            asyncio.get_running_loop().create_task(aclose())
        return True


class DirectStub:
    def __init__(self, service: WorkerService) -> None:
        self.service = service

    def Generate(  # noqa: N802 - the stub's names
        self, request: worker_pb2.GenerateRequest, **_: Any
    ) -> _Stream:
        return _Stream(self.service.Generate(request, _Context()))

    def WatchLoad(  # noqa: N802
        self, request: worker_pb2.WatchLoadRequest, **_: Any
    ) -> _Stream:
        return _Stream(self.service.WatchLoad(request, _Context()))

    async def Cancel(  # noqa: N802
        self, request: worker_pb2.CancelRequest, **_: Any
    ) -> worker_pb2.CancelResponse:
        return await self.service.Cancel(request, _Context())

    async def SetRole(  # noqa: N802
        self, request: worker_pb2.SetRoleRequest, **_: Any
    ) -> worker_pb2.SetRoleResponse:
        return await self.service.SetRole(request, _Context())

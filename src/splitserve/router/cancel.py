"""Best-effort `Cancel(request_id)` to workers, in the background.

A request that ends early (client gone, stop string, failure) must not keep running on its
workers. Cancels run as their own tasks, so they still go out when the request's task is being
cancelled itself; each is bounded by a short timeout and failures are only logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.core.ids import EndpointId

log = logging.getLogger(__name__)


class Canceller:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._tasks: set[asyncio.Task[None]] = set()

    def cancel_later(
        self, request_id: str, stubs: Mapping[EndpointId, worker_pb2_grpc.WorkerAsyncStub]
    ) -> None:
        """Send `Cancel(request_id)` to each endpoint in the background."""
        for eid, stub in stubs.items():
            task = asyncio.create_task(self._cancel(eid, stub, request_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _cancel(
        self, eid: EndpointId, stub: worker_pb2_grpc.WorkerAsyncStub, request_id: str
    ) -> None:
        try:
            await stub.Cancel(
                worker_pb2.CancelRequest(request_id=request_id), timeout=self.timeout_s
            )
            log.debug("cancelled %s on %s", request_id, eid)
        except asyncio.CancelledError:
            log.info("cancel of %s on %s interrupted", request_id, eid)
        except Exception as err:  # best-effort: a closed channel, a dead worker, a timeout
            log.info("cancel of %s on %s failed: %s", request_id, eid, err)

    async def drain(self) -> None:
        """Wait for the cancels still going out (at shutdown, and in tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

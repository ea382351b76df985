"""Warm KV pairs: tell decode-capable workers which prefill-capable workers to set KV up with.

Whenever the pool changes — a worker joins, comes back after its load stream broke (a restart),
or changes role (a flip) — every ready decode-capable worker gets `WorkerKv.WarmKv` naming every
ready prefill-capable worker but itself, unless it already got that same list since it last
became ready. The worker does the work (NIXL: metadata exchange and connection; see
`splitserve.worker.kv_warm`), so a request's first pull between two workers costs what the tenth
does. Workers without a KV transport (the simulated engine) answer UNIMPLEMENTED and are not
asked again until they reconnect. Best effort: a failure is logged, and the request path still
sets pairs up on demand as before.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc import aio

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.aio import stop_task
from splitserve.core.ids import EndpointId
from splitserve.policy.placement import EndpointView
from splitserve.router.pool_view import PoolView
from splitserve.security import tls

log = logging.getLogger(__name__)

WARM_TIMEOUT_S = 60.0


def warm_plan(views: list[EndpointView]) -> dict[EndpointId, tuple[str, ...]]:
    """For each ready decode-capable endpoint, the ready prefill-capable ones it pulls from."""
    # Stock vLLM servers (`http_backend`, ids are URLs) take no WarmKv: their NIXL handshake
    # happens on the first pull, and a gRPC worker cannot pull from them by that id either.
    ready = [v for v in views if v.ready and not v.id.startswith(("http://", "https://"))]
    sources = [v.id for v in ready if v.role.can_prefill]
    return {v.id: tuple(s for s in sources if s != v.id) for v in ready if v.role.can_decode}


class KvPairWarmer:
    """Runs beside the pool (`run()` until cancelled). Keeps its own channels to the workers
    it warms (closed when they leave the pool)."""

    def __init__(self, pool: PoolView) -> None:
        self._pool = pool
        self._told: dict[EndpointId, tuple[str, ...]] = {}
        """The peer list each ready endpoint was last given (or would have been: an empty one is
        recorded, not sent). Forgotten when it stops being ready."""
        self._unsupported: set[EndpointId] = set()
        self._channels: dict[EndpointId, aio.Channel] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def _changes(self) -> dict[EndpointId, tuple[str, ...]]:
        plan = warm_plan(self._pool.views())
        return {eid: peers for eid, peers in plan.items() if self._told.get(eid) != peers}

    def _forget_gone(self) -> None:
        plan = warm_plan(self._pool.views())
        for eid in [e for e in self._told if e not in plan]:
            del self._told[eid]  # gone, reconnecting or no longer decoding: tell it again later
        self._unsupported &= set(plan)

    async def run(self) -> None:
        try:
            while True:
                self._forget_gone()
                await self._pool.wait_for(lambda _pool: bool(self._changes()))
                self._forget_gone()
                for eid, peers in self._changes().items():
                    self._told[eid] = peers
                    if peers and eid not in self._unsupported:
                        task = asyncio.create_task(self._warm(eid, peers), name=f"warm-kv {eid}")
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                await self._close_gone()
        finally:
            for task in list(self._tasks):
                await stop_task(task)
            for channel in self._channels.values():
                await channel.close()
            self._channels.clear()

    async def _close_gone(self) -> None:
        members = set(self._pool.ids())
        for eid in [e for e in self._channels if e not in members]:
            await self._channels.pop(eid).close()

    async def _warm(self, eid: EndpointId, peers: tuple[str, ...]) -> None:
        channel = self._channels.get(eid)
        if channel is None:
            channel = self._channels[eid] = tls.aio_channel(eid)
        try:
            stub = worker_pb2_grpc.WorkerKvStub(channel)
            out = await stub.WarmKv(worker_pb2.WarmKvRequest(peers=peers), timeout=WARM_TIMEOUT_S)
        except aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._unsupported.add(eid)  # no KV transport there (simulated engine)
            else:  # not retried until the pool changes: requests still set pairs up on demand
                log.warning("WarmKv on %s failed: %s %s", eid, err.code().name, err.details())
            return
        if out.failed:
            log.warning("%s could not warm KV pairs: %s", eid, "; ".join(out.failed))
        if out.warmed:
            log.info("%s warmed KV pairs with %s", eid, ", ".join(out.warmed))

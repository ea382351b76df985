"""`splitserve.v1.WorkerKv`: KV-transfer set-up between workers before any request needs it.

Served by workers whose engine has a KV transport between processes (vLLM + NIXL): the engine
implements `KvPeerEngine`. `KvEndpoint` says where this worker's KV is pulled from; `WarmKv`
(called by the router on a decode-capable worker, naming the prefill-capable ones) asks each
peer for its endpoint over gRPC and has the engine set the pair up (NIXL: metadata exchange and
connection), so the first request on a pair costs what the tenth does. Its `KvEndpoint` call
carries `warm_up_ms`: the peer (an engine with `KvWarmupServer`) then progresses its KV
transfers for that long, or until this worker's warm-up READ has notified it, so that the set-up
completes while the peer is otherwise idle (`nixl.WarmupWindow`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import grpc

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.core.errors import KvTransferError
from splitserve.security import tls
from splitserve.worker.kv_source import KvSources

log = logging.getLogger(__name__)

ENDPOINT_TIMEOUT_S = 10.0
"""How long a peer's KvEndpoint answer may take."""
WARMUP_ENV = "SPLITSERVE_KV_WARMUP_MS"
"""How long (ms) a peer is asked to progress KV transfers while this worker warms up with it
(`KvEndpointRequest.warm_up_ms`); `0` asks for nothing (the behaviour before it, for
comparisons: docs/benchmarks.md, "KV handoff")."""
WARMUP_DEFAULT_MS = 2000
MAX_WARMUP_MS = 10_000


def warmup_ms(env: Mapping[str, str] = os.environ) -> int:
    """`SPLITSERVE_KV_WARMUP_MS` (0 to 10000) if set, else 2000. Anything else is refused."""
    value = env.get(WARMUP_ENV, "")
    if value == "":
        return WARMUP_DEFAULT_MS
    if not value.isdigit() or int(value) > MAX_WARMUP_MS:
        raise ValueError(f"{WARMUP_ENV} must be a whole number of ms in [0, {MAX_WARMUP_MS}], "
                         f"not {value!r}")  # fmt: skip
    return int(value)


@runtime_checkable
class KvPeerEngine(Protocol):
    """What an engine offers for warming KV pairs (the vLLM engine does; the simulated one,
    whose KV "transfer" is a sleep, does not)."""

    def kv_endpoint(self) -> tuple[str, dict[str, Any]] | None:
        """(transport, params) other engines pull this one's KV from; None without a KV
        connector."""
        ...

    async def warm_kv(self, endpoint: Mapping[str, Any]) -> bool:
        """Set up pulling from the engine at `endpoint`. True: set up now; False: it already
        was. Raises KvTransferError when it cannot."""
        ...


@runtime_checkable
class KvWarmupServer(Protocol):
    """An engine whose KV transfers need its own progress on the serving side (vLLM + NIXL
    without NIXL's progress thread)."""

    def serve_kv_warmup(self, seconds: float) -> bool:
        """A peer is about to warm up with this engine: progress KV transfers for up to
        `seconds` (or until the peer's warm-up READ has notified it). False: nothing to do
        (no KV connector)."""
        ...


class KvWarmService(worker_pb2_grpc.WorkerKvServicer):
    def __init__(
        self, engine: KvPeerEngine, own_address: str, warm_up_ms: int | None = None
    ) -> None:
        self.engine = engine
        self.own_address = own_address
        self.warm_up_ms = warmup_ms() if warm_up_ms is None else warm_up_ms
        """What this worker's WarmKv asks its peers for (`KvEndpointRequest.warm_up_ms`)."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.sources: KvSources | None = None
        """Where the peers' endpoints are remembered for checking Decodes' KV handles."""

    async def KvEndpoint(  # noqa: N802 - gRPC method names
        self, request: worker_pb2.KvEndpointRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.KvEndpointResponse:
        endpoint = self.engine.kv_endpoint()
        if endpoint is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "this worker's engine has no KV connector"
            )
            raise AssertionError("unreachable")  # abort raises
        if request.warm_up_ms > MAX_WARMUP_MS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"warm_up_ms must be at most {MAX_WARMUP_MS}, got {request.warm_up_ms}",
            )
        if request.warm_up_ms and isinstance(self.engine, KvWarmupServer):
            self.engine.serve_kv_warmup(request.warm_up_ms / 1000)
        transport, params = endpoint
        return worker_pb2.KvEndpointResponse(transport=transport, params_json=json.dumps(params))

    async def WarmKv(  # noqa: N802
        self, request: worker_pb2.WarmKvRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WarmKvResponse:
        peers = [p for p in dict.fromkeys(request.peers) if p and p != self.own_address]
        bad = [p for p in peers if ":" not in p]
        if bad:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"peers must be host:port, got {bad}"
            )
        await self._forget_except(set(peers))
        results = await asyncio.gather(*(self._warm(p) for p in peers))
        out = worker_pb2.WarmKvResponse()
        for peer, (state, why) in zip(peers, results, strict=True):
            if state == "warmed":
                out.warmed.append(peer)
            elif state == "already":
                out.already_warm.append(peer)
            else:
                out.failed.append(f"{peer}: {why}")
        if out.failed:
            log.warning("KV pairs not warmed: %s", "; ".join(out.failed))
        return out

    async def _warm(self, peer: str) -> tuple[str, str]:
        channel = self._channels.get(peer)
        if channel is None:
            channel = self._channels[peer] = tls.aio_channel(peer)
        stub = worker_pb2_grpc.WorkerKvStub(channel)
        try:
            got = await stub.KvEndpoint(
                worker_pb2.KvEndpointRequest(warm_up_ms=self.warm_up_ms),
                timeout=ENDPOINT_TIMEOUT_S,
            )
            transport, params = got.transport, json.loads(got.params_json or "{}")
            own = self.engine.kv_endpoint()
            if own is None or transport != own[0]:
                return "failed", f"transport {transport!r} is not this engine's"
            if self.sources is not None and isinstance(params, dict):
                self.sources.learn(peer, params)
            return ("warmed" if await self.engine.warm_kv(params) else "already"), ""
        except grpc.aio.AioRpcError as err:
            return "failed", f"KvEndpoint: {err.code().name} {err.details()}"
        except (KvTransferError, ValueError) as err:
            return "failed", str(err)

    async def _forget_except(self, peers: set[str]) -> None:
        """Close channels to workers no longer named (the router sends the whole peer set)."""
        for peer in [p for p in self._channels if p not in peers]:
            await self._channels.pop(peer).close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

"""Where a decode worker may pull KV from: the NIXL endpoint a KV handle names must be its source's.

A `Decode`'s KV handle names its source twice: `source_address` (the prefill worker's gRPC
address, which the router checked is the worker that prefilled and a current member of the pool,
`splitserve.router.kv_source`) and, for vLLM's NIXL transport, `params` — vLLM's
`kv_transfer_params`, whose `remote_engine_id` / `remote_host` / `remote_port` are where vLLM's
connector opens its side channel and reads blocks. Nothing ties the second to the first, so a
handle could send the NIXL connection anywhere. `KvSources.problem` ties them: it asks the worker
at `source_address` for its KV endpoint (`WorkerKv/KvEndpoint`, over the same mutual TLS as every
internal call: the source must hold a worker certificate of this CA, and a worker answers only
callers of its own service) and refuses a handle whose NIXL endpoint is not that one.

Answers are cached per address (bounded, least recently used dropped first) and seeded by the
router's `WarmKv` (which fetched the same answer); a handle that disagrees with the cache is
checked again against a fresh answer before it is refused (a restarted source has a new engine
id). Handles of other transports (the simulated engine's) carry no endpoint: their "pull" is a
`ReleaseKv` call to `source_address`, under the same TLS checks.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final

import grpc

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.core.kv import KvHandle

log = logging.getLogger(__name__)

NIXL: Final = "nixl"
ENDPOINT_TIMEOUT_S: Final = 5.0
"""How long a source's KvEndpoint answer may take (the decode waits for it once per source)."""
MAX_SOURCES: Final = 256
"""Most sources' endpoints a worker remembers (least recently used ones are forgotten)."""

_CHECKED: Final = (
    ("remote_engine_id", "engine_id"),
    ("remote_host", "host"),
    ("remote_port", "port"),
)
"""(kv_transfer_params key, KvEndpoint key): what must agree."""


def endpoint_mismatch(params: Mapping[str, Any], endpoint: Mapping[str, Any]) -> str | None:
    """How a handle's NIXL `params` differ from the source's own endpoint, or None."""
    for key, ep_key in _CHECKED:
        if key not in params:
            return f"kv.params has no {key}"
        want = endpoint.get(ep_key)
        if str(params[key]) != str(want):
            return f"kv.params.{key} ({params[key]!r}) is not the source's ({want!r})"
    return None


class KvSources:
    """The KV endpoints of source workers, as they report them (see the module doc)."""

    def __init__(
        self,
        channel: Callable[[str], grpc.aio.Channel],
        max_sources: int = MAX_SOURCES,
    ) -> None:
        if max_sources < 1:
            raise ValueError(f"max_sources must be >= 1, got {max_sources}")
        self._channel = channel
        self.max_sources = max_sources
        self._known: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def learn(self, address: str, endpoint: Mapping[str, Any]) -> None:
        """Remember `address`'s endpoint (what its KvEndpoint answered, e.g. for WarmKv)."""
        self._known[address] = dict(endpoint)
        self._known.move_to_end(address)
        while len(self._known) > self.max_sources:
            self._known.popitem(last=False)

    async def problem(self, kv: KvHandle) -> str | None:
        """Why `kv` must not be pulled, or None. Only NIXL handles carry an endpoint."""
        if kv.transport != NIXL:
            return None
        params = kv.params or {}
        known = self._known.get(kv.source_address)
        if known is not None:
            self._known.move_to_end(kv.source_address)
            if endpoint_mismatch(params, known) is None:
                return None
        try:
            fresh = await self._fetch(kv.source_address)
        except grpc.aio.AioRpcError as err:
            return (
                f"the KV source {kv.source_address} did not confirm its KV endpoint "
                f"({err.code().name}: {err.details()})"
            )
        except ValueError as err:
            return f"the KV source {kv.source_address} answered no usable KV endpoint ({err})"
        self.learn(kv.source_address, fresh)
        return endpoint_mismatch(params, fresh)

    async def _fetch(self, address: str) -> dict[str, Any]:
        stub = worker_pb2_grpc.WorkerKvStub(self._channel(address))
        got = await stub.KvEndpoint(worker_pb2.KvEndpointRequest(), timeout=ENDPOINT_TIMEOUT_S)
        if got.transport != NIXL:
            raise ValueError(f"its transport is {got.transport!r}")
        endpoint = json.loads(got.params_json or "{}")
        if not isinstance(endpoint, dict):
            raise ValueError("its params are not an object")
        return endpoint

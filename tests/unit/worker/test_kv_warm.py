"""`WorkerKv` on the worker side: KvEndpoint, and WarmKv asking each peer for its endpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import pytest
from grpc import aio

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.core.errors import KvTransferError
from splitserve.worker.kv_warm import KvPeerEngine


class FakeKvEngine:
    def __init__(self, engine_id: str, connector: bool = True) -> None:
        self.engine_id = engine_id
        self.connector = connector
        self.warm: set[str] = set()
        self.calls: list[dict[str, Any]] = []

    def kv_endpoint(self) -> tuple[str, dict[str, Any]] | None:
        return ("nixl", {"engine_id": self.engine_id}) if self.connector else None

    async def warm_kv(self, endpoint: Mapping[str, Any]) -> bool:
        self.calls.append(dict(endpoint))
        eid = str(endpoint["engine_id"])
        if eid.startswith("broken"):
            raise KvTransferError(f"cannot reach {eid}")
        new = eid not in self.warm
        self.warm.add(eid)
        return new


Served = tuple[FakeKvEngine, str]


def test_the_fake_is_a_kv_peer_engine() -> None:
    assert isinstance(FakeKvEngine("x"), KvPeerEngine)
    assert not isinstance(object(), KvPeerEngine)


async def test_warm_kv_fetches_each_peers_endpoint_once_per_engine(serve: Any) -> None:
    decode = FakeKvEngine("d")
    d_addr = await serve(decode)
    p1 = await serve(FakeKvEngine("p1"))
    p2 = await serve(FakeKvEngine("broken-p2"))
    no_kv = await serve(FakeKvEngine("x", connector=False))
    async with aio.insecure_channel(d_addr) as channel:
        stub = worker_pb2_grpc.WorkerKvStub(channel)
        got = await stub.KvEndpoint(worker_pb2.KvEndpointRequest())
        assert (got.transport, got.params_json) == ("nixl", '{"engine_id": "d"}')

        out = await stub.WarmKv(worker_pb2.WarmKvRequest(peers=[p1, p2, no_kv, d_addr, p1]))
        assert list(out.warmed) == [p1]
        assert list(out.already_warm) == []
        assert out.failed[0] == f"{p2}: cannot reach broken-p2"  # in the order named
        assert out.failed[1].startswith(f"{no_kv}: KvEndpoint: FAILED_PRECONDITION")
        # Peers are warmed concurrently: any order. Itself and the engine without a connector
        # are never handed to warm_kv.
        assert sorted(c["engine_id"] for c in decode.calls) == ["broken-p2", "p1"]

        again = await stub.WarmKv(worker_pb2.WarmKvRequest(peers=[p1]))
        assert (list(again.warmed), list(again.already_warm)) == ([], [p1])

        gone = "127.0.0.1:1"  # nothing listens there
        out = await stub.WarmKv(worker_pb2.WarmKvRequest(peers=[gone]))
        assert out.failed[0].startswith(f"{gone}: KvEndpoint: ")  # UNAVAILABLE (or a timeout)

        with pytest.raises(aio.AioRpcError) as err:
            await stub.WarmKv(worker_pb2.WarmKvRequest(peers=["no-port"]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_engine_without_a_connector_says_so(serve: Any) -> None:
    addr = await serve(FakeKvEngine("x", connector=False))
    async with aio.insecure_channel(addr) as channel:
        with pytest.raises(aio.AioRpcError) as err:
            await worker_pb2_grpc.WorkerKvStub(channel).KvEndpoint(worker_pb2.KvEndpointRequest())
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

"""A Decode's NIXL endpoint must be its source worker's own (`worker.kv_source`): a forged
`kv_transfer_params` naming another host, port or engine is refused before vLLM connects there;
the answers are cached (bounded) and re-checked when a source restarts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.ids import RequestId
from splitserve.core.kv import KvHandle
from splitserve.core.roles import Role
from splitserve.worker.kv_source import KvSources, endpoint_mismatch
from splitserve.worker.runtime import _ReleaseClient
from tests.fakes.ports import free_port_on_all
from tests.unit.worker.conftest import WorkerFactory


class FakeSource(worker_pb2_grpc.WorkerKvServicer):
    """A prefill worker's WorkerKv service: answers KvEndpoint with `endpoint`."""

    def __init__(self, endpoint: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.calls = 0

    async def KvEndpoint(  # noqa: N802
        self, request: worker_pb2.KvEndpointRequest, context: Any
    ) -> worker_pb2.KvEndpointResponse:
        self.calls += 1
        return worker_pb2.KvEndpointResponse(
            transport="nixl", params_json=json.dumps(self.endpoint)
        )

    async def WarmKv(  # noqa: N802
        self, request: worker_pb2.WarmKvRequest, context: Any
    ) -> worker_pb2.WarmKvResponse:
        return worker_pb2.WarmKvResponse()


@pytest.fixture
async def source() -> AsyncIterator[tuple[FakeSource, str]]:
    fake = FakeSource({"engine_id": "engine-a", "host": "127.0.0.1", "port": 5601, "tp_size": 1})
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerKvServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield fake, f"127.0.0.1:{port}"
    await server.stop(None)


@pytest.fixture
async def release() -> AsyncIterator[_ReleaseClient]:
    client = _ReleaseClient()
    yield client
    await client.close()


def _handle(address: str, **params: Any) -> KvHandle:
    kvp = {
        "remote_engine_id": "engine-a",
        "remote_host": "127.0.0.1",
        "remote_port": 5601,
        "remote_block_ids": [0, 1],
        "remote_request_id": "r1",
    }
    kvp.update(params)
    return KvHandle("nixl", address, RequestId("r1"), num_tokens=20, params=kvp)


def test_endpoint_mismatch_names_the_parameter() -> None:
    ep = {"engine_id": "e", "host": "10.0.0.5", "port": 5600}
    ok = {"remote_engine_id": "e", "remote_host": "10.0.0.5", "remote_port": 5600}
    assert endpoint_mismatch(ok, ep) is None
    assert "remote_host" in (endpoint_mismatch({**ok, "remote_host": "169.254.169.254"}, ep) or "")
    assert "remote_port" in (endpoint_mismatch({**ok, "remote_port": 22}, ep) or "")
    assert "remote_engine_id" in (endpoint_mismatch({**ok, "remote_engine_id": "x"}, ep) or "")
    assert endpoint_mismatch({"remote_host": "10.0.0.5"}, ep) == "kv.params has no remote_engine_id"


async def test_the_sources_own_endpoint_passes_and_is_cached(
    source: tuple[FakeSource, str], release: _ReleaseClient
) -> None:
    fake, address = source
    sources = KvSources(release.channel)
    assert await sources.problem(_handle(address)) is None
    assert await sources.problem(_handle(address)) is None
    assert fake.calls == 1  # asked once, then remembered


@pytest.mark.parametrize(
    "forged",
    [{"remote_host": "169.254.169.254"}, {"remote_port": 22}, {"remote_engine_id": "other"}],
    ids=lambda f: next(iter(f)),
)
async def test_a_forged_nixl_endpoint_is_refused(
    source: tuple[FakeSource, str], release: _ReleaseClient, forged: dict[str, Any]
) -> None:
    _fake, address = source
    sources = KvSources(release.channel)
    problem = await sources.problem(_handle(address, **forged))
    assert problem is not None
    assert next(iter(forged)) in problem


async def test_a_restarted_source_is_asked_again(
    source: tuple[FakeSource, str], release: _ReleaseClient
) -> None:
    fake, address = source
    sources = KvSources(release.channel)
    sources.learn(address, {"engine_id": "engine-old", "host": "127.0.0.1", "port": 5601})
    assert await sources.problem(_handle(address)) is None  # engine-a now: re-checked, fine
    assert fake.calls == 1
    assert await sources.problem(_handle(address)) is None
    assert fake.calls == 1


async def test_a_source_that_does_not_answer_is_refused(release: _ReleaseClient) -> None:
    sources = KvSources(release.channel)
    problem = await sources.problem(_handle(f"127.0.0.1:{free_port_on_all(['127.0.0.1'])}"))
    assert problem is not None
    assert "did not confirm its KV endpoint (UNAVAILABLE" in problem


async def test_other_transports_carry_no_endpoint(release: _ReleaseClient) -> None:
    sources = KvSources(release.channel)
    kv = KvHandle("sim", "127.0.0.1:1", RequestId("r1"), num_tokens=4)
    assert await sources.problem(kv) is None
    assert len(sources) == 0


def test_the_cache_is_bounded() -> None:
    sources = KvSources(lambda _a: None, max_sources=2)
    for i in range(5):
        sources.learn(f"10.0.0.{i}:50051", {"engine_id": str(i)})
    assert len(sources) == 2
    with pytest.raises(ValueError, match="max_sources"):
        KvSources(lambda _a: None, max_sources=0)


async def test_decode_with_a_forged_endpoint_is_aborted_before_anything_is_counted(
    make_worker: WorkerFactory, source: tuple[FakeSource, str], release: _ReleaseClient
) -> None:
    _fake, address = source
    d = await make_worker(Role.DECODE)
    d.service.kv_sources = KvSources(release.channel)
    prompt = list(range(20, 40))
    kv = _handle(address, remote_host="169.254.169.254")
    call = d.stub.Decode(
        worker_pb2.DecodeRequest(
            request_id="forged",
            prompt_token_ids=prompt,
            first_token_id=7,
            sampling=common_pb2.SamplingParams(max_tokens=4),
            kv=common_pb2.KvHandle(
                transport=kv.transport,
                source_address=kv.source_address,
                source_request_id=kv.source_request_id,
                num_tokens=kv.num_tokens,
                params_json=json.dumps(dict(kv.params or {})),
            ),
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.ABORTED
    assert "remote_host" in (info.value.details() or "")
    assert d.sample("splitserve_worker_kv_transfer_bytes_total") == 0

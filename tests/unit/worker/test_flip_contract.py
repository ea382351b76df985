"""The flip protocol between the operator's worker client and a real worker.

fence (router side) -> drain -> SetRole -> relabel (Kubernetes side) -> unfence: here the worker
half, with the operator's own `GrpcWorkerClient` against a real simulated worker. In-flight work
finishes under the old role, nothing new is accepted while draining, the new role takes effect
without a restart, and resume re-opens the worker.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.roles import Role
from splitserve.operator.workers import GrpcWorkerClient
from tests.unit.worker.conftest import WorkerFactory
from tests.unit.worker.test_server import PROMPT, collect, sampling


async def test_drain_set_role_resume_against_a_real_worker(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.DECODE, sim_time_scale=0.5)
    client = GrpcWorkerClient()
    call = w.stub.Generate(
        worker_pb2.GenerateRequest(request_id="old", prompt_token_ids=PROMPT, sampling=sampling(40))
    )
    await call.read()  # in flight under the old role
    assert await asyncio.to_thread(client.load, w.address) == 1

    in_flight = await asyncio.to_thread(client.drain, w.address, timeout_s=30)
    assert in_flight == 0  # drain waited for the request to finish
    tokens, reasons = await collect(call)
    assert reasons[-1] == common_pb2.FINISH_REASON_LENGTH
    assert len(tokens) == 39  # the rest of the 40, none lost

    refused = w.stub.Generate(
        worker_pb2.GenerateRequest(request_id="new", prompt_token_ids=PROMPT, sampling=sampling())
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(refused)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    await asyncio.to_thread(client.set_role, w.address, Role.PREFILL)
    await asyncio.to_thread(client.resume, w.address)
    report = w.service.load_report()
    assert report.role == common_pb2.ROLE_PREFILL
    assert not report.draining
    pre = await w.stub.Prefill(
        worker_pb2.PrefillRequest(request_id="p", prompt_token_ids=PROMPT, sampling=sampling())
    )
    assert pre.kv.num_tokens == len(PROMPT)
    assert w.sample("splitserve_worker_role_changes_total") == 1


async def test_drain_times_out_with_work_still_in_flight(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED, sim_time_scale=1.0)
    call = w.stub.Generate(
        worker_pb2.GenerateRequest(
            request_id="long", prompt_token_ids=PROMPT, sampling=sampling(2000)
        )
    )
    await call.read()
    in_flight = await asyncio.to_thread(GrpcWorkerClient().drain, w.address, timeout_s=0.2)
    assert in_flight == 1
    call.cancel()

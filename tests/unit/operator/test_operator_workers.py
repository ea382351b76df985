"""GrpcWorkerClient against a real gRPC server implementing the Worker calls the operator uses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.roles import Role
from splitserve.operator.workers import GrpcWorkerClient, WorkerCallError


class Worker(worker_pb2_grpc.WorkerServicer):
    def __init__(self) -> None:
        self.role = common_pb2.ROLE_PREFILL
        self.draining = False
        self.in_flight = 2

    def Drain(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.draining = not request.resume
        return worker_pb2.DrainResponse(draining=self.draining, in_flight=self.in_flight)

    def SetRole(self, request: Any, context: Any) -> Any:  # noqa: N802
        previous, self.role = self.role, request.role
        return worker_pb2.SetRoleResponse(previous=previous, current=self.role)

    def WatchLoad(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        for _ in range(100):  # bounded: a stuck stream must not keep the server thread alive
            if not context.is_active():
                return
            yield common_pb2.LoadReport(num_waiting=3, num_running=1)
            time.sleep(0.05)


@pytest.fixture
def worker() -> Iterator[tuple[Worker, str]]:
    servicer = Worker()  # type: ignore[abstract]  # only the calls the operator makes
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=0).wait(5)


def test_drain_set_role_resume_load(worker: tuple[Worker, str]) -> None:
    servicer, address = worker
    client = GrpcWorkerClient()
    assert client.drain(address, timeout_s=0.1) == 2
    assert servicer.draining
    client.set_role(address, Role.DECODE)
    assert servicer.role == common_pb2.ROLE_DECODE
    client.resume(address)
    assert not servicer.draining
    assert client.load(address) == 4


def test_unreachable_worker_is_a_worker_call_error() -> None:
    with pytest.raises(WorkerCallError):
        GrpcWorkerClient().set_role("127.0.0.1:1", Role.DECODE)

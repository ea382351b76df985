"""The operator's calls to workers during a flip: Drain and SetRole over gRPC."""

from __future__ import annotations

from typing import Final, Protocol

from splitserve.core.errors import SplitserveError
from splitserve.core.roles import Role

RPC_TIMEOUT_S: Final = 10.0


class WorkerCallError(SplitserveError):
    """A worker did not answer a Drain or SetRole; the flip step is retried on the next tick."""


class WorkerClient(Protocol):
    def drain(self, address: str, *, timeout_s: float) -> int:
        """Stop new work; wait up to `timeout_s` for in-flight work. Returns what is in flight."""
        ...

    def resume(self, address: str) -> None:
        """Accept new work again."""
        ...

    def set_role(self, address: str, role: Role) -> None: ...

    def load(self, address: str) -> int:
        """Requests waiting or running on the worker (its next load report)."""
        ...


class GrpcWorkerClient:
    """`splitserve.v1.Worker` over insecure gRPC (workers listen on the pod network)."""

    def _stub(self, address: str) -> tuple[object, object]:

        from splitserve._gen.v1 import worker_pb2_grpc
        from splitserve.security import tls

        channel = tls.sync_channel(address)
        return channel, worker_pb2_grpc.WorkerStub(channel)

    def _call(self, address: str, method: str, request: object, timeout_s: float) -> object:
        import grpc

        channel, stub = self._stub(address)
        try:
            return getattr(stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as err:
            raise WorkerCallError(f"{method} {address}: {err}") from err
        finally:
            channel.close()  # type: ignore[attr-defined]

    def drain(self, address: str, *, timeout_s: float) -> int:
        from splitserve._gen.v1 import worker_pb2

        request = worker_pb2.DrainRequest(wait=True, timeout_s=timeout_s)
        response = self._call(address, "Drain", request, timeout_s + RPC_TIMEOUT_S)
        assert isinstance(response, worker_pb2.DrainResponse)
        return int(response.in_flight)

    def resume(self, address: str) -> None:
        from splitserve._gen.v1 import worker_pb2

        self._call(address, "Drain", worker_pb2.DrainRequest(resume=True), RPC_TIMEOUT_S)

    def set_role(self, address: str, role: Role) -> None:
        from splitserve._gen.v1 import common_pb2, worker_pb2

        wire = {
            Role.PREFILL: common_pb2.ROLE_PREFILL,
            Role.DECODE: common_pb2.ROLE_DECODE,
            Role.MIXED: common_pb2.ROLE_MIXED,
        }[role]
        self._call(address, "SetRole", worker_pb2.SetRoleRequest(role=wire), RPC_TIMEOUT_S)

    def load(self, address: str) -> int:
        import grpc

        from splitserve._gen.v1 import worker_pb2

        channel, stub = self._stub(address)
        try:
            stream = stub.WatchLoad(  # type: ignore[attr-defined]
                worker_pb2.WatchLoadRequest(interval_s=0.1), timeout=RPC_TIMEOUT_S
            )
            for report in stream:
                stream.cancel()
                return int(report.num_waiting) + int(report.num_running)
        except grpc.RpcError as err:
            raise WorkerCallError(f"WatchLoad {address}: {err}") from err
        finally:
            channel.close()  # type: ignore[attr-defined]
        raise WorkerCallError(f"WatchLoad {address}: no report")

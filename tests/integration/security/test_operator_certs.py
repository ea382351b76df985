"""The certificates the operator issues (`operator.certs`), used by real processes.

The operator's `Pki` writes each service's `kubernetes.io/tls` Secrets into an in-memory API
server; the test writes them out as the kubelet would mount them and starts a real worker with
them and a plaintext health port (kubelet's gRPC probe). Checked: the probe port answers health
and nothing else; the operator's own identity may call `SetRole`; a router of the same service
may `Generate`; a router of another service signed by the same CA is refused.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.fakes.kube import MemoryKube
from tests.integration.processes import ready, spawn

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.operator import certs, render

pytestmark = pytest.mark.integration

NS = "ml"
NOW = dt.datetime.now(dt.UTC)


def _mount(kube: MemoryKube, name: str, directory: Path) -> Path:
    """The Secret's keys as files, as the kubelet mounts a secret volume."""
    secret = kube.get("v1", "Secret", NS, name)
    assert secret is not None
    assert secret["type"] == "kubernetes.io/tls"
    directory.mkdir(parents=True)
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("certs")
    kube = MemoryKube()
    pki = certs.Pki.load_or_create(kube, NS, root / "operator", NOW)
    mine = render.ServiceRef("s", NS, "uid-s")
    other = render.ServiceRef("t", NS, "uid-t")
    assert pki.ensure(kube, mine, NOW) == [
        "created Secret s-tls-router",
        "created Secret s-tls-worker",
    ]
    pki.ensure(kube, other, NOW)
    dirs = {
        "worker": _mount(kube, "s-tls-worker", root / "worker"),
        "router": _mount(kube, "s-tls-router", root / "router"),
        "other-router": _mount(kube, "t-tls-router", root / "other-router"),
        "operator": root / "operator",
    }
    args = ["worker", "serve", "--sim-time-scale", "0", "--log-level", "WARNING"]
    args += ["--health-port", "0", "--ready-file", str(root / "worker.json")]
    env = {**os.environ, "SPLITSERVE_TLS_DIR": str(dirs["worker"])}
    proc = spawn(args, root / "worker.log", env)
    try:
        info = ready(root / "worker.json", proc)
        yield {"address": info["address"], "health": info["health_port"], "dirs": dirs}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _channel(address: str, directory: Path) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        (directory / "ca.crt").read_bytes(),
        (directory / "tls.key").read_bytes(),
        (directory / "tls.crt").read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", "worker.splitserve.internal")]
    return grpc.secure_channel(address, creds, options=options)


def _code(call: object) -> grpc.StatusCode:
    try:
        if callable(call):
            call()
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_probe_port_is_plaintext_health_only(cluster: dict[str, object]) -> None:
    address = f"127.0.0.1:{cluster['health']}"
    with grpc.insecure_channel(address) as ch:
        answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        stub = worker_pb2_grpc.WorkerStub(ch)
        request = worker_pb2.SetRoleRequest(role=common_pb2.ROLE_MIXED)
        assert _code(lambda: stub.SetRole(request, timeout=10)) == grpc.StatusCode.UNIMPLEMENTED
    # The gRPC port itself takes no plaintext client.
    with grpc.insecure_channel(str(cluster["address"])) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        request = worker_pb2.SetRoleRequest(role=common_pb2.ROLE_MIXED)
        assert _code(lambda: stub.SetRole(request, timeout=10)) == grpc.StatusCode.UNAVAILABLE


def _generate(address: str, directory: Path) -> grpc.StatusCode:
    request = worker_pb2.GenerateRequest(request_id="r-cert", prompt_token_ids=[1, 2, 3])
    request.sampling.max_tokens = 2
    with _channel(address, directory) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        return _code(lambda: list(stub.Generate(request, timeout=20)))


def test_operator_and_own_router_are_served_another_services_router_is_not(
    cluster: dict[str, object],
) -> None:
    address = str(cluster["address"])
    dirs: dict[str, Path] = cluster["dirs"]  # type: ignore[assignment]
    with _channel(address, dirs["operator"]) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        request = worker_pb2.SetRoleRequest(role=common_pb2.ROLE_MIXED)
        assert _code(lambda: stub.SetRole(request, timeout=10)) == grpc.StatusCode.OK
    assert _generate(address, dirs["router"]) == grpc.StatusCode.OK
    assert _generate(address, dirs["other-router"]) == grpc.StatusCode.PERMISSION_DENIED

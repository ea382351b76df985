"""Issue 19 items 1, 2 and 7 with real processes: a worker serving mutual TLS with per-method
role checks, a router in front of it with an API key.

Refusals checked: a plaintext client, a client with another CA's certificate, a router
certificate calling `SetRole`, a worker certificate calling `Generate`; the operator's
certificate may call `SetRole`, the router's `Generate`; the worker's certificate rotates (a new
CA) without a restart; the router serves a chat through the worker only with the key.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.security.ca import Authority, local_pki

pytestmark = pytest.mark.integration

KEY = "sk-integration-0123456789"
NOW = dt.datetime.now(dt.UTC)


def _start(argv: list[str], ready: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitserve", *argv, "--ready-file", str(ready)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"{argv[0]} exited early:\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{argv[0]} did not become ready")
        time.sleep(0.1)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("tls")
    pki = local_pki(root / "pki", "local", now=NOW)
    worker = _start(
        ["worker", "serve", "--role", "mixed", "--sim-time-scale", "0", "--log-level", "WARNING"],
        root / "worker.json",
        {"SPLITSERVE_TLS_DIR": str(pki["worker"])},
    )
    procs = [worker]
    try:
        address = json.loads((root / "worker.json").read_text())["address"]
        router = _start(
            [
                "router",
                "serve",
                "--worker",
                address,
                "--port",
                "0",
                "--grpc-port",
                "0",
                "--tls-dir",
                str(pki["router"]),
                "--log-level",
                "WARNING",
            ],
            root / "router.json",
            {"SPLITSERVE_API_KEY": KEY},
        )
        procs.append(router)
        port = json.loads((root / "router.json").read_text())["port"]
        yield {"root": root, "pki": pki, "address": address, "router": f"http://127.0.0.1:{port}"}
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _creds(directory: Path) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        (directory / "ca.crt").read_bytes(),
        (directory / "tls.key").read_bytes(),
        (directory / "tls.crt").read_bytes(),
    )


def _channel(address: str, directory: Path | None) -> grpc.Channel:
    if directory is None:
        return grpc.insecure_channel(address)
    options = [("grpc.ssl_target_name_override", "worker.splitserve.internal")]
    return grpc.secure_channel(address, _creds(directory), options=options)


def _set_role(address: str, directory: Path | None) -> grpc.StatusCode:
    with _channel(address, directory) as ch:
        try:
            worker_pb2_grpc.WorkerStub(ch).SetRole(
                worker_pb2.SetRoleRequest(role=common_pb2.ROLE_MIXED), timeout=10
            )
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def _generate(address: str, directory: Path) -> grpc.StatusCode:
    request = worker_pb2.GenerateRequest(request_id="r-1", prompt_token_ids=[1, 2, 3])
    request.sampling.max_tokens = 2
    with _channel(address, directory) as ch:
        try:
            list(worker_pb2_grpc.WorkerStub(ch).Generate(request, timeout=20))
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def test_plaintext_and_foreign_ca_clients_are_refused(
    stack: dict[str, object], tmp_path: Path
) -> None:
    address = str(stack["address"])
    assert _set_role(address, None) == grpc.StatusCode.UNAVAILABLE
    other = Authority.create("other", now=NOW).write_identity(
        tmp_path / "other", "local", "operator", now=NOW
    )
    assert _set_role(address, other) == grpc.StatusCode.UNAVAILABLE


def test_each_method_checks_the_callers_role(stack: dict[str, object]) -> None:
    address = str(stack["address"])
    pki: dict[str, Path] = stack["pki"]  # type: ignore[assignment]
    assert _set_role(address, pki["router"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _set_role(address, pki["worker"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _set_role(address, pki["operator"]) == grpc.StatusCode.OK
    assert _generate(address, pki["worker"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _generate(address, pki["operator"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _generate(address, pki["router"]) == grpc.StatusCode.OK


def test_router_serves_through_the_mtls_worker_only_with_a_key(stack: dict[str, object]) -> None:
    url = f"{stack['router']}/v1/completions"
    body = {"model": "splitserve-sim", "prompt": "hello", "max_tokens": 3}
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    r = httpx.post(url, json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


def _decode(address: str, directory: Path, kv: common_pb2.KvHandle) -> grpc.RpcError | None:
    request = worker_pb2.DecodeRequest(
        request_id="d-1", prompt_token_ids=[1, 2, 3], first_token_id=7, kv=kv
    )
    request.sampling.max_tokens = 2
    with _channel(address, directory) as ch:
        try:
            list(worker_pb2_grpc.WorkerStub(ch).Decode(request, timeout=20))
        except grpc.RpcError as err:
            return err
    return None


def _kv_bytes(stack: dict[str, object]) -> float:
    port = json.loads((Path(str(stack["root"])) / "worker.json").read_text())["metrics_port"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("splitserve_worker_kv_transfer_bytes_total "):
            return float(line.split()[1])
    return 0.0


def test_oversized_kv_handle_is_refused(stack: dict[str, object]) -> None:
    pki: dict[str, Path] = stack["pki"]  # type: ignore[assignment]
    before = _kv_bytes(stack)
    for kv in (
        common_pb2.KvHandle(
            transport="sim", source_address="127.0.0.1:1", source_request_id="x",
            num_tokens=3, num_bytes=10**18,
        ),
        common_pb2.KvHandle(
            transport="sim", source_address="127.0.0.1:1", source_request_id="x",
            num_tokens=100_000, num_bytes=1,
        ),
    ):  # fmt: skip
        err = _decode(str(stack["address"]), pki["router"], kv)
        assert err is not None
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "kv.num_" in str(err.details())
    assert _kv_bytes(stack) == before


def test_forged_kv_source_gets_no_request(stack: dict[str, object]) -> None:
    """A handle naming a listener that is no worker: the decode worker connects only with TLS
    and must see a worker certificate, so the listener receives a TLS ClientHello, never an
    HTTP/2 request, and the decode fails."""
    pki: dict[str, Path] = stack["pki"]  # type: ignore[assignment]
    received: list[bytes] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(20)

    def accept() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    received.append(conn.recv(4096))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    kv = common_pb2.KvHandle(
        transport="sim",
        source_address=f"127.0.0.1:{listener.getsockname()[1]}",
        source_request_id="victim",
        num_tokens=3,
        num_bytes=3,
    )
    try:
        err = _decode(str(stack["address"]), pki["router"], kv)
    finally:
        thread.join(25)
        listener.close()
    assert err is not None
    assert err.code() == grpc.StatusCode.ABORTED
    assert received
    assert not received[0].startswith(b"PRI * HTTP/2.0")
    assert received[0][:1] == b"\x16"  # a TLS handshake record


# Last: it replaces the worker's CA, which the earlier tests' certificates come from.
def test_worker_certificate_rotates_without_a_restart(
    stack: dict[str, object], tmp_path: Path
) -> None:
    """A new CA: the worker's files are replaced in place; new handshakes use them."""
    address = str(stack["address"])
    pki: dict[str, Path] = stack["pki"]  # type: ignore[assignment]
    new_ca = Authority.create("rotated", now=NOW)
    operator = new_ca.write_identity(tmp_path / "operator", "local", "operator", now=NOW)
    assert _set_role(address, operator) == grpc.StatusCode.UNAVAILABLE
    new_ca.write_identity(pki["worker"], "local", "worker", now=NOW)
    deadline = time.monotonic() + 20
    code = grpc.StatusCode.UNAVAILABLE
    while code != grpc.StatusCode.OK and time.monotonic() < deadline:
        time.sleep(0.5)
        code = _set_role(address, operator)
    assert code == grpc.StatusCode.OK
    assert _set_role(address, pki["operator"]) == grpc.StatusCode.UNAVAILABLE

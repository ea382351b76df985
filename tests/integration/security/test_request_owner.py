"""Workers scope Cancel and ReleaseKv to the caller that started the request (real processes).

Two router certificates of the same CA and service (two keys): the second cannot cancel the
first one's stream nor free the KV its prefill holds; it gets `found: false`, the answer for an
unknown id. The owner can do both.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.integration.processes import ready, spawn

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.security.ca import Authority

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("owner")
    ca = Authority.create("local", now=NOW)
    dirs = {
        name: ca.write_identity(root / name, "local", role, now=NOW)
        for name, role in (("worker", "worker"), ("a", "router"), ("b", "router"))
    }
    # Real-time simulated engine: a long generation stays open until it is cancelled.
    args = ["worker", "serve", "--role", "mixed", "--log-level", "WARNING"]
    args += ["--sim-max-model-len", "100000", "--ready-file", str(root / "worker.json")]
    env = {**os.environ, "SPLITSERVE_TLS_DIR": str(dirs["worker"])}
    proc = spawn(args, root / "worker.log", env)
    try:
        info = ready(root / "worker.json", proc)
        yield {"address": info["address"], "dirs": dirs}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _stub(address: str, directory: Path) -> tuple[grpc.Channel, worker_pb2_grpc.WorkerStub]:
    creds = grpc.ssl_channel_credentials(
        (directory / "ca.crt").read_bytes(),
        (directory / "tls.key").read_bytes(),
        (directory / "tls.crt").read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", "worker.splitserve.internal")]
    channel = grpc.secure_channel(address, creds, options=options)
    return channel, worker_pb2_grpc.WorkerStub(channel)


def test_another_router_cannot_cancel_the_owners_stream(worker: dict[str, object]) -> None:
    address = str(worker["address"])
    dirs: dict[str, Path] = worker["dirs"]  # type: ignore[assignment]
    ch_a, a = _stub(address, dirs["a"])
    ch_b, b = _stub(address, dirs["b"])
    with ch_a, ch_b:
        request = worker_pb2.GenerateRequest(request_id="owned-1", prompt_token_ids=[1, 2, 3])
        request.sampling.max_tokens = 50_000
        stream = a.Generate(request, timeout=120)
        first = next(stream)  # the request is running: it holds until cancelled
        assert first.request_id == "owned-1"
        refused = b.Cancel(worker_pb2.CancelRequest(request_id="owned-1"), timeout=10)
        assert not refused.found
        unknown = b.Cancel(worker_pb2.CancelRequest(request_id="no-such-id"), timeout=10)
        assert refused == unknown  # nothing tells B whether the id is in flight
        more = next(stream)  # still streaming to A
        assert more.request_id == "owned-1"
        done = a.Cancel(worker_pb2.CancelRequest(request_id="owned-1"), timeout=10)
        assert done.found
        stream.cancel()


def test_another_router_cannot_release_the_owners_kv(worker: dict[str, object]) -> None:
    address = str(worker["address"])
    dirs: dict[str, Path] = worker["dirs"]  # type: ignore[assignment]
    ch_a, a = _stub(address, dirs["a"])
    ch_b, b = _stub(address, dirs["b"])
    with ch_a, ch_b:
        request = worker_pb2.PrefillRequest(request_id="owned-kv", prompt_token_ids=[1, 2, 3, 4])
        request.sampling.max_tokens = 4
        out = a.Prefill(request, timeout=60)
        assert out.HasField("kv")
        release = worker_pb2.ReleaseKvRequest(request_id="owned-kv")
        assert not b.ReleaseKv(release, timeout=10).found
        assert a.ReleaseKv(release, timeout=10).found
        assert not a.ReleaseKv(release, timeout=10).found  # freed once

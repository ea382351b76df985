"""Two router processes on one stack (issue 17 item 3, issue 12 item 4): `splitserve router serve
--processes 2` shares the ports with SO_REUSEPORT; a router process that dies is replaced while
the other keeps serving, and SIGTERM drains both (an in-flight stream finishes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.processes import ready, spawn, stop

pytestmark = pytest.mark.integration

MODEL = "splitserve-sim"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[dict[str, Any], subprocess.Popen[bytes]]]:
    env = {**os.environ, "SPLITSERVE_CACHE_DIR": str(tmp_path / "cache")}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        worker = spawn(
            ["worker", "serve", "--role", "mixed", "--sim-time-scale", "0.2",
             "--port", "0", "--metrics-port", "0", "--ready-file", str(tmp_path / "w.json")],
            tmp_path / "worker.log",
            env,
        )  # fmt: skip
        procs.append(worker)
        address = ready(tmp_path / "w.json", worker)["address"]
        router = spawn(
            ["router", "serve", "--worker", address, "--port", "0", "--grpc-port", "0",
             "--processes", "2", "--ready-file", str(tmp_path / "r.json")],
            tmp_path / "router.log",
            env,
        )  # fmt: skip
        procs.append(router)
        yield ready(tmp_path / "r.json", router), router
    finally:
        for proc in reversed(procs):
            stop(proc)


def _complete(base: str, **extra: Any) -> dict[str, Any]:
    # A new connection per request, so the kernel spreads them over both processes.
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4, **extra}
    with httpx.Client(timeout=30) as client:
        r = client.post(f"{base}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def test_two_router_processes_share_the_port_survive_a_death_and_drain(
    stack: tuple[dict[str, Any], subprocess.Popen[bytes]],
) -> None:
    info, supervisor = stack
    base = f"http://127.0.0.1:{info['port']}"
    assert len(info["pids"]) == 2
    for _ in range(8):
        assert _complete(base)["usage"]["completion_tokens"] == 4

    os.kill(info["pids"][0], signal.SIGKILL)  # one process dies: the other keeps serving
    for _ in range(8):
        assert _complete(base)["choices"][0]["finish_reason"] == "length"

    # SIGTERM drains: a stream already under way finishes, with its finish reason.
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 200, "stream": True}
    events: list[str] = []
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{base}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                events.append(line[6:])
                break
        supervisor.send_signal(signal.SIGTERM)
        events += [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert supervisor.wait(60) == 0


def _two_free_ports() -> int:
    """A port P with P + 1 free as well (bound and released: another process may take them in
    between, which only makes the test fail loudly)."""
    import socket

    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


def test_each_process_serves_its_own_metrics_port(tmp_path: Path) -> None:
    """`--processes 2 --metrics-port P`: process i on P + i. Before, both bound P and the second
    process failed to start ("Address already in use"), so the router never came up."""
    env = {**os.environ, "SPLITSERVE_CACHE_DIR": str(tmp_path / "cache")}
    port = _two_free_ports()
    router = spawn(
        ["router", "serve", "--port", "0", "--grpc-port", "0", "--processes", "2",
         "--metrics-port", str(port), "--ready-file", str(tmp_path / "r.json")],
        tmp_path / "router.log",
        env,
    )  # fmt: skip
    try:
        info = ready(tmp_path / "r.json", router)
        assert info["metrics_ports"] == [port, port + 1]
        assert len(info["pids"]) == 2
        for p in info["metrics_ports"]:
            r = httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=10)
            assert r.status_code == 200
            assert "splitserve_router_" in r.text
    finally:
        stop(router)

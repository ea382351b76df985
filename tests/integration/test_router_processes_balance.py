"""Placement stays balanced with two router processes (issue 17 item 3).

The burst of the SLO-router test (200 simultaneous requests on 2 prefill + 2 decode workers,
45-55 % on each) against `splitserve router serve --processes 2`: each process reserves in its
own ledger and sees the other's work only through the workers' load reports, and the burst,
each request on a new connection so the kernel spreads them over both processes, still splits
evenly. Real processes throughout.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.processes import counted, ready, spawn

pytestmark = pytest.mark.integration

MODEL = "splitserve-sim"


def _decode_requests_ok(metrics_port: int, kind: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).text
    pattern = (
        r'^splitserve_worker_requests_total\{[^}]*kind="' + kind + r'"[^}]*outcome="ok"[^}]*\}'
        r" ([0-9.e+]+)$"
    )
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _requests_ok(workers: list[dict[str, Any]], kind: str) -> list[float]:
    return [_decode_requests_ok(w["metrics_port"], kind) for w in workers]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    env = {**os.environ, "SPLITSERVE_CACHE_DIR": str(tmp_path / "cache")}
    procs: list[subprocess.Popen[bytes]] = []
    workers: list[dict[str, Any]] = []
    try:
        for i, role in enumerate(["prefill", "prefill", "decode", "decode"]):
            ready_file = tmp_path / f"w{i}.json"
            proc = spawn(
                ["worker", "serve", "--role", role, "--sim-time-scale", "0.01", "--port", "0",
                 "--metrics-port", "0", "--ready-file", str(ready_file)],
                tmp_path / f"worker{i}.log",
                env,
            )  # fmt: skip
            procs.append(proc)
            workers.append(ready(ready_file, proc))
        args = ["router", "serve", "--port", "0", "--grpc-port", "0", "--processes", "2",
                "--ready-file", str(tmp_path / "r.json")]  # fmt: skip
        for w in workers:
            args += ["--worker", w["address"]]
        router = spawn(args, tmp_path / "router.log", env)
        procs.append(router)
        yield ready(tmp_path / "r.json", router), workers
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


async def _burst(base: str, count: int) -> list[int]:
    # No keep-alive: every request opens its own connection, which the kernel hands to either
    # router process (SO_REUSEPORT).
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4}
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        replies = await asyncio.gather(
            *(client.post(f"{base}/v1/completions", json=body) for _ in range(count))
        )
    return [r.status_code for r in replies]


def test_burst_splits_evenly_with_two_router_processes(
    stack: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    info, workers = stack
    assert len(info["pids"]) == 2
    statuses = asyncio.run(_burst(f"http://127.0.0.1:{info['port']}", 200))
    assert statuses == [200] * 200
    for kind, group in (("prefill", workers[:2]), ("decode", workers[2:])):
        counts = counted(partial(_requests_ok, group, kind), 200)
        assert sum(counts) == 200, (kind, counts)
        for n in counts:
            assert 0.45 * 200 <= n <= 0.55 * 200, (kind, counts)

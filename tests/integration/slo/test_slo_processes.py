"""The SLO router with real processes: `splitserve worker serve` and `splitserve router serve`
as separate OS processes over loopback (as `splitserve up` runs them), driven over HTTP.

* a burst of 200 simultaneous requests on 2 prefill + 2 decode workers lands 45-55 % on each
  decode worker and on each prefill worker (reservations at decision time: no herding);
* admission by class: with a full pool, non-sheddable (high-priority) requests are queued and
  served, sheddable ones are answered 429 with `Retry-After` and an OpenAI-style body;
* classes from the `x-slo-class` header (an unknown class is a 400 naming the header; none: the
  default class), counted per class;
* `router.disaggregation` from the config file decides the path, counted by path and reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.processes import counted

pytestmark = pytest.mark.integration

MODEL = "splitserve-sim"


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {**os.environ, "SPLITSERVE_CACHE_DIR": str(tmp / "cache")}
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, args: list[str]) -> dict[str, Any]:
        ready = self.tmp / f"{name}.json"
        with (self.tmp / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "splitserve", *args, "--ready-file", str(ready)],
                stdout=out,
                stderr=out,
                env=self.env,
            )
        self.procs.append(proc)
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"{name} not ready"
            time.sleep(0.1)
        info: dict[str, Any] = json.loads(ready.read_text())
        return info

    def worker(self, name: str, role: str, time_scale: float) -> dict[str, Any]:
        return self.spawn(
            name,
            ["worker", "serve", "--role", role, "--sim-time-scale", str(time_scale),
             "--port", "0", "--metrics-port", "0"],
        )  # fmt: skip

    def router(self, workers: list[dict[str, Any]], slo: dict[str, Any] | None = None) -> str:
        args = ["router", "serve", "--port", "0", "--grpc-port", "0"]
        for w in workers:
            args += ["--worker", w["address"]]
        if slo is not None:
            path = self.tmp / "slo.yaml"
            path.write_text(yaml.safe_dump(slo))
            args += ["--slo-config", str(path)]
        info = self.spawn("router", args)
        base = f"http://127.0.0.1:{info['port']}"
        # Ready once every worker's load stream is up (the endpoints gauge).
        deadline = time.monotonic() + 60
        while _ready_endpoints(base) < len(workers):
            assert time.monotonic() < deadline, "router never saw every worker ready"
            time.sleep(0.2)
        return base

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _metrics(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url, timeout=10).text
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _sample(url: str, name: str, **labels: str) -> float:
    return _metrics(url).get((name, frozenset(labels.items())), 0.0)


def _ready_endpoints(base: str) -> float:
    try:
        m = _metrics(f"{base}/metrics")
    except httpx.HTTPError:
        return 0.0
    return sum(
        v
        for (name, labels), v in m.items()
        if name == "splitserve_router_endpoints" and ("state", "ready") in labels
    )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hello there", "max_tokens": 4, **extra}


def _worker_count(w: dict[str, Any], kind: str) -> float:
    return _sample(
        f"http://127.0.0.1:{w['metrics_port']}/metrics",
        "splitserve_worker_requests_total",
        kind=kind,
        outcome="ok",
    )


def _worker_counts(ws: list[dict[str, Any]], kind: str) -> list[float]:
    return [_worker_count(w, kind) for w in ws]


def test_burst_of_200_splits_evenly_across_worker_processes(stack: Stack) -> None:
    ps = [stack.worker(f"p{i}", "prefill", 0.01) for i in range(2)]
    ds = [stack.worker(f"d{i}", "decode", 0.01) for i in range(2)]
    base = stack.router([*ps, *ds])

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=180, limits=limits) as client:
            replies = await asyncio.gather(
                *(client.post(f"{base}/v1/completions", json=_body()) for _ in range(200))
            )
        return [r.status_code for r in replies]

    assert asyncio.run(burst()) == [200] * 200
    for kind, workers in (("decode", ds), ("prefill", ps)):
        counts = counted(partial(_worker_counts, workers, kind), 200)
        assert sum(counts) == 200, (kind, counts)
        for n in counts:
            assert 0.45 * 200 <= n <= 0.55 * 200, (kind, counts)


def test_full_pool_queues_the_unsheddable_and_sheds_the_sheddable(stack: Stack) -> None:
    w = stack.worker("w", "mixed", 0.5)
    slo = {
        "sloClasses": [
            {"name": "interactive", "ttftMs": 5000, "tpotMs": 1000, "priority": 10},
            {"name": "batch", "ttftMs": 50, "tpotMs": 1000, "sheddable": True},
        ],
        "router": {"maxOutstandingPerWorker": 1},
    }
    base = stack.router([w], slo)
    url = f"{base}/v1/completions"

    async def run() -> tuple[int, list[httpx.Response]]:
        # The head request holds the only slot for as long as its stream stays open (a long
        # completion, closed by the client once the others are in: a short head could finish
        # on a slow machine before the batch requests arrive and leave them room).
        async with httpx.AsyncClient(timeout=180) as client:
            async with client.stream(
                "POST", url, json=_body(max_tokens=2000, stream=True, ignore_eos=True)
            ) as head:
                lines = head.aiter_lines()  # held: a dropped iterator closes the stream
                async for line in lines:
                    if line.startswith("data: "):
                        break
                post = [
                    asyncio.create_task(
                        client.post(url, json=_body(max_tokens=40), headers={"x-slo-class": c})
                    )
                    for c in ("interactive", "interactive", "batch", "batch")
                ]
                batch = await asyncio.gather(*post[2:])  # shed while the head runs
                deadline = time.monotonic() + 60
                depth = f"{base}/metrics", "splitserve_router_queue_depth"
                while await asyncio.to_thread(_sample, *depth, slo_class="interactive") < 2:
                    assert time.monotonic() < deadline, "the interactive requests never queued"
                    await asyncio.sleep(0.05)
                status = head.status_code
                await head.aclose()
            # The head's client left: its slot goes to the queued interactive requests.
            inter = await asyncio.gather(*post[:2])
            return status, [*inter, *batch]

    head, replies = asyncio.run(run())
    assert head == 200
    inter, batch = replies[:2], replies[2:]
    assert [r.status_code for r in inter] == [200, 200]  # queued, never shed
    assert [r.status_code for r in batch] == [429, 429]
    for r in batch:
        assert int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded"
        assert err["type"] == "requests"
    metrics = f"{base}/metrics"
    assert (
        _sample(
            metrics, "splitserve_router_admission_total", slo_class="interactive", outcome="queued"
        )
        == 2
    )
    assert (
        _sample(metrics, "splitserve_router_requests_total", slo_class="batch", outcome="shed",
                path="none")
        == 2
    )  # fmt: skip


def test_classes_come_from_the_header(stack: Stack) -> None:
    ws = [stack.worker("p", "prefill", 0.01), stack.worker("d", "decode", 0.01)]
    slo = {
        "sloClasses": [
            {"name": "interactive", "ttftMs": 5000, "tpotMs": 1000, "priority": 10},
            {"name": "batch", "ttftMs": 20000, "tpotMs": 5000, "sheddable": True},
        ],
        "defaultSloClass": "batch",
    }
    base = stack.router(ws, slo)
    url = f"{base}/v1/completions"
    bad = httpx.post(url, json=_body(), headers={"x-slo-class": "gold"}, timeout=60)
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "x-slo-class"
    assert "gold" in bad.json()["error"]["message"]
    for headers in ({"x-slo-class": "interactive"}, {}, {}):
        r = httpx.post(url, json=_body(), headers=headers, timeout=60)
        assert r.status_code == 200, r.text
    metrics = f"{base}/metrics"
    for cls, n in (("interactive", 1), ("batch", 2)):
        got = _sample(
            metrics, "splitserve_router_admission_total", slo_class=cls, outcome="admitted"
        )
        assert got == n, (cls, got)


@pytest.mark.parametrize(
    ("mode", "path", "reason"),
    [("Never", "aggregated", "never"), ("Always", "disaggregated", "split")],
)
def test_disaggregation_from_the_config_file(
    stack: Stack, mode: str, path: str, reason: str
) -> None:
    p = stack.worker("p", "prefill", 0.01)
    d = stack.worker("d", "decode", 0.01)
    slo = {
        "sloClasses": [{"name": "standard", "ttftMs": 20000, "tpotMs": 5000}],
        "router": {"disaggregation": mode},
    }
    base = stack.router([p, d], slo)
    for _ in range(2):
        r = httpx.post(f"{base}/v1/completions", json=_body(), timeout=60)
        assert r.status_code == 200, r.text
    placed = _sample(
        f"{base}/metrics", "splitserve_router_placements_total", path=path, reason=reason
    )
    assert placed == 2
    assert _worker_count(p, "prefill") == (2 if path == "disaggregated" else 0)

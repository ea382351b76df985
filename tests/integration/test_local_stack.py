"""The local stack end to end: `splitserve up` with 2 prefill + 2 decode workers as real
processes, driven with the official `openai` client.

What must hold: chat and completions, streaming and not, with correct usage; both roles served
each disaggregated request (worker metrics); a client that goes away cancels the work on the
workers; bad input gets a 4xx with an OpenAI-style body; a run-time role change re-routes; and
stopping `up` leaves no process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.processes import up_ready

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc

pytestmark = pytest.mark.integration

MODEL = "splitserve-sim"


@dataclass
class Stack:
    proc: subprocess.Popen[str]
    run_dir: Path
    base_url: str
    workers: dict[str, dict[str, object]]
    router: dict[str, object]

    def metrics(self, name: str) -> dict[str, float]:
        """Every sample of one worker's (or the router's, name='router') metrics."""
        if name == "router":
            url = f"{self.base_url.removesuffix('/v1')}/metrics"
        else:
            url = f"http://127.0.0.1:{self.workers[name]['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = s.name + json.dumps(dict(sorted(s.labels.items())), separators=(",", ":"))
                out[key] = s.value
        return out

    def sample(self, name: str, metric: str, **labels: str) -> float:
        key = metric + json.dumps(dict(sorted(labels.items())), separators=(",", ":"))
        return self.metrics(name).get(key, 0.0)

    def total(self, role: str, metric: str, **labels: str) -> float:
        return sum(self.sample(n, metric, **labels) for n in self.workers if n.startswith(role))


def operator_channel(stack: Stack, address: str) -> grpc.aio.Channel:
    """A channel to a worker with the operator's certificate of the stack's throw-away CA
    (`splitserve up` runs internal RPCs over mutual TLS)."""
    d = stack.run_dir / "pki" / "operator"
    creds = grpc.ssl_channel_credentials(
        (d / "ca.crt").read_bytes(), (d / "tls.key").read_bytes(), (d / "tls.crt").read_bytes()
    )
    options = [("grpc.ssl_target_name_override", "worker.splitserve.internal")]
    return grpc.aio.secure_channel(address, creds, options=options)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("stack")
    env = dict(os.environ, SPLITSERVE_CACHE_DIR=str(tmp_path_factory.mktemp("cache")))
    argv = [
        sys.executable, "-m", "splitserve", "up",
        "--prefill", "2", "--decode", "2",
        "--port", "0", "--grpc-port", "0",
        "--sim-time-scale", "0.2", "--sim-kv-blocks", "2048",
        "--run-dir", str(run_dir), "--log-level", "WARNING",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        up_ready(proc, run_dir)
        router = json.loads((run_dir / "router.ready.json").read_text())
        workers = {
            p.name.removesuffix(".ready.json"): json.loads(p.read_text())
            for p in sorted(run_dir.glob("*-*.ready.json"))
        }
        base_url = f"http://127.0.0.1:{router['port']}/v1"
        yield Stack(proc, run_dir, base_url, workers, router)
    finally:
        pids = [int(json.loads(p.read_text())["pid"]) for p in run_dir.glob("*.ready.json")]
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    for pid in pids:  # stopping `up` stops everything it started: no orphans
        assert not _alive(pid), f"process {pid} survived `splitserve up` stopping"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie not yet reaped by init still answers kill(0); read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def test_up_started_every_process(stack: Stack) -> None:
    assert sorted(stack.workers) == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    assert {w["role"] for w in stack.workers.values()} == {"prefill", "decode"}
    assert stack.proc.poll() is None


def test_models_and_health(stack: Stack, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    root = stack.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health", timeout=5).status_code == 200
    assert httpx.get(f"{root}/ready", timeout=5).status_code == 200


def test_chat_is_disaggregated_over_both_roles(stack: Stack, client: openai.OpenAI) -> None:
    before_p = stack.total(
        "prefill", "splitserve_worker_requests_total", kind="prefill", outcome="ok"
    )
    before_d = stack.total(
        "decode", "splitserve_worker_requests_total", kind="decode", outcome="ok"
    )
    n = 4
    for i in range(n):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"hello number {i}"}], max_tokens=12
        )
        assert r.choices[0].finish_reason == "length"
        assert r.usage is not None
        assert r.usage.completion_tokens == 12
        assert r.usage.prompt_tokens > 3
        assert r.usage.total_tokens == r.usage.prompt_tokens + 12
        assert r.choices[0].message.content
    after_p = stack.total(
        "prefill", "splitserve_worker_requests_total", kind="prefill", outcome="ok"
    )
    after_d = stack.total("decode", "splitserve_worker_requests_total", kind="decode", outcome="ok")
    assert after_p - before_p == n
    assert after_d - before_d == n
    assert stack.total("decode", "splitserve_worker_kv_transfer_bytes_total") > 0
    routed = stack.sample(
        "router",
        "splitserve_router_requests_total",
        outcome="ok",
        path="disaggregated",
        slo_class="default",
    )
    assert routed >= n


def test_answers_end_by_themselves_unless_ignore_eos(client: openai.OpenAI) -> None:
    """The README's call without `max_tokens`: the simulated engine ends the answer with the
    tokenizer's end of text (finish `stop`, well short of the context limit), across P/D;
    `ignore_eos` runs the same tokens on to `max_tokens`; `min_tokens` moves the end."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    ended = client.chat.completions.create(model=MODEL, messages=messages, temperature=0.0)
    assert ended.choices[0].finish_reason == "stop"
    assert ended.usage is not None
    n = ended.usage.completion_tokens  # the end-of-text token counts, its text is left out
    assert 2 <= n < 1000
    text = ended.choices[0].message.content
    assert text
    on = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0.0,
        max_tokens=n + 20,
        extra_body={"ignore_eos": True},
    )
    assert on.choices[0].finish_reason == "length"
    assert on.usage is not None
    assert on.usage.completion_tokens == n + 20
    assert (on.choices[0].message.content or "").startswith(text)
    later = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0.0, extra_body={"min_tokens": n + 5}
    )
    assert later.choices[0].finish_reason == "stop"
    assert later.usage is not None
    assert later.usage.completion_tokens == n + 6


def test_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 20, "temperature": 0.0}
    full = client.completions.create(**kwargs)  # type: ignore[call-overload]
    pieces: list[str] = []
    usage = None
    for chunk in client.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    ):  # type: ignore[call-overload]
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == full.choices[0].text
    assert usage is not None
    assert full.usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens == 20


def test_chat_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=8,
        stream=True,
    )
    deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(deltas)


def test_client_disconnect_cancels_work_on_the_workers(stack: Stack) -> None:
    before = stack.total(
        "decode", "splitserve_worker_requests_total", kind="decode", outcome="cancelled"
    )

    async def start_and_abandon() -> None:
        async with openai.AsyncOpenAI(
            base_url=stack.base_url, api_key="unused", max_retries=0
        ) as c:
            stream = await c.completions.create(
                model=MODEL, prompt="a very long story", max_tokens=3000, stream=True
            )
            got = 0
            async for _chunk in stream:
                got += 1
                if got == 3:
                    break
            await stream.close()  # the client goes away mid-stream

    asyncio.run(start_and_abandon())
    # Gauges follow the workers' load reports (every 100 ms): poll until all three settle.
    deadline = time.monotonic() + 30
    while True:
        cancelled = stack.total(
            "decode", "splitserve_worker_requests_total", kind="decode", outcome="cancelled"
        )
        running = stack.total("decode", "splitserve_worker_running_requests")
        held = stack.total("prefill", "splitserve_worker_kv_held_requests")
        if (cancelled > before and running == 0 and held == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert cancelled == before + 1, f"decode cancellations {before} -> {cancelled}"
    assert running == 0, f"{running} requests still running on decode workers"
    assert held == 0, f"{held} prefilled KV caches still held"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"model": MODEL}, 400, "messages"),
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
            400,
            "",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
        ({"model": MODEL, "messages": "not a list"}, 400, ""),
    ],
    ids=["no-messages", "unknown-model", "too-long", "n>1", "wrong-type"],
)
def test_bad_input_gets_openai_style_4xx(
    stack: Stack, body: dict[str, object], status: int, fragment: str
) -> None:
    r = httpx.post(f"{stack.base_url}/chat/completions", json=body, timeout=10)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"]
    assert fragment in err["message"].lower() or fragment in str(err.get("param", "")).lower()


def test_malformed_json_is_400(stack: Stack) -> None:
    r = httpx.post(
        f"{stack.base_url}/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400
    assert "error" in r.json()


def test_role_change_at_run_time_reroutes_to_aggregated(
    stack: Stack, client: openai.OpenAI
) -> None:
    """Turn both prefill workers into decode workers: requests now run aggregated."""
    prefill = [w for name, w in stack.workers.items() if name.startswith("prefill")]

    async def set_roles(role: common_pb2.Role.ValueType) -> None:
        for w in prefill:
            async with operator_channel(stack, str(w["address"])) as ch:
                await worker_pb2_grpc.WorkerStub(ch).SetRole(worker_pb2.SetRoleRequest(role=role))

    asyncio.run(set_roles(common_pb2.ROLE_DECODE))
    try:
        time.sleep(0.5)  # a few load-report intervals: the router sees the new roles
        before = stack.sample(
            "router",
            "splitserve_router_requests_total",
            outcome="ok",
            path="aggregated",
            slo_class="default",
        )
        r = client.completions.create(model=MODEL, prompt="after the flip", max_tokens=5)
        assert r.usage is not None
        assert r.usage.completion_tokens == 5
        after = stack.sample(
            "router",
            "splitserve_router_requests_total",
            outcome="ok",
            path="aggregated",
            slo_class="default",
        )
        assert after == before + 1
    finally:
        asyncio.run(set_roles(common_pb2.ROLE_PREFILL))
        time.sleep(0.5)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_real_prometheus_scrapes_the_stack_and_evaluates_our_rules(
    stack: Stack, client: openai.OpenAI, tmp_path: Path
) -> None:
    """Prometheus (Debian's, installed by `make test`) scrapes router and workers, and the shipped
    recording rules produce series from what it scraped."""
    prometheus = shutil.which("prometheus") or shutil.which(
        "prometheus", path=os.environ.get("SPLITSERVE_PROMETHEUS_BIN_DIR", "") or None
    )
    if prometheus is None:
        why = "prometheus is not installed (`make promtool` installs or unpacks it, see mk/)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    rules = Path(__file__).resolve().parents[2] / "deploy/prometheus/splitserve-rules.yaml"
    targets = [f"127.0.0.1:{w['metrics_port']}" for w in stack.workers.values()]
    router_port = stack.router["port"]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "router", "static_configs": [{"targets": [f"127.0.0.1:{router_port}"]}]},
            {"job_name": "workers", "static_configs": [{"targets": targets}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    port = _free_port()
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(expr: str) -> list[dict[str, object]]:
        r = httpx.get(f"{api}/query", params={"query": expr}, timeout=5)
        r.raise_for_status()
        return list(r.json()["data"]["result"])

    try:
        client.completions.create(model=MODEL, prompt="for prometheus", max_tokens=3)
        deadline = time.monotonic() + 60
        up: list[dict[str, object]] = []
        util: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            try:
                up = query("up == 1")
                util = query("splitserve:worker_kv_utilization:ratio")
                served = query('sum(splitserve_router_requests_total{outcome="ok"})')
            except httpx.HTTPError:
                time.sleep(0.5)
                continue
            if len(up) == 5 and len(util) == 4 and served:
                break
            time.sleep(0.5)
        assert len(up) == 5, up  # the router and four workers
        assert len(util) == 4
        assert float(served[0]["value"][1]) >= 1  # type: ignore[index]
    finally:
        proc.terminate()
        proc.wait(timeout=10)

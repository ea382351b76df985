"""Every dashboard panel and every Prometheus rule, checked against a real run.

`splitserve up` (2 prefill + 2 decode simulated workers, real processes) serves a scenario that
exercises what the dashboards show: disaggregated requests in two SLO classes, a burst that queues
the unsheddable class and sheds the sheddable one, a prefill worker killed mid-burst (the router
falls back), and a run-time role flip (aggregated requests). Beside it the real operator (kopf,
in this process) runs against kmock, an emulated Kubernetes API server, with one valid
`LLMService` (its control loop reads the local stack's real router and workers: the router and
worker pods in kmock are fakes whose addresses map onto them) and one invalid one (reconcile
errors). A real Prometheus scrapes the router, the workers and the operator's /metrics every
second and evaluates the shipped rules. Then every PromQL expression of
every dashboard (`splitserve.obs.dashboards`) is evaluated through Prometheus' HTTP API and must
return a non-empty result with at least one finite value, unless the panel names why it is empty
in this scenario (`Panel.empty_in_local_stack` / `Query.empty_in_local_stack`); every recording
rule's series must exist and be finite, and every alert rule must evaluate cleanly over live
series.

With `SPLITSERVE_DASHBOARD_PNG_DIR` set, the test also renders each dashboard from this run as PNG
there (`splitserve dashboard render`; the screenshots in docs/observability.md come from it).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from tests.fakes.controllers import DeploymentController, Kubelet, running
from tests.fakes.kube import FakeWorkers
from tests.integration.operator.conftest import KmockServer, _write_kubeconfig

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.obs.dashboards import DASHBOARDS
from splitserve.obs.dashboards.model import substitute
from splitserve.operator import handlers
from splitserve.operator.control import runtime
from splitserve.operator.control.loop import http_get, prometheus_admissions, prometheus_samples
from splitserve.operator.control.signals import (
    ADMISSION,
    SLO_REQUESTS,
    TPOT,
    TTFT,
    ClassTargets,
    Snapshot,
    Window,
    parse,
)
from splitserve.operator.kube import RestKube
from splitserve.operator.reconcile import Settings
from splitserve.policy.planner.signals import WorkerLoad

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "splitserve-sim"
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/splitserve-rules.yaml"
SLO_CONFIG = {
    "sloClasses": [
        {"name": "interactive", "ttftMs": 5000, "tpotMs": 1000, "priority": 10},
        # Tight enough that a busy pool cannot meet it: arrivals in a burst are shed.
        {"name": "batch", "ttftMs": 10, "tpotMs": 1000, "sheddable": True},
    ],
    "defaultSloClass": "interactive",
}
LONG_PROMPT = " ".join(f"word{i} alpha beta gamma" for i in range(300))
# The labels the router's scrape carries, as a PodMonitor's would for a service "obs".
PROM_NAMESPACE = "default"
PROM_SERVICE = "obs"
PROM_ROUTER_POD = f"{PROM_SERVICE}-router-0"
# Recording rules whose series may be empty in this scenario, and why.
EMPTY_RULES: dict[str, str] = {}


def _prometheus() -> str:
    found = shutil.which("prometheus") or shutil.which(
        "prometheus", path=os.environ.get("SPLITSERVE_PROMETHEUS_BIN_DIR", "") or None
    )
    if found is None:
        why = "prometheus is not installed (`make promtool` installs or unpacks it, see mk/)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    base_url: str
    prometheus_url: str
    workers: dict[str, dict[str, object]]
    run_dir: Path
    started_s: float
    events: dict[str, int]

    def query(self, expr: str) -> list[dict[str, object]]:
        r = httpx.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr}, timeout=10)
        assert r.status_code == 200, f"{expr}: {r.text}"
        body = r.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def window(self) -> str:
        """A rate window covering the whole scenario."""
        return f"{math.ceil(time.time() - self.started_s) + 15}s"


# -- the operator beside the stack ------------------------------------------------------------

NS = "default"
OPERATOR_SERVICE = "stack"
BROKEN_SERVICE = "broken"


def _service(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": MODEL, "source": "org/m"},
        "engine": {"kind": "sim", "image": "img:1"},
        "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
        "pools": {
            "prefill": {"replicas": 2, "minReplicas": 1, "maxReplicas": 4},
            "decode": {"replicas": 2, "minReplicas": 1, "maxReplicas": 4},
        },
        "sloClasses": SLO_CONFIG["sloClasses"],
        "scaling": {
            "mode": "External",
            "intervalSeconds": 2,
            "windowSeconds": 10,
            "scaleDownStabilizationSeconds": 600,
        },
    }
    body.update(spec)
    return {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMService",
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


class _StackLoads:
    """The control loop's worker load reports from the local stack's real workers (their
    /metrics): each worker pod in kmock (a fake) stands for one of them, in order of sighting."""

    def __init__(self, metrics_urls: list[str]) -> None:
        self.urls = metrics_urls
        self.assigned: dict[str, str] = {}
        self.lock = threading.Lock()

    def load(self, address: str) -> WorkerLoad:
        with self.lock:
            url = self.assigned.setdefault(address, self.urls[len(self.assigned) % len(self.urls)])
        values: dict[str, float] = {}
        for line in http_get(url).splitlines():
            if line.startswith("splitserve_worker_"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        free = values.get("splitserve_worker_kv_blocks_free", 0.0)
        total = values.get("splitserve_worker_kv_blocks_total", 0.0)
        return WorkerLoad(
            address,
            Role.MIXED,
            int(values.get("splitserve_worker_queue_requests", 0)),
            int(values.get("splitserve_worker_running_requests", 0)),
            1 - free / total if total else None,
        )


@contextmanager
def _restored_logging() -> Iterator[None]:
    """kopf configures logging process-wide (root level and handlers, asyncio's logger)."""
    import logging

    root, aio = logging.getLogger(), logging.getLogger("asyncio")
    saved = (root.level, list(root.handlers), aio.propagate, list(aio.handlers))
    try:
        yield
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        aio.propagate = saved[2]
        aio.handlers[:] = saved[3]


@contextmanager
def _operator(run_dir: Path, router_port: int, worker_metrics: list[str]) -> Iterator[int]:
    """kmock, the operator (kopf, this process) with its /metrics on the port yielded, the
    fake Deployment controller and kubelet, and the two services."""
    import kubernetes
    from kopf.testing import KopfRunner

    with ExitStack() as stack:
        server = KmockServer().start()
        stack.callback(server.stop)
        kubeconfig = run_dir / "kmock.kubeconfig"
        _write_kubeconfig(kubeconfig, server.url)
        router_metrics = f"http://127.0.0.1:{router_port}/metrics"
        runtime.configure(
            runtime.ControlConfig(
                get=lambda _url: http_get(router_metrics), loads=_StackLoads(worker_metrics)
            )
        )
        stack.callback(runtime.configure, runtime.ControlConfig())
        port = _free_port()
        http = runtime.serve("127.0.0.1", port)
        stack.callback(http.shutdown)
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        kube = RestKube(client)
        kube.client.user_agent = "splitserve-tests"
        config = handlers.OperatorConfig(
            settings=Settings(router_image="router:test", drain_wait_s=0.0),
            interval_s=2.0,
            kubeconfig=str(kubeconfig),
            workers=FakeWorkers(),
        )
        args = ["run", "--standalone", "--namespace", NS]
        stack.enter_context(_restored_logging())
        stack.enter_context(KopfRunner(args, timeout=60, registry=handlers.registry(config)))
        stack.enter_context(
            running(DeploymentController(kube, NS), Kubelet(kube, NS), period_s=0.5)
        )
        kube.create(_service(OPERATOR_SERVICE))
        # Invalid (no worker group takes `mixed`; kmock does not apply the CRD's schema): every
        # reconcile of it fails, then backs off.
        kube.create(_service(BROKEN_SERVICE, pools={"mixed": {"replicas": 1}}))
        archiver = threading.Event()

        def archive() -> None:
            # kmock matches each request against its whole log: keep it short (conftest).
            while not archiver.wait(5):
                server.archive()

        threading.Thread(target=archive, name="kmock-archive", daemon=True).start()
        stack.callback(archiver.set)
        yield port


def _worker_pid(run_dir: Path, name: str) -> int:
    return int(json.loads((run_dir / f"{name}.ready.json").read_text())["pid"])


async def _set_roles(run_dir: Path, addresses: list[str], role: common_pb2.Role.ValueType) -> None:
    """`SetRole` as the operator: `splitserve up` runs internal RPCs over mutual TLS, and only the
    operator's certificate of its throw-away CA may change a worker's role."""
    d = run_dir / "pki" / "operator"
    creds = grpc.ssl_channel_credentials(
        (d / "ca.crt").read_bytes(), (d / "tls.key").read_bytes(), (d / "tls.crt").read_bytes()
    )
    options = [("grpc.ssl_target_name_override", "worker.splitserve.internal")]
    for address in addresses:
        async with grpc.aio.secure_channel(address, creds, options=options) as ch:
            await worker_pb2_grpc.WorkerStub(ch).SetRole(worker_pb2.SetRoleRequest(role=role))


async def _burst(
    client: httpx.AsyncClient, n: int, slo_class: str, max_tokens: int = 16
) -> list[int]:
    async def one(i: int) -> int:
        r = await client.post(
            "/completions",
            json={"model": MODEL, "prompt": f"{i} {LONG_PROMPT}", "max_tokens": max_tokens},
            headers={"x-slo-class": slo_class},
        )
        return r.status_code

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def _router_sample(run: Run, metric: str, **labels: str) -> float:
    url = f"{run.base_url.removesuffix('/v1')}/metrics"
    text = httpx.get(url, timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(metric + "{") and not line.startswith(metric + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _scenario(run: Run) -> None:
    """Load on both paths, a queue, a shed, a fallback, a flip; counts what happened."""

    async def go() -> None:
        async with httpx.AsyncClient(base_url=run.base_url, timeout=120) as client:
            # Warm-up: the router fits its per-worker prefill rate from these.
            codes = await _burst(client, 6, "interactive")
            assert codes == [200] * 6, codes
            # Busy pool: the unsheddable class queues, the sheddable one is shed (429).
            for _ in range(5):
                both = await asyncio.gather(
                    _burst(client, 6, "interactive", max_tokens=32), _burst(client, 6, "batch")
                )
                run.events["interactive_ok"] += both[0].count(200)
                run.events["shed"] += both[1].count(429)
                run.events["batch_ok"] += both[1].count(200)
                if run.events["shed"]:
                    break
            # Alone on an idle pool a batch request is admitted, and misses its 10 ms TTFT.
            await asyncio.sleep(1.0)
            codes = await _burst(client, 1, "batch")
            run.events["batch_ok"] += codes.count(200)
            # A prefill worker dies mid-burst: the router retries elsewhere (a fallback).
            for name in ("prefill-0", "prefill-1", "prefill-0"):
                task = asyncio.create_task(_burst(client, 6, "interactive", max_tokens=32))
                await asyncio.sleep(0.3)
                os.kill(_worker_pid(run.run_dir, name), signal.SIGKILL)
                await task
                await _wait_prefill_ready(run)
                if _router_sample(run, "splitserve_router_fallbacks_total") > 0:
                    break
            # Both prefill workers turn decode: requests run aggregated; then back.
            prefill = [str(w["address"]) for n, w in run.workers.items() if n.startswith("pre")]
            await _set_roles(run.run_dir, prefill, common_pb2.ROLE_DECODE)
            await asyncio.sleep(1.0)
            codes = await _burst(client, 4, "interactive")
            run.events["aggregated_ok"] += codes.count(200)
            await _set_roles(run.run_dir, prefill, common_pb2.ROLE_PREFILL)
            await asyncio.sleep(1.0)
            codes = await _burst(client, 4, "interactive")
            assert codes == [200] * 4, codes

    async def _wait_prefill_ready(run: Run) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = _router_sample(
                run, "splitserve_router_endpoints", role="prefill", state="ready"
            )
            if ready >= 2:
                return
            await asyncio.sleep(0.2)
        raise TimeoutError("the killed prefill worker did not come back")

    asyncio.run(go())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prometheus = _prometheus()
    run_dir = tmp_path_factory.mktemp("stack")
    slo_file = run_dir / "slo.yaml"
    slo_file.write_text(yaml.safe_dump(SLO_CONFIG))
    env = dict(os.environ, SPLITSERVE_CACHE_DIR=str(tmp_path_factory.mktemp("cache")))
    argv = [
        sys.executable, "-m", "splitserve", "up",
        "--prefill", "2", "--decode", "2",
        "--port", "0", "--grpc-port", "0",
        "--sim-time-scale", "1.0", "--sim-kv-blocks", "4096",
        "--slo-config", str(slo_file),
        "--run-dir", str(run_dir), "--log-level", "WARNING",
    ]  # fmt: skip
    up = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    prom: subprocess.Popen[bytes] | None = None
    stack = ExitStack()
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "router.ready.json").exists():
            if up.poll() is not None:
                out = up.stdout.read() if up.stdout else ""
                raise RuntimeError(f"splitserve up exited early ({up.returncode}):\n{out}")
            if time.monotonic() > deadline:
                raise TimeoutError("splitserve up did not become ready")
            time.sleep(0.1)
        router = json.loads((run_dir / "router.ready.json").read_text())
        workers = {
            p.name.removesuffix(".ready.json"): json.loads(p.read_text())
            for p in sorted(run_dir.glob("*-*.ready.json"))
        }
        targets = [f"127.0.0.1:{w['metrics_port']}" for w in workers.values()]
        operator_port = stack.enter_context(
            _operator(run_dir, int(router["port"]), [f"http://{t}/metrics" for t in targets])
        )
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "router",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{router['port']}"],
                            # What a PodMonitor's scrape adds, for the operator's queries
                            # (`scaling.metricsSource: Prometheus`).
                            # The chart's PodMonitor also copies the pod's service label.
                            "labels": {
                                "namespace": PROM_NAMESPACE,
                                "service": PROM_SERVICE,
                                "pod": PROM_ROUTER_POD,
                            },
                        }
                    ],
                },
                {"job_name": "workers", "static_configs": [{"targets": targets}]},
                {
                    "job_name": "operator",
                    "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}],
                },
            ],
        }
        (run_dir / "prometheus.yml").write_text(json.dumps(config))
        port = _free_port()
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={run_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={run_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        result = Run(
            base_url=f"http://127.0.0.1:{router['port']}/v1",
            prometheus_url=f"http://127.0.0.1:{port}",
            workers=workers,
            run_dir=run_dir,
            started_s=time.time(),
            events=dict.fromkeys(("interactive_ok", "batch_ok", "shed", "aggregated_ok"), 0),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if len(result.query("up == 1")) == 6:
                    break
            except (httpx.HTTPError, AssertionError):
                pass
            time.sleep(0.5)
        _scenario(result)
        time.sleep(4)  # a few scrapes and rule evaluations after the last request
        yield result
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=10)
        stack.close()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            raise


def test_the_scenario_exercised_what_the_dashboards_show(run: Run) -> None:
    assert run.events["shed"] > 0, run.events
    assert run.events["batch_ok"] == 1, run.events
    assert run.events["aggregated_ok"] == 4, run.events
    assert _router_sample(run, "splitserve_router_fallbacks_total") > 0
    paths = {r["metric"]["path"] for r in run.query("splitserve_router_requests_total")}  # type: ignore[index]
    assert {"disaggregated", "aggregated"} <= paths


def test_the_operator_reconciled_failed_and_looped(run: Run) -> None:
    """The operator's series moved on real work: reconciles of both services (the broken one
    failing, then backing off), the control loop's ticks over the stack's real router, and its
    requests to the API server."""
    by_result = {
        r["metric"]["result"]: float(r["value"][1])  # type: ignore[index]
        for r in run.query(
            'sum by (result) (splitserve_operator_reconciles_total{resource="LLMService"})'
        )
    }
    assert by_result.get("success", 0) > 0, by_result
    assert by_result.get("error", 0) > 0, by_result
    reasons = run.query("splitserve_operator_reconcile_errors_total")
    assert {r["metric"]["reason"] for r in reasons} == {"InvalidSpec"}  # type: ignore[index]
    verbs = {r["metric"]["verb"] for r in run.query("splitserve_operator_kube_requests_total")}  # type: ignore[index]
    assert {"list", "create", "patch"} <= verbs, verbs  # reads come from the watch-fed cache
    ticks = run.query(
        f'splitserve_operator_loop_duration_seconds_count{{service="{NS}/{OPERATOR_SERVICE}"}}'
    )
    assert _values(ticks), ticks
    assert _values(ticks)[0] > 2, ticks
    staleness = run.query('splitserve_operator_signal_staleness_seconds{source="router"}')
    assert staleness
    assert all(math.isfinite(v) for v in _values(staleness)), staleness


def _values(result: list[dict[str, object]]) -> list[float]:
    return [float(r["value"][1]) for r in result]  # type: ignore[index]


def test_every_dashboard_query_has_data_or_a_reason(run: Run) -> None:
    window = run.window()
    problems: list[str] = []
    checked = 0
    for board_name, board in DASHBOARDS.items():
        for panel in board.panels:
            for q in panel.queries:
                # The namespace / service variables at All (`.*`), as Grafana opens the boards:
                # the router's series carry `namespace` and `service`, the workers' neither label.
                expr = substitute(q.expr, window)
                values = _values(run.query(expr))
                has_data = any(math.isfinite(v) for v in values)
                reason = panel.empty_reason(q)
                checked += 1
                if not has_data and not reason:
                    problems.append(f"{board_name} / {panel.title}: no finite value from {expr}")
                elif has_data and reason:
                    problems.append(
                        f"{board_name} / {panel.title}: has data but says it is empty ({reason})"
                    )
    assert checked > 40
    assert not problems, "\n".join(problems)


def _rules() -> list[dict[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_recording_rule_has_finite_data(run: Run) -> None:
    problems = []
    for rule in _rules():
        if "record" not in rule:
            continue
        values = _values(run.query(rule["record"]))
        if not any(math.isfinite(v) for v in values) and rule["record"] not in EMPTY_RULES:
            problems.append(f"{rule['record']}: {values}")
    assert not problems, problems


def test_every_alert_rule_evaluates_over_live_series(run: Run) -> None:
    r = httpx.get(f"{run.prometheus_url}/api/v1/rules", timeout=10).json()
    seen = {}
    for group in r["data"]["groups"]:
        for rule in group["rules"]:
            seen[rule.get("name")] = rule
    for rule in _rules():
        name = rule.get("alert") or rule["record"]
        assert seen[name]["health"] == "ok", seen[name]
        if "alert" not in rule:
            continue
        # Every series the alert compares is live in this run (the alert itself stays quiet).
        for series in set(re.findall(r"\b(splitserve[_:][a-z0-9_:]+)", rule["expr"])):
            assert run.query(series), f"{name}: {series} has no data"


def test_render_dashboards_as_png(run: Run, tmp_path: Path) -> None:
    """`splitserve dashboard render` draws every dashboard of this run (PNG files)."""
    from splitserve.obs.render import render_all

    out = Path(os.environ.get("SPLITSERVE_DASHBOARD_PNG_DIR") or tmp_path)
    files = render_all(
        run.prometheus_url, out, start_s=run.started_s, end_s=time.time(), scrape_interval_s=1
    )
    assert sorted(p.name for p in files) == sorted(f"{name}.png" for name in DASHBOARDS)
    for p in files:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_size > 20_000


def test_the_operator_reads_the_routers_slo_series_from_prometheus(run: Run) -> None:
    """`scaling.metricsSource: Prometheus`: the operator's two queries (`prometheus_samples`,
    `prometheus_admissions`) against the real Prometheus of this run find the router's pod and
    return its SLO counters and histograms as a direct scrape of the router reads them, and
    the window built from them observes the same classes as one built from direct scrapes."""
    router_metrics = run.base_url.removesuffix("/v1") + "/metrics"
    families = (ADMISSION, SLO_REQUESTS, TTFT + "_bucket", TPOT + "_bucket")
    deadline = time.monotonic() + 30
    while True:
        direct = parse(http_get(router_metrics))
        routers = prometheus_samples(run.prometheus_url, PROM_NAMESPACE, PROM_SERVICE)
        from_prom = routers.get(PROM_ROUTER_POD, {})
        want = {k: v for k, v in direct.items() if k[0] in families}
        got = {k: v for k, v in from_prom.items() if k[0] in families}
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(1.0)  # one scrape behind
    assert list(routers) == [PROM_ROUTER_POD]
    assert want, "the scenario counted no SLO series"
    assert got == want
    at = time.time()
    raw = prometheus_admissions(run.prometheus_url, PROM_NAMESPACE, PROM_SERVICE, 600.0, at)
    last = {k: pts[-1][1] for k, pts in raw.items()}
    assert sum(last.values()) == sum(v for (n, _), v in direct.items() if n == ADMISSION)
    classes = [
        ClassTargets("interactive", 5.0, 1.0, 0.9, 0.9),
        ClassTargets("batch", 0.01, 1.0, 0.9, 0.9),
    ]  # SLO_CONFIG's classes
    observed = []
    for samples in (direct, from_prom):
        w = Window(600.0, 600.0)
        w.add(Snapshot(0.0, {"r": {}}))
        w.add(Snapshot(10.0, {"r": samples}))
        obs = w.observe(10.0, classes, {})
        observed.append([(c.name, c.requests, c.attainment, c.ttft_s) for c in obs.classes])
    assert observed[0] == observed[1]
    assert any(requests > 0 for _, requests, _, _ in observed[0])

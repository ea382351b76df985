"""The live control loop (operator.control) against the in-memory API server, with a fake
router's metrics text and fake worker load reports."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.obs.metrics import OperatorMetrics
from splitserve.operator import reconcile as rc
from splitserve.operator.control.loop import Controller, prometheus_samples
from splitserve.operator.control.signals import Snapshot, Window, histogram_quantile, parse
from splitserve.policy.planner.signals import PoolSignal, SignalState, WorkerLoad
from tests.fakes.kube import FakeWorkers, MemoryKube, worker_pod
from tests.fakes.router_metrics import FakeRouterMetrics

NS = "default"
ROUTER = "10.1.0.1:8000"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Loads:
    def __init__(self) -> None:
        self.queued: dict[str, int] = {}
        self.kv_used = 0.3

    def load(self, address: str) -> WorkerLoad:
        return WorkerLoad(address, Role.MIXED, self.queued.get(address, 0), 1, self.kv_used)


class Env:
    def __init__(self, mode: str = "Managed", **spec: Any) -> None:
        self.kube = MemoryKube()
        self.workers = FakeWorkers()
        self.router = FakeRouterMetrics()
        self.clock = Clock()
        self.loads = Loads()
        self.down = False
        self.registry = CollectorRegistry()
        body: dict[str, Any] = {
            "model": {"name": "m", "source": "org/m"},
            "engine": {"kind": "sim", "image": "img:1"},
            "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
            "pools": {
                "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 6},
                "decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": 6},
            },
            "sloClasses": [{"name": "chat", "ttftMs": 2000, "tpotMs": 100}],
            "scaling": {
                "mode": mode,
                "intervalSeconds": 10,
                "scaleDownStabilizationSeconds": 60,
                "windowSeconds": 30,
            },
        }
        body.update(spec)
        self.kube.create(
            {
                "apiVersion": v1.API_VERSION,
                "kind": "LLMService",
                "metadata": {"name": "svc", "namespace": NS},
                "spec": body,
            }
        )
        self.reconcile()
        for i in range(2):
            self.kube.create(worker_pod("svc", "w", f"svc-w-{i}", ip=f"10.0.0.{i + 1}"))
        router = worker_pod("svc", "w", "svc-router-0", ip="10.1.0.1")
        router["metadata"]["labels"][v1.LABEL_COMPONENT] = "router"
        self.kube.create(router)
        self.reconcile()
        self.wall = itertools.count()
        self.controller = Controller(
            self.kube,
            OperatorMetrics(self.registry),
            get=self.get,
            loads=self.loads,
            clock=self.clock,
            wall=lambda: (
                datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
                + datetime.timedelta(seconds=next(self.wall))
            ),
        )

    def get(self, url: str) -> str:
        assert url == f"http://{ROUTER}/metrics"
        if self.down:
            raise OSError("connection refused")
        return self.router.text()

    def reconcile(self) -> None:
        rc.reconcile(
            self.kube,
            self.workers,
            NS,
            "svc",
            rc.Settings(drain_wait_s=0.0),
            "2026-01-01T00:00:00Z",
        )

    def tick(self, advance: float = 10.0, **serve: Any) -> Any:
        if serve:
            self.router.serve(**serve)
        self.clock.t += advance
        return self.controller.tick(NS, "svc")

    def queue_at_router(self, n: int, prompt_tokens: int) -> None:
        """`n` requests of class chat counted on arrival and waiting at the router's gate (their
        prompts observed), none finished."""
        self.router.admission.labels("chat", "queued").inc(n)
        for _ in range(n):
            self.router.prompt.labels("chat").observe(prompt_tokens)
        self.router.queue.labels("chat").set(n)

    def svc(self) -> dict[str, Any]:
        obj = self.kube.get(v1.API_VERSION, "LLMService", NS, "svc")
        assert obj is not None
        return obj

    def pools_spec(self) -> dict[str, int]:
        return {r: p["replicas"] for r, p in self.svc()["spec"]["pools"].items()}

    def status(self) -> dict[str, Any]:
        return dict(self.svc().get("status") or {})

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == kind)

    def events(self) -> list[dict[str, Any]]:
        return self.kube.list("v1", "Event", NS)


def test_first_tick_holds_and_says_rates_need_two_scrapes() -> None:
    env = Env()
    result = env.tick(0.0)
    assert result.decision.held
    assert "one scrape so far" in result.decision.held
    assert env.pools_spec() == {"prefill": 1, "decode": 1}
    assert env.condition("SLOAtRisk")["status"] == "Unknown"
    held = [d for d in env.status()["decisions"] if d["kind"] == "hold"]
    assert held[-1]["reason"] == "SignalsMissing"
    assert any(e["reason"] == "SignalsMissing" for e in env.events())


def test_managed_scales_up_on_load_then_down_after_stabilization() -> None:
    env = Env()
    env.tick(0.0)
    # 30 req/s of 2000-token prompts for a window: more workers on both sides.
    result = None
    for _ in range(3):
        result = env.tick(n=300, prompt=2000, output=200)
    assert result is not None
    pools = env.pools_spec()
    assert pools["prefill"] > 1
    assert pools["decode"] > 1
    decisions = env.status()["decisions"]
    ups = [d for d in decisions if d["kind"] == "scale"]
    assert ups
    assert ups[0]["reason"] == "Load"
    assert "arrivalRate" in ups[0]["inputs"]
    assert "prefill 1 ->" in ups[0]["message"]
    assert any(e["reason"] == "Load" for e in env.events())
    assert env.condition("SLOAtRisk")["status"] == "False"
    classes = env.status()["sloClasses"]
    assert classes[0]["name"] == "chat"
    assert classes[0]["attainment"] == 1.0
    assert env.status()["sloAttainment"] == "100.0%"
    peak = env.pools_spec()
    # Load falls to almost nothing: no scale-down before the 60 s window has passed...
    for _ in range(5):
        env.tick(n=1, prompt=2000, output=200)
        assert env.pools_spec() == peak
    # ...then one worker per tick, down to the minimum.
    for _ in range(30):
        env.tick(n=1, prompt=2000, output=200)
    assert env.pools_spec() == {"prefill": 1, "decode": 1}
    downs = [d for d in env.status()["decisions"] if d["reason"] == "Stabilized"]
    assert downs


def test_the_routers_queued_prompt_tokens_are_an_explicit_optional_signal() -> None:
    """`splitserve_router_queued_prompt_tokens` (the prompt tokens waiting at the routers' gate)
    reaches the observation and the decisions' inputs beside the queue's length; a router
    without the gauge reads as unknown (None), not as zero. No policy sizes on it."""
    from prometheus_client import Gauge

    env = Env()
    env.tick(0.0)
    result = env.tick(n=300, prompt=2000, output=200)
    assert result.observation is not None
    assert result.observation.router_queued_prompt_tokens is None  # the fake has no gauge
    tokens = Gauge(
        "splitserve_router_queued_prompt_tokens", "", ["slo_class"], registry=env.router.registry
    )
    tokens.labels("chat").set(4500)
    env.router.queue.labels("chat").set(3)
    result = env.tick(n=300, prompt=2000, output=200)
    assert result.observation is not None
    assert result.observation.router_queued_prompt_tokens == 4500
    assert result.observation.router_queue == 3
    scales = [d for d in env.status()["decisions"] if d["kind"] == "scale"]
    assert scales[-1]["inputs"]["routerQueuedPromptTokens"] == "4500", scales[-1]
    assert scales[-1]["inputs"]["routerQueue"] == "3", scales[-1]


def test_external_mode_writes_only_recommendations() -> None:
    env = Env(mode="External")
    env.tick(0.0)
    for _ in range(3):
        env.tick(n=300, prompt=2000, output=200)
    assert env.pools_spec() == {"prefill": 1, "decode": 1}
    pool = env.kube.get(v1.API_VERSION, "LLMPool", NS, "svc-prefill")
    assert pool is not None
    assert pool["spec"]["replicas"] == 1
    assert pool["status"]["recommendedReplicas"] > 1
    kinds = {d["kind"] for d in env.status()["decisions"]}
    assert "recommend" in kinds
    assert "scale" not in kinds


def test_stale_metrics_cause_no_action() -> None:
    env = Env()
    env.tick(0.0)
    env.tick(n=10)
    env.down = True
    before = env.pools_spec()
    result = env.tick(n=600, prompt=4000)  # a surge the loop cannot see
    assert result.decision.held
    assert "scrape failed" in result.decision.held
    assert env.pools_spec() == before
    # The router stays down: the last good scrape goes stale.
    result = env.tick(30.0)
    assert "stale" in result.decision.held
    assert env.condition("SLOAtRisk")["status"] == "Unknown"
    assert env.pools_spec() == before
    text = _metrics(env)
    assert 'splitserve_operator_decisions_total{kind="no-signal",reason="SignalsStale"' in text


def test_slo_at_risk_condition_names_class_and_pool_at_max() -> None:
    env = Env(pools={"prefill": {"replicas": 2, "maxReplicas": 2}, "decode": {"replicas": 1}})
    env.tick(0.0)
    env.tick(n=100, ttft_s=3.0, met=False, prompt=500, output=100)
    cond = env.condition("SLOAtRisk")
    assert cond["status"] == "True"
    assert cond["message"].startswith("class chat: TTFT p90 ")
    assert "prefill pool at max 2" in cond["message"]
    assert any(e["reason"] == "SLOAtRisk" and e["type"] == "Warning" for e in env.events())
    assert env.status()["sloAttainment"] == "0.0%"
    # The reconcile keeps the condition it does not own.
    env.reconcile()
    assert env.condition("SLOAtRisk")["status"] == "True"


def test_flip_before_scale_out_through_the_flip_machine() -> None:
    # Burst headroom off: the one-tick surge below would also size decode for its busiest 10 s
    # (15 req/s), leaving decode no headroom to give; the flip is what this test is about.
    env = Env(
        pools={"prefill": {"replicas": 1, "maxReplicas": 6}, "decode": {"replicas": 3}},
        scaling={
            "mode": "Managed",
            "intervalSeconds": 10,
            "scaleDownStabilizationSeconds": 60,
            "windowSeconds": 30,
            "burstWeight": 0,
        },
    )
    for i in range(2, 4):
        env.kube.create(worker_pod("svc", "w", f"svc-w-{i}", ip=f"10.0.0.{i + 1}"))
    env.reconcile()
    env.loads.kv_used = 0.05  # light load: the decode workers hold little KV (occupancy floor)
    env.tick(0.0)
    # Light load with short outputs: after a stabilization window decode starts giving back.
    for _ in range(12):
        env.tick(n=10, prompt=600, output=20)
        if env.pools_spec()["decode"] < 3:
            break
    assert env.pools_spec()["decode"] == 2
    # Prompts grow: prefill needs more; the decode worker still spare flips instead of a new pod.
    env.tick(n=150, prompt=4000, output=20)
    assert env.pools_spec()["decode"] == 1
    assert env.pools_spec()["prefill"] > 2
    flips = [d for d in env.status()["decisions"] if d["kind"] == "flip"]
    assert flips, env.status()["decisions"]
    assert flips[-1]["reason"] == "Rebalance"
    assert "decode -> prefill" in flips[-1]["message"]
    # The reconcile carries it out with the flip machine: fence, drain, SetRole, relabel.
    env.reconcile()
    assert ("drain", "10.0.0.4:50051") in env.workers.calls or any(
        m == "drain" for m, _ in env.workers.calls
    )
    assert any(m == "set_role" for m, _ in env.workers.calls)


def test_operator_metrics_exposed() -> None:
    env = Env()
    env.tick(0.0)
    env.tick(n=50)
    text = _metrics(env)
    for name in (
        "splitserve_operator_decisions_total",
        "splitserve_operator_pool_desired_replicas",
        "splitserve_operator_pool_current_replicas",
        "splitserve_operator_loop_duration_seconds_count",
        "splitserve_operator_signal_staleness_seconds",
        "splitserve_operator_slo_attainment",
    ):
        assert name in text


def _metrics(env: Env) -> str:
    from prometheus_client import generate_latest

    return generate_latest(env.registry).decode()


# -- the window ---------------------------------------------------------------------------------


def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    buckets = [(0.5, 10.0), (1.0, 30.0), (2.0, 40.0), (float("inf"), 40.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.75)
    assert histogram_quantile(0.9, buckets) == pytest.approx(1.6)
    assert histogram_quantile(0.9, []) is None


def test_window_counts_router_restart_from_zero() -> None:
    fake = FakeRouterMetrics()
    fake.serve(100)
    w = Window(60.0, 30.0)
    w.add(Snapshot(0.0, {ROUTER: parse(fake.text())}))
    restarted = FakeRouterMetrics()
    restarted.serve(20)
    w.add(Snapshot(10.0, {ROUTER: parse(restarted.text())}))
    pools = {Role.PREFILL: PoolSignal(Role.PREFILL, 1)}
    from splitserve.operator.control.signals import ClassTargets

    obs = w.observe(10.0, [ClassTargets("chat", 2.0, 0.1, 0.9, 0.9)], pools)
    assert obs.arrival_rate_per_s == pytest.approx(2.0)
    assert obs.classes[0].requests == 20


@pytest.mark.parametrize("queued_first", [False, True])
def test_window_counts_requests_shed_after_queueing(queued_first: bool) -> None:
    """A request queued at arrival and shed later is in the admission counter as `queued`
    only; the window reads the shed from the requests' outcome (it read 0 for these before)."""
    from splitserve.operator.control.signals import ClassTargets

    fake = FakeRouterMetrics()
    fake.serve(10)
    w = Window(60.0, 30.0)
    w.add(Snapshot(0.0, {ROUTER: parse(fake.text())}))
    fake.serve(4)
    fake.shed(6, queued_first=queued_first)
    w.add(Snapshot(10.0, {ROUTER: parse(fake.text())}))
    obs = w.observe(10.0, [ClassTargets("chat", 2.0, 0.1, 0.9, 0.9)], {})
    assert obs.shed == 6
    assert obs.classes[0].shed == 6
    assert obs.arrival_rate_per_s == pytest.approx(1.0)


def test_window_missing_slo_metrics_is_explicit() -> None:
    w = Window(60.0, 30.0)
    text = "# TYPE splitserve_router_requests_total counter\nsplitserve_router_requests_total 5\n"
    w.add(Snapshot(0.0, {ROUTER: parse(text)}))
    w.add(Snapshot(10.0, {ROUTER: parse(text)}))
    obs = w.observe(10.0, [], {})
    assert not obs.usable
    assert any(
        p.state is SignalState.MISSING and "without the SLO metrics" in p.reason
        for p in obs.problems
    )


def test_prometheus_source_reads_router_series_per_pod() -> None:
    import json

    body = {
        "status": "success",
        "data": {
            "result": [
                {
                    "metric": {
                        "__name__": "splitserve_router_admission_total",
                        "pod": "svc-router-abc",
                        "namespace": "default",
                        "slo_class": "chat",
                        "outcome": "admitted",
                    },
                    "value": [0, "42"],
                }
            ]
        },
    }
    seen: list[str] = []

    def get(url: str) -> str:
        seen.append(url)
        return json.dumps(body)

    out = prometheus_samples("http://prom:9090/", "default", "svc", get)
    assert out == {
        "svc-router-abc": {
            (
                "splitserve_router_admission_total",
                (("outcome", "admitted"), ("slo_class", "chat")),
            ): 42.0
        }
    }
    assert seen[0].startswith("http://prom:9090/api/v1/query?query=")
    assert "svc-router-" in seen[0]


def test_metrics_and_healthz_endpoint() -> None:
    import socket
    import urllib.error
    import urllib.request

    from splitserve.operator.control import server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = CollectorRegistry()
    OperatorMetrics(registry).slo_at_risk.labels("default/svc").set(1)
    ticks = {"default/svc": (100.0, 10.0)}
    now = [110.0]
    srv = server.serve(registry, server.health_of(lambda: ticks, lambda: now[0]), "127.0.0.1", port)
    try:
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            assert 'splitserve_operator_slo_at_risk{service="default/svc"} 1.0' in r.read().decode()
        with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
            assert r.status == 200
        now[0] = 200.0  # no tick for 100 s at a 10 s interval
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/healthz", timeout=5)
        assert err.value.code == 503
    finally:
        srv.shutdown()
        srv.server_close()


def test_prometheus_metrics_source_drives_the_loop() -> None:
    import json

    env = Env(
        scaling={
            "mode": "Managed",
            "intervalSeconds": 10,
            "windowSeconds": 30,
            "metricsSource": "Prometheus",
            "prometheusUrl": "http://prom:9090",
        }
    )
    seen: list[str] = []

    def prom(url: str) -> str:
        # Prometheus answers with the router's series, labelled with its pod.
        seen.append(url)
        result = [
            {
                "metric": {"__name__": name, "pod": "svc-router-0", **dict(labels)},
                "value": [0, str(value)],
            }
            for (name, labels), value in parse(env.router.text()).items()
        ]
        return json.dumps({"status": "success", "data": {"result": result}})

    env.controller.get = prom
    env.tick(0.0)
    for _ in range(3):
        env.tick(n=300, prompt=2000, output=200)
    assert seen
    assert all(u.startswith("http://prom:9090/api/v1/query?") for u in seen)
    assert env.pools_spec()["prefill"] > 1


def test_healthz_is_503_with_the_reason_while_start_up_fails_then_200() -> None:
    """Start-up is tracked once begun: 503 "starting", 503 naming the error and the next try
    while it fails (the clock is a fake: no timing), 200 once it succeeded."""
    from splitserve.operator.control import server

    clock = [1000.0]
    startup = server.Startup(clock=lambda: clock[0])
    ticks: dict[str, tuple[float, float]] = {}
    health = server.health_of(lambda: ticks, lambda: clock[0], startup.verdict)
    assert health() == (True, "ok: no service yet\n")  # untracked: judged by its loops only
    startup.begin()
    assert health() == (False, "starting: start-up not finished\n")
    startup.failed(ValueError("Invalid kube-config file. No configuration found.\nmore"), 60.0)
    assert health() == (
        False,
        "start-up failing: Invalid kube-config file. No configuration found, retrying in 60 s\n",
    )
    clock[0] += 45.0
    assert health()[1].endswith("retrying in 15 s\n")
    clock[0] += 30.0  # the next try is due (kopf runs it): not a negative wait
    assert health()[1].endswith("retrying in 0 s\n")
    startup.failed(RuntimeError(), 60.0)  # an error without a message: named by its type
    assert health() == (False, "start-up failing: RuntimeError, retrying in 60 s\n")
    startup.succeeded()
    assert health() == (True, "ok: no service yet\n")
    startup.begin()  # a late begin() does not undo a success
    assert health()[0]
    ticks["default/svc"] = (clock[0] - 100.0, 10.0)  # after start-up: the loops decide again
    ok, text = health()
    assert not ok
    assert "default/svc" in text
    assert "STALLED" in text
    startup.failed("cert-manager CRDs missing", None)
    assert health() == (False, "start-up failed: cert-manager CRDs missing; not retried\n")


def test_healthz_endpoint_answers_503_with_the_start_up_error() -> None:
    import socket
    import urllib.error
    import urllib.request

    from splitserve.operator.control import server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    startup = server.Startup(clock=lambda: 0.0)
    startup.begin()
    startup.failed(ValueError("Service host/port is not set."), 60.0)
    health = server.health_of(dict, lambda: 0.0, startup.verdict)
    srv = server.serve(CollectorRegistry(), health, "127.0.0.1", port)
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 503
        assert err.value.read().decode() == (
            "start-up failing: Service host/port is not set, retrying in 60 s\n"
        )
        startup.succeeded()
        with urllib.request.urlopen(url, timeout=5) as r:
            assert (r.status, r.read().decode()) == (200, "ok: no service yet\n")
    finally:
        srv.shutdown()
        srv.server_close()


def _series(env: Env, service: str = f"{NS}/svc") -> list[str]:
    """The exposed samples that name `service`."""
    return [
        line
        for line in _metrics(env).splitlines()
        if not line.startswith("#") and f'service="{service}"' in line
    ]


def test_a_deleted_service_leaves_no_series_and_no_health_entry() -> None:
    env = Env()
    env.tick(0.0)
    env.tick(n=50)
    assert _series(env)
    assert f"{NS}/svc" in env.controller.last_ticks()
    # kopf stops the service's daemon on deletion; the delete handler tells the loop.
    env.controller.forget(NS, "svc")
    assert _series(env) == []
    assert env.controller.last_ticks() == {}


def test_a_tick_that_finds_the_service_gone_forgets_it() -> None:
    env = Env()
    env.tick(0.0)
    env.tick(n=50)
    env.kube.delete(v1.API_VERSION, "LLMService", NS, "svc")
    env.tick(n=50)
    assert _series(env) == []
    assert env.controller.last_ticks() == {}


def test_a_removed_pool_or_slo_class_leaves_no_gauge() -> None:
    env = Env(
        sloClasses=[
            {"name": "chat", "ttftMs": 2000, "tpotMs": 100},
            {"name": "batch", "ttftMs": 9000, "tpotMs": 500},
        ]
    )
    env.tick(0.0)
    env.tick(n=50, slo_class="batch")
    env.tick(n=50, slo_class="batch")
    assert any('slo_class="batch"' in s for s in _series(env))
    assert any('role="decode"' in s for s in _series(env))
    env.kube.patch(
        v1.API_VERSION,
        "LLMService",
        NS,
        "svc",
        {
            "spec": {
                "sloClasses": [{"name": "chat", "ttftMs": 2000, "tpotMs": 100}],
                "workerGroups": [{"name": "w", "roles": ["mixed"]}],
                "pools": {"prefill": None, "decode": None, "mixed": {"replicas": 2}},
            }
        },
    )
    env.reconcile()
    env.tick(n=50)
    gauges = [s for s in _series(env) if not s.startswith("splitserve_operator_decisions")]
    assert not [s for s in gauges if 'slo_class="batch"' in s]
    assert not [s for s in gauges if 'role="decode"' in s or 'role="prefill"' in s]
    assert any('role="mixed"' in s for s in gauges)


def test_advice_is_withdrawn_when_the_loop_takes_over() -> None:
    """`status.recommendedReplicas` is advice for External and Manual modes; once the service
    switches to Managed the loop writes the pools itself and the old advice must not stay on
    the LLMPools (an HPA / KEDA reading it would act on a stale number)."""
    env = Env(mode="External")
    env.tick(0.0)
    for _ in range(3):
        env.tick(n=300, prompt=2000, output=200)
    pool = env.kube.get(v1.API_VERSION, "LLMPool", NS, "svc-prefill")
    assert pool is not None
    assert pool["status"]["recommendedReplicas"] > 1
    env.kube.patch(
        v1.API_VERSION, "LLMService", NS, "svc", {"spec": {"scaling": {"mode": "Managed"}}}
    )
    env.reconcile()
    env.tick(n=300, prompt=2000, output=200)
    for role in ("prefill", "decode"):
        pool = env.kube.get(v1.API_VERSION, "LLMPool", NS, f"svc-{role}")
        assert pool is not None
        assert "recommendedReplicas" not in (pool.get("status") or {}), role


def test_the_loop_waits_for_the_reconcile_to_enter_managed_from_the_live_sizes() -> None:
    """External -> Managed: until the reconcile has taken the live pool sizes into
    spec.pools (status.scalingMode still External), the loop's `current` is the stale number
    from before External; it must not write spec.pools from it."""
    env = Env(mode="External")
    env.tick(0.0)
    for role in ("prefill", "decode"):  # an HPA grew both pools
        env.kube.patch(v1.API_VERSION, "LLMPool", NS, f"svc-{role}", {"spec": {"replicas": 5}})
    env.reconcile()
    assert env.status()["scalingMode"] == "External"
    env.kube.patch(
        v1.API_VERSION, "LLMService", NS, "svc", {"spec": {"scaling": {"mode": "Managed"}}}
    )
    for _ in range(3):
        env.tick(n=300, prompt=2000, output=200)
    assert env.pools_spec() == {"prefill": 1, "decode": 1}
    env.reconcile()
    assert env.pools_spec() == {"prefill": 5, "decode": 5}
    assert env.status()["scalingMode"] == "Managed"


def test_a_router_queue_before_the_first_finish_scales_prefill() -> None:
    """Requests queued at the router, none finished yet: the operator's loop scales the prefill
    pool on the queue (it held before, "no request finished yet"), records why, and keeps
    decode (no output length to size it by)."""
    env = Env()
    env.tick(0.0)
    env.queue_at_router(40, 1000)
    result = env.tick()
    assert not result.decision.held, result.decision.held
    assert env.pools_spec() == {"prefill": 2, "decode": 1}
    scale = [d for d in env.status()["decisions"] if d["kind"] == "scale"]
    assert scale[-1]["message"].startswith("prefill 1 -> 2: no request finished yet"), scale
    assert scale[-1]["inputs"]["routerQueue"] == "40"
    assert env.condition("SLOAtRisk")["status"] == "True"
    assert env.condition("SLOAtRisk")["message"].startswith("router queue 40 waiting")


def test_from_zero_the_loop_starts_a_decode_worker_before_any_request_finished() -> None:
    """`minReplicas: 0` (the default) and both pools at zero, as after scaling an idle service
    to zero and restarting the operator: arrivals waiting at the router make the loop start a
    decode worker (the one role that finishes requests) beside the prefill one, and say why."""
    env = Env(
        pools={
            "prefill": {"replicas": 0, "minReplicas": 0, "maxReplicas": 6},
            "decode": {"replicas": 0, "minReplicas": 0, "maxReplicas": 6},
        }
    )
    for i in range(2):  # no worker pod at zero replicas: no load report either
        env.kube.delete("v1", "Pod", NS, f"svc-w-{i}")
    env.reconcile()
    env.tick(0.0)
    env.queue_at_router(5, 200)
    result = env.tick()
    assert not result.decision.held, result.decision.held
    assert env.pools_spec() == {"prefill": 1, "decode": 1}
    messages = [d["message"] for d in env.status()["decisions"] if d["kind"] == "scale"]
    assert any(
        m.startswith("decode 0 -> 1: no request finished yet; no worker can finish a request")
        for m in messages
    ), messages

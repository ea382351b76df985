"""The control loop inside the real operator (kopf) against an API server (kmock by default).

The routers are a fake metrics endpoint (METRICS_CONTRACT names; the real router emits them with
the SLO-router work) injected through `operator.control.runtime.configure`; workers are
`FakeWorkers` plus a fake load probe; the fake router serves `rate` requests/s between scrapes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from tests.fakes.kube import FakeWorkers, worker_pod
from tests.fakes.router_metrics import FakeRouterMetrics
from tests.integration.operator.conftest import controllers
from tests.integration.operator.test_operator_lifecycle import (
    NS,
    cleanup,
    operator,
    service_body,
    wait_for,
)

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator.control import runtime
from splitserve.operator.kube import RestKube
from splitserve.policy.planner.signals import WorkerLoad

pytestmark = [pytest.mark.k8s, pytest.mark.integration, pytest.mark.timeout(600)]


class Router:
    """Serves `rate` requests per second of wall time between scrapes (ticks may be slow on a
    busy machine; the rate the loop sees stays the rate asked for)."""

    def __init__(self) -> None:
        self.metrics = FakeRouterMetrics()
        self.rate = 0.0
        self.prompt = 2000
        self.down = False
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.owed = 0.0
        """Requests due but not served yet: the fraction carried between scrapes (at 0.5 req/s
        and a scrape a second, truncating each gap would serve none)."""

    def get(self, url: str) -> str:
        with self.lock:
            now = time.monotonic()
            self.owed += self.rate * (now - self.last)
            self.last = now
            n = int(self.owed)
            self.owed -= n
            if self.down:
                raise OSError("connection refused")
            if n:
                self.metrics.serve(n, prompt=self.prompt, output=200)
            return self.metrics.text()


class Loads:
    def load(self, address: str) -> WorkerLoad:
        return WorkerLoad(address, Role.MIXED, 0, 1, 0.2)


def autoscaled_body(name: str, mode: str) -> dict[str, Any]:
    return service_body(
        name,
        pools={
            "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4},
            "decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4},
        },
        sloClasses=[{"name": "chat", "ttftMs": 2000, "tpotMs": 100}],
        scaling={
            "mode": mode,
            "intervalSeconds": 1,
            "scaleDownStabilizationSeconds": 600,
            "windowSeconds": 3,
        },
    )


def start_router(kube: RestKube, service: str) -> None:
    pod = worker_pod(service, "w", f"{service}-router-0", ip="10.9.0.1")
    pod["metadata"]["labels"][v1.LABEL_COMPONENT] = "router"
    status = pod.pop("status")
    kube.create(pod)
    kube.patch("v1", "Pod", NS, pod["metadata"]["name"], {"status": status}, "status")


def pools(kube: RestKube, service: str) -> dict[str, int]:
    svc = kube.get(v1.API_VERSION, "LLMService", NS, service) or {}
    return {r: p.get("replicas", 0) for r, p in (svc.get("spec") or {}).get("pools", {}).items()}


def decisions(kube: RestKube, service: str) -> list[dict[str, Any]]:
    svc = kube.get(v1.API_VERSION, "LLMService", NS, service) or {}
    return list((svc.get("status") or {}).get("decisions") or [])


def test_managed_scales_up_and_stale_metrics_hold(api_server: str, kube: RestKube) -> None:
    router = Router()
    runtime.configure(runtime.ControlConfig(get=router.get, loads=Loads()))
    svc = "auto"
    try:
        with operator(api_server, FakeWorkers()), controllers(kube, NS):
            kube.create(autoscaled_body(svc, "Managed"))
            wait_for("pools", lambda: kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-decode"))
            start_router(kube, svc)
            # 40 requests/s of 2000-token prompts: more prefill workers.
            router.rate = 40.0
            wait_for("scale up", lambda: pools(kube, svc).get("prefill", 0) > 1, timeout=90)
            # The loop writes the replicas first, then reports the decision in status and as an
            # Event: a reader can see the new size a moment before the report (a clean-clone CI
            # run on 2 loaded cores did), so wait for the report rather than read it at once.
            wait_for(
                "scale decision",
                lambda: any(d["kind"] == "scale" for d in decisions(kube, svc)),
                timeout=30,
            )
            ups = [d for d in decisions(kube, svc) if d["kind"] == "scale"]
            assert ups[0].get("reason") in ("Load", "SLOPressure"), decisions(kube, svc)

            def service_events() -> list[dict[str, Any]]:
                return [
                    e
                    for e in kube.list("v1", "Event", NS)
                    if e.get("involvedObject", {}).get("name") == svc
                ]

            wait_for("scale event", lambda: bool(service_events()), timeout=30)
            assert any(e["reason"] in ("Load", "SLOPressure") for e in service_events())
            # The Deployment follows the pools (the reconcile sizes it).
            wait_for(
                "deployment grows",
                lambda: (
                    (kube.get("apps/v1", "Deployment", NS, f"{svc}-w") or {})
                    .get("spec", {})
                    .get("replicas", 0)
                    > 2
                ),
            )
            # The router goes away: no action, the reason recorded.
            router.down = True
            router.rate = 40.0
            wait_for(
                "hold recorded",
                lambda: any(
                    d["kind"] == "hold" and "scrape failed" in d["message"]
                    for d in decisions(kube, svc)
                ),
                timeout=30,
            )
            held_at = pools(kube, svc)
            time.sleep(3)
            assert pools(kube, svc) == held_at
            cleanup(kube, svc)
    finally:
        runtime.configure(runtime.ControlConfig())


def test_external_mode_writes_only_recommendations(api_server: str, kube: RestKube) -> None:
    router = Router()
    runtime.configure(runtime.ControlConfig(get=router.get, loads=Loads()))
    svc = "advice"
    try:
        with operator(api_server, FakeWorkers()), controllers(kube, NS):
            kube.create(autoscaled_body(svc, "External"))
            wait_for("pools", lambda: kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-prefill"))
            start_router(kube, svc)
            router.rate = 40.0

            def recommended() -> bool:
                pool = kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-prefill") or {}
                return int((pool.get("status") or {}).get("recommendedReplicas", 0)) > 1

            wait_for("recommendation", recommended, timeout=90)
            pool = kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-prefill") or {}
            assert pool["spec"]["replicas"] == 1
            assert pools(kube, svc) == {"prefill": 1, "decode": 1}
            assert any(d["kind"] == "recommend" for d in decisions(kube, svc))
            cleanup(kube, svc)
    finally:
        runtime.configure(runtime.ControlConfig())


def test_managed_scales_down_after_stabilization(api_server: str, kube: RestKube) -> None:
    router = Router()
    runtime.configure(runtime.ControlConfig(get=router.get, loads=Loads()))
    svc = "shrink"
    body = autoscaled_body(svc, "Managed")
    body["spec"]["pools"]["prefill"]["replicas"] = 3
    body["spec"]["scaling"]["scaleDownStabilizationSeconds"] = 5
    try:
        with operator(api_server, FakeWorkers()), controllers(kube, NS):
            kube.create(body)
            wait_for("pools", lambda: kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-decode"))
            start_router(kube, svc)
            router.rate = 0.5  # far below what 3 prefill workers serve
            wait_for("scale down", lambda: pools(kube, svc).get("prefill", 3) < 3, timeout=120)
            downs = [d for d in decisions(kube, svc) if d["kind"] == "scale"]
            assert any(d.get("reason") == "Stabilized" for d in downs), decisions(kube, svc)
            wait_for(
                "deployment shrinks",
                lambda: (
                    (kube.get("apps/v1", "Deployment", NS, f"{svc}-w") or {})
                    .get("spec", {})
                    .get("replicas", 99)
                    < 4
                ),
                timeout=120,
            )
            cleanup(kube, svc)
    finally:
        runtime.configure(runtime.ControlConfig())


def test_planner_advise_reports_a_plan_and_writes_nothing(api_server: str, kube: RestKube) -> None:
    router = Router()
    runtime.configure(runtime.ControlConfig(get=router.get, loads=Loads()))
    svc = "planned"
    body = autoscaled_body(svc, "Manual")
    body["spec"]["planner"] = {"mode": "Advise", "intervalSeconds": 5}
    try:
        with operator(api_server, FakeWorkers()), controllers(kube, NS):
            kube.create(body)
            wait_for("pools", lambda: kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-decode"))
            start_router(kube, svc)
            router.rate = 40.0
            wait_for(
                "plan",
                lambda: any(d["kind"] == "plan" for d in decisions(kube, svc)),
                timeout=90,
            )
            plan = next(d for d in decisions(kube, svc) if d["kind"] == "plan")
            assert plan["reason"] == "PlanAdvised"
            assert "P:D" in plan["message"]
            assert pools(kube, svc) == {"prefill": 1, "decode": 1}
            cleanup(kube, svc)
    finally:
        runtime.configure(runtime.ControlConfig())

"""The real operator (kopf, `splitserve.operator.handlers`) against an API server.

kmock by default, a real cluster with `TARGET=real KUBECONFIG=...`. What the API server
lacks, `conftest.controllers` plays: on kmock the Deployment / ReplicaSet controller (with the
real one's deletion order) and a kubelet; on a real control plane the kubelet only. Workers are
`FakeWorkers` (no gRPC), which record the flip protocol's calls.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tests.fakes.controllers import DeploymentController
from tests.fakes.kube import FakeWorkers
from tests.fakes.rbac import KOPF_NEEDS, ApiCall, chart_rules, denied, needed, watches
from tests.integration.operator.conftest import controllers

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator import handlers, render
from splitserve.operator.kube import KubeError, RestKube, resource_path
from splitserve.operator.reconcile import Settings
from splitserve.policy.planner.flip import FlipProgress, Step

pytestmark = [pytest.mark.k8s, pytest.mark.integration, pytest.mark.timeout(300)]

NS = "default"
TARGET = os.environ.get("TARGET", "kmock")
T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 45.0) -> T:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except KubeError as err:
            last = err
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


OPERATOR_TOKEN = "operator-sa-token"


def operator_kubeconfig(api_server: str) -> str:
    """On kmock: a copy of the test's kubeconfig with a token of its own, so the recorded calls
    show which identity made them (`$KUBECONFIG` stays the tokenless one)."""
    if TARGET != "kmock":
        return api_server
    import yaml

    config = yaml.safe_load(Path(api_server).read_text())
    config["users"] = [{"name": "test", "user": {"token": OPERATOR_TOKEN}}]
    path = Path(api_server).with_name("operator-kubeconfig")
    path.write_text(yaml.safe_dump(config))
    return str(path)


@contextmanager
def operator(api_server: str, workers: FakeWorkers) -> Iterator[Any]:
    from kopf.testing import KopfRunner

    config = handlers.OperatorConfig(
        settings=Settings(router_image="router:test", drain_wait_s=0.0),
        interval_s=0.3,
        kubeconfig=operator_kubeconfig(api_server),
        workers=workers,
    )
    args = ["run", "--standalone", "--namespace", NS]
    registry = handlers.registry(config)
    with restored_logging(), KopfRunner(args, timeout=60, registry=registry) as runner:
        yield runner
    assert runner.exception is None, runner.output[-3000:]
    assert runner.exit_code == 0, runner.output[-3000:]


def exists(kube: RestKube, api_version: str, kind: str, name: str) -> Callable[[], bool]:
    return lambda: kube.get(api_version, kind, NS, name) is not None


def gone(kube: RestKube, api_version: str, kind: str, name: str) -> Callable[[], bool]:
    return lambda: kube.get(api_version, kind, NS, name) is None


@contextmanager
def restored_logging() -> Iterator[None]:
    """kopf configures logging process-wide (root level and handlers, asyncio's logger)."""
    root, aio = logging.getLogger(), logging.getLogger("asyncio")
    saved = (root.level, list(root.handlers), aio.propagate, list(aio.handlers))
    try:
        yield
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        aio.propagate = saved[2]
        aio.handlers[:] = saved[3]


def operator_writes(api_calls: Callable[[], list[ApiCall]]) -> int:
    return sum(
        1
        for c in api_calls()
        if c.user_agent.startswith("splitserve-operator")
        and c.method in ("POST", "PATCH", "DELETE")
    )


def quiet(api_calls: Callable[[], list[ApiCall]], seconds: float) -> bool:
    """Whether the operator wrote nothing for `seconds` (several reconcile ticks)."""
    before = operator_writes(api_calls)
    time.sleep(seconds)
    return operator_writes(api_calls) == before


def service_body(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "m", "source": "org/m"},
        "engine": {"kind": "sim", "image": "img:1"},
        "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
        "scaling": {"mode": "Manual"},
    }
    body.update(spec)
    return {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMService",
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


def worker_pods(kube: RestKube, service: str) -> list[dict[str, Any]]:
    return kube.list("v1", "Pod", NS, render.worker_selector(service))


def roles(kube: RestKube, service: str) -> list[str]:
    pods = worker_pods(kube, service)
    return sorted((p["metadata"].get("labels") or {}).get(v1.LABEL_ROLE, "-") for p in pods)


def pod_names(kube: RestKube, service: str) -> set[str]:
    return {p["metadata"]["name"] for p in worker_pods(kube, service)}


def retired(kube: RestKube, service: str) -> str | None:
    """The worker the operator chose to remove (its `Retiring` Event names it)."""
    for event in kube.list("v1", "Event", NS):
        involved = event.get("involvedObject") or {}
        if event.get("reason") == "Retiring" and involved.get("name") == service:
            return str(event["message"]).split(":", 1)[0]
    return None


def fenced(kube: RestKube, service: str) -> list[str]:
    pods = kube.list("v1", "Pod", NS, {v1.LABEL_SERVICE: service})
    return [p["metadata"]["name"] for p in pods if v1.LABEL_FENCED in p["metadata"]["labels"]]


def condition(kube: RestKube, service: str, type_: str) -> dict[str, Any] | None:
    svc = kube.get(v1.API_VERSION, "LLMService", NS, service)
    for c in ((svc or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return None


def scale(kube: RestKube, service: str, role: Role, replicas: int) -> None:
    """`kubectl scale llmpool/<service>-<role> --replicas=N`: a merge patch on /scale."""
    name = f"{service}-{role.value}"
    wait_for(name, lambda: kube.get(v1.API_VERSION, "LLMPool", NS, name))
    path = resource_path(v1.API_VERSION, "LLMPool", NS, name, "scale")
    kube._call("PATCH", path, {"spec": {"replicas": replicas}}, "application/merge-patch+json")


def cleanup(kube: RestKube, service: str) -> None:
    kube.delete(v1.API_VERSION, "LLMService", NS, service)
    for pod in kube.list("v1", "Pod", NS, {v1.LABEL_SERVICE: service}):
        kube.delete("v1", "Pod", NS, pod["metadata"]["name"])


def test_create_update_scale_flip_delete(
    api_server: str, kube: RestKube, api_calls: Callable[[], list[ApiCall]] | None
) -> None:
    workers = FakeWorkers()
    svc = "life"
    with operator(api_server, workers) as runner:
        # create
        kube.create(service_body(svc))
        wait_for("worker Deployment", lambda: kube.get("apps/v1", "Deployment", NS, f"{svc}-w"))
        for api_version, kind, name in (
            (v1.API_VERSION, "LLMPool", f"{svc}-prefill"),
            (v1.API_VERSION, "LLMPool", f"{svc}-decode"),
            ("v1", "ConfigMap", f"{svc}-router"),
            ("v1", "ServiceAccount", f"{svc}-router"),
            ("v1", "Service", svc),
        ):
            wait_for(kind, exists(kube, api_version, kind, name))
        nr = wait_for("NotRoutable", lambda: condition(kube, svc, "NotRoutable"))
        assert nr["status"] == "True"
        assert "matched 0 pods" in nr["message"]

        # pods appear (a ReplicaSet creates them, a kubelet runs them) and get roles
        with controllers(kube, NS) as deployments:
            exercise(kube, svc, workers, api_calls, deployments)
    cleanup(kube, svc)
    assert "Traceback" not in runner.output, runner.output[-3000:]
    if api_calls is not None:
        check_identity_and_rbac(api_calls)


def exercise(
    kube: RestKube,
    svc: str,
    workers: FakeWorkers,
    api_calls: Callable[[], list[ApiCall]] | None,
    deployments: DeploymentController | None,
) -> None:
    wait_for("roles", lambda: roles(kube, svc) == ["decode", "decode", "prefill"])
    wait_for(
        "routable",
        lambda: (condition(kube, svc, "NotRoutable") or {}).get("status") == "False",
    )
    if api_calls is not None:
        # Steady state: reconciling again and again writes nothing.
        wait_for("a quiet second", lambda: quiet(api_calls, 1.0), timeout=40)
    pool = wait_for(
        "pool status",
        lambda: (kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-decode") or {}).get("status"),
    )
    assert pool["selector"].startswith("splitserve.io/component=worker")

    # update the service
    kube.patch(v1.API_VERSION, "LLMService", NS, svc, {"spec": {"router": {"replicas": 2}}})
    wait_for(
        "router replicas",
        lambda: (
            (kube.get("apps/v1", "Deployment", NS, f"{svc}-router") or {})
            .get("spec", {})
            .get("replicas")
            == 2
        ),
    )

    # scale through /scale: one prefill worker flips to decode without a restart
    workers.calls.clear()
    before = pod_names(kube, svc)
    scale(kube, svc, Role.PREFILL, 0)
    scale(kube, svc, Role.DECODE, 3)
    wait_for("flip", lambda: roles(kube, svc) == ["decode", "decode", "decode"])
    wait_for("unfenced", lambda: not fenced(kube, svc))
    assert pod_names(kube, svc) == before  # no pod deleted, none created
    # One flip: no worker was retired on the way (the two scales were coalesced).
    assert [m for m, _ in workers.calls if m != "load"][:3] == [
        "drain",
        "set_role",
        "resume",
    ], " ".join(m for m, _ in workers.calls)
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 3  # Manual mode: the operator did not write it back
    assert all(
        v1.LABEL_FENCED not in (p["metadata"].get("labels") or {})
        for p in kube.list("v1", "Pod", NS, {v1.LABEL_SERVICE: svc})
    )

    # shrink: the worker the operator chose is drained, then the ReplicaSet deletes it
    scale(kube, svc, Role.DECODE, 2)
    chosen = wait_for("a worker retired", lambda: retired(kube, svc))
    assert chosen in before
    wait_for("chosen pod gone", lambda: pod_names(kube, svc) == before - {chosen})
    if deployments is not None:
        assert deployments.deleted == [chosen]

    # delete: everything the service owns goes
    kube.delete(v1.API_VERSION, "LLMService", NS, svc)
    wait_for("service gone", lambda: kube.get(v1.API_VERSION, "LLMService", NS, svc) is None)
    for api_version, kind, name in (
        ("apps/v1", "Deployment", f"{svc}-w"),
        ("apps/v1", "Deployment", f"{svc}-router"),
        (v1.API_VERSION, "LLMPool", f"{svc}-decode"),
        ("v1", "ConfigMap", f"{svc}-router"),
        ("v1", "Service", svc),
    ):
        wait_for(f"{kind} gone", gone(kube, api_version, kind, name))


def check_identity_and_rbac(api_calls: Callable[[], list[ApiCall]]) -> None:
    # One identity: kopf's own calls use --kubeconfig too, not $KUBECONFIG.
    ours = [c for c in api_calls() if c.user_agent.startswith(("kopf/", "splitserve-op"))]
    assert ours
    assert {c.authorization for c in ours} == {f"Bearer {OPERATOR_TOKEN}"}
    # Every call the operator and kopf made is allowed by the chart's RBAC ...
    helpers = Path(__file__).resolve().parents[3] / "charts/splitserve/templates/_helpers.tpl"
    assert denied(ours, chart_rules(helpers)) == []
    # ... and kopf needed only what the unit test's derivation assumes of it.
    kopf_calls = [c for c in ours if c.user_agent.startswith("kopf/")]
    assert needed(kopf_calls) <= KOPF_NEEDS | watches(handlers.CACHED_KINDS)


def test_operator_restart_mid_flip_resumes(api_server: str, kube: RestKube) -> None:
    workers = FakeWorkers()
    svc = "restart"
    kube.create(service_body(svc, pools={"prefill": {"replicas": 2}, "decode": {"replicas": 1}}))
    with controllers(kube, NS):
        restart_mid_flip(api_server, kube, svc, workers)
    cleanup(kube, svc)


def restart_mid_flip(api_server: str, kube: RestKube, svc: str, workers: FakeWorkers) -> None:
    with operator(api_server, workers):
        wait_for("roles", lambda: roles(kube, svc) == ["decode", "prefill", "prefill"])
        # Keep every worker busy, so the flip stops at the drain step.
        for running_pod in worker_pods(kube, svc):
            workers.in_flight[f"{running_pod['status']['podIP']}:50051"] = 5
        scale(kube, svc, Role.PREFILL, 1)
        scale(kube, svc, Role.DECODE, 2)

        def draining() -> str | None:
            for p in kube.list("v1", "Pod", NS, {v1.LABEL_SERVICE: svc}):
                note = (p["metadata"].get("annotations") or {}).get(v1.ANNOTATION_FLIP)
                if FlipProgress.decode(note) == FlipProgress(Step.DRAIN, Role.PREFILL, Role.DECODE):
                    return str(p["metadata"]["name"])
            return None

        victim = wait_for("flip at drain", draining)
    # The operator is gone; the flip's progress and the fence stay on the pod.
    pod = kube.get("v1", "Pod", NS, victim)
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    assert pod["metadata"]["labels"][v1.LABEL_ROLE] == "prefill"
    # A new operator, and the worker finishes its work: the flip completes.
    fresh = FakeWorkers()
    with operator(api_server, fresh):
        wait_for("flip done", lambda: roles(kube, svc) == ["decode", "decode", "prefill"])
        wait_for("unfenced", lambda: not fenced(kube, svc))
        methods = [m for m, _ in fresh.calls if m != "load"]
        assert methods[:3] == ["drain", "set_role", "resume"]
        pod = kube.get("v1", "Pod", NS, victim)
        assert pod is not None
        assert v1.LABEL_FENCED not in pod["metadata"]["labels"]
        assert v1.ANNOTATION_FLIP not in (pod["metadata"].get("annotations") or {})
        kube.delete(v1.API_VERSION, "LLMService", NS, svc)
        wait_for("service gone", lambda: kube.get(v1.API_VERSION, "LLMService", NS, svc) is None)

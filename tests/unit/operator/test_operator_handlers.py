"""kopf handlers called directly with fake kwargs, over the in-memory API server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from splitserve.api import v1alpha1 as v1
from splitserve.operator import handlers
from splitserve.operator.kube import KubeError
from tests.fakes.kube import FakeWorkers, MemoryKube, worker_pod

NS = "default"
LOG = logging.getLogger("test")


@pytest.fixture
def kube() -> Iterator[MemoryKube]:
    memory = MemoryKube()
    handlers.configure(
        handlers.OperatorConfig(kube_factory=lambda: memory, workers=FakeWorkers(), interval_s=0)
    )
    yield memory
    handlers.configure(handlers.OperatorConfig())


def create_service(kube: MemoryKube, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "m", "source": "org/m"},
        "engine": {"kind": "sim", "image": "img:1"},
        "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        "scaling": {"mode": "External"},
    }
    body.update(spec)
    return kube.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": "tiny", "namespace": NS},
            "spec": body,
        }
    )


def test_reconcile_handler_creates_children(kube: MemoryKube) -> None:
    create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, logger=LOG)
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is not None
    assert kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode") is not None


def test_invalid_spec_is_reported_and_backed_off(
    kube: MemoryKube, caplog: pytest.LogCaptureFixture
) -> None:
    create_service(kube, pools={"mixed": {"replicas": 1}})
    with caplog.at_level(logging.DEBUG, logger="test"):
        handlers.reconcile_service(name="tiny", namespace=NS, logger=LOG)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    ready = svc["status"]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert "spec.pools.mixed" in ready["message"]
    assert "errors.pydantic.dev" not in ready["message"]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].exc_info is None  # one line, no traceback
    # The daemon's next ticks are inside the back-off: no request, no log line.
    writes = len(kube.writes)
    handlers.control_loop(name="tiny", namespace=NS, stopped=StopAfter(3), logger=LOG)  # type: ignore[arg-type]
    assert len(kube.writes) == writes
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    events = [o for k, o in kube.objects.items() if k[1] == "Event"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "InvalidSpec")]
    assert events[0]["involvedObject"]["name"] == "tiny"


def test_forbidden_is_permanent_reported_with_object_and_field(
    kube: MemoryKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_service(kube)
    real_create = kube.create

    def forbid_deployments(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Deployment":
            raise KubeError(403, 'deployments.apps is forbidden: User "sa" cannot create')
        return real_create(obj)

    monkeypatch.setattr(kube, "create", forbid_deployments)
    handlers.reconcile_service(name="tiny", namespace=NS, logger=LOG)  # does not raise
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    conds = {c["type"]: c for c in svc["status"]["conditions"]}
    assert conds["Ready"]["status"] == "False"
    assert conds["Ready"]["reason"] == "Forbidden"
    assert conds["Degraded"]["status"] == "True"
    message = conds["Ready"]["message"]
    assert message.startswith("create Deployment tiny-w (from spec.workerGroups[w]): 403 ")
    assert ("default", "tiny") in handlers._state.failures


def test_conflicts_are_temporary(kube: MemoryKube, monkeypatch: pytest.MonkeyPatch) -> None:
    create_service(kube)

    def conflict(*args: Any, **kwargs: Any) -> Any:
        raise KubeError(409, "conflict")

    monkeypatch.setattr(kube, "create", conflict)
    with pytest.raises(kopf.TemporaryError):
        handlers.reconcile_service(name="tiny", namespace=NS, logger=LOG)


def test_delete_handler_removes_owned_objects(kube: MemoryKube) -> None:
    svc = create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, logger=LOG)
    handlers.delete_service(name="tiny", namespace=NS, uid=svc["metadata"]["uid"], logger=LOG)
    assert [k for k in kube.objects if k[1] not in ("LLMService", "Event")] == []


def test_pool_event_reconciles_on_replica_change_only(kube: MemoryKube) -> None:
    create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, logger=LOG)
    for i in range(3):
        kube.create(worker_pod("tiny", "w", f"p{i}", ip=f"10.0.0.{i + 1}"))
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None

    def event(body: dict[str, Any]) -> None:
        kwargs: dict[str, Any] = {
            "event": {"type": "MODIFIED", "object": body},
            "body": kopf.Body(body),  # type: ignore[arg-type]
            "namespace": NS,
        }
        if handlers.replicas_changed(**kwargs):
            handlers.pool_changed(body=kwargs["body"], namespace=NS, logger=LOG)

    event(pool)  # first sighting: remembered, nothing done
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 2
    pool = kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-decode", {"spec": {"replicas": 2}})
    event(pool)
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 3
    event(pool)  # a status-only event: nothing to do
    # External mode: the operator never wrote the pool's replicas back.
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 2


class StopAfter:
    def __init__(self, n: int) -> None:
        self.n = n

    def wait(self, timeout: float | None = None) -> bool:
        self.n -= 1
        return self.n < 0


def test_control_loop_reconciles_until_stopped(kube: MemoryKube) -> None:
    create_service(kube)
    handlers.control_loop(name="tiny", namespace=NS, stopped=StopAfter(2), logger=LOG)  # type: ignore[arg-type]
    assert kube.get("apps/v1", "Deployment", NS, "tiny-router") is not None


def test_control_loop_survives_errors(kube: MemoryKube) -> None:
    create_service(kube, pools={"mixed": {"replicas": 1}})
    handlers.control_loop(name="tiny", namespace=NS, stopped=StopAfter(2), logger=LOG)  # type: ignore[arg-type]


def test_login_uses_the_kubeconfig_flag_not_the_environment(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def kubeconfig(name: str, server: str, token: str) -> str:
        path = tmp_path / name
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
            f"users: [{{name: u, user: {{token: {token}}}}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "current-context: x\n"
        )
        return str(path)

    monkeypatch.setenv("KUBECONFIG", kubeconfig("admin", "https://admin:6443", "admin-token"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")  # not in a pod
    flag = kubeconfig("sa", "https://sa:6443", "sa-token")
    handlers.configure(handlers.OperatorConfig(kubeconfig=flag))
    info = handlers.login(settings=kopf.OperatorSettings())
    assert (info.server, info.scheme, info.token) == ("https://sa:6443", "Bearer", "sa-token")
    handlers.configure(handlers.OperatorConfig())

"""The operator's own metrics: reconciles (by resource and result), reconcile errors and
duration, and every Kubernetes API request (by verb and code) through `RestKube`'s one place."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.operator import handlers, reconcile
from splitserve.operator.control import runtime
from splitserve.operator.kube import KubeError, RestKube
from tests.fakes.kube import FakeWorkers, MemoryKube

NS = "default"
LOG = logging.getLogger("test")


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh operator metrics registry for each test (the runtime's is process-wide)."""
    config = runtime.ControlConfig()
    runtime.configure(config)
    yield config.registry
    runtime.configure(runtime.ControlConfig())


@pytest.fixture
def memo() -> kopf.Memo:
    return handlers.memo(handlers.OperatorConfig(workers=FakeWorkers(), interval_s=0))


@pytest.fixture
def kube(memo: kopf.Memo) -> MemoryKube:
    memory = MemoryKube()
    memo["operator"].config.kube_factory = lambda: memory
    return memory


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


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def reconciles(registry: CollectorRegistry, resource: str, result: str) -> float:
    return value(registry, "splitserve_operator_reconciles_total", resource=resource, result=result)


def test_a_successful_reconcile_is_counted_and_timed(
    registry: CollectorRegistry, kube: MemoryKube, memo: kopf.Memo
) -> None:
    create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    handlers.tick(name="tiny", namespace=NS, memo=copy.copy(memo), logger=LOG)
    assert reconciles(registry, "LLMService", "success") == 2
    assert reconciles(registry, "LLMService", "error") == 0
    count = "splitserve_operator_reconcile_duration_seconds_count"
    assert value(registry, count, resource="LLMService") == 2
    total = value(
        registry, "splitserve_operator_reconcile_duration_seconds_sum", resource="LLMService"
    )
    assert total > 0


def test_an_invalid_spec_is_an_error_then_backoff(
    registry: CollectorRegistry, kube: MemoryKube, memo: kopf.Memo
) -> None:
    create_service(kube, pools={"mixed": {"replicas": 1}})
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    assert reconciles(registry, "LLMService", "error") == 1
    errors = "splitserve_operator_reconcile_errors_total"
    assert value(registry, errors, resource="LLMService", reason="InvalidSpec") == 1
    service_memo = copy.copy(memo)
    for _ in range(3):
        handlers.tick(name="tiny", namespace=NS, memo=service_memo, logger=LOG)
    assert reconciles(registry, "LLMService", "backoff") == 3
    assert reconciles(registry, "LLMService", "error") == 1


def test_api_errors_and_bugs_are_counted_by_reason(
    registry: CollectorRegistry,
    kube: MemoryKube,
    memo: kopf.Memo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    create_service(kube)

    def conflict(*args: Any, **kwargs: Any) -> Any:
        raise KubeError(409, "conflict")

    monkeypatch.setattr(kube, "create", conflict)
    with pytest.raises(kopf.TemporaryError):
        handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    errors = "splitserve_operator_reconcile_errors_total"
    assert value(registry, errors, resource="LLMService", reason="Conflict") == 1

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(reconcile, "reconcile", bug)
    with pytest.raises(ZeroDivisionError):
        handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    assert value(registry, errors, resource="LLMService", reason="Unexpected") == 1
    assert reconciles(registry, "LLMService", "error") == 2


def test_a_pool_change_counts_as_an_llmpool_reconcile(
    registry: CollectorRegistry, kube: MemoryKube, memo: kopf.Memo
) -> None:
    create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    body = kopf.Body(pool)  # type: ignore[arg-type]
    handlers.pool_changed(body=body, namespace=NS, memo=memo, logger=LOG)
    assert reconciles(registry, "LLMPool", "success") >= 1


# -- the API server: every request through RestKube._call ----------------------------------


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self._data = json.dumps(body).encode()

    def read(self) -> bytes:
        return self._data


class _ApiClient:
    """The official client's two calls `RestKube` makes, answering from a script."""

    def __init__(self) -> None:
        self.answers: list[_Response | Exception] = []
        self.user_agent = ""

    def param_serialize(self, **kw: Any) -> tuple[Any, ...]:
        return kw["method"], kw["resource_path"], kw["header_params"], kw["body"], []

    def call_api(self, *args: Any, **kw: Any) -> _Response:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_every_api_request_is_counted_by_verb_and_code_and_timed(
    registry: CollectorRegistry,
) -> None:
    client = _ApiClient()
    kube = RestKube(client, runtime.observe_api)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS}}
    client.answers = [
        _Response(200, pod),
        _Response(404, {"message": "not found"}),
        _Response(200, {"items": [pod]}),
        _Response(201, pod),
        _Response(200, pod),
        _Response(200, {}),
        _Response(422, {"message": "invalid"}),
        ConnectionResetError("reset"),
    ]
    assert kube.get("v1", "Pod", NS, "p") == pod
    assert kube.get("v1", "Pod", NS, "gone") is None
    assert kube.list("v1", "Pod", NS) == [pod]
    kube.create(pod)
    kube.patch("v1", "Pod", NS, "p", {"metadata": {"labels": {"a": "b"}}})
    assert kube.delete("v1", "Pod", NS, "p")
    with pytest.raises(KubeError):
        kube.create(pod)
    with pytest.raises(ConnectionResetError):
        kube.get("v1", "Pod", NS, "p")
    requests = "splitserve_operator_kube_requests_total"
    expected = {
        ("get", "200"): 1,
        ("get", "404"): 1,
        ("list", "200"): 1,
        ("create", "201"): 1,
        ("patch", "200"): 1,
        ("delete", "200"): 1,
        ("create", "422"): 1,
        ("get", "error"): 1,
    }
    for (verb, code), n in expected.items():
        assert value(registry, requests, verb=verb, code=code) == n, (verb, code)
    counts = "splitserve_operator_kube_request_duration_seconds_count"
    assert value(registry, counts, verb="get") == 3
    assert value(registry, counts, verb="create") == 2


def test_the_operator_client_reports_to_the_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's own client (no kube_factory) is a RestKube that reports its requests."""
    import kubernetes

    monkeypatch.setattr(
        handlers, "load_configuration", lambda path: kubernetes.client.Configuration()
    )
    op = handlers.Operator(handlers.OperatorConfig(cache=False))
    kube = op.kube()
    assert isinstance(kube, RestKube)
    assert kube.observe is runtime.observe_api

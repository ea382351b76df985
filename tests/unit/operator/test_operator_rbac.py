"""The chart's RBAC is exactly what the operator and kopf use.

The rules are derived from the API calls the operator makes (recorded while reconciling through
every path: create, drift repair, roles, events and their repeats, failures, pruning, deletion),
the admission and escalation checks those calls trigger, and the watches kopf runs for it; then
compared with the chart's Role / ClusterRole, both ways.
"""

from __future__ import annotations

import datetime
import tempfile
from pathlib import Path
from typing import Any

import pytest

from splitserve.api import v1alpha1 as v1
from splitserve.operator import certs, handlers, render
from splitserve.operator import reconcile as rc
from splitserve.operator.kube import OWNED_KINDS, KubeError
from tests.fakes.kube import FakeWorkers, MemoryKube, worker_pod
from tests.fakes.rbac import (
    KOPF_NEEDS,
    ApiCall,
    RbacAttributes,
    RecordingKube,
    attributes,
    chart_rules,
    denied,
    granted,
    needed,
    rendered_rules,
    watches,
)

ROOT = Path(__file__).resolve().parents[3]
HELPERS = ROOT / "charts/splitserve/templates/_helpers.tpl"
NS = "ml"
NOW = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("method", "path", "params", "expected"),
    [
        ("GET", "/api/v1/namespaces/ml/pods", {}, RbacAttributes("", "pods", "list", True)),
        (
            "GET",
            "/api/v1/namespaces/ml/pods",
            {"watch": "true"},
            RbacAttributes("", "pods", "watch", True),
        ),
        ("PATCH", "/api/v1/namespaces/ml/pods/p", {}, RbacAttributes("", "pods", "patch", True)),
        (
            "PATCH",
            "/apis/splitserve.io/v1alpha1/namespaces/ml/llmpools/x/status",
            {},
            RbacAttributes("splitserve.io", "llmpools/status", "patch", True),
        ),
        ("GET", "/api/v1/namespaces", {}, RbacAttributes("", "namespaces", "list", False)),
        ("GET", "/apis/apps/v1", {}, None),
    ],
)
def test_attributes(
    method: str, path: str, params: dict[str, str], expected: RbacAttributes | None
) -> None:
    assert attributes(ApiCall(method, path, params)) == expected


def test_owner_references_need_finalizers_update() -> None:
    """OwnerReferencesPermissionEnforcement: blockOwnerDeletion needs update on finalizers."""
    body = {
        "metadata": {"ownerReferences": [render.owner_reference(render.ServiceRef("s", NS, "u"))]}
    }
    call = ApiCall("POST", "/apis/apps/v1/namespaces/ml/deployments", {}, body=body)
    assert RbacAttributes("splitserve.io", "llmservices/finalizers", "update", True) in needed(
        [call]
    )


def operator_calls() -> list[ApiCall]:
    """Every request the operator's own client makes, over the paths a service goes through."""
    memory = MemoryKube()
    kube = RecordingKube(memory)
    workers = FakeWorkers()
    svc = memory.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": "s", "namespace": NS},
            "spec": {
                "model": {"name": "m", "source": "org/m"},
                "engine": {"kind": "sim", "image": "img:1"},
                "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
                "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
                "scaling": {"mode": "Manual"},
            },
        }
    )

    # Internal TLS: the CA Secret created in the operator's namespace, then each service's.
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    pki = certs.Pki.load_or_create(kube, NS, Path(tempfile.mkdtemp()), when)

    def run(now: str = NOW) -> None:
        rc.reconcile(kube, workers, NS, "s", rc.Settings(drain_wait_s=0.0), now, pki=pki)

    run()  # create everything
    run("2026-03-15T00:00:00Z")  # certificates renewed (patched)
    for i in range(2):
        memory.create(worker_pod("s", "w", f"s-w-{i}", namespace=NS, ip=f"10.0.0.{i + 1}"))
    run()  # assign roles
    # Drift: someone edits every child; the operator merge-patches each back.
    for api_version, kind in OWNED_KINDS:
        for obj in memory.list(api_version, kind, NS):
            patch: dict[str, Any] = {"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}
            memory.patch(api_version, kind, NS, obj["metadata"]["name"], patch)
    run()
    # A refused write, twice: reported in status, its Event posted then bumped.
    original = memory.create

    def refuse(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Deployment":
            raise KubeError(403, "forbidden")
        return original(obj)

    memory.delete("apps/v1", "Deployment", NS, "s-w")
    memory.create = refuse  # type: ignore[method-assign]
    for _ in range(2):
        with pytest.raises(KubeError):
            run()
    memory.create = original  # type: ignore[method-assign]
    # A create that conflicts (a stale cache): read live, then patch.
    stale = RecordingKube(memory)
    stale.get = lambda *a, live=False, **k: None if not live else memory.get(*a)  # type: ignore[method-assign]
    rc.reconcile(stale, workers, NS, "s", rc.Settings(), NOW)
    # A pool removed: pruned; the service deleted: everything it owns goes.
    memory.patch(v1.API_VERSION, "LLMService", NS, "s", {"spec": {"pools": {"prefill": None}}})
    memory.patch(
        v1.API_VERSION,
        "LLMService",
        NS,
        "s",
        {"spec": {"workerGroups": [{"name": "w", "roles": ["decode"]}]}},
    )
    run()
    rc.delete_owned(kube, render.ServiceRef("s", NS, svc["metadata"]["uid"]))
    # A model with a cache the operator creates: its claim and download Job, then deletion.
    cached = memory.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": "c", "namespace": NS},
            "spec": {
                "model": {"name": "m", "source": "hf://org/m", "cache": {"size": "1Gi"}},
                "engine": {"kind": "vllm", "image": "img:1"},
                "workerGroups": [{"name": "w", "roles": ["decode"]}],
                "pools": {"decode": {"replicas": 1}},
                "scaling": {"mode": "Manual"},
            },
        }
    )
    rc.reconcile(kube, workers, NS, "c", rc.Settings(drain_wait_s=0.0), NOW)
    for api_version, kind in (("batch/v1", "Job"), ("v1", "PersistentVolumeClaim")):
        for obj in memory.list(api_version, kind, NS):  # drift, merge-patched back
            patch = {"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}
            memory.patch(api_version, kind, NS, obj["metadata"]["name"], patch)
    rc.reconcile(kube, workers, NS, "c", rc.Settings(drain_wait_s=0.0), NOW)
    rc.delete_owned(kube, render.ServiceRef("c", NS, cached["metadata"]["uid"]))
    return kube.calls + stale.calls


def test_chart_grants_exactly_what_the_operator_uses() -> None:
    uses = needed(operator_calls()) | watches(handlers.CACHED_KINDS) | KOPF_NEEDS
    grants = granted(chart_rules(HELPERS))
    assert sorted(map(str, uses - grants)) == []  # refused
    assert sorted(map(str, grants - uses)) == []  # granted, never used


def test_rendered_chart_matches() -> None:
    rules = rendered_rules(ROOT / "charts/splitserve", helm=_helm())
    if rules is None:
        pytest.skip("helm is not installed (make helm)")
    assert granted(rules) == granted(chart_rules(HELPERS))


def _helm() -> str | None:
    local = ROOT / ".venv/bin/helm"
    return str(local) if local.exists() else None


def test_denied_names_what_is_missing() -> None:
    refused = [
        ApiCall("DELETE", "/api/v1/namespaces/ml/pods/p", {}),  # pods are the Deployments' job
        ApiCall("GET", "/api/v1/namespaces/ml/secrets", {}),
        ApiCall("DELETE", "/apis/splitserve.io/v1alpha1/namespaces/ml/llmservices/s", {}),
        ApiCall("GET", "/apis/apps/v1/deployments", {}),  # cluster-wide list
    ]
    assert len(denied(refused, chart_rules(HELPERS))) == 4

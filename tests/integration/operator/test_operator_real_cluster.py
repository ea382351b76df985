"""The chart's operator on the cluster `$KUBECONFIG` names, as a user installs it (`TARGET=real`).

Unlike the other tests here, nothing is faked: the CRDs and the Helm chart are installed, the
operator runs in the cluster as the chart's ServiceAccount, the cluster's kubelets pull
`$SPLITSERVE_IMAGE` and run the router and simulated-engine workers (`engine.kind: sim`: no
accelerator, no model download). One LLMService goes through:

create -> Ready -> two `kubectl scale` (prefill +1, decode -1) -> a flip (same pods, a role
changes, none restarted) -> `kubectl scale` down -> exactly the drained pod removed -> delete
-> the finalizer runs and the owned objects go. A second one is deleted with the operator
scaled to 0: it stays on its finalizer until that is removed by hand, then the garbage
collector removes what it owned.

Needs: `TARGET=real`, `KUBECONFIG`, `kubectl` and `helm` on PATH (or in the venv: `make helm`),
at least one schedulable node that can pull `$SPLITSERVE_IMAGE` (default: the chart's image)
and fit 3 workers of 250m CPU / 256Mi and a router, and a user who may create namespaces, CRDs
and the chart's Roles. It creates a namespace `splitserve-e2e-<random>` and removes it after;
the CRDs stay (cluster-scoped, shared). Elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator import render
from splitserve.operator.kube import RestKube

pytestmark = [pytest.mark.k8s, pytest.mark.integration, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]
TARGET = os.environ.get("TARGET", "kmock")
IMAGE = os.environ.get("SPLITSERVE_IMAGE", "")
"""`repository:tag` of the splitserve image for the operator, router and sim workers."""
READY_TIMEOUT_S = float(os.environ.get("SPLITSERVE_E2E_READY_TIMEOUT", "600"))
SERVICE = "e2e"
FINALIZER = f"{v1.GROUP}/finalizer"
T = TypeVar("T")


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found is None:
        local = Path(sys.executable).parent / name
        found = str(local) if local.exists() else None
    return found


def _why_not() -> str | None:
    """Why this module cannot run here (None: it can)."""
    if TARGET != "real":
        return "needs a real cluster: TARGET=real KUBECONFIG=... (docs/install.md)"
    if not os.environ.get("KUBECONFIG"):
        return "TARGET=real needs KUBECONFIG (the cluster to install into)"
    missing = [t for t in ("kubectl", "helm") if _tool(t) is None]
    if missing:
        return f"TARGET=real needs {' and '.join(missing)} on PATH (helm: make helm)"
    return None


pytestmark.append(pytest.mark.skipif(_why_not() is not None, reason=_why_not() or ""))


def run(*args: str, timeout: float = 600) -> str:
    tool = _tool(args[0])
    assert tool is not None
    done = subprocess.run(
        [tool, *args[1:]], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 300.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(2.0)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def kube() -> RestKube:
    import kubernetes

    client = kubernetes.config.new_client_from_config()  # type: ignore[no-untyped-call]
    return RestKube(client)


@pytest.fixture(scope="module")
def namespace(kube: RestKube) -> Iterator[str]:
    """A fresh namespace with the CRDs applied and the chart installed in it."""
    nodes = kube._call("GET", "/api/v1/nodes") or {}
    schedulable = [
        n for n in nodes.get("items") or [] if not (n.get("spec") or {}).get("unschedulable")
    ]
    if not schedulable:
        pytest.skip("TARGET=real: the cluster has no schedulable node (the workers run as pods)")
    ns = f"splitserve-e2e-{uuid.uuid4().hex[:6]}"
    run("kubectl", "create", "namespace", ns)
    try:
        run("kubectl", "apply", "--server-side", "-f", str(ROOT / "charts/splitserve/crds"))
        image = []
        if IMAGE:
            repository, _, tag = IMAGE.rpartition(":")
            image = ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]
        run(
            "helm", "upgrade", "--install", "splitserve", str(ROOT / "charts/splitserve"),
            "--namespace", ns, "--wait", "--timeout", "10m", *image,
        )  # fmt: skip
        yield ns
    finally:
        subprocess.run([_tool("helm") or "helm", "uninstall", "splitserve", "-n", ns], check=False)
        subprocess.run(
            [_tool("kubectl") or "kubectl", "delete", "namespace", ns, "--wait=false"], check=False
        )


def service_body(ns: str) -> dict[str, Any]:
    repository, tag = "ghcr.io/splitserve/splitserve", ""
    if IMAGE:
        repository, _, tag = IMAGE.rpartition(":")
    image = f"{repository}:{tag}" if tag else repository
    return {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMService",
        "metadata": {"name": SERVICE, "namespace": ns},
        "spec": {
            "model": {"name": "tiny", "source": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"},
            "engine": {"kind": "sim", "image": image},
            "workerGroups": [
                {
                    "name": "w",
                    "roles": ["prefill", "decode"],
                    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                }
            ],
            "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
            "router": {"image": image},
            "scaling": {"mode": "Manual"},
        },
    }


def pods(kube: RestKube, ns: str) -> dict[str, tuple[str, str]]:
    """Worker pods still running: name -> (uid, role)."""
    out: dict[str, tuple[str, str]] = {}
    for p in kube.list("v1", "Pod", ns, render.worker_selector(SERVICE)):
        md = p["metadata"]
        if md.get("deletionTimestamp") is None:
            out[md["name"]] = (md["uid"], (md.get("labels") or {}).get(v1.LABEL_ROLE, "-"))
    return out


def workers(kube: RestKube, ns: str, n: int) -> Callable[[], dict[str, tuple[str, str]] | None]:
    def check() -> dict[str, tuple[str, str]] | None:
        now = pods(kube, ns)
        return now if len(now) == n else None

    return check


def ready(kube: RestKube, ns: str) -> bool:
    svc = kube.get(v1.API_VERSION, "LLMService", ns, SERVICE) or {}
    conditions = (svc.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def describe(kube: RestKube, ns: str) -> str:
    svc = kube.get(v1.API_VERSION, "LLMService", ns, SERVICE)
    events = [
        f"{e.get('type')} {e.get('reason')}: {e.get('message')}"
        for e in kube.list("v1", "Event", ns)
        if (e.get("involvedObject") or {}).get("name") == SERVICE
    ]
    return json.dumps((svc or {}).get("status"), indent=1) + "\n" + "\n".join(events)


def test_install_create_flip_shrink_delete(kube: RestKube, namespace: str) -> None:
    ns = namespace
    kube.create(service_body(ns))
    try:
        wait_for(f"LLMService {SERVICE} Ready", lambda: ready(kube, ns), READY_TIMEOUT_S)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{describe(kube, ns)}") from None
    before = wait_for("3 workers", workers(kube, ns, 3))
    assert sorted(role for _, role in before.values()) == ["decode", "decode", "prefill"]
    events = [e for e in kube.list("v1", "Event", ns) if e["involvedObject"].get("name") == SERVICE]
    assert events, "the operator posted no Event on the LLMService"

    # Two kubectl scale in a row: one flip (a decode worker becomes a prefill worker).
    run(
        "kubectl",
        "-n",
        ns,
        "scale",
        f"llmpool/{render.pool_name(SERVICE, Role.PREFILL)}",
        "--replicas=2",
    )
    run(
        "kubectl",
        "-n",
        ns,
        "scale",
        f"llmpool/{render.pool_name(SERVICE, Role.DECODE)}",
        "--replicas=1",
    )

    def flipped() -> dict[str, tuple[str, str]] | None:
        now = pods(kube, ns)
        roles = sorted(role for _, role in now.values())
        return now if roles == ["decode", "prefill", "prefill"] else None

    after = wait_for("the flip", flipped, READY_TIMEOUT_S)
    assert after.keys() == before.keys(), "a flip must not replace pods"
    assert {n: uid for n, (uid, _) in after.items()} == {n: uid for n, (uid, _) in before.items()}
    deployment = kube.get("apps/v1", "Deployment", ns, render.group_deployment_name(SERVICE, "w"))
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 3
    wait_for("Ready after the flip", lambda: ready(kube, ns), READY_TIMEOUT_S)

    # A shrink: the operator drains a prefill worker, marks it, and the ReplicaSet removes it.
    run(
        "kubectl",
        "-n",
        ns,
        "scale",
        f"llmpool/{render.pool_name(SERVICE, Role.PREFILL)}",
        "--replicas=1",
    )
    shrunk = wait_for("the shrink", workers(kube, ns, 2), READY_TIMEOUT_S)
    assert set(shrunk) < set(after), "the ReplicaSet removed a pod and started another"
    gone = (set(after) - set(shrunk)).pop()
    assert after[gone][1] == "prefill", f"{gone} was a {after[gone][1]} worker"
    assert sorted(role for _, role in shrunk.values()) == ["decode", "prefill"]

    # Delete: the operator's finalizer runs, then the service and what it owns go.
    kube.delete(v1.API_VERSION, "LLMService", ns, SERVICE)
    wait_for(
        "the LLMService gone", lambda: kube.get(v1.API_VERSION, "LLMService", ns, SERVICE) is None
    )
    selector = {v1.LABEL_SERVICE: SERVICE}
    owned = (
        ("apps/v1", "Deployment"),
        ("v1", "ConfigMap"),
        ("v1", "Service"),
        (v1.API_VERSION, "LLMPool"),
    )

    def none_left() -> list[str] | None:
        left = [k for a, k in owned for _ in kube.list(a, k, ns, selector)]
        return None if left else ["ok"]

    wait_for("the owned objects gone", none_left)


def test_delete_without_the_operator_waits_on_the_finalizer(kube: RestKube, namespace: str) -> None:
    """docs/operations.md, "Deleting a service while the operator is not running": with the
    operator scaled to 0 a deleted LLMService stays (its finalizer); removing the finalizer by
    hand lets it go, and the garbage collector removes what it owned (kmock has none)."""
    ns, name = namespace, f"{SERVICE}-orphan"
    body = service_body(ns)
    body["metadata"]["name"] = name
    body["spec"]["pools"] = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    kube.create(body)
    deployment = render.group_deployment_name(name, "w")

    def adopted() -> bool:
        svc = kube.get(v1.API_VERSION, "LLMService", ns, name) or {}
        finalizers = svc.get("metadata", {}).get("finalizers") or []
        return (
            FINALIZER in finalizers
            and kube.get("apps/v1", "Deployment", ns, deployment) is not None
        )

    wait_for(f"the operator's finalizer on {name} and its Deployment", adopted)
    operator = {
        "app.kubernetes.io/instance": "splitserve",
        "app.kubernetes.io/component": "operator",
    }
    run("kubectl", "-n", ns, "scale", "deployment/splitserve", "--replicas=0")
    try:
        wait_for("no operator pod", lambda: not kube.list("v1", "Pod", ns, operator) or None)
        run("kubectl", "-n", ns, "delete", "llmservice", name, "--wait=false")
        left = kube.get(v1.API_VERSION, "LLMService", ns, name)
        assert left is not None, "deleted at once: the finalizer did not hold it"
        assert left["metadata"].get("deletionTimestamp")
        assert FINALIZER in left["metadata"]["finalizers"]
        run(
            "kubectl", "-n", ns, "patch", "llmservice", name, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}',
        )  # fmt: skip
        wait_for(f"{name} gone", lambda: kube.get(v1.API_VERSION, "LLMService", ns, name) is None)
        wait_for(
            f"{name}'s Deployment collected",
            lambda: kube.get("apps/v1", "Deployment", ns, deployment) is None,
        )
    finally:
        run("kubectl", "-n", ns, "scale", "deployment/splitserve", "--replicas=1")

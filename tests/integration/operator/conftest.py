"""An API server for the operator's integration tests: kmock (default) or a real cluster.

`TARGET=kmock` (default) runs kmock's `KubernetesEmulator` on 127.0.0.1 in its own thread and
event loop, with the fixes a kopf operator needs (see ENVIRONMENT.md):

- `GET /api/v1/namespaces[/name]` parses as the Namespace resource (kmock 0.8 answers 500);
- objects get server-side metadata: namespace, uid, resourceVersion, generation,
  creationTimestamp;
- a failed JSON-patch `test` answers 422 (kopf's optimistic concurrency) instead of 500;
- lists carry a resourceVersion, and watches honour `?resourceVersion=` instead of replaying
  every object;
- kopf's backbone resources (namespaces with `default`, CRDs, events) and every kind the
  operator touches are declared.

`TARGET=real` uses `$KUBECONFIG` as it is (the CRDs from charts/splitserve/crds must be applied
and the current context's namespace must be `default`).

What the API server lacks, the `controllers` fixture plays (`tests.fakes.controllers`): on kmock
the Deployment / ReplicaSet controller and a kubelet; on a real control plane the kubelet only
when kube-controller-manager runs (its ReplicaSets create the pods) and no node is registered.
Where a real kubelet runs, the tests skip: their workers are fakes, so they must play the
kubelet themselves.
"""

from __future__ import annotations

import datetime
import itertools
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.controllers import DeploymentController, Kubelet, running
from tests.fakes.kmock_thread import KmockThread, consistent_watch
from tests.fakes.rbac import ApiCall

from splitserve.operator.kube import Kube, RestKube

TARGET = os.environ.get("TARGET", "kmock")
if TARGET == "kmock":
    # kopf's and the client's defaults read $KUBECONFIG; point it at our emulator's config.
    _KUBECONFIG = Path(tempfile.mkdtemp(prefix="splitserve-kmock-")) / "kubeconfig"
    os.environ["KUBECONFIG"] = str(_KUBECONFIG)

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
RESOURCES: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    # "group/version/plural": (kind, namespaced, subresources)
    "splitserve.io/v1alpha1/llmservices": ("LLMService", True, ("status",)),
    "splitserve.io/v1alpha1/llmpools": ("LLMPool", True, ("status", "scale")),
    "apps/v1/deployments": ("Deployment", True, ("status", "scale")),
    "v1/pods": ("Pod", True, ("status",)),
    "v1/services": ("Service", True, ("status",)),
    "v1/configmaps": ("ConfigMap", True, ()),
    "v1/secrets": ("Secret", True, ()),
    "cert-manager.io/v1/certificates": ("Certificate", True, ("status",)),
    "v1/serviceaccounts": ("ServiceAccount", True, ()),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True, ()),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True, ()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, ()),
    "batch/v1/jobs": ("Job", True, ("status",)),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, ("status",)),
    "v1/events": ("Event", True, ()),
    "v1/namespaces": ("Namespace", False, ("status",)),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, ()),
}


def _fix_namespace_paths() -> None:
    from kmock._internal import parsing

    original = parsing.parse_path
    if getattr(original, "_splitserve", False):
        return

    def parse_path(path: str) -> Any:
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 5:
            name = parts[3] if len(parts) > 3 else None
            sub = parts[4] if len(parts) > 4 else None
            if len(parts) <= 4 or sub in ("status", "finalize"):
                return parsing.ParsedPath("", "v1", "namespaces", None, name, sub)
        return original(path)

    parse_path._splitserve = True  # type: ignore[attr-defined]
    parsing.parse_path = parse_path


def _emulator_class() -> type[Any]:
    import jsonpatch
    import kmock
    from kmock._internal import enums

    class Emulator(kmock.KubernetesEmulator):
        _versions = itertools.count(100)

        def _stamp(self, request: Any) -> None:
            rv = str(next(self._versions))
            if request.action == enums.action.CREATE and isinstance(request.data, dict):
                md = request.data.setdefault("metadata", {})
                if request.namespace:
                    md["namespace"] = request.namespace
                md.setdefault("uid", str(uuid.uuid4()))
                md["resourceVersion"] = rv
                md["generation"] = 1
                md.setdefault(
                    "creationTimestamp",
                    datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                )
            elif request.action == enums.action.UPDATE:
                key = (request.resource, request.namespace, request.name)
                stored = self.objects[key] if key in self.objects else None  # noqa: SIM401
                generation = 1
                if stored is not None and not stored.deleted:
                    generation = stored.get("metadata", {}).get("generation", 1)
                spec_write = request.subresource not in ("status",)
                if isinstance(request.data, dict):
                    md = request.data.get("metadata") or {}
                    request.data["metadata"] = md
                    md["resourceVersion"] = rv
                    if spec_write and "spec" in request.data:
                        md["generation"] = generation + 1
                elif isinstance(request.data, list):
                    request.data.append(
                        {"op": "add", "path": "/metadata/resourceVersion", "value": rv}
                    )

        async def _handle(self, request: Any) -> Any:
            if request.resource is not None and isinstance(request.data, dict | list):
                self._stamp(request)
            try:
                return await super()._handle(request)
            except jsonpatch.JsonPatchTestFailed as err:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(err)) from err

        async def _serve_list(self, request: Any) -> Any:
            result: dict[str, Any] = dict(await super()._serve_list(request))  # type: ignore[arg-type]
            result["metadata"] = {"resourceVersion": str(next(self._versions))}
            return result

        async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
            try:
                since = int(request.params.get("resourceVersion") or 0)
            except ValueError:
                since = 0
            async for event in consistent_watch(self, request):
                if since and isinstance(event, dict) and event.get("type") in ("ADDED", "MODIFIED"):
                    rv = event.get("object", {}).get("metadata", {}).get("resourceVersion", "")
                    if rv.isdigit() and int(rv) <= since:
                        continue
                yield event

    return Emulator


def _populate(emulator: Any) -> None:
    """kopf's backbone: our resources, and the `default` Namespace."""
    import kmock

    for key, (kind, namespaced, subs) in RESOURCES.items():
        emulator.resources[key] = kmock.ResourceInfo(
            kind=kind,
            singular=kind.lower(),
            namespaced=namespaced,
            verbs=set(VERBS),
            subresources=set(subs),
        )
    emulator.objects["v1/namespaces", None, "default"] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "default", "uid": "ns-default", "resourceVersion": "1"},
    }


class KmockServer(KmockThread):
    """kmock with the operator's resources (kopf's runner and the synchronous tests both block)."""

    def __init__(self) -> None:
        _fix_namespace_paths()
        super().__init__(_emulator_class(), _populate)


def _write_kubeconfig(path: Path, server: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: test, user: {}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: test, namespace: default}}]\n"
        "current-context: kmock\n"
    )


_SERVER: KmockServer | None = None


@pytest.fixture(scope="session")
def api_server() -> Iterator[str]:
    """The kubeconfig path of the API server under test."""
    global _SERVER
    if TARGET == "kmock":
        _SERVER = KmockServer().start()
        _write_kubeconfig(_KUBECONFIG, _SERVER.url)
        yield str(_KUBECONFIG)
        _SERVER.stop()
        _SERVER = None
    else:
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            pytest.skip("TARGET=real needs KUBECONFIG")
        yield kubeconfig


@pytest.fixture
def kube(api_server: str) -> RestKube:
    """A client of the API server under test, identified as the tests (`splitserve-tests`), not
    as the operator: the lifecycle test checks every call made with the operator's user agent
    (kmock's log spans the session) for the operator's token and the chart's RBAC."""
    import kubernetes

    client = kubernetes.config.new_client_from_config(config_file=api_server)  # type: ignore[no-untyped-call]
    kube = RestKube(client)
    kube.client.user_agent = "splitserve-tests"
    return kube


@pytest.fixture(autouse=True)
def _kmock_log_stays_short() -> Iterator[None]:
    """After each test, move kmock's request log aside (`KmockThread.archive`): kmock matches
    every request against its whole log, so over a session of tests each request got slower
    (about 1 s each late in `make test`, which timed the later tests out)."""
    yield
    if _SERVER is not None:
        _SERVER.archive()


@pytest.fixture
def api_calls(api_server: str) -> Callable[[], list[ApiCall]] | None:
    """Every request the emulator has answered so far (None on a real cluster)."""
    return None if _SERVER is None else _SERVER.calls


@contextmanager
def controllers(kube: Kube, namespace: str = "default") -> Iterator[DeploymentController | None]:
    """Run what the API server does not (see the module docstring) until the block ends."""
    if TARGET == "kmock":
        deployments: DeploymentController | None = DeploymentController(kube, namespace)
        kubelet = Kubelet(kube, namespace)
    else:
        nodes = kube_nodes(kube)
        if nodes:
            pytest.skip(
                f"TARGET=real: the cluster has {len(nodes)} node(s) with kubelets; these tests "
                "fake the workers, so they need a control plane without nodes (they play the "
                "kubelet)"
            )
        has_kcm = kube.get("v1", "ServiceAccount", namespace, "default") is not None
        deployments = None if has_kcm else DeploymentController(kube, namespace)
        kubelet = Kubelet(kube, namespace, bind=False)
    parts = [c for c in (deployments, kubelet) if c is not None]
    with running(*parts):
        yield deployments


def kube_nodes(kube: Kube) -> list[Any]:
    """Registered nodes (a kubelet each)."""
    call = getattr(kube, "_call", None)
    if call is None:
        return []
    out = call("GET", "/api/v1/nodes")
    return list((out or {}).get("items") or [])

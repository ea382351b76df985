"""Talking to the API server: get, list, create, JSON merge-patch, delete. Nothing else.

Only these verbs, on purpose: they behave the same on every API server the operator meets,
including test emulators without server-side apply, PUT or strategic merge. `apply` is
create-or-merge-patch with a client-side diff, so applying the same manifest twice sends
nothing the second time.

`Kube` is the protocol the reconciler uses; `RestKube` speaks HTTP through the official client's
configuration (kubeconfig or in-cluster), `splitserve.operator.testing.MemoryKube` keeps objects in
a dict for tests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final, Protocol

from splitserve.api import v1alpha1 as v1

log = logging.getLogger(__name__)

Obj = dict[str, Any]

PLURALS: Final[Mapping[tuple[str, str], str]] = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Event"): "events",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    (v1.API_VERSION, "LLMService"): "llmservices",
    (v1.API_VERSION, "LLMPool"): "llmpools",
}

OWNED_KINDS: Final = (
    (v1.API_VERSION, "LLMPool"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("batch/v1", "Job"),
    ("v1", "PersistentVolumeClaim"),
)
"""Kinds an `LLMService` owns (what deletion and pruning look at)."""


USER_AGENT: Final = "splitserve-operator"
REQUEST_TIMEOUT_S: Final = 30.0
"""No call to the API server may block a reconcile (and the operator's shutdown) for longer."""


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def resource_path(
    api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None
) -> str:
    plural = PLURALS[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    if name is not None:
        path += f"/{name}"
        if sub is not None:
            path += f"/{sub}"
    return path


class Kube(Protocol):
    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None: ...

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Obj]: ...

    def create(self, obj: Obj) -> Obj: ...

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Obj,
        subresource: str | None = None,
    ) -> Obj: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool: ...


def matches(obj: Mapping[str, Any], labels: Mapping[str, str] | None) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    return all(have.get(k) == v for k, v in (labels or {}).items())


def covers(current: Any, desired: Any) -> bool:
    """Whether `current` already has everything `desired` sets (server defaults may add more)."""
    if isinstance(desired, Mapping):
        return isinstance(current, Mapping) and all(
            covers(current.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(covers(c, d) for c, d in zip(current, desired, strict=True))
        )
    if isinstance(desired, str) and isinstance(current, int | float):
        return str(current) == desired
    return bool(current == desired)


def merge_diff(current: Mapping[str, Any], desired: Mapping[str, Any]) -> Obj:
    """The JSON merge patch that brings `current` up to `desired` (fields desired sets only)."""
    out: Obj = {}
    for key, want in desired.items():
        have = current.get(key)
        if covers(have, want):
            continue
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            out[key] = merge_diff(have, want)
        else:
            out[key] = want
    return out


def apply(kube: Kube, obj: Obj) -> tuple[str, Obj]:
    """Create `obj`, or merge-patch the fields that differ. Returns (action, object)."""
    md = obj["metadata"]
    current = kube.get(obj["apiVersion"], obj["kind"], md["namespace"], md["name"])
    if current is None:
        return "created", kube.create(obj)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
    diff = merge_diff(current, body)
    if not diff:
        return "unchanged", current
    patched = kube.patch(obj["apiVersion"], obj["kind"], md["namespace"], md["name"], diff)
    return "patched", patched


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


class RestKube:
    """The API server over HTTP, with the official client's auth and TLS configuration."""

    def __init__(self, api_client: Any | None = None) -> None:
        import kubernetes

        self.client = api_client or kubernetes.client.ApiClient()
        self.client.user_agent = USER_AGENT

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        verb, url, header_params, payload, post_params = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.client.call_api(
            verb, url, header_params, payload, post_params, _request_timeout=REQUEST_TIMEOUT_S
        )
        data = response.read()
        if not 200 <= response.status < 300:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data.decode(errors="replace")[:500]
            raise KubeError(response.status, f"{method} {path}: {message}")
        return json.loads(data) if data else None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            out: Obj = self._call("GET", resource_path(api_version, kind, namespace, name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise
        return out

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else {}
        out = self._call("GET", resource_path(api_version, kind, namespace), query=query)
        items: list[Obj] = out.get("items") or []
        # Filter here too: some servers (and emulators) ignore labelSelector.
        return [i for i in items if matches(i, labels)]

    def create(self, obj: Obj) -> Obj:
        md = obj["metadata"]
        out: Obj = self._call(
            "POST", resource_path(obj["apiVersion"], obj["kind"], md["namespace"]), obj
        )
        return out

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Obj,
        subresource: str | None = None,
    ) -> Obj:
        path = resource_path(api_version, kind, namespace, name, subresource)
        out: Obj = self._call("PATCH", path, patch, "application/merge-patch+json")
        return out

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self._call("DELETE", resource_path(api_version, kind, namespace, name), body)
        except KubeError as err:
            if err.status == 404:
                return False
            raise
        return True

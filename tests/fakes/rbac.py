"""RBAC: derive the rules a client needs from the API calls it made, and check them against the
chart's Role / ClusterRole (an offline stand-in for the authorizer and for the admission plugins
that ask it).

What a call needs:

- the request itself: (API group, resource[/subresource], verb, namespaced), as the authorizer
  sees it (`attributes`);
- `OwnerReferencesPermissionEnforcement` (on by default in OpenShift): a create or patch that sets
  an ownerReference with `blockOwnerDeletion: true` needs `update` on `<owner>/finalizers`;
- RBAC's escalation check: creating or patching a Role that grants something needs that grant.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from splitserve.operator.kube import PLURALS, Kube, Obj, resource_path

RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class ApiCall:
    """One request an API server answered (as recorded by a test server or `RecordingKube`)."""

    method: str
    path: str
    params: dict[str, str]
    user_agent: str = ""
    authorization: str = ""
    """The Authorization header (`Bearer <token>`), to tell identities apart."""
    body: Any = None


@dataclass(frozen=True)
class RbacAttributes:
    """What the authorizer sees: (API group, resource[/subresource], verb, namespaced)."""

    group: str
    resource: str
    verb: str
    namespaced: bool

    def __str__(self) -> str:
        scope = "namespaced" if self.namespaced else "cluster"
        return f"{self.verb} {self.group or 'core'}/{self.resource} ({scope})"


def attributes(call: ApiCall) -> RbacAttributes | None:
    """None for non-resource URLs (discovery: /api, /apis/<g>/<v>), which everyone may read."""
    parts = call.path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespaced = False
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespaced, rest = True, rest[2:]
    resource, name, sub = (
        rest[0],
        rest[1] if len(rest) > 1 else None,
        rest[2] if len(rest) > 2 else None,
    )
    method = call.method.upper()
    if method == "GET":
        verb = "watch" if call.params.get("watch") in ("true", "1") else ("get" if name else "list")
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
    return RbacAttributes(group, f"{resource}/{sub}" if sub else resource, verb, namespaced)


def _admission(call: ApiCall, attrs: RbacAttributes) -> list[RbacAttributes]:
    body = call.body if isinstance(call.body, Mapping) else {}
    out = []
    if attrs.verb in ("create", "patch", "update"):
        refs = (body.get("metadata") or {}).get("ownerReferences") or []
        for ref in refs:
            if not ref.get("blockOwnerDeletion"):
                continue
            api_version, kind = ref.get("apiVersion", ""), ref.get("kind", "")
            plural = PLURALS.get((api_version, kind), kind.lower() + "s")
            group = api_version.split("/")[0] if "/" in api_version else ""
            out.append(RbacAttributes(group, f"{plural}/finalizers", "update", attrs.namespaced))
        if attrs.group == RBAC_GROUP and attrs.resource == "roles":
            for rule in body.get("rules") or []:
                out += expand([rule], namespaced=True)
    return out


def needed(calls: Iterable[ApiCall]) -> set[RbacAttributes]:
    """Every permission the calls needed (requests, admission checks, escalation checks)."""
    out: set[RbacAttributes] = set()
    for call in calls:
        attrs = attributes(call)
        if attrs is None:
            continue
        out.add(attrs)
        out.update(_admission(call, attrs))
    return out


def expand(rules: Sequence[Mapping[str, Any]], *, namespaced: bool) -> set[RbacAttributes]:
    """The permissions a list of PolicyRules grants (no wildcards: the chart uses none)."""
    return {
        RbacAttributes(group, resource, verb, namespaced)
        for r in rules
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    }


def allowed(attrs: RbacAttributes, rules: Sequence[dict[str, Any]]) -> bool:
    return any(
        attrs.group in r["apiGroups"]
        and attrs.resource in r["resources"]
        and attrs.verb in r["verbs"]
        for r in rules
    )


def granted(rules: Mapping[str, Sequence[Mapping[str, Any]]]) -> set[RbacAttributes]:
    """What `{"cluster": ..., "namespace": ...}` rules grant (cluster rules cover namespaces too,
    but the chart keeps the two apart, so they are compared apart)."""
    return expand(rules["cluster"], namespaced=False) | expand(rules["namespace"], namespaced=True)


def denied(
    calls: Iterable[ApiCall], rules: dict[str, list[dict[str, Any]]]
) -> list[RbacAttributes]:
    """Permissions the calls needed that the chart's Role (or, cluster-scoped, its ClusterRole)
    does not grant."""
    have = granted(rules)
    out = []
    for attrs in sorted(needed(calls), key=str):
        if attrs not in have:
            out.append(attrs)
    return out


def chart_rules(helpers: Path) -> dict[str, list[dict[str, Any]]]:
    """{"cluster": discovery rules, "namespace": manager rules} from the chart's `_helpers.tpl`."""
    text = helpers.read_text()

    def block(name: str) -> list[dict[str, Any]]:
        match = re.search(
            r'define "' + re.escape(name) + r'" -\}\}\n(.*?)\{\{- end -\}\}', text, re.S
        )
        assert match, name
        rules: list[dict[str, Any]] = yaml.safe_load(match.group(1))
        return rules

    return {
        "cluster": block("splitserve.discoveryRules"),
        "namespace": block("splitserve.managerRules") + block("splitserve.internalTlsRules"),
    }


def rendered_rules(chart: Path, helm: str | None = None) -> dict[str, list[dict[str, Any]]] | None:
    """The Role and ClusterRole `helm template` renders (default values); None without helm."""
    helm = helm or shutil.which("helm")
    if helm is None:
        return None
    out = subprocess.run(
        [helm, "template", "t", str(chart), "--namespace", "ml"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rules: dict[str, list[dict[str, Any]]] = {"cluster": [], "namespace": []}
    for doc in yaml.safe_load_all(out):
        if not doc:
            continue
        if doc.get("kind") == "ClusterRole":
            rules["cluster"] += doc["rules"]
        elif doc.get("kind") == "Role":
            rules["namespace"] += doc["rules"]
    return rules


class RecordingKube:
    """A `Kube` that records each call as the HTTP request `RestKube` would send."""

    def __init__(self, inner: Kube, user_agent: str = "splitserve-operator") -> None:
        self.inner = inner
        self.calls: list[ApiCall] = []
        self.user_agent = user_agent

    def _rec(self, method: str, path: str, body: Any = None) -> None:
        self.calls.append(ApiCall(method, path, {}, self.user_agent, body=body))

    def get(
        self, api_version: str, kind: str, namespace: str, name: str, *, live: bool = False
    ) -> Obj | None:
        self._rec("GET", resource_path(api_version, kind, namespace, name))
        return self.inner.get(api_version, kind, namespace, name, live=live)

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        self._rec("GET", resource_path(api_version, kind, namespace))
        return self.inner.list(api_version, kind, namespace, labels)

    def create(self, obj: Obj) -> Obj:
        md = obj["metadata"]
        self._rec("POST", resource_path(obj["apiVersion"], obj["kind"], md["namespace"]), obj)
        return self.inner.create(obj)

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
        self._rec("PATCH", path, patch)
        return self.inner.patch(api_version, kind, namespace, name, patch, subresource)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self._rec("DELETE", resource_path(api_version, kind, namespace, name))
        return self.inner.delete(api_version, kind, namespace, name)


def _attrs(group: str, resource: str, verbs: str, namespaced: bool = True) -> set[RbacAttributes]:
    return {RbacAttributes(group, resource, v, namespaced) for v in verbs.split()}


KOPF_NEEDS: frozenset[RbacAttributes] = frozenset(
    # kopf follows the namespaces it serves and the CRDs it handles (cluster scope, even when it
    # serves one namespace) ...
    _attrs("", "namespaces", "list watch", namespaced=False)
    | _attrs("apiextensions.k8s.io", "customresourcedefinitions", "list watch", namespaced=False)
    # ... watches LLMServices and patches their finalizer and its annotations, and posts Events.
    | _attrs("splitserve.io", "llmservices", "list watch patch")
    | _attrs("", "events", "create")
)
"""What kopf itself does, apart from the watches the operator registers (`handlers.CACHED_KINDS`).
The kmock integration test checks that kopf's recorded calls need nothing else."""


def watches(kinds: Iterable[tuple[str, str]]) -> set[RbacAttributes]:
    """list + watch per kind: what a kopf watch of each kind needs in a namespace."""
    out: set[RbacAttributes] = set()
    for api_version, kind in kinds:
        group = api_version.split("/")[0] if "/" in api_version else ""
        out |= _attrs(group, PLURALS[(api_version, kind)], "list watch")
    return out

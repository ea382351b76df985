"""In-memory fakes of the API server and of workers, for tests of the operator's edges.

`MemoryKube` implements `kube.Kube` with real JSON merge-patch semantics (RFC 7386), server-side
metadata (uid, resourceVersion, generation) and status-subresource isolation; `FakeWorkers`
implements `workers.WorkerClient` and records every call. RBAC checks of recorded API calls are
in `tests.fakes.rbac`; controllers that act on the stored objects in `tests.fakes.controllers`.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from splitserve.core.roles import Role
from splitserve.operator.kube import KubeError, Obj, matches
from splitserve.operator.workers import WorkerCallError

Key = tuple[str, str, str, str]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class MemoryKube:
    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self.writes: list[str] = []
        """`VERB Kind name` per write, in order."""
        self._rv = itertools.count(1)

    @staticmethod
    def _key(api_version: str, kind: str, namespace: str, name: str) -> Key:
        return (api_version, kind, namespace, name)

    def get(
        self, api_version: str, kind: str, namespace: str, name: str, *, live: bool = False
    ) -> Obj | None:
        obj = self.objects.get(self._key(api_version, kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        return [
            copy.deepcopy(o)
            for (av, k, ns, _), o in sorted(self.objects.items())
            if (av, k, ns) == (api_version, kind, namespace) and matches(o, labels)
        ]

    def create(self, obj: Obj) -> Obj:
        md = obj["metadata"]
        key = self._key(obj["apiVersion"], obj["kind"], md["namespace"], md["name"])
        if key in self.objects:
            raise KubeError(409, f"{obj['kind']} {md['name']} already exists")
        stored = copy.deepcopy(obj)
        smd = stored["metadata"]
        smd.setdefault("uid", str(uuid.uuid4()))
        smd["resourceVersion"] = str(next(self._rv))
        smd["generation"] = 1
        smd.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.objects[key] = stored
        self.writes.append(f"CREATE {obj['kind']} {md['name']}")
        return copy.deepcopy(stored)

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Obj,
        subresource: str | None = None,
    ) -> Obj:
        key = self._key(api_version, kind, namespace, name)
        if key not in self.objects:
            raise KubeError(404, f"{kind} {name} not found")
        current = self.objects[key]
        if subresource == "status":
            patch = {"status": patch.get("status")}
        elif subresource is None and kind not in ("Pod",):
            patch = {k: v for k, v in patch.items() if k != "status"}
        merged = merge_patch(current, patch)
        if merged != current:
            merged["metadata"]["resourceVersion"] = str(next(self._rv))
            if merged.get("spec") != current.get("spec"):
                merged["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            self.objects[key] = merged
            self.writes.append(f"PATCH {kind}{'/' + subresource if subresource else ''} {name}")
        return copy.deepcopy(merged)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        key = self._key(api_version, kind, namespace, name)
        if key not in self.objects:
            return False
        del self.objects[key]
        self.writes.append(f"DELETE {kind} {name}")
        return True


@dataclass
class FakeWorkers:
    """Workers that answer Drain and SetRole. `in_flight[address]` > 0 keeps a drain waiting."""

    in_flight: dict[str, int] = field(default_factory=dict)
    roles: dict[str, Role] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(method, address) in call order."""
    down: set[str] = field(default_factory=set)
    """Addresses that fail every call."""
    queued: dict[str, int] = field(default_factory=dict)
    """Requests waiting or running per address (`load`)."""

    def _check(self, method: str, address: str) -> None:
        self.calls.append((method, address))
        if address in self.down:
            raise WorkerCallError(f"{method} {address}: unavailable")

    def drain(self, address: str, *, timeout_s: float) -> int:
        self._check("drain", address)
        return self.in_flight.get(address, 0)

    def resume(self, address: str) -> None:
        self._check("resume", address)

    def set_role(self, address: str, role: Role) -> None:
        self._check("set_role", address)
        self.roles[address] = role

    def load(self, address: str) -> int:
        self._check("load", address)
        return self.queued.get(address, 0)


def worker_pod(
    service: str,
    group: str,
    name: str,
    *,
    namespace: str = "default",
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    role: Role | None = None,
) -> Obj:
    """A worker pod as a Deployment would create it (for API servers without controllers)."""
    from splitserve.api import v1alpha1 as v1
    from splitserve.operator import render

    labels = {**render.service_labels(service, "worker"), **render.worker_selector(service, group)}
    if role is not None:
        labels[v1.LABEL_ROLE] = role.value
    status: dict[str, Any] = {"phase": "Running"}
    if ip is not None:
        status["podIP"] = ip
    status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "worker", "image": "img"}]},
        "status": status,
    }

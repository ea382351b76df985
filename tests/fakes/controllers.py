"""What kube-controller-manager and a kubelet do with the operator's Deployments, for API servers
that run neither (the in-memory fake, kmock).

`DeploymentController.sync()` is one pass of the Deployment and ReplicaSet controllers folded
into one (the operator never changes a worker template during these tests, so there is one
ReplicaSet per Deployment and no rollout): it creates pods up to `spec.replicas` from the pod
template, and when there are too many it deletes them in the real ReplicaSet controller's order
(`pkg/controller/controller_utils.go`, `ActivePodsWithRanks.Less`, with
`PodDeletionCost` on):

1. not scheduled (no `spec.nodeName`) before scheduled;
2. `Pending` before `Unknown` before `Running`;
3. not ready before ready;
4. lower `controller.kubernetes.io/pod-deletion-cost` before higher;
5. (pods doubled up on a node first: every pod here is on its own node, so no difference);
6. ready for a shorter time before longer;
7. more container restarts before fewer;
8. newer before older.

Pods are deleted at once (no graceful termination). `Kubelet.sync()` binds Pending pods to a
node and makes them Running and ready with an IP, unless a test says they cannot run
(`unschedulable`, `bad_images`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from splitserve.operator.kube import Kube, Obj

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}
TEMPLATE_HASH = "7c9f5d4b8"
"""The `pod-template-hash` of every fake ReplicaSet (one per Deployment, no rollouts)."""


def _ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _ready_since(pod: Mapping[str, Any]) -> str:
    conds = (pod.get("status") or {}).get("conditions") or []
    for c in conds:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return str(c.get("lastTransitionTime") or "")
    return ""


def _restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount", 0)) for c in statuses)


def _cost(pod: Mapping[str, Any]) -> int:
    try:
        return int((pod["metadata"].get("annotations") or {}).get(DELETION_COST, 0))
    except ValueError:
        return 0


def deletion_order(pods: list[Obj]) -> list[Obj]:
    """Pods in the order the ReplicaSet controller deletes them (first = first to go)."""

    def key(p: Obj) -> tuple[Any, ...]:
        md = p["metadata"]
        return (
            bool((p.get("spec") or {}).get("nodeName")),
            PHASE_RANK.get((p.get("status") or {}).get("phase", "Pending"), 0),
            _ready(p),
            _cost(p),
            # 6. shorter ready time first: later lastTransitionTime first
            _Desc(_ready_since(p)),
            -_restarts(p),
            # 8. newer first: later creationTimestamp first, then the later name
            _Desc(f"{md.get('creationTimestamp', '')}|{int(md.get('resourceVersion') or 0):012d}"),
        )

    return sorted(pods, key=key)


@dataclass(frozen=True, order=False)
class _Desc:
    value: str

    def __lt__(self, other: _Desc) -> bool:
        return self.value > other.value


def _selected(pod: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class DeploymentController:
    """Deployments -> pods, as kube-controller-manager would (see the module docstring)."""

    kube: Kube
    namespace: str
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def sync(self) -> None:
        pods = [
            p
            for p in self.kube.list("v1", "Pod", self.namespace)
            if not p["metadata"].get("deletionTimestamp")
        ]
        for dep in self.kube.list("apps/v1", "Deployment", self.namespace):
            selector = dep["spec"]["selector"]["matchLabels"]
            mine = [p for p in pods if _selected(p, selector)]
            want = int(dep["spec"].get("replicas", 1))
            for _ in range(want - len(mine)):
                self._create(dep)
            for pod in deletion_order(mine)[: max(0, len(mine) - want)]:
                name = pod["metadata"]["name"]
                self.kube.delete("v1", "Pod", self.namespace, name)
                self.deleted.append(name)
            ready = sum(1 for p in mine if _ready(p))
            status = {
                "observedGeneration": dep["metadata"].get("generation"),
                "replicas": min(len(mine), want),
                "readyReplicas": ready,
            }
            if {k: (dep.get("status") or {}).get(k) for k in status} != status:
                self.kube.patch(
                    "apps/v1",
                    "Deployment",
                    self.namespace,
                    dep["metadata"]["name"],
                    {"status": status},
                    "status",
                )

    def _create(self, dep: Obj) -> None:
        template = dep["spec"]["template"]
        name = f"{dep['metadata']['name']}-{next(self._names):05d}"
        # As the ReplicaSet controller: the pod's controller is `<deployment>-<hash>` and the
        # pod carries the hash as `pod-template-hash` (the router's discovery checks both).
        template_meta = dict(template.get("metadata") or {})
        template_meta["labels"] = {
            **(template_meta.get("labels") or {}),
            "pod-template-hash": TEMPLATE_HASH,
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **template_meta,
                "name": name,
                "namespace": self.namespace,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": f"{dep['metadata']['name']}-{TEMPLATE_HASH}",
                        "uid": dep["metadata"].get("uid", ""),
                        "controller": True,
                    }
                ],
            },
            "spec": template["spec"],
            "status": {"phase": "Pending"},
        }
        self.kube.create(pod)
        self.created.append(name)


@dataclass
class Kubelet:
    """Runs pods: Pending -> Running and ready, with an IP; or says why it cannot."""

    kube: Kube
    namespace: str
    unschedulable: str | None = None
    """New pods stay Pending with this scheduler message (`Insufficient nvidia.com/gpu`)."""
    bad_images: set[str] = field(default_factory=set)
    """Images that fail to pull."""
    bind: bool = True
    """Set `spec.nodeName` (an emulator allows it; a real API server wants a Binding, so on
    one the pods stay unbound, which the ReplicaSet controller does not mind)."""
    _ips: Iterator[int] = field(default_factory=lambda: itertools.count(10))
    _clock: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def sync(self) -> None:
        for pod in self.kube.list("v1", "Pod", self.namespace):
            status = pod.get("status") or {}
            if status.get("phase") != "Pending" or status.get("podIP"):
                continue
            name = pod["metadata"]["name"]
            images = [c.get("image") for c in pod["spec"].get("containers", [])]
            if self.unschedulable:
                new = {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": self.unschedulable,
                        }
                    ],
                }
            elif any(i in self.bad_images for i in images):
                new = {
                    "phase": "Pending",
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "containerStatuses": [
                        {
                            "name": "worker",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": f'Back-off pulling image "{images[0]}"',
                                }
                            },
                        }
                    ],
                }
            else:
                n = next(self._ips)
                ip = f"10.2.{n // 250}.{n % 250 + 1}"
                new = {
                    "phase": "Running",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "lastTransitionTime": f"2026-01-01T00:{next(self._clock):05d}Z",
                        }
                    ],
                }
            if new == status:
                continue
            if self.bind and "podIP" in new and not pod["spec"].get("nodeName"):
                node = {"spec": {"nodeName": f"node-{name}"}}
                self.kube.patch("v1", "Pod", self.namespace, name, node)
            self.kube.patch("v1", "Pod", self.namespace, name, {"status": new}, "status")


@contextmanager
def running(*controllers: DeploymentController | Kubelet, period_s: float = 0.1) -> Iterator[None]:
    """Run `sync()` of each controller in a background thread until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period_s):
            for c in controllers:
                try:
                    c.sync()
                except Exception:
                    continue

    thread = threading.Thread(target=loop, name="fake-controllers", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)

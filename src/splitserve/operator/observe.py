"""Turn pods into the planner's observations. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator.status import PodCounts
from splitserve.policy.planner.flip import FlipProgress, WorkerObs

DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
SURPLUS_COST: Final = "-100"


def pod_name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if not status.get("podIP"):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_address(pod: Mapping[str, Any], port: int) -> str:
    return f"{(pod.get('status') or {}).get('podIP')}:{port}"


def live_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods not being deleted and not finished."""
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def worker(pod: Mapping[str, Any], spec: v1.LLMServiceSpec) -> WorkerObs:
    md = pod["metadata"]
    labels = md.get("labels") or {}
    annotations = md.get("annotations") or {}
    groups = {g.name: g for g in spec.worker_groups}
    group = groups.get(labels.get(v1.LABEL_GROUP, ""))
    try:
        role: Role | None = Role(labels[v1.LABEL_ROLE]) if v1.LABEL_ROLE in labels else None
    except ValueError:
        role = None
    return WorkerObs(
        name=str(md["name"]),
        allowed=frozenset(group.roles) if group is not None else frozenset(),
        role=role,
        ready=pod_ready(pod),
        fenced=labels.get(v1.LABEL_FENCED) == "true",
        flip=FlipProgress.decode(annotations.get(v1.ANNOTATION_FLIP)),
    )


def pod_counts(pods: Sequence[Mapping[str, Any]]) -> PodCounts:
    ready = [p for p in pods if pod_ready(p)]
    unassigned = [p for p in ready if v1.LABEL_ROLE not in (p["metadata"].get("labels") or {})]
    return PodCounts(total=len(pods), ready=len(ready), unassigned=len(unassigned))

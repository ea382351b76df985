"""Turn pods into the planner's observations. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator.status import PodCounts, PodProblem
from splitserve.policy.planner.flip import FlipProgress, WorkerObs

DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
SURPLUS_COST: Final = "-100"
"""On a drained surplus worker: the ReplicaSet deletes it before any other pod of equal phase
and readiness when its Deployment shrinks."""
RETIRE_SINCE: Final = f"{v1.GROUP}/retire-since"
"""On a surplus worker being drained before its Deployment shrinks: when it was fenced."""
SCALE_DOWN_FIRST: Final = f"{v1.GROUP}/scale-down-first"
"""`"true"` on the workers the control loop found emptiest (fewest requests, least KV) when it
shrank their pool: the flip plan takes them as the surplus first (then drained, marked cheapest
to delete)."""

IMAGE_PULL: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
CONFIG_ERRORS: Final = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)


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
        scale_down_first=annotations.get(SCALE_DOWN_FIRST) == "true",
    )


def pod_problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """Why a pod that is not ready is not, from its conditions and container states.

    None when nothing is wrong yet (it is starting: image pull, model download, engine start).
    """
    if pod_ready(pod):
        return None
    name = pod_name(pod)
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return PodProblem("Unschedulable", name, str(cond.get("message") or "no node fits"))
    containers = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        detail = f"container {c.get('name')}: {reason}: {waiting.get('message') or ''}".rstrip(": ")
        if reason in IMAGE_PULL:
            return PodProblem("ImagePullFailed", name, detail)
        if reason == "CrashLoopBackOff":
            last = (c.get("lastState") or {}).get("terminated") or {}
            message = f"container {c.get('name')} restarted {c.get('restartCount', 0)} time(s)"
            if last:
                message += f", last exit code {last.get('exitCode')} ({last.get('reason')})"
            return PodProblem("CrashLooping", name, message)
        if reason in CONFIG_ERRORS:
            return PodProblem("ContainerConfigError", name, detail)
    return None


def pod_counts(pods: Sequence[Mapping[str, Any]]) -> PodCounts:
    ready = [p for p in pods if pod_ready(p)]
    unassigned = [p for p in ready if v1.LABEL_ROLE not in (p["metadata"].get("labels") or {})]
    problems = [pr for p in pods if (pr := pod_problem(p)) is not None]
    return PodCounts(
        total=len(pods), ready=len(ready), unassigned=len(unassigned), problems=tuple(problems)
    )

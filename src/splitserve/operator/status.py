"""Status of an `LLMService` and its `LLMPool`s from what the operator observed. Pure.

Conditions (each with a reason a person can act on):

- `Ready`: every pool has its desired ready workers and the router has a ready replica.
- `Degraded`: something runs below what was asked (a pool short of ready workers, a router
  replica missing); the service may still serve.
- `NotRoutable`: the router cannot serve any request: no ready worker that can generate
  (decode or mixed), or no worker pod at all ("selector ... matched 0 pods").
- `SpecApplied`: False when the operator does not honour something a person set: a pool's
  `replicas` in the service while the `LLMPool` decides (Manual, External), or a
  `kubectl scale llmpool` it reverted (Managed).

Pods that are not ready say why, from their conditions (`Unschedulable` with the scheduler's
message, `ImagePullFailed`, `CrashLooping`, `ContainerConfigError`), each with its own hint.
A reconcile that fails leaves `Ready=False` and `Degraded=True` with the API server's reason
(`Forbidden`, `Invalid`, `BadRequest`, `InvalidSpec`) and a message naming object and field.

`lastTransitionTime` only moves when a condition's status changes, so a status computed twice
from the same observation is identical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator import podspec, render
from splitserve.policy.planner.flip import WorkerObs

MAX_DECISIONS = 10


@dataclass(frozen=True, slots=True)
class PodProblem:
    """Why one worker pod is not ready (`observe.pod_problem`)."""

    reason: str
    """Unschedulable, ImagePullFailed, CrashLooping, ContainerConfigError."""
    pod: str
    message: str


HINTS: Final[Mapping[str, str]] = {
    "Unschedulable": "no node can run it: check free capacity for the group's gpus and "
    "resources, its nodeSelector and node taints (kubectl describe pod -n {ns} {pod})",
    "ImagePullFailed": "check engine.image and the image pull secret "
    "(kubectl describe pod -n {ns} {pod})",
    "CrashLooping": "the worker exits after starting: kubectl logs -n {ns} {pod} --previous",
    "ContainerConfigError": "a Secret or ConfigMap it needs is missing, or its command is wrong "
    "(kubectl describe pod -n {ns} {pod})",
}


@dataclass(frozen=True, slots=True)
class PodCounts:
    """Worker pods of the service, whatever their state."""

    total: int = 0
    ready: int = 0
    unassigned: int = 0
    problems: tuple[PodProblem, ...] = ()
    """Pods not ready for a reason other than starting up."""


def problem_summary(problems: Sequence[PodProblem], namespace: str) -> tuple[str, str] | None:
    """(reason, message) for the most common problem, or None."""
    if not problems:
        return None
    by_reason: dict[str, list[PodProblem]] = {}
    for p in problems:
        by_reason.setdefault(p.reason, []).append(p)
    reason, group = max(by_reason.items(), key=lambda kv: (len(kv[1]), kv[0]))
    first = group[0]
    hint = HINTS.get(reason, "").format(ns=namespace, pod=first.pod)
    message = f"{len(group)} worker pod(s) {reason}: {first.pod}: {first.message}"
    if hint:
        message += f"; {hint}"
    return reason, message


@dataclass(frozen=True, slots=True)
class DeploymentObs:
    name: str
    desired: int
    ready: int


def pool_statuses(
    desired: Mapping[Role, int], workers: Sequence[WorkerObs]
) -> dict[Role, v1.PoolStatus]:
    out = {}
    for role, want in desired.items():
        current = sum(1 for w in workers if w.role is role)
        ready = sum(1 for w in workers if w.serving is role)
        flipping = sum(
            1 for w in workers if w.flip is not None and role in (w.flip.source, w.flip.target)
        )
        out[role] = v1.PoolStatus(
            role=role, desired=want, current=current, ready=ready, flipping=flipping
        )
    return out


def llm_pool_status(service: str, pool: v1.PoolStatus, generation: int | None) -> v1.LLMPoolStatus:
    ready = pool.ready >= pool.desired
    cond = v1.Condition(
        type="Ready",
        status=v1.ConditionStatus.TRUE if ready else v1.ConditionStatus.FALSE,
        reason="PoolReady" if ready else "PoolBelowDesired",
        message=f"{pool.ready}/{pool.desired} {pool.role.value} workers ready",
    )
    return v1.LLMPoolStatus(
        replicas=pool.current,
        ready_replicas=pool.ready,
        flipping=pool.flipping,
        selector=render.role_selector(service, pool.role),
        observed_generation=generation,
        conditions=[cond],
    )


def _condition(
    previous: Sequence[v1.Condition],
    now: str,
    generation: int | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
) -> v1.Condition:
    value = v1.ConditionStatus.TRUE if status else v1.ConditionStatus.FALSE
    old = next((c for c in previous if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == value else now
    return v1.Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def _sized_to_zero_hint(service: str, mode: v1.ScalingMode, roles: list[Role]) -> str:
    """What sizes the decode and mixed pools in `mode`, so the person knows what to change."""
    if mode is v1.ScalingMode.MANAGED:
        fields = " or ".join(f"spec.pools.{r.value}.minReplicas" for r in roles)
        return (
            f"the autoscaler starts workers when requests arrive; to keep some up, raise {fields}"
        )
    scale = "; ".join(
        f"kubectl scale llmpool/{render.pool_name(service, r)} --replicas=N" for r in roles
    )
    who = "you" if mode is v1.ScalingMode.MANUAL else "your HPA / KEDA"
    return f"in {mode.value} mode the LLMPools' spec.replicas decide, as {who} set them: {scale}"


def _not_routable(
    service: str,
    namespace: str,
    pools: Mapping[Role, v1.PoolStatus],
    pods: PodCounts,
    mode: v1.ScalingMode,
) -> tuple[bool, str, str]:
    generating = sum(p.ready for r, p in pools.items() if r.can_generate)
    if generating:
        return False, "Routable", f"{generating} decode/mixed worker(s) ready"
    if any(r.can_generate for r in pools) and not any(
        p.desired for r, p in pools.items() if r.can_generate
    ):  # on purpose: not a quota, image or scheduling problem
        return (
            True,
            "NoDecodeWorkers",
            "the decode and mixed pools are sized to 0: "
            + ", ".join(f"{r.value} {p.ready}/{p.desired}" for r, p in pools.items())
            + f" ({_sized_to_zero_hint(service, mode, [r for r in pools if r.can_generate])})",
        )
    selector = render.selector_string(render.worker_selector(service))
    if pods.total == 0:
        return (
            True,
            "NoWorkerPods",
            f"selector {selector} matched 0 pods in {namespace}: check the worker Deployments "
            f"(kubectl describe deployment -n {namespace} -l {selector}) for quota, image or "
            "scheduling errors",
        )
    if pods.ready == 0:
        problem = problem_summary(pods.problems, namespace)
        if problem is not None:
            return True, problem[0], f"{pods.total} worker pod(s), none ready; {problem[1]}"
        return (
            True,
            "NoReadyWorkers",
            f"{pods.total} worker pod(s), none ready: see kubectl get pods -n {namespace} "
            f"-l {selector} (image pulls, model downloads and engine start-up take a while)",
        )
    if not any(r.can_generate for r in pools):
        return True, "NoDecodePool", "no decode or mixed pool: set spec.pools.decode or .mixed"
    if pods.unassigned:
        return True, "AssigningRoles", f"{pods.unassigned} ready worker(s) waiting for a role"
    return (
        True,
        "NoDecodeWorkers",
        "no ready worker in a decode or mixed role: "
        + ", ".join(f"{r.value} {p.ready}/{p.desired}" for r, p in pools.items()),
    )


def service_status(
    *,
    spec: v1.LLMServiceSpec,
    ref: render.ServiceRef,
    desired: Mapping[Role, int],
    workers: Sequence[WorkerObs],
    pods: PodCounts,
    router: DeploymentObs | None,
    previous: v1.LLMServiceStatus | None,
    now: str,
    generation: int | None,
    decisions: Sequence[str] = (),
    artifact: v1.ArtifactStatus | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    spec_replicas: Mapping[Role, int] | None = None,
) -> v1.LLMServiceStatus:
    """`overrides`: (reason, message) per change a person made that the operator does not
    honour (`SpecApplied=False`); `spec_replicas`: {role: the `spec.pools.<role>.replicas`
    the pool acknowledges} (`PoolStatus.spec_replicas`)."""
    prev = previous or v1.LLMServiceStatus()
    pools = pool_statuses(desired, workers)
    for role, acked in (spec_replicas or {}).items():
        if role in pools:
            pools[role] = pools[role].model_copy(update={"spec_replicas": acked})
    summary = v1.RoleSummary(**{r.value: f"{p.ready}/{p.desired}" for r, p in pools.items()})
    short = [
        f"{r.value} {p.ready}/{p.desired} ready" for r, p in pools.items() if p.ready < p.desired
    ]
    router_ready = router is not None and router.ready >= 1  # desired 0 is no router either
    if router is not None and router.ready < router.desired:
        short.append(f"router {router.ready}/{router.desired} ready")
    blocked, nr_reason, nr_message = _not_routable(
        ref.name, ref.namespace, pools, pods, spec.scaling.mode
    )
    if not blocked and router is not None and router.desired == 0 and router.ready == 0:
        blocked, nr_reason = True, "NoRouter"
        nr_message = "spec.router.replicas is 0: no router pod serves the service"
    if blocked:
        ready_reason, ready_message = nr_reason, nr_message
    elif not router_ready:  # (router replicas 0 is `NoRouter` above)
        ready_reason = "RouterNotReady"
        ready_message = (
            f"no ready router pod: kubectl describe deployment -n {ref.namespace} "
            f"{render.router_name(ref.name)}"
        )
    elif short:
        ready_reason, ready_message = "PoolsBelowDesired", "; ".join(short)
    else:
        ready_reason, ready_message = "AllPoolsReady", "every pool has its desired ready workers"
    is_ready = not blocked and router_ready and not short
    problem = problem_summary(pods.problems, ref.namespace)
    degraded_reason = "PoolsBelowDesired" if short else "AsDesired"
    degraded_message = "; ".join(short) if short else "nothing runs below what was asked"
    if short and problem is not None:
        degraded_reason, degraded_message = problem[0], f"{degraded_message}; {problem[1]}"
        if ready_reason == "PoolsBelowDesired":
            ready_reason, ready_message = degraded_reason, degraded_message
    waiting = (v1.ArtifactPhase.PENDING, v1.ArtifactPhase.DOWNLOADING, v1.ArtifactPhase.FAILED)
    if not is_ready and artifact is not None and artifact.phase in waiting:
        # Workers wait for the model cache: say so rather than "no ready workers".
        ready_reason = f"Model{artifact.phase.value}"
        ready_message = f"model {artifact.source}: {artifact.message}"

    def cond(type_: str, status: bool, reason: str, message: str) -> v1.Condition:
        return _condition(prev.conditions, now, generation, type_, status, reason, message)

    conditions = [
        cond("Ready", is_ready, ready_reason, ready_message),
        cond("Degraded", bool(short), degraded_reason, degraded_message),
        cond("NotRoutable", blocked, nr_reason, nr_message),
        cond(
            "SpecApplied",
            not overrides,
            overrides[0][0] if overrides else "AsSpecified",
            "; ".join(m for _, m in overrides) if overrides else "the spec is applied as written",
        ),
    ]
    # Conditions other writers own (the control loop's SLOAtRisk) are kept as they are.
    ours = {c.type for c in conditions}
    conditions += [c for c in prev.conditions if c.type not in ours]
    kept = _decided(prev.decisions, decisions, now)
    return v1.LLMServiceStatus(
        observed_generation=generation,
        pools=list(pools.values()),
        summary=summary,
        slo_attainment=prev.slo_attainment,
        slo_classes=prev.slo_classes,
        decisions=kept,
        router_endpoint=render.router_endpoint(spec, ref),
        conditions=conditions,
        model_artifact=artifact,
        scaling_mode=spec.scaling.mode,
    )


def artifact_status(
    spec: v1.LLMServiceSpec, ref: render.ServiceRef, job: Mapping[str, Any] | None
) -> v1.ArtifactStatus:
    """The model artifact's state, from the download Job (when the model has a cache)."""
    art = podspec.artifact(spec, ref.name)
    src = spec.model.source
    kind = art.source.kind
    if kind is v1.SourceKind.HF and art.marker is None:
        return v1.ArtifactStatus(
            source=src,
            phase=v1.ArtifactPhase.PER_POD,
            message="no model.cache: every worker pod downloads the model when it starts",
        )
    if art.marker is None:
        where = {
            v1.SourceKind.PVC: f"claim {art.source.location}",
            v1.SourceKind.OCI: f"image volume {art.source.location}",
            v1.SourceKind.FILE: "the worker image",
        }[kind]
        return v1.ArtifactStatus(
            source=src,
            phase=v1.ArtifactPhase.READY,
            path=art.directory,
            message=f"read in place from {where} (its contents are not checked by the operator)",
        )
    name = render.model_cache_job_name(spec, ref)
    st = (job or {}).get("status") or {}
    where = f"kubectl logs -n {ref.namespace} job/{name}"
    failed = any(
        c.get("type") == "Failed" and c.get("status") == "True" for c in st.get("conditions", [])
    )
    if int(st.get("succeeded", 0)) > 0:
        phase, msg = v1.ArtifactPhase.READY, f"downloaded into claim {art.cache_claim}"
    elif failed:
        reason = next(
            (c.get("message", "") for c in st.get("conditions", []) if c.get("type") == "Failed"),
            "",
        )
        phase, msg = v1.ArtifactPhase.FAILED, f"download failed: {reason} ({where})"
    elif int(st.get("active", 0)) > 0:
        since = st.get("startTime", "?")
        retries = int(st.get("failed", 0))
        phase = v1.ArtifactPhase.DOWNLOADING
        msg = f"downloading since {since}, {retries} failed attempt(s) ({where})"
    else:
        phase, msg = v1.ArtifactPhase.PENDING, f"download Job {name} not started yet"
    return v1.ArtifactStatus(
        source=src, phase=phase, path=art.directory, job=name, message=msg[:1024]
    )


def _decided(
    before: Sequence[v1.Decision], decisions: Sequence[str], now: str
) -> list[v1.Decision]:
    """The last `MAX_DECISIONS` of `before` and the new `decisions` (kind: the first word)."""
    new = [v1.Decision(time=now, kind=d.split(" ", 1)[0], message=d[:1024]) for d in decisions]
    return [*before, *new][-MAX_DECISIONS:]


def failed_status(
    previous: v1.LLMServiceStatus | None,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
    decisions: Sequence[str] = (),
) -> v1.LLMServiceStatus:
    """The last status with `Ready=False` and `Degraded=True` for a reconcile that failed, with
    the `decisions` it carried out before it failed."""
    prev = previous or v1.LLMServiceStatus()
    message = message[:4096]
    ready = _condition(prev.conditions, now, generation, "Ready", False, reason, message)
    degraded = _condition(prev.conditions, now, generation, "Degraded", True, reason, message)
    rest = [c for c in prev.conditions if c.type not in ("Ready", "Degraded")]
    return prev.model_copy(
        update={
            "conditions": [ready, degraded, *rest],
            "decisions": _decided(prev.decisions, decisions, now),
        }
    )

"""One reconcile of one `LLMService`: observe, decide (pure), act, report. Idempotent.

1. read the service, its `LLMPool`s and its worker pods;
2. plan role assignments and flips (`policy.planner.flip`) and carry out their steps, recording
   each step on the pod before the next one (so a restarted operator resumes);
3. mark the pods no pool needs as cheapest to delete (`pod-deletion-cost`);
4. apply `render(spec, observed)` with create / merge-patch, and delete owned objects that are
   no longer rendered;
5. write `LLMPool` and `LLMService` status, only when it changed.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.core.errors import ConfigError
from splitserve.core.roles import Role
from splitserve.operator import observe, render, status
from splitserve.operator.kube import OWNED_KINDS, Kube, Obj, apply, covers, owned_by
from splitserve.operator.workers import WorkerCallError, WorkerClient
from splitserve.policy.planner import flip

log = logging.getLogger(__name__)

SERVICE: Final = (v1.API_VERSION, "LLMService")
POOL: Final = (v1.API_VERSION, "LLMPool")
RFC3339: Final = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True, slots=True)
class Settings:
    router_image: str = "ghcr.io/splitserve/splitserve:latest"
    """Router image for services that name none."""
    drain_wait_s: float = 2.0
    """How long one Drain call may block a reconcile; a longer drain resumes next tick."""


@dataclass(slots=True)
class Outcome:
    status: v1.LLMServiceStatus | None = None
    actions: list[str] = field(default_factory=list)
    """What changed in the cluster, e.g. `created Deployment tiny-workers`."""


def parse_spec(obj: Mapping[str, Any]) -> v1.LLMServiceSpec:
    try:
        return v1.LLMServiceSpec.model_validate(obj.get("spec") or {})
    except ValidationError as err:
        name = obj.get("metadata", {}).get("name")
        # Field paths and messages only: the input values may hold credentials.
        details = "; ".join(
            f"spec.{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
            for e in err.errors(include_input=False, include_url=False)
        )
        raise ConfigError(f"LLMService {name}: invalid spec: {details}") from None


def reconcile(
    kube: Kube, workers: WorkerClient, namespace: str, name: str, settings: Settings, now: str
) -> Outcome:
    """Bring the service's children, roles and status in line. Returns what it did."""
    svc = kube.get(*SERVICE, namespace, name)
    if svc is None or svc["metadata"].get("deletionTimestamp"):
        return Outcome()
    try:
        spec = parse_spec(svc)
    except ConfigError as err:
        _report_invalid(kube, svc, str(err), now)
        raise
    ref = render.ServiceRef(name, namespace, str(svc["metadata"]["uid"]))
    out = Outcome()

    pools = {
        Role(p["spec"]["role"]): p
        for p in kube.list(*POOL, namespace, {v1.LABEL_SERVICE: name})
        if owned_by(p, ref.uid) and p.get("spec", {}).get("role") in set(Role)
    }
    observed = render.Observed(
        service=ref,
        pool_replicas={r: int(p["spec"].get("replicas", 0)) for r, p in pools.items()},
        router_image=settings.router_image,
    )
    desired = render.desired_replicas(spec, observed)

    # Roles first: pods marked as surplus before a Deployment shrinks are the ones it deletes.
    pods = {
        observe.pod_name(p): dict(p)
        for p in observe.live_pods(kube.list("v1", "Pod", namespace, render.worker_selector(name)))
    }
    observed_workers = [observe.worker(p, spec) for p in pods.values()]
    probe = flip.roles_to_probe(observed_workers, desired)
    queued = _queue_lengths(workers, pods, probe, spec)
    plan = flip.plan(
        observed_workers,
        desired,
        queued,
        flip.FlipParams(spec.flipping.enabled, spec.flipping.max_concurrent),
    )
    for reason in plan.reasons:
        log.info("%s/%s: %s", namespace, name, reason)
    for pod_name, progress in plan.steps:
        pods[pod_name] = run_flip(kube, workers, pods[pod_name], progress, spec, settings, now)
    _mark_surplus(kube, pods, set(plan.surplus))

    manifests = render.render(spec, observed)
    applied: dict[tuple[str, str], Obj] = {}
    for manifest in manifests:
        action, obj = apply(kube, manifest)
        applied[(manifest["kind"], manifest["metadata"]["name"])] = obj
        if action != "unchanged":
            out.actions.append(f"{action} {manifest['kind']} {manifest['metadata']['name']}")
    out.actions += prune(kube, ref, set(applied))

    workers_now = [observe.worker(p, spec) for p in pods.values()]
    pool_states = status.pool_statuses(desired, workers_now)
    for role, pool_state in pool_states.items():
        pool_obj = applied.get(("LLMPool", render.pool_name(name, role)))
        generation = (pool_obj or {}).get("metadata", {}).get("generation")
        wanted = status.llm_pool_status(name, pool_state, generation).wire()
        if pool_obj is not None and not covers(pool_obj.get("status") or {}, wanted):
            kube.patch(*POOL, namespace, render.pool_name(name, role), {"status": wanted}, "status")

    router = applied.get(("Deployment", render.router_name(name)))
    router_obs = None
    if router is not None:
        router_obs = status.DeploymentObs(
            name=render.router_name(name),
            desired=int(router["spec"].get("replicas", 0)),
            ready=int((router.get("status") or {}).get("readyReplicas", 0)),
        )
    job_name = render.model_cache_job_name(spec, ref)
    artifact = status.artifact_status(
        spec, ref, applied.get(("Job", job_name)) if job_name else None
    )
    previous = _previous_status(svc)
    decisions = [r for r in plan.reasons if r.startswith(("assign ", "flip "))]
    new_status = status.service_status(
        spec=spec,
        ref=ref,
        desired=desired,
        workers=workers_now,
        pods=observe.pod_counts(list(pods.values())),
        router=router_obs,
        previous=previous,
        now=now,
        generation=svc["metadata"].get("generation"),
        decisions=decisions,
        artifact=artifact,
    )
    wire = new_status.wire()
    current = svc.get("status") or {}
    if not (covers(current, wire) and covers(wire, _ours(current))):
        kube.patch(*SERVICE, namespace, name, {"status": wire}, "status")
        out.actions.append(f"status LLMService {name}")
    out.status = new_status
    return out


def _report_invalid(kube: Kube, svc: Mapping[str, Any], message: str, now: str) -> None:
    """An invalid spec (one the CRD schema let through) shows in status, not only in logs."""
    md = svc["metadata"]
    cond = v1.Condition(
        type="Ready",
        status=v1.ConditionStatus.FALSE,
        reason="InvalidSpec",
        message=message[:4096],
        last_transition_time=now,
        observed_generation=md.get("generation"),
    )
    current = (svc.get("status") or {}).get("conditions") or []
    if [c.get("reason") for c in current] != ["InvalidSpec"] or current[0].get(
        "message"
    ) != message[:4096]:
        patch = {
            "status": {"conditions": [cond.wire()], "observedGeneration": md.get("generation")}
        }
        kube.patch(*SERVICE, md["namespace"], md["name"], patch, "status")


def _ours(status_obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a stored status this operator writes (kopf may keep its own keys there)."""
    fields = {f.alias or n for n, f in v1.LLMServiceStatus.model_fields.items()}
    return {k: v for k, v in status_obj.items() if k in fields}


def _previous_status(svc: Mapping[str, Any]) -> v1.LLMServiceStatus | None:
    try:
        return v1.LLMServiceStatus.model_validate(_ours(svc.get("status") or {}))
    except ValidationError:
        return None


def run_flip(
    kube: Kube,
    workers: WorkerClient,
    pod: Obj,
    progress: flip.FlipProgress,
    spec: v1.LLMServiceSpec,
    settings: Settings,
    now: str,
) -> Obj:
    """Carry out a flip from its current step as far as it goes now; record each step done.

    Every step is idempotent, and the pod's annotation names the next step only after the
    current one succeeded, so repeating a step after a crash is harmless.
    """
    md = pod["metadata"]
    address = observe.pod_address(pod, spec.engine.grpc_port)
    current: flip.FlipProgress | None = progress
    while current is not None:
        labels: dict[str, str | None] = {}
        notes: dict[str, str | None] = {}
        try:
            if current.step is flip.Step.FENCE:
                labels[v1.LABEL_FENCED] = "true"
                notes[v1.ANNOTATION_FLIP_SINCE] = now
            elif current.step is flip.Step.DRAIN:
                in_flight = workers.drain(address, timeout_s=settings.drain_wait_s)
                waited = _seconds_since(md, now)
                if in_flight > 0 and waited < spec.flipping.drain_timeout_seconds:
                    log.info("%s: draining, %d request(s) in flight", md["name"], in_flight)
                    return pod
                if in_flight > 0:
                    log.warning(
                        "%s: drain timed out after %.0fs with %d request(s) in flight; "
                        "switching role anyway (they finish under the old role)",
                        md["name"],
                        waited,
                        in_flight,
                    )
            elif current.step is flip.Step.SET_ROLE:
                workers.set_role(address, current.target)
            elif current.step is flip.Step.RELABEL:
                labels[v1.LABEL_ROLE] = current.target.value
            elif current.step is flip.Step.UNFENCE:
                if current.source is not None:
                    workers.resume(address)
                labels[v1.LABEL_FENCED] = None
                notes[v1.ANNOTATION_FLIP_SINCE] = None
        except WorkerCallError as err:
            log.warning(
                "%s: flip step %s failed, retrying later: %s", md["name"], current.step, err
            )
            return pod
        nxt = current.advanced()
        notes[v1.ANNOTATION_FLIP] = nxt.encode() if nxt else None
        meta: dict[str, Any] = {"annotations": notes}
        if labels:
            meta["labels"] = labels
        pod = kube.patch("v1", "Pod", md["namespace"], md["name"], {"metadata": meta})
        md = pod["metadata"]
        current = nxt
    return pod


def _queue_lengths(
    workers: WorkerClient,
    pods: Mapping[str, Obj],
    probe: Mapping[Role, str],
    spec: v1.LLMServiceSpec,
) -> dict[Role, int]:
    """Work on the last serving worker of each role in `probe`; unknown roles are left out."""
    out: dict[Role, int] = {}
    for role, pod_name in probe.items():
        try:
            out[role] = workers.load(observe.pod_address(pods[pod_name], spec.engine.grpc_port))
        except WorkerCallError as err:
            log.warning("%s: no load report (%s); keeping it in %s", pod_name, err, role.value)
    return out


def _seconds_since(md: Mapping[str, Any], now: str) -> float:
    """Seconds since the flip fenced the worker (0 when unknown)."""
    since = (md.get("annotations") or {}).get(v1.ANNOTATION_FLIP_SINCE)
    try:
        start = datetime.datetime.strptime(str(since), RFC3339)
        end = datetime.datetime.strptime(now, RFC3339)
    except ValueError:
        return 0.0
    return (end - start).total_seconds()


def _mark_surplus(kube: Kube, pods: Mapping[str, Obj], surplus: set[str]) -> None:
    for name, pod in pods.items():
        have = (pod["metadata"].get("annotations") or {}).get(observe.DELETION_COST)
        want = observe.SURPLUS_COST if name in surplus else None
        if have != want:
            patch = {"metadata": {"annotations": {observe.DELETION_COST: want}}}
            kube.patch("v1", "Pod", pod["metadata"]["namespace"], name, patch)


def prune(kube: Kube, ref: render.ServiceRef, keep: set[tuple[str, str]]) -> list[str]:
    """Delete objects the service owns that are no longer rendered."""
    done = []
    for api_version, kind in OWNED_KINDS:
        for obj in kube.list(api_version, kind, ref.namespace, {v1.LABEL_SERVICE: ref.name}):
            obj_name = obj["metadata"]["name"]
            stale = owned_by(obj, ref.uid) and (kind, obj_name) not in keep
            if stale and kube.delete(api_version, kind, ref.namespace, obj_name):
                done.append(f"deleted {kind} {obj_name}")
    return done


def delete_owned(kube: Kube, ref: render.ServiceRef) -> list[str]:
    """Delete everything the service owns (for API servers without garbage collection)."""
    return prune(kube, ref, set())


def assigned_roles(pods: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """{pod: role label} (for logs and tests)."""
    return {
        observe.pod_name(p): (p["metadata"].get("labels") or {}).get(v1.LABEL_ROLE) for p in pods
    }

"""One reconcile of one `LLMService`: observe, decide (pure), act, report. Idempotent.

1. read the service, its `LLMPool`s and its worker pods;
2. plan role assignments and flips (`policy.planner.flip`) and carry out their steps, recording
   each step on the pod before the next one (so a restarted operator resumes);
3. fence and drain the workers no pool needs; once drained, mark them cheapest to delete
   (`pod-deletion-cost`) and let their Deployment shrink, so the ReplicaSet removes exactly
   those pods (until then the Deployment keeps its size);
4. apply `render(spec, observed)` with create / merge-patch, and delete owned objects that are
   no longer rendered;
5. write `LLMPool` and `LLMService` status, only when it changed; post an Event for each
   decision, flip step, condition change and failure.

Pool sizes set through `LLMPool`s (Manual, External) settle for `Settings.coalesce_s` before
the operator acts on them: `kubectl scale` of prefill down and decode up, one after the other,
is one flip and not a pod deleted and another created.

A reconcile that fails leaves `Ready=False` / `Degraded=True` naming the object, the field of
the spec it came from and the API server's answer, and an Event; the caller decides how soon
to retry (`KubeError.permanent`).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.core.errors import ConfigError
from splitserve.core.roles import Role
from splitserve.operator import certs, observe, render, status, validate
from splitserve.operator.events import EventType, Recorder
from splitserve.operator.kube import OWNED_KINDS, Kube, KubeError, Obj, apply, covers, owned_by
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
    coalesce_s: float = 2.0
    """Pool sizes changed through `LLMPool`s settle this long before the operator acts."""


@dataclass(slots=True)
class Outcome:
    status: v1.LLMServiceStatus | None = None
    actions: list[str] = field(default_factory=list)
    """What changed in the cluster, e.g. `created Deployment tiny-workers`."""
    settle_s: float = 0.0
    """> 0: pool sizes changed within the coalescing window; reconcile again after this long."""


class Coalescer:
    """Debounces pool sizes set through `LLMPool`s, per service.

    `replicas` returns the sizes to act on: the last settled ones while any pool of the service
    changed less than `window_s` ago (each change restarts the window), the new ones after.
    A service seen for the first time (or after an operator restart) is settled at once.
    """

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, str], tuple[dict[Role, int], dict[Role, int], float]] = {}
        self._lock = threading.Lock()

    def replicas(
        self, key: tuple[str, str], observed: Mapping[Role, int]
    ) -> tuple[dict[Role, int], float]:
        """(sizes to act on, seconds until the window closes; 0 when settled)."""
        now = self.clock()
        current = dict(observed)
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or self.window_s <= 0:
                self._seen[key] = (current, current, now - self.window_s)
                return current, 0.0
            last, acted, changed_at = seen
            # A pool seen for the first time (just created) counts as it is, at once.
            acted = {**{r: n for r, n in current.items() if r not in last}, **acted}
            if any(last.get(r, n) != n for r, n in current.items()):
                changed_at = now
            wait = changed_at + self.window_s - now
            if wait <= 0:
                acted = current
            self._seen[key] = (current, acted, changed_at)
            return {r: acted.get(r, n) for r, n in current.items()}, max(0.0, wait)

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._seen.pop(key, None)


def parse_spec(obj: Mapping[str, Any]) -> v1.LLMServiceSpec:
    try:
        return v1.LLMServiceSpec.model_validate(obj.get("spec") or {})
    except ValidationError as err:
        name = obj.get("metadata", {}).get("name")
        # Field paths and messages only (`spec_errors`): the input values may hold credentials.
        raise ConfigError(
            f"LLMService {name}: invalid spec: " + "; ".join(validate.spec_errors(err))
        ) from None


def spec_field(spec: v1.LLMServiceSpec, service: str, kind: str, name: str) -> str:
    """The part of the spec an object the operator writes comes from (for failure messages)."""
    for group in spec.worker_groups:
        if name == render.group_deployment_name(service, group.name):
            return f"spec.workerGroups[{group.name}]"
    for role, _ in spec.pools.items():
        if kind == "LLMPool" and name == render.pool_name(service, role):
            return f"spec.pools.{role.value}"
    if kind == "Pod":
        return "spec.workerGroups"
    return "spec.router"


def failure_message(err: KubeError, spec: v1.LLMServiceSpec | None, service: str) -> str:
    """`<verb> <Kind> <name> (from <field>): <status> <reason>: <what the API server said>`."""
    target = err.target or "request"
    parts = target.split(" ")
    where = ""
    if spec is not None and len(parts) == 3:
        where = f" (from {spec_field(spec, service, parts[1], parts[2])})"
    return f"{target}{where}: {err.status} {err.reason}: {err.message}"


def reconcile(
    kube: Kube,
    workers: WorkerClient,
    namespace: str,
    name: str,
    settings: Settings,
    now: str,
    *,
    events: Recorder | None = None,
    coalescer: Coalescer | None = None,
    pki: certs.Issuer | None = None,
) -> Outcome:
    """Bring the service's children, roles and status in line. Returns what it did.

    `pki`: issue the service's internal TLS certificates (or have cert-manager issue them) and
    mount them (None: plaintext).

    Raises `ConfigError` (invalid spec) or `KubeError` after reporting either in status and as
    an Event.
    """
    svc = kube.get(*SERVICE, namespace, name)
    if svc is None or svc["metadata"].get("deletionTimestamp"):
        return Outcome()
    events = events or Recorder()
    spec: v1.LLMServiceSpec | None = None
    # What this pass did (assignments, flips, abandons, retirements), as it does it: a pass that
    # fails later still records them in status.decisions.
    decisions: list[str] = []
    try:
        spec = parse_spec(svc)
        return _reconcile(
            kube, workers, svc, spec, settings, now, events, coalescer, pki, decisions
        )
    except ConfigError as err:
        _release_workers(kube, workers, svc, spec, events, now, decisions)
        report_failure(kube, svc, "InvalidSpec", str(err), now, events, decisions)
        raise
    except KubeError as err:
        message = failure_message(err, spec, name)
        report_failure(kube, svc, err.reason, message, now, events, decisions)
        raise


def _reconcile(
    kube: Kube,
    workers: WorkerClient,
    svc: Obj,
    spec: v1.LLMServiceSpec,
    settings: Settings,
    now: str,
    events: Recorder,
    coalescer: Coalescer | None,
    pki: certs.Issuer | None,
    decisions: list[str],
) -> Outcome:
    """`decisions` receives each decision as it is carried out."""
    namespace, name = str(svc["metadata"]["namespace"]), str(svc["metadata"]["name"])
    ref = render.ServiceRef(name, namespace, str(svc["metadata"]["uid"]))
    out = Outcome()

    def event(type_: EventType, reason: str, message: str) -> None:
        events.post(kube, svc, type_, reason, message, now)

    pools = {
        Role(p["spec"]["role"]): p
        for p in kube.list(*POOL, namespace, {v1.LABEL_SERVICE: name})
        if owned_by(p, ref.uid) and p.get("spec", {}).get("role") in set(Role)
    }
    pool_replicas = {r: int(p["spec"].get("replicas", 0)) for r, p in pools.items()}
    previous = _previous_status(svc)
    entering = _entering_managed(spec, previous, pool_replicas)
    if entering:
        svc, spec = _adopt_live_sizes(kube, svc, spec, previous, entering, event, decisions)
    if coalescer is not None and spec.scaling.mode is not v1.ScalingMode.MANAGED:
        pool_replicas, out.settle_s = coalescer.replicas((namespace, name), pool_replicas)
    observed = render.Observed(
        service=ref,
        pool_replicas=pool_replicas,
        recreate=_deleted_pools(spec, name, pools, previous, event, decisions),
        router_image=settings.router_image,
        internal_tls=pki is not None,
    )
    desired = render.desired_replicas(spec, observed)
    acknowledged, unapplied = _acknowledged(spec, pools, previous, observed.recreate)
    overrides = _overrides(
        spec, name, pools, unapplied, previous, svc["metadata"].get("generation")
    )
    overrides += render.group_coverage_problems(spec, desired)

    # Roles first: pods marked as surplus before a Deployment shrinks are the ones it deletes.
    pods = {
        observe.pod_name(p): dict(p)
        for p in observe.live_pods(kube.list("v1", "Pod", namespace, render.worker_selector(name)))
    }
    _abandon_unreadable_flips(kube, workers, pods, spec, event)
    # Workers of a group no longer in the spec (removed, renamed) leave like a scale-down:
    # fenced and drained before their Deployment goes; no plan counts or moves them.
    leaving = _of_removed_groups(pods, spec)
    removed_groups = {_group_of(pods[n]) for n in leaving}
    starting = sorted(  # groups whose drain starts in this pass
        {
            _group_of(pods[n])
            for n in leaving
            if not _retiring(pods[n]) and observe.pod_ready(pods[n])
        }
    )
    for pod_name in sorted(leaving):
        pods[pod_name] = _leave_flip(kube, workers, pods[pod_name], spec, now, event, decisions)
    observed_workers = [observe.worker(p, spec) for n, p in pods.items() if n not in leaving]
    probe = flip.roles_to_probe(observed_workers, desired)
    queued = _queue_lengths(workers, pods, probe, spec)
    plan = flip.plan(
        observed_workers,
        desired,
        queued,
        flip.FlipParams(spec.flipping.enabled, spec.flipping.max_concurrent),
    )
    stuck = _flipping_disabled(spec, observed_workers, desired, namespace)
    if stuck is not None:
        overrides.insert(0, ("FlippingDisabled", stuck))  # it explains a pool left short
    for reason in plan.reasons:
        log.info("%s/%s: %s", namespace, name, reason)
        if reason.startswith(("assign ", "flip ")):
            event("Normal", "Assigned" if reason.startswith("assign ") else "FlipStarted", reason)
            decisions.append(reason)
    for pod_name, why in plan.abandon:
        pods[pod_name] = abandon_flip(
            kube, workers, pods[pod_name], spec.engine.grpc_port, why, event, decisions
        )
    for pod_name, progress in plan.steps:
        pods[pod_name] = run_flip(
            kube, workers, pods[pod_name], progress, spec, settings, now, event, decisions
        )
    sizes = render.group_replicas(spec, desired)
    retire = _to_retire(pods, plan.surplus, sizes) | leaving
    drained, held = _retire(kube, workers, pods, retire, spec, settings, now, event)
    kept_groups = _removed_groups_held(name, removed_groups, held)
    for gone in starting:
        decisions.append(
            f"retire worker group {gone!r} (no longer in spec.workerGroups): its workers are "
            f"drained before Deployment {render.group_deployment_name(name, gone)} is deleted"
        )
    _mark_surplus(kube, pods, drained)

    if pki is not None:  # certificates before the pods that mount them
        when = datetime.datetime.strptime(now, RFC3339).replace(tzinfo=datetime.UTC)
        pki.refresh_own(when)
        out.actions += pki.ensure(kube, ref, when)
    manifests = render.render(spec, observed)
    for manifest in manifests:
        group = render_group(manifest, spec, name)
        if group is not None and held.get(group):
            # Drain first: the Deployment shrinks only by the workers already drained.
            manifest["spec"]["replicas"] += held[group]
        if manifest["kind"] == "LLMPool":
            edited = _bounds_edited(manifest, pools.get(Role(manifest["spec"]["role"])))
            if edited is not None:
                event("Warning", "BoundsReverted", edited)
                overrides.append(("BoundsReverted", edited))
        if manifest["kind"] == "LLMPool" and spec.scaling.mode is v1.ScalingMode.MANAGED:
            role = Role(manifest["spec"]["role"])
            have = pool_replicas.get(role)
            want = manifest["spec"].get("replicas")
            # Someone else's change: not what the operator wrote last (its own resize is not).
            wrote = next(
                (p.desired for p in (previous.pools if previous else []) if p.role is role), None
            )
            if have is not None and want is not None and have != want and have != wrote:
                message = (
                    f"kubectl scale llmpool/{manifest['metadata']['name']} --replicas={have} "
                    f"was reverted to {want}: in Managed mode spec.pools.{role.value}.replicas "
                    "decides; edit the LLMService, or set spec.scaling.mode to Manual"
                )
                event("Warning", "ScaleReverted", message)
                overrides.append(("ScaleReverted", message))
    applied: dict[tuple[str, str], Obj] = {}
    for manifest in manifests:
        action, obj = apply(kube, manifest)
        applied[(manifest["kind"], manifest["metadata"]["name"])] = obj
        if action != "unchanged":
            out.actions.append(f"{action} {manifest['kind']} {manifest['metadata']['name']}")
    pruned = prune(kube, ref, set(applied) | kept_groups)
    out.actions += pruned
    for gone in sorted(removed_groups):
        deployment = render.group_deployment_name(name, gone)
        if f"deleted Deployment {deployment}" in pruned:
            decisions.append(
                f"retire worker group {gone!r}: its workers are drained; deleted Deployment "
                f"{deployment}"
            )

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
        overrides=overrides,
        spec_replicas=acknowledged,
    )
    _post_transitions(previous, new_status, event)
    _write_status(kube, svc, new_status)
    if _status_changed(svc, new_status):
        out.actions.append(f"status LLMService {name}")
    out.status = new_status
    return out


def _entering_managed(
    spec: v1.LLMServiceSpec,
    previous: v1.LLMServiceStatus | None,
    pool_replicas: Mapping[Role, int],
) -> dict[Role, int]:
    """{role: live size to take into the spec} when this reconcile enters Managed mode from
    another (`status.scalingMode`): the pools' live sizes within the spec's min/max. Empty
    otherwise, or when the spec already says so."""
    before = previous.scaling_mode if previous is not None else None
    if spec.scaling.mode is not v1.ScalingMode.MANAGED or before in (None, spec.scaling.mode):
        return {}
    out: dict[Role, int] = {}
    for role, pool in spec.pools.items():
        if role not in pool_replicas:
            continue
        live = max(pool.min_replicas, pool_replicas[role])
        if pool.max_replicas is not None:
            live = min(live, pool.max_replicas)
        if live != pool.replicas:
            out[role] = live
    return out


def _adopt_live_sizes(
    kube: Kube,
    svc: Obj,
    spec: v1.LLMServiceSpec,
    previous: v1.LLMServiceStatus | None,
    sizes: Mapping[Role, int],
    event: Callable[[EventType, str, str], None],
    decisions: list[str],
) -> tuple[Obj, v1.LLMServiceSpec]:
    """Write `sizes` into `spec.pools.<role>.replicas` (the field Managed mode acts on), so
    Managed starts where the pools are and not at numbers left from before. Returns the
    service and spec as written."""
    md = svc["metadata"]
    patch = {"spec": {"pools": {r.value: {"replicas": n} for r, n in sizes.items()}}}
    try:
        svc = kube.patch(*SERVICE, md["namespace"], md["name"], patch)
    except KubeError as err:
        raise err.about(f"patch LLMService {md['name']}") from err
    before = previous.scaling_mode.value if previous and previous.scaling_mode else "?"
    old = {r: getattr(spec.pools, r.value).replicas for r in sizes}
    message = (
        "scale "
        + ", ".join(f"{r.value} {n}" for r, n in sizes.items())
        + f": scaling.mode {before} -> Managed starts from the live LLMPool sizes (within "
        "min/max), not from spec.pools ("
        + ", ".join(f"{r.value}.replicas was {old[r]}" for r in sizes)
        + ")"
    )
    log.info("%s/%s: %s", md["namespace"], md["name"], message)
    event("Normal", "ManagedFromLiveSizes", message)
    decisions.append(message)
    return svc, parse_spec(svc)


def render_group(manifest: Mapping[str, Any], spec: v1.LLMServiceSpec, service: str) -> str | None:
    """The worker group a rendered Deployment runs, or None."""
    if manifest["kind"] != "Deployment":
        return None
    for group in spec.worker_groups:
        if manifest["metadata"]["name"] == render.group_deployment_name(service, group.name):
            return group.name
    return None


_BOUNDS: Final = ("minReplicas", "maxReplicas")


def _bounds_edited(manifest: Obj, live: Obj | None) -> str | None:
    """Why an `LLMPool`'s `minReplicas` / `maxReplicas` are being put back, if someone else
    edited them: they are written from the service's `spec.pools.<role>`. The pool's spec
    changed since the operator last wrote its status (`observedGeneration` behind `generation`:
    not the operator's own write) and a bound differs from the service's."""
    if live is None:
        return None
    seen = (live.get("status") or {}).get("observedGeneration")
    if seen is None or seen == live["metadata"].get("generation"):
        return None
    have, want = live.get("spec") or {}, manifest["spec"]
    changed = [k for k in _BOUNDS if have.get(k) != want.get(k)]
    if not changed:
        return None
    name, role = manifest["metadata"]["name"], manifest["spec"]["role"]
    edits = ", ".join(f"spec.{k} {have.get(k, 'unset')}" for k in changed)
    back = ", ".join(str(want.get(k, "unset")) for k in changed)
    verb = "was" if len(changed) == 1 else "were"
    return (
        f"LLMPool {name} {edits} {verb} put back to {back}: a pool's bounds come from the "
        f"LLMService's spec.pools.{role}; edit the LLMService to change them"
    )


def _deleted_pools(
    spec: v1.LLMServiceSpec,
    service: str,
    pools: Mapping[Role, Obj],
    previous: v1.LLMServiceStatus | None,
    event: Callable[[EventType, str, str], None],
    decisions: list[str],
) -> dict[Role, int]:
    """{role: last size} of the pools someone deleted (Manual, External): the status still has
    them, the API server not. Recreated at the service's initial `replicas`, a pool scaled to 4
    would drop to 2 workers unasked; it comes back at its last size, said in an Event."""
    if spec.scaling.mode is v1.ScalingMode.MANAGED or previous is None:
        return {}
    out: dict[Role, int] = {}
    for last in previous.pools:
        pool = getattr(spec.pools, last.role.value, None)
        if pool is None or last.role in pools:
            continue
        out[last.role] = last.desired
        message = (
            f"LLMPool {render.pool_name(service, last.role)} was deleted: recreated at its last "
            f"size {last.desired}, not spec.pools.{last.role.value}.replicas ({pool.replicas}), "
            f"which sizes a new pool only (in {spec.scaling.mode.value} mode the pool decides: "
            f"kubectl scale llmpool/{render.pool_name(service, last.role)} --replicas=N)"
        )
        event("Warning", "PoolRecreated", message)
        decisions.append(message)
    return out


def _flipping_disabled(
    spec: v1.LLMServiceSpec,
    workers: Sequence[flip.WorkerObs],
    desired: Mapping[Role, int],
    namespace: str,
) -> str | None:
    """Why a pool stays short with `flipping.enabled: false`, if it does: another role holds
    workers beyond its pool that could take the short role, and only a flip would move them (the
    group's size already counts them, so no new pod starts)."""
    if spec.flipping.enabled:
        return None
    have = dict.fromkeys(desired, 0)
    for w in workers:
        if w.counts_as in have:
            have[w.counts_as] += 1
    short = [r for r in desired if have[r] < desired[r]]
    over = {r for r in desired if have[r] > desired[r]}
    movable = sorted(
        w.name for w in workers if w.counts_as in over and any(r in w.allowed for r in short)
    )
    if not short or not movable:
        return None
    wanted = ", ".join(f"{r.value} {have[r]}/{desired[r]}" for r in short)
    return (
        f"{wanted}: {', '.join(movable)} serve(s) a role beyond its pool and could take it, "
        "but spec.flipping.enabled is false, so they are neither moved nor replaced (their "
        "group's size already counts them). Set spec.flipping.enabled: true, or delete such a "
        f"pod (kubectl delete pod -n {namespace} {movable[0]}): its replacement takes the "
        "missing role"
    )


def _acknowledged(
    spec: v1.LLMServiceSpec,
    pools: Mapping[Role, Obj],
    previous: v1.LLMServiceStatus | None,
    recreate: Mapping[Role, int],
) -> tuple[dict[Role, int], list[Role]]:
    """({role: the `spec.pools.<role>.replicas` the pool acknowledges}, [roles whose spec value
    is not applied]) — the pure half of `PoolReplicasDecide`.

    Manual / External: the pool's own `spec.replicas` decides once it exists, so it moving
    (`kubectl scale`, an HPA / KEDA) is normal operation, not a spec left unapplied. What is
    not applied is a person's later edit of the service's value: flagged while it differs from
    the value the pool was created from (or last acknowledged) and from the pool's size. The
    pool reaching the spec's value acknowledges it. A status without the value (an older
    operator's) acknowledges the spec as it is. Managed: the spec is applied, so acknowledged.
    """
    acks: dict[Role, int] = {}
    unapplied: list[Role] = []
    before = {p.role: p.spec_replicas for p in (previous.pools if previous else [])}
    for role, pool_spec in spec.pools.items():
        want = pool_spec.replicas
        prior = before.get(role)
        pool = pools.get(role)
        if spec.scaling.mode is v1.ScalingMode.MANAGED or prior is None:
            acks[role] = want
        elif pool is None:  # created from the spec, or recreated at its last size
            acks[role] = prior if role in recreate else want
        elif want == prior or want == int(pool["spec"].get("replicas", 0)):
            acks[role] = want
        else:
            acks[role] = prior
            unapplied.append(role)
    return acks, unapplied


def _overrides(
    spec: v1.LLMServiceSpec,
    service: str,
    pools: Mapping[Role, Obj],
    unapplied: Sequence[Role],
    previous: v1.LLMServiceStatus | None,
    generation: int | None,
) -> list[tuple[str, str]]:
    """What a person set that the operator does not apply, and why (`SpecApplied=False`)."""
    out: list[tuple[str, str]] = []
    mode = spec.scaling.mode
    for role in unapplied:
        pool_spec = getattr(spec.pools, role.value)
        have = int(pools[role]["spec"].get("replicas", 0))
        pool_name = render.pool_name(service, role)
        how = (
            f"kubectl scale llmpool/{pool_name} --replicas=N"
            if mode is v1.ScalingMode.MANUAL
            else "set by your HPA / KEDA, whose minReplicas / maxReplicas bound it"
        )
        out.append(
            (
                "PoolReplicasDecide",
                f"spec.pools.{role.value}.replicas ({pool_spec.replicas}) is not applied: "
                f"in {mode.value} mode LLMPool {pool_name}'s spec.replicas ({have}) "
                f"decides ({how})",
            )
        )
    # A revert stays explained until the service changes.
    for c in previous.conditions if previous else []:
        kept = c.type == "SpecApplied" and c.reason in ("ScaleReverted", "BoundsReverted")
        if kept and c.observed_generation == generation:
            out.append((c.reason, c.message))
    return out


WARNING_REASONS: Final = frozenset(
    {*status.HINTS, "InvalidSpec", "Forbidden", "Invalid", "BadRequest", "NotFound", "Conflict"}
    | {"ApiError", "ServerError", "TooManyRequests", "ScaleReverted", "BoundsReverted"}
    | {"PoolReplicasDecide", "PoolsNotSized", "GroupServesNoPool", "FlippingDisabled"}
)


def _post_transitions(
    previous: v1.LLMServiceStatus | None,
    new: v1.LLMServiceStatus,
    event: Callable[[EventType, str, str], None],
) -> None:
    """An Event per condition whose status or reason changed."""
    before = {c.type: (c.status, c.reason) for c in (previous.conditions if previous else [])}
    for c in new.conditions:
        if before.get(c.type) == (c.status, c.reason):
            continue
        type_: EventType = "Warning" if c.reason in WARNING_REASONS else "Normal"
        event(type_, c.reason, f"{c.type}={c.status.value}: {c.message}")


def _status_changed(svc: Mapping[str, Any], new: v1.LLMServiceStatus) -> bool:
    wire = new.wire()
    current = svc.get("status") or {}
    return not (covers(current, wire) and covers(wire, _ours(current)))


def _write_status(kube: Kube, svc: Mapping[str, Any], new: v1.LLMServiceStatus) -> None:
    if _status_changed(svc, new):
        md = svc["metadata"]
        patch = _removing(_ours(svc.get("status") or {}), new.wire())
        kube.patch(*SERVICE, md["namespace"], md["name"], {"status": patch}, "status")


def _removing(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """`wanted` as a JSON merge patch over `current`: a key `current` has and `wanted` leaves
    out is set to null (deleted), at every level of nested objects (lists are replaced whole)."""
    out: dict[str, Any] = {k: None for k in current if k not in wanted}
    for key, value in wanted.items():
        have = current.get(key)
        if isinstance(value, Mapping) and isinstance(have, Mapping):
            out[key] = _removing(have, value)
        else:
            out[key] = value
    return out


def report_failure(
    kube: Kube,
    svc: Mapping[str, Any],
    reason: str,
    message: str,
    now: str,
    events: Recorder,
    decisions: Sequence[str] = (),
) -> None:
    """A failed reconcile shows in status (`Ready=False`, `Degraded=True`) and as an Event;
    `decisions` (what the pass did before it failed) are added to `status.decisions`.

    Reporting is best effort: a status the API server refuses too is logged, not raised (the
    caller raises the original error).
    """
    md = svc["metadata"]
    previous = _previous_status(svc)
    new = status.failed_status(previous, reason, message, now, md.get("generation"), decisions)
    new = new.model_copy(update={"observed_generation": md.get("generation")})
    events.post(kube, svc, "Warning", reason, message, now)
    try:
        _write_status(kube, svc, new)
    except KubeError as err:
        log.warning("%s/%s: cannot write status either: %s", md["namespace"], md["name"], err)


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
    event: Callable[[EventType, str, str], None] | None = None,
    decisions: list[str] | None = None,
) -> Obj:
    """Carry out a flip from its current step as far as it goes now; record each step done.

    Every step is idempotent, and the pod's annotation names the next step only after the
    current one succeeded, so repeating a step after a crash is harmless. A worker call that
    fails once `flipping.drainTimeoutSeconds` has passed since the fence abandons the flip
    (`abandon_flip`); `decisions` receives the reason.
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
                    message = (
                        f"{md['name']}: drain timed out after {waited:.0f}s with {in_flight} "
                        "request(s) in flight; switching role anyway (they finish under the old "
                        "role)"
                    )
                    log.warning("%s", message)
                    if event is not None:
                        event("Warning", "DrainTimedOut", message)
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
            waited = _seconds_since(md, now)
            if current.source is not None and waited >= spec.flipping.drain_timeout_seconds:
                # A worker that stays unreachable (crash-looping) must not hold its fence and a
                # flipping.maxConcurrent slot for ever.
                why = (
                    f"abandon {md['name']}: flip {current.source.value} -> "
                    f"{current.target.value} given up at {current.step.value}: worker "
                    f"unreachable for {waited:.0f}s (flipping.drainTimeoutSeconds "
                    f"{spec.flipping.drain_timeout_seconds}): {err}"
                )
                return abandon_flip(
                    kube, workers, pod, spec.engine.grpc_port, why, event, decisions, force=True
                )
            log.warning(
                "%s: flip step %s failed, retrying later: %s", md["name"], current.step, err
            )
            if event is not None:
                event("Warning", "FlipStepFailed", f"{md['name']}: {current.step.value}: {err}")
            return pod
        nxt = current.advanced()
        notes[v1.ANNOTATION_FLIP] = nxt.encode() if nxt else None
        meta: dict[str, Any] = {"annotations": notes}
        if labels:
            meta["labels"] = labels
        try:
            pod = kube.patch("v1", "Pod", md["namespace"], md["name"], {"metadata": meta})
        except KubeError as err:
            raise err.about(f"patch Pod {md['name']}") from err
        if event is not None and current.source is not None:
            move = f"{current.source.value} -> {current.target.value}"
            event("Normal", "FlipStep", f"{md['name']}: {current.step.value} done ({move})")
        md = pod["metadata"]
        current = nxt
    return pod


def _abandon_unreadable_flips(
    kube: Kube,
    workers: WorkerClient,
    pods: dict[str, Obj],
    spec: v1.LLMServiceSpec,
    event: Callable[[EventType, str, str], None],
) -> None:
    """A flip whose progress annotation cannot be read (another operator version, an edit) is
    abandoned (`abandon_flip`), so no worker stays out of rotation for ever. A worker that
    cannot be reached is retried later."""
    for name, pod in pods.items():
        notes = pod["metadata"].get("annotations") or {}
        text = notes.get(v1.ANNOTATION_FLIP)
        if text is None or flip.FlipProgress.decode(text) is not None:
            continue
        why = f"{name}: flip progress {text!r} is unreadable; flip abandoned, worker re-opened"
        pods[name] = abandon_flip(kube, workers, pod, spec.engine.grpc_port, why, event)


def _release_workers(
    kube: Kube,
    workers: WorkerClient,
    svc: Obj,
    spec: v1.LLMServiceSpec | None,
    events: Recorder,
    now: str,
    decisions: list[str],
) -> None:
    """An invalid spec stops every decision, but no worker stays fenced for it: each flip in
    progress is abandoned (`abandon_flip`) and each retirement rolled back (`_release_retired`);
    `decisions` receives one line per worker released. Best effort: a failure is logged,
    retried at the next reconcile."""
    md = svc["metadata"]
    namespace, name = str(md["namespace"]), str(md["name"])
    port = spec.engine.grpc_port if spec is not None else _raw_grpc_port(svc)

    def event(type_: EventType, reason: str, message: str) -> None:
        events.post(kube, svc, type_, reason, message, now)

    try:
        pods = kube.list("v1", "Pod", namespace, render.worker_selector(name))
        for pod in observe.live_pods(pods):
            text = (pod["metadata"].get("annotations") or {}).get(v1.ANNOTATION_FLIP)
            if text is None:
                continue
            why = (
                f"abandon {observe.pod_name(pod)}: flip {text!r} given up, worker re-opened: the "
                "spec is invalid (no decisions until it is fixed)"
            )
            abandon_flip(kube, workers, dict(pod), port, why, event, decisions)
        _release_retired(kube, workers, namespace, name, port, event, decisions)
    except KubeError as err:
        log.warning("%s/%s: cannot release flips: %s", namespace, name, err)


def _release_retired(
    kube: Kube,
    workers: WorkerClient,
    namespace: str,
    service: str,
    port: int,
    event: Callable[[EventType, str, str], None],
    decisions: list[str],
) -> None:
    """Re-open the workers fenced for a scale-down (or a removed group) while the spec is
    invalid: the Deployments keep their sizes then, so they would stay fenced. Only the drained
    workers that their Deployment has already shrunk by (marked cheapest to delete, the
    ReplicaSet deletes them) stay as they are. An unreachable worker is retried later."""
    pods = [
        dict(p)
        for p in observe.live_pods(
            kube.list("v1", "Pod", namespace, render.worker_selector(service))
        )
    ]
    going: set[str] = set()
    for group in sorted({_group_of(p) for p in pods if _retiring(p)}):
        deployment_name = render.group_deployment_name(service, group)
        deployment = kube.get("apps/v1", "Deployment", namespace, deployment_name)
        in_group = [p for p in pods if _group_of(p) == group]
        size = int(((deployment or {}).get("spec") or {}).get("replicas", len(in_group)))
        marked = sorted(
            observe.pod_name(p)
            for p in in_group
            if (p["metadata"].get("annotations") or {}).get(observe.DELETION_COST)
            == observe.SURPLUS_COST
        )
        going.update(marked[: max(0, len(in_group) - size)])
    for pod in pods:
        pod_name = observe.pod_name(pod)
        notes = pod["metadata"].get("annotations") or {}
        if not _retiring(pod) or pod_name in going or v1.ANNOTATION_FLIP in notes:
            continue
        try:
            if observe.pod_ready(pod):
                workers.resume(observe.pod_address(pod, port))
        except WorkerCallError as err:
            log.warning("%s: resume failed, retrying later: %s", pod_name, err)
            continue
        meta: Obj = {
            "labels": {v1.LABEL_FENCED: None},
            "annotations": {observe.RETIRE_SINCE: None, observe.DELETION_COST: None},
        }
        _patch_pod(kube, pod, meta)
        why = (
            f"{pod_name}: re-opened, its removal rolled back: the spec is invalid (no decisions "
            "until it is fixed)"
        )
        event("Normal", "Kept", why)
        decisions.append(f"keep {why}")


def _raw_grpc_port(svc: Mapping[str, Any]) -> int:
    """The workers' gRPC port from a spec that does not validate (its default when unreadable)."""
    engine = (svc.get("spec") or {}).get("engine")
    port = engine.get("grpcPort") if isinstance(engine, Mapping) else None
    default = v1.EngineSpec.model_fields["grpc_port"].default
    return port if isinstance(port, int) and 0 < port < 65536 else int(default)


def abandon_flip(
    kube: Kube,
    workers: WorkerClient,
    pod: Obj,
    grpc_port: int,
    why: str,
    event: Callable[[EventType, str, str], None] | None = None,
    decisions: list[str] | None = None,
    *,
    force: bool = False,
) -> Obj:
    """Give up a flip: the worker's role is set back to its label's (SetRole may have run), it
    is re-opened, and the fence and progress are removed (a retiring worker stays fenced).

    A worker that cannot be reached is retried later, unless `force` (it stayed unreachable past
    the drain timeout: a restarted worker process holds no fence or drain of its own)."""
    md = pod["metadata"]
    name = str(md["name"])
    notes = md.get("annotations") or {}
    labels = md.get("labels") or {}
    address = observe.pod_address(pod, grpc_port)
    try:
        if observe.pod_ready(pod):
            label = labels.get(v1.LABEL_ROLE)
            if label in set(Role):
                workers.set_role(address, Role(label))
            workers.resume(address)
    except WorkerCallError as err:
        if not force:
            log.warning("%s: abandoning its flip: worker unreachable, retrying: %s", name, err)
            return pod
    meta: Obj = {"annotations": {v1.ANNOTATION_FLIP: None, v1.ANNOTATION_FLIP_SINCE: None}}
    if observe.RETIRE_SINCE not in notes:
        meta["labels"] = {v1.LABEL_FENCED: None}
    pod = _patch_pod(kube, pod, meta)
    log.warning("%s", why)
    if event is not None:
        event("Warning", "FlipAbandoned", why)
    if decisions is not None:
        decisions.append(why)
    return pod


def _group_of(pod: Mapping[str, Any]) -> str:
    return str((pod["metadata"].get("labels") or {}).get(v1.LABEL_GROUP, ""))


def _retiring(pod: Mapping[str, Any]) -> bool:
    return observe.RETIRE_SINCE in (pod["metadata"].get("annotations") or {})


def _of_removed_groups(pods: Mapping[str, Obj], spec: v1.LLMServiceSpec) -> set[str]:
    """Workers whose worker group is no longer in `spec.workerGroups` (removed or renamed)."""
    groups = {g.name for g in spec.worker_groups}
    return {n for n, p in pods.items() if _group_of(p) and _group_of(p) not in groups}


def _leave_flip(
    kube: Kube,
    workers: WorkerClient,
    pod: Obj,
    spec: v1.LLMServiceSpec,
    now: str,
    event: Callable[[EventType, str, str], None],
    decisions: list[str],
) -> Obj:
    """A worker whose group was removed gives up its flip in progress. It is marked retiring
    first (fenced; its drain counts from the flip's fence), so it is not re-opened to new work
    on its way out."""
    md = pod["metadata"]
    notes = md.get("annotations") or {}
    text = notes.get(v1.ANNOTATION_FLIP)
    if text is None:
        return pod
    if observe.RETIRE_SINCE not in notes:
        since = notes.get(v1.ANNOTATION_FLIP_SINCE) or now
        meta: Obj = {
            "labels": {v1.LABEL_FENCED: "true"},
            "annotations": {observe.RETIRE_SINCE: since},
        }
        pod = _patch_pod(kube, pod, meta)
    why = (
        f"abandon {md['name']}: flip {text!r} given up: its worker group "
        f"{_group_of(pod)!r} is no longer in spec.workerGroups"
    )
    return abandon_flip(kube, workers, pod, spec.engine.grpc_port, why, event, decisions)


def _removed_groups_held(
    service: str, groups: set[str], held: Mapping[str, int]
) -> set[tuple[str, str]]:
    """The Deployments of removed groups whose workers are still draining: kept until they are
    drained (`prune` deletes them then)."""
    return {("Deployment", render.group_deployment_name(service, g)) for g in groups if held.get(g)}


def _to_retire(
    pods: Mapping[str, Obj], surplus: Sequence[str], sizes: Mapping[str, int]
) -> set[str]:
    """The surplus workers that must go because their group's Deployment shrinks (a surplus in
    a group that keeps its size is for a flip to take). Workers already retiring go first."""
    per_group: dict[str, int] = {}
    for pod in pods.values():
        group = (pod["metadata"].get("labels") or {}).get(v1.LABEL_GROUP, "")
        per_group[group] = per_group.get(group, 0) + 1
    shrink = {g: n - sizes[g] for g, n in per_group.items() if g in sizes and n > sizes[g]}

    def retiring(name: str) -> bool:
        return observe.RETIRE_SINCE in (pods[name]["metadata"].get("annotations") or {})

    out: set[str] = set()
    for name in sorted(surplus, key=lambda n: (not retiring(n), n)):
        group = (pods[name]["metadata"].get("labels") or {}).get(v1.LABEL_GROUP, "")
        if shrink.get(group, 0) > 0:
            out.add(name)
            shrink[group] -= 1
    return out


def _retire(
    kube: Kube,
    workers: WorkerClient,
    pods: dict[str, Obj],
    surplus: set[str],
    spec: v1.LLMServiceSpec,
    settings: Settings,
    now: str,
    event: Callable[[EventType, str, str], None],
) -> tuple[set[str], dict[str, int]]:
    """Fence and drain the workers no pool needs, before their Deployment shrinks.

    Returns (drained surplus workers, {group: surplus workers still draining}); the caller
    keeps each group's Deployment that much larger until they are drained. A worker that is
    surplus no more (the pool grew back) is re-opened.
    """
    drained: set[str] = set()
    held: dict[str, int] = {}
    for name, pod in pods.items():
        md = pod["metadata"]
        notes = md.get("annotations") or {}
        retiring = observe.RETIRE_SINCE in notes
        if name not in surplus:
            if retiring and v1.ANNOTATION_FLIP not in notes:
                try:
                    if observe.pod_ready(pod):
                        workers.resume(observe.pod_address(pod, spec.engine.grpc_port))
                except WorkerCallError as err:
                    log.warning("%s: resume failed, retrying later: %s", name, err)
                    continue
                meta: Obj = {
                    "labels": {v1.LABEL_FENCED: None},
                    "annotations": {observe.RETIRE_SINCE: None},
                }
                pods[name] = _patch_pod(kube, pod, meta)
                event("Normal", "Kept", f"{name}: needed again, re-opened")
            continue
        group = (md.get("labels") or {}).get(v1.LABEL_GROUP, "")
        if not observe.pod_ready(pod):
            drained.add(name)  # nothing in flight on a worker that is not serving
            continue
        if not retiring:
            meta = {
                "labels": {v1.LABEL_FENCED: "true"},
                "annotations": {observe.RETIRE_SINCE: now},
            }
            pod = pods[name] = _patch_pod(kube, pod, meta)
            if group in {g.name for g in spec.worker_groups}:
                why = "not needed by any pool"
            else:
                why = f"its worker group {group!r} is no longer in spec.workerGroups"
            event("Normal", "Retiring", f"{name}: {why}; draining before removal")
        address = observe.pod_address(pod, spec.engine.grpc_port)
        try:
            in_flight = workers.drain(address, timeout_s=settings.drain_wait_s)
        except WorkerCallError as err:
            log.warning("%s: drain failed, retrying later: %s", name, err)
            in_flight = -1
        since = (pod["metadata"].get("annotations") or {}).get(observe.RETIRE_SINCE)
        waited = _seconds_between(since, now)
        if in_flight == 0 or waited >= spec.flipping.drain_timeout_seconds:
            drained.add(name)
        else:
            held[group] = held.get(group, 0) + 1
    return drained, held


def _patch_pod(kube: Kube, pod: Mapping[str, Any], meta: Obj) -> Obj:
    md = pod["metadata"]
    try:
        return kube.patch("v1", "Pod", md["namespace"], md["name"], {"metadata": meta})
    except KubeError as err:
        raise err.about(f"patch Pod {md['name']}") from err


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
    return _seconds_between((md.get("annotations") or {}).get(v1.ANNOTATION_FLIP_SINCE), now)


def _seconds_between(since: Any, now: str) -> float:
    """Seconds from the RFC 3339 time `since` to `now` (0 when unknown)."""
    try:
        start = datetime.datetime.strptime(str(since), RFC3339)
        end = datetime.datetime.strptime(now, RFC3339)
    except ValueError:
        return 0.0
    return (end - start).total_seconds()


def _mark_surplus(kube: Kube, pods: dict[str, Obj], drained: set[str]) -> None:
    """Drained surplus workers are the cheapest to delete; every other worker is not marked."""
    for name, pod in pods.items():
        have = (pod["metadata"].get("annotations") or {}).get(observe.DELETION_COST)
        want = observe.SURPLUS_COST if name in drained else None
        if have != want:
            pods[name] = _patch_pod(kube, pod, {"annotations": {observe.DELETION_COST: want}})


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

"""The live control loop of one `LLMService`: observe -> decide (pure) -> act -> report.

Every `scaling.intervalSeconds` (a kopf daemon per service, `handlers.autoscale_loop`):

1. observe: scrape `/metrics` of every ready router pod (or query Prometheus when
   `scaling.metricsSource: Prometheus`), read one load report per serving worker, count the
   pools' workers; all of it into `policy.planner.signals.Observation` through the per-service
   `Window` (explicit missing / stale state, never zeros);
2. decide: `policy.planner.autoscaler.decide`, then `policy.planner.flipper.plan_flips`;
3. act, by `scaling.mode`:
   - `Managed`: write `spec.pools.<role>.replicas` of the `LLMService` (the field the operator
     owns in that mode); the reconcile then resizes the worker Deployments and carries out the
     flips with the existing fence -> drain -> SetRole -> relabel -> unfence machine
     (`policy.planner.flip`, a pool shrinking while another grows in the same group is a flip);
     just after a switch from another mode, nothing until the reconcile has taken the live pool
     sizes into `spec.pools` (`status.scalingMode` says Managed);
   - `External` and `Manual`: write only `status.recommendedReplicas` on each `LLMPool` (advice
     for an HPA / KEDA user or a person); never `replicas`;
   - signals missing or stale: no action, the reason recorded;
4. report: each decision into `status.decisions` (with its inputs and a reason word), as a
   Kubernetes Event and in the operator metrics; `status.sloClasses`, `status.sloAttainment` and
   the `SLOAtRisk` condition from the observation.

The tick runs under the same per-service lock as the reconcile, so their status writes never
interleave.
"""

from __future__ import annotations

import datetime
import logging
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.obs.metrics import OperatorMetrics
from splitserve.operator import observe, render
from splitserve.operator.control.signals import ClassTargets, Samples, Snapshot, Window, parse
from splitserve.operator.kube import Kube, Obj, owned_by
from splitserve.policy.planner.aladdin import AladdinPerfModel
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Decision,
    Kind,
    PoolDecision,
    decide,
    live_params,
)
from splitserve.policy.planner.capacity import CapacityPlan, plan_capacity
from splitserve.policy.planner.flipper import FlipDecision, drain_order, plan_flips
from splitserve.policy.planner.signals import (
    Observation,
    PoolSignal,
    SignalProblem,
    SignalState,
    WorkerLoad,
)

log = logging.getLogger(__name__)

SERVICE: Final = (v1.API_VERSION, "LLMService")
POOL: Final = (v1.API_VERSION, "LLMPool")
MAX_DECISIONS: Final = 10
SLO_AT_RISK: Final = "SLOAtRisk"
COMPONENT: Final = "splitserve-operator"
DEFAULT_TTFT_S: Final = 2.0
DEFAULT_TPOT_S: Final = 0.2
REASONS: Final = (
    "Load",
    "SLOPressure",
    "Stabilized",
    "Rebalance",
    "Bounds",
    "SignalsMissing",
    "SignalsStale",
    "Steady",
    "PlanAdvised",
    "PlanApplied",
)


class LoadProbe(Protocol):
    def load(self, address: str) -> WorkerLoad:
        """One load report of the worker at `address` (raises on failure)."""
        ...


class GrpcLoadProbe:
    """The first report of the worker's `WatchLoad` stream."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s

    def load(self, address: str) -> WorkerLoad:

        from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
        from splitserve.security import tls

        channel = tls.sync_channel(address)
        try:
            stub = worker_pb2_grpc.WorkerStub(channel)
            stream = stub.WatchLoad(
                worker_pb2.WatchLoadRequest(interval_s=0.1), timeout=self.timeout_s
            )
            for r in stream:
                stream.cancel()
                total = int(r.kv_blocks_total)
                kv = 1 - int(r.kv_blocks_free) / total if total else None
                return WorkerLoad(address, Role.MIXED, int(r.num_waiting), int(r.num_running), kv)
        finally:
            channel.close()
        raise OSError(f"WatchLoad {address}: no report")


def http_get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def prometheus_samples(
    base_url: str, namespace: str, service: str, get: Callable[[str], str] = http_get
) -> dict[str, Samples]:
    """The routers' `splitserve_router_*` series from Prometheus, per router pod (the `pod`
    label a PodMonitor / ServiceMonitor scrape adds), as raw cumulative values."""
    import json

    query = (
        '{__name__=~"splitserve_router_.+", '
        f'namespace="{namespace}", pod=~"{render.router_name(service)}-.+"}}'
    )
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    body = json.loads(get(url))
    if body.get("status") != "success":
        raise OSError(f"Prometheus: {body.get('error') or body}")
    out: dict[str, Samples] = {}
    for series in body["data"]["result"]:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        pod = labels.get("pod", "?")
        for drop in ("pod", "namespace", "instance", "job", "container", "service", "endpoint"):
            labels.pop(drop, None)
        out.setdefault(pod, {})[(name, tuple(sorted(labels.items())))] = float(series["value"][1])
    return out


def prometheus_admissions(
    base_url: str,
    namespace: str,
    service: str,
    window_s: float,
    at_s: float,
    get: Callable[[str], str] = http_get,
) -> dict[str, list[tuple[float, float]]]:
    """The raw samples of the routers' admission counter over the last `window_s` before the
    Unix time `at_s`, per series (router pod and labels): `{series: [(unix time, count), ...]}`
    (for the busiest sub-window's rate, `signals.busiest_rate`, which handles each series'
    restarts and sums them)."""
    import json

    query = (
        f'splitserve_router_admission_total{{namespace="{namespace}", '
        f'pod=~"{render.router_name(service)}-.+"}}[{max(1, round(window_s))}s]'
    )
    url = (
        base_url.rstrip("/")
        + "/api/v1/query?"
        + urllib.parse.urlencode({"query": query, "time": f"{at_s:.3f}"})
    )
    body = json.loads(get(url))
    if body.get("status") != "success":
        raise OSError(f"Prometheus: {body.get('error') or body}")
    if body["data"].get("resultType") != "matrix":
        raise ValueError(f"expected a matrix, got {body['data'].get('resultType')!r}")
    out: dict[str, list[tuple[float, float]]] = {}
    for series in body["data"]["result"]:
        key = ",".join(f"{k}={v}" for k, v in sorted(dict(series["metric"]).items()))
        out[key] = sorted((float(t), float(v)) for t, v in series["values"])
    return out


def _rfc3339(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _ServiceState:
    window: Window
    autoscaler: AutoscalerState = field(default_factory=AutoscalerState)
    last_held: str = ""
    last_tick_s: float = 0.0
    interval_s: float = 30.0
    last_plan_s: float | None = None
    """When the capacity planner (`planner.mode`) last made a plan."""


@dataclass
class TickResult:
    decision: Decision | None = None
    flips: tuple[FlipDecision, ...] = ()
    observation: Observation | None = None
    wrote: list[str] = field(default_factory=list)
    interval_s: float = 30.0
    plan: CapacityPlan | None = None
    """The capacity planner's plan, on ticks it ran (`planner.mode` Advise / Apply)."""
    plan_applied: bool = False


class Controller:
    """The loop for every service this operator manages (state per service)."""

    def __init__(
        self,
        kube: Kube,
        metrics: OperatorMetrics,
        *,
        get: Callable[[str], str] = http_get,
        loads: LoadProbe | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        perf: AladdinPerfModel | None = None,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.get = get
        self.loads = loads if loads is not None else GrpcLoadProbe()
        self.clock = clock
        self.wall = wall
        self.perf = perf or AladdinPerfModel()
        self.services: dict[tuple[str, str], _ServiceState] = {}

    def last_ticks(self) -> dict[str, tuple[float, float]]:
        """{namespace/name: (last tick, interval)} for `/healthz`."""
        return {f"{ns}/{n}": (s.last_tick_s, s.interval_s) for (ns, n), s in self.services.items()}

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted service: its state (so `/healthz` stops judging its ticks) and every
        metric series labelled with it (no stale gauge outlives the service)."""
        self.services.pop((namespace, name), None)
        label = f"{namespace}/{name}"
        for metric, names in self._series():
            _drop_series(metric, names, lambda labels: labels["service"] == label)

    def _series(self) -> list[tuple[Any, tuple[str, ...]]]:
        m = self.metrics
        return [
            (m.decisions, ("service", "kind", "reason")),
            (m.desired, ("service", "role")),
            (m.current, ("service", "role")),
            (m.loop_duration, ("service",)),
            (m.staleness, ("service", "source")),
            (m.attainment, ("service", "slo_class")),
            (m.slo_at_risk, ("service",)),
        ]

    # -- observe ----------------------------------------------------------------------------

    def _snapshot(self, spec: v1.LLMServiceSpec, namespace: str, name: str, now: float) -> Snapshot:
        routers: dict[str, Samples] = {}
        failed: dict[str, str] = {}
        if spec.scaling.metrics_source is v1.MetricsSource.PROMETHEUS:
            assert spec.scaling.prometheus_url is not None
            url = spec.scaling.prometheus_url
            try:
                routers = prometheus_samples(url, namespace, name, self.get)
            except (OSError, ValueError, KeyError) as err:
                failed[url] = f"Prometheus query failed: {err}"
            admissions: dict[str, list[tuple[float, float]]] | None = None
            why: str | None = None
            try:
                at = self.wall().timestamp()
                raw = prometheus_admissions(
                    url, namespace, name, spec.scaling.window_seconds, at, self.get
                )
                # Prometheus' timestamps onto the loop's clock (`now` is the query's `at`).
                admissions = {k: [(now - (at - t), v) for t, v in pts] for k, pts in raw.items()}
            except (OSError, ValueError, KeyError, TypeError) as err:
                why = f"Prometheus range query failed: {err}"
            return Snapshot(now, routers, failed, admissions, why)
        selector = {v1.LABEL_SERVICE: name, v1.LABEL_COMPONENT: "router"}
        for pod in observe.live_pods(self.kube.list("v1", "Pod", namespace, selector)):
            if not observe.pod_ready(pod):
                continue
            addr = observe.pod_address(pod, spec.router.http_port)
            try:
                routers[addr] = parse(self.get(f"http://{addr}/metrics"))
            except (OSError, ValueError) as err:
                failed[addr] = f"scrape failed: {err}"
        return Snapshot(now, routers, failed)

    def _pools(
        self, spec: v1.LLMServiceSpec, svc: Obj, namespace: str, name: str
    ) -> tuple[dict[Role, PoolSignal], dict[Role, Obj], int, list[SignalProblem]]:
        uid = str(svc["metadata"]["uid"])
        pool_objs = {
            Role(p["spec"]["role"]): p
            for p in self.kube.list(*POOL, namespace, {v1.LABEL_SERVICE: name})
            if owned_by(p, uid) and p.get("spec", {}).get("role") in set(Role)
        }
        observed = render.Observed(
            service=render.ServiceRef(name, namespace, uid),
            pool_replicas={r: int(p["spec"].get("replicas", 0)) for r, p in pool_objs.items()},
        )
        desired = render.desired_replicas(spec, observed)
        pods = observe.live_pods(
            self.kube.list("v1", "Pod", namespace, render.worker_selector(name))
        )
        workers = [(p, observe.worker(p, spec)) for p in pods]
        in_flight = sum(1 for _, w in workers if w.flip is not None and w.flip.source is not None)
        loads: dict[Role, list[WorkerLoad]] = {r: [] for r in Role}
        tried = failed = 0
        for pod, w in workers:
            role = w.serving
            if role is None:
                continue
            tried += 1
            try:
                rep = self.loads.load(observe.pod_address(pod, spec.engine.grpc_port))
            except Exception as err:  # any transport error: the worker is unknown, not idle
                failed += 1
                log.debug("%s: no load report: %s", w.name, err)
                continue
            loads[role].append(WorkerLoad(w.name, role, rep.queued, rep.running, rep.kv_used))
        problems = []
        if tried and failed == tried:
            problems.append(
                SignalProblem(
                    "worker load", SignalState.MISSING, f"none of {tried} worker(s) answered"
                )
            )
        out = {}
        for role, pool in spec.pools.items():
            out[role] = PoolSignal(
                role,
                desired.get(role, 0),
                sum(1 for _, w in workers if w.serving is role),
                pool.min_replicas,
                pool.max_replicas,
                tuple(loads[role]),
            )
        return out, pool_objs, in_flight, problems

    # -- the tick ---------------------------------------------------------------------------

    def tick(self, namespace: str, name: str) -> TickResult:
        started = self.clock()
        svc = self.kube.get(*SERVICE, namespace, name)
        if svc is None or svc["metadata"].get("deletionTimestamp"):
            self.forget(namespace, name)
            return TickResult()
        try:
            spec = v1.LLMServiceSpec.model_validate(svc.get("spec") or {})
        except ValidationError:
            return TickResult()  # the reconcile reports invalid specs in status
        sc = spec.scaling
        key = (namespace, name)
        st = self.services.get(key)
        if st is None or st.window.window_s != sc.window_seconds:
            st = _ServiceState(Window(sc.window_seconds, max_age_s=2 * sc.interval_seconds + 5))
            self.services[key] = st
        params = live_params(
            sc.interval_seconds, sc.scale_down_stabilization_seconds, sc.burst_weight
        )
        now = self.clock()
        st.window.add(self._snapshot(spec, namespace, name, now))
        pools, pool_objs, in_flight, problems = self._pools(spec, svc, namespace, name)
        obs = st.window.observe(now, class_targets(spec.slo_classes), pools, problems)
        decision, st.autoscaler = decide(obs, st.autoscaler, self.perf, params)
        decision, flips = plan_flips(
            decision,
            obs,
            _flippable(spec),
            spec.flipping.max_concurrent,
            in_flight,
            spec.flipping.enabled,
        )
        result = TickResult(decision, flips, obs, interval_s=sc.interval_seconds)
        self._act(spec, svc, pool_objs, decision, result)
        self._planner(spec, svc, pool_objs, obs, st, params, now, result)
        self._report(spec, svc, obs, decision, flips, st, result)
        st.last_tick_s = self.clock()
        st.interval_s = sc.interval_seconds
        self.metrics.loop_duration.labels(f"{namespace}/{name}").observe(st.last_tick_s - started)
        return result

    def _act(
        self,
        spec: v1.LLMServiceSpec,
        svc: Obj,
        pool_objs: Mapping[Role, Obj],
        decision: Decision,
        result: TickResult,
    ) -> None:
        md = svc["metadata"]
        ns, name = md["namespace"], md["name"]
        if spec.scaling.mode is v1.ScalingMode.MANAGED:
            # Advice from an earlier External / Manual mode: withdrawn, the loop acts now.
            for role, advised in pool_objs.items():
                if (advised.get("status") or {}).get("recommendedReplicas") is not None:
                    pool_name = render.pool_name(name, role)
                    self.kube.patch(
                        *POOL, ns, pool_name, {"status": {"recommendedReplicas": None}}, "status"
                    )
                    result.wrote.append(f"{pool_name} status.recommendedReplicas withdrawn")
            last_mode = (svc.get("status") or {}).get("scalingMode")
            if last_mode not in (None, v1.ScalingMode.MANAGED.value):
                # Just switched from External / Manual: spec.pools may hold numbers from before;
                # the reconcile first takes the live pool sizes into it (operator.reconcile).
                return
            changes = {
                r.value: {"replicas": p.desired}
                for r, p in decision.pools.items()
                if p.desired != p.current
            }
            if changes and not decision.held:
                self._mark_emptiest(ns, name, decision, result)
                self.kube.patch(*SERVICE, ns, name, {"spec": {"pools": changes}})
                result.wrote.append(
                    "spec.pools " + ", ".join(f"{r}={c['replicas']}" for r, c in changes.items())
                )
            return
        for role, p in decision.pools.items():
            obj = pool_objs.get(role)
            if obj is None:
                continue
            want = p.desired if not decision.held else None
            have = (obj.get("status") or {}).get("recommendedReplicas")
            if want is not None and have != want:
                pool_name = render.pool_name(name, role)
                self.kube.patch(
                    *POOL, ns, pool_name, {"status": {"recommendedReplicas": want}}, "status"
                )
                result.wrote.append(f"{pool_name} status.recommendedReplicas={want}")

    def _mark_emptiest(self, ns: str, name: str, decision: Decision, result: TickResult) -> None:
        """Consolidation-aware scale-down: for each pool that shrinks, mark its emptiest workers
        (`flipper.drain_order` over this tick's load reports) `scale-down-first` and unmark the
        rest of the pool, so the reconcile drains and deletes those (`policy.planner.flip`)."""
        shrink = {
            r: p.current - p.desired
            for r, p in decision.pools.items()
            if p.desired < p.current and p.kind is not Kind.FLIP
        }
        if not shrink:
            return
        pods = {
            observe.pod_name(p): p
            for p in observe.live_pods(
                self.kube.list("v1", "Pod", ns, render.worker_selector(name))
            )
        }
        pools = result.observation.pools if result.observation is not None else {}
        for role, n in shrink.items():
            pool = pools.get(role)
            if pool is None:
                continue
            chosen = set(drain_order(pool)[:n])
            for w in pool.workers:
                pod = pods.get(w.name)
                if pod is None:
                    continue
                have = (pod["metadata"].get("annotations") or {}).get(observe.SCALE_DOWN_FIRST)
                want = "true" if w.name in chosen else None
                if have != want:
                    self.kube.patch(
                        "v1",
                        "Pod",
                        ns,
                        w.name,
                        {"metadata": {"annotations": {observe.SCALE_DOWN_FIRST: want}}},
                    )
                    if want:
                        result.wrote.append(f"pod {w.name} scale-down-first")

    def _planner(
        self,
        spec: v1.LLMServiceSpec,
        svc: Obj,
        pool_objs: Mapping[Role, Obj],
        obs: Observation,
        st: _ServiceState,
        params: AutoscalerParams,
        now: float,
        result: TickResult,
    ) -> None:
        """`planner.mode`: Advise makes a plan every `planner.intervalSeconds` and reports it
        (status.decisions, an Event); Apply also writes it to each `LLMPool`'s `spec.replicas`
        (what Manual mode sizes from) and to `spec.pools.<role>.replicas` (only with
        `scaling.mode: Manual`, which the spec's validation requires). Without usable signals
        there is no plan; the next tick tries again."""
        mode = spec.planner.mode
        if mode is v1.PlannerMode.OFF:
            st.last_plan_s = None
            return
        if st.last_plan_s is not None and now - st.last_plan_s < spec.planner.interval_seconds:
            return
        plan = plan_capacity(obs, self.perf, params)
        if plan.held is not None:
            return  # the hold is recorded by the autoscaler's decision already
        st.last_plan_s = now
        result.plan = plan
        if mode is not v1.PlannerMode.APPLY or spec.scaling.mode is not v1.ScalingMode.MANUAL:
            return
        md = svc["metadata"]
        # Manual mode sizes each pool from its LLMPool's spec.replicas (spec.pools only seeds a
        # new pool): the plan goes there, as `kubectl scale` would, and to spec.pools, so the
        # service says what runs (written there only, it was never applied).
        for role, p in plan.pools.items():
            obj = pool_objs.get(role)
            if obj is not None and (obj.get("spec") or {}).get("replicas") != p.recommended:
                pool_name = render.pool_name(md["name"], role)
                self.kube.patch(
                    *POOL, md["namespace"], pool_name, {"spec": {"replicas": p.recommended}}
                )
                result.wrote.append(f"plan {pool_name} spec.replicas={p.recommended}")
        changes = {
            r.value: {"replicas": p.recommended}
            for r, p in plan.pools.items()
            if getattr(spec.pools, r.value) is not None
            and getattr(spec.pools, r.value).replicas != p.recommended
        }
        if changes:
            self.kube.patch(*SERVICE, md["namespace"], md["name"], {"spec": {"pools": changes}})
            result.wrote.append(
                "plan spec.pools " + ", ".join(f"{r}={c['replicas']}" for r, c in changes.items())
            )
        result.plan_applied = True

    def _report(
        self,
        spec: v1.LLMServiceSpec,
        svc: Obj,
        obs: Observation,
        decision: Decision,
        flips: tuple[FlipDecision, ...],
        st: _ServiceState,
        result: TickResult,
    ) -> None:
        md = svc["metadata"]
        ns, name = md["namespace"], md["name"]
        label = f"{ns}/{name}"
        now = _rfc3339(self.wall())
        managed = spec.scaling.mode is v1.ScalingMode.MANAGED
        entries: list[tuple[str, str, str, dict[str, str], bool]] = []
        """(kind, reason word, message, inputs, warning)"""
        for p in decision.pools.values():
            word = _reason_word(p, decision)
            self.metrics.decisions.labels(label, p.kind.value, word).inc()
            self.metrics.desired.labels(label, p.role.value).set(p.desired)
            self.metrics.current.labels(label, p.role.value).set(p.current)
            if p.desired != p.current and p.kind is not Kind.FLIP:
                kind = "scale" if managed else "recommend"
                entries.append((kind, word, p.reason, _inputs(obs, decision, p), False))
        for f in flips:
            kind = "flip" if managed else "recommend"
            entries.append((kind, "Rebalance", f.reason, _inputs(obs, decision, None), False))
        if decision.held:
            word = (
                "SignalsStale"
                if any(pr.state is SignalState.STALE for pr in obs.problems)
                else "SignalsMissing"
            )
            # One decision and Event when the set of missing / stale signals changes, not one
            # per tick as their details (ages) change.
            if held_key(obs) != st.last_held:
                entries.append(("hold", word, f"no action: {decision.held}", {}, True))
        st.last_held = held_key(obs) if decision.held else ""
        if result.plan is not None:
            word = "PlanApplied" if result.plan_applied else "PlanAdvised"
            self.metrics.decisions.labels(label, "plan", word).inc()
            entries.append(
                ("plan", word, result.plan.message, dict(result.plan.inputs or {}), False)
            )
        self._staleness(label, obs, st)

        status = svc.get("status") or {}
        decisions = [v1.Decision.model_validate(d) for d in status.get("decisions") or []]
        for kind, word, message, inputs, _ in entries:
            decisions.append(
                v1.Decision(
                    time=now, kind=kind, message=message[:1024], reason=word, inputs=inputs or None
                )
            )
        classes = [
            v1.SloClassStatus(
                name=c.name,
                attainment=None if c.attainment is None else round(c.attainment, 4),
                ttft_ms=None if c.ttft_s is None else round(c.ttft_s * 1000, 1),
                tpot_ms=None if c.tpot_s is None else round(c.tpot_s * 1000, 2),
                goodput=None if c.goodput_per_s is None else round(c.goodput_per_s, 3),
                requests=c.requests,
            )
            for c in obs.classes
        ]
        for c in obs.classes:
            if c.attainment is not None:
                self.metrics.attainment.labels(label, c.name).set(c.attainment)
        # A pool or an SLO class the spec no longer has: its gauges go with it.
        roles = {p.role.value for p in decision.pools.values()}
        names = {c.name for c in obs.classes}
        for gauge in (self.metrics.desired, self.metrics.current):
            _drop_series(
                gauge,
                ("service", "role"),
                lambda s: s["service"] == label and s["role"] not in roles,
            )
        _drop_series(
            self.metrics.attainment,
            ("service", "slo_class"),
            lambda s: s["service"] == label and s["slo_class"] not in names,
        )
        at_risk = _slo_condition(
            decision, obs, status.get("conditions") or [], now, md.get("generation")
        )
        self.metrics.slo_at_risk.labels(label).set(
            1 if at_risk.status is v1.ConditionStatus.TRUE else 0
        )
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != SLO_AT_RISK]
        conditions.append(at_risk.wire())
        patch: dict[str, Any] = {"conditions": conditions}
        if not decision.held:
            patch["sloClasses"] = [c.wire() for c in classes]
            lowest = obs.min_attainment
            patch["sloAttainment"] = None if lowest is None else f"{lowest:.1%}"
        if entries:
            patch["decisions"] = [d.wire() for d in decisions[-MAX_DECISIONS:]]
        if any(_differs(status.get(k), v) for k, v in patch.items()):
            self.kube.patch(*SERVICE, ns, name, {"status": patch}, "status")
            result.wrote.append("status")
        previous = next(
            (c for c in status.get("conditions") or [] if c.get("type") == SLO_AT_RISK), None
        )
        if previous is None or previous.get("status") != at_risk.status.value:
            if at_risk.status is v1.ConditionStatus.TRUE:
                entries.append(("slo", "SLOAtRisk", at_risk.message, {}, True))
            elif previous is not None and previous.get("status") == "True":
                entries.append(("slo", "SLOMet", at_risk.message, {}, False))
        for _kind, word, message, _, warning in entries:
            self._event(svc, word, message, warning, now)
            result.wrote.append(f"event {word}")

    def _staleness(self, label: str, obs: Observation, st: _ServiceState) -> None:
        good = st.window.last_good_s
        age = obs.time_s - good if good is not None else float("inf")
        self.metrics.staleness.labels(label, "router").set(age)
        has_loads = any(p.workers for p in obs.pools.values())
        self.metrics.staleness.labels(label, "worker-load").set(0.0 if has_loads else float("inf"))

    def _event(self, svc: Obj, reason: str, message: str, warning: bool, now: str) -> None:
        md = svc["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{md['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": md["namespace"],
            },
            "involvedObject": {
                "apiVersion": v1.API_VERSION,
                "kind": "LLMService",
                "name": md["name"],
                "namespace": md["namespace"],
                "uid": md.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.kube.create(event)
        except Exception as err:  # an Event is best effort; the decision is in status already
            log.warning("event %s for %s not posted: %s", reason, md["name"], err)


def _drop_series(
    metric: Any, names: tuple[str, ...], drop: Callable[[Mapping[str, str]], bool]
) -> None:
    """Remove the series of `metric` (label names `names`, in order) that `drop` selects."""
    keys: set[tuple[str, ...]] = set()
    for family in metric.collect():
        for sample in family.samples:
            if all(n in sample.labels for n in names) and drop(sample.labels):
                keys.add(tuple(sample.labels[n] for n in names))
    for key in keys:
        metric.remove(*key)


def held_key(obs: Observation) -> str:
    """Which signals are missing or stale, without their changing details."""
    keys = [f"{p.signal} {p.state.value}" for p in obs.problems]
    if not keys and obs.arrival_rate_per_s is None:
        keys.append("arrival rate missing")
    if not keys and obs.no_finish_yet and obs.mean_output_tokens is None:
        keys.append("no request finished yet")
    if not keys and (obs.mean_prompt_tokens is None or obs.mean_output_tokens is None):
        keys.append("length mix missing")
    return ", ".join(keys)


def _differs(current: object, wanted: object) -> bool:
    return bool(current != wanted)


def class_targets(classes: Sequence[v1.SloClassSpec]) -> list[ClassTargets]:
    """The classes the loop sizes for (seconds); none declared: the default class."""
    if not classes:
        return [ClassTargets("default", DEFAULT_TTFT_S, DEFAULT_TPOT_S, 0.9, 0.9)]
    return [
        ClassTargets(
            c.name,
            None if c.ttft_ms is None else c.ttft_ms / 1000,
            None if c.tpot_ms is None else c.tpot_ms / 1000,
            c.percentile,
            c.attainment,
        )
        for c in classes
    ]


def _flippable(spec: v1.LLMServiceSpec) -> list[tuple[Role, Role]]:
    pairs = set()
    for g in spec.worker_groups:
        for a in g.roles:
            for b in g.roles:
                if a is not b:
                    pairs.add((a, b))
    return sorted(pairs)


def _reason_word(p: PoolDecision, decision: Decision) -> str:
    if p.kind is Kind.NO_SIGNAL:
        return "SignalsStale" if "stale" in decision.held else "SignalsMissing"
    return {
        Kind.SCALE_UP: "SLOPressure" if p.pressure else "Load",
        Kind.SCALE_DOWN: "Stabilized",
        Kind.FLIP: "Rebalance",
        Kind.BOUNDS: "Bounds",
        Kind.HOLD: "Steady",
    }[p.kind]


def _inputs(obs: Observation, decision: Decision, p: PoolDecision | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if decision.rate_per_s is not None:
        out["arrivalRate"] = f"{decision.rate_per_s:.3g}/s"
    if decision.forecast_per_s is not None:
        out["forecastRate"] = f"{decision.forecast_per_s:.3g}/s"
    if obs.arrival_rate_peak_per_s is not None:
        out["arrivalRatePeak"] = f"{obs.arrival_rate_peak_per_s:.3g}/s"
    elif obs.peak_problem is not None:
        out["arrivalRatePeak"] = f"unknown: {obs.peak_problem.reason}"[:200]
    if obs.mean_prompt_tokens is not None:
        out["meanPromptTokens"] = f"{obs.mean_prompt_tokens:.0f}"
    if obs.mean_output_tokens is not None:
        out["meanOutputTokens"] = f"{obs.mean_output_tokens:.0f}"
    if obs.min_attainment is not None:
        out["attainment"] = f"{obs.min_attainment:.3f}"
    if obs.router_queue is not None:
        out["routerQueue"] = str(obs.router_queue)
    if obs.router_queued_prompt_tokens is not None:  # recorded; no policy sizes on it yet
        out["routerQueuedPromptTokens"] = str(obs.router_queued_prompt_tokens)
    if p is not None:
        out["work"] = f"{p.work:.2f}"
        out["upTarget"] = str(p.up_target)
        out["downTarget"] = str(p.down_target)
        if p.pressure:
            out["pressure"] = p.pressure[:200]
    return out


def _slo_condition(
    decision: Decision,
    obs: Observation,
    current: list[dict[str, Any]],
    now: str,
    generation: int | None,
) -> v1.Condition:
    if decision.held:
        status, reason = v1.ConditionStatus.UNKNOWN, "NoSignal"
        message = f"no SLO signal ({held_key(obs)}): see status.decisions"
    elif decision.at_risk:
        status, reason, message = v1.ConditionStatus.TRUE, "SLOAtRisk", "; ".join(decision.at_risk)
    elif all(c.attainment is None for c in obs.classes):
        status, reason, message = (
            v1.ConditionStatus.UNKNOWN,
            "NoTraffic",
            "no request finished in the window",
        )
    else:
        status, reason, message = v1.ConditionStatus.FALSE, "SLOMet", "every class meets its SLO"
    prev = next((c for c in current if c.get("type") == SLO_AT_RISK), None)
    since = now
    if prev is not None and prev.get("status") == status.value and prev.get("lastTransitionTime"):
        since = str(prev["lastTransitionTime"])
    return v1.Condition(
        type=SLO_AT_RISK,
        status=status,
        reason=reason,
        message=message[:4096],
        last_transition_time=since,
        observed_generation=generation,
    )

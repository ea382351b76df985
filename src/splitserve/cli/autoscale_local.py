"""The control loop over local worker processes (for `splitserve up --autoscale`).

The same observe -> decide -> flip -> act loop as the operator (`operator.control`), over a
`Fleet`: anything that can list its workers, start a worker of a role, stop one (draining it
first) and change one's role (drain, SetRole, resume). `splitserve up`'s process supervisor
provides the real one; tests pass a fake. Signals: the local router's `/metrics` (the same
`Window` as the operator) and each worker's load report.

Not wired into `splitserve up` yet (its process supervision is being reworked): the loop and its
protocol are here, tested with a fake fleet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from splitserve.core.roles import Role
from splitserve.operator.control.loop import GrpcLoadProbe, LoadProbe, http_get
from splitserve.operator.control.signals import ClassTargets, Snapshot, Window, parse
from splitserve.policy.planner.aladdin import AladdinPerfModel
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Decision,
    decide,
)
from splitserve.policy.planner.flipper import FlipDecision, drain_order, plan_flips
from splitserve.policy.planner.signals import PoolSignal, SignalProblem, SignalState, WorkerLoad

ROLES = (Role.PREFILL, Role.DECODE)


@dataclass(frozen=True, slots=True)
class LocalWorker:
    name: str
    role: Role
    address: str
    """host:port of its gRPC service."""
    ready: bool = True


class Fleet(Protocol):
    def workers(self) -> Sequence[LocalWorker]: ...

    def start(self, role: Role) -> str:
        """Start a worker of `role`; returns its name (it shows in `workers()`, not ready yet)."""
        ...

    def stop(self, name: str) -> None:
        """Drain the worker, then stop its process."""
        ...

    def set_role(self, name: str, role: Role) -> None:
        """Drain, SetRole, resume."""
        ...


@dataclass
class LocalLoop:
    fleet: Fleet
    router_metrics_url: str
    classes: Sequence[ClassTargets]
    params: AutoscalerParams = field(default_factory=AutoscalerParams)
    min_replicas: int = 1
    max_replicas: int = 8
    window_s: float = 30.0
    max_concurrent_flips: int = 1
    get: Callable[[str], str] = http_get
    loads: LoadProbe = field(default_factory=GrpcLoadProbe)
    clock: Callable[[], float] = time.monotonic
    perf: AladdinPerfModel = field(default_factory=AladdinPerfModel)
    state: AutoscalerState = field(default_factory=AutoscalerState)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.window = Window(self.window_s, max_age_s=2 * self.params.interval_s + 5)

    def tick(self) -> tuple[Decision, tuple[FlipDecision, ...]]:
        now = self.clock()
        try:
            snap = Snapshot(now, {"router": parse(self.get(self.router_metrics_url))})
        except (OSError, ValueError) as err:
            snap = Snapshot(now, {}, {"router": f"scrape failed: {err}"})
        self.window.add(snap)
        workers = list(self.fleet.workers())
        loads: dict[Role, list[WorkerLoad]] = {r: [] for r in ROLES}
        problems: list[SignalProblem] = []
        for w in workers:
            if not w.ready or w.role not in loads:
                continue
            try:
                rep = self.loads.load(w.address)
            except Exception:  # the worker is unknown, not idle
                continue
            loads[w.role].append(WorkerLoad(w.name, w.role, rep.queued, rep.running, rep.kv_used))
        ready = [w for w in workers if w.ready]
        if ready and not any(loads.values()):
            problems.append(SignalProblem("worker load", SignalState.MISSING, "no worker answered"))
        pools = {
            r: PoolSignal(
                r,
                sum(1 for w in workers if w.role is r),
                sum(1 for w in ready if w.role is r),
                self.min_replicas,
                self.max_replicas,
                tuple(loads[r]),
            )
            for r in ROLES
        }
        obs = self.window.observe(now, self.classes, pools, problems)
        decision, self.state = decide(obs, self.state, self.perf, self.params)
        decision, flips = plan_flips(
            decision,
            obs,
            [(Role.PREFILL, Role.DECODE), (Role.DECODE, Role.PREFILL)],
            self.max_concurrent_flips,
        )
        self._act(decision, flips, pools)
        return decision, flips

    def _act(
        self,
        decision: Decision,
        flips: Sequence[FlipDecision],
        pools: dict[Role, PoolSignal],
    ) -> None:
        if decision.held:
            self.log.append(f"hold: {decision.held}")
            return
        have = {r: p.current for r, p in pools.items()}
        for f in flips:
            names = list(f.workers) or list(drain_order(pools[f.source]))
            for name in names[: f.count]:
                self.fleet.set_role(name, f.target)
                self.log.append(f"flip {name} {f.source.value} -> {f.target.value}")
            have[f.source] -= f.count
            have[f.target] += f.count
        for role, p in decision.pools.items():
            delta = p.desired - have[role]
            for _ in range(max(0, delta)):
                name = self.fleet.start(role)
                self.log.append(f"start {name} as {role.value}: {p.reason}")
            if delta < 0:
                for name in drain_order(pools[role])[:-delta]:
                    self.fleet.stop(name)
                    self.log.append(f"stop {name}: {p.reason}")

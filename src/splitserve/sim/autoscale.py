"""Simulated evaluation of the control loop: the autoscaler and flipper in the simulator's loop.

`run_autoscaled` replays a workload through the discrete-event cluster (`sim.cluster`) and, every
`params.interval_s` of simulated time, builds an `Observation` from the cluster's own records
(the last `window_s` of arrivals and finished requests, and each worker's engine load), asks the
same pure policies the operator runs (`policy.planner.autoscaler.decide`, then
`policy.planner.flipper.plan_flips`) and acts on the cluster:

- scale up: a new worker of the role starts and serves after `startup_s` (cold start: its
  GPU-time counts from the start);
- scale down: the emptiest workers of the role stop taking new work (fence), finish what they
  have (drain), then leave;
- flip: the emptiest donor workers are fenced and drained, then serve the new role at once (the
  weights are loaded; no cold start).

Approximations (said again in docs/autoscaling.md): a flipped worker is modelled as a fresh
engine of the target role (its KV cache is empty after the drain anyway); pending transitions
are checked every `resolution_s` (1 s), so a drain completes up to 1 s late; the observation
sees exact per-request records where the live loop reads router histograms.

Every run (loop, static, scheduled) places requests through the live router's admission gate
(`Setup.admission`, `sim.admission.SimAdmission`: the router's defaults): an arrival without
room in the pool waits in the EDF queue and is placed when room appears, on the workers there
are then, so workers the loop adds take part of a backlog; a sheddable request that cannot meet
its TTFT deadline is shed and counts as a miss. `Setup.admission = None` places every request at
arrival (the simulator before the gate; the paper reproductions still do).

`run_static` replays the same workload with fixed pools, for the comparison. Pure: no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from splitserve.core.ids import PoolName, SloClassName
from splitserve.core.perf import HARDWARE, MODELS, RooflineModel
from splitserve.core.request import SloClass
from splitserve.core.roles import Role
from splitserve.policy.admission import SloPolicyClass
from splitserve.policy.planner.aladdin import AladdinPerfModel, fit_perf_model
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Decision,
    Kind,
    decide,
)
from splitserve.policy.planner.flipper import drain_order, plan_flips
from splitserve.policy.planner.signals import (
    ClassSignal,
    Observation,
    PoolSignal,
    WorkerLoad,
)
from splitserve.sim.admission import SHED, AdmissionSpec, SimAdmission
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, RouterSlo, SimRequest, SimWorker, WorkerTemplate
from splitserve.sim.metrics import RequestRecord, percentile
from splitserve.sim.workload import WorkItem

ROLES = (Role.PREFILL, Role.DECODE)


@dataclass(frozen=True, slots=True)
class SloTarget:
    """One SLO class as the evaluation judges it."""

    name: str
    ttft_s: float
    tpot_s: float
    percentile: float = 0.9
    attainment: float = 0.99
    priority: int = 0
    """The router serves a higher priority first when it queues (`SloClassSpec.priority`)."""
    sheddable: bool = False
    """Whether the router may shed the class's requests (`SloClassSpec.sheddable`; its default
    is False: queued however late)."""

    def slo_class(self) -> SloClass:
        return SloClass(
            SloClassName(self.name), self.ttft_s * 1000, self.tpot_s * 1000, self.percentile
        )

    def policy_class(self) -> SloPolicyClass:
        """The class as the router's admission gate sees it."""
        return SloPolicyClass(
            self.name,
            self.ttft_s,
            self.tpot_s,
            self.percentile,
            self.attainment,
            self.priority,
            self.sheddable,
        )


@dataclass(frozen=True, slots=True)
class Setup:
    """The hardware, model and loop settings of one evaluation."""

    model: str = "llama-2-13b"
    hardware: str = "a100-80g"
    tp: int = 1
    memory_utilization: float = 0.9
    block_size: int = 16
    classes: tuple[SloTarget, ...] = (SloTarget("chat", 2.0, 0.1),)
    initial: Mapping[Role, int] = field(default_factory=lambda: {Role.PREFILL: 1, Role.DECODE: 1})
    min_replicas: int = 1
    max_replicas: int = 64
    params: AutoscalerParams = field(
        default_factory=lambda: AutoscalerParams(
            interval_s=10.0,
            scale_down_stabilization_s=120.0,
            horizon_s=30.0,
            burst_weight=1.0,
            ttft_tail_fraction=0.8,
            occupancy_floor=True,
            scale_down_utilization=0.5,
            pooled_tail=True,
            reversal_backoff=2.0,
            max_backoff=4.0,
            feedback_settle=True,
            burst_poisson=True,
        )
    )
    window_s: float = 30.0
    """What each observation covers."""
    peak_window_s: float = 10.0
    """The sub-windows of the window whose busiest one gives `arrival_rate_peak_per_s`."""
    startup_s: float = 20.0
    """A new worker serves this long after it was started (model load)."""
    flipping: bool = True
    max_concurrent_flips: int = 2
    resolution_s: float = 1.0
    """How often drains and start-ups are checked between ticks."""
    tp_by_role: Mapping[Role, int] | None = None
    """Per-pool tensor-parallel degree for static runs (`run_static`, `splitserve plan`'s
    per-pool search); None: `tp` for every pool. The autoscaled run uses `tp`."""
    warmup_s: float = 120.0
    """`RunResult.warm_attainment` counts only the requests arriving after this: the replay
    starts every autoscaled run at `initial` sizes under the trace's full load (a cold start a
    running service does not go through), the static runs at their full sizes."""
    admission: AdmissionSpec | None = field(default_factory=AdmissionSpec)
    """The router's admission gate (its defaults: room while the best prefill worker's
    predicted backlog is within 25 % of the tightest TTFT target, no outstanding cap, 1,024
    queued). None: every request is placed at arrival (the simulator before the gate)."""

    router_predictor: str | None = "per-class"
    """The router's SLO inputs to its P/D decider (`sim.entities.RouterSlo`): each placement
    carries the class's TTFT budget and TPOT target and this predictor's output length (the
    router's default `per-class`; `oracle`, the true length, only as an upper bound), and the
    workers' rate estimates, so `prefill_would_miss_ttft` and `pull_would_miss_tpot` act as in
    the router. None: placements without them (every prompt split; the runs before
    2026-11-27)."""

    def router_slo(self) -> RouterSlo | None:
        if self.router_predictor is None:
            return None
        return RouterSlo(
            {c.name: (c.ttft_s, c.tpot_s) for c in self.classes}, self.router_predictor
        )

    def gate(self, cluster: Cluster) -> SimAdmission | None:
        """The admission gate for `cluster` (installed), or None without one."""
        if self.admission is None:
            return None
        gate = SimAdmission(cluster, [c.policy_class() for c in self.classes], self.admission)
        cluster.admission = gate
        return gate

    def tp_of(self, role: Role) -> int:
        return self.tp if self.tp_by_role is None else self.tp_by_role.get(role, self.tp)

    def template(self, role: Role | None = None) -> WorkerTemplate:
        """A worker of `role`'s pool (its TP: `tp_of`); None: TP `tp`."""
        tp = self.tp if role is None else self.tp_of(role)
        roofline = RooflineModel(MODELS[self.model], HARDWARE[self.hardware], tp=tp)
        blocks = roofline.kv_capacity_tokens(self.memory_utilization) // self.block_size
        return WorkerTemplate(
            latency=roofline,
            num_blocks=blocks,
            kv_layout=roofline.shape.kv_layout,
            block_size=self.block_size,
            num_gpus=tp,
        )

    def perf_model(self, role: Role | None = None) -> AladdinPerfModel:
        """The autoscaler's learned model: Eq 2/3 fitted to the simulated workers' prices (of
        `role`'s pool; None: TP `tp`)."""
        t = self.template(role)
        tpot = min(c.tpot_s for c in self.classes)
        return fit_perf_model(
            t.latency, t.num_blocks * t.block_size, t.num_gpus, atgt_slo_s=tpot
        ).model


@dataclass(frozen=True, slots=True)
class Tick:
    """One control-loop tick, for plots and reports."""

    time_s: float
    arrival_rate_per_s: float
    workers: Mapping[Role, int]
    """Workers serving or starting per role (what the pool counts)."""
    attainment: float | None
    """Attainment of the requests that finished in the window (all classes)."""
    actions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClassResult:
    name: str
    requests: int
    attainment: float
    """Fraction of the class's requests that finished meeting both targets (drops miss)."""
    ttft_p: float | None
    tpot_p: float | None
    ttft_misses: int = 0
    """Requests that missed the TTFT target (or never finished)."""
    tpot_misses: int = 0
    """Finished requests that missed the TPOT target (a request can miss both)."""


@dataclass(frozen=True, slots=True)
class RunResult:
    label: str
    classes: tuple[ClassResult, ...]
    gpu_hours: float
    num_scale_actions: int
    num_flips: int
    oscillations: int
    """Scale direction reversals within one stabilization window (per role, summed)."""
    ticks: tuple[Tick, ...] = ()
    peak_workers: Mapping[Role, int] = field(default_factory=dict)
    reaction_s: float | None = None
    """From `step_at_s` to the first scale-up or flip decision after it."""
    ready_s: float | None = None
    """From `step_at_s` until the added capacity serves (first start or flip completed)."""
    warm_attainment: float | None = None
    """Attainment over the requests arriving after `Setup.warmup_s` (all classes; None: none)."""
    shed: int = 0
    """Requests the router's admission gate shed or rejected (each counts as a miss)."""
    queued: int = 0
    """Arrivals the gate queued rather than placed at once."""

    @property
    def requests(self) -> int:
        return sum(c.requests for c in self.classes)

    @property
    def shed_fraction(self) -> float:
        return self.shed / self.requests if self.requests else 0.0

    @property
    def attainment(self) -> float:
        total = sum(c.requests for c in self.classes)
        return sum(c.attainment * c.requests for c in self.classes) / total if total else 1.0


# -- the autoscaled cluster ---------------------------------------------------------------------


class _Fleet:
    """The cluster's workers as the control loop manages them."""

    def __init__(self, cluster: Cluster, template: WorkerTemplate, initial: Mapping[Role, int]):
        self.cluster = cluster
        self.template = template
        self.pools = {r: PoolSpec(PoolName(r.value), r, 0, template) for r in ROLES}
        self.active: list[SimWorker] = []
        self.starting: list[tuple[float, SimWorker]] = []
        """(serves at, worker): cold starts."""
        self.draining: list[tuple[SimWorker, Role | None]] = []
        """(worker, role it takes after the drain; None: it leaves)."""
        self.alive_since: dict[int, float] = {}
        self.gpu_s = 0.0
        self.num_flips = 0
        self.first_ready_s: list[float] = []
        cluster.workers.clear()
        cluster.router.workers = self.active
        cluster.router._index = {}
        for role, n in initial.items():
            for _ in range(n):
                self.active.append(self._new(role, 0.0))

    def _new(self, role: Role, now: float) -> SimWorker:
        w = SimWorker(len(self.cluster.workers), self.pools[role])
        self.cluster.workers.append(w)
        self.cluster.router._index[w.id] = w.index
        self.alive_since[w.index] = now
        return w

    def _retire(self, w: SimWorker, now: float) -> None:
        self.gpu_s += (now - self.alive_since.pop(w.index)) * w.template.num_gpus

    def counts(self) -> dict[Role, int]:
        """Workers per role, counting starts and flips toward their role."""
        out = dict.fromkeys(ROLES, 0)
        for w in self.active:
            out[w.role] += 1
        for _, w in self.starting:
            out[w.role] += 1
        for _, target in self.draining:
            if target is not None:
                out[target] += 1
        return out

    def busy(self, w: SimWorker) -> bool:
        if w.inflight > 0 or w.step is not None:
            return True
        load = w.engine.load()
        if load.num_waiting or load.num_running or load.num_transferring or load.num_holding:
            return True
        i = w.index
        return any(r.decode_worker == i or r.prefill_worker == i for r in _live(self.cluster))

    def advance(self, now: float) -> None:
        """Finish the cold starts and drains that are done by `now`."""
        for start in list(self.starting):
            if start[0] <= now:
                self.starting.remove(start)
                self.active.append(start[1])
                self.first_ready_s.append(now)
        for drain in list(self.draining):
            worker, target = drain
            if self.busy(worker):
                continue
            self.draining.remove(drain)
            self._retire(worker, now)
            if target is not None:
                self.active.append(self._new(target, now))
                self.first_ready_s.append(now)

    def start(self, role: Role, n: int, now: float, startup_s: float) -> None:
        for _ in range(n):
            w = self._new(role, now)
            self.starting.append((now + startup_s, w))

    def fence(self, role: Role, names: Sequence[str], n: int, target: Role | None) -> None:
        """Stop sending `n` workers of `role` new work (named first, then the emptiest)."""
        mine = [w for w in self.active if w.role is role]
        by_name = {str(w.id): w for w in mine}
        chosen = [by_name[x] for x in names if x in by_name][:n]
        rest = sorted((w for w in mine if w not in chosen), key=lambda w: (_work(w), w.index))
        chosen += rest[: n - len(chosen)]
        # Cancel cold starts first when shrinking (cheapest: they serve nothing yet).
        for w in chosen:
            self.active.remove(w)
            self.draining.append((w, target))
            if target is not None:
                self.num_flips += 1

    def cancel_starts(self, role: Role, n: int, now: float) -> int:
        cancelled = 0
        for item in sorted(self.starting, key=lambda s: -s[0]):
            if cancelled >= n:
                break
            if item[1].role is role:
                self.starting.remove(item)
                self._retire(item[1], now)
                cancelled += 1
        return cancelled

    def finish(self, now: float) -> float:
        for w in [*self.active, *(w for _, w in self.starting), *(w for w, _ in self.draining)]:
            self._retire(w, now)
        self.active.clear()
        self.starting.clear()
        self.draining.clear()
        return self.gpu_s


def _live(cluster: Cluster) -> list[SimRequest]:
    return list(cluster._live.values())


def _work(w: SimWorker) -> int:
    load = w.engine.load()
    return load.num_waiting + load.num_running + w.inflight + w.reserved


def _loads(fleet: _Fleet) -> dict[Role, tuple[WorkerLoad, ...]]:
    out: dict[Role, list[WorkerLoad]] = {r: [] for r in ROLES}
    for w in fleet.active:
        load = w.engine.load()
        kv = 1 - load.free_blocks / load.total_blocks if load.total_blocks else None
        out[w.role].append(
            # A request pulling its KV waits for its first token: queued, not running.
            WorkerLoad(
                str(w.id), w.role, load.num_waiting + load.num_transferring, load.num_running, kv
            )
        )
    return {r: tuple(v) for r, v in out.items()}


def observe(
    cluster: Cluster,
    fleet: _Fleet,
    now: float,
    setup: Setup,
    finished: Sequence[RequestRecord],
    gate: SimAdmission | None = None,
) -> Observation:
    """The loop's view of the last `window_s`: the same fields the live loop reads. Arrivals
    count every request that reached the router (placed, queued or shed: the live
    `splitserve_router_admission_total`); `finished` holds no shed request (the router counts
    those as shed, not as SLO results); the gate's queue depth and the window's sheds are
    `router_queue` and `shed` (the live `splitserve_router_queue_depth` and admission
    outcomes)."""
    # The replay starts at 0: before a whole window has passed, rates cover what has.
    span = min(setup.window_s, now) if now > 0 else setup.window_s
    start = now - span
    arrived = [r for r in cluster.requests if r.item.arrival_s > start]
    rate = len(arrived) / span
    peak = peak_rate([r.item.arrival_s for r in arrived], now, span, setup.peak_window_s)
    prompts = np.array([r.item.num_prompt_tokens for r in arrived], dtype=float)
    prompt = float(prompts.mean()) if arrived else None
    cv2 = float(prompts.var() / prompts.mean() ** 2) if len(prompts) > 1 and prompt else None
    # Output lengths only of finished requests, as the router counts them (at the finish):
    # none finished in the window is unknown here (`run_autoscaled` keeps the last known mix,
    # as the live `Window` does), never the true lengths of requests still in flight.
    outs = [r.num_output_tokens for r in finished if r.finish_s is not None]
    output = float(np.mean(outs)) if outs else None
    shed_by_class: dict[str, int] = {}
    for r in arrived:
        if r.dropped.startswith(SHED):
            shed_by_class[r.slo_class] = shed_by_class.get(r.slo_class, 0) + 1
    classes = []
    for c in setup.classes:
        mine = [r for r in finished if r.slo_class == c.name]
        ttfts = [x for r in mine if (x := r.ttft_s) is not None]
        tpots = [x for r in mine if (x := r.tpot_s) is not None]
        met = sum(1 for r in mine if r.meets(c.slo_class()))
        classes.append(
            ClassSignal(
                c.name,
                c.ttft_s,
                c.tpot_s,
                c.percentile,
                c.attainment,
                requests=len(mine),
                ttft_s=percentile(ttfts, c.percentile) if ttfts else None,
                tpot_s=percentile(tpots, c.percentile) if tpots else None,
                attainment=met / len(mine) if mine else None,
                goodput_per_s=met / span,
                shed=shed_by_class.get(c.name, 0),
            )
        )
    counts = fleet.counts()
    loads = _loads(fleet)
    pools = {
        r: PoolSignal(
            r,
            counts[r],
            sum(1 for w in fleet.active if w.role is r),
            setup.min_replicas,
            setup.max_replicas,
            loads[r],
        )
        for r in ROLES
    }
    # An idle service still has a known (zero) rate; lengths default to the last seen.
    return Observation(
        now,
        span,
        rate,
        prompt,
        output,
        tuple(classes),
        pools,
        router_queue=gate.waiting if gate is not None else 0,
        shed=sum(1 for x in gate.shed_at if x > start) if gate is not None else 0,
        arrival_rate_peak_per_s=peak,
        arrival_rate_peak_window_s=setup.peak_window_s,
        prompt_tokens_cv2=cv2,
    )


def peak_rate(arrivals: Sequence[float], now: float, span: float, sub_s: float) -> float:
    """The busiest `sub_s` sub-window's arrival rate among those tiling `(now - span, now]`
    (the newest first; a last partial one is dropped; at least one): at least the mean of the
    tiled part."""
    k = max(1, int(span / sub_s + 1e-9))
    counts = [0] * k
    for a in arrivals:
        i = int((now - a) / sub_s)
        if 0 <= i < k:
            counts[i] += 1
    return max(counts) / sub_s


def _finished_since(cluster: Cluster, since: float) -> list[RequestRecord]:
    """Requests that finished (or were dropped, not shed) in the window: the SLO results the
    live router records (`splitserve_router_slo_requests_total`)."""
    from splitserve.sim.cluster import _record

    return [
        _record(r)
        for r in cluster.requests
        if (r.finish_s is not None and r.finish_s > since)
        or (r.dropped and not r.dropped.startswith(SHED) and r.item.arrival_s > since)
    ]


def run_autoscaled(
    items: Sequence[WorkItem],
    setup: Setup,
    label: str = "autoscaled",
    step_at_s: float | None = None,
) -> RunResult:
    params = setup.params
    template = setup.template()
    perf = setup.perf_model()
    spec = ClusterSpec(
        tuple(PoolSpec(PoolName(r.value), r, 0, template) for r in ROLES),
        router_slo=setup.router_slo(),
    )
    sim = Simulator()
    cluster = Cluster(spec, items)
    fleet = _Fleet(cluster, template, setup.initial)
    gate = setup.gate(cluster)
    cluster.start(sim)
    state = AutoscalerState()
    ticks: list[Tick] = []
    end = items[-1].arrival_s if items else 0.0
    t = 0.0
    next_tick = params.interval_s
    last_lengths: tuple[float, float] | None = None
    finished_any = False
    num_scale = 0
    reaction: float | None = None
    flip_pairs = [(Role.PREFILL, Role.DECODE), (Role.DECODE, Role.PREFILL)]
    history: dict[Role, list[int]] = {r: [] for r in ROLES}
    while t < end or cluster.num_in_flight > 0:
        t += setup.resolution_s
        sim.run(cluster, until_s=t)
        fleet.advance(t)
        if gate is not None:
            gate.pump(sim)  # workers joined or left; also the router's periodic re-check
        if t + 1e-9 < next_tick:
            continue
        next_tick += params.interval_s
        finished = _finished_since(cluster, t - setup.window_s)
        obs = observe(cluster, fleet, t, setup, finished, gate)
        finished_any = finished_any or bool(finished)
        if obs.mean_prompt_tokens is not None and obs.mean_output_tokens is not None:
            last_lengths = (obs.mean_prompt_tokens, obs.mean_output_tokens)
        elif last_lengths is not None:
            obs = _with_lengths(obs, last_lengths)
        elif not finished_any and any(r.item.arrival_s <= t for r in cluster.requests):
            # Arrivals and none finished yet: what the live router's metrics show then.
            obs = replace(obs, no_finish_yet=True)
        decision, state = decide(obs, state, perf, params)
        in_flight = sum(1 for _, target in fleet.draining if target is not None)
        decision, flips = plan_flips(
            decision, obs, flip_pairs, setup.max_concurrent_flips, in_flight, setup.flipping
        )
        actions = _act(fleet, decision, flips, t, setup)
        if gate is not None:
            gate.pump(sim)
        num_scale += sum(
            1 for p in decision.pools.values() if p.kind in (Kind.SCALE_UP, Kind.SCALE_DOWN)
        )
        if (
            step_at_s is not None
            and reaction is None
            and t >= step_at_s
            and any(
                p.kind is Kind.SCALE_UP or (p.kind is Kind.FLIP and p.desired > p.current)
                for p in decision.pools.values()
            )
        ):
            reaction = t - step_at_s
        counts = fleet.counts()
        for r in ROLES:
            history[r].append(counts[r])
        met = [c.attainment * c.requests for c in obs.classes if c.attainment is not None]
        n = sum(c.requests for c in obs.classes if c.attainment is not None)
        ticks.append(
            Tick(
                t,
                obs.arrival_rate_per_s or 0.0,
                counts,
                sum(met) / n if n else None,
                tuple(actions),
            )
        )
    gpu_s = fleet.finish(sim.now_s if sim.now_s > t else t)
    result = _summarize(cluster, setup, label, gpu_s, gate)
    window_ticks = int(params.scale_down_stabilization_s / params.interval_s)
    ready = None
    if step_at_s is not None:
        after = [x for x in fleet.first_ready_s if x >= step_at_s]
        ready = after[0] - step_at_s if after else None
    return RunResult(
        label,
        result.classes,
        result.gpu_hours,
        num_scale,
        fleet.num_flips,
        sum(reversals(history[r], window_ticks) for r in ROLES),
        tuple(ticks),
        {r: max(history[r], default=setup.initial.get(r, 0)) for r in ROLES},
        reaction,
        ready,
        result.warm_attainment,
        result.shed,
        result.queued,
    )


def _with_lengths(obs: Observation, lengths: tuple[float, float]) -> Observation:
    """The window's lengths, each missing one the last known (the live `Window`'s rule)."""
    prompt = obs.mean_prompt_tokens if obs.mean_prompt_tokens is not None else lengths[0]
    output = obs.mean_output_tokens if obs.mean_output_tokens is not None else lengths[1]
    return replace(obs, mean_prompt_tokens=prompt, mean_output_tokens=output)


def _act(
    fleet: _Fleet, decision: Decision, flips: Sequence[object], now: float, setup: Setup
) -> list[str]:
    from splitserve.policy.planner.flipper import FlipDecision

    actions: list[str] = []
    flipped_in = dict.fromkeys(ROLES, 0)
    flipped_out = dict.fromkeys(ROLES, 0)
    for f in flips:
        assert isinstance(f, FlipDecision)
        fleet.fence(f.source, f.workers, f.count, f.target)
        flipped_in[f.target] += f.count
        flipped_out[f.source] += f.count
        actions.append(f.reason)
    counts = fleet.counts()
    for role, p in decision.pools.items():
        # `counts` already moved the flips from source to target.
        delta = p.desired - counts[role]
        if delta > 0:
            fleet.start(role, delta, now, setup.startup_s)
            actions.append(p.reason)
        elif delta < 0:
            n = -delta
            n -= fleet.cancel_starts(role, n, now)
            if n > 0:
                sig = [w for w in fleet.active if w.role is role]
                names = drain_order(_pool_of(sig, role))
                fleet.fence(role, names, n, None)
            actions.append(p.reason)
    return actions


def _pool_of(workers: Sequence[SimWorker], role: Role) -> PoolSignal:
    loads = tuple(
        WorkerLoad(
            str(w.id), role, w.engine.load().num_waiting, w.engine.load().num_running + w.inflight
        )
        for w in workers
    )
    return PoolSignal(role, len(workers), workers=loads)


def reversals(series: Sequence[int], window_ticks: int) -> int:
    """Scale direction changes closer together than `window_ticks` ticks."""
    moves = [(i, b - a) for i, (a, b) in enumerate(itertools.pairwise(series)) if b != a]
    return sum(
        1
        for (i, d1), (j, d2) in itertools.pairwise(moves)
        if (d1 > 0) != (d2 > 0) and j - i < window_ticks
    )


@dataclass(frozen=True, slots=True)
class _Summary:
    classes: tuple[ClassResult, ...]
    gpu_hours: float
    warm_attainment: float | None = None
    shed: int = 0
    queued: int = 0


def _summarize(
    cluster: Cluster, setup: Setup, label: str, gpu_s: float, gate: SimAdmission | None = None
) -> _Summary:
    from splitserve.sim.cluster import _record

    records = [_record(r) for r in cluster.requests]
    slo = {c.name: c.slo_class() for c in setup.classes}
    warm = [r for r in records if r.arrival_s >= setup.warmup_s and r.slo_class in slo]
    warm_met = sum(1 for r in warm if r.meets(slo[r.slo_class]))
    out = []
    for c in setup.classes:
        mine = [r for r in records if r.slo_class == c.name]
        ttfts = [x for r in mine if (x := r.ttft_s) is not None]
        tpots = [x for r in mine if (x := r.tpot_s) is not None]
        met = sum(1 for r in mine if r.meets(c.slo_class()))
        out.append(
            ClassResult(
                c.name,
                len(mine),
                met / len(mine) if mine else 1.0,
                percentile(ttfts, c.percentile) if ttfts else None,
                percentile(tpots, c.percentile) if tpots else None,
                sum(
                    1 for r in mine if r.finish_s is None or r.ttft_s is None or r.ttft_s > c.ttft_s
                ),
                sum(1 for r in mine if r.tpot_s is not None and r.tpot_s > c.tpot_s),
            )
        )
    return _Summary(
        tuple(out),
        gpu_s / 3600,
        warm_met / len(warm) if warm else None,
        gate.num_shed if gate is not None else 0,
        gate.num_queued if gate is not None else 0,
    )


def run_static(
    items: Sequence[WorkItem], setup: Setup, pools: Mapping[Role, int], label: str = "static"
) -> RunResult:
    """The same workload on fixed pools (no loop); each pool's workers at its TP."""
    spec = ClusterSpec(
        tuple(PoolSpec(PoolName(r.value), r, pools.get(r, 0), setup.template(r)) for r in ROLES),
        router_slo=setup.router_slo(),
    )
    sim = Simulator()
    cluster = Cluster(spec, items)
    gate = setup.gate(cluster)
    cluster.start(sim)
    sim.run(cluster)
    while gate is not None and gate.waiting and gate.pump(sim):
        sim.run(cluster)  # the gate re-checks on every step; this only catches an idle pool
    end = max(sim.now_s, items[-1].arrival_s if items else 0.0)
    gpu_s = sum(n * setup.tp_of(r) for r, n in pools.items()) * end
    s = _summarize(cluster, setup, label, gpu_s, gate)
    return RunResult(
        label,
        s.classes,
        s.gpu_hours,
        0,
        0,
        0,
        peak_workers=dict(pools),
        warm_attainment=s.warm_attainment,
        shed=s.shed,
        queued=s.queued,
    )


def run_scheduled(
    items: Sequence[WorkItem],
    setup: Setup,
    schedule: Sequence[Mapping[Role, int]],
    interval_s: float,
    label: str = "oracle",
) -> RunResult:
    """The workload on pools that follow a fixed `schedule` (no loop): `schedule[k]` serves
    from `k * interval_s`; a worker the next interval adds is started `setup.startup_s` before
    it (so it serves on time), workers it removes are fenced at its start and drained (the
    emptiest first); the last entry holds until the last request finishes. GPU time as in
    `run_autoscaled` (from the start, cold start included, to the end of the drain)."""
    if not schedule:
        raise ValueError("the schedule is empty")
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    template = setup.template()
    spec = ClusterSpec(
        tuple(PoolSpec(PoolName(r.value), r, 0, template) for r in ROLES),
        router_slo=setup.router_slo(),
    )
    sim = Simulator()
    cluster = Cluster(spec, items)
    fleet = _Fleet(cluster, template, schedule[0])
    gate = setup.gate(cluster)
    cluster.start(sim)
    # (time, order, role, +n start / -n fence): starts before fences at the same instant.
    events: list[tuple[float, int, Role, int]] = []
    for k in range(1, len(schedule)):
        at = k * interval_s
        for r in ROLES:
            d = schedule[k].get(r, 0) - schedule[k - 1].get(r, 0)
            if d > 0:
                events.append((max(0.0, at - setup.startup_s), 0, r, d))
            elif d < 0:
                events.append((at, 1, r, d))
    events.sort(key=lambda e: (e[0], e[1]))
    end = items[-1].arrival_s if items else 0.0
    t, i = 0.0, 0
    while t < end or cluster.num_in_flight > 0:
        t += setup.resolution_s
        sim.run(cluster, until_s=t)
        while i < len(events) and events[i][0] <= t + 1e-9:
            _, _, role, n = events[i]
            fleet.advance(t)
            if n > 0:
                # started at its own time (the tick may be up to a resolution late)
                fleet.start(role, n, events[i][0], setup.startup_s)
            else:
                fleet.fence(role, (), -n, None)
            i += 1
        fleet.advance(t)
        if gate is not None:
            gate.pump(sim)
    gpu_s = fleet.finish(sim.now_s if sim.now_s > t else t)
    s = _summarize(cluster, setup, label, gpu_s, gate)
    return RunResult(
        label,
        s.classes,
        s.gpu_hours,
        0,
        0,
        0,
        peak_workers={r: max(p.get(r, 0) for p in schedule) for r in ROLES},
        warm_attainment=s.warm_attainment,
        shed=s.shed,
        queued=s.queued,
    )


# -- workloads ---------------------------------------------------------------------------------


def step_workload(
    pairs: Sequence[tuple[int, int]],
    base_rate: float,
    factor: float,
    before_s: float,
    during_s: float,
    after_s: float,
    rng: np.random.Generator,
    slo_class: str = "chat",
) -> tuple[WorkItem, ...]:
    """Poisson arrivals at `base_rate`, then `factor`× for `during_s`, then back; lengths
    bootstrapped from (prompt, output) pairs (e.g. a trace's)."""
    out: list[WorkItem] = []
    t = 0.0
    phases = ((before_s, base_rate), (during_s, base_rate * factor), (after_s, base_rate))
    start = 0.0
    for length, rate in phases:
        stop = start + length
        t = max(t, start)
        while True:
            t += float(rng.exponential(1 / rate))
            if t >= stop:
                t = stop
                break
            p, o = pairs[int(rng.integers(0, len(pairs)))]
            out.append(WorkItem(t, p, o, SloClassName(slo_class)))
        start = stop
    return tuple(out)


def with_class(items: Sequence[WorkItem], slo_class: str) -> tuple[WorkItem, ...]:
    return tuple(
        WorkItem(w.arrival_s, w.num_prompt_tokens, w.num_output_tokens, SloClassName(slo_class))
        for w in items
    )

"""`splitserve sim autoscale`: the control loop's evaluation, autoscaled vs static provisioning.

Scenarios (each one workload, one SLO class `chat`: TTFT 2 s, TPOT 100 ms at p90, Llama-2-13B on
A100-80GB workers, prefill and decode pools):

- `azure-conv`, `azure-code`: the bundled Azure LLM inference traces (2023), one hour each,
  replayed at their recorded times;
- `step-5x`: Poisson arrivals at 1 req/s, 5× for 10 minutes, then back (lengths bootstrapped from
  the conversation trace): the reaction-time test;
- `mix-shift`: a constant 4 req/s whose length mix switches from the conversation trace's to the
  code trace's (long prompts, short outputs): prefill needs more workers and decode fewer, the
  case for flips.

Each is run autoscaled, then on static pools two ways: sized for the peak as the loop itself
found it (`static-peak`: the largest pool sizes the autoscaled run reached), and the smallest
static prefill + decode split that meets the class's attainment target on the whole workload,
found by searching with the simulator (`static-best`: hindsight, no real operator knows it in
advance). GPU-hours count every worker from its start (cold start included) to its exit (drain
included). Pure apart from the PNG rendering (matplotlib's Agg canvas, bytes returned).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import AladdinPerfModel, LengthStats
from splitserve.policy.planner.autoscaler import Targets, work_by_role
from splitserve.sim.autoscale import (
    ROLES,
    RunResult,
    Setup,
    run_autoscaled,
    run_scheduled,
    run_static,
    step_workload,
    with_class,
)
from splitserve.sim.workload import WorkItem, parse_azure_trace

SCENARIOS = ("azure-conv", "azure-code", "step-5x", "mix-shift")
EXTRA_SCENARIOS = ("step-5x-fleet",)
"""Run only when named: `step-5x-fleet`, the step at a fleet size (10 req/s: P3:D3 in the low
phases, about P11:D11 at the peak) where whole workers are a small step."""
FLEET_BASE_RATE = 10.0
FLEET_INITIAL = 3
"""Workers per role `step-5x-fleet`'s loop starts with: what `planned_pools` gives for the low
phase (a test holds it to that)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    items: tuple[WorkItem, ...]
    step_at_s: float | None = None
    note: str = ""
    initial: Mapping[Role, int] | None = None
    """Where the loop starts (None: `Setup.initial`, one worker per role)."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    scenario: Scenario
    autoscaled: RunResult
    static_peak: RunResult
    static_best: RunResult | None
    """None when no static split up to the search limit met the target."""
    static_planned: Planned | None = None
    """The loop-independent yardstick (`planned_static`); None: not run."""
    oracle: Oracle | None = None
    """The clairvoyant whole-worker schedule (`oracle`); None: not run."""

    @property
    def gpu_ratio_peak(self) -> float:
        return self.autoscaled.gpu_hours / self.static_peak.gpu_hours

    @property
    def gpu_ratio_planned(self) -> float | None:
        if self.static_planned is None:
            return None
        return self.autoscaled.gpu_hours / self.static_planned.result.gpu_hours

    @property
    def gpu_ratio_oracle(self) -> float | None:
        """The loop's GPU-hours over the oracle's."""
        if self.oracle is None:
            return None
        return self.autoscaled.gpu_hours / self.oracle.gpu_hours

    @property
    def oracle_ratio_planned(self) -> float | None:
        """The oracle's GPU-hours over static-planned's: the least any loop with whole
        workers and these cold starts could reach against the yardstick."""
        if self.oracle is None or self.static_planned is None:
            return None
        return self.oracle.gpu_hours / self.static_planned.result.gpu_hours

    @property
    def gpu_ratio_best(self) -> float | None:
        if self.static_best is None:
            return None
        return self.autoscaled.gpu_hours / self.static_best.gpu_hours


def build_scenario(
    name: str, trace_lines: Callable[[str], Iterable[str]], quick: bool = False, seed: int = 0
) -> Scenario:
    """The scenario's workload; `trace_lines("conv" | "code")` gives a bundled trace's lines."""
    rng = np.random.default_rng(seed)
    limit = 3000 if quick else None
    if name in ("azure-conv", "azure-code"):
        kind = name.split("-")[1]
        items = with_class(parse_azure_trace(trace_lines(kind), max_requests=limit), "chat")
        return Scenario(name, items, note=f"Azure LLM 2023 {kind} trace, recorded arrival times")
    conv = _pairs(trace_lines("conv"))
    if name in ("step-5x", "step-5x-fleet"):
        base = 1.0 if name == "step-5x" else FLEET_BASE_RATE
        before, during, after = (120.0, 240.0, 300.0) if quick else (300.0, 600.0, 900.0)
        items = step_workload(conv, base, 5.0, before, during, after, rng)
        note = f"{base:g} req/s, 5x from {before:g} s for {during:g} s"
        if name == "step-5x":
            return Scenario(name, items, before, note=note)
        # A service already running at the low rate: from one worker per role the first
        # minutes' backlog at 10 req/s is what the run would measure, not the step.
        start = {Role.PREFILL: FLEET_INITIAL, Role.DECODE: FLEET_INITIAL}
        note += f"; the loop starts at P{FLEET_INITIAL}:D{FLEET_INITIAL} (the low phase's sizing)"
        return Scenario(name, items, before, note=note, initial=start)
    if name == "mix-shift":
        code = _pairs(trace_lines("code"))
        half = 300.0 if quick else 900.0
        first = step_workload(conv, 4.0, 1.0, half, 0.0, 0.0, rng)
        second = step_workload(code, 4.0, 1.0, half, 0.0, 0.0, rng)
        items = first + tuple(
            WorkItem(w.arrival_s + half, w.num_prompt_tokens, w.num_output_tokens, w.slo_class)
            for w in second
        )
        return Scenario(
            name, items, half, note=f"4 req/s; conv lengths, code lengths from {half:g} s"
        )
    valid = ", ".join(SCENARIOS + EXTRA_SCENARIOS)
    raise ValueError(f"unknown scenario {name!r}; valid: {valid}")


def _pairs(lines: Iterable[str]) -> list[tuple[int, int]]:
    return [(w.num_prompt_tokens, w.num_output_tokens) for w in parse_azure_trace(lines)]


def min_static(
    items: Sequence[WorkItem], setup: Setup, target: float, start: Mapping[Role, int]
) -> RunResult | None:
    """A small static (prefill, decode) split meeting `target` attainment: from `start` (which
    must meet it; else None), take prefill workers away while it still meets, then decode
    workers. Scanning down from a size that meets keeps every run near capacity (an overloaded
    run's queue grows without bound and is slow to simulate). Not an exhaustive search: a split
    with fewer workers may exist where one pool can only shrink after the other grew."""
    pools = {r: max(1, start.get(r, 1)) for r in ROLES}
    best = run_static(items, setup, pools, "static-best")
    if best.attainment < target:
        return None
    for role in ROLES:
        while pools[role] > 1:
            trial = {**pools, role: pools[role] - 1}
            r = run_static(items, setup, trial, "static-best")
            if r.attainment < target:
                break
            pools, best = trial, r
    return best


# -- the loop-independent yardstick: what a user would provision statically for the peak --------

PLANNED_WINDOW_S = 60.0
"""The busiest window the `static-planned` yardstick is sized for: the trace's busiest minute
(peak-minute provisioning)."""


@dataclass(frozen=True, slots=True)
class PeakWindow:
    """The busiest `window_s` of a workload: its start, rate and length mix."""

    start_s: float
    window_s: float
    requests: int
    mean_prompt_tokens: float
    mean_output_tokens: float
    prompt_cv2: float

    @property
    def rate_per_s(self) -> float:
        return self.requests / self.window_s


def busiest_window(items: Sequence[WorkItem], window_s: float = PLANNED_WINDOW_S) -> PeakWindow:
    """The `window_s` holding the most arrivals (windows starting at an arrival; ties: the
    earliest), with that window's prompt / output means and prompt spread (variance / mean²)."""
    if not items:
        raise ValueError("the workload has no requests")
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    arrivals = np.array([w.arrival_s for w in items])
    order = np.argsort(arrivals, kind="stable")
    arrivals = arrivals[order]
    ends = np.searchsorted(arrivals, arrivals + window_s, side="left")
    counts = ends - np.arange(len(arrivals))
    i = int(np.argmax(counts))
    chosen = [items[int(k)] for k in order[i : int(ends[i])]]
    return _window(chosen, float(arrivals[i]), window_s)


def _window(chosen: Sequence[WorkItem], start_s: float, window_s: float) -> PeakWindow:
    """`chosen`'s rate over `window_s` and length mix (no requests: zero rate and lengths)."""
    if not chosen:
        return PeakWindow(start_s, window_s, 0, 0.0, 0.0, 0.0)
    prompts = np.array([w.num_prompt_tokens for w in chosen], dtype=float)
    outputs = np.array([w.num_output_tokens for w in chosen], dtype=float)
    mean_p = float(prompts.mean())
    cv2 = float(prompts.var() / mean_p**2) if len(prompts) > 1 and mean_p > 0 else 0.0
    return PeakWindow(start_s, window_s, len(chosen), mean_p, float(outputs.mean()), cv2)


def planned_pools(peak: PeakWindow, setup: Setup) -> dict[Role, int]:
    """The pools the autoscaler's own steady-state sizing gives for `peak`'s rate and length
    mix (`policy.planner.autoscaler.work_by_role` with the evaluated policy's parameters: tail
    sizing over the pool, the class's attainment quantile), at its scale-up utilization, at
    least `setup.min_replicas` each. No forecast, burst headroom or feedback: a steady load."""
    p = setup.params
    targets = Targets(
        min(c.ttft_s for c in setup.classes),
        min(c.tpot_s for c in setup.classes),
        min(0.999, max(max(c.percentile, c.attainment) for c in setup.classes)),
    )
    stats = LengthStats(peak.mean_prompt_tokens, max(1.0, peak.mean_output_tokens))
    work = work_by_role(
        ROLES, peak.rate_per_s, stats, setup.perf_model(), targets, p, peak.prompt_cv2
    )
    return {
        r: min(
            setup.max_replicas,
            max(setup.min_replicas, 1, math.ceil(w / p.target_utilization - 1e-9)),
        )
        for r, w in work.items()
    }


@dataclass(frozen=True, slots=True)
class Planned:
    """The `static-planned` yardstick: `planned_pools` for the busiest window, grown one worker
    at a time until a static run of the whole workload meets the target."""

    peak: PeakWindow
    sized: Mapping[Role, int]
    """What the steady-state sizing gave."""
    result: RunResult
    """The static run at the final (grown) pools; its attainment meets the target unless
    `max_replicas` stopped the growth."""
    grown: tuple[str, ...] = ()
    """One line per worker added after the sized pools missed the target."""
    met: bool = True
    """False: growth stopped below the target (`PLANNED_PATIENCE` workers in a row raised no
    attainment, or `max_replicas`); `result` is then the best run seen."""


PLANNED_PATIENCE = 4
"""`planned_static` gives up after this many added workers in a row raised no attainment."""


def planned_static(
    items: Sequence[WorkItem], setup: Setup, target: float, window_s: float = PLANNED_WINDOW_S
) -> Planned:
    """`static-planned`: size for the busiest `window_s` (`planned_pools`), run it statically;
    while it misses `target`, add one worker to the pool whose side misses more (TTFT misses:
    prefill; TPOT misses: decode) and run again. Attainment can plateau for a worker or two (a
    burst's prefills queue in whole rounds), so growth gives up only after `PLANNED_PATIENCE`
    workers in a row raised nothing (misses no pool size removes, e.g. the KV pull of a long
    prompt before a short output's second token), or at `setup.max_replicas`; then the best
    run seen is kept and `Planned.met` is False."""
    peak = busiest_window(items, window_s)
    sized = planned_pools(peak, setup)
    pools = dict(sized)
    grown: list[str] = []
    result = best = run_static(items, setup, pools, "static-planned")
    kept = 0  # grown lines up to the best run
    stalled = 0
    while result.attainment < target and stalled < PLANNED_PATIENCE:
        ttft = sum(c.ttft_misses for c in result.classes)
        tpot = sum(c.tpot_misses for c in result.classes)
        role = Role.PREFILL if ttft >= tpot else Role.DECODE
        if pools[role] >= setup.max_replicas:
            role = Role.DECODE if role is Role.PREFILL else Role.PREFILL
            if pools[role] >= setup.max_replicas:
                break
        grown.append(
            f"{_fmt_pools(pools)} {result.attainment:.2%} ({ttft} TTFT / {tpot} TPOT misses): "
            f"+1 {role.value}"
        )
        pools[role] += 1
        result = run_static(items, setup, pools, "static-planned")
        if result.attainment > best.attainment:
            best, kept, stalled = result, len(grown), 0
        else:
            stalled += 1
    return Planned(peak, sized, best, tuple(grown[:kept]), best.attainment >= target)


# -- the oracle: the best a loop with whole workers and these cold starts could do ---------------

ORACLE_INTERVAL_S = 60.0
"""The oracle re-sizes its pools once per this many seconds (the same minute `static-planned`
is sized for)."""


@dataclass(frozen=True, slots=True)
class Oracle:
    """A clairvoyant whole-worker schedule: in every `interval_s` the pools the static sizing
    model needs for that interval's own arrivals and lengths (`planned_pools`, scaled by what
    `static-planned`'s simulation check had to add), each added worker started `startup_s`
    early, each removed one gone at once (no stabilization, no drain)."""

    interval_s: float
    schedule: tuple[Mapping[Role, int], ...]
    """The pools of each interval, from 0."""
    scale: Mapping[Role, float]
    """The factor each interval's sizing was multiplied by (rounded up after)."""
    end_s: float
    gpu_hours: float
    """The schedule's GPU-hours: `oracle_gpu_seconds` / 3600."""
    cold_start_gpu_hours: float
    """Of which the early starts (`startup_s` per added worker)."""
    simulated: RunResult | None = None
    """The schedule replayed (`sim.autoscale.run_scheduled`, drains counted); None: not run."""


def interval_windows(
    items: Sequence[WorkItem], interval_s: float, end_s: float
) -> list[PeakWindow]:
    """The arrivals of each `[k·interval_s, (k+1)·interval_s)` up to `end_s`, with their rate
    (over `interval_s`, also for a last, shorter interval: a tail of a few seconds must not
    read as a burst) and length mix."""
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    n = max(1, math.ceil(end_s / interval_s - 1e-9))
    buckets: list[list[WorkItem]] = [[] for _ in range(n)]
    for w in items:
        buckets[min(n - 1, int(w.arrival_s // interval_s))].append(w)
    return [_window(b, k * interval_s, interval_s) for k, b in enumerate(buckets)]


def oracle_gpu_seconds(
    schedule: Sequence[Mapping[Role, int]],
    interval_s: float,
    end_s: float,
    startup_s: float,
    gpus: Mapping[Role, int] | None = None,
) -> tuple[float, float]:
    """(GPU-seconds of `schedule`, of which cold starts): entry k holds from k·interval_s to
    the next (the last one to `end_s`); the first entry is up at 0 (the static runs' and the
    loop's initial workers pay no start either); every worker entry k adds over entry k-1 is
    paid `startup_s` more; removed workers cost nothing after their interval. `gpus`: GPUs per
    worker of each role (default 1)."""
    if not schedule:
        return 0.0, 0.0
    per = {r: (gpus or {}).get(r, 1) for r in ROLES}
    total = cold = 0.0
    for k, pools in enumerate(schedule):
        start = k * interval_s
        stop = end_s if k == len(schedule) - 1 else (k + 1) * interval_s
        total += sum(pools.get(r, 0) * per[r] for r in ROLES) * max(0.0, stop - start)
        if k > 0:
            added = sum(max(0, pools.get(r, 0) - schedule[k - 1].get(r, 0)) * per[r] for r in ROLES)
            cold += added * startup_s
    return total + cold, cold


def oracle_schedule(
    items: Sequence[WorkItem],
    setup: Setup,
    end_s: float,
    planned: Planned | None = None,
    interval_s: float = ORACLE_INTERVAL_S,
) -> tuple[tuple[dict[Role, int], ...], dict[Role, float]]:
    """Each interval's pools: `planned_pools` of its own arrivals (at least
    `setup.min_replicas`, 1), times per role the factor `planned`'s simulation check grew the
    sizing by at the peak (its final pools over the largest per-interval sizing, at least 1:
    the sizing model's own error at the peak, spread proportionally; a pool the check did not
    grow keeps factor 1), rounded up."""
    floor = max(setup.min_replicas, 1)
    sized = [
        planned_pools(w, setup) if w.requests else dict.fromkeys(ROLES, floor)
        for w in interval_windows(items, interval_s, end_s)
    ]
    scale = dict.fromkeys(ROLES, 1.0)
    if planned is not None:
        for r in ROLES:
            top = max(p[r] for p in sized)
            scale[r] = max(1.0, planned.result.peak_workers.get(r, 0) / top)
    schedule = tuple(
        {r: min(setup.max_replicas, max(floor, math.ceil(p[r] * scale[r] - 1e-9))) for r in ROLES}
        for p in sized
    )
    return schedule, scale


def static_end_s(result: RunResult, setup: Setup) -> float:
    """When a static run's last request finished (its GPU-hours over its GPUs)."""
    gpus = sum(n * setup.tp_of(r) for r, n in result.peak_workers.items())
    return result.gpu_hours * 3600 / gpus if gpus else 0.0


def oracle(
    items: Sequence[WorkItem],
    setup: Setup,
    planned: Planned | None = None,
    interval_s: float = ORACLE_INTERVAL_S,
    simulate: bool = True,
) -> Oracle:
    """The `Oracle` of `items`: over the span `planned`'s static run took (or to the last
    arrival), with `setup.startup_s` cold starts; `simulate` replays the schedule to give its
    attainment. A bound on what the sizing model allows, not a proof that no loop can do
    better: a loop that accepts more misses, or a finer sizing, could go lower."""
    end = items[-1].arrival_s if items else 0.0
    if planned is not None:
        end = max(end, static_end_s(planned.result, setup))
    schedule, scale = oracle_schedule(items, setup, end, planned, interval_s)
    gpus = {r: setup.tp_of(r) for r in ROLES}
    total, cold = oracle_gpu_seconds(schedule, interval_s, end, setup.startup_s, gpus)
    sim = run_scheduled(items, setup, schedule, interval_s) if simulate and items else None
    return Oracle(interval_s, schedule, scale, end, total / 3600, cold / 3600, sim)


def evaluate(
    scenario: Scenario,
    setup: Setup,
    search: bool = True,
    planned: bool = True,
    with_oracle: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """The loop and the static yardsticks on one scenario. `progress` hears each run as it
    starts (a full-length run takes minutes; the caller decides where to show it)."""
    say = progress or (lambda _: None)
    name = scenario.name
    loop_setup = setup if scenario.initial is None else replace(setup, initial=scenario.initial)
    say(f"{name}: the loop ({len(scenario.items)} requests)")
    auto = run_autoscaled(scenario.items, loop_setup, step_at_s=scenario.step_at_s)
    say(f"{name}: static-peak {_fmt_pools(auto.peak_workers)}")
    peak = run_static(scenario.items, setup, auto.peak_workers, "static-peak")
    target = min(c.attainment for c in setup.classes)
    if search:
        say(f"{name}: static-best (searching the cheapest static pools; the slow part)")
    best = min_static(scenario.items, setup, target, auto.peak_workers) if search else None
    if planned:
        say(f"{name}: static-planned")
    plan = planned_static(scenario.items, setup, target) if planned else None
    if with_oracle:
        say(f"{name}: oracle")
    orc = oracle(scenario.items, setup, plan) if with_oracle else None
    return Evaluation(scenario, auto, peak, best, plan, orc)


# -- reporting ----------------------------------------------------------------------------------


def _fmt_router_slo(setup: Setup) -> str:
    if setup.router_predictor is None:
        return "placements without SLO inputs (every prompt split)"
    return (
        "placements with the router's SLO inputs (deadlines, `"
        + setup.router_predictor
        + "` output-length prediction, rate estimates: the P/D decider's "
        "`prefill_would_miss_ttft` / `pull_would_miss_tpot` act)"
    )


def _fmt_admission(setup: Setup) -> str:
    a = setup.admission
    if a is None:
        return "no admission gate (every request placed at arrival)"
    cap = (
        ""
        if a.max_outstanding_per_worker is None
        else f", at most {a.max_outstanding_per_worker} outstanding per decode worker"
    )
    shed = [c.name for c in setup.classes if c.sheddable]
    who = (
        f"class {', '.join(f'`{n}`' for n in shed)} sheddable: requests predicted to miss their "
        "TTFT deadline are shed and count as misses"
        if shed
        else "no class sheddable: queued requests wait however late"
    )
    return (
        f"the router's admission gate (room while the best prefill worker's predicted backlog "
        f"is within {a.max_backlog_fraction:g}x the tightest TTFT target{cap}, "
        f"queue {a.queue_capacity}; {who})"
    )


def _fmt_pools(p: Mapping[Role, int]) -> str:
    return "P" + str(p.get(Role.PREFILL, 0)) + ":D" + str(p.get(Role.DECODE, 0))


def _fmt_range(schedule: Sequence[Mapping[Role, int]]) -> str:
    def span(r: Role) -> str:
        lo, hi = min(p.get(r, 0) for p in schedule), max(p.get(r, 0) for p in schedule)
        return str(lo) if lo == hi else f"{lo}-{hi}"

    return f"P{span(Role.PREFILL)}:D{span(Role.DECODE)}"


def _oracle_sim(o: Oracle) -> str:
    if o.simulated is None:
        return "-"
    return f"{o.simulated.attainment:.2%}, {o.simulated.gpu_hours:.2f} GPU-h"


def _opt(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(evals: Sequence[Evaluation], setup: Setup) -> str:
    c = setup.classes[0]
    p = setup.params
    head = (
        f"Setup: {setup.model} on {setup.hardware} (TP {setup.tp}) workers, class `{c.name}` "
        f"TTFT {c.ttft_s:g} s / TPOT {c.tpot_s * 1000:g} ms at p{round(c.percentile * 100)}, "
        f"attainment target {c.attainment:.0%}; loop every {p.interval_s:g} s, "
        f"window {setup.window_s:g} s, "
        f"scale-down stabilization {p.scale_down_stabilization_s:g} s, "
        f"cold start {setup.startup_s:g} s, flips {'on' if setup.flipping else 'off'}, "
        f"burst weight {p.burst_weight:g}"
        f"{' less the Poisson excess' if p.burst_poisson and p.burst_weight > 0 else ''}, "
        f"utilization {p.target_utilization:g} up / "
        f"{p.scale_down_utilization:g} down, prefill tail fraction {p.ttft_tail_fraction:g}, "
        f"decode occupancy floor {'on' if p.occupancy_floor else 'off'}; "
        f"'after warm-up': requests arriving after "
        f"{setup.warmup_s:g} s; {_fmt_admission(setup)}; {_fmt_router_slo(setup)}.\n\n"
    )
    rows = [
        "| scenario | run | pools | attainment | after warm-up | shed | GPU-h "
        "| vs static-planned | vs static-peak | vs static-best | vs oracle | scale actions "
        "| flips | oscillations | reaction (s) | capacity ready (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    for e in evals:
        a = e.autoscaled
        rows.append(
            f"| {e.scenario.name} | autoscaled | up to {_fmt_pools(a.peak_workers)} "
            f"| {a.attainment:.2%} | {_opt(a.warm_attainment, '.2%')} | {a.shed_fraction:.2%} "
            f"| {a.gpu_hours:.2f} | {ratio(e.gpu_ratio_planned)} | {e.gpu_ratio_peak:.2f}x "
            f"| {ratio(e.gpu_ratio_best)} | {ratio(e.gpu_ratio_oracle)} "
            f"| {a.num_scale_actions} | {a.num_flips} | {a.oscillations} "
            f"| {_opt(a.reaction_s, '.0f')} | {_opt(a.ready_s, '.0f')} |"
        )
        planned = e.static_planned.result if e.static_planned is not None else None
        for s in (planned, e.static_peak, e.static_best):
            if s is None:
                continue
            rows.append(
                f"| {e.scenario.name} | {s.label} | {_fmt_pools(s.peak_workers)} "
                f"| {s.attainment:.2%} | {_opt(s.warm_attainment, '.2%')} "
                f"| {s.shed_fraction:.2%} | {s.gpu_hours:.2f} | | | | | | | | | |"
            )
        o = e.oracle
        if o is not None:
            sim = o.simulated
            rows.append(
                f"| {e.scenario.name} | oracle | {_fmt_range(o.schedule)} "
                f"| {'-' if sim is None else format(sim.attainment, '.2%')} "
                f"| {'-' if sim is None else _opt(sim.warm_attainment, '.2%')} "
                f"| {'-' if sim is None else format(sim.shed_fraction, '.2%')} "
                f"| {o.gpu_hours:.2f} | {ratio(e.oracle_ratio_planned)} | | | | | | | | |"
            )
    notes = [f"- `{e.scenario.name}`: {e.scenario.note}" for e in evals]
    for e in evals:
        pl = e.static_planned
        if pl is None:
            continue
        k = pl.peak
        grown = f"; grown: {'; '.join(pl.grown)}" if pl.grown else "; met as sized"
        if not pl.met:
            grown += (
                f"; growth stopped below the target ({PLANNED_PATIENCE} more workers in a row "
                "raised no attainment): the best run is shown"
            )
        notes.append(
            f"- `{e.scenario.name}` static-planned: busiest {k.window_s:g} s from "
            f"{k.start_s:.0f} s, {k.rate_per_s:.3g} req/s, prompt {k.mean_prompt_tokens:.0f} / "
            f"output {k.mean_output_tokens:.0f} tokens, prompt cv² {k.prompt_cv2:.2f}: sized "
            f"{_fmt_pools(pl.sized)}{grown}"
        )
    oracle_rows = []
    for e in evals:
        if e.oracle is None:
            continue
        planned_h = e.static_planned.result.gpu_hours if e.static_planned is not None else None
        oracle_rows.append(
            f"| {e.scenario.name} | {_opt(planned_h, '.2f')} "
            f"| {e.oracle.gpu_hours:.2f} ({e.oracle.cold_start_gpu_hours:.2f} cold starts) "
            f"| {ratio(e.oracle_ratio_planned)} | {e.autoscaled.gpu_hours:.2f} "
            f"| {ratio(e.gpu_ratio_planned)} | {ratio(e.gpu_ratio_oracle)} "
            f"| {_oracle_sim(e.oracle)} |"
        )
    if oracle_rows:
        o0 = next(e.oracle for e in evals if e.oracle is not None)
        notes += [
            "",
            f"Oracle (the best a loop with whole workers and {setup.startup_s:g} s cold starts "
            f"could do): every {o0.interval_s:g} s the pools the static sizing needs for that "
            "interval's own arrivals, scaled by what static-planned's check added, each added "
            "worker paid from its start, none held after its interval (no stabilization, no "
            "drain); 'simulated': the same schedule replayed (drains counted).",
            "",
            "| scenario | static-planned GPU-h | oracle GPU-h | oracle / static-planned "
            "| loop GPU-h | loop / static-planned | loop / oracle | oracle simulated |",
            "|---|---|---|---|---|---|---|---|",
            *oracle_rows,
        ]
    legend = (
        "static-planned: the pools the autoscaler's steady-state sizing gives for the "
        "workload's busiest minute (its rate and length mix), grown one worker at a time until "
        "a static run meets the target (what a user provisioning for the peak would run; "
        "independent of the loop). static-peak: the largest sizes the autoscaled run reached. "
        "static-best: the smallest split found meeting the target (hindsight search).\n\n"
    )
    return head + legend + "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


def plot_png(e: Evaluation) -> bytes:
    """Load, workers per role and attainment over time: autoscaled vs the static runs."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ticks = e.autoscaled.ticks
    t = [x.time_s / 60 for x in ticks]
    fig = Figure(figsize=(9, 7.5))
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    ax1.plot(t, [x.arrival_rate_per_s for x in ticks], color="black")
    ax1.set_ylabel("arrivals (req/s)")
    ax1.set_title(f"{e.scenario.name}: autoscaled vs static")
    colors = {Role.PREFILL: "tab:blue", Role.DECODE: "tab:orange"}
    for role in ROLES:
        ax2.step(
            t,
            [x.workers[role] for x in ticks],
            where="post",
            color=colors[role],
            label=f"{role.value} (autoscaled)",
        )
        planned = e.static_planned.result if e.static_planned is not None else None
        for s, style in ((planned, "-."), (e.static_peak, ":"), (e.static_best, "--")):
            if s is not None:
                ax2.axhline(
                    s.peak_workers.get(role, 0),
                    color=colors[role],
                    linestyle=style,
                    label=f"{role.value} ({s.label})",
                )
    ax2.set_ylabel("workers")
    ax2.legend(fontsize=7, ncol=2, loc="upper right")
    att = [(x.time_s / 60, x.attainment) for x in ticks if x.attainment is not None]
    ax3.plot(
        [a for a, _ in att], [b for _, b in att], color="tab:green", label="autoscaled (window)"
    )
    target = e.autoscaled.classes[0] if e.autoscaled.classes else None
    ax3.axhline(0.99, color="grey", linestyle=":", label="target")
    ax3.set_ylim(min(0.5, *(b for _, b in att)) if att else 0.5, 1.01)
    ax3.set_ylabel("attainment")
    ax3.set_xlabel("minutes")
    ax3.legend(fontsize=7, loc="lower right")
    del target
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


@dataclass(frozen=True, slots=True)
class Report:
    markdown: str
    plots: Mapping[str, bytes] = field(default_factory=dict)
    evaluations: tuple[Evaluation, ...] = ()


def run(
    names: Sequence[str],
    trace_lines: Callable[[str], Iterable[str]],
    setup: Setup | None = None,
    quick: bool = False,
    search: bool = True,
    plots: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Report:
    setup = setup or Setup()
    evals = tuple(
        evaluate(build_scenario(n, trace_lines, quick), setup, search, progress=progress)
        for n in names
    )
    pngs = {f"autoscale_{e.scenario.name}.png": plot_png(e) for e in evals} if plots else {}
    return Report(markdown(evals, setup), pngs, evals)


def reactive_shortfall(
    items: Sequence[WorkItem],
    perf: AladdinPerfModel,
    lag_s: float,
    hold_s: float,
    window_s: float = 10.0,
    utilization: float = 0.8,
    floor: int = 1,
) -> float:
    """The fraction of requests that arrive while the prefill capacity the workload needs
    exceeds what any reactive loop could have in place: the largest need seen between
    `lag_s + hold_s` and `lag_s` earlier (capacity takes `lag_s` to react and start: a tick
    plus the cold start; it is held for `hold_s`, the stabilization window), at least `floor`.

    An estimate of what is physically possible, not a simulation: need(t) is the prefill work
    (Eq 2, `perf`) arriving in the `window_s` before t at `utilization`, per second; a request
    arriving while need > capacity is at risk (queues absorb some of it, so a loop can do a
    little better than 1 - this; a loop that predicts the surge can do better still).
    """
    return reactive_hold(items, perf, lag_s, hold_s, window_s, utilization, floor)[0]


def reactive_hold(
    items: Sequence[WorkItem],
    perf: AladdinPerfModel,
    lag_s: float,
    hold_s: float,
    window_s: float = 10.0,
    utilization: float = 0.8,
    floor: int = 1,
) -> tuple[float, float]:
    """`reactive_shortfall`'s share at risk, and the mean prefill workers that capacity takes
    (held need over the workload's span): the trade-off of holding the recent peak need for
    `hold_s` (a surge floor; the loop's `scale_down_stabilization_s` plays this part). The
    workers are the estimate's, not a simulation's (no hysteresis, no rate limits)."""
    if not items:
        return 0.0, 0.0
    arrivals = np.array([w.arrival_s for w in items])
    service = np.array([perf.prefill_s(w.num_prompt_tokens) for w in items])
    seconds = int(np.ceil(arrivals.max())) + 1
    work = np.zeros(seconds)
    np.add.at(work, arrivals.astype(int), service)
    w = max(1, round(window_s))
    rolling = np.convolve(work, np.ones(w), mode="full")[:seconds] / w
    need = np.ceil(rolling / utilization - 1e-9)
    lag, hold = round(lag_s), round(hold_s)
    cap = np.full(seconds, float(floor))
    for i in range(lag, seconds):
        cap[i] = max(floor, need[max(0, i - lag - hold) : i - lag + 1].max())
    short = need > cap
    return float(short[arrivals.astype(int)].mean()), float(cap.mean())


SHORTFALL_LAGS_S = (0.0, 10.0, 20.0, 30.0)


def shortfall_markdown(
    names: Sequence[str],
    trace_lines: Callable[[str], Iterable[str]],
    setup: Setup | None = None,
    quick: bool = False,
) -> str:
    """`reactive_shortfall` of each scenario at several reaction lags (no simulation), with the
    set-up's model and stabilization window, as a markdown table."""
    setup = setup or Setup()
    perf = setup.perf_model()
    hold = setup.params.scale_down_stabilization_s
    head = " | ".join(f"lag {lag:g} s" for lag in SHORTFALL_LAGS_S)
    rows = [f"| scenario | {head} |", "|---" * (len(SHORTFALL_LAGS_S) + 1) + "|"]
    for name in names:
        items = build_scenario(name, trace_lines, quick).items
        cells = " | ".join(
            f"{reactive_shortfall(items, perf, lag, hold):.1%}" for lag in SHORTFALL_LAGS_S
        )
        rows.append(f"| {name} | {cells} |")
    rows += [
        "",
        f"Holding the recent peak need (lag {HOLD_LAG_S:g} s): at risk / mean prefill workers",
        "",
    ]
    head = " | ".join(f"hold {h:g} s" for h in HOLDS_S)
    rows += [f"| scenario | {head} |", "|---" * (len(HOLDS_S) + 1) + "|"]
    for name in names:
        items = build_scenario(name, trace_lines, quick).items
        held = [reactive_hold(items, perf, HOLD_LAG_S, h) for h in HOLDS_S]
        rows.append(f"| {name} | " + " | ".join(f"{a:.1%} / {w:.1f}" for a, w in held) + " |")
    rows += [
        "",
        "Surge onsets forecast by their period (causal autocorrelation, 200-400 s):",
        "",
        "| scenario | onsets | periods (s) | autocorrelation | median error (s) | within 20 s |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        fc = periodic_onset_forecasts(build_scenario(name, trace_lines, quick).items)
        if not fc:
            rows.append(f"| {name} | 0 | - | - | - | - |")
            continue
        periods = ", ".join(f"{p:g}" for p in sorted({f.period_s for f in fc}))
        rows.append(
            f"| {name} | {len(fc)} | {periods} | {min(f.acf for f in fc):.2f}-"
            f"{max(f.acf for f in fc):.2f} | {np.median([f.error_s for f in fc]):g} "
            f"| {sum(f.error_s <= 20.0 for f in fc)} |"
        )
    return "\n".join(rows)


HOLD_LAG_S = 20.0
HOLDS_S = (120.0, 480.0, 900.0, 3600.0)


@dataclass(frozen=True, slots=True)
class OnsetForecast:
    """One surge onset and what a causal periodic forecast made of it."""

    onset_s: float
    period_s: float
    """The lag (in the searched range) with the highest autocorrelation of the per-bin
    arrival counts before the onset."""
    acf: float
    """That autocorrelation."""
    error_s: float
    """Distance from the onset to the nearest of the last three earlier onsets plus one
    period: how far off a forecast of "the next surge one period after a past one" was."""


def periodic_onset_forecasts(
    items: Sequence[WorkItem],
    bin_s: float = 10.0,
    quantile: float = 0.9,
    min_period_s: float = 200.0,
    max_period_s: float = 400.0,
    min_history_s: float = 600.0,
) -> list[OnsetForecast]:
    """Are the surges predictable from the past alone by their period? Per-`bin_s` arrival
    counts; a surge onset is a bin above the counts' `quantile` after a minute without
    one. For each onset after `min_history_s`, the period is the lag in `[min_period_s,
    max_period_s]` with the highest autocorrelation of the counts *before* it (causal), and
    the forecast error is as `OnsetForecast.error_s`. (The quantile threshold uses the whole
    workload: it only labels onsets, the forecast never sees it.)"""
    if not items:
        return []
    arrivals = np.array([w.arrival_s for w in items])
    bins = (arrivals // bin_s).astype(int)
    counts = np.bincount(bins, minlength=int(bins.max()) + 1).astype(float)
    high = counts > np.quantile(counts, quantile)
    quiet = max(1, round(60.0 / bin_s))
    onsets = [i for i in range(1, len(counts)) if high[i] and not high[max(0, i - quiet) : i].any()]
    lo, hi = max(1, round(min_period_s / bin_s)), round(max_period_s / bin_s)
    out = []
    for i in onsets:
        if i * bin_s < min_history_s or i <= hi:
            continue
        x = counts[:i] - counts[:i].mean()
        norm = float(np.dot(x, x))
        if norm <= 0:
            continue
        acfs = [float(np.dot(x[:-k], x[k:])) / norm for k in range(lo, hi + 1)]
        k = int(np.argmax(acfs))
        period = lo + k
        earlier = [j for j in onsets if j < i][-3:]
        if not earlier:
            continue
        err = min(abs(i - (j + period)) for j in earlier)
        out.append(OnsetForecast(i * bin_s, period * bin_s, acfs[k], err * bin_s))
    return out

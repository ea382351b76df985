"""What the control loop sees of one service in one tick: the `Observation`. Pure data.

One `Observation` per service per tick, built by an edge (the operator from router and worker
metrics, `splitserve up --autoscale` from local processes, the simulator from its own records)
and handed to the pure policies (`policy.planner.autoscaler`, `policy.planner.flipper`):

- per SLO class: the class's targets and, over the window, TTFT / TPOT at the class percentile,
  attainment (fraction of finished requests that met both deadlines) and goodput;
- the arrival rate and the prompt / output length mix;
- the router's queue depth and shed count;
- per pool (role): its desired / ready workers and per-worker load (queued, running, KV use).

Missing or stale signals are an explicit state, never a zero: `Observation.problems` lists what
is missing or stale and why, and a policy that gets an observation with problems holds (no
action) and records the reason. A field that is `None` is unknown, and unknown is never read as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from splitserve.core.roles import Role


class SignalState(StrEnum):
    OK = "ok"
    MISSING = "missing"
    """No data at all (no router answered, no metric of that name, no requests yet)."""
    STALE = "stale"
    """Data older than the staleness limit."""


@dataclass(frozen=True, slots=True)
class SignalProblem:
    """A signal the loop needs and does not have, with the reason (for status and Events)."""

    signal: str
    state: SignalState
    reason: str

    def __str__(self) -> str:
        return f"{self.signal} {self.state.value}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ClassSignal:
    """One SLO class: its targets and what was observed over the window."""

    name: str
    ttft_target_s: float | None
    tpot_target_s: float | None
    percentile: float = 0.9
    attainment_target: float = 0.9
    requests: int = 0
    """Finished requests of the class in the window."""
    ttft_s: float | None = None
    """Observed TTFT at `percentile` (None: unknown)."""
    tpot_s: float | None = None
    """Observed TPOT at `percentile` (None: unknown)."""
    attainment: float | None = None
    """Fraction of the window's finished requests that met both deadlines (None: none finished)."""
    goodput_per_s: float | None = None
    """Requests per second that met their SLO."""
    shed: int = 0
    """Requests of the class the router refused (shed / rejected) in the window."""

    def ttft_missed(self) -> bool:
        return (
            self.ttft_s is not None
            and self.ttft_target_s is not None
            and self.ttft_s > self.ttft_target_s
        )

    def tpot_missed(self) -> bool:
        return (
            self.tpot_s is not None
            and self.tpot_target_s is not None
            and self.tpot_s > self.tpot_target_s
        )

    def attainment_missed(self) -> bool:
        return self.attainment is not None and self.attainment < self.attainment_target


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's load report."""

    name: str
    role: Role
    queued: int = 0
    running: int = 0
    kv_used: float | None = None
    """Fraction of KV blocks in use (0..1); None when the worker does not report it."""

    @property
    def work(self) -> int:
        return self.queued + self.running


@dataclass(frozen=True, slots=True)
class PoolSignal:
    """One role's pool."""

    role: Role
    current: int
    """Workers the pool has now (its desired size, counting flips toward their target)."""
    ready: int | None = None
    min_replicas: int = 0
    max_replicas: int | None = None
    workers: tuple[WorkerLoad, ...] = ()
    """Per-worker load, where reported (a worker without a report is absent, not idle)."""

    @property
    def queued(self) -> int | None:
        """Requests waiting on the pool's workers (None: no worker reported)."""
        return sum(w.queued for w in self.workers) if self.workers else None

    @property
    def running(self) -> int | None:
        return sum(w.running for w in self.workers) if self.workers else None

    @property
    def kv_used(self) -> float | None:
        """Mean KV use over the workers that report it."""
        known = [w.kv_used for w in self.workers if w.kv_used is not None]
        return sum(known) / len(known) if known else None


@dataclass(frozen=True, slots=True)
class Observation:
    """One service, one tick."""

    time_s: float
    """The loop's clock at the observation (seconds, any origin; only differences matter)."""
    window_s: float
    """The window the rates and percentiles cover."""
    arrival_rate_per_s: float | None
    """Requests arriving per second over the window (admitted + queued + shed + rejected)."""
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    classes: tuple[ClassSignal, ...] = ()
    pools: Mapping[Role, PoolSignal] = field(default_factory=dict)
    router_queue: int | None = None
    """Requests waiting in the routers' queues (None: unknown)."""
    router_queued_prompt_tokens: int | None = None
    """The prompt tokens of those requests (`splitserve_router_queued_prompt_tokens`: the
    prefill work waiting at the gate; None: unknown, e.g. a router without the gauge). Recorded
    in the decision's inputs; no policy sizes on it yet (the queue's length, `router_queue`,
    is what they read)."""
    shed: int | None = None
    """Requests shed or rejected by the routers in the window (None: unknown)."""
    problems: tuple[SignalProblem, ...] = ()
    """Signals missing or stale: when non-empty, policies hold and record these."""
    arrival_rate_peak_per_s: float | None = None
    """The highest arrival rate over the window's sub-windows (e.g. per tick interval), at least
    the window's mean: how bursty the arrivals are, and a step's full size on the first tick
    after it (the window's mean shows only part of it). None: not measured (the policies then
    size on the mean alone, and say so: `peak_problem`)."""
    prompt_tokens_cv2: float | None = None
    """Squared coefficient of variation of the window's prompt lengths (variance / mean²): how
    widely they spread (prefill's queueing tail). None: not measured (the policy assumes
    `AutoscalerParams.default_prompt_cv2`)."""
    arrival_rate_peak_window_s: float | None = None
    """The sub-window `arrival_rate_peak_per_s` was counted over (10 s, or the samples' spacing
    when coarser). None: not said (the policy then deducts no Poisson excess from the burst
    headroom, `AutoscalerParams.burst_poisson`: the full headroom, as before)."""
    peak_problem: SignalProblem | None = None
    """Why `arrival_rate_peak_per_s` is None, where an edge tried to measure it. Unlike
    `problems` it does not stop the policies (the mean is still known); they record it."""
    no_finish_yet: bool = False
    """Requests arrived but none has finished yet (at any router, since they started): no SLO
    result and no output length exist yet (`mean_output_tokens` is None), while the arrival
    rate, the prompts (counted at arrival) and the router's queue are known. Not a problem that
    stops the policies: the autoscaler acts on what is known (`autoscaler.decide`: prefill
    sized from the rate and prompts, queue pressure, no scale-down). False for a router with no
    traffic at all ("no traffic yet", a `problems` entry: nothing to act on)."""

    @property
    def usable(self) -> bool:
        """Whether the policies may act on it."""
        return (
            not self.problems
            and self.arrival_rate_per_s is not None
            and self.mean_prompt_tokens is not None
            and self.mean_output_tokens is not None
        )

    def why_unusable(self) -> str:
        parts = [str(p) for p in self.problems]
        if self.arrival_rate_per_s is None:
            parts.append("arrival rate unknown")
        if self.no_finish_yet and self.mean_output_tokens is None:
            parts.append("no request finished yet (output lengths and SLO results unknown)")
        elif self.mean_prompt_tokens is None or self.mean_output_tokens is None:
            parts.append("length mix unknown")
        return "; ".join(parts)

    def class_at_risk(self) -> list[ClassSignal]:
        return [
            c for c in self.classes if c.ttft_missed() or c.tpot_missed() or c.attainment_missed()
        ]

    @property
    def min_attainment(self) -> float | None:
        known = [c.attainment for c in self.classes if c.attainment is not None]
        return min(known) if known else None

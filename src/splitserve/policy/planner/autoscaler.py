"""The SLO-driven autoscaler: joint sizing of the prefill and decode pools, one tick at a time.

Aladdin-style (research/seed-distserve-vidur-aladdin.md, Aladdin §; `policy.planner.aladdin`):

- prefill workers from the arrival rate × prompt work against the TTFT target: one prefill of
  the mean prompt takes `S = k₁·l_in + c₁` (Eq 2); a prefill worker is treated as an M/D/1 queue,
  whose mean wait is `ρ·S / (2(1 − ρ))`, so it may run at the utilisation `ρ*` where
  `S + wait <= ttft_budget` (capped by `target_utilization`). Needed: `rate·S / ρ*` workers.
- decode workers from the KV and compute demand of the predicted lengths against the TPOT
  target: Eq 6's tokens/s per worker (`per_gpu_throughput`: the smaller of the KV bound and the
  batch that still decodes within the TPOT target). Needed: `rate·E[l_out] / (T·util)` workers.
- a mixed pool (aggregated serving) does both works.

Around the sizing, what keeps it from flapping (anchors.md §3 item 2: no oscillation, explained
decisions):

- forecast: Holt's linear smoothing of the per-tick arrival rate, looked `horizon_s` ahead, and
  never below the rate just observed (sizing for a rise before it arrives);
- burst headroom: the rate sized for moves `burst_weight` of the way from the window's mean to
  its busiest sub-window (`Observation.arrival_rate_peak_per_s`): headroom in proportion to the
  observed burstiness, and a step sized on the first tick after it; with `burst_poisson`, less
  what a Poisson stream at the mean shows in the busiest sub-window anyway (`poisson_peak_
  excess`, ∝ √rate: the tail sizing already assumes Poisson arrivals);
- hysteresis: scale up when the `target_utilization` count exceeds the pool; scale down only to
  the `scale_down_utilization` count (lower utilisation, so more workers), so a load that sits
  between the two thresholds moves nothing;
- `scale_down_stabilization_s`: scale down to the largest scale-down recommendation of the whole
  window (as the Kubernetes HPA does), and only once the loop has watched for a whole window;
- rate limits: at most `max(max_step_up, ⌈current·max_step_up_fraction⌉)` workers added and
  `max_step_down` removed per tick;
- the router's queue (`Observation.router_queue`: requests held at the admission gate, on no
  worker) is demand: it adds `backlog_rate` (the rate that clears it within one horizon) to
  the rate both sides are sized for, counts in decode's occupancy floor, and counts in the
  prefill side's queue for pressure (a count only: the router's queue depth carries no prompt
  tokens, so the window's mean prompt stands for theirs);
- the router's queue *growing* (`queue_growth_ticks` ticks in a row, `AutoscalerState.
  queue_trend` keeps the last tick's) is pressure on the side that takes new requests even
  below the size threshold: arrivals outrun admission, so the queue will cross the threshold
  later; a flat or shrinking queue is not, nor an unknown one;
- SLO feedback: a class missing its TTFT (TPOT) target with enough samples, or a queue above
  `queue_per_worker` per worker, puts the prefill (decode) side under *pressure*: one more
  worker per tick (unless workers already started for the pool are not serving yet: their
  effect is awaited first), and no scale-down while it lasts. The model can be wrong; the
  feedback is not;
- min / max per pool always win (a prefill floor never blocks the decode pool's scale-down:
  pools are decided independently).

Invariants (hypothesis-tested in tests/unit/policy/planner/test_planner_autoscaler.py): the
desired size is always within the bounds; monotone in the arrival rate (same state); under a
constant or slowly varying load no scale direction reverses within a stabilization window; after
a step the size converges and stays.

Pure: the clock is the observation's `time_s`; the state is passed in and returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from statistics import NormalDist
from typing import Final

from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import (
    AladdinPerfModel,
    LengthStats,
    PlannerParams,
    per_gpu_throughput,
)
from splitserve.policy.planner.signals import ClassSignal, Observation, PoolSignal

_EPS = 1e-9


class Kind(StrEnum):
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    HOLD = "hold"
    BOUNDS = "bounds"
    """The pool was outside its min / max and is brought back."""
    FLIP = "flip"
    NO_SIGNAL = "no-signal"
    """Signals missing or stale: nothing is done."""


@dataclass(frozen=True, slots=True)
class AutoscalerParams:
    interval_s: float = 30.0
    """Tick period (`scaling.intervalSeconds`)."""
    scale_down_stabilization_s: float = 300.0
    """`scaling.scaleDownStabilizationSeconds`."""
    target_utilization: float = 0.8
    """Scale up when the pool would run above this."""
    scale_down_utilization: float = 0.6
    """Scale down only to a size that runs at or below this (< target: the hysteresis band)."""
    ttft_budget_fraction: float = 0.5
    """Share of the TTFT target the model's mean prefill time + mean wait may use (the rest
    covers the spread up to the class percentile and the KV transfer)."""
    forecast_alpha: float = 0.5
    """Holt level smoothing (1: no smoothing)."""
    forecast_beta: float = 0.3
    """Holt trend smoothing (0: no trend)."""
    horizon_s: float = 30.0
    """How far ahead the rate is forecast: about the time a new worker takes to serve."""
    max_step_up: int = 4
    max_step_up_fraction: float = 1.0
    max_step_down: int = 1
    min_samples: int = 20
    """Finished requests a class needs in the window before its SLO misses count as pressure."""
    queue_per_worker: float = 4.0
    """Queued requests per worker above which the role is under pressure."""
    queue_growth_ticks: int = 2
    """The router's queue counts as pressure on the side that takes new requests once it grew
    (strictly, and is non-empty) at this many consecutive ticks, whatever its size (0: off; only
    its size counts). 2: three readings in a row rising, so one noisy reading is not a trend."""
    burst_weight: float = 0.0
    """Headroom for bursts: size for `mean + burst_weight × (peak − mean)` of the observation's
    arrival rates (`Observation.arrival_rate_peak_per_s`, the busiest sub-window). 0: the mean
    alone; 1: the busiest sub-window (a step's full size on the first tick after it)."""
    ttft_tail_fraction: float = 0.0
    """Tail sizing of prefill (0: off): the share of the TTFT target that the mean prefill time
    plus the wait at the class's attainment quantile may use (M/G/1 wait with an exponential
    tail, `prefill_tail_utilization`). A 99 % attainment target needs the 99th percentile wait
    inside the target, which the mean (`ttft_budget_fraction`) does not see."""
    default_prompt_cv2: float = 1.0
    """Squared coefficient of variation of prompt lengths assumed when the observation does not
    carry one (`Observation.prompt_tokens_cv2`); 1: exponential-like lengths."""
    occupancy_floor: bool = False
    """Decode work is at least what the decode workers hold now: their mean KV use, and their
    requests (running + queued) over the batch that still decodes within the TPOT target. A
    measured floor under the model, which reads output lengths from finished requests (short
    ones finish first: after a rise the mean is low for a while)."""

    pooled_tail: bool = False
    """Tail sizing over the prefill pool as one M/G/c queue (`prefill_tail_workers`: the router
    sends each prefill to the least-loaded worker, so a request waits only when every worker is
    busy) instead of a utilisation cap from one worker's M/G/1 queue (each worker its own
    queue, as a random split would have it). The M/G/1 cap sized the mix shift's 4 req/s of
    ~2,000-token prompts at 7-10 prefill workers where 2 met the target."""
    length_alpha: float = 1.0
    """Smoothing of the length mix (mean prompt and output tokens, prompt cv²) from tick to
    tick: an exponential average with this weight on the newest window (1: none). A window of a
    few hundred heavy-tailed prompts has a mean that moves by a third from one tick to the next
    with nothing changed (the code trace's 1,865-2,463 tokens at a constant 4 req/s), and the
    pool then ratchets up to the largest of those readings, which the hysteresis holds."""
    reversal_backoff: float = 1.0
    """Adaptive stabilization: when a pool scales up within a stabilization window of its own
    scale-down (a reversal: the load came back), its scale-down window is multiplied by this
    (1: off), up to `max_backoff` times the configured one; each window that passes without a
    reversal divides it by this again. Recurring surges after idle gaps then find the capacity
    still in place instead of a pool just shrunk."""
    max_backoff: float = 8.0
    feedback_settle: bool = False
    """SLO feedback waits for its effect: after a pool's serving workers rose, its pressure adds
    no further worker until one observation window (`Observation.window_s`) has passed, since
    until then the window's misses are mostly of requests served before the new capacity
    (False: only workers not yet serving are awaited). The mix shift's prefill pool grew
    2 -> 5 on misses from the first 30 s after the shift, where the model's 3 met the target,
    and the hysteresis then held the overshoot."""

    burst_poisson: bool = False
    """Burst headroom for what Poisson arrivals do not explain (False: for the whole excess of
    the busiest sub-window over the mean). The prefill tail sizing (M/G/c) already assumes
    Poisson arrivals at the sized rate, so the part of the busiest sub-window's excess that a
    Poisson stream at the mean rate shows anyway (its expected largest of `k` sub-windows,
    `poisson_peak_excess`) is counted once there and not again here; a real step or surge
    (an excess well beyond that) is still sized in full. Needs the sub-window's length
    (`Observation.arrival_rate_peak_window_s`); without it nothing is deducted."""
    hold_down_on_rise: bool = False
    """No scale-down in a tick whose sized rate (forecast or burst, the rate the pools are sized
    for) is above the previous usable tick's: the load is coming back, so the pool holds
    (`Kind.HOLD`, "sized rate rising"). On the full-length code trace 6 of the 8 reversals
    began with a stabilized scale-down taken while that rate was already rising tick over tick
    (e.g. decode 4 -> 3 -> 2 -> 1 at forecasts 1.78, 8.38, 8.22 req/s, then 1 -> 2 under
    pressure 40 s later; docs/benchmarks.md, 2026-11-27). Measured there and **not used** by
    the live loops: full length 84.00 -> 85.52 % in SLO at 9.60 -> 10.40 GPU-h, but 8 -> 8
    reversals (the trajectory changes and others take their place)."""
    band_z: float = 0.0
    """Scale-down band from the noise of the measured rate (0: off, the fixed band of
    `scale_down_utilization` alone). A window of `T` seconds reads a Poisson rate `λ` with a
    standard error of `√(λ/T)` (relative: `1/√(λT)`); the pool scales down only to the size
    that still runs at `target_utilization` the work of the sized rate plus `z` standard
    errors (`band_workers`), never to more than the fixed band's size. The fixed band holds
    `target / scale_down − 1` (60 % at 0.8 / 0.5) extra workers at every pool size, where the
    reading's noise shrinks like `1/√λ`: at 5 req/s over 30 s, z = 2 is a 16 % margin."""

    def __post_init__(self) -> None:
        if self.band_z < 0:
            raise ValueError("band_z must be >= 0")
        if self.queue_growth_ticks < 0:
            raise ValueError("queue_growth_ticks must be >= 0 (0: off)")
        if not 0 < self.length_alpha <= 1:
            raise ValueError("length_alpha must be in (0, 1]")
        if self.reversal_backoff < 1 or self.max_backoff < 1:
            raise ValueError("reversal_backoff and max_backoff must be >= 1")
        if self.interval_s <= 0 or self.scale_down_stabilization_s < 0 or self.horizon_s < 0:
            raise ValueError("interval_s must be > 0, stabilization and horizon >= 0")
        if not 0 < self.scale_down_utilization <= self.target_utilization <= 1:
            raise ValueError("need 0 < scale_down_utilization <= target_utilization <= 1")
        if not 0 < self.forecast_alpha <= 1 or not 0 <= self.forecast_beta <= 1:
            raise ValueError("forecast_alpha in (0, 1], forecast_beta in [0, 1]")
        if self.max_step_up < 1 or self.max_step_down < 1 or self.max_step_up_fraction < 0:
            raise ValueError("max_step_up and max_step_down must be >= 1")
        if not 0 < self.ttft_budget_fraction <= 1:
            raise ValueError("ttft_budget_fraction must be in (0, 1]")
        if not 0 <= self.burst_weight <= 1:
            raise ValueError("burst_weight must be in [0, 1]")
        if not 0 <= self.ttft_tail_fraction <= 1 or self.default_prompt_cv2 < 0:
            raise ValueError("ttft_tail_fraction in [0, 1], default_prompt_cv2 >= 0")


def live_params(
    interval_s: float,
    scale_down_stabilization_s: float,
    burst_weight: float = 1.0,
    horizon_s: float = 30.0,
) -> AutoscalerParams:
    """The policy the live loops run, one definition for the operator (`operator.control`) and
    `splitserve up --autoscale` (`cli.autoscale_local`): the evaluated one (docs/autoscaling.md)
    with burst headroom `burst_weight` (`scaling.burstWeight`), prefill sized for the class's
    tail over the pool (M/G/c, the prompts' spread from the router's length histogram,
    `default_prompt_cv2` when the window has none), decode never below what its workers hold,
    and a scale-down window that doubles after a reversal (up to 4×), burst headroom less the
    busiest sub-window's Poisson excess (`burst_poisson`: the tail sizing already covers it).
    The forecast looks at least one interval ahead."""
    return AutoscalerParams(
        interval_s=interval_s,
        scale_down_stabilization_s=scale_down_stabilization_s,
        horizon_s=max(interval_s, horizon_s),
        burst_weight=burst_weight,
        ttft_tail_fraction=0.8,
        occupancy_floor=True,
        pooled_tail=True,
        reversal_backoff=2.0,
        max_backoff=4.0,
        feedback_settle=True,
        burst_poisson=True,
    )


@dataclass(frozen=True, slots=True)
class Bounds:
    min_replicas: int = 0
    max_replicas: int | None = None

    def clamp(self, n: int) -> int:
        n = max(self.min_replicas, n)
        return n if self.max_replicas is None else min(self.max_replicas, n)


@dataclass(frozen=True, slots=True)
class Targets:
    """The latency targets the pools are sized for: the strictest class's."""

    ttft_s: float
    tpot_s: float
    quantile: float = 0.9
    """The share of requests that must meet the targets: the largest of the classes'
    percentiles and attainment targets (tail sizing, `AutoscalerParams.ttft_tail_fraction`)."""

    @classmethod
    def of(cls, classes: tuple[ClassSignal, ...], default: Targets | None = None) -> Targets:
        base = default or Targets(2.0, 0.2)
        ttfts = [c.ttft_target_s for c in classes if c.ttft_target_s is not None]
        tpots = [c.tpot_target_s for c in classes if c.tpot_target_s is not None]
        qs = [max(c.percentile, c.attainment_target) for c in classes]
        return cls(
            min(ttfts, default=base.ttft_s),
            min(tpots, default=base.tpot_s),
            min(0.999, max(qs, default=base.quantile)),
        )


# -- sizing (the model) -------------------------------------------------------------------------


def prefill_utilization(service_s: float, budget_s: float, cap: float) -> float:
    """Largest M/D/1 utilisation with `service + mean wait <= budget` (at most `cap`; a small
    floor when even an idle worker misses the budget: the pool is then sized by `cap`'s
    fraction of it, and the SLO feedback adds the rest)."""
    if service_s <= 0:
        return cap
    slack = (budget_s - service_s) / service_s
    if slack <= 0:
        return min(cap, 0.1)
    return min(cap, 2 * slack / (1 + 2 * slack))


def prefill_tail_utilization(
    service_s: float, cv2: float, quantile: float, budget_s: float, cap: float
) -> float:
    """Largest utilisation whose `quantile` wait plus the mean service fits `budget_s` (at most
    `cap`; a small floor when even an idle worker misses it).

    The wait of an M/G/1 queue: mean `W = ρ·S·(1 + cv²) / (2(1 − ρ))` (Pollaczek-Khinchine,
    `cv²` of the service time); a request waits with probability ρ, and the wait, when there is
    one, is taken as exponential with mean `W / ρ` (the usual heavy-traffic approximation), so
    `P(wait > t) = ρ·exp(−ρt / W)` and the quantile is `(W / ρ)·ln(ρ / (1 − quantile))` (0 when
    ρ <= 1 − quantile). Increasing in ρ: found by bisection.
    """
    if service_s <= 0:
        return cap
    if budget_s <= service_s:
        return min(cap, 0.1)

    def wait_q(rho: float) -> float:
        if rho <= 1 - quantile:
            return 0.0
        per_wait = service_s * (1 + cv2) / (2 * (1 - rho))  # W / ρ
        return per_wait * math.log(rho / (1 - quantile))

    if service_s + wait_q(cap) <= budget_s:
        return cap
    lo, hi = 0.0, cap
    for _ in range(40):
        mid = (lo + hi) / 2
        if service_s + wait_q(mid) <= budget_s:
            lo = mid
        else:
            hi = mid
    return max(lo, min(cap, 0.1))


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with `servers` servers and `offered`
    erlangs of load (`rate × service`); 1 when the load is at or above capacity. Through the
    Erlang B recursion (stable for any size)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    b = erlang_b(servers, offered)
    rho = offered / servers
    return b / (1 - rho * (1 - b))


_FLUID_START: Final = 12.0
"""`erlang_b` starts its recursion this many √a below the load `a` (from the fluid value)."""
_NEGLIGIBLE_B: Final = 1e-40
"""`erlang_b` stops once the blocking probability is below this (it only falls further)."""


def erlang_b(servers: int, offered: float) -> float:
    """Erlang B (blocking probability of M/M/c/c) by its recursion `B(k) = a·B(k−1) /
    (k + a·B(k−1))`, B(0) = 1.

    Exact to float precision but not O(c) for large loads: 12√a below `min(a, c)` servers B
    is the fluid `1 − k/a` to within O(1/√a), and the recursion contracts any error there by
    `∏ k/a <= e^{−72}` by the time it reaches `min(a, c)`, so it starts there from the fluid
    value; and
    once B falls below 1e-40 (it only falls with k) the rest is 0 for every use here. A
    forecast of 10⁶ req/s made a tick take tens of seconds with the full recursion (the local
    loop's probe, 2026-11-29)."""
    a = offered
    k0 = int(min(a, servers) - _FLUID_START * math.sqrt(a)) if a > 4 * _FLUID_START**2 else 0
    k0 = max(k0, 0)
    b = 1.0 - k0 / a if k0 else 1.0
    for k in range(k0 + 1, servers + 1):
        b = a * b / (k + a * b)
        if b < _NEGLIGIBLE_B:
            return 0.0
    return b


def pool_wait_quantile(
    servers: int, rate: float, service_s: float, cv2: float, quantile: float
) -> float:
    """The `quantile` wait of an M/G/c queue: waits with probability `C` (Erlang C), and the
    wait, when there is one, taken as exponential with rate `(c/S − λ)·2/(1 + cv²)` (the M/M/c
    tail with the Allen-Cunneen factor for the service's spread). For c = 1 it is the M/G/1
    rule of `prefill_tail_utilization` (Pollaczek-Khinchine mean). Infinite when overloaded."""
    spare = servers / service_s - rate
    if spare <= 0:
        return math.inf
    c = erlang_c(servers, rate * service_s)
    if c <= 1 - quantile:
        return 0.0
    return (1 + cv2) / (2 * spare) * math.log(c / (1 - quantile))


def prefill_tail_workers(
    rate: float, service_s: float, cv2: float, quantile: float, budget_s: float, cap: float
) -> float:
    """Prefill workers (fractional) for an M/G/c pool (`pool_wait_quantile`) whose `quantile`
    wait plus the mean service fits `budget_s`, each at most at `cap` utilisation.

    Rounded up, it is the fewest workers that fit. The fraction keeps the size continuous in
    the load, so the hysteresis can act (a pool needing a third of a worker is not one full
    worker's work): within one worker it is `rate·S / ρ*` (ρ*: the largest one-worker
    utilisation that fits, the M/G/1 rule); beyond, it interpolates between the largest pool
    that misses and the smallest that fits by how far each is from the budget. `rate·S /
    min(cap, 0.1)` when even an idle worker misses the budget (as `prefill_tail_utilization`'s
    floor). Non-decreasing in `rate`, `cv2` and `quantile`."""
    offered = rate * service_s
    if offered <= 0:
        return 0.0
    if budget_s <= service_s:
        return offered / min(cap, 0.1)

    def excess(c: int) -> float:
        return service_s + pool_wait_quantile(c, rate, service_s, cv2, quantile) - budget_s

    c = max(1, math.floor(offered) + 1)  # the fewest that are not overloaded
    while excess(c) > 0:
        c += 1
    if c == 1:
        frac = offered / prefill_tail_utilization(service_s, cv2, quantile, budget_s, 0.999)
    else:
        over, under = excess(c - 1), excess(c)
        frac = c - 1 + (1.0 if math.isinf(over) else over / (over - under))
    return max(frac, offered / cap)


def prefill_work(
    rate: float,
    mean_prompt: float,
    perf: AladdinPerfModel,
    ttft_s: float,
    budget_fraction: float,
    cap: float,
    *,
    tail_fraction: float = 0.0,
    prompt_cv2: float = 0.0,
    quantile: float = 0.9,
    pooled: bool = False,
) -> float:
    """Prefill workers needed (fractional) for `rate` requests/s at the TTFT target: the mean
    wait within `budget_fraction` of it (M/D/1) and, when `tail_fraction` > 0, the `quantile`
    wait within `tail_fraction` of it (with the prompts' spread, `prompt_cv2`): per worker
    (M/G/1) or, with `pooled`, over the pool (M/G/c, `prefill_tail_workers`)."""
    service = perf.prefill_s(mean_prompt)
    if rate <= 0 or service <= 0:
        return 0.0
    rho = prefill_utilization(service, ttft_s * budget_fraction, cap)
    if tail_fraction <= 0:
        return rate * service / rho
    # The service time's cv² from the prompt lengths' (S = k₁·l + c₁: the constant damps it).
    scale = (service - perf.prefill_s(0.0)) / service if service > 0 else 0.0
    cv2 = prompt_cv2 * scale * scale
    if pooled:
        workers = prefill_tail_workers(rate, service, cv2, quantile, ttft_s * tail_fraction, cap)
        return max(rate * service / rho, workers)
    tail = prefill_tail_utilization(service, cv2, quantile, ttft_s * tail_fraction, cap)
    return rate * service / min(rho, tail)


def decode_work(rate: float, stats: LengthStats, perf: AladdinPerfModel, tpot_s: float) -> float:
    """Decode workers needed (fractional, at 100 %) for `rate` requests/s at the TPOT target."""
    if rate <= 0:
        return 0.0
    params = PlannerParams(atgt_slo_s=tpot_s)
    per_worker = per_gpu_throughput(perf, stats, params) * perf.num_gpus
    if per_worker <= 0:
        # The worker cannot meet the TPOT target at any batch: size by raw decode speed and let
        # the SLO feedback report it (never divide by zero, never claim zero work).
        per_worker = 1.0 / max(perf.decode_s(stats.mean_context, 1), _EPS)
    return rate * stats.mean_output_tokens / per_worker


def work_by_role(
    roles: tuple[Role, ...],
    rate: float,
    stats: LengthStats,
    perf: AladdinPerfModel,
    targets: Targets,
    params: AutoscalerParams,
    prompt_cv2: float | None = None,
) -> dict[Role, float]:
    """Worker-equivalents of work per role at `rate`, before the utilisation margin."""
    pre = prefill_work(
        rate,
        stats.mean_prompt_tokens,
        perf,
        targets.ttft_s,
        params.ttft_budget_fraction,
        params.target_utilization,
        tail_fraction=params.ttft_tail_fraction,
        prompt_cv2=params.default_prompt_cv2 if prompt_cv2 is None else prompt_cv2,
        quantile=targets.quantile,
        pooled=params.pooled_tail,
    )
    # prefill_work already holds its own utilisation; express it at 100 % like decode's.
    pre *= params.target_utilization
    dec = decode_work(rate, stats, perf, targets.tpot_s)
    out: dict[Role, float] = {}
    has_p, has_d = Role.PREFILL in roles, Role.DECODE in roles
    for role in roles:
        if role is Role.PREFILL:
            out[role] = pre
        elif role is Role.DECODE:
            out[role] = dec + (0.0 if has_p else pre)
        else:  # mixed: whatever the split pools do not cover
            out[role] = (0.0 if has_p else pre) + (0.0 if has_d else dec)
    return out


def backlog_rate(queued: int, params: AutoscalerParams) -> float:
    """The extra arrival rate that clears `queued` requests waiting at the router within one
    forecast horizon (at least one interval): `queued / max(horizon_s, interval_s)`. The
    window's arrival rate already counts them once (as arrivals); this is the capacity beyond
    the arrivals' that the backlog needs to drain. Linear, 0 for an empty queue."""
    return max(0, queued) / max(params.horizon_s, params.interval_s)


def decode_occupancy(
    pool: PoolSignal | None,
    stats: LengthStats,
    perf: AladdinPerfModel,
    tpot_s: float,
    waiting: int = 0,
) -> float:
    """Worker-equivalents the decode workers hold now (0 when they report nothing): the larger
    of their summed KV use and their requests (running + queued, plus `waiting`: requests held
    at the router, each of which will be decoded) over the batch that still decodes within
    `tpot_s` (the model's `slo_batch` at the mean context)."""
    if pool is None or not pool.workers:
        return 0.0
    kv = sum(w.kv_used for w in pool.workers if w.kv_used is not None)
    batch = perf.slo_batch(tpot_s, stats.mean_context)
    held = sum(w.work for w in pool.workers) + max(0, waiting)
    return max(kv, held / batch if batch >= 1 else 0.0)


# -- forecast -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Forecast:
    """Holt's linear smoothing of the arrival rate."""

    level: float | None = None
    trend: float = 0.0

    def update(self, rate: float, params: AutoscalerParams) -> Forecast:
        if self.level is None:
            return Forecast(rate, 0.0)
        a, b = params.forecast_alpha, params.forecast_beta
        level = a * rate + (1 - a) * (self.level + self.trend)
        trend = b * (level - self.level) + (1 - b) * self.trend
        return Forecast(level, trend)

    def ahead(self, params: AutoscalerParams) -> float:
        """The rate `horizon_s` ahead (>= 0)."""
        if self.level is None:
            return 0.0
        return max(0.0, self.level + self.trend * params.horizon_s / params.interval_s)


# -- state and decisions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    forecast: Forecast = field(default_factory=Forecast)
    since_s: float | None = None
    """When the loop first saw a usable observation (scale-down needs a whole window of it)."""
    history: tuple[tuple[float, Role, int], ...] = ()
    """(time, role, scale-down recommendation) within the (longest) stabilization window."""
    lengths: tuple[float, float, float | None] | None = None
    """The smoothed mean prompt / output tokens and prompt cv² (`length_alpha`)."""
    backoff: tuple[tuple[Role, float, float, float | None], ...] = ()
    """Per role: (stabilization multiplier, since when it holds, last scale-down time)."""
    serving: tuple[tuple[Role, int, float | None], ...] = ()
    """Per role: (serving workers last seen, when that count last rose; None: not seen to)."""
    queue_trend: tuple[int, int] | None = None
    """The router's queue at the last usable tick and at how many ticks in a row it had grown
    (None: unknown then)."""
    sized_rate: float | None = None
    """The rate the last usable tick sized the pools for (`hold_down_on_rise`)."""

    def serving_of(self, role: Role) -> tuple[int | None, float | None]:
        for r, n, rose in self.serving:
            if r is role:
                return n, rose
        return None, None

    def backoff_of(self, role: Role) -> tuple[float, float | None, float | None]:
        for r, mult, since, down in self.backoff:
            if r is role:
                return mult, since, down
        return 1.0, None, None


@dataclass(frozen=True, slots=True)
class PoolDecision:
    role: Role
    current: int
    desired: int
    kind: Kind
    reason: str
    work: float = 0.0
    """Worker-equivalents of work at 100 % utilisation (forecast rate)."""
    up_target: int = 0
    """Workers at `target_utilization`, bounded."""
    down_target: int = 0
    """The stabilized scale-down recommendation (largest over the window), bounded."""
    pressure: str = ""
    """Why the role is under SLO / queue pressure ('' when it is not)."""

    @property
    def headroom(self) -> int:
        """Workers the pool could give away now without breaking its scale-down rule."""
        if self.pressure or self.desired > self.current:
            return 0
        return max(0, self.current - self.down_target)


@dataclass(frozen=True, slots=True)
class Decision:
    time_s: float
    pools: Mapping[Role, PoolDecision]
    held: str = ""
    """Non-empty when the loop did nothing because its signals are missing or stale."""
    at_risk: tuple[str, ...] = ()
    """One actionable line per SLO class at risk."""
    rate_per_s: float | None = None
    forecast_per_s: float | None = None

    @property
    def desired(self) -> dict[Role, int]:
        return {r: p.desired for r, p in self.pools.items()}

    def changes(self) -> list[PoolDecision]:
        return [p for p in self.pools.values() if p.desired != p.current]


def _side(role_of: str, roles: tuple[Role, ...]) -> Role | None:
    """The pool responsible for TTFT ('prefill') or TPOT ('decode') work."""
    order = {
        "prefill": (Role.PREFILL, Role.MIXED, Role.DECODE),
        "decode": (Role.DECODE, Role.MIXED),
    }[role_of]
    return next((r for r in order if r in roles), None)


def _fmt_s(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.3g} s"


def queue_trend(obs: Observation, last: tuple[int, int] | None) -> tuple[int, int] | None:
    """The router's queue now and at how many consecutive ticks it grew, from the last tick's
    (`AutoscalerState.queue_trend`). Grew: strictly larger than the last reading. An unknown
    reading (now or then) starts over: unknown is no trend."""
    q = obs.router_queue
    if q is None:
        return None
    if last is None:
        return (q, 0)
    return (q, last[1] + 1 if q > last[0] else 0)


def drained_backlog(obs: Observation) -> tuple[int, int] | None:
    """`(finished, arrived)` in the window when it drained a backlog that is gone now: more
    requests finished than arrived (the rest arrived before the window, queued), and the
    router's queue is known empty and no worker has a request waiting. None otherwise (an
    unknown router queue or rate is not known to be drained)."""
    if obs.router_queue != 0 or obs.arrival_rate_per_s is None:
        return None
    if any(p.queued for p in obs.pools.values()):
        return None
    finished = sum(c.requests for c in obs.classes)
    arrived = math.floor(max(0.0, obs.arrival_rate_per_s) * obs.window_s + _EPS)
    return (finished, arrived) if finished > arrived else None


def _fresh_misses(c: ClassSignal, finished: int, arrived: int, params: AutoscalerParams) -> bool:
    """Whether a class's misses in a drained window still count: the requests of the class that
    arrived in the window (at most `arrived`) are at least `min_samples`, and even if every late
    one (`finished − arrived`, arrived before the window) missed, the rest missed more than the
    class allows (`1 − min(attainment target, percentile)` of them)."""
    fresh = min(c.requests, arrived)
    if fresh < params.min_samples or c.attainment is None:
        return False
    missed = round(c.requests * (1.0 - c.attainment))
    fresh_missed = missed - min(c.requests, finished - arrived)
    return fresh_missed > (1.0 - min(c.attainment_target, c.percentile)) * fresh + _EPS


def late_misses(obs: Observation, params: AutoscalerParams) -> str:
    """Why the window's SLO misses are not pressure ('' when they are, or there are none): they
    are of a backlog that drained (`drained_backlog`), and the window's own arrivals cannot
    account for them (`_fresh_misses`)."""
    drained = drained_backlog(obs)
    if drained is None:
        return ""
    finished, arrived = drained
    names = [
        c.name
        for c in obs.class_at_risk()
        if c.requests >= params.min_samples and not _fresh_misses(c, finished, arrived, params)
    ]
    if not names:
        return ""
    return (
        f"SLO misses of class {', '.join(names)} not counted: a drained backlog "
        f"({finished} finished, {arrived} arrived in the {obs.window_s:.0f} s window, "
        "queues empty now)"
    )


def pressure_by_role(
    obs: Observation,
    params: AutoscalerParams,
    last_queue: tuple[int, int] | None = None,
) -> dict[Role, str]:
    """Which roles are under pressure, and why (SLO misses with enough samples, queues, the
    router's queue growing since `last_queue`, the last tick's `queue_trend`).

    The window counts a request when it finishes, so after a burst its queued requests miss in
    the windows after it, when the load is gone. Once that backlog drained (`drained_backlog`:
    more finished than arrived, every queue empty now), a class's misses count only if the
    window's own arrivals account for them (`_fresh_misses`; `late_misses` says which do not)."""
    roles = tuple(obs.pools)
    out: dict[Role, list[str]] = {}
    drained = drained_backlog(obs)
    for c in obs.classes:
        if c.requests < params.min_samples:
            continue
        if drained is not None and not _fresh_misses(c, *drained, params):
            continue
        pct = f"p{round(c.percentile * 100)}"
        ttft_role, tpot_role = _side("prefill", roles), _side("decode", roles)
        if c.ttft_missed() and ttft_role is not None:
            assert c.ttft_s is not None
            assert c.ttft_target_s is not None
            line = f"class {c.name}: TTFT {pct} {_fmt_s(c.ttft_s)} > {_fmt_s(c.ttft_target_s)}"
            out.setdefault(ttft_role, []).append(line)
            # The first token also waits for the decode side (KV pull, admission): when decode
            # workers have requests queued, they share the blame.
            dec = obs.pools.get(Role.DECODE) if ttft_role is Role.PREFILL else None
            dq = dec.queued if dec is not None else None
            if dec is not None and dq is not None and dec.current > 0 and dq > dec.current:
                out.setdefault(Role.DECODE, []).append(f"{line}; decode queue {dq}")
        if c.tpot_missed() and tpot_role is not None:
            assert c.tpot_s is not None
            assert c.tpot_target_s is not None
            out.setdefault(tpot_role, []).append(
                f"class {c.name}: TPOT {pct} {_fmt_s(c.tpot_s)} > {_fmt_s(c.tpot_target_s)}"
            )
        if c.attainment_missed() and not (c.ttft_missed() or c.tpot_missed()):
            assert c.attainment is not None
            # Latency percentiles met but attainment not: the tail misses. Blame the side
            # whose observed latency is closest to its target.
            side = "decode"
            if (
                c.ttft_s is not None
                and c.ttft_target_s
                and c.tpot_s is not None
                and c.tpot_target_s
                and c.ttft_s / c.ttft_target_s >= c.tpot_s / c.tpot_target_s
            ):
                side = "prefill"
            role = _side(side, roles)
            if role is not None:
                out.setdefault(role, []).append(
                    f"class {c.name}: attainment {c.attainment:.1%} < {c.attainment_target:.0%}"
                )
    # Requests held at the router's admission gate wait for the side that takes new requests
    # (prefill, else mixed, else decode): its queue is theirs plus its workers'.
    entry = _side("prefill", roles)
    for role, pool in obs.pools.items():
        q = pool.queued
        held = (obs.router_queue or 0) if role is entry else 0
        if held:
            q = (q or 0) + held
        if q is not None and pool.current > 0 and q > params.queue_per_worker * pool.current:
            what = f"{role.value} queue {q}" + (f" ({held} at the router)" if held else "")
            out.setdefault(role, []).append(f"{what} > {params.queue_per_worker:g} per worker")
        elif role is entry and held and last_queue is not None and params.queue_growth_ticks:
            # Below the size threshold, a queue growing tick after tick is demand outrunning
            # admission: it will cross the threshold, later.
            trend = queue_trend(obs, last_queue)
            if trend is not None and trend[1] >= params.queue_growth_ticks:
                out.setdefault(role, []).append(
                    f"router queue growing {last_queue[0]} -> {held} (at the router, "
                    f"{trend[1]} ticks in a row)"
                )
    return {r: "; ".join(v) for r, v in out.items()}


def burst_rate(mean: float, peak: float | None, weight: float, noise: float = 0.0) -> float:
    """The rate sized for: `mean + weight × (peak − mean − noise)`; the mean when no peak is
    known (a peak below `mean + noise` is treated as the mean). `noise`: the part of the peak's
    excess that is Poisson variation (`poisson_peak_excess`), 0: none deducted."""
    if peak is None or peak <= mean + noise:
        return mean
    return mean + weight * (peak - mean - noise)


def poisson_peak_excess(mean: float, window_s: float, sub_s: float) -> float:
    """How far the busiest of `k = window_s / sub_s` sub-windows of a Poisson stream at `mean`
    requests/s is expected to read above the mean: the expected largest of `k` standard normals
    (Blom's approximation `Φ⁻¹((k − 0.375)/(k + 0.25))`) times a sub-window rate's standard
    deviation `√(mean / sub_s)`. 0 for one sub-window. Grows like `√mean`, so relative to the
    rate it shrinks as the load grows: what a proportional headroom gets wrong."""
    k = math.floor(window_s / sub_s + 1e-9)
    if k <= 1 or mean <= 0:
        return 0.0
    z = NormalDist().inv_cdf((k - 0.375) / (k + 0.25))
    return max(0.0, z) * math.sqrt(mean / sub_s)


def band_workers(work: float, work_high: float, params: AutoscalerParams) -> int:
    """The size the pool may scale down to (unbounded): the fixed band (`work /
    scale_down_utilization`), or with `band_z` > 0 the size that runs `work_high` (the work at
    the rate `z` standard errors above the window's reading, `noisy_rate`) at
    `target_utilization`: never more than the fixed band's, never fewer than the scale-up
    count. Both counts are monotone in the rate, so their minimum is too."""
    fixed = math.ceil(work / params.scale_down_utilization - _EPS)
    if params.band_z <= 0:
        return fixed
    up = math.ceil(work / params.target_utilization - _EPS)
    return min(fixed, max(up, math.ceil(work_high / params.target_utilization - _EPS)))


def noisy_rate(sized: float, observed: float, window_s: float, z: float) -> float:
    """`sized` plus `z` standard errors of a Poisson rate read over `window_s`
    (`√(observed / window_s)`): increasing in both rates."""
    return sized + z * math.sqrt(max(0.0, observed) / window_s) if window_s > 0 else sized


def _smooth_lengths(
    obs: Observation, last: tuple[float, float, float | None] | None, alpha: float
) -> tuple[float, float, float | None]:
    """The length mix sized for: the observation's, exponentially averaged with `last`."""
    assert obs.mean_prompt_tokens is not None
    assert obs.mean_output_tokens is not None
    new = (obs.mean_prompt_tokens, obs.mean_output_tokens, obs.prompt_tokens_cv2)
    if last is None or alpha >= 1:
        return new
    cv2 = new[2] if last[2] is None or new[2] is None else alpha * new[2] + (1 - alpha) * last[2]
    return (alpha * new[0] + (1 - alpha) * last[0], alpha * new[1] + (1 - alpha) * last[1], cv2)


def decide(
    obs: Observation,
    state: AutoscalerState,
    perf: AladdinPerfModel,
    params: AutoscalerParams,
    targets: Targets | None = None,
) -> tuple[Decision, AutoscalerState]:
    """One tick: the desired size of each pool in `obs.pools`, and the next state.

    An unusable observation (missing / stale signals) changes nothing, not even the state,
    except for pools outside their bounds, which are still brought back within them.

    Before the first request finishes (`Observation.no_finish_yet`, no other problem) the loop
    acts on what it knows (`before_first_finish`): the prefill side is sized from the arrival
    rate, the router's queue and the prompts as always (its work needs no output length);
    queue pressure (the router's queue above `queue_per_worker` per worker or growing, a
    pool's own queue) adds a worker per tick as always; decode, whose modelled work needs the
    output lengths, is sized from what its workers hold (`decode_occupancy`, the router's
    queue counted, read at the prompt's context), so an idle decode worker is headroom the
    flipper may use; a mixed pool acts on its queue only; nothing scales down, and the window
    of watching that a scale-down needs starts at the first usable observation. Each reason
    starts with "no request finished yet". Without any change or pressure the decision is a
    hold as before (`Decision.held`), but the state keeps the rate's forecast and the queue's
    trend.
    """
    now = obs.time_s
    bounds = {r: Bounds(p.min_replicas, p.max_replicas) for r, p in obs.pools.items()}
    blind = before_first_finish(obs)
    if not obs.usable and not blind:
        why = obs.why_unusable()
        held: dict[Role, PoolDecision] = {}
        for role, p in obs.pools.items():
            want = bounds[role].clamp(p.current)
            kind = Kind.BOUNDS if want != p.current else Kind.NO_SIGNAL
            reason = (
                f"{role.value} {p.current} -> {want}: outside min/max"
                if want != p.current
                else f"{role.value} held at {p.current}: {why}"
            )
            held[role] = PoolDecision(role, p.current, want, kind, reason)
        return Decision(now, held, held=why), state
    assert obs.arrival_rate_per_s is not None

    rate = max(0.0, obs.arrival_rate_per_s)
    forecast = state.forecast.update(rate, params)
    sub_s = obs.arrival_rate_peak_window_s
    noise = (
        poisson_peak_excess(rate, obs.window_s, sub_s)
        if params.burst_poisson and sub_s is not None and sub_s > 0
        else 0.0
    )
    burst = burst_rate(rate, obs.arrival_rate_peak_per_s, params.burst_weight, noise)
    rate_f = max(burst, forecast.ahead(params))
    rising = params.hold_down_on_rise and state.sized_rate is not None and rate_f > state.sized_rate
    if blind:
        # No output length yet: only the prefill side's work (prompts) is sized; a placeholder
        # output length that no sized number below reads.
        lengths = (obs.mean_prompt_tokens or 0.0, 1.0, obs.prompt_tokens_cv2)
    else:
        lengths = _smooth_lengths(obs, state.lengths, params.length_alpha)
    stats = LengthStats(max(0.0, lengths[0]), max(1.0, lengths[1]))
    tgt = targets or Targets.of(obs.classes)
    roles = tuple(obs.pools)
    # The router's queue is demand no worker shows: its requests are sized as extra arrivals
    # that clear within one horizon (`backlog_rate`), and count as decode's in-flight work.
    backlog = obs.router_queue or 0
    extra = backlog_rate(backlog, params)
    work = work_by_role(roles, rate_f + extra, stats, perf, tgt, params, lengths[2])
    sized: set[Role] = set()
    if blind:
        # Known: the prefill pool's work, when the window has prompts, and what the decode
        # workers hold now (their occupancy, the router's queue included: each request will
        # be decoded). A mixed pool's work needs the output lengths: unknown, 0 here (it acts
        # on its queue only and keeps its size).
        if obs.mean_prompt_tokens is not None and Role.PREFILL in work:
            sized.add(Role.PREFILL)
        if Role.DECODE in work and Role.PREFILL in work:
            sized.add(Role.DECODE)
            work[Role.DECODE] = decode_occupancy(
                obs.pools.get(Role.DECODE), stats, perf, tgt.tpot_s, waiting=backlog
            )
        work = {r: (w if r in sized else 0.0) for r, w in work.items()}
    work_high = work
    if params.band_z > 0 and not blind:
        high = noisy_rate(rate_f, rate, obs.window_s, params.band_z) + extra
        work_high = work_by_role(roles, high, stats, perf, tgt, params, lengths[2])
    if params.occupancy_floor and Role.DECODE in work and not blind:
        occupied = decode_occupancy(
            obs.pools.get(Role.DECODE), stats, perf, tgt.tpot_s, waiting=backlog
        )
        work[Role.DECODE] = max(work[Role.DECODE], occupied)
        work_high[Role.DECODE] = max(work_high[Role.DECODE], occupied)
    pressure = pressure_by_role(obs, params, state.queue_trend)
    late = late_misses(obs, params)
    since = state.since_s if state.since_s is not None or blind else now
    watched_long_enough = (
        since is not None and now - since >= params.scale_down_stabilization_s - _EPS
    )
    longest = params.scale_down_stabilization_s * params.max_backoff
    history = [h for h in state.history if h[0] > now - longest - _EPS]
    backoff: list[tuple[Role, float, float, float | None]] = []
    serving: list[tuple[Role, int, float | None]] = []
    pools: dict[Role, PoolDecision] = {}
    for role, p in obs.pools.items():
        mult, mult_since, last_down = state.backoff_of(role)
        # A stabilization window passed at this multiplier without a reversal: relax it.
        window_s = params.scale_down_stabilization_s * mult
        while mult > 1 and mult_since is not None and now - mult_since >= window_s - _EPS:
            mult_since += window_s
            mult = max(1.0, mult / params.reversal_backoff)
            window_s = params.scale_down_stabilization_s * mult
        window_start = now - window_s
        b = bounds[role]
        w = work[role]
        up_target = b.clamp(math.ceil(w / params.target_utilization - _EPS))
        down_now = b.clamp(band_workers(w, work_high[role], params))
        why = pressure.get(role, "")
        starting = p.ready is not None and p.ready < p.current
        now_serving = p.ready if p.ready is not None else p.current
        last_seen, rose = state.serving_of(role)
        if last_seen is not None and now_serving > last_seen:
            rose = now
        serving.append((role, now_serving, rose))
        settling = params.feedback_settle and rose is not None and now - rose < obs.window_s - _EPS
        if why:
            # One more worker per tick of pressure, unless workers already on their way (started
            # or flipping in, not serving yet) are still to show their effect, or (with
            # `feedback_settle`) started serving less than a window ago.
            if not starting and not settling:
                # One more per tick. (Sizing for the whole queue at once was tried: it
                # overshot on the traces' bursts, 1.5x the GPU-hours for no attainment gain.)
                up_target = max(up_target, b.clamp(p.current + 1))
            down_now = max(down_now, p.current)
        # Never recommend scaling down below what this tick scales up to (pressure can lift the
        # up target above the model's scale-down count): the window then holds the new size.
        down_now = max(down_now, up_target)
        if blind and role not in sized:
            down_now = max(down_now, p.current)  # no headroom on a work not known
        history.append((now, role, down_now))
        down_target = max(h[2] for h in history if h[1] is role and h[0] > window_start - _EPS)
        seen = f"observed {rate:.3g}" + (f", burst {burst:.3g}" if burst > rate else "")
        if params.burst_weight > 0 and obs.arrival_rate_peak_per_s is None:
            seen += ", no burst peak" + (f" ({obs.peak_problem})" if obs.peak_problem else "")
        if backlog:
            seen += f", router queue {backlog} (+{extra:.3g} req/s to clear it)"
        basis = (
            f"forecast {rate_f:.3g} req/s ({seen}), "
            f"prompt {stats.mean_prompt_tokens:.0f} / output {stats.mean_output_tokens:.0f} "
            f"tokens: {w:.2f} worker-equivalents"
        )
        if blind:
            if role is Role.PREFILL and role in sized:
                basis = (
                    f"forecast {rate_f:.3g} req/s ({seen}), prompt "
                    f"{stats.mean_prompt_tokens:.0f} tokens: {w:.2f} worker-equivalents"
                )
            elif role in sized:
                basis = f"decode workers hold {w:.2f} worker-equivalents (output lengths unknown)"
            else:
                basis = f"{role.value} not sized without output lengths"
        cur = p.current
        if b.clamp(cur) != cur:
            desired, kind = b.clamp(cur), Kind.BOUNDS
            reason = (
                f"{role.value} {cur} -> {desired}: "
                f"outside min {b.min_replicas} / max {b.max_replicas}"
            )
        elif up_target > cur:
            step = max(params.max_step_up, math.ceil(cur * params.max_step_up_fraction))
            desired, kind = min(up_target, cur + step), Kind.SCALE_UP
            cause = f"{basis} at {params.target_utilization:.0%}"
            if why:
                cause = f"under pressure ({why}); {cause}"
            reason = f"{role.value} {cur} -> {desired}: {cause}"
        elif down_target < cur and not why and watched_long_enough and not rising:
            desired = max(down_target, cur - params.max_step_down)
            kind = Kind.SCALE_DOWN
            reason = (
                f"{role.value} {cur} -> {desired}: {basis}; at most {down_target} wanted for "
                f"{window_s:g} s at {params.scale_down_utilization:.0%}"
            )
        else:
            desired, kind = cur, Kind.HOLD
            if why and b.max_replicas is not None and cur >= b.max_replicas:
                reason = f"{role.value} held at max {cur}: {why}"
            elif why and starting:
                reason = (
                    f"{role.value} held at {cur}: {why}; waiting for "
                    f"{cur - (p.ready or 0)} worker(s) to start serving"
                )
            elif why and settling:
                assert rose is not None
                reason = (
                    f"{role.value} held at {cur}: {why}; workers added {now - rose:.0f} s ago, "
                    f"waiting a {obs.window_s:g} s window for their effect"
                )
            elif down_target < cur and rising and watched_long_enough:
                assert state.sized_rate is not None
                reason = (
                    f"{role.value} held at {cur}: sized rate rising "
                    f"{state.sized_rate:.3g} -> {rate_f:.3g} req/s; {basis}"
                )
            elif down_target < cur and not watched_long_enough:
                reason = (
                    f"{role.value} held at {cur}: watched < {params.scale_down_stabilization_s:g} s"
                )
            else:
                reason = f"{role.value} held at {cur}: {basis}"
        if late and not why and kind is not Kind.BOUNDS:
            reason += f"; {late}"
        if blind and kind is not Kind.BOUNDS:
            head, _, tail = reason.partition(": ")
            reason = f"{head}: {NO_FINISH_YET}; {tail}"
        if kind is Kind.SCALE_DOWN:
            last_down = now
        elif (
            kind is Kind.SCALE_UP
            and params.reversal_backoff > 1
            and last_down is not None
            and now - last_down < window_s - _EPS
        ):
            # A reversal: the load came back within the window this pool shrank in.
            mult = min(params.max_backoff, mult * params.reversal_backoff)
            mult_since = now
            reason += (
                f"; reversed a scale-down {now - last_down:.0f} s ago: scale-down now waits "
                f"{params.scale_down_stabilization_s * mult:g} s"
            )
        backoff.append((role, mult, mult_since if mult_since is not None else now, last_down))
        pools[role] = PoolDecision(role, cur, desired, kind, reason, w, up_target, down_target, why)

    pools = _keep_one_finisher(pools, bounds, rate, backlog, blind)
    at_risk = _risk_lines(obs, pools)
    # Before the first finish the lengths are a placeholder: the smoothed mix stays as it was.
    smoothed = state.lengths if blind else (lengths if params.length_alpha < 1 else None)
    new_state = AutoscalerState(
        forecast,
        since,
        tuple(history),
        smoothed,
        tuple(backoff),
        tuple(serving),
        queue_trend(obs, state.queue_trend),
        rate_f,
    )
    held_why = ""
    if blind and not any(p.desired != p.current or p.pressure for p in pools.values()):
        # Nothing to act on yet: a hold, as before, but with the state's forecast and queue
        # trend kept (growth is seen from the next tick on).
        held_why = obs.why_unusable()
        pools = {
            r: replace(p, kind=Kind.NO_SIGNAL, reason=f"{r.value} held at {p.current}: {held_why}")
            for r, p in pools.items()
        }
    return Decision(now, pools, held_why, at_risk, rate, rate_f), new_state


NO_FINISH_YET = "no request finished yet"


def _keep_one_finisher(
    pools: dict[Role, PoolDecision],
    bounds: Mapping[Role, Bounds],
    rate: float,
    backlog: int,
    blind: bool,
) -> dict[Role, PoolDecision]:
    """At least one worker that can finish a request (decode or mixed) while requests arrive
    or wait at the router.

    Prefill workers only hand their KV on, so a service whose decode-capable pools are all at
    zero answers every request 503, and before the first finish nothing would size decode
    (its work needs the output lengths): from zero (`minReplicas: 0` everywhere, an idle
    service scaled to zero, the loop restarted) the loop added prefill workers and never a
    decode one. So when requests arrive (or wait) and no decode-capable pool is wanted at one
    or more, one is raised to one, decode where a prefill pool hands off to it, else mixed,
    within its max; it is also kept out of the flipper's headroom. An idle service (no
    arrival in the window, no queue) may still scale to zero where the bounds allow it."""
    finishers = [r for r in (Role.DECODE, Role.MIXED) if r in pools]
    if (rate <= 0 and backlog <= 0) or any(pools[r].desired >= 1 for r in finishers):
        return pools
    for role in finishers:
        b = bounds[role]
        if b.clamp(1) < 1:
            continue  # max 0: this pool may not run
        p = pools[role]
        demand = f"{rate:.3g} req/s arriving" + (
            f", {backlog} waiting at the router" if backlog else ""
        )
        if p.current >= 1:
            kind = Kind.HOLD
            reason = (
                f"{role.value} held at {p.current}: the last worker that can finish a request "
                f"({demand}; prefill workers only hand off)"
            )
        else:
            kind = Kind.SCALE_UP
            reason = (
                f"{role.value} 0 -> 1: no worker can finish a request ({demand}; prefill "
                "workers only hand off)"
            )
        if blind:
            head, _, tail = reason.partition(": ")
            reason = f"{head}: {NO_FINISH_YET}; {tail}"
        desired = max(1, p.desired)
        pools = dict(pools)
        pools[role] = replace(
            p,
            desired=desired,
            kind=kind,
            reason=reason,
            up_target=max(p.up_target, 1),
            down_target=max(p.down_target, 1),
        )
        return pools
    return pools


def before_first_finish(obs: Observation) -> bool:
    """Whether the autoscaler acts on an observation without output lengths: requests arrived
    and none finished yet (`Observation.no_finish_yet`), no signal missing or stale otherwise,
    and the arrival rate known."""
    return (
        obs.no_finish_yet
        and not obs.problems
        and obs.arrival_rate_per_s is not None
        and obs.mean_output_tokens is None
    )


def _risk_lines(obs: Observation, pools: Mapping[Role, PoolDecision]) -> tuple[str, ...]:
    """`class chat: TTFT p90 2.4 s > 2 s; prefill pool at max 8` — one line per class at risk."""
    roles = tuple(pools)
    lines = []
    for c in obs.class_at_risk():
        pct = f"p{round(c.percentile * 100)}"
        parts = []
        sides = []
        if c.ttft_missed():
            assert c.ttft_s is not None
            assert c.ttft_target_s is not None
            parts.append(f"TTFT {pct} {_fmt_s(c.ttft_s)} > {_fmt_s(c.ttft_target_s)}")
            sides.append(_side("prefill", roles))
        if c.tpot_missed():
            assert c.tpot_s is not None
            assert c.tpot_target_s is not None
            parts.append(f"TPOT {pct} {_fmt_s(c.tpot_s)} > {_fmt_s(c.tpot_target_s)}")
            sides.append(_side("decode", roles))
        if c.attainment_missed():
            assert c.attainment is not None
            parts.append(f"attainment {c.attainment:.1%} < {c.attainment_target:.0%}")
        line = f"class {c.name}: " + ", ".join(parts)
        for role in dict.fromkeys(s for s in sides if s is not None):
            line += _what_the_pool_does(role, pools[role], obs.pools[role].max_replicas)
        lines.append(line)
    entry = _side("prefill", roles)
    if entry is not None and obs.router_queue and "at the router" in pools[entry].pressure:
        # Demand held at the router's gate is at risk before any class's finished requests
        # show it (they finish late, or are shed).
        d = pools[entry]
        line = f"router queue {obs.router_queue} waiting: {d.pressure}"
        lines.append(line + _what_the_pool_does(entry, d, obs.pools[entry].max_replicas))
    return tuple(lines)


def _what_the_pool_does(role: Role, d: PoolDecision, max_replicas: int | None) -> str:
    """The tail of an SLO-at-risk line: the pool at its maximum, or scaling up, or nothing."""
    if max_replicas is not None and d.desired >= max_replicas:
        return f"; {role.value} pool at max {max_replicas}"
    if d.desired > d.current:
        return f"; scaling {role.value} {d.current} -> {d.desired}"
    return ""


def with_desired(decision: Decision, role: Role, desired: int, kind: Kind, reason: str) -> Decision:
    """A copy of `decision` with one pool's outcome replaced (the flipper's edits)."""
    pools = dict(decision.pools)
    pools[role] = replace(pools[role], desired=desired, kind=kind, reason=reason)
    return replace(decision, pools=pools)

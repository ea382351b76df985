"""The local control loop over a fake fleet: a load step starts a worker within two ticks and
it is stopped after the stabilization window."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from splitserve.cli.autoscale_local import LocalLoop, LocalWorker, loop_params
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.operator.control.signals import ClassTargets
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    Decision,
    live_params,
    poisson_peak_excess,
)
from splitserve.policy.planner.signals import WorkerLoad
from tests.fakes.router_metrics import FakeRouterMetrics


class FakeFleet:
    def __init__(self) -> None:
        self.ws: dict[str, LocalWorker] = {}
        self.n = 0
        self.calls: list[str] = []
        for role in (Role.PREFILL, Role.DECODE):
            self.start(role)

    def workers(self) -> Sequence[LocalWorker]:
        return list(self.ws.values())

    def start(self, role: Role) -> str:
        name = f"w{self.n}"
        self.n += 1
        self.ws[name] = LocalWorker(name, role, f"127.0.0.1:{7000 + self.n}")
        self.calls.append(f"start {role.value}")
        return name

    def stop(self, name: str) -> None:
        self.calls.append(f"stop {self.ws.pop(name).role.value}")

    def set_role(self, name: str, role: Role) -> None:
        w = self.ws[name]
        self.ws[name] = LocalWorker(w.name, role, w.address)
        self.calls.append(f"flip {name} {role.value}")


class Loads:
    def load(self, address: str) -> WorkerLoad:
        return WorkerLoad(address, Role.MIXED, 0, 1, 0.1)


STEP_PARAMS = AutoscalerParams(interval_s=5.0, scale_down_stabilization_s=30.0, horizon_s=5.0)


def _step_loop(
    fleet: FakeFleet, router: FakeRouterMetrics, now: list[float], max_replicas: int = 8
) -> LocalLoop:
    """The loop of the load-step tests: `STEP_PARAMS`, one class, a 10 s window, fake loads."""
    return LocalLoop(
        fleet,
        "http://127.0.0.1:8000/metrics",
        [ClassTargets("default", 2.0, 0.1, 0.9, 0.9)],
        params=STEP_PARAMS,
        window_s=10.0,
        get=lambda url: router.text(),
        loads=Loads(),
        clock=lambda: now[0],
        max_replicas=max_replicas,
    )


def test_load_step_adds_a_worker_within_two_ticks_and_removes_it_after_stabilization() -> None:
    router = FakeRouterMetrics()
    fleet = FakeFleet()
    now = [0.0]
    params = STEP_PARAMS
    loop = _step_loop(fleet, router, now)

    def tick(n: int) -> None:
        router.serve(n, "default", prompt=2000, output=100)
        now[0] += params.interval_s
        loop.tick()

    tick(5)
    tick(5)
    assert fleet.calls == ["start prefill", "start decode"]
    tick(100)  # the step: 20 req/s of 2000-token prompts
    tick(100)
    started = [c for c in fleet.calls[2:] if c.startswith(("start", "flip"))]
    assert started, loop.log
    peak = len(fleet.ws)
    for _ in range(5):  # back to light load: nothing stops within the 30 s window
        tick(2)
    assert len(fleet.ws) == peak
    for _ in range(20):
        tick(2)
    assert len(fleet.ws) < peak
    assert any(c.startswith("stop") for c in fleet.calls)
    assert {w.role for w in fleet.ws.values()} == {Role.PREFILL, Role.DECODE}


def _up_loop(
    fleet: FakeFleet,
    text: Callable[[], str],
    now: list[float],
    burst_weight: float,
    *,
    window_s: float,
    max_replicas: int = 8,
) -> LocalLoop:
    """`up`'s loop (5 s ticks, 60 s stabilization) over `fleet`, scraping `text()`."""
    opts = {
        "autoscale_interval_s": 5.0,
        "autoscale_stabilization_s": 60.0,
        "autoscale_burst_weight": burst_weight,
        "autoscale_horizon_s": 5.0,
    }
    return LocalLoop(
        fleet,
        "http://127.0.0.1:8000/metrics",
        [ClassTargets("default", 2.0, 0.1, 0.9, 0.9)],
        params=loop_params(opts),
        max_replicas=max_replicas,
        window_s=window_s,
        get=lambda url: text(),
        loads=Loads(),
        clock=lambda: now[0],
    )


def _bursty_run(burst_weight: float) -> tuple[FakeFleet, Decision]:
    """10 requests per 5 s tick for 30 s, then one tick of 100 (a 30 s window's mean of
    5 req/s, its busiest 10 s sub-window 11 req/s), over `up`'s loop parameters."""
    router = FakeRouterMetrics()
    fleet = FakeFleet()
    now = [0.0]
    loop = _up_loop(fleet, router.text, now, burst_weight, window_s=30.0, max_replicas=16)
    decision = None
    for n in (10, 10, 10, 10, 10, 10, 100):
        router.serve(n, "default", prompt=1000, output=100)
        now[0] += 5.0
        decision, _ = loop.tick()
    assert decision is not None
    return fleet, decision


def test_burst_weight_sizes_for_the_busiest_sub_window_like_the_operator() -> None:
    mean_fleet, mean = _bursty_run(0.0)
    burst_fleet, burst = _bursty_run(1.0)
    assert mean.rate_per_s == burst.rate_per_s == 5.0  # the same window mean
    assert mean.forecast_per_s == 5.0  # weight 0: the mean alone
    # weight 1: the busiest 10 s (110 arrivals) less the Poisson excess at 5 req/s of the
    # busiest of the 30 s window's three (live_params: burst_poisson)
    assert burst.forecast_per_s == pytest.approx(11.0 - poisson_peak_excess(5.0, 30.0, 10.0))
    assert "burst 10.4" in burst.pools[Role.PREFILL].reason
    for role in (Role.PREFILL, Role.DECODE):
        assert burst.desired[role] > mean.desired[role]
    assert len(burst_fleet.ws) > len(mean_fleet.ws)


def test_up_loop_parameters_are_the_operators_policy() -> None:
    opts = {
        "autoscale_interval_s": 10.0,
        "autoscale_stabilization_s": 60.0,
        "autoscale_burst_weight": 0.5,
        "autoscale_horizon_s": 30.0,
    }
    assert loop_params(opts) == live_params(10.0, 60.0, 0.5, 30.0)
    p = loop_params(opts)
    assert (p.burst_weight, p.ttft_tail_fraction, p.occupancy_floor) == (0.5, 0.8, True)
    assert (p.pooled_tail, p.reversal_backoff, p.max_backoff) == (True, 2.0, 4.0)
    assert loop_params({**opts, "autoscale_horizon_s": 1.0}).horizon_s == 10.0  # >= interval


def _router_queue_run(readings: Sequence[int | None]) -> tuple[FakeFleet, LocalLoop]:
    """`up`'s loop over the real router's metrics (`obs.metrics.RouterMetrics`, the registry
    `router serve` exposes on /metrics): a light load, and its admission queue gauge at each
    tick as given (None: no request queued yet, so the gauge has no sample)."""
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    fleet = FakeFleet()
    now = [0.0]
    loop = _up_loop(fleet, lambda: generate_latest(registry).decode(), now, 1.0, window_s=10.0)
    for q in [None, None, *readings]:
        metrics.admission.labels("default", "admitted").inc(2)
        metrics.slo_requests.labels("default", "met").inc(2)
        for _ in range(2):
            metrics.prompt_length.labels("default").observe(200)
            metrics.output_length.labels("default").observe(50)
        if q is not None:
            metrics.queue_depth.labels("default").set(q)  # as router.admission keeps it
        now[0] += 5.0
        loop.tick()
    return fleet, loop


def test_up_loop_reads_the_router_s_admission_queue() -> None:
    """The local loop's observation carries the router's queue (the operator's `Window` over
    the router's /metrics): a queue above 4 per prefill worker, or one growing at consecutive
    ticks below that, starts a prefill worker; the same queue flat, or none, starts nothing."""
    for readings, why in (([20], "prefill queue 20 (20 at the router)"), ([1, 2, 3], "growing")):
        fleet, loop = _router_queue_run(readings)
        assert fleet.calls[2:] == ["start prefill"], loop.log
        assert why in loop.log[-1]
    flat: list[list[int | None]] = [[3, 3, 3], [None, None, None], [3, 2, 1]]
    for still in flat:
        fleet, loop = _router_queue_run(still)
        assert fleet.calls[2:] == [], loop.log


def test_a_flip_is_logged_with_its_reason() -> None:
    """Like a start or a stop, a flip's line says why (the flipper's reason), not only what."""
    router = FakeRouterMetrics()
    fleet = FakeFleet()
    fleet.start(Role.DECODE)  # 1 prefill, 2 decode: the second decode worker is spare
    now = [0.0]
    params = STEP_PARAMS
    loop = _step_loop(fleet, router, now, max_replicas=2)
    for n in (2, 2, 100, 100, 100):  # a step of long prompts with short outputs
        router.serve(n, "default", prompt=2000, output=10)
        now[0] += params.interval_s
        loop.tick()
    assert "flip w1 prefill" in fleet.calls, (fleet.calls, loop.log)
    flips = [line for line in loop.log if line.startswith("flip ")]
    assert flips, loop.log
    assert all(line.startswith("flip w1 decode -> prefill: ") for line in flips), flips
    assert all("prefill needs" in line for line in flips), flips


def test_a_hold_is_printed_once_per_reason_like_the_operator_s_status_decisions() -> None:
    """`up` prints a hold (no action, and why) when the set of missing / stale signals changes,
    as the operator writes it to status.decisions: not on every tick of the same hold, again
    after the signals came back and went again."""
    from splitserve.cli.autoscale_local import AutoscaleThread

    router = FakeRouterMetrics()
    fleet = FakeFleet()
    now = [0.0]
    down = [True]

    def get(url: str) -> str:
        if down[0]:
            raise OSError("connection refused")
        return router.text()

    loop = _step_loop(fleet, router, now)
    loop.get = get
    printed: list[str] = []
    thread = AutoscaleThread(loop, STEP_PARAMS.interval_s, printed.append)

    def tick() -> None:
        router.serve(5, "default", prompt=200, output=50)
        now[0] += STEP_PARAMS.interval_s
        thread.run_once()

    tick()
    tick()  # the second tick has a window with two failed scrapes: a different set of signals
    holds = [line for line in printed if line.startswith("autoscale: hold: no action: ")]
    assert 1 <= len(holds) <= 2, printed
    assert all("scrape failed: connection refused" in line for line in holds), holds
    # The router is named by its address, as the operator names its router pods.
    assert all("router 127.0.0.1:8000 " in line for line in holds), holds
    for _ in range(4):  # the same outage: nothing new
        tick()
    assert [line for line in printed if "hold" in line] == holds, printed
    down[0] = False
    for _ in range(4):
        tick()
    assert [line for line in printed if "hold" in line] == holds, printed
    down[0] = True
    for _ in range(6):  # the scrapes stop: stale, then missing again
        tick()
    later = [line for line in printed if "hold" in line][len(holds) :]
    assert 1 <= len(later) <= 3, printed  # stale, then the stale one gone from the window
    assert len(set(later)) == len(later), later
    assert fleet.calls == ["start prefill", "start decode"], fleet.calls


def test_a_pool_kept_at_max_under_pressure_is_printed_once_per_kind_of_reason() -> None:
    """A pool the loop keeps at its size although under pressure (here: at max, with a router
    queue) is printed once with the reason, not on every tick as the queue's length changes;
    once the pressure is gone and comes back, it is printed again."""
    from splitserve.cli.autoscale_local import AutoscaleThread

    router = FakeRouterMetrics()
    fleet = FakeFleet()
    now = [0.0]
    loop = _step_loop(fleet, router, now, max_replicas=1)
    printed: list[str] = []
    thread = AutoscaleThread(loop, STEP_PARAMS.interval_s, printed.append)
    for queue in (0, 0, 20, 30, 40, 50, 0, 0, 0, 0, 25, 35):
        router.serve(2, "default", prompt=200, output=50)
        router.queue.labels("default").set(queue)
        now[0] += STEP_PARAMS.interval_s
        thread.run_once()
    holds = [line for line in printed if "held at max" in line]
    assert len(holds) == 2, printed
    assert all(h.startswith("autoscale: hold: prefill held at max 1: ") for h in holds), holds
    assert "queue 20 (20 at the router)" in holds[0], holds
    assert "queue 25 (25 at the router)" in holds[1], holds
    assert fleet.calls == ["start prefill", "start decode"], fleet.calls


def test_workers_started_in_one_tick_for_one_reason_are_one_line() -> None:
    """A tick that starts several workers of a pool prints them on one line with the reason
    once ("start w2, w3 as prefill: prefill 1 -> 3: ..."), not the same reason per worker."""
    router = FakeRouterMetrics()
    fleet = FakeFleet()
    now = [0.0]
    loop = _step_loop(fleet, router, now)
    for n in (5, 5, 100, 100):
        router.serve(n, "default", prompt=2000, output=100)
        now[0] += STEP_PARAMS.interval_s
        seen = len(fleet.calls)
        loop.tick()
        starts = [c for c in fleet.calls[seen:] if c.startswith("start")]
        lines = [line for line in loop.log if line.startswith("start ")]
        if len(starts) > 1:
            break
    assert len(starts) > 1, (fleet.calls, loop.log)  # the step started several at once
    last = lines[-1]
    assert last.startswith("start w"), loop.log
    assert ", w" in last.split(" as ")[0], loop.log
    reasons = [line.split(": ", 1)[1] for line in lines]
    assert len(reasons) == len(set(reasons)), loop.log


def test_a_router_queue_before_the_first_finish_starts_a_prefill_worker() -> None:
    """`up --autoscale` with requests queued at the router and none finished yet (no SLO
    result, no output length): before, the loop held ("no request finished yet") while the
    queue grew; now the queue, known before any request finishes, starts a prefill worker,
    and the line says why. A router with no traffic at all still only holds."""
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    fleet = FakeFleet()
    now = [0.0]
    loop = _up_loop(fleet, lambda: generate_latest(registry).decode(), now, 1.0, window_s=10.0)
    for queued in (0, 0, 40):
        if queued:
            metrics.admission.labels("default", "queued").inc(queued)
            for _ in range(queued):
                metrics.prompt_length.labels("default").observe(500)
            metrics.queue_depth.labels("default").set(queued)
        now[0] += 5.0
        loop.tick()
    assert any("no traffic yet" in line for line in loop.log), loop.log
    assert fleet.calls[2:] == ["start prefill"], loop.log
    assert loop.log[-1].startswith("start w2 as prefill: prefill 1 -> 2: no request finished yet")
    assert "router queue 40" in loop.log[-1]


class _SilentDecode(Loads):
    """Loads where the decode workers (addresses in `silent`) do not answer."""

    def __init__(self, silent: set[str]) -> None:
        self.silent = silent

    def load(self, address: str) -> WorkerLoad:
        if address in self.silent:
            raise OSError("unreachable")
        return super().load(address)


def test_a_scale_down_with_no_worker_to_stop_says_so_once() -> None:
    """A pool to shrink whose workers report no load (none can be picked to stop) printed
    "stop : <reason>" on every tick; now a line says no worker could be stopped and why,
    once per kind of reason, and nothing is stopped."""
    from splitserve.cli.autoscale_local import AutoscaleThread

    router = FakeRouterMetrics()
    fleet = FakeFleet()
    fleet.start(Role.DECODE)
    fleet.start(Role.DECODE)  # 1 prefill, 3 decode: two more than light load needs
    decode = {w.address for w in fleet.workers() if w.role is Role.DECODE}
    now = [0.0]
    loop = _step_loop(fleet, router, now)
    loop.loads = _SilentDecode(decode)
    printed: list[str] = []
    thread = AutoscaleThread(loop, STEP_PARAMS.interval_s, printed.append)
    for _ in range(20):  # light load, past the 30 s stabilization window
        router.serve(2, "default", prompt=200, output=50)
        now[0] += STEP_PARAMS.interval_s
        thread.run_once()
    assert not any(c.startswith("stop") for c in fleet.calls), fleet.calls
    stops = [line for line in printed if line.startswith("autoscale: stop")]
    assert stops, printed
    assert not any(line.startswith("autoscale: stop :") for line in printed), printed
    assert len(stops) == 1, printed
    assert stops[0].startswith("autoscale: stop: no decode worker to stop (3 not reporting"), stops
    assert "): decode 3 -> " in stops[0], stops  # the pool's reason follows


def test_a_pool_below_its_minimum_is_refilled_while_signals_are_missing() -> None:
    """A worker marked down leaves its pool empty; no request can finish, so no signal comes:
    the loop held forever and every request got 503. Bounds need no signal."""
    router = FakeRouterMetrics()
    fleet = FakeFleet()
    now = [0.0]
    loop = _step_loop(fleet, router, now)
    loop.get = lambda url: (_ for _ in ()).throw(OSError("connection refused"))
    [decode] = [n for n, w in fleet.ws.items() if w.role is Role.DECODE]
    del fleet.ws[decode]  # marked down: out of the fleet
    now[0] += STEP_PARAMS.interval_s
    decision, flips = loop.tick()
    assert decision.held
    assert not flips
    assert fleet.calls == ["start prefill", "start decode", "start decode"]
    assert any(line.startswith("start ") and "as decode" in line for line in loop.log), loop.log
    now[0] += STEP_PARAMS.interval_s
    loop.tick()  # the started worker counts in its pool (not ready yet): no second one
    assert fleet.calls.count("start decode") == 2

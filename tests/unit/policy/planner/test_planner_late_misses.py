"""SLO misses of a backlog that has drained are no pressure (the flap after a burst).

The window counts a request when it finishes: after a burst, the requests it queued finish late
in the windows after it, at 0 % attainment, while the arrivals are already back to a trickle and
every queue is empty. Read as pressure, those misses add a worker for load that is gone, and the
stabilization window then takes it back: a reversal. Weighed against the window's arrivals and the
queues now, only the misses that the requests which arrived in the window could account for
count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import AladdinPerfModel
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Kind,
    decide,
    late_misses,
    pressure_by_role,
)
from splitserve.policy.planner.signals import ClassSignal, Observation, PoolSignal, WorkerLoad

PERF = AladdinPerfModel()
PARAMS = AutoscalerParams(interval_s=10, scale_down_stabilization_s=60, horizon_s=10)
WINDOW_S = 60.0


def after_burst(
    rate: float,
    finished: int,
    attainment: float,
    *,
    router_queue: int | None = 0,
    queued: int = 0,
) -> Observation:
    """A window after a burst: `finished` requests (queued during it) at `attainment`, while
    `rate` requests/s arrive now; every worker's queue holds `queued`."""
    cls = ClassSignal(
        "chat",
        2.0,
        0.1,
        requests=finished,
        ttft_s=9.0 if attainment < 0.9 else 1.0,
        tpot_s=0.05,
        attainment=attainment,
    )
    pools = {
        r: PoolSignal(r, 2, 2, 1, 16, (WorkerLoad("a", r, queued), WorkerLoad("b", r, 0)))
        for r in (Role.PREFILL, Role.DECODE)
    }
    return Observation(100.0, WINDOW_S, rate, 1000, 200, (cls,), pools, router_queue=router_queue)


def test_late_misses_of_a_drained_backlog_are_no_pressure_and_say_so() -> None:
    # 40 finished at 0 %, 3 arrived in the window (0.05 req/s), every queue empty.
    o = after_burst(0.05, 40, 0.0)
    assert pressure_by_role(o, PARAMS) == {}
    d, _ = decide(o, AutoscalerState(), PERF, PARAMS)
    p = d.pools[Role.PREFILL]
    assert p.desired == 2
    assert p.kind is Kind.HOLD
    assert "drained backlog" in p.reason
    assert "40 finished, 3 arrived" in p.reason


def test_misses_with_a_queue_or_without_a_drained_window_still_are_pressure() -> None:
    # The router still holds requests: the backlog is not gone.
    assert Role.PREFILL in pressure_by_role(after_burst(0.05, 40, 0.0, router_queue=3), PARAMS)
    # Unknown router queue: not known to be drained.
    assert Role.PREFILL in pressure_by_role(after_burst(0.05, 40, 0.0, router_queue=None), PARAMS)
    # A worker still has a queue.
    assert Role.PREFILL in pressure_by_role(after_burst(0.05, 40, 0.0, queued=2), PARAMS)
    # As many arrived as finished (60 vs 40): these misses are of current load.
    assert Role.PREFILL in pressure_by_role(after_burst(1.0, 40, 0.0), PARAMS)
    # Drained (50 finished, 30 arrived), but at 0 % at least 30 misses are of the window's own
    # arrivals: enough samples, and more misses than the target allows.
    assert Role.PREFILL in pressure_by_role(after_burst(0.5, 50, 0.0), PARAMS)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.0, 0.3),
    late=st.integers(20, 400),
    attainment=st.floats(0.0, 1.0),
)
def test_a_drained_backlog_never_scales_a_pool_up(
    rate: float, late: int, attainment: float
) -> None:
    """Whatever the late requests' attainment, with queues empty and fewer arrivals than
    `min_samples` in the window, the pools scale up only if the model asks (it does not at
    this rate for 2 workers)."""
    o = after_burst(rate, late + int(rate * WINDOW_S), attainment)
    d, _ = decide(o, AutoscalerState(since_s=0), PERF, PARAMS)
    assert all(p.kind is not Kind.SCALE_UP for p in d.pools.values())


def test_the_reason_reads_the_window_in_whole_seconds() -> None:
    # A live window spans the scrapes' times: 30.4513 s read "the 30.4513 s window".
    o = after_burst(0.1, 40, 0.0)
    o = Observation(o.time_s, 30.4513, 0.1, 1000, 200, o.classes, o.pools, router_queue=0)
    assert "arrived in the 30 s window" in late_misses(o, PARAMS)

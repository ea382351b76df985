"""A service with requests arriving always keeps one worker that can finish them.

Prefill workers only hand their KV on; a decode or mixed worker finishes a request. With
`minReplicas: 0` on every pool (the CRD's default) an idle service may scale to zero, and the
loop must bring it back. Before, from zero and before any request had finished (a new service
at zero, or the loop restarted after scaling to zero: no output length known), the loop sized
prefill from the arrivals and kept decode at zero, so every request was a 503 and none ever
finished to let it size decode."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import AladdinPerfModel
from splitserve.policy.planner.autoscaler import (
    AutoscalerState,
    Kind,
    decide,
    live_params,
)
from splitserve.policy.planner.signals import ClassSignal, Observation, PoolSignal

PERF = AladdinPerfModel()
PARAMS = live_params(5.0, 60.0, horizon_s=5.0)
CHAT = (ClassSignal("chat", 2.0, 0.1, 0.9, 0.9),)


def observe(
    rate: float,
    queue: int,
    sizes: dict[Role, int],
    *,
    output: float | None = None,
    time_s: float = 100.0,
    max_replicas: dict[Role, int] | None = None,
) -> Observation:
    """Pools at `sizes` (all ready, min 0), `rate` arrivals per second with 200-token prompts
    and `queue` waiting at the router; `output` None: no request finished yet."""
    maxes = max_replicas or {}
    pools = {r: PoolSignal(r, n, n, 0, maxes.get(r, 8), ()) for r, n in sizes.items()}
    return Observation(
        time_s,
        30.0,
        rate,
        200.0,
        output,
        CHAT,
        pools,
        router_queue=queue,
        no_finish_yet=output is None,
    )


def test_from_zero_before_the_first_finish_a_decode_worker_is_started() -> None:
    d, _ = decide(
        observe(1.0, 5, {Role.PREFILL: 0, Role.DECODE: 0}), AutoscalerState(), PERF, PARAMS
    )
    p = d.pools[Role.DECODE]
    assert (p.kind, p.desired) == (Kind.SCALE_UP, 1)
    assert p.reason.startswith("decode 0 -> 1: no request finished yet; no worker can finish")
    assert "1 req/s arriving, 5 waiting at the router" in p.reason
    assert d.pools[Role.PREFILL].desired == 1


def test_prefill_workers_alone_get_a_decode_worker_and_it_is_not_flipped_away() -> None:
    d, _ = decide(
        observe(1.0, 5, {Role.PREFILL: 2, Role.DECODE: 0}), AutoscalerState(), PERF, PARAMS
    )
    assert d.pools[Role.DECODE].desired == 1
    assert d.pools[Role.DECODE].headroom == 0


def test_with_only_a_mixed_pool_the_mixed_pool_is_raised() -> None:
    d, _ = decide(observe(0.5, 0, {Role.MIXED: 0}), AutoscalerState(), PERF, PARAMS)
    assert (d.pools[Role.MIXED].kind, d.pools[Role.MIXED].desired) == (Kind.SCALE_UP, 1)


def test_decode_at_max_zero_raises_the_mixed_pool_instead() -> None:
    obs = observe(
        1.0, 0, {Role.PREFILL: 1, Role.DECODE: 0, Role.MIXED: 0}, max_replicas={Role.DECODE: 0}
    )
    d, _ = decide(obs, AutoscalerState(), PERF, PARAMS)
    assert d.pools[Role.DECODE].desired == 0
    assert d.pools[Role.MIXED].desired == 1


def test_an_idle_service_may_still_scale_to_zero() -> None:
    state = AutoscalerState()
    for t in range(0, 200, 10):
        obs = observe(0.0, 0, {Role.PREFILL: 1, Role.DECODE: 1}, output=100.0, time_s=100.0 + t)
        d, state = decide(obs, state, PERF, PARAMS)
    assert d.desired == {Role.PREFILL: 0, Role.DECODE: 0}


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.0, 50.0),
    queue=st.integers(0, 100),
    prefill=st.integers(0, 4),
    decode=st.integers(0, 4),
    output=st.one_of(st.none(), st.floats(1.0, 2000.0)),
    ticks=st.integers(1, 30),
)
def test_requests_arriving_always_leave_a_worker_that_can_finish_them(
    rate: float, queue: int, prefill: int, decode: int, output: float | None, ticks: int
) -> None:
    state = AutoscalerState()
    sizes = {Role.PREFILL: prefill, Role.DECODE: decode}
    for t in range(ticks):
        obs = observe(0.0, 0, sizes, output=output or 100.0, time_s=100.0 + 10 * t)
        d, state = decide(obs, state, PERF, PARAMS)  # an idle spell: may scale to zero
        sizes = d.desired
    d, _ = decide(observe(rate, queue, sizes, output=output, time_s=1000.0), state, PERF, PARAMS)
    if rate > 0 or queue > 0:
        assert d.desired[Role.DECODE] >= 1, d.pools[Role.DECODE].reason

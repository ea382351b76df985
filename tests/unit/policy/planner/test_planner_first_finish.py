"""Before the first request finishes, the loop acts on what it knows: the arrival rate, the
prompts and the router's queue (issue 11, "blind until the first finish").

Nothing finished means no SLO result and no output length, so decode cannot be sized by the
model; but the arrivals, their prompts (the router counts a prompt at arrival) and the requests
waiting at the router's gate are known. Before, the loop held ("no request finished yet") while
the router's queue grew: a probe of `up --autoscale` saw 23 s of no action. Now the prefill side
is sized as always (its work needs only the prompts), a queue above `queue_per_worker` per worker
or one growing at consecutive ticks adds a worker to the side it waits for, decode acts on its
own workers' queue and on what they hold (their occupancy, the router's queue included), an
idle decode worker can still be flipped to prefill, and nothing scales down. A truly idle router
still holds."""

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
    live_params,
)
from splitserve.policy.planner.signals import (
    ClassSignal,
    Observation,
    PoolSignal,
    SignalProblem,
    SignalState,
    WorkerLoad,
)

PERF = AladdinPerfModel()
PARAMS = live_params(5.0, 60.0, horizon_s=5.0)
CHAT = (ClassSignal("chat", 2.0, 0.1, 0.9, 0.9),)


def blind(
    rate: float,
    queue: int | None,
    *,
    prompt: float | None = 200.0,
    prefill: int = 1,
    decode: int = 1,
    decode_queued: int = 0,
    max_replicas: int = 8,
    time_s: float = 100.0,
    ready: dict[Role, int] | None = None,
) -> Observation:
    """Requests arriving and queued at the router, none finished yet: no output length. Each
    worker runs one request (KV 10 %)."""
    ready = ready or {}
    pools = {
        Role.PREFILL: PoolSignal(
            Role.PREFILL,
            prefill,
            ready.get(Role.PREFILL, prefill),
            1,
            max_replicas,
            tuple(WorkerLoad(f"p{i}", Role.PREFILL, 0, 1, 0.1) for i in range(prefill)),
        ),
        Role.DECODE: PoolSignal(
            Role.DECODE,
            decode,
            ready.get(Role.DECODE, decode),
            1,
            max_replicas,
            tuple(
                WorkerLoad(f"d{i}", Role.DECODE, decode_queued if i == 0 else 0, 1, 0.1)
                for i in range(decode)
            ),
        ),
    }
    return Observation(
        time_s,
        30.0,
        rate,
        prompt,
        None,
        CHAT,
        pools,
        router_queue=queue,
        no_finish_yet=True,
    )


def test_a_router_queue_before_the_first_finish_adds_prefill_and_says_why() -> None:
    d, _ = decide(blind(1.0, 40), AutoscalerState(), PERF, PARAMS)
    assert not d.held
    p = d.pools[Role.PREFILL]
    assert p.kind is Kind.SCALE_UP
    assert p.desired > 1
    assert p.reason.startswith("prefill 1 -> ")
    assert "no request finished yet" in p.reason
    assert "router queue 40" in p.reason
    # Decode: no output length known, idle workers: kept, not guessed.
    assert d.pools[Role.DECODE].desired == 1
    assert "decode workers hold" in d.pools[Role.DECODE].reason
    assert any(line.startswith("router queue 40 waiting") for line in d.at_risk), d.at_risk


def test_prefill_is_sized_from_the_rate_and_prompts_alone() -> None:
    """The prefill side's work needs no output length: a heavy stream of long prompts sizes
    prefill beyond one step of pressure, as a usable observation would."""
    d, _ = decide(blind(20.0, 0, prompt=4000), AutoscalerState(), PERF, PARAMS)
    usable = blind(20.0, 0, prompt=4000)
    from dataclasses import replace

    usable = replace(usable, mean_output_tokens=100.0, no_finish_yet=False)
    u, _ = decide(usable, AutoscalerState(), PERF, PARAMS)
    assert d.pools[Role.PREFILL].desired == u.pools[Role.PREFILL].desired > 2
    assert d.pools[Role.DECODE].desired == 1


def test_a_queue_growing_below_the_threshold_adds_a_worker_at_the_second_rise() -> None:
    state = AutoscalerState()
    desired = []
    for t, q in enumerate((1, 2, 3)):
        d, state = decide(blind(0.1, q, time_s=100.0 + 5 * t), state, PERF, PARAMS)
        desired.append(d.pools[Role.PREFILL].desired)
    assert desired == [1, 1, 2], desired
    assert "router queue growing 2 -> 3" in d.pools[Role.PREFILL].reason
    assert "no request finished yet" in d.pools[Role.PREFILL].reason


def test_decode_adds_a_worker_on_its_own_queue() -> None:
    d, _ = decide(blind(0.1, 0, decode_queued=10), AutoscalerState(), PERF, PARAMS)
    p = d.pools[Role.DECODE]
    assert (p.kind, p.desired) == (Kind.SCALE_UP, 2)
    assert "decode queue 10" in p.reason


def test_without_pressure_it_holds_and_says_no_request_finished_yet() -> None:
    d, state = decide(blind(0.1, 0), AutoscalerState(), PERF, PARAMS)
    assert "no request finished yet" in d.held
    assert d.desired == {Role.PREFILL: 1, Role.DECODE: 1}
    # The queue's reading is kept, so growth is seen from the next tick on.
    assert state.queue_trend == (0, 0)


def test_it_never_scales_down_before_the_first_finish() -> None:
    d, _ = decide(blind(0.0, 0, prefill=6, decode=6), AutoscalerState(), PERF, PARAMS)
    assert d.desired == {Role.PREFILL: 6, Role.DECODE: 6}


def test_at_max_or_while_started_workers_come_up_it_holds_under_pressure() -> None:
    d, _ = decide(blind(0.1, 40, max_replicas=1), AutoscalerState(), PERF, PARAMS)
    p = d.pools[Role.PREFILL]
    assert (p.kind, p.desired) == (Kind.HOLD, 1)
    assert "held at max 1" in p.reason
    assert not d.held  # the pressure is reported per pool (printed once), not as a signal hold
    d, _ = decide(
        blind(0.1, 40, prefill=2, ready={Role.PREFILL: 1}), AutoscalerState(), PERF, PARAMS
    )
    p = d.pools[Role.PREFILL]
    assert (p.kind, p.desired) == (Kind.HOLD, 2)
    assert "waiting for 1 worker(s) to start serving" in p.reason


def test_a_truly_idle_router_and_other_problems_still_hold() -> None:
    idle = Observation(
        100.0,
        30.0,
        None,
        None,
        None,
        CHAT,
        blind(0.0, None).pools,
        problems=(SignalProblem("router r traffic", SignalState.MISSING, "no traffic yet"),),
    )
    d, state = decide(idle, AutoscalerState(), PERF, PARAMS)
    assert "no traffic yet" in d.held
    assert state == AutoscalerState()
    stale = SignalProblem("router metrics", SignalState.STALE, "last scrape 30 s ago")
    from dataclasses import replace

    d, _ = decide(replace(blind(1.0, 40), problems=(stale,)), AutoscalerState(), PERF, PARAMS)
    assert "stale" in d.held
    assert d.desired == {Role.PREFILL: 1, Role.DECODE: 1}


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(0.0, 50.0),
    queue=st.one_of(st.none(), st.integers(0, 500)),
    prompt=st.one_of(st.none(), st.floats(1.0, 8000.0)),
    prefill=st.integers(1, 8),
    decode=st.integers(1, 8),
    decode_queued=st.integers(0, 100),
)
def test_before_the_first_finish_sizes_stay_in_bounds_and_never_fall(
    rate: float,
    queue: int | None,
    prompt: float | None,
    prefill: int,
    decode: int,
    decode_queued: int,
) -> None:
    obs = blind(
        rate, queue, prompt=prompt, prefill=prefill, decode=decode, decode_queued=decode_queued
    )
    d, _ = decide(obs, AutoscalerState(), PERF, PARAMS)
    for role, p in d.pools.items():
        assert 1 <= p.desired <= 8
        assert p.desired >= p.current, (role, p.reason)
    # More waiting at the router never means fewer prefill workers.
    more = blind(
        rate,
        (queue or 0) + 50,
        prompt=prompt,
        prefill=prefill,
        decode=decode,
        decode_queued=decode_queued,
    )
    d2, _ = decide(more, AutoscalerState(), PERF, PARAMS)
    for role in (Role.PREFILL, Role.DECODE):
        assert d2.pools[role].desired >= d.pools[role].desired


def test_default_params_act_the_same_way() -> None:
    d, _ = decide(blind(1.0, 40), AutoscalerState(), PERF, AutoscalerParams())
    assert d.pools[Role.PREFILL].desired > 1


def test_an_idle_decode_worker_is_flipped_to_prefill_before_the_first_finish() -> None:
    """What the decode workers hold is known before any request finishes: with one of two
    idle, the prefill side's need is met by a flip (cheaper than a cold start), as it is once
    requests finish; the decode pool itself does not scale down."""
    from splitserve.policy.planner.flipper import plan_flips

    obs = blind(1.0, 40, decode=2)
    d, _ = decide(obs, AutoscalerState(), PERF, PARAMS)
    assert d.pools[Role.DECODE].kind is Kind.HOLD
    assert d.pools[Role.DECODE].desired == 2
    d, flips = plan_flips(d, obs, [(Role.DECODE, Role.PREFILL)], 1)
    assert [(f.source, f.target, f.count) for f in flips] == [(Role.DECODE, Role.PREFILL, 1)]
    assert d.desired == {Role.PREFILL: 2, Role.DECODE: 1}

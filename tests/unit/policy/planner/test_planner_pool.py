"""Prefill tail sizing over the pool (M/G/c, `pooled_tail`) and adaptive stabilization after a
reversal (`reversal_backoff`): unit cases and the autoscaler's invariants with both on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy.planner.test_planner_autoscaler import (
    PERF,
    obs,
    reversals_within,
    run,
    sizes,
)
from tests.unit.policy.planner.test_planner_tail import STRICT, TAIL

from splitserve.core.roles import Role
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Decision,
    Kind,
    decide,
    erlang_b,
    erlang_c,
    live_params,
    pool_wait_quantile,
    prefill_tail_workers,
    prefill_work,
)
from splitserve.policy.planner.signals import Observation

POOLED = replace(TAIL, pooled_tail=True, reversal_backoff=2.0, max_backoff=4.0)


def _erlang_c_direct(c: int, a: float) -> float:
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize(("c", "a"), [(1, 0.5), (2, 1.0), (4, 3.0), (10, 8.0), (20, 5.0)])
def test_erlang_c_matches_the_formula(c: int, a: float) -> None:
    assert erlang_c(c, a) == pytest.approx(_erlang_c_direct(c, a), rel=1e-9)
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # one server: waits with probability ρ
    assert erlang_c(3, 3.0) == 1.0  # at capacity
    assert erlang_c(3, 0.0) == 0.0


def _erlang_b_full(c: int, a: float) -> float:
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


@settings(max_examples=150, deadline=None)
@given(st.floats(0.1, 3e4), st.floats(0.02, 3.0))
def test_erlang_b_equals_the_full_recursion(a: float, ratio: float) -> None:
    """`erlang_b` starts the recursion near the load from the fluid value and stops once B is
    negligible (a forecast of 10^6 req/s made every tick take tens of seconds): the same
    value as the recursion from 0 for light, critical and heavy loads alike."""
    c = max(1, int(a * ratio))
    want = _erlang_b_full(c, a)
    assert erlang_b(c, a) == pytest.approx(want, rel=1e-9, abs=1e-39)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 1.0), st.floats(0.01, 0.99), st.floats(0, 10), st.floats(0.5, 0.999))
def test_one_worker_pool_is_the_m_g_1_rule(
    service: float, rho: float, cv2: float, q: float
) -> None:
    rate = rho / service
    want = 0.0
    if rho > 1 - q:
        want = service * (1 + cv2) / (2 * (1 - rho)) * math.log(rho / (1 - q))
    assert pool_wait_quantile(1, rate, service, cv2, q) == pytest.approx(want, rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.0, 200.0),
    st.floats(0.01, 1.0),
    st.floats(0.0, 10.0),
    st.floats(0.5, 0.999),
    st.floats(1.05, 50.0),
)
def test_pool_size_is_the_fewest_workers_that_fit(
    rate: float, service: float, cv2: float, q: float, budget_x: float
) -> None:
    budget = service * budget_x
    c = prefill_tail_workers(rate, service, cv2, q, budget, 0.8)
    if rate == 0:
        assert c == 0
        return
    n = max(1, math.ceil(c - 1e-9))  # the pool it asks for
    assert rate * service / n <= 0.8 + 1e-6  # within the utilisation cap
    assert service + pool_wait_quantile(n, rate, service, cv2, q) <= budget * (1 + 1e-6)
    if n - 1 >= rate * service / 0.8 and n > 1:  # one fewer would still be under the cap
        assert service + pool_wait_quantile(n - 1, rate, service, cv2, q) > budget


@settings(max_examples=200, deadline=None)
@given(st.floats(0.001, 100.0), st.floats(0.01, 1.0), st.floats(0.0, 5.0), st.floats(1.05, 50.0))
def test_pool_size_is_continuous_in_the_rate(
    rate: float, service: float, cv2: float, budget_x: float
) -> None:
    """No jump at a whole worker: the hysteresis can bring a light pool back to one worker."""
    budget = service * budget_x
    a = prefill_tail_workers(rate, service, cv2, 0.99, budget, 0.8)
    b = prefill_tail_workers(rate * 1.0001, service, cv2, 0.99, budget, 0.8)
    assert a <= b <= a + 0.05 * max(1.0, a)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.0, 100.0),
    st.floats(0.0, 100.0),
    st.floats(0.01, 1.0),
    st.floats(0.0, 5.0),
    st.floats(0.0, 5.0),
    st.floats(1.05, 50.0),
)
def test_pool_size_is_monotone_in_rate_and_spread(
    r1: float, r2: float, service: float, v1: float, v2: float, budget_x: float
) -> None:
    lo, hi = sorted((r1, r2))
    vlo, vhi = sorted((v1, v2))
    budget = service * budget_x
    assert prefill_tail_workers(lo, service, vlo, 0.99, budget, 0.8) <= prefill_tail_workers(
        hi, service, vlo, 0.99, budget, 0.8
    )
    assert prefill_tail_workers(hi, service, vlo, 0.99, budget, 0.8) <= prefill_tail_workers(
        hi, service, vhi, 0.99, budget, 0.8
    )
    assert prefill_tail_workers(hi, service, vlo, 0.9, budget, 0.8) <= prefill_tail_workers(
        hi, service, vlo, 0.99, budget, 0.8
    )


def test_a_pool_needs_fewer_workers_than_separate_queues() -> None:
    """The mix shift's load: 4 req/s of ~2,000-token prompts (cv² ~2), 99 % within 1.6 s."""

    def work(pooled: bool) -> float:
        return prefill_work(
            4.0, 2000, PERF, 2.0, 0.5, 0.8, tail_fraction=0.8, prompt_cv2=2.0, quantile=0.99,
            pooled=pooled,
        )  # fmt: skip

    separate, pooled = work(False), work(True)
    assert pooled < separate / 2
    mean_only = prefill_work(4.0, 2000, PERF, 2.0, 0.5, 0.8)
    assert pooled >= mean_only  # never below the mean-wait rule


# -- adaptive stabilization -----------------------------------------------------------------


def _drive(rates: list[float], params: AutoscalerParams) -> list[Decision]:
    return run(rates, start={Role.PREFILL: 1, Role.DECODE: 1}, params=params)


def _first(ds: list[Decision], kind: Kind, after: int = 0) -> int:
    return next(i for i, d in enumerate(ds) if i >= after and d.pools[Role.PREFILL].kind is kind)


def test_a_reversal_doubles_the_scale_down_window_and_quiet_relaxes_it() -> None:
    window = int(POOLED.scale_down_stabilization_s / POOLED.interval_s)  # 6 ticks
    # High, low until prefill shrinks, high again soon after (a reversal), then low for long.
    high, low = 20.0, 0.5
    probe = _drive([high] * 5 + [low] * 30, POOLED)
    down = _first(probe, Kind.SCALE_DOWN)
    rates = [high] * 5 + [low] * (down - 5 + 1) + [high] * 3 + [low] * 60
    ds = _drive(rates, POOLED)
    back_up = _first(ds, Kind.SCALE_UP, after=down + 1)
    assert "reversed a scale-down" in ds[back_up].pools[Role.PREFILL].reason
    low_again = down + 4
    next_down = _first(ds, Kind.SCALE_DOWN, after=low_again)
    # The low load is seen for 2 windows (not 1) before prefill shrinks again.
    assert next_down - low_again >= 2 * window - 1
    assert f"wanted for {2 * POOLED.scale_down_stabilization_s:g} s" in (
        ds[next_down].pools[Role.PREFILL].reason
    )
    # Without the backoff the same load shrinks it after one window.
    off = _drive(rates, replace(POOLED, reversal_backoff=1.0))
    off_down = _first(off, Kind.SCALE_DOWN, after=low_again)
    assert off_down < next_down
    # A quiet stretch brings the multiplier back to 1.
    _, state = decide(obs(0, 1.0, {Role.PREFILL: 1}), AutoscalerState(), PERF, POOLED)
    state = replace(state, backoff=((Role.PREFILL, 4.0, 0.0, 0.0),))
    t = 0.0
    for _ in range(200):
        t += POOLED.interval_s
        _, state = decide(obs(t, 1.0, {Role.PREFILL: 1}), state, PERF, POOLED)
    assert state.backoff_of(Role.PREFILL)[0] == 1.0


def test_new_params_are_validated() -> None:
    with pytest.raises(ValueError, match="length_alpha"):
        AutoscalerParams(length_alpha=0.0)
    with pytest.raises(ValueError, match="reversal_backoff"):
        AutoscalerParams(reversal_backoff=0.5)


def test_length_smoothing_averages_the_mix() -> None:
    params = replace(TAIL, length_alpha=0.5)
    current = {Role.PREFILL: 2, Role.DECODE: 2}
    _, state = decide(obs(0, 2.0, current, prompt=1000), AutoscalerState(), PERF, params)
    d, state = decide(obs(10, 2.0, current, prompt=3000), state, PERF, params)
    assert state.lengths is not None
    assert state.lengths[0] == pytest.approx(2000)
    assert "prompt 2000" in d.pools[Role.PREFILL].reason


# -- the invariants, once per parameter set -----------------------------------------------------

SETTLED = replace(POOLED, feedback_settle=True)
VARIANTS = pytest.mark.parametrize(
    "params", [TAIL, POOLED, SETTLED], ids=["tail", "pooled+backoff", "pooled+backoff+settle"]
)
rates = st.floats(min_value=0.0, max_value=200.0, allow_nan=False)


@VARIANTS
@settings(max_examples=100, deadline=None)
@given(st.lists(rates, min_size=1, max_size=30), st.integers(0, 10), st.integers(0, 20))
def test_never_outside_bounds(
    params: AutoscalerParams, load: list[float], lo: int, span: int
) -> None:
    for d in run(load, params=params, bounds=(lo, lo + span)):
        assert all(lo <= n <= lo + span for n in d.desired.values())


@VARIANTS
@settings(max_examples=100, deadline=None)
@given(rates, rates, st.lists(rates, max_size=20))
def test_monotone_in_load(
    params: AutoscalerParams, r1: float, r2: float, past: list[float]
) -> None:
    lo, hi = sorted((r1, r2))
    current = {Role.PREFILL: 2, Role.DECODE: 2}
    state = AutoscalerState()
    for i, r in enumerate(past):  # any history, reversals included
        d, state = decide(obs(i * 10, r, current, classes=(STRICT,)), state, PERF, params)
        current = d.desired
    t = len(past) * 10
    a, _ = decide(obs(t, lo, current, classes=(STRICT,)), state, PERF, params)
    b, _ = decide(obs(t, hi, current, classes=(STRICT,)), state, PERF, params)
    for role in current:
        assert a.desired[role] <= b.desired[role]


@VARIANTS
@settings(max_examples=60, deadline=None)
@given(st.floats(0.5, 100), st.floats(-0.02, 0.02), st.integers(20, 60))
def test_slowly_varying_load_never_reverses_within_a_window(
    params: AutoscalerParams, start: float, drift: float, n: int
) -> None:
    ds = run([start * (1 + drift) ** i for i in range(n)], params=params)
    window = int(params.scale_down_stabilization_s / params.interval_s)
    for role in (Role.PREFILL, Role.DECODE):
        assert reversals_within(sizes(ds, role), window) == 0


@VARIANTS
@settings(max_examples=60, deadline=None)
@given(st.floats(0.1, 50), st.floats(0.2, 5.0))
def test_converges_after_a_step(params: AutoscalerParams, base: float, factor: float) -> None:
    ds = run([base] * 10 + [base * factor] * 80, params=params)
    for role in (Role.PREFILL, Role.DECODE):
        s = sizes(ds, role)
        assert len(set(s[-10:])) == 1, s
        final = ds[-1].pools[role]
        assert final.up_target <= final.desired <= max(final.down_target, 1)


# -- SLO feedback waits a window for the workers it added (`feedback_settle`) -------------------


def _missing(t: float, current: int, ready: int) -> Observation:
    """A prefill pool under SLO pressure (TTFT p90 3 s > 2 s) at a light modelled load."""
    missed = replace(STRICT, requests=100, ttft_s=3.0, tpot_s=0.05, attainment=0.9)
    base = obs(t, 0.1, {Role.PREFILL: current, Role.DECODE: 1}, classes=(missed,))
    pools = dict(base.pools)
    pools[Role.PREFILL] = replace(pools[Role.PREFILL], ready=ready)
    return replace(base, pools=pools)


@pytest.mark.parametrize("settle", [False, True])
def test_feedback_waits_a_window_after_new_workers_serve(settle: bool) -> None:
    params = replace(POOLED, feedback_settle=settle)
    state = AutoscalerState()
    d, state = decide(_missing(0, 2, 2), state, PERF, params)
    assert d.desired[Role.PREFILL] == 3  # pressure: one more
    d, state = decide(_missing(10, 3, 2), state, PERF, params)
    assert d.desired[Role.PREFILL] == 3  # the new one is not serving yet: awaited either way
    assert "to start serving" in d.pools[Role.PREFILL].reason
    # it serves from t = 20; the window (60 s) still holds misses from before it
    d, state = decide(_missing(20, 3, 3), state, PERF, params)
    if not settle:
        assert d.desired[Role.PREFILL] == 4
        return
    assert d.desired[Role.PREFILL] == 3
    assert "waiting a 60 s window for their effect" in d.pools[Role.PREFILL].reason
    for t in (30, 40, 70):
        d, state = decide(_missing(t, 3, 3), state, PERF, params)
        assert d.desired[Role.PREFILL] == 3, t  # held: no scale-down while under pressure
    d, state = decide(_missing(80, 3, 3), state, PERF, params)
    assert d.desired[Role.PREFILL] == 4  # a whole window later and still missing: one more


def test_settling_is_off_by_default_and_on_in_the_live_policy() -> None:
    assert not AutoscalerParams().feedback_settle
    assert live_params(10.0, 120.0).feedback_settle

"""The reshaped safety margins: burst headroom less the Poisson excess of the busiest
sub-window (`burst_poisson`, `poisson_peak_excess`) and a scale-down band from the rate's noise
(`band_z`, `band_workers`). Unit cases, a Poisson check, and the autoscaler's invariants with
them on (docs/autoscaling.md: what each margin costs)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy.planner.test_planner_autoscaler import PERF, obs, reversals_within, sizes
from tests.unit.policy.planner.test_planner_pool import SETTLED

from splitserve.core.roles import Role
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Decision,
    band_workers,
    burst_rate,
    decide,
    live_params,
    noisy_rate,
    poisson_peak_excess,
)
from splitserve.policy.planner.signals import Observation

RESHAPED = replace(SETTLED, burst_weight=1.0, burst_poisson=True, band_z=2.0)
WINDOW_S = 30.0


def peaked(t: float, rate: float, peak: float, current: dict[Role, int]) -> Observation:
    return replace(
        obs(t, rate, current),
        window_s=WINDOW_S,
        arrival_rate_peak_per_s=peak,
        arrival_rate_peak_window_s=10.0,
    )


def drive(rates: list[tuple[float, float]], params: AutoscalerParams) -> list[Decision]:
    """(mean, busiest sub-window) per tick; each tick's sizes become the next one's."""
    current = {Role.PREFILL: 1, Role.DECODE: 1}
    state = AutoscalerState()
    out = []
    for i, (mean, peak) in enumerate(rates):
        d, state = decide(peaked(i * params.interval_s, mean, peak, current), state, PERF, params)
        out.append(d)
        current = d.desired
    return out


# -- the Poisson excess of the busiest sub-window ------------------------------------------------


def test_poisson_excess_is_the_expected_busiest_of_k_sub_windows() -> None:
    rng = np.random.default_rng(7)
    for mean in (0.5, 2.0, 8.0, 30.0):
        counts = rng.poisson(mean * 10.0, size=(20_000, 3))  # 3 sub-windows of 10 s
        measured = float((counts.max(axis=1) - counts.mean(axis=1)).mean() / 10.0)
        # Blom's normal approximation; Poisson counts of 5 are skewed, so a loose bound there
        assert poisson_peak_excess(mean, 30.0, 10.0) == pytest.approx(measured, rel=0.12), mean


def test_poisson_excess_grows_like_the_square_root_of_the_rate() -> None:
    one = poisson_peak_excess(2.0, 30.0, 10.0)
    assert poisson_peak_excess(8.0, 30.0, 10.0) == pytest.approx(2 * one)
    assert poisson_peak_excess(8.0, 30.0, 10.0) / 8.0 < one / 2.0  # relative: shrinks
    assert poisson_peak_excess(2.0, 10.0, 10.0) == 0.0  # one sub-window: the mean itself
    assert poisson_peak_excess(0.0, 30.0, 10.0) == 0.0
    assert poisson_peak_excess(2.0, 60.0, 10.0) > one  # the busiest of more is higher


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 100), st.floats(0, 300), st.floats(0, 300), st.floats(0, 1), st.floats(0, 5))
def test_burst_rate_is_bounded_and_monotone_in_the_peak(
    mean: float, p1: float, p2: float, weight: float, noise: float
) -> None:
    lo, hi = sorted((p1, p2))
    a, b = burst_rate(mean, lo, weight, noise), burst_rate(mean, hi, weight, noise)
    assert mean <= a <= b <= max(mean, hi)
    assert burst_rate(mean, hi, weight, noise) <= burst_rate(mean, hi, weight, 0.0)


def test_a_real_step_is_still_sized_but_a_steady_poisson_peak_is_not() -> None:
    current = {Role.PREFILL: 2, Role.DECODE: 2}
    noise = poisson_peak_excess(5.0, WINDOW_S, 10.0)
    steady = peaked(0, 5.0, 5.0 + noise, current)  # what Poisson at 5 req/s shows anyway
    step = peaked(0, 5.0, 15.0, current)  # a step to 15 req/s in the last 10 s
    for o, sized in ((steady, 5.0), (step, 15.0 - noise)):
        d, _ = decide(o, AutoscalerState(), PERF, RESHAPED)
        assert d.forecast_per_s == pytest.approx(sized)
    d, _ = decide(step, AutoscalerState(), PERF, replace(RESHAPED, burst_poisson=False))
    assert d.forecast_per_s == pytest.approx(15.0)
    # without the sub-window's length nothing is deducted: the full headroom
    unknown = replace(step, arrival_rate_peak_window_s=None)
    d, _ = decide(unknown, AutoscalerState(), PERF, RESHAPED)
    assert d.forecast_per_s == pytest.approx(15.0)


def test_the_live_policy_deducts_the_poisson_excess() -> None:
    assert live_params(10.0, 120.0).burst_poisson
    assert not AutoscalerParams().burst_poisson


# -- the scale-down band from the rate's noise -----------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 60), st.floats(0, 60), st.floats(0, 3))
def test_band_is_between_the_up_count_and_the_fixed_band(w1: float, w2: float, z: float) -> None:
    params = AutoscalerParams(scale_down_utilization=0.5, band_z=z)
    lo, hi = sorted((w1, w2))
    for w in (lo, hi):
        n = band_workers(w, w * 1.2, params)
        assert math.ceil(w / 0.8 - 1e-9) <= n <= math.ceil(w / 0.5 - 1e-9)
    assert band_workers(lo, lo * 1.2, params) <= band_workers(hi, hi * 1.2, params)
    off = replace(params, band_z=0.0)
    assert band_workers(hi, hi * 5, off) == math.ceil(hi / 0.5 - 1e-9)


def test_band_shrinks_relative_to_the_pool_as_the_load_grows() -> None:
    z, t = 2.0, 30.0
    small = noisy_rate(1.0, 1.0, t, z) / 1.0
    large = noisy_rate(50.0, 50.0, t, z) / 50.0
    assert small == pytest.approx(1 + z * math.sqrt(1 / 30))
    assert large < small < 1 / 0.5 * 0.8  # both tighter than the fixed 0.8 / 0.5 band
    d = drive([(40.0, 40.0)] * 30, RESHAPED)[-1]
    fixed = drive([(40.0, 40.0)] * 30, replace(RESHAPED, band_z=0.0))[-1]
    for role in (Role.PREFILL, Role.DECODE):
        assert d.pools[role].down_target <= fixed.pools[role].down_target
    assert d.pools[Role.PREFILL].down_target < fixed.pools[Role.PREFILL].down_target


def test_validation() -> None:
    with pytest.raises(ValueError, match="band_z"):
        AutoscalerParams(band_z=-1.0)


# -- the invariants with both on, bursty observations ------------------------------------------

means = st.floats(0.0, 100.0)
ratios = st.floats(1.0, 3.0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(means, ratios), min_size=1, max_size=30), st.integers(0, 8))
def test_never_outside_bounds(load: list[tuple[float, float]], lo: int) -> None:
    current = {Role.PREFILL: lo, Role.DECODE: lo}
    state = AutoscalerState()
    for i, (m, k) in enumerate(load):
        o = peaked(i * 10.0, m, m * k, current)
        bounded = {r: replace(p, min_replicas=lo, max_replicas=lo + 6) for r, p in o.pools.items()}
        d, state = decide(replace(o, pools=bounded), state, PERF, RESHAPED)
        assert all(lo <= n <= lo + 6 for n in d.desired.values())
        current = d.desired


@settings(max_examples=80, deadline=None)
@given(means, means, ratios, st.lists(st.tuples(means, ratios), max_size=15))
def test_monotone_in_load(r1: float, r2: float, k: float, past: list[tuple[float, float]]) -> None:
    lo, hi = sorted((r1, r2))
    current = {Role.PREFILL: 2, Role.DECODE: 2}
    state = AutoscalerState()
    for i, (m, kk) in enumerate(past):
        d, state = decide(peaked(i * 10.0, m, m * kk, current), state, PERF, RESHAPED)
        current = d.desired
    t = len(past) * 10.0
    a, _ = decide(peaked(t, lo, lo * k, current), state, PERF, RESHAPED)
    b, _ = decide(peaked(t, hi, hi * k, current), state, PERF, RESHAPED)
    for role in current:
        assert a.desired[role] <= b.desired[role]
        assert a.pools[role].down_target <= b.pools[role].down_target


@settings(max_examples=50, deadline=None)
@given(st.floats(0.5, 100), st.floats(-0.02, 0.02), st.floats(1.0, 2.0), st.integers(20, 60))
def test_slowly_varying_load_never_reverses_within_a_window(
    start: float, drift: float, k: float, n: int
) -> None:
    ds = drive(
        [(start * (1 + drift) ** i, k * start * (1 + drift) ** i) for i in range(n)], RESHAPED
    )
    window = int(RESHAPED.scale_down_stabilization_s / RESHAPED.interval_s)
    for role in (Role.PREFILL, Role.DECODE):
        assert reversals_within(sizes(ds, role), window) == 0


@settings(max_examples=50, deadline=None)
@given(st.floats(0.1, 50), st.floats(0.2, 5.0))
def test_converges_after_a_step(base: float, factor: float) -> None:
    new = base * factor
    # the tick after the step sees it only in its busiest sub-window, then in full
    ds = drive([(base, base)] * 10 + [(base + (new - base) / 3, new)] + [(new, new)] * 80, RESHAPED)
    for role in (Role.PREFILL, Role.DECODE):
        s = sizes(ds, role)
        assert len(set(s[-10:])) == 1, s
        final = ds[-1].pools[role]
        assert final.up_target <= final.desired <= max(final.down_target, 1)

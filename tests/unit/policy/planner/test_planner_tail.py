"""Tail sizing of prefill (M/G/1 wait at the class's attainment quantile) and the decode
occupancy floor: unit cases and the autoscaler's invariants with them on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy.planner.test_planner_autoscaler import (
    PERF,
    obs,
)

from splitserve.core.roles import Role
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Targets,
    decide,
    prefill_tail_utilization,
    prefill_work,
)
from splitserve.policy.planner.signals import ClassSignal, WorkerLoad

TAIL = AutoscalerParams(
    interval_s=10,
    scale_down_stabilization_s=60,
    horizon_s=10,
    burst_weight=1.0,
    ttft_tail_fraction=0.8,
    occupancy_floor=True,
)
STRICT = ClassSignal("chat", 2.0, 0.1, percentile=0.9, attainment_target=0.99)


def _wait_q(service: float, cv2: float, q: float, rho: float) -> float:
    if rho <= 1 - q:
        return 0.0
    return service * (1 + cv2) / (2 * (1 - rho)) * math.log(rho / (1 - q))


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.01, 1.0),
    st.floats(0.0, 10.0),
    st.floats(0.5, 0.999),
    st.floats(1.05, 50.0),
)
def test_tail_utilization_keeps_the_quantile_wait_in_budget(
    service: float, cv2: float, q: float, budget_x: float
) -> None:
    budget = service * budget_x
    rho = prefill_tail_utilization(service, cv2, q, budget, 0.8)
    assert 0 < rho <= 0.8
    if rho > 0.1 + 1e-9:  # above the floor: the quantile wait fits
        assert service + _wait_q(service, cv2, q, rho) <= budget * (1 + 1e-6)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 1.0), st.floats(0.0, 5.0), st.floats(0.0, 5.0), st.floats(1.5, 50.0))
def test_tail_utilization_falls_with_spread_and_stricter_quantile(
    service: float, c1: float, c2: float, budget_x: float
) -> None:
    lo, hi = sorted((c1, c2))
    budget = service * budget_x
    assert prefill_tail_utilization(service, hi, 0.99, budget, 0.8) <= (
        prefill_tail_utilization(service, lo, 0.99, budget, 0.8) + 1e-9
    )
    assert prefill_tail_utilization(service, lo, 0.99, budget, 0.8) <= (
        prefill_tail_utilization(service, lo, 0.9, budget, 0.8) + 1e-9
    )


def test_tail_sizing_needs_more_prefill_than_the_mean_for_a_99_percent_target() -> None:
    mean_only = prefill_work(4.0, 3000, PERF, 2.0, 0.5, 0.8)
    tail = prefill_work(
        4.0, 3000, PERF, 2.0, 0.5, 0.8, tail_fraction=0.8, prompt_cv2=2.0, quantile=0.99
    )
    assert tail > mean_only


def test_targets_take_the_strictest_quantile() -> None:
    loose = ClassSignal("batch", 10.0, 0.5, percentile=0.5, attainment_target=0.9)
    assert Targets.of((STRICT, loose)).quantile == pytest.approx(0.99)


def test_measured_prompt_spread_acts() -> None:
    current = {Role.PREFILL: 1, Role.DECODE: 1}
    narrow = replace(obs(0, 6.0, current, prompt=2000, classes=(STRICT,)), prompt_tokens_cv2=0.0)
    wide = replace(narrow, prompt_tokens_cv2=4.0)
    a, _ = decide(narrow, AutoscalerState(), PERF, TAIL)
    b, _ = decide(wide, AutoscalerState(), PERF, TAIL)
    assert b.pools[Role.PREFILL].work > a.pools[Role.PREFILL].work


def test_tail_params_are_validated() -> None:
    with pytest.raises(ValueError, match="ttft_tail_fraction"):
        AutoscalerParams(ttft_tail_fraction=1.5)


# -- decode occupancy floor ------------------------------------------------------------------


def _decode_held(kv: float, running: int, n: int) -> dict[Role, tuple[WorkerLoad, ...]]:
    return {Role.DECODE: tuple(WorkerLoad(f"d{i}", Role.DECODE, 0, running, kv) for i in range(n))}


def test_decode_is_never_sized_below_what_its_workers_hold() -> None:
    current = {Role.PREFILL: 1, Role.DECODE: 2}
    # Light modelled load, but both decode workers' KV is 95 % full.
    full = obs(0, 0.5, current, output=20, workers=_decode_held(0.95, 10, 2))
    d, _ = decide(full, AutoscalerState(), PERF, TAIL)
    assert d.pools[Role.DECODE].work >= 1.9
    assert d.desired[Role.DECODE] == 3  # 1.9 / 0.8 -> 3
    off, _ = decide(full, AutoscalerState(), PERF, replace(TAIL, occupancy_floor=False))
    assert off.desired[Role.DECODE] == 2


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.integers(0, 200), st.integers(1, 8))
def test_occupancy_floor_is_monotone_in_what_is_held(
    kv1: float, kv2: float, running: int, n: int
) -> None:
    lo, hi = sorted((kv1, kv2))
    current = {Role.PREFILL: 1, Role.DECODE: n}
    a, _ = decide(
        obs(0, 1.0, current, workers=_decode_held(lo, running, n)), AutoscalerState(), PERF, TAIL
    )
    b, _ = decide(
        obs(0, 1.0, current, workers=_decode_held(hi, running, n)), AutoscalerState(), PERF, TAIL
    )
    assert a.desired[Role.DECODE] <= b.desired[Role.DECODE]


# The autoscaler's invariants with tail sizing and the floor on (bounds, monotone, no reversal,
# converges) run in test_planner_pool.py, parametrized over TAIL and the pooled variants.

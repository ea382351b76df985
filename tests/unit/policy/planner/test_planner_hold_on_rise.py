"""`AutoscalerParams.hold_down_on_rise`: no scale-down while the sized rate rises tick over tick.

Invariants (property-tested): a pool never shrinks in a tick whose sized rate is above the
previous tick's; under a load that falls and then comes back over several ticks no
scale-down is taken once it has started to come back (so no reversal begins there: one in
the gap itself, before anything rises, a rule that sees only the past cannot avoid); it
still converges after a step down.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy.planner.test_planner_autoscaler import reversals_within, sizes
from tests.unit.policy.planner.test_planner_margins import RESHAPED, drive

from splitserve.core.roles import Role
from splitserve.policy.planner.autoscaler import Kind

HOLD = replace(RESHAPED, hold_down_on_rise=True, band_z=0.0)
PLAIN = replace(HOLD, hold_down_on_rise=False)
WINDOW = int(HOLD.scale_down_stabilization_s / HOLD.interval_s)


GAP = WINDOW + 2


def _gap_then_ramp(high: float, low: float, ramp: int) -> list[tuple[float, float]]:
    """High load, a low gap just longer than the stabilization window (the pools start to
    shrink one worker per tick), then a ramp back up over `ramp` ticks (each tick's rate above
    the last) and the high load again."""
    up = [low + (high - low) * (i + 1) / ramp for i in range(ramp)]
    return [(high, high)] * 20 + [(low, low)] * GAP + [(r, r) for r in up] + [(high, high)] * 20


def test_a_rising_rate_holds_the_scale_down_and_says_why() -> None:
    plain = drive(_gap_then_ramp(40.0, 0.5, 10), PLAIN)
    held = drive(_gap_then_ramp(40.0, 0.5, 10), HOLD)
    start = 20 + GAP
    ramp = slice(start, start + 10)
    # Without the hold the stabilized scale-down runs on into the ramp, then reverses.
    assert any(d.pools[Role.PREFILL].kind is Kind.SCALE_DOWN for d in plain[ramp])
    assert reversals_within(sizes(plain, Role.PREFILL), WINDOW) >= 1
    assert all(d.pools[Role.PREFILL].kind is not Kind.SCALE_DOWN for d in held[ramp])
    assert any("sized rate rising" in d.pools[Role.PREFILL].reason for d in held[ramp])
    assert reversals_within(sizes(held, Role.PREFILL), WINDOW) < reversals_within(
        sizes(plain, Role.PREFILL), WINDOW
    )


def test_off_by_default() -> None:
    assert not replace(RESHAPED).hold_down_on_rise


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.0, 80.0), min_size=2, max_size=60),
)
def test_never_shrinks_while_the_sized_rate_rises(load: list[float]) -> None:
    ds = drive([(r, r) for r in load], HOLD)
    for prev, d in itertools.pairwise(ds):
        if (
            d.forecast_per_s is not None
            and prev.forecast_per_s is not None
            and d.forecast_per_s > prev.forecast_per_s
        ):
            for role in (Role.PREFILL, Role.DECODE):
                assert d.pools[role].kind is not Kind.SCALE_DOWN


@settings(max_examples=40, deadline=None)
@given(st.floats(5.0, 80.0), st.floats(0.0, 1.0), st.integers(2, 12))
def test_no_reversal_begins_in_the_ramp(high: float, low: float, ramp: int) -> None:
    """A reversal needs a scale-down; none is taken once the load has started to come back, so
    every reversal left began before the ramp (in the gap itself, which no rule that sees
    only the past can tell from a lasting drop)."""
    ds = drive(_gap_then_ramp(high, low, ramp), HOLD)
    start = 20 + GAP
    for role in (Role.PREFILL, Role.DECODE):
        assert all(d.pools[role].kind is not Kind.SCALE_DOWN for d in ds[start + 1 :])


@settings(max_examples=30, deadline=None)
@given(st.floats(1.0, 50), st.floats(0.1, 0.9))
def test_still_converges_after_a_step_down(base: float, factor: float) -> None:
    new = base * factor
    ds = drive([(base, base)] * 10 + [(new, new)] * 80, HOLD)
    for role in (Role.PREFILL, Role.DECODE):
        s = sizes(ds, role)
        assert len(set(s[-10:])) == 1, s
        final = ds[-1].pools[role]
        assert final.up_target <= final.desired <= max(final.down_target, 1)

"""The event loop.

Invariants:
- the clock never goes backwards and equals each event's time while it is handled;
- `until_s` leaves later events queued; `max_events` bounds one call;
- two simulators in one process are independent (no global state).
"""

from __future__ import annotations

import gc

import pytest

from splitserve.sim.engine import Simulator, relax_gc
from splitserve.sim.events import Event, EventKind


class Echo:
    """Re-schedules each event `gap_s` later until `stop_s`, recording what it saw."""

    def __init__(self, gap_s: float, stop_s: float) -> None:
        self.gap_s = gap_s
        self.stop_s = stop_s
        self.seen: list[tuple[float, float]] = []

    def handle(self, event: Event, sim: Simulator) -> None:
        self.seen.append((event.time_s, sim.now_s))
        if event.time_s + self.gap_s <= self.stop_s:
            sim.schedule(event.time_s + self.gap_s, EventKind.WAKE)


def test_clock_follows_events() -> None:
    sim = Simulator()
    world = Echo(0.5, 3.0)
    sim.schedule(0.0, EventKind.WAKE)
    assert sim.run(world) == 7
    assert all(t == now for t, now in world.seen)
    assert [t for t, _ in world.seen] == sorted(t for t, _ in world.seen)
    assert sim.now_s == 3.0


def test_until_and_max_events() -> None:
    sim = Simulator()
    world = Echo(1.0, 10.0)
    sim.schedule(0.0, EventKind.WAKE)
    sim.run(world, until_s=2.5)
    assert sim.now_s == 2.0
    assert len(sim.queue) == 1
    assert sim.run(world, max_events=2) == 2
    assert sim.now_s == 4.0


def test_two_simulators_are_independent() -> None:
    a, b = Simulator(), Simulator()
    wa, wb = Echo(1.0, 5.0), Echo(2.0, 5.0)
    a.schedule(0.0, EventKind.WAKE)
    b.schedule(0.0, EventKind.WAKE)
    a.run(wa, max_events=3)
    b.run(wb)
    a.run(wa)
    assert len(wa.seen) == 6
    assert len(wb.seen) == 3
    assert a.num_events == 6
    assert b.num_events == 3


def test_cannot_schedule_in_the_past() -> None:
    sim = Simulator(start_s=5.0)
    with pytest.raises(ValueError, match="past"):
        sim.schedule(4.0, EventKind.WAKE)


def test_relax_gc_raises_floors_and_leaves_a_disabled_collector_off() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert relax_gc() == (700, 10, 10)
        assert gc.get_threshold() == (100_000, 50, 100)
        gc.set_threshold(0, 10, 10)  # automatic collection off: stays off
        assert relax_gc() == (0, 10, 10)
        assert gc.get_threshold() == (0, 10, 10)
    finally:
        gc.set_threshold(*before)

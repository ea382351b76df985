"""The discrete-event loop.

Owns: one `ManualClock` and one `EventQueue` per `Simulator`; nothing global, so two simulators
run side by side in one process. The loop pops the earliest event, advances the clock to it and
hands it to the world (`World.handle`), which may schedule more events through the simulator.
Pure: no I/O, no wall time.

While `run` loops, the cyclic garbage collector runs less often (thresholds raised, restored
after): a replay allocates millions of short-lived containers that reference counting frees at
once, and keeps every request record alive to the end, so the default thresholds (a young
collection every 700 allocations, full ones as the records pile up) cost ≈ 10 % of a compiled
replay and reclaim nothing (the Azure replay leaves no cyclic garbage). Collections still happen,
so a world that does make cycles stays bounded. No result depends on collection timing.
"""

from __future__ import annotations

import gc
import heapq
from typing import Protocol

from splitserve.core.clock import ManualClock
from splitserve.sim.events import Event, EventKind, EventQueue

_GC_THRESHOLDS = (100_000, 50, 100)
"""`gc.set_threshold` floors while `Simulator.run` loops (CPython's defaults: 700, 10, 10)."""


def relax_gc() -> tuple[int, int, int]:
    """Raise the cyclic collector's thresholds to at least `_GC_THRESHOLDS` (a collector that is
    off, threshold 0, stays off); returns the old ones, for `gc.set_threshold(*old)`. Used while
    the loop runs and while `cluster.simulate` builds its records (19,366 records at the default
    thresholds set off full collections over every live request: ≈ 2 % of a compiled replay)."""
    old = gc.get_threshold()
    t0, t1, t2 = old
    if t0 > 0:
        f0, f1, f2 = _GC_THRESHOLDS
        gc.set_threshold(max(t0, f0), max(t1, f1), max(t2, f2))
    return old


class World(Protocol):
    """What the loop drives: the cluster model (`entities.Cluster`) or a test double."""

    def handle(self, event: Event, sim: Simulator) -> None:
        """React to `event` at `sim.now_s`; schedule follow-ups with `sim.schedule`."""
        ...


class Simulator:
    def __init__(self, start_s: float = 0.0) -> None:
        self.clock = ManualClock(start_s)
        self.queue = EventQueue()
        self.num_events = 0

    @property
    def now_s(self) -> float:
        return self.clock.now_s()

    def schedule(
        self, time_s: float, kind: EventKind, target: int = -1, payload: object = None
    ) -> Event:
        """Queue an event at `time_s` (never in the past)."""
        now = self.clock.now_s()
        if time_s < now:
            raise ValueError(f"cannot schedule in the past: {time_s} < {now}")
        return self.queue.push(time_s, kind, target, payload)

    def run(self, world: World, until_s: float | None = None, max_events: int | None = None) -> int:
        """Handle events in order until the queue is empty, `until_s` or `max_events`.

        Returns the number of events handled by this call. Events after `until_s` stay queued.
        """
        clock = self.clock
        heap = self.queue.heap_entries()
        pop = heapq.heappop
        handle = world.handle
        handled = 0
        limit = float("inf") if until_s is None else until_s
        max_n = -1 if max_events is None else max(0, max_events)
        thresholds = relax_gc()
        try:
            while heap:
                if handled == max_n:
                    break
                if heap[0][0] > limit:
                    break
                event = pop(heap)[3]
                clock.advance_to(event.time_s)  # a native call compiled (a bound method is not)
                handle(event, self)
                handled += 1
        finally:
            gc.set_threshold(*thresholds)
        self.num_events += handled
        return handled

"""Event-loop lag: how late the router's loop runs a timer.

Exported as `splitserve_router_event_loop_lag_seconds`.

A task sleeps `interval_s` and records how much longer than that it took to wake. Lag grows when
the loop is busy (CPU starvation, a blocking call): the same starvation that delays load reports.
"""

from __future__ import annotations

import asyncio

from splitserve.aio import stop_task
from splitserve.core.clock import Clock
from splitserve.obs.metrics import RouterMetrics


class LoopLagMonitor:
    def __init__(self, metrics: RouterMetrics, clock: Clock, interval_s: float = 0.25) -> None:
        self.metrics = metrics
        self.clock = clock
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _run(self) -> None:
        while True:
            before = self.clock.now_s()
            await asyncio.sleep(self.interval_s)
            lag = self.clock.now_s() - before - self.interval_s
            self.metrics.loop_lag.observe(max(0.0, lag))
